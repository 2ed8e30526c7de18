// Times qd::q4_gemm on the 17920-wide gate+up shape (K and rows from the command line), 2 threads sharing the
// n-blocks, best of ITERS calls; for perf:
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -g -Iquickdraft/runtime/native \
//       results/xeon-167/q4-amx-overlap/q4_driver.cpp -o /tmp/q4_driver && /tmp/q4_driver 1536 224 300
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "gemm.h"
int main(int argc, char** argv) {
  const int64_t n = 17920, k = atoll(argv[1]), rows = atoll(argv[2]), iters = atoll(argv[3]);
  std::mt19937 rng(1);
  const int64_t groups = k / 32, supers = (groups + 7) / 8;
  std::vector<uint8_t> codes(n * k / 2), ss(n * groups), sm(n * groups);
  for (auto& b : codes) b = rng(); for (auto& b : ss) b = rng() % 64; for (auto& b : sm) b = rng() % 64;
  std::vector<float> d(n * supers, 1e-3f), dm(n * supers, 1e-4f), out(rows * n);
  std::vector<int8_t> x(rows * k); for (auto& v : x) v = (int)(rng() % 255) - 127;
  std::vector<int32_t> pairs(rows * k / 64);
  for (int64_t r = 0; r < rows; ++r) qd::group_sum_pairs(x.data() + r * k, k, pairs.data() + r * k / 64);
  qd::Q4Weights w{codes.data(), ss.data(), sm.data(), d.data(), dm.data(), n, k};
  double best = 1e9;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
    { int t = omp_get_thread_num(); int64_t b = n / 16; qd::q4_gemm(w, x.data(), rows, pairs.data(), out.data(), n, b * t / 2, b * (t + 1) / 2); }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  printf("best %.3f ms, %.0f GMAC/s\n", best * 1e3, rows * n * k / best / 1e9);
}
