// What TEAL-style activation sparsity could save the draft model: one row through 4-bit GEMVs that read only the
// weights of the input's nonzero channels, against the runtime's q4 kernel (quickdraft/runtime/native/gemm.h) reading
// them all, at the 0.5B draft's shapes, on 1 and 2 threads. A measurement, not a runtime kernel.
//
// Two layouts, both 4.5 bits a weight as Q4_K (4-bit codes, a float16 scale and minimum per 64 outputs of a channel):
// - f: tiles of 256 outputs, each holding channel after channel its 256 codes (128 bytes) and scales. A tile sums
//   x_k·scale·code + x_k·minimum over the nonzero channels in float32. A channel left out is a 144-byte gap.
// - i: channel-major, each channel's N codes contiguous, so a channel left out is an N/2-byte gap. x_k·scale is
//   rounded to int8 at a step per group of 64 outputs (its largest scale times max|x|, over 127), and four channels at
//   a time are multiplied by vpdpbusd after interleaving their codes; int8_reference is its oracle, bit for bit.
// Weights are random, and copies filling 1.5 GiB rotate, so every call streams them from memory as a drafted token
// does. The columns are ms, the best of 48 calls; "f0.50 2t" is layout f at density 0.5 on 2 threads.
//   g++ -std=c++17 -O3 -march=native -ffp-contract=off -fopenmp -Iquickdraft/runtime/native -Itools \
//       tools/sparse_gemv.cpp -o /tmp/sparse_gemv && /tmp/sparse_gemv [density ...]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gemm.h"
#include "gemm_bench.h"

namespace {

using qd_bench::best_ms, qd_bench::make_q4, qd_bench::Q4Copy, qd_bench::random_activations, qd_bench::random_bytes,
    qd_bench::run_blocks;

constexpr int64_t kTile = 256, kTileBytes = 128, kGroupOutputs = 64, kGroupsPerTile = kTile / kGroupOutputs;

struct ColumnQ4 {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;    // [N/256, K, 128]
  std::vector<uint16_t> scales;  // [N/256, K, 4] float16
  std::vector<uint16_t> mins;    // [N/256, K, 4] float16
  // Output j of a tile: byte j % 128 of its channel's 128, the low nibble for j < 128, else the high one.
  int code(int64_t out, int64_t channel) const {
    const int64_t tile = out / kTile, j = out % kTile;
    const uint8_t byte = codes[(tile * k + channel) * kTileBytes + j % kTileBytes];
    return j < kTileBytes ? byte & 15 : byte >> 4;
  }
};

float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// n float16 values drawn uniformly from [low, high).
std::vector<uint16_t> random_halves(size_t n, float low, float high, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(low, high);
  std::vector<uint16_t> halves(n);
  for (auto& h : halves) h = _cvtss_sh(value(rng), 0);
  return halves;
}

ColumnQ4 make_column(int64_t n, int64_t k, std::mt19937& rng) {
  ColumnQ4 w;
  w.n = n, w.k = k;
  w.codes = random_bytes(n / kTile * k * kTileBytes, rng);
  w.scales = random_halves(n / kTile * k * kGroupsPerTile, 1e-3f, 2e-3f, rng);
  w.mins = random_halves(w.scales.size(), -2e-2f, -1e-2f, rng);
  return w;
}

// out[tile range] = W x over the channels `nonzero` (ascending), in float32: each code converted and multiplied.
void column_gemv(const ColumnQ4& w, const float* x, const int32_t* nonzero, int64_t count, float* out,
                 int64_t tile_begin, int64_t tile_end) {
  const __m512i low_nibbles = _mm512_set1_epi8(15);
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    __m128 offset = _mm_setzero_ps();  // the minimums' sum per group of 64 outputs
    const uint8_t* tile_codes = w.codes.data() + tile * w.k * kTileBytes;
    const uint16_t* tile_scales = w.scales.data() + tile * w.k * kGroupsPerTile;
    const uint16_t* tile_mins = w.mins.data() + tile * w.k * kGroupsPerTile;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t channel = nonzero[i];
      const __m128 xk = _mm_set1_ps(x[channel]);
      if (i + 4 < count) _mm_prefetch(reinterpret_cast<const char*>(tile_codes + nonzero[i + 4] * kTileBytes), _MM_HINT_T0);
      const __m128i scale_bits = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tile_scales + channel * 4));
      const __m128i min_bits = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tile_mins + channel * 4));
      const __m128 scaled = _mm_mul_ps(_mm_cvtph_ps(scale_bits), xk);
      offset = _mm_add_ps(offset, _mm_mul_ps(_mm_cvtph_ps(min_bits), xk));
      alignas(16) float a[4];
      _mm_store_ps(a, scaled);
      const uint8_t* c = tile_codes + channel * kTileBytes;
      const __m512i first = _mm512_loadu_si512(c), second = _mm512_loadu_si512(c + 64);
      const __m512i groups[4] = {_mm512_and_si512(first, low_nibbles), _mm512_and_si512(second, low_nibbles),
                                 _mm512_and_si512(_mm512_srli_epi16(first, 4), low_nibbles),
                                 _mm512_and_si512(_mm512_srli_epi16(second, 4), low_nibbles)};
      for (int g = 0; g < 4; ++g) {
        const __m512 ag = _mm512_set1_ps(a[g]);
        for (int q = 0; q < 4; ++q) {
          const __m128i bytes = _mm512_extracti32x4_epi32(groups[g], q);  // q is a constant after unrolling
          const __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
          acc[g * 4 + q] = _mm512_add_ps(acc[g * 4 + q], _mm512_mul_ps(ag, codes));
        }
      }
    }
    alignas(16) float offsets[4];
    _mm_store_ps(offsets, offset);
    float* o = out + tile * kTile;
    for (int g = 0; g < 4; ++g)
      for (int q = 0; q < 4; ++q)
        _mm512_storeu_ps(o + g * 64 + q * 16, _mm512_add_ps(acc[g * 4 + q], _mm512_set1_ps(offsets[g])));
  }
}

// Channel-major 4-bit weights for the int8 kernel: channel k's N codes are contiguous, so a channel left out is a
// gap of N/2 bytes. Per channel and group of 64 outputs, 32 bytes (code position b in the
// low nibble of byte b, 32 + b in its high nibble) and a float16 scale and minimum. Code position 16L + 4q + j holds
// output 16q + 4L + j of its group: interleaving four channels' codes within 128-bit lanes puts outputs 16q..16q+15
// in accumulator q in order. Each group also keeps its largest scale, which sets its int8 step.
struct ChannelQ4 {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;    // [K, N/2]
  std::vector<uint16_t> scales;  // [K, N/64] float16
  std::vector<uint16_t> mins;    // [K, N/64] float16
  std::vector<float> largest;    // [N/64]: the largest scale of each group over the channels
  int64_t groups() const { return n / kGroupOutputs; }
  int code(int64_t out, int64_t channel) const {
    const int64_t g = out / kGroupOutputs, within = out % kGroupOutputs;
    const int64_t position = 16 * ((within % 16) / 4) + 4 * (within / 16) + within % 4;
    const uint8_t byte = codes[channel * n / 2 + g * 32 + position % 32];
    return position < 32 ? byte & 15 : byte >> 4;
  }
};

ChannelQ4 make_channel(int64_t n, int64_t k, std::mt19937& rng) {
  ChannelQ4 w;
  w.n = n, w.k = k;
  w.codes = random_bytes(n * k / 2, rng);
  w.scales = random_halves(k * w.groups(), 1e-3f, 2e-3f, rng);
  w.mins = random_halves(w.scales.size(), -2e-2f, -1e-2f, rng);
  w.largest.assign(w.groups(), 0.0f);
  for (int64_t c = 0; c < k; ++c)
    for (int64_t g = 0; g < w.groups(); ++g)
      w.largest[g] = std::max(w.largest[g], half_to_float(w.scales[c * w.groups() + g]));
  return w;
}

// The float kernel's arithmetic, one output at a time.
float column_reference(const ColumnQ4& w, const float* x, const std::vector<int32_t>& nonzero, int64_t out) {
  const int64_t tile = out / kTile, group = (out % kTile) / kGroupOutputs;
  float total = 0.0f, offset = 0.0f;
  for (int32_t channel : nonzero) {
    const int64_t at = (tile * w.k + channel) * kGroupsPerTile + group;
    total += half_to_float(w.scales[at]) * x[channel] * static_cast<float>(w.code(out, channel));
    offset += half_to_float(w.mins[at]) * x[channel];
  }
  return total + offset;
}

// The int8 kernel's arithmetic, one output at a time: group g's step is largest_g · max|x| / 127; each channel's
// x_k·scale is rounded to int8 at that step; integer sums of those times the codes, in channel order; then
// step · sum + the minimums' sum (float, in channel order).
float int8_reference(const ChannelQ4& w, const float* x, const std::vector<int32_t>& nonzero, int64_t out) {
  const int64_t g = out / kGroupOutputs;
  float x_max = 0.0f, offset = 0.0f;
  for (int32_t channel : nonzero) x_max = std::max(x_max, std::fabs(x[channel]));
  const float step = std::max(w.largest[g] * x_max, 1e-30f) / 127.0f, inverse = 1.0f / step;
  int32_t total = 0;
  for (int32_t channel : nonzero) {
    const float scale = half_to_float(w.scales[channel * w.groups() + g]);
    total += static_cast<int32_t>(std::nearbyint(scale * x[channel] * inverse)) * w.code(out, channel);
    offset += half_to_float(w.mins[channel * w.groups() + g]) * x[channel];
  }
  return static_cast<float>(total) * step + offset;
}

// out[groups begin..end) = W x over the channels `nonzero` (ascending), four channels at a time with vpdpbusd.
// `work` holds (2 + quads + 64) int32 of scratch per group, quads = ceil(count / 4).
void int8_gemv(const ChannelQ4& w, const float* x, const int32_t* nonzero, int64_t count, float* out,
               int64_t group_begin, int64_t group_end, int32_t* work) {
  const int64_t groups = group_end - group_begin, quads = (count + 3) / 4;
  float x_max = 0.0f;
  for (int64_t i = 0; i < count; ++i) x_max = std::max(x_max, std::fabs(x[nonzero[i]]));
  float* steps = reinterpret_cast<float*>(work);              // [groups]
  float* offsets = steps + groups;                            // [groups]
  int32_t* betas = work + 2 * groups;                         // [quads, groups]: four channels' int8 betas
  int32_t* sums = betas + quads * groups;                     // [groups, 64]
  for (int64_t g = 0; g < groups; ++g) {
    steps[g] = std::max(w.largest[group_begin + g] * x_max, 1e-30f) / 127.0f;
    offsets[g] = 0.0f;
  }
  for (int64_t g = 0; g < groups; g += 16) {  // 1. int8 betas, 16 groups at a time, four channels to an int32
    const __mmask16 valid = static_cast<__mmask16>(groups - g >= 16 ? 0xFFFF : (1u << (groups - g)) - 1);
    const __m512 inverse = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_maskz_loadu_ps(valid, steps + g));
    __m512 offset = _mm512_setzero_ps();
    for (int64_t quad = 0; quad < quads; ++quad) {
      __m128i bytes[4];
      for (int c = 0; c < 4; ++c) {
        if (4 * quad + c >= count) {
          bytes[c] = _mm_setzero_si128();
          continue;
        }
        const int64_t channel = nonzero[4 * quad + c], at = channel * w.groups() + group_begin + g;
        const __m512 xk = _mm512_set1_ps(x[channel]);
        const __m512 scale = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.scales.data() + at));
        offset = _mm512_add_ps(offset, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.mins.data() + at)), xk));
        bytes[c] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(scale, xk), inverse)));
      }
      const __m128i low01 = _mm_unpacklo_epi8(bytes[0], bytes[1]), high01 = _mm_unpackhi_epi8(bytes[0], bytes[1]);
      const __m128i low23 = _mm_unpacklo_epi8(bytes[2], bytes[3]), high23 = _mm_unpackhi_epi8(bytes[2], bytes[3]);
      alignas(64) int32_t packed[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(packed), _mm_unpacklo_epi16(low01, low23));
      _mm_store_si128(reinterpret_cast<__m128i*>(packed + 4), _mm_unpackhi_epi16(low01, low23));
      _mm_store_si128(reinterpret_cast<__m128i*>(packed + 8), _mm_unpacklo_epi16(high01, high23));
      _mm_store_si128(reinterpret_cast<__m128i*>(packed + 12), _mm_unpackhi_epi16(high01, high23));
      std::memcpy(betas + quad * groups + g, packed, 4 * std::min<int64_t>(16, groups - g));
    }
    _mm512_mask_storeu_ps(offsets + g, valid, offset);
  }
  std::memset(sums, 0, groups * kGroupOutputs * sizeof(int32_t));
  const __m256i low_nibbles = _mm256_set1_epi8(15);
  for (int64_t quad = 0; quad < quads; ++quad) {  // 2. integer sums: four columns streamed side by side
    const uint8_t* column[4];
    for (int c = 0; c < 4; ++c)
      column[c] = w.codes.data() + nonzero[std::min(4 * quad + c, count - 1)] * w.n / 2 + group_begin * 32;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i codes[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column[c] + g * 32));
        codes[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, low_nibbles)),
                                      _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles), 1);
      }
      const __m512i quad_betas = _mm512_set1_epi32(betas[quad * groups + g]);
      const __m512i low01 = _mm512_unpacklo_epi8(codes[0], codes[1]), high01 = _mm512_unpackhi_epi8(codes[0], codes[1]);
      const __m512i low23 = _mm512_unpacklo_epi8(codes[2], codes[3]), high23 = _mm512_unpackhi_epi8(codes[2], codes[3]);
      int32_t* sum = sums + g * kGroupOutputs;
      const __m512i parts[4] = {_mm512_unpacklo_epi16(low01, low23), _mm512_unpackhi_epi16(low01, low23),
                                _mm512_unpacklo_epi16(high01, high23), _mm512_unpackhi_epi16(high01, high23)};
      for (int q = 0; q < 4; ++q)
        _mm512_storeu_si512(sum + 16 * q, _mm512_dpbusd_epi32(_mm512_loadu_si512(sum + 16 * q), parts[q], quad_betas));
    }
  }
  for (int64_t g = 0; g < groups; ++g)  // 3. back to floats
    for (int q = 0; q < 4; ++q)
      _mm512_storeu_ps(out + (group_begin + g) * kGroupOutputs + 16 * q,
                       _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums + g * 64 + 16 * q)),
                                                   _mm512_set1_ps(steps[g])),
                                     _mm512_set1_ps(offsets[g])));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> densities = {1.0, 0.6, 0.5, 0.4};
  if (argc > 1) {
    densities.clear();
    for (int i = 1; i < argc; ++i) densities.push_back(std::atof(argv[i]));
  }
  std::mt19937 rng(7);
  constexpr int64_t kStreamBytes = int64_t{1} << 30;
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  // Qwen2.5-0.5B: hidden 896, 14 query and 2 key-value heads of 64, intermediate 4864; 24 layers.
  const Shape shapes[] = {{"qkv     896->1152", 1152, 896},
                          {"out     896->896 ", 896, 896},
                          {"gate+up 896->9728", 9728, 896},
                          {"down   4864->896 ", 896, 4864}};
  {  // the kernels against their scalar references
    ColumnQ4 tiles = make_column(512, 256, rng);
    ChannelQ4 w = make_channel(512, 256, rng);
    std::vector<float> x(256);
    std::vector<int32_t> nonzero;
    for (int32_t k = 0; k < 256; ++k) {
      x[k] = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      if (rng() % 2) nonzero.push_back(k);
    }
    std::vector<float> out(512);
    std::vector<int32_t> work(8 * (2 + 256 / 4 + 64));
    int8_gemv(w, x.data(), nonzero.data(), static_cast<int64_t>(nonzero.size()), out.data(), 0, 8, work.data());
    int different = 0;
    for (int64_t o = 0; o < 512; ++o) different += out[o] != int8_reference(w, x.data(), nonzero, o);
    column_gemv(tiles, x.data(), nonzero.data(), static_cast<int64_t>(nonzero.size()), out.data(), 0, 2);
    for (int64_t o = 0; o < 512; ++o) different += out[o] != column_reference(tiles, x.data(), nonzero, o);
    std::printf("both kernels against their references: %d of 1024 outputs differ\n", different);
    if (different) return 1;
  }
  std::printf("isa %s; one row; best of 48 calls after 4, weights rotating through 1.5 GiB; ms\n", qd::kIsa);
  std::printf("%-18s %8s %8s", "shape", "q4 1t", "q4 2t");
  for (double density : densities) std::printf("  f%.2f 2t  i%.2f 1t  i%.2f 2t", density, density, density);
  std::printf("\n");
  for (const Shape& shape : shapes) {
    const int64_t bytes = shape.n * shape.k * 9 / 16;
    const int copies = static_cast<int>((kStreamBytes / 2 + bytes - 1) / bytes);  // three formats: 1.5 GiB
    std::vector<Q4Copy> q4;
    std::vector<ColumnQ4> column;
    for (int c = 0; c < copies; ++c) q4.push_back(make_q4(shape.n, shape.k, rng));
    const int64_t padded = (shape.n + kTile - 1) / kTile * kTile;  // the column layout's outputs, in whole tiles
    for (int c = 0; c < copies; ++c) column.push_back(make_column(padded, shape.k, rng));
    std::vector<ChannelQ4> channel;
    for (int c = 0; c < copies; ++c) channel.push_back(make_channel(shape.n, shape.k, rng));
    const std::vector<int8_t> xq = random_activations(shape.k, rng);
    std::vector<int32_t> pairs(shape.k / (2 * qd::kGroup));
    qd::group_sum_pairs(xq.data(), shape.k, pairs.data());
    std::vector<float> x(shape.k), out(padded);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    int call = 0;
    std::printf("%-18s", shape.name);
    for (int threads = 1; threads <= 2; ++threads)
      std::printf(" %8.3f", best_ms(4, 48, [&](int) {
                    const Q4Copy& w = q4[call++ % copies];
                    run_blocks(shape.n / qd::kLanes, threads, [&](int64_t begin, int64_t end) {
                      qd::q4_gemm(w.weights(), xq.data(), 1, pairs.data(), out.data(), shape.n, begin, end);
                    });
                  }));
    for (double density : densities) {
      std::vector<int32_t> nonzero;  // a random `density` share of the channels, ascending
      for (int32_t k = 0; k < shape.k; ++k)
        if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < density) nonzero.push_back(k);
      const int64_t count = static_cast<int64_t>(nonzero.size());
      std::printf(" %9.3f", best_ms(4, 48, [&](int) {
                    const ColumnQ4& w = column[call++ % copies];
                    run_blocks(padded / kTile, 2, [&](int64_t begin, int64_t end) {
                      column_gemv(w, x.data(), nonzero.data(), count, out.data(), begin, end);
                    });
                  }));
      const int64_t groups = shape.n / kGroupOutputs;
      std::vector<std::vector<int32_t>> work(2, std::vector<int32_t>(groups * (2 + (shape.k + 3) / 4 + 64)));
      for (int threads = 1; threads <= 2; ++threads)
        std::printf(" %9.3f", best_ms(4, 48, [&](int) {
                      const ChannelQ4& w = channel[call++ % copies];
                      run_blocks(groups, threads, [&](int64_t begin, int64_t end) {
                        int8_gemv(w, x.data(), nonzero.data(), count, out.data(), begin, end,
                                  work[omp_get_thread_num()].data());
                      });
                    }));
    }
    std::printf("\n");
  }
  return 0;
}
