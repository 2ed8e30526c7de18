// What tools/gemm_speed.cpp and tools/sparse_gemv.cpp share: random q4 weights in the runtime's layout, the runtime's
// split of output blocks between threads, and the best time of repeated calls. Include after gemm.h.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace qd_bench {

inline std::vector<uint8_t> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Random int8 activations in [-127, 127], as the kernels' quantized rows hold them.
inline std::vector<int8_t> random_activations(size_t n, std::mt19937& rng) {
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  return v;
}

struct Q4Copy {
  std::vector<uint8_t> codes, sub_scale, sub_min, high;  // high: q5's fifth bits (empty for q4)
  std::vector<float> d, dmin;
  qd::Q4Weights weights() const {
    return {codes.data(), sub_scale.data(), sub_min.data(), d.data(), dmin.data(), n, groups * qd::kGroup,
            high.empty() ? nullptr : high.data()};
  }
  int64_t n = 0, groups = 0, supers = 0;
};

inline Q4Copy make_q4(int64_t n, int64_t k, std::mt19937& rng) {
  Q4Copy c;
  c.n = n;
  c.groups = k / qd::kGroup;
  c.supers = (c.groups + qd::kGroupsPerSuper - 1) / qd::kGroupsPerSuper;
  c.codes = random_bytes(n * k / 2, rng);
  c.sub_scale = random_bytes(n * c.groups, rng);
  c.sub_min = random_bytes(n * c.groups, rng);
  c.d.assign(n * c.supers, 1e-3f);
  c.dmin.assign(n * c.supers, 1e-4f);
  return c;
}

inline Q4Copy make_q5(int64_t n, int64_t k, std::mt19937& rng) {
  Q4Copy c = make_q4(n, k, rng);
  c.high = random_bytes(n * k / 8, rng);
  return c;
}

// Each thread takes a contiguous range of `units` (output blocks), as at::parallel_for(0, N/16, 1) does.
template <typename Work>
void run_blocks(int64_t units, int threads, Work work) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t begin = units * t / count, end = units * (t + 1) / count;
    if (begin < end) work(begin, end);
  }
}

// The fastest of `repeats` calls in milliseconds, after `warmups` untimed ones; call(i) numbers every call.
template <typename Call>
double best_ms(int warmups, int repeats, Call call) {
  int i = 0;
  while (i < warmups) call(i++);
  double best = 1e9;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    call(i++);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace qd_bench
