// The native runtime's integer GEMMs: out[m][n] for quantized activation rows x[m] (int8, values in [-127, 127])
// against weights in one of the packed formats below (and gemm_q6.h's, gemm_q8.h's). Every output element is a function of its own row and column
// alone, computed with exact integer sums and then a fixed sequence of float operations, so it has the same
// bits whatever the number of rows in the call, the tile a row lands in, the thread, or the instruction set
// (AVX-512 VNNI, AVX-VNNI, AVX2 or plain C++): the integer parts are exact on every path and the float parts
// are the same operations in the same order (compiled with -ffp-contract=off: no fused multiply-adds but those
// written out, std::fma on the plain path).
//
// Format "int8" (7-bit weights, one scale per output channel):
//   out[m][n] = float(sum_k x[m][k] * w[n][k]) * scale[n],      w in [-63, 63]
//   codes hold w + 64 (unsigned bytes, so u8 x s8 pair sums stay below 2^15 on AVX2), as
//   [N/16][K/4][16 lanes][4 bytes]: one 64-byte vector holds 4 consecutive k of 16 consecutive n.
//   (The same bits as the fbgemm GEMM of earlier versions, whose quantization a sentinel row pinned per row.)
//
// Format "q4" (4-bit codes in groups of 32 along k, llama.cpp's Q4_K structure):
//   w[n][k] = d[n][s] * sub_scale[n][g] * code[n][k] + dmin[n][s] * sub_min[n][g]
//   for k in group g = k / 32 of superblock s = g / 8; codes in [0, 15], sub-scales and sub-mins in [0, 255].
//   out[m][n] = the float sequence of q4_reference below: per superblock s, in order,
//     acc = fma(d[n][s], float(T), acc),   T = sum_{g in s} sub_scale[n][g] * sum_{k in g} code * x   (exact int32)
//     acc = fma(dmin[n][s], float(O), acc), O = sum_{g in s} sub_min[n][g] * X[m][g], X[m][g] = sum_{k in g} x[m][k]
//   (T is one integer per superblock, so AMX can sum it on tiles: gemm_amx.h).
//   codes: [N/16][G][4 vectors][16 lanes][4 bytes], each byte two codes: the low nibble is k = 32g + 4j + i of
//   lane n0 + l, the high nibble k = 32g + 4(j + 4) + i (vector j, lane l, byte i). sub_scale: [N/16][G][16];
//   sub_min: [N/16][G/2][16][2] (the two groups of a pair side by side); d, dmin: [N/16][S][16] float.
//   K must be a multiple of 64.
//
// Format "q5" (llama.cpp's Q5_K structure): "q4" with codes in [0, 31], their fifth bits in a plane beside the
// nibbles: high: [N/16][G][16 lanes][4 bytes], bit j of byte (l, i) the fifth bit of k = 32g + 4j + i of lane n0 + l
// (code vector j's byte). The same sums and float sequence as q4, so q4_reference defines both.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE__)
#include <immintrin.h>
#endif

// Loops over a tile's rows or a group's vectors run fully unrolled, so their accumulators live in registers.
#define QD_PRAGMA(x) _Pragma(#x)
#define QD_UNROLL QD_PRAGMA(GCC unroll 16)

namespace qd {

constexpr int64_t kLanes = 16;          // outputs per block: one 512-bit vector of int32 or float
constexpr int64_t kGroup = 32;          // q4: weights per group (a sub-scale and a sub-min each)
constexpr int64_t kGroupsPerSuper = 8;  // q4: groups per superblock (a d and a dmin each)
constexpr int32_t kInt8Offset = 64;     // int8: codes hold w + 64

// The end of superblock s's groups: 8 groups after its first, or fewer in a row's last, short superblock.
inline int64_t super_end(int64_t s, int64_t groups) {
  return (s + 1) * kGroupsPerSuper < groups ? (s + 1) * kGroupsPerSuper : groups;
}

// A call streams its weights from memory once. The hardware prefetchers stop at 4 KiB pages, so the vector paths
// ask for the codes this far ahead of the ones they multiply into L1 (tools/gemm_speed.cpp: on the Xeon, 8 rows of
// the 1536 -> 17920 q4 GEMM went from 1.05 to 0.74 ms, 16 rows of the LM head from 18.2 to 11.8 ms), and further
// ahead into L2, so that a tile of a few rows, whose arithmetic keeps the core busy between loads, still has its
// next codes on the way (docs/design.md: verifying 2-8 tokens on an EPYC without AMX).
constexpr int64_t kPrefetchBytes = 3072;
constexpr int64_t kPrefetchL2Bytes = 8192;

inline void prefetch(const uint8_t* p) {
#if defined(__SSE__)
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL2Bytes), _MM_HINT_T1);
#else
  (void)p;
#endif
}

struct Int8Weights {
  const uint8_t* codes;  // [N/16][K/4][16][4]
  const float* scale;    // [N]
  int64_t n, k;
};

struct Q4Weights {
  const uint8_t* codes;      // [N/16][G][4][16][4] nibbles
  const uint8_t* sub_scale;  // [N/16][G][16]
  const uint8_t* sub_min;    // [N/16][G/2][16][2]
  const float* d;            // [N/16][S][16]
  const float* dmin;         // [N/16][S][16]
  int64_t n, k;
  const uint8_t* high = nullptr;  // q5: [N/16][G][16][4] the codes' fifth bits; null for q4
  int64_t groups() const { return k / kGroup; }
  int64_t supers() const { return (groups() + kGroupsPerSuper - 1) / kGroupsPerSuper; }
};

}  // namespace qd

#include "gemm_amx.h"  // the AMX paths, which take the formats above

namespace qd {

// Per-row sums the kernels need besides the rows themselves: int8 wants sum_k x, q4 the sums of each group as int16
// pairs packed in 32 bits (the second of a pair in the high half) for one multiply-add per pair, q6 its
// sub-blocks' offsets (gemm_q6.h), and q8 and iq4 their groups' offsets (group_offsets).
inline int32_t row_sum(const int8_t* x, int64_t k) {
  int32_t total = 0;
  for (int64_t i = 0; i < k; ++i) total += x[i];
  return total;
}

// pairs[p] = (sum of group 2p, sum of group 2p + 1) for the k / 64 pairs of groups; |sum| <= 32 * 127 fits in 16 bits.
inline void group_sum_pairs(const int8_t* x, int64_t k, int32_t* pairs) {
  for (int64_t p = 0; p < k / (2 * kGroup); ++p) {
    const int32_t low = row_sum(x + 2 * p * kGroup, kGroup), high = row_sum(x + (2 * p + 1) * kGroup, kGroup);
    pairs[p] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(low)) |
                                    (static_cast<uint32_t>(static_cast<uint16_t>(high)) << 16));
  }
}

// What makes a signed byte's value + 128 an unsigned byte: the paths whose byte multiply-adds take unsigned codes
// (q8's codes, iq4's values on VNNI) multiply code + 128 and start each group's sum at -128 * X[g].
constexpr int32_t kByteOffset = 128;

// offsets[g] = -128 * X[g] for each of the k / 32 groups, X[g] = sum_{k in g} x[k].
inline void group_offsets(const int8_t* x, int64_t k, int32_t* offsets) {
  for (int64_t g = 0; g < k / kGroup; ++g) offsets[g] = -kByteOffset * row_sum(x + g * kGroup, kGroup);
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- the definitions, one element at a time (the oracle of the tests; also the path without AVX2) ----------

inline uint8_t int8_code(const Int8Weights& w, int64_t n, int64_t k) {
  return w.codes[((n / kLanes) * (w.k / 4) + k / 4) * 64 + (n % kLanes) * 4 + k % 4];
}

inline float int8_reference(const Int8Weights& w, const int8_t* x, int64_t n) {
  int32_t total = 0;
  for (int64_t k = 0; k < w.k; ++k) total += (static_cast<int32_t>(int8_code(w, n, k)) - kInt8Offset) * x[k];
  return static_cast<float>(total) * w.scale[n];
}

inline uint8_t q4_code(const Q4Weights& w, int64_t n, int64_t k) {
  const int64_t g = k / kGroup, within = k % kGroup, j = (within / 4) % 4, i = within % 4;
  const uint8_t byte = w.codes[(((n / kLanes) * w.groups() + g) * 4 + j) * 64 + (n % kLanes) * 4 + i];
  const uint8_t nibble = within < 16 ? byte & 0x0F : byte >> 4;
  if (w.high == nullptr) return nibble;
  const uint8_t fifth = w.high[((n / kLanes) * w.groups() + g) * 64 + (n % kLanes) * 4 + i] >> (within / 4);
  return static_cast<uint8_t>(nibble | ((fifth & 1) << 4));
}

inline float q4_reference(const Q4Weights& w, const int8_t* x, int64_t n) {
  const int64_t block = n / kLanes, lane = n % kLanes, groups = w.groups();
  float acc = 0.0f;
  for (int64_t s = 0; s < w.supers(); ++s) {
    int32_t total = 0, offset = 0;  // |total| <= 8 * 255 * 32 * 31 * 127 < 2^31 (q5's codes)
    const float d = w.d[(block * w.supers() + s) * kLanes + lane];
    const float dmin = w.dmin[(block * w.supers() + s) * kLanes + lane];
    for (int64_t g = s * kGroupsPerSuper; g < groups && g < (s + 1) * kGroupsPerSuper; ++g) {
      int32_t dot = 0, sum = 0;
      for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) dot += q4_code(w, n, k) * x[k], sum += x[k];
      total += static_cast<int32_t>(w.sub_scale[(block * groups + g) * kLanes + lane]) * dot;
      offset += static_cast<int32_t>(w.sub_min[((block * groups + g - g % 2) * kLanes + 2 * lane) + g % 2]) * sum;
    }
    acc = std::fma(d, static_cast<float>(total), acc);
    acc = std::fma(dmin, static_cast<float>(offset), acc);
  }
  return acc;
}

// A tile's outputs from a format's definition, element by element (the path without AVX2):
// out[r][n] = reference(row r, n) for the block's 16 outputs.
template <int R, typename Reference>
inline void reference_tile(Reference reference, const int8_t* x, int64_t x_stride, int64_t block, float* out,
                           int64_t out_stride) {
  QD_UNROLL for (int r = 0; r < R; ++r)
    for (int64_t n = block * kLanes; n < (block + 1) * kLanes; ++n) out[r * out_stride + n] = reference(x + r * x_stride, n);
}

// run(std::true_type{}) or run(std::false_type{}): a weight's optional part (q5's fifth bits, q8m's mins) chosen once
// per call as a template argument, so the tiles hold no branch on it.
template <typename Run>
inline void with_flag(bool flag, Run run) {
  if (flag) run(std::true_type{});
  else run(std::false_type{});
}

// ---- the fast paths: out[m][n] for rows [0, m) and the n-blocks [block_begin, block_end) ---------------------

#if defined(__AVX2__) && defined(__FMA__)
// Helpers of the 8-lane tiles: the AVX2 paths below, and gemm_iq4.h's, which AVX-512 builds run too.

// Where a tile of more than 4 rows keeps its rows' float sums between additions (stored and loaded back: the same
// bits either way): in the tile's own `out` rows, or in a local array. `out`'s row stride (the layer's width in
// floats) often maps every row to the same one or two cache sets, so q6, which adds to its sums twice per group in
// tiles of 16 rows, keeps them local. q4 and iq4 add once or twice per superblock, and q8 (tiles of 8) once per
// group; they ran as fast or faster keeping them in `out` (tools/gemm_speed.cpp on an AVX2 EPYC).
enum class SumsIn { kOut, kLocal };

// Each row's 8 float sums of one half of a q4, q6 or iq4 tile: in registers for tiles of up to 4 rows, whose rows
// alone cannot hide a store's round trip, and for bigger tiles where `Where` says between groups, so that the
// registers hold a group's code vectors instead.
template <int R, SumsIn Where = SumsIn::kOut>
struct HalfSums {
  static constexpr bool kHeld = R <= 4 || Where == SumsIn::kLocal;
  float* sums;  // row r's sums at sums + r * stride
  int64_t stride;
  __m256 acc[kHeld ? R : 1];

  HalfSums(float* first, int64_t row_stride) : sums(first), stride(row_stride) {
    QD_UNROLL for (int r = 0; r < R; ++r) set(r, _mm256_setzero_ps());
  }
  __m256 get(int r) const {
    if constexpr (kHeld) return acc[r];
    else return _mm256_loadu_ps(sums + r * stride);
  }
  void set(int r, __m256 value) {
    if constexpr (kHeld) acc[r] = value;
    else _mm256_storeu_ps(sums + r * stride, value);
  }
  // sum[r] = fma(scale, float(total), sum[r])
  void add(int r, __m256 scale, __m256i total) { set(r, _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(total), get(r))); }
  void finish() {
    if constexpr (kHeld) QD_UNROLL for (int r = 0; r < R; ++r) _mm256_storeu_ps(sums + r * stride, acc[r]);
  }
};

// Each row's 8 exact superblock totals of one half of a q4 tile: in registers for tiles of up to 4 rows, on the
// stack beyond, so that the registers hold a group's code vectors.
template <int R>
struct HalfTotals {
  static constexpr bool kInRegisters = R <= 4;
  __m256i held[kInRegisters ? R : 1];
  alignas(32) int32_t stack[kInRegisters ? 1 : R * 8];

  HalfTotals() { QD_UNROLL for (int r = 0; r < R; ++r) set(r, _mm256_setzero_si256()); }
  __m256i get(int r) const {
    if constexpr (kInRegisters) return held[r];
    else return _mm256_load_si256(reinterpret_cast<const __m256i*>(stack + 8 * r));
  }
  void set(int r, __m256i value) {
    if constexpr (kInRegisters) held[r] = value;
    else _mm256_store_si256(reinterpret_cast<__m256i*>(stack + 8 * r), value);
  }
};

#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#if defined(QD_AMX)
constexpr const char* kIsa = "avx512-vnni+amx";
#else
constexpr const char* kIsa = "avx512-vnni";
#endif

// A tile of R rows keeps U partial sums per row (U > 1 for few rows, so that consecutive multiply-adds do not wait
// for each other); integer partial sums add up exactly in any order.
template <int R>
constexpr int kPartials = R <= 2 ? 4 : (R <= 4 ? 2 : 1);
// A q4 group's 8 multiply-adds per row start from zero, so a chain of 8 would keep a tile's rows waiting on each
// other's latency unless the core held most of the tile's rows in flight at once: two chains of 4 per row. A chain
// sums at most 16 products code * x, |.| <= 16 * 15 * 127 < 2^15, so its low int16 word is exact: two chains' low
// words side by side in a lane and one word multiply-add with (sub_scale, sub_scale) add sub_scale * (chain + chain)
// to the superblock's total (one multiply-add where a chain each took two: the tile's rows wait on that port).
template <int R>
constexpr int kQ4Partials = R <= 2 ? 4 : 2;
// q5's codes reach 31, so its chains sum 8 products each (8 * 31 * 127 < 2^15): four chains whatever the tile.
template <int R, bool Five>
constexpr int kGroupChains = Five ? 4 : kQ4Partials<R>;

template <int R>
inline void int8_tile(const Int8Weights& w, const int8_t* x, int64_t x_stride, const int32_t* sums, int64_t block,
                      float* out, int64_t out_stride) {
  constexpr int U = kPartials<R>;
  __m512i acc[R][U];
  QD_UNROLL for (int r = 0; r < R; ++r) QD_UNROLL for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_si512();
  const uint8_t* codes = w.codes + block * (w.k / 4) * 64;
  const int64_t quads = w.k / 4;  // K is a multiple of 4, not necessarily of 4 * U
  int64_t q = 0;
  for (; q + U <= quads; q += U) {
    QD_UNROLL for (int u = 0; u < U; ++u) {
      prefetch(codes + (q + u) * 64);
      const __m512i c = _mm512_loadu_si512(codes + (q + u) * 64);
      QD_UNROLL for (int r = 0; r < R; ++r)
        acc[r][u] = _mm512_dpbusd_epi32(acc[r][u], c, _mm512_set1_epi32(load4(x + r * x_stride + 4 * (q + u))));
    }
  }
  for (; q < quads; ++q) {  // the last K % (4 * U) inputs
    const __m512i c = _mm512_loadu_si512(codes + q * 64);
    QD_UNROLL for (int r = 0; r < R; ++r)
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], c, _mm512_set1_epi32(load4(x + r * x_stride + 4 * q)));
  }
  const __m512 scale = _mm512_loadu_ps(w.scale + block * kLanes);
  QD_UNROLL for (int r = 0; r < R; ++r) {
    __m512i total = _mm512_set1_epi32(-kInt8Offset * sums[r]);
    QD_UNROLL for (int u = 0; u < U; ++u) total = _mm512_add_epi32(total, acc[r][u]);
    _mm512_storeu_ps(out + r * out_stride + block * kLanes, _mm512_mul_ps(_mm512_cvtepi32_ps(total), scale));
  }
}

// A group's two half sums of code * x for one row of 32 activations: 4 byte multiply-adds each over its code vectors
// c[0..3] (into dot_a: x[0..15]) and c[4..7] (into dot_b: x[16..31]), vector j's byte (l, i) times x[4j + i] in lane
// l, each continuing from the value it holds. The q6 and iq4h tiles scale the halves apart; group_dot adds them.
inline void group_halves(__m512i& dot_a, __m512i& dot_b, const __m512i* c, const int8_t* row) {
  QD_UNROLL for (int j = 0; j < 4; ++j) {
    dot_a = _mm512_dpbusd_epi32(dot_a, c[j], _mm512_set1_epi32(load4(row + 4 * j)));
    dot_b = _mm512_dpbusd_epi32(dot_b, c[j + 4], _mm512_set1_epi32(load4(row + 4 * (j + 4))));
  }
}

// A group's exact sum of code * x for one row: its two halves (group_halves), the first from `start` (the group's
// offset where the codes are values + 128), added. The q8 and iq4 tiles take it.
inline __m512i group_dot(__m512i start, const __m512i* c, const int8_t* row) {
  __m512i dot_a = start, dot_b = _mm512_setzero_si512();
  group_halves(dot_a, dot_b, c, row);
  return _mm512_add_epi32(dot_a, dot_b);
}

// q5: code vector j's fifth bits (bit j of each byte of the plane) moved to bit 4 of each byte and added to the
// nibbles; the 16-bit shifts carry other bits across bytes, which the mask drops.
inline __m512i with_fifth_bits(__m512i nibbles, __m512i plane, int j) {
  const __m512i moved = j <= 4 ? _mm512_sll_epi16(plane, _mm_cvtsi32_si128(4 - j)) : _mm512_srl_epi16(plane, _mm_cvtsi32_si128(j - 4));
  return _mm512_or_si512(nibbles, _mm512_and_si512(moved, _mm512_set1_epi8(0x10)));
}

// A tile's float sums, one vector of 16 lanes a row: in registers for tiles of up to 8 rows, in the tile's own `out`
// beyond (the same bits), so that the registers hold the rows' integer totals. Row r's sums are at first + r * stride.
template <int R>
struct RowSums {
  static constexpr bool kInRegisters = R <= 8;
  float* sums;
  int64_t stride;
  __m512 acc[kInRegisters ? R : 1];

  RowSums(float* first, int64_t row_stride) : sums(first), stride(row_stride) {
    QD_UNROLL for (int r = 0; r < R; ++r) set(r, _mm512_setzero_ps());
  }
  __m512 get(int r) const {
    if constexpr (kInRegisters) return acc[r];
    else return _mm512_loadu_ps(sums + r * stride);
  }
  void set(int r, __m512 value) {
    if constexpr (kInRegisters) acc[r] = value;
    else _mm512_storeu_ps(sums + r * stride, value);
  }
  void finish() {
    if constexpr (kInRegisters) QD_UNROLL for (int r = 0; r < R; ++r) _mm512_storeu_ps(sums + r * stride, acc[r]);
  }
};

// The min term's offset = sum_g sub_min[g] * X[g] is an exact integer, so it is summed at the end of each
// superblock from its (at most 4) sub-min pairs, into the row's float sum (RowSums).
template <int R, bool Five>
inline void q4_tile(const Q4Weights& w, const int8_t* x, int64_t x_stride, const int32_t* pairs, int64_t pair_stride,
                    int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  RowSums<R> sums(out + block * kLanes, out_stride);
  for (int64_t s = 0; s < supers; ++s) {
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + s) * kLanes);
    const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
    __m512i total[R];
    QD_UNROLL for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_si512();
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* packed = w.codes + (block * groups + g) * 256;
      __m512i c[8];
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        prefetch(packed + j * 64);
        const __m512i v = _mm512_loadu_si512(packed + j * 64);
        c[j] = _mm512_and_si512(v, low_nibbles);
        c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles);
      }
      if constexpr (Five) {
        const uint8_t* fifth = w.high + (block * groups + g) * 64;
        prefetch(fifth);
        const __m512i plane = _mm512_loadu_si512(fifth);
        QD_UNROLL for (int j = 0; j < 8; ++j) c[j] = with_fifth_bits(c[j], plane, j);
      }
      const __m128i sub_scale = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_scale + (block * groups + g) * kLanes));
      const __m512i scale = _mm512_cvtepu8_epi32(sub_scale);
      const __m512i scales = _mm512_or_si512(scale, _mm512_slli_epi32(scale, 16));  // (sub_scale, sub_scale) words
      QD_UNROLL for (int r = 0; r < R; ++r) {
        const int8_t* row = x + r * x_stride + g * kGroup;
        constexpr int U = kGroupChains<R, Five>;
        static_assert(U % 2 == 0, "chains are added in pairs");
        __m512i dot[U];
        QD_UNROLL for (int u = 0; u < U; ++u) dot[u] = _mm512_setzero_si512();
        QD_UNROLL for (int j = 0; j < 8; ++j) dot[j % U] = _mm512_dpbusd_epi32(dot[j % U], c[j], _mm512_set1_epi32(load4(row + 4 * j)));
        QD_UNROLL for (int u = 0; u < U; u += 2)  // chain u's low word and chain u + 1's in one int32 lane
          total[r] = _mm512_dpwssd_epi32(total[r], _mm512_mask_blend_epi16(0xAAAAAAAA, dot[u], _mm512_slli_epi32(dot[u + 1], 16)), scales);
      }
    }
    __m512i min_pairs[kGroupsPerSuper / 2];  // 16 lanes of (min of group 2p, min of group 2p + 1) as int16
    const int64_t pair_count = (end - begin) / 2;
    QD_UNROLL for (int p = 0; p < kGroupsPerSuper / 2; ++p)
      if (p < pair_count)
        min_pairs[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.sub_min + (block * groups + begin + 2 * p) * kLanes)));
    const __m512 dmin = _mm512_loadu_ps(w.dmin + (block * supers + s) * kLanes);
    QD_UNROLL for (int r = 0; r < R; ++r) {
      __m512 sum = sums.get(r);
      sum = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(total[r]), sum);
      __m512i offset = _mm512_setzero_si512();
      QD_UNROLL for (int p = 0; p < kGroupsPerSuper / 2; ++p)
        if (p < pair_count) offset = _mm512_dpwssd_epi32(offset, min_pairs[p], _mm512_set1_epi32(pairs[r * pair_stride + begin / 2 + p]));
      sum = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(offset), sum);
      sums.set(r, sum);
    }
  }
  sums.finish();
}

constexpr int kInt8Rows = 16;
constexpr int kQ4Rows = 16;

#elif defined(__AVX2__) && defined(__FMA__)
#if defined(__AVXVNNI__)
constexpr const char* kIsa = "avx-vnni";
inline __m256i dot_bytes(__m256i acc, __m256i u8, __m256i s8) { return _mm256_dpbusd_avx_epi32(acc, u8, s8); }
inline __m256i dot_words(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
// A q4 group's sums of code * x: int32 lanes, two chains of 16 products each (|.| < 2^15: the low int16 word is
// exact), each added to the superblock's total times the sub-scale by one word multiply-add with (sub_scale, 0).
inline __m256i q4_dot(__m256i acc, __m256i low, __m256i high, __m256i x_low, __m256i x_high) {
  return dot_bytes(dot_bytes(acc, low, x_low), high, x_high);
}
inline __m256i q4_add_scaled(__m256i total, __m256i dot0, __m256i dot1, __m256i sub_scale) {
  return dot_words(dot_words(total, dot0, sub_scale), dot1, sub_scale);
}
#else
constexpr const char* kIsa = "avx2";
// u8 x s8 products summed in pairs to int16 (exact: our codes keep pair sums below 2^15), then in fours to int32.
inline __m256i dot_bytes(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
inline __m256i dot_words(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
// A q4 group's sums of code * x in int16 pairs, widened once at the end: with codes <= 15 and |x| <= 127 a pair is
// at most 2 * 15 * 127 = 3810 and a group's 8 pairs per lane at most 30480 < 2^15, so the int16 sums are exact
// (not so for the int8 format's 7-bit weights).
inline __m256i q4_dot(__m256i acc, __m256i low, __m256i high, __m256i x_low, __m256i x_high) {
  return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(low, x_low), _mm256_maddubs_epi16(high, x_high)));
}
// The two chains' int16 sums (16 products a word) times the sub-scale, each lane's pair of words in one multiply-add.
inline __m256i q4_add_scaled(__m256i total, __m256i dot0, __m256i dot1, __m256i sub_scale) {
  return dot_words(total, _mm256_add_epi16(dot0, dot1), _mm256_or_si256(sub_scale, _mm256_slli_epi32(sub_scale, 16)));
}
#endif

// q5 on 8 lanes: with_fifth_bits of AVX-512 above.
inline __m256i with_fifth_bits(__m256i nibbles, __m256i plane, int j) {
  const __m256i moved = j <= 4 ? _mm256_sll_epi16(plane, _mm_cvtsi32_si128(4 - j)) : _mm256_srl_epi16(plane, _mm_cvtsi32_si128(j - 4));
  return _mm256_or_si256(nibbles, _mm256_and_si256(moved, _mm256_set1_epi8(0x10)));
}

// Two halves of 8 lanes each: half h covers outputs n0 + 8h .. n0 + 8h + 7 (bytes 32h.. of each 64-byte vector).
template <int R>
inline void int8_tile(const Int8Weights& w, const int8_t* x, int64_t x_stride, const int32_t* sums, int64_t block,
                      float* out, int64_t out_stride) {
  const uint8_t* codes = w.codes + block * (w.k / 4) * 64;
  for (int h = 0; h < 2; ++h) {
    __m256i acc[R];
    QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
    for (int64_t q = 0; q < w.k / 4; ++q) {
      prefetch(codes + q * 64);
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + q * 64 + 32 * h));
      QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = dot_bytes(acc[r], c, _mm256_set1_epi32(load4(x + r * x_stride + 4 * q)));
    }
    const __m256 scale = _mm256_loadu_ps(w.scale + block * kLanes + 8 * h);
    QD_UNROLL for (int r = 0; r < R; ++r) {
      const __m256i exact = _mm256_sub_epi32(acc[r], _mm256_set1_epi32(kInt8Offset * sums[r]));
      _mm256_storeu_ps(out + r * out_stride + block * kLanes + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(exact), scale));
    }
  }
}

// A group's 8 code vectors of one half stay in registers while the tile's rows take turns on them (HalfTotals keeps
// the rows' superblock totals, HalfSums their float sums), so a tile streams its codes once. The min term is summed
// at the end of each superblock, as on AVX-512. q5's codes reach 31, so its group takes four chains of one q4_dot
// each (AVX2: 4 products a word, 8 once two chains are added; AVX-VNNI: 8 products an int32), where q4 takes two.
template <int R, bool Five>
inline void q4_tile(const Q4Weights& w, const int8_t* x, int64_t x_stride, const int32_t* pairs, int64_t pair_stride,
                    int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    HalfSums<R> sums(out + block * kLanes + 8 * h, out_stride);
    for (int64_t s = 0; s < supers; ++s) {
      const __m256 d = _mm256_loadu_ps(w.d + (block * supers + s) * kLanes + 8 * h);
      const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
      HalfTotals<R> totals;
      for (int64_t g = begin; g < end; ++g) {
        const uint8_t* packed = w.codes + (block * groups + g) * 256;
        __m256i c[8];
        QD_UNROLL for (int j = 0; j < 4; ++j) {
          prefetch(packed + j * 64);
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + j * 64 + 32 * h));
          c[j] = _mm256_and_si256(v, low_nibbles);
          c[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles);
        }
        if constexpr (Five) {
          const uint8_t* fifth = w.high + (block * groups + g) * 64;
          prefetch(fifth);
          const __m256i plane = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fifth + 32 * h));
          QD_UNROLL for (int j = 0; j < 8; ++j) c[j] = with_fifth_bits(c[j], plane, j);
        }
        const __m128i sub_scale = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.sub_scale + (block * groups + g) * kLanes + 8 * h));
        const __m256i scale = _mm256_cvtepu8_epi32(sub_scale);
        QD_UNROLL for (int r = 0; r < R; ++r) {
          const int8_t* row = x + r * x_stride + g * kGroup;
          constexpr int kChains = Five ? 4 : 2;
          __m256i dot[kChains];
          QD_UNROLL for (int u = 0; u < kChains; ++u) dot[u] = _mm256_setzero_si256();
          QD_UNROLL for (int j = 0; j < 4; ++j)
            dot[j % kChains] = q4_dot(dot[j % kChains], c[j], c[j + 4], _mm256_set1_epi32(load4(row + 4 * j)), _mm256_set1_epi32(load4(row + 4 * (j + 4))));
          QD_UNROLL for (int u = 0; u < kChains; u += 2) totals.set(r, q4_add_scaled(totals.get(r), dot[u], dot[u + 1], scale));
        }
      }
      const __m256 dmin = _mm256_loadu_ps(w.dmin + (block * supers + s) * kLanes + 8 * h);
      QD_UNROLL for (int r = 0; r < R; ++r) {
        sums.add(r, d, totals.get(r));
        __m256i offset = _mm256_setzero_si256();
        for (int64_t g = begin; g < end; g += 2) {
          const __m128i mins = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_min + (block * groups + g) * kLanes + 16 * h));
          offset = dot_words(offset, _mm256_cvtepu8_epi16(mins), _mm256_set1_epi32(pairs[r * pair_stride + g / 2]));
        }
        sums.add(r, dmin, offset);
      }
    }
    sums.finish();
  }
}

constexpr int kInt8Rows = 8;
constexpr int kQ4Rows = 8;

#else
constexpr const char* kIsa = "scalar";

template <int R>
inline void int8_tile(const Int8Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t block,
                      float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return int8_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

template <int R, bool Five>
inline void q4_tile(const Q4Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                    float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return q4_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

constexpr int kInt8Rows = 1;
constexpr int kQ4Rows = 1;
#endif

// Calls tile(first_row, std::integral_constant<int, R>) for rows in ceil(rows / Max) tiles of nearly equal sizes
// (9 rows with Max 8: 5 + 4, not 8 + 1, whose 1-row tile would redo a whole tile's unpacking for one row). Tile
// sizes are compile-time constants, so a tile's accumulators stay in registers.
template <int R, typename Tile>
inline void tile_of(int64_t size, int64_t first_row, Tile& tile) {
  if constexpr (R >= 1) {
    if (size == R) return tile(first_row, std::integral_constant<int, R>{});
    tile_of<R - 1>(size, first_row, tile);
  }
}

template <int Max, typename Tile>
inline void for_each_tile(int64_t rows, Tile tile) {
  const int64_t tiles = (rows + Max - 1) / Max, base = rows / (tiles > 0 ? tiles : 1), larger = rows - base * tiles;
  for (int64_t t = 0, first = 0; t < tiles; ++t) {
    const int64_t size = base + (t < larger ? 1 : 0);
    tile_of<Max>(size, first, tile);
    first += size;
  }
}

// Many rows (a prompt) go in chunks that stay in the L2 cache while every n-block passes over them; without
// chunks, each n-block streamed all the rows from memory again (at 1,800 rows of the 8,960-wide down projection,
// 16 MB per block). A row's arithmetic is the same in any chunk.
constexpr int64_t kChunkBytes = 512 * 1024;

// chunk(first, count) for consecutive chunks of rows [first, first + count) of width k.
template <typename Chunk>
inline void for_each_chunk(int64_t rows, int64_t k, Chunk chunk) {
  const int64_t size = kChunkBytes / k > 16 ? kChunkBytes / k : 16;
  for (int64_t first = 0; first < rows; first += size) chunk(first, rows - first < size ? rows - first : size);
}

// Rows in chunks (for_each_chunk), each n-block of [block_begin, block_end) over a chunk's rows in tiles of at most
// Max rows (for_each_tile): tile(block, first_row, std::integral_constant<int, R>).
template <int Max, typename Tile>
inline void for_each_block_tile(int64_t rows, int64_t k, int64_t block_begin, int64_t block_end, Tile tile) {
  for_each_chunk(rows, k, [&](int64_t first, int64_t count) {
    for (int64_t block = block_begin; block < block_end; ++block)
      for_each_tile<Max>(count, [&](int64_t r, auto tile_rows) { tile(block, first + r, tile_rows); });
  });
}

// out [rows, N] (row stride out_stride) for n-blocks [block_begin, block_end); x [rows, K] int8; sums [rows].
inline void int8_gemm(const Int8Weights& w, const int8_t* x, int64_t rows, const int32_t* sums, float* out,
                      int64_t out_stride, int64_t block_begin, int64_t block_end) {
  for_each_chunk(rows, w.k, [&](int64_t first, int64_t count) {
    const int8_t* xs = x + first * w.k;
    float* outs = out + first * out_stride;
#if defined(QD_AMX)
    if (int8_amx(w.codes, w.scale, w.k, xs, count, sums + first, outs, out_stride, block_begin, block_end)) return;
#endif
    for (int64_t block = block_begin; block < block_end; ++block)
      for_each_tile<kInt8Rows>(count, [&](int64_t r, auto tile_rows) {
        int8_tile<decltype(tile_rows)::value>(w, xs + r * w.k, w.k, sums + first + r, block, outs + r * out_stride,
                                              out_stride);
      });
  });
}

// pairs [rows, K/64] from group_sum_pairs.
inline void q4_gemm(const Q4Weights& w, const int8_t* x, int64_t rows, const int32_t* pairs, float* out,
                    int64_t out_stride, int64_t block_begin, int64_t block_end) {
  const int64_t pair_stride = w.k / (2 * kGroup);
#if defined(QD_AMX)
  if (q4_amx(w, x, rows, pairs, pair_stride, out, out_stride, block_begin, block_end)) return;
#endif
  with_flag(w.high != nullptr, [&](auto five) {
    for_each_block_tile<kQ4Rows>(rows, w.k, block_begin, block_end, [&](int64_t block, int64_t row, auto tile_rows) {
      q4_tile<decltype(tile_rows)::value, decltype(five)::value>(w, x + row * w.k, w.k, pairs + row * pair_stride,
                                                                 pair_stride, block, out + row * out_stride, out_stride);
    });
  });
}

}  // namespace qd
