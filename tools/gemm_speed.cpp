// How fast the native runtime's GEMMs (quickdraft/runtime/native/gemm.h, gemm_q6.h, ...) run for few rows: GMAC/s of
// the q4, q5, q6, q2, q8, q4t, iq4 and int8 kernels at the target's shapes (Qwen2.5-1.5B: gate+up 1536 -> 17920, down 8960 -> 1536, the
// 1536 -> 151936 LM head; a Q4_K_M file holds the head and half the down projections as Q6_K, a Q5_K_M file most
// of the rest as Q5_K, a Q3_K_M file its gate+up as Q3_K, which loads as q6, a Q2_K file most of the rest as Q2_K) for M = 1..32 rows, on 1 and 2 threads that share the output blocks as the runtime does. Weights are
// random (speed does not depend on them) and copies filling 1 GiB rotate, so every call streams them from memory as a
// decoding step does. Compare with tools/int8_peak.cpp's register-only VNNI rate.
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -Iquickdraft/runtime/native -Itools \
//       tools/gemm_speed.cpp -o /tmp/gemm_speed && /tmp/gemm_speed [rows ...]
// Add -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 for what a CPU without AMX runs.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gemm.h"
#include "gemm_iq4.h"
#include "gemm_q2.h"
#include "gemm_q6.h"
#include "gemm_q8.h"
#include "gemm_bench.h"

namespace {

using qd_bench::best_ms, qd_bench::make_q4, qd_bench::make_q5, qd_bench::Q4Copy, qd_bench::random_activations, qd_bench::random_bytes,
    qd_bench::run_blocks;

struct Q6Copy {
  std::vector<uint8_t> codes, high;
  std::vector<int8_t> sub_scale;
  std::vector<float> d;
  int64_t n = 0, k = 0;
  qd::Q6Weights weights() const { return {codes.data(), high.data(), sub_scale.data(), d.data(), n, k}; }
};

Q6Copy make_q6(int64_t n, int64_t k, std::mt19937& rng) {
  Q6Copy c;
  c.n = n;
  c.k = k;
  c.codes = random_bytes(n * k / 2, rng);
  c.high = random_bytes(n * k / 4, rng);
  const auto scales = random_bytes(n * k / qd::kSubBlock, rng);
  c.sub_scale.assign(scales.begin(), scales.end());
  c.d.assign(n * ((k / qd::kGroup + qd::kGroupsPerSuper - 1) / qd::kGroupsPerSuper), 1e-3f);
  return c;
}

struct Q2Copy {
  std::vector<uint8_t> codes, scales;
  std::vector<float> d, dmin;
  int64_t n = 0, k = 0;
  qd::Q2Weights weights() const { return {codes.data(), scales.data(), d.data(), dmin.data(), n, k}; }
};

Q2Copy make_q2(int64_t n, int64_t k, std::mt19937& rng) {
  Q2Copy c;
  c.n = n;
  c.k = k;
  c.codes = random_bytes(n * k / 4, rng);
  c.scales = random_bytes(n * k / qd::kQ2SubBlock, rng);
  const int64_t supers = n * ((k / qd::kGroup + qd::kGroupsPerSuper - 1) / qd::kGroupsPerSuper);
  c.d.assign(supers, 1e-3f);
  c.dmin.assign(supers, -1e-3f);
  return c;
}

struct Q8Copy {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> d;
  std::vector<int8_t> table;  // q4t: a panel's 16 values; empty for q8
  int64_t n = 0, k = 0;
  qd::Q8Weights weights() const { return {codes.data(), d.data(), n, k, nullptr, table.empty() ? nullptr : table.data()}; }
};

// q8, or with `nibbles` q4t (4-bit codes into Q4_0's table -8..7).
Q8Copy make_q8(int64_t n, int64_t k, std::mt19937& rng, bool nibbles = false) {
  Q8Copy c;
  c.n = n;
  c.k = k;
  c.codes = random_bytes(nibbles ? n * k / 2 : n * k, rng);
  for (int64_t i = 0; nibbles && i < n; ++i) c.table.push_back(static_cast<int8_t>(i % 16 - 8));  // n/16 panels' tables
  c.d.assign(n * k / qd::kGroup, 0x1400);  // float16 2^-10
  return c;
}

struct Iq4Copy {
  std::vector<uint8_t> codes;
  std::vector<int8_t> table, sub_scale;
  std::vector<float> d;
  int64_t n = 0, k = 0;
  qd::Iq4Weights weights() const { return {codes.data(), table.data(), sub_scale.data(), d.data(), n, k}; }
};

Iq4Copy make_iq4(int64_t n, int64_t k, std::mt19937& rng) {
  Iq4Copy c;
  c.n = n;
  c.k = k;
  c.codes = random_bytes(n * k / 2, rng);
  constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int64_t panel = 0; panel < n / qd::kLanes; ++panel) c.table.insert(c.table.end(), kIq4Values, kIq4Values + 16);
  for (const uint8_t b : random_bytes(n * k / qd::kGroup, rng)) c.sub_scale.push_back(static_cast<int8_t>(b % 64 - 32));
  c.d.assign(n * ((k / qd::kGroup + qd::kGroupsPerSuper - 1) / qd::kGroupsPerSuper), 1e-3f);
  return c;
}

struct Int8Copy {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
  int64_t k = 0;
  qd::Int8Weights weights() const { return {codes.data(), scale.data(), static_cast<int64_t>(scale.size()), k}; }
};

Int8Copy make_int8(int64_t n, int64_t k, std::mt19937& rng) {
  Int8Copy c;
  c.codes = random_bytes(n * k, rng);
  for (auto& b : c.codes) b = static_cast<uint8_t>(1 + b % 127);  // w + 64 with w in [-63, 63]
  c.scale.assign(n, 1e-3f);
  c.k = k;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> row_counts = {1, 2, 4, 8, 9, 12, 16, 24, 32};
  if (argc > 1) {
    row_counts.clear();
    for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoll(argv[i]));
  }
  std::mt19937 rng(7);
  constexpr int64_t kStreamBytes = int64_t{1} << 30;  // more than any last-level cache: weights come from memory
  enum Format { kQ4, kQ5, kQ6, kInt8, kQ8, kIq4, kQ4t, kQ2 };
  struct Shape {
    const char* name;
    int64_t n, k;
    Format format;
  };
  const Shape shapes[] = {{"q4   gate+up 1536->17920", 17920, 1536, kQ4},
                          {"q5   gate+up 1536->17920", 17920, 1536, kQ5},
                          {"int8 gate+up 1536->17920", 17920, 1536, kInt8},
                          {"q8   gate+up 1536->17920", 17920, 1536, kQ8},
                          {"iq4  gate+up 1536->17920", 17920, 1536, kIq4},
                          {"q4t  gate+up 1536->17920", 17920, 1536, kQ4t},
                          {"q6   gate+up 1536->17920", 17920, 1536, kQ6},
                          {"q2   gate+up 1536->17920", 17920, 1536, kQ2},
                          {"q4   down    8960->1536 ", 1536, 8960, kQ4},
                          {"q5   down    8960->1536 ", 1536, 8960, kQ5},
                          {"q6   down    8960->1536 ", 1536, 8960, kQ6},
                          {"q2   down    8960->1536 ", 1536, 8960, kQ2},
                          {"int8 down    8960->1536 ", 1536, 8960, kInt8},
                          {"q8   down    8960->1536 ", 1536, 8960, kQ8},
                          {"iq4  down    8960->1536 ", 1536, 8960, kIq4},
                          {"q4t  down    8960->1536 ", 1536, 8960, kQ4t},
                          {"q6   lm-head 1536->151936", 151936, 1536, kQ6},
                          {"int8 lm-head 1536->151936", 151936, 1536, kInt8}};
  std::printf("isa %s; best of 8 calls, weights rotating through 1 GiB; GMAC/s\n", qd::kIsa);
  std::printf("%-26s %4s %10s %10s %10s %10s\n", "shape", "rows", "1t ms", "1t GMAC/s", "2t ms", "2t GMAC/s");
  for (const Shape& shape : shapes) {
    std::vector<Q4Copy> q4;
    std::vector<Q6Copy> q6;
    std::vector<Int8Copy> int8;
    std::vector<Q8Copy> q8;
    std::vector<Iq4Copy> iq4;
    std::vector<Q2Copy> q2;
    const int sixteenths[] = {9, 11, 13, 16, 17, 9, 9, 6};  // bytes a weight, in 16ths, by format
    const int64_t bytes = shape.n * shape.k * sixteenths[shape.format] / 16;
    const int copies = static_cast<int>((kStreamBytes + bytes - 1) / bytes);
    for (int c = 0; c < copies; ++c) {
      if (shape.format == kQ4) q4.push_back(make_q4(shape.n, shape.k, rng));
      else if (shape.format == kQ5) q4.push_back(make_q5(shape.n, shape.k, rng));
      else if (shape.format == kQ6) q6.push_back(make_q6(shape.n, shape.k, rng));
      else if (shape.format == kQ8 || shape.format == kQ4t) q8.push_back(make_q8(shape.n, shape.k, rng, shape.format == kQ4t));
      else if (shape.format == kIq4) iq4.push_back(make_iq4(shape.n, shape.k, rng));
      else if (shape.format == kQ2) q2.push_back(make_q2(shape.n, shape.k, rng));
      else int8.push_back(make_int8(shape.n, shape.k, rng));
    }
    for (int64_t rows : row_counts) {
      const std::vector<int8_t> x = random_activations(rows * shape.k, rng);
      std::vector<int32_t> sums(rows), pairs(rows * shape.k / (2 * qd::kGroup)), sub_offsets(rows * shape.k / qd::kSubBlock),
          offsets(rows * shape.k / qd::kGroup), sub_pairs(rows * shape.k / qd::kGroup);
      for (int64_t r = 0; r < rows; ++r) {
        sums[r] = qd::row_sum(x.data() + r * shape.k, shape.k);
        qd::group_sum_pairs(x.data() + r * shape.k, shape.k, pairs.data() + r * shape.k / (2 * qd::kGroup));
        qd::sub_block_offsets(x.data() + r * shape.k, shape.k, sub_offsets.data() + r * shape.k / qd::kSubBlock);
        qd::group_offsets(x.data() + r * shape.k, shape.k, offsets.data() + r * shape.k / qd::kGroup);
        qd::sub_block_sum_pairs(x.data() + r * shape.k, shape.k, sub_pairs.data() + r * shape.k / qd::kGroup);
      }
      std::vector<float> out(rows * shape.n);
      double ms[2];
      int call = 0;
      for (int threads = 1; threads <= 2; ++threads) {
        ms[threads - 1] = best_ms(0, 8, [&](int) {
          const int i = call++;
          run_blocks(shape.n / qd::kLanes, threads, [&](int64_t begin, int64_t end) {
            if (shape.format == kQ4 || shape.format == kQ5)
              qd::q4_gemm(q4[i % copies].weights(), x.data(), rows, pairs.data(), out.data(), shape.n, begin, end);
            else if (shape.format == kQ6)
              qd::q6_gemm(q6[i % copies].weights(), x.data(), rows, sub_offsets.data(), out.data(), shape.n, begin, end);
            else if (shape.format == kQ8 || shape.format == kQ4t)
              qd::q8_gemm(q8[i % copies].weights(), x.data(), rows, offsets.data(), out.data(), shape.n, begin, end);
            else if (shape.format == kQ2)
              qd::q2_gemm(q2[i % copies].weights(), x.data(), rows, sub_pairs.data(), out.data(), shape.n, begin, end);
            else if (shape.format == kIq4)
              qd::iq4_gemm(iq4[i % copies].weights(), x.data(), rows, offsets.data(), out.data(), shape.n, begin, end);
            else
              qd::int8_gemm(int8[i % copies].weights(), x.data(), rows, sums.data(), out.data(), shape.n, begin, end);
          });
        });
      }
      const double gmac = 1e-9 * rows * shape.n * shape.k;
      std::printf("%-26s %4ld %10.3f %10.1f %10.3f %10.1f\n", shape.name, static_cast<long>(rows), ms[0],
                  gmac / ms[0] * 1e3, ms[1], gmac / ms[1] * 1e3);
    }
  }
  return 0;
}
