// Two builds of the q4, q5, q6, iq4, iq4h, q8 and q4t GEMMs (quickdraft/runtime/native/gemm.h, gemm_q6.h, gemm_iq4.h, gemm_q8.h) in one process, taking turns call by
// call in the order A B B A, so that a VM switching speed slows both alike: the best of 40 calls each, at the default
// target's shapes (q4 and q5: the 1536 -> 17920 gate+up and the 8960 -> 1536 down projection; q6, as a Q4_K_M file stores
// half the down projections and the LM head: 8960 -> 1536 and 1536 -> 151936; iq4 as an IQ4_XS file's gate+up and
// down, iq4h as an IQ2_S file's gate+up, q8 and q4t as a Q8_0's and a Q4_0's gate+up and down), 2 threads sharing the n-blocks as
// the runtime does. Weights rotate through 1 GiB so that every timed call streams them from memory (copy 0, which
// the check reads, is timed last if ever), and the two builds' outputs are compared bit for bit on the same
// weights. A and B are directories holding gemm.h, gemm_q6.h, gemm_iq4.h, gemm_q8.h and gemm_amx.h, e.g. a checkout's headers and those
// of `git show REV:quickdraft/runtime/native/...` written to /tmp/old:
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -I. -DQD_A=/tmp/old -DQD_B=quickdraft/runtime/native \
//       tools/gemm_ab.cpp -o /tmp/gemm_ab && /tmp/gemm_ab [rows ...]
// QD_SHAPES=iq4 (any part of a shape's name) times only the shapes whose names hold it.
// Add -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 for what a CPU without AMX runs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define QD_STRING(x) #x
#define QD_HEADER(dir) QD_STRING(dir/gemm_q6.h)
#define QD_IQ4_HEADER(dir) QD_STRING(dir/gemm_iq4.h)
#define QD_Q8_HEADER(dir) QD_STRING(dir/gemm_q8.h)
#define qd qd_a
#include QD_HEADER(QD_A)
#include QD_IQ4_HEADER(QD_A)
#include QD_Q8_HEADER(QD_A)
#undef qd
#undef QD_UNROLL
#define qd qd_b
#include QD_HEADER(QD_B)
#include QD_IQ4_HEADER(QD_B)
#include QD_Q8_HEADER(QD_B)
#undef qd

namespace {

// One copy of a shape's weights, q4 (sub_min, dmin), q6 (high; sub_scale read as int8) or iq4/iq4h (table; sub_scale
// read as int8).
struct Copy {
  std::vector<uint8_t> codes, sub_scale, sub_min, high;
  std::vector<int8_t> table;
  std::vector<float> d, dmin;
  std::vector<uint16_t> half_d;  // q8, q4t: a float16 scale per group
};

enum Format { kQ4, kQ6, kIq4, kIq4h, kQ8, kQ4t, kQ5 };

Copy make_copy(Format format, int64_t n, int64_t k, std::mt19937& rng) {
  const int64_t groups = k / 32, supers = (groups + 7) / 8;
  Copy c;
  c.codes.resize(format == kQ8 ? n * k : n * k / 2);
  for (auto& b : c.codes) b = static_cast<uint8_t>(rng());
  if (format == kQ8 || format == kQ4t) {
    for (int64_t i = 0; format == kQ4t && i < n; ++i) c.table.push_back(static_cast<int8_t>(i % 16 - 8));  // Q4_0's
    c.half_d.assign(n * groups, 0x1400);  // 2^-10
    return c;
  }
  const bool q4 = format == kQ4 || format == kQ5;  // q5: q4 with a plane of fifth bits
  c.sub_scale.resize(q4 || format == kIq4 ? n * groups : n * k / 16);
  for (auto& b : c.sub_scale) b = static_cast<uint8_t>(q4 ? rng() % 64 : format == kQ6 ? rng() : rng() % 64 - 32);
  if (format == kIq4 || format == kIq4h) {
    c.table.resize(n);  // 16 values per 16-row panel
    for (auto& v : c.table) v = static_cast<int8_t>(rng());
  } else if (q4) {
    c.sub_min.resize(n * groups);
    for (auto& b : c.sub_min) b = static_cast<uint8_t>(rng() % 64);
    c.dmin.assign(n * supers, 1e-4f);
  }
  if (format == kQ5 || format == kQ6) {
    c.high.resize(format == kQ5 ? n * k / 8 : n * k / 4);
    for (auto& b : c.high) b = static_cast<uint8_t>(rng());
  }
  c.d.assign(n * supers, 1e-3f);
  return c;
}

// Per-row sums the format's kernel wants: q4's and q5's group pairs, q6's sub-block offsets, iq4's, q8's and q4t's
// group and iq4h's half-group offsets (the same in both builds).
std::vector<int32_t> row_sums(Format format, const std::vector<int8_t>& x, int64_t rows, int64_t k) {
  const int64_t width = format == kQ4 || format == kQ5 ? k / 64 : format == kIq4 || format == kQ8 || format == kQ4t ? k / 32 : k / 16;
  std::vector<int32_t> sums(rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* row = sums.data() + r * width;
    if (format == kQ4 || format == kQ5) qd_a::group_sum_pairs(x.data() + r * k, k, row);
    else if (format == kQ6) qd_a::sub_block_offsets(x.data() + r * k, k, row);
    else if (format == kIq4 || format == kQ8 || format == kQ4t) qd_a::group_offsets(x.data() + r * k, k, row);
    else qd_a::half_group_offsets(x.data() + r * k, k, row);
  }
  return sums;
}

// which = 0 runs build A, 1 build B.
void gemm(int which, Format format, const Copy& c, int64_t n, int64_t k, const int8_t* x, int64_t rows,
          const int32_t* sums, float* out, int64_t begin, int64_t end) {
  const auto* scales = reinterpret_cast<const int8_t*>(c.sub_scale.data());
  if (format == kQ8 || format == kQ4t) {
    const int8_t* table = format == kQ4t ? c.table.data() : nullptr;
    if (which == 0) qd_a::q8_gemm({c.codes.data(), c.half_d.data(), n, k, nullptr, table}, x, rows, sums, out, n, begin, end);
    else qd_b::q8_gemm({c.codes.data(), c.half_d.data(), n, k, nullptr, table}, x, rows, sums, out, n, begin, end);
    return;
  }
  if (format == kIq4 || format == kIq4h) {
    const bool halves = format == kIq4h;
    if (which == 0)
      qd_a::iq4_gemm({c.codes.data(), c.table.data(), scales, c.d.data(), n, k, halves}, x, rows, sums, out, n, begin, end);
    else
      qd_b::iq4_gemm({c.codes.data(), c.table.data(), scales, c.d.data(), n, k, halves}, x, rows, sums, out, n, begin, end);
  } else if (format == kQ4 || format == kQ5) {
    const uint8_t* high = format == kQ5 ? c.high.data() : nullptr;
    if (which == 0)
      qd_a::q4_gemm({c.codes.data(), c.sub_scale.data(), c.sub_min.data(), c.d.data(), c.dmin.data(), n, k, high}, x,
                    rows, sums, out, n, begin, end);
    else
      qd_b::q4_gemm({c.codes.data(), c.sub_scale.data(), c.sub_min.data(), c.d.data(), c.dmin.data(), n, k, high}, x,
                    rows, sums, out, n, begin, end);
  } else if (which == 0)
    qd_a::q6_gemm({c.codes.data(), c.high.data(), scales, c.d.data(), n, k}, x, rows, sums, out, n, begin, end);
  else
    qd_b::q6_gemm({c.codes.data(), c.high.data(), scales, c.d.data(), n, k}, x, rows, sums, out, n, begin, end);
}

// Build A or B over every n-block, split between the threads as at::parallel_for does.
void call(int which, Format format, const Copy& c, int64_t n, int64_t k, const std::vector<int8_t>& x, int64_t rows,
          const std::vector<int32_t>& sums, std::vector<float>& out, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t blocks = n / 16, begin = blocks * t / count, end = blocks * (t + 1) / count;
    gemm(which, format, c, n, k, x.data(), rows, sums.data(), out.data(), begin, end);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> row_counts = {1, 2, 4, 8, 9, 12, 16, 24};
  if (argc > 1) {
    row_counts.clear();
    for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoll(argv[i]));
  }
  const struct {
    const char* name;
    int64_t n, k;
    Format format;
  } shapes[] = {{"q4 gate+up 1536->17920", 17920, 1536, kQ4},
                {"q4 down    8960->1536 ", 1536, 8960, kQ4},
                {"q5 gate+up 1536->17920", 17920, 1536, kQ5},
                {"q5 down    8960->1536 ", 1536, 8960, kQ5},
                {"q6 down    8960->1536 ", 1536, 8960, kQ6},
                {"q6 lm-head 1536->151936", 151936, 1536, kQ6},
                {"iq4 gate+up 1536->17920", 17920, 1536, kIq4},
                {"iq4 down   8960->1536 ", 1536, 8960, kIq4},
                {"iq4h gate+up 1536->17920", 17920, 1536, kIq4h},
                {"q8 gate+up 1536->17920", 17920, 1536, kQ8},
                {"q8 down   8960->1536 ", 1536, 8960, kQ8},
                {"q4t gate+up 1536->17920", 17920, 1536, kQ4t},
                {"q4t down  8960->1536 ", 1536, 8960, kQ4t}};
  std::mt19937 rng(7);
  std::printf("isa %s; 2 threads; best of 40 calls each, A B B A; ms\n", qd_b::kIsa);
  std::printf("%-24s %4s %8s %8s %6s\n", "shape", "rows", "A", "B", "B/A");
  const char* only = std::getenv("QD_SHAPES");
  for (const auto& shape : shapes) {
    if (only != nullptr && std::strstr(shape.name, only) == nullptr) continue;
    const int64_t bytes = shape.n * shape.k * (shape.format == kQ6 ? 13 : shape.format == kQ5 ? 11 : shape.format == kIq4h ? 10 : shape.format == kQ8 ? 17 : 9) / 16;
    const int copies = static_cast<int>(((int64_t{1} << 30) + bytes - 1) / bytes);
    std::vector<Copy> weights;
    for (int c = 0; c < copies; ++c) weights.push_back(make_copy(shape.format, shape.n, shape.k, rng));
    for (int64_t rows : row_counts) {
      std::vector<int8_t> x(rows * shape.k);
      for (auto& v : x) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      const std::vector<int32_t> sums = row_sums(shape.format, x, rows, shape.k);
      std::vector<float> out_a(rows * shape.n), out_b(rows * shape.n);
      double best[2] = {1e9, 1e9};
      for (int i = 0; i < 80; ++i) {
        const int which = (i % 4 == 0 || i % 4 == 3) ? 0 : 1;
        const auto t0 = std::chrono::steady_clock::now();
        call(which, shape.format, weights[(i + 1) % copies], shape.n, shape.k, x, rows, sums, which == 0 ? out_a : out_b, 2);
        best[which] = std::min(best[which], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      call(0, shape.format, weights[0], shape.n, shape.k, x, rows, sums, out_a, 2);
      call(1, shape.format, weights[0], shape.n, shape.k, x, rows, sums, out_b, 2);
      const bool same = std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)) == 0;
      std::printf("%-24s %4ld %8.3f %8.3f %6.3f %s\n", shape.name, static_cast<long>(rows), best[0] * 1e3,
                  best[1] * 1e3, best[1] / best[0], same ? "same bits" : "DIFFERENT BITS");
    }
  }
  return 0;
}
