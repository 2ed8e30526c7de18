// Do the draft's GEMMs run slower inside a forward than alone? The runtime's q4 kernel (gemm.h) for one row at the
// 0.5B draft's shapes on 2 threads: each shape alone, rotating through copies that fill about 1 GiB (min, median
// and mean of 1,000 calls), then the 24 layers' 96 GEMMs in a forward's order on distinct weights (216 MB), the
// mean of 300 passes split by shape. A probe kept beside its output (gemm_sequence.txt).
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -Iquickdraft/runtime/native -Itools \
//       results/zen5-26/draft-forward/gemm_sequence.cpp -o /tmp/gemm_sequence && /tmp/gemm_sequence
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "gemm.h"
#include "gemm_bench.h"

namespace {

using qd_bench::make_q4, qd_bench::Q4Copy, qd_bench::random_activations, qd_bench::run_blocks;

struct Shape {
  const char* name;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"qkv", 1152, 896}, {"out", 896, 896}, {"gate+up", 9728, 896}, {"down", 896, 4864}};
constexpr int kLayers = 24, kThreads = 2;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  std::vector<int8_t> x;
  std::vector<int32_t> pairs;
  explicit Row(int64_t k, std::mt19937& rng) : x(random_activations(k, rng)), pairs(k / 64) {
    qd::group_sum_pairs(x.data(), k, pairs.data());
  }
};

void gemv(const Q4Copy& w, const Row& row, std::vector<float>& out) {
  run_blocks(w.n / qd::kLanes, kThreads, [&](int64_t begin, int64_t end) {
    qd::q4_gemm(w.weights(), row.x.data(), 1, row.pairs.data(), out.data(), w.n, begin, end);
  });
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::vector<float> out(9728);
  std::printf("isa %s; one row, %d threads; microseconds\n", qd::kIsa, kThreads);
  for (const Shape& shape : kShapes) {
    const Row row(shape.k, rng);
    const int copies = static_cast<int>(std::max<int64_t>(2, (1ll << 30) / (shape.n * shape.k * 9 / 16)));
    std::vector<Q4Copy> weights;
    for (int c = 0; c < copies; ++c) weights.push_back(make_q4(shape.n, shape.k, rng));
    std::vector<double> times;
    for (int call = 0; call < 1100; ++call) {
      const double start = seconds();
      gemv(weights[call % copies], row, out);
      if (call >= 100) times.push_back((seconds() - start) * 1e6);
    }
    std::sort(times.begin(), times.end());
    double mean = 0;
    for (const double t : times) mean += t / static_cast<double>(times.size());
    std::printf("%-8s alone:     min %6.1f  median %6.1f  mean %6.1f\n", shape.name, times.front(),
                times[times.size() / 2], mean);
  }
  std::vector<Q4Copy> layers;
  std::vector<Row> rows;
  for (int l = 0; l < kLayers; ++l)
    for (const Shape& shape : kShapes) layers.push_back(make_q4(shape.n, shape.k, rng));
  for (const Shape& shape : kShapes) rows.emplace_back(shape.k, rng);
  constexpr int kPasses = 300, kWarmups = 20;
  double by_shape[4] = {0, 0, 0, 0}, total = 0;
  for (int pass = 0; pass < kPasses + kWarmups; ++pass) {
    double this_pass[4] = {0, 0, 0, 0};
    const double start = seconds();
    for (int l = 0; l < kLayers; ++l)
      for (int s = 0; s < 4; ++s) {
        const double began = seconds();
        gemv(layers[l * 4 + s], rows[s], out);
        this_pass[s] += seconds() - began;
      }
    if (pass < kWarmups) continue;
    total += seconds() - start;
    for (int s = 0; s < 4; ++s) by_shape[s] += this_pass[s];
  }
  std::printf("24 layers in order, mean of %d passes: %.0f us (", kPasses, total / kPasses * 1e6);
  for (int s = 0; s < 4; ++s) std::printf("%s%s %.0f", s ? ", " : "", kShapes[s].name, by_shape[s] / kPasses * 1e6);
  std::printf("), %.1f us a layer's gate+up\n", by_shape[2] / kPasses / kLayers * 1e6);
}
