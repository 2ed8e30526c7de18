// q6 GEMM before (A: exact int32 superblock totals, sub-scales by vpmulld) and after (B: a fused multiply-add per
// sub-block) in one process, calls taking turns A B B A, weights rotating through 1 GiB, 2 threads.
// A is a directory holding e203b95's gemm.h, gemm_q6.h and gemm_amx.h (git show e203b95:PATH), here /tmp/oldq6:
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -I. -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 \
//       -DQD_A=/tmp/oldq6 -DQD_B=quickdraft/runtime/native results/q4-fma-xeon/q6_ab.cpp -o /tmp/q6ab && /tmp/q6ab [rows ...]
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#define QD_STRING(x) #x
#define QD_HEADER(dir) QD_STRING(dir/gemm_q6.h)
#define qd qd_a
#include QD_HEADER(QD_A)
#undef qd
#undef QD_UNROLL
#undef QD_PRAGMA
#define qd qd_b
#include QD_HEADER(QD_B)
#undef qd

struct Q6Copy { std::vector<uint8_t> codes, high; std::vector<int8_t> sub_scale; std::vector<float> d; };

Q6Copy make_q6(int64_t n, int64_t k, std::mt19937& rng) {
  Q6Copy c;
  c.codes.resize(n * k / 2); for (auto& b : c.codes) b = static_cast<uint8_t>(rng());
  c.high.resize(n * k / 4); for (auto& b : c.high) b = static_cast<uint8_t>(rng());
  c.sub_scale.resize(n * k / 16); for (auto& b : c.sub_scale) b = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  c.d.assign(n * ((k / 32 + 7) / 8), 1e-3f);
  return c;
}

int main(int argc, char** argv) {
  std::vector<int64_t> row_counts;
  for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoll(argv[i]));
  if (row_counts.empty()) row_counts = {1, 4, 8, 12, 16};
  const struct { const char* name; int64_t n, k; } shapes[] = {{"q6 down    8960->1536  ", 1536, 8960}, {"q6 lm-head 1536->151936", 151936, 1536}};
  std::mt19937 rng(7);
  std::printf("isa %s; 2 threads; best of 40 calls each, A B B A; ms\n", qd_b::kIsa);
  for (const auto& shape : shapes) {
    const int64_t bytes = shape.n * shape.k * 13 / 16;
    const int copies = std::max<int>(2, static_cast<int>(((int64_t{1} << 30) + bytes - 1) / bytes));
    std::vector<Q6Copy> q6;
    for (int c = 0; c < copies; ++c) q6.push_back(make_q6(shape.n, shape.k, rng));
    for (int64_t rows : row_counts) {
      std::vector<int8_t> x(rows * shape.k);
      for (auto& v : x) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      std::vector<int32_t> pairs(rows * shape.k / 32), offsets(rows * shape.k / 16);
      for (int64_t r = 0; r < rows; ++r) {
        qd_a::sub_block_sum_pairs(x.data() + r * shape.k, shape.k, pairs.data() + r * shape.k / 32);
        qd_b::sub_block_offsets(x.data() + r * shape.k, shape.k, offsets.data() + r * shape.k / 16);
      }
      std::vector<float> out(rows * shape.n);
      double best[2] = {1e9, 1e9};
      for (int i = 0; i < 80; ++i) {
        const int which = (i % 4 == 0 || i % 4 == 3) ? 0 : 1;
        const Q6Copy& c = q6[(i + 1) % copies];
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
        {
          const int t = omp_get_thread_num(), count = omp_get_num_threads();
          const int64_t blocks = shape.n / 16, begin = blocks * t / count, end = blocks * (t + 1) / count;
          if (which == 0) qd_a::q6_gemm({c.codes.data(), c.high.data(), c.sub_scale.data(), c.d.data(), shape.n, shape.k}, x.data(), rows, pairs.data(), out.data(), shape.n, begin, end);
          else qd_b::q6_gemm({c.codes.data(), c.high.data(), c.sub_scale.data(), c.d.data(), shape.n, shape.k}, x.data(), rows, offsets.data(), out.data(), shape.n, begin, end);
        }
        best[which] = std::min(best[which], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%s %4ld %8.3f %8.3f %6.3f\n", shape.name, static_cast<long>(rows), best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
    }
  }
}
