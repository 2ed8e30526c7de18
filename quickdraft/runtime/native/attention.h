// Causal attention over a static cache, one KV head's group of query heads at a time, for one query row or for the
// rows of one cache slot together (attend_rows: they share the cache's reads).
//
// A query at position p attends to the cache's positions 0..p (a sliding window: the callers pass keys and values
// from a block boundary and `skip`, the positions before the window inside the first block). Its result is computed by one call, in an order of
// operations fixed by p alone (blocks of 16 keys, dimensions in order, blocks in order), never by how many other
// queries or rows share the forward: so a token's attention has the same bits whether it is decoded alone, inside
// a verify block at any offset, or again after a rollback. Positions past p are never used, whatever they hold.
//
// A tree's leaf (a drafted sibling of the chain's token at its depth) is a row at position p whose own key and value
// are kept past the verify block, at index `own`, because the chain's token holds position p: it attends to positions
// 0..p - 1 and then to its own key in the place of p, with the same arithmetic as a chain row at p holding its token.
//
// Keys are stored in blocks of 16 positions, transposed: [C/16][D][16] per KV head, so one vector load gives a
// dimension of 16 consecutive keys (8 with AVX2) and a query's scores need no horizontal sums. Values are [C][D].
// The cache holds float32 or IEEE half (float16) elements, the template argument Kv (float or uint16_t, a half's
// bits): a half widens to a float exactly, so once read every path does the same float operations on the same values.
//
// Subnormal floats are zero inside attention (FlushSubnormals): a weight below 2^-126 of the largest, or a product
// that small, adds nothing a float sum of order 1 keeps, and left subnormal each operation on it takes a microcode
// assist on x86, so that rows whose scores spread over more than 87 (random or untrained weights, large q/k biases)
// ran several times slower. Every path flushes, so the bits stay each row's own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "simd.h"

namespace qd {

// While it lives, this thread's float operations read subnormal inputs as zero and write subnormal results as zero
// (MXCSR's DAZ and FTZ bits); the mode the thread had comes back when it ends. Elsewhere than x86: nothing.
class FlushSubnormals {
 public:
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;
#if defined(__SSE__) || defined(__x86_64__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kDenormalsAreZero | kFlushToZero); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kDenormalsAreZero = 0x0040, kFlushToZero = 0x8000;
  unsigned saved_;
#else
  FlushSubnormals() = default;
#endif
};

constexpr int64_t kKeyBlock = 16;

// The float a cache element holds: itself, or a half's value (exact: every half is a float).
inline float kv_float(float value) { return value; }
inline float kv_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
  uint32_t bits = sign;
  if (exponent == 0x1Fu) bits |= 0x7F800000u | (mantissa << 13);  // infinity, NaN
  else if (exponent != 0) bits |= ((exponent + 112u) << 23) | (mantissa << 13);
  else if (mantissa != 0) {  // subnormal: mantissa · 2^-24, a normal float (a product of exact factors)
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  }
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

inline int64_t key_offset(int64_t position, int64_t d, int64_t head_dim) {
  return (position / kKeyBlock) * head_dim * kKeyBlock + d * kKeyBlock + position % kKeyBlock;
}

inline int64_t key_blocks(int64_t positions) { return (positions + kKeyBlock - 1) / kKeyBlock; }

// cap · tanh(scores / cap) for scores[from, to): Gemma 2's attention logit softcapping (cap 0: none), one score at
// a time, so a score's bits depend on itself alone.
inline void softcap_scores(float* scores, int64_t from, int64_t to, float cap) {
  if (cap <= 0.0f) return;
  for (int64_t j = from; j < to; ++j) scores[j] = cap * std::tanh(scores[j] / cap);
}

#if defined(__AVX512F__)
constexpr const char* kAttentionIsa = "avx512";
#define QD_VECTOR_ATTENTION 1

// 16 cache elements as floats; the masked forms read only the lanes of `mask` and give 0 in the others.
inline __m512 load_kv(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_kv(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_kv(__mmask16 mask, const float* p) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load_kv(__mmask16 mask, const uint16_t* p) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
#else
  alignas(32) uint16_t lanes[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((mask >> i) & 1) lanes[i] = p[i];
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)));
#endif
}

// Scores of H query heads (q: [H][D]) against `blocks` blocks of 16 keys, times scale: scores [H][blocks·16].
template <int H, typename Kv>
inline void block_scores(const float* q, const Kv* keys, int64_t blocks, int64_t head_dim, float scale,
                         float* scores, int64_t stride) {
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 acc[H];
    for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
    const Kv* block = keys + b * head_dim * kKeyBlock;
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m512 k = load_kv(block + d * kKeyBlock);
      for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * head_dim + d]), k, acc[h]);
    }
    for (int h = 0; h < H; ++h) _mm512_storeu_ps(scores + h * stride + b * kKeyBlock, _mm512_mul_ps(acc[h], _mm512_set1_ps(scale)));
  }
}

// softmax(scores[0..length)) in place: the unnormalized weights exp(s - max); returns 1 / their sum.
inline float softmax_weights(float* scores, int64_t length) {
  const int64_t blocks = key_blocks(length);
  const __mmask16 last = static_cast<__mmask16>((1u << (length - (blocks - 1) * kKeyBlock)) - 1u);
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < blocks; ++b)
    top = _mm512_mask_max_ps(top, b + 1 < blocks ? 0xFFFF : last, top, _mm512_loadu_ps(scores + b * kKeyBlock));
  const __m512 max_score = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 e = _mm512_maskz_mov_ps(b + 1 < blocks ? 0xFFFF : last,
                                         exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + b * kKeyBlock), max_score)));
    _mm512_storeu_ps(scores + b * kKeyBlock, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.0f / _mm512_reduce_add_ps(sum);
}

// acc [D] += Σ_{j in [from, to)} weights[j] · values[j] (j in order: the same sums, in one call or in several).
template <typename Kv>
inline void add_values(const float* weights, int64_t from, int64_t to, const Kv* values, int64_t head_dim,
                       float* acc_out) {
  for (int64_t first = 0; first < head_dim; first += 8 * 16) {  // 8 vectors of the output at a time
    const int64_t vectors = std::min<int64_t>(8, (head_dim - first + 15) / 16);
    const __mmask16 tail = static_cast<__mmask16>(head_dim - first >= 16 * vectors ? 0xFFFF : (1u << ((head_dim - first) % 16)) - 1u);
    __m512 acc[8];
    for (int i = 0; i < 8; ++i)
      if (i < vectors) acc[i] = _mm512_maskz_loadu_ps(i + 1 < vectors ? 0xFFFF : tail, acc_out + first + 16 * i);
    for (int64_t j = from; j < to; ++j) {
      const __m512 w = _mm512_set1_ps(weights[j]);
      const Kv* v = values + j * head_dim + first;
      for (int i = 0; i < 8; ++i)
        if (i < vectors) acc[i] = _mm512_fmadd_ps(w, i + 1 < vectors ? load_kv(v + 16 * i) : load_kv(tail, v + 16 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i)
      if (i < vectors) _mm512_mask_storeu_ps(acc_out + first + 16 * i, i + 1 < vectors ? 0xFFFF : tail, acc[i]);
  }
}

// add_values for H heads at once: acc[h] [D] (at acc_out + h·D) += Σ_{j in [from, to)} weights[h·stride + j] ·
// values[j]. Each output element gets add_values' multiply-adds in add_values' order (so the same bits); a value
// vector is read and widened once for the H heads instead of once for each. The heads' accumulators fill the
// registers for a few vectors of D at a time.
template <int H, typename Kv>
inline void add_heads_values(const float* weights, int64_t stride, int64_t from, int64_t to, const Kv* values,
                             int64_t head_dim, float* acc_out) {
  constexpr int kVectors = std::max(1, std::min(8, 16 / H));  // H · kVectors accumulators of the 32 registers
  for (int64_t first = 0; first < head_dim; first += kVectors * 16) {
    const int64_t vectors = std::min<int64_t>(kVectors, (head_dim - first + 15) / 16);
    const __mmask16 tail = static_cast<__mmask16>(head_dim - first >= 16 * vectors ? 0xFFFF : (1u << ((head_dim - first) % 16)) - 1u);
    __m512 acc[H][kVectors];
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) acc[h][i] = _mm512_maskz_loadu_ps(i + 1 < vectors ? 0xFFFF : tail, acc_out + h * head_dim + first + 16 * i);
    for (int64_t j = from; j < to; ++j) {
      const Kv* v = values + j * head_dim + first;
      __m512 value[kVectors];
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) value[i] = i + 1 < vectors ? load_kv(v + 16 * i) : load_kv(tail, v + 16 * i);
      for (int h = 0; h < H; ++h) {
        const __m512 w = _mm512_set1_ps(weights[h * stride + j]);
        for (int i = 0; i < kVectors; ++i)
          if (i < vectors) acc[h][i] = _mm512_fmadd_ps(w, value[i], acc[h][i]);
      }
    }
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) _mm512_mask_storeu_ps(acc_out + h * head_dim + first + 16 * i, i + 1 < vectors ? 0xFFFF : tail, acc[h][i]);
  }
}

inline void scale_values(float* out, int64_t head_dim, float inverse) {
  for (int64_t d = 0; d < head_dim; d += 16) {
    const __mmask16 mask = static_cast<__mmask16>(head_dim - d >= 16 ? 0xFFFF : (1u << (head_dim - d)) - 1u);
    _mm512_mask_storeu_ps(out + d, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, out + d), _mm512_set1_ps(inverse)));
  }
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr const char* kAttentionIsa = "avx2";
#define QD_VECTOR_ATTENTION 1

// Lanes 0..count-1 of 8 set (count clamped to 0..8): for masked loads and stores, and to zero a block's tail.
inline __m256i lanes_below(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))), index);
}

// 8 cache elements as floats; the masked forms read only the lanes of `mask` and give 0 in the others.
inline __m256 load_kv(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_kv(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load_kv(__m256i mask, const float* p) { return _mm256_maskload_ps(p, mask); }
inline __m256 load_kv(__m256i mask, const uint16_t* p) {
  alignas(32) int32_t lanes_on[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_on), mask);
  alignas(16) uint16_t lanes[8] = {};
  for (int i = 0; i < 8; ++i)
    if (lanes_on[i]) lanes[i] = p[i];
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(lanes)));
}

// As the AVX-512 block_scores, each block of 16 keys in two halves of 8: every score's sum runs over d in order.
template <int H, typename Kv>
inline void block_scores(const float* q, const Kv* keys, int64_t blocks, int64_t head_dim, float scale,
                         float* scores, int64_t stride) {
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t half = 0; half < kKeyBlock; half += 8) {
      __m256 acc[H];
      for (int h = 0; h < H; ++h) acc[h] = _mm256_setzero_ps();
      const Kv* block = keys + b * head_dim * kKeyBlock + half;
      for (int64_t d = 0; d < head_dim; ++d) {
        const __m256 k = load_kv(block + d * kKeyBlock);
        for (int h = 0; h < H; ++h) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(q[h * head_dim + d]), k, acc[h]);
      }
      for (int h = 0; h < H; ++h)
        _mm256_storeu_ps(scores + h * stride + b * kKeyBlock + half, _mm256_mul_ps(acc[h], _mm256_set1_ps(scale)));
    }
}

inline float horizontal_max(__m256 v) {
  const __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

inline float horizontal_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// softmax(scores[0..length)) in place: the unnormalized weights exp(s - max) (0 past the length, to the end of its
// block); returns 1 / their sum. Positions past the length hold whatever their keys gave and are masked out.
inline float softmax_weights(float* scores, int64_t length) {
  const int64_t chunks = key_blocks(length) * (kKeyBlock / 8);
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 top = lowest;
  for (int64_t c = 0; c < chunks; ++c) {
    const __m256 valid = _mm256_castsi256_ps(lanes_below(length - c * 8));
    top = _mm256_max_ps(top, _mm256_blendv_ps(lowest, _mm256_loadu_ps(scores + c * 8), valid));
  }
  const __m256 max_score = _mm256_set1_ps(horizontal_max(top));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const __m256 valid = _mm256_castsi256_ps(lanes_below(length - c * 8));
    const __m256 e = _mm256_and_ps(valid, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + c * 8), max_score)));
    _mm256_storeu_ps(scores + c * 8, e);
    sum = _mm256_add_ps(sum, e);
  }
  return 1.0f / horizontal_sum(sum);
}

// acc [D] += Σ_{j in [from, to)} weights[j] · values[j] (j in order: the same sums, in one call or in several).
template <typename Kv>
inline void add_values(const float* weights, int64_t from, int64_t to, const Kv* values, int64_t head_dim,
                       float* acc_out) {
  for (int64_t first = 0; first < head_dim; first += 8 * 8) {  // 8 vectors of the output at a time
    const int64_t vectors = std::min<int64_t>(8, (head_dim - first + 7) / 8);
    const __m256i tail = lanes_below(head_dim - first - 8 * (vectors - 1));
    const __m256i full = lanes_below(8);
    __m256 acc[8];
    for (int i = 0; i < 8; ++i)
      if (i < vectors) acc[i] = _mm256_maskload_ps(acc_out + first + 8 * i, i + 1 < vectors ? full : tail);
    for (int64_t j = from; j < to; ++j) {
      const __m256 w = _mm256_set1_ps(weights[j]);
      const Kv* v = values + j * head_dim + first;
      for (int i = 0; i < 8; ++i)
        if (i < vectors) acc[i] = _mm256_fmadd_ps(w, i + 1 < vectors ? load_kv(v + 8 * i) : load_kv(tail, v + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i)
      if (i < vectors) _mm256_maskstore_ps(acc_out + first + 8 * i, i + 1 < vectors ? full : tail, acc[i]);
  }
}

// As the AVX-512 add_heads_values, with 8-lane vectors and the 16 registers.
template <int H, typename Kv>
inline void add_heads_values(const float* weights, int64_t stride, int64_t from, int64_t to, const Kv* values,
                             int64_t head_dim, float* acc_out) {
  constexpr int kVectors = std::max(1, std::min(8, 12 / H));
  for (int64_t first = 0; first < head_dim; first += kVectors * 8) {
    const int64_t vectors = std::min<int64_t>(kVectors, (head_dim - first + 7) / 8);
    const __m256i tail = lanes_below(head_dim - first - 8 * (vectors - 1));
    const __m256i full = lanes_below(8);
    __m256 acc[H][kVectors];
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) acc[h][i] = _mm256_maskload_ps(acc_out + h * head_dim + first + 8 * i, i + 1 < vectors ? full : tail);
    for (int64_t j = from; j < to; ++j) {
      const Kv* v = values + j * head_dim + first;
      __m256 value[kVectors];
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) value[i] = i + 1 < vectors ? load_kv(v + 8 * i) : load_kv(tail, v + 8 * i);
      for (int h = 0; h < H; ++h) {
        const __m256 w = _mm256_set1_ps(weights[h * stride + j]);
        for (int i = 0; i < kVectors; ++i)
          if (i < vectors) acc[h][i] = _mm256_fmadd_ps(w, value[i], acc[h][i]);
      }
    }
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < kVectors; ++i)
        if (i < vectors) _mm256_maskstore_ps(acc_out + h * head_dim + first + 8 * i, i + 1 < vectors ? full : tail, acc[h][i]);
  }
}

inline void scale_values(float* out, int64_t head_dim, float inverse) {
  for (int64_t d = 0; d < head_dim; d += 8) {
    const __m256i mask = lanes_below(head_dim - d);
    _mm256_maskstore_ps(out + d, mask, _mm256_mul_ps(_mm256_maskload_ps(out + d, mask), _mm256_set1_ps(inverse)));
  }
}
#endif

#if defined(QD_VECTOR_ATTENTION)

// Positions [0, skip) left out of the softmax: their scores become −inf, so their weights are exp_ps's floor (below
// 1e-37, nothing next to the current position's weight of 1 in the sum), and they are never added to the values.
inline void skip_scores(float* scores, int64_t skip) {
  std::fill(scores, scores + skip, -std::numeric_limits<float>::infinity());
}

// The score of the key at index `own` as either build's block_scores computes a lane: fused multiply-adds over d in
// order, times scale.
template <typename Kv>
inline float key_score(const float* q, const Kv* keys, int64_t own, int64_t head_dim, float scale) {
  float acc = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) acc = std::fma(q[d], kv_float(keys[key_offset(own, d, head_dim)]), acc);
  return acc * scale;
}

// add_values over [from, to) of a row of this length whose last position's value is row `own` (own < 0: its own
// place): the same multiply-adds in the same order, the last one reading the leaf's value.
template <typename Kv>
inline void add_row_values(const float* weights, int64_t from, int64_t to, int64_t length, int64_t own,
                           const Kv* values, int64_t head_dim, float* acc_out) {
  if (own < 0 || to < length) return add_values(weights, from, to, values, head_dim, acc_out);
  add_values(weights, from, length - 1, values, head_dim, acc_out);
  add_values(weights + length - 1, 0, 1, values + own * head_dim, head_dim, acc_out);
}

// add_row_values for `heads` heads of one row (head h's weights at weights + h·stride, its output at acc_out + h·D),
// 8 heads at a time through add_heads_values: each head's sums are add_row_values' own.
template <typename Kv>
inline void add_group_values(const float* weights, int64_t stride, int64_t heads, int64_t from, int64_t to,
                             int64_t length, int64_t own, const Kv* values, int64_t head_dim, float* acc_out) {
  if (from >= to) return;
  if (own >= 0 && to == length) {
    add_group_values(weights, stride, heads, from, length - 1, length, -1, values, head_dim, acc_out);
    add_group_values(weights + length - 1, stride, heads, 0, 1, 1, -1, values + own * head_dim, head_dim, acc_out);
    return;
  }
  for (int64_t first = 0; first < heads; first += 8) {
    const float* w = weights + first * stride;
    float* o = acc_out + first * head_dim;
    switch (std::min<int64_t>(8, heads - first)) {
      case 1: add_heads_values<1>(w, stride, from, to, values, head_dim, o); break;
      case 2: add_heads_values<2>(w, stride, from, to, values, head_dim, o); break;
      case 3: add_heads_values<3>(w, stride, from, to, values, head_dim, o); break;
      case 4: add_heads_values<4>(w, stride, from, to, values, head_dim, o); break;
      case 5: add_heads_values<5>(w, stride, from, to, values, head_dim, o); break;
      case 6: add_heads_values<6>(w, stride, from, to, values, head_dim, o); break;
      case 7: add_heads_values<7>(w, stride, from, to, values, head_dim, o); break;
      default: add_heads_values<8>(w, stride, from, to, values, head_dim, o); break;
    }
  }
}

// softmax(softcap(scores[skip..length))) · values -> out [D]; scores are overwritten with the weights.
template <typename Kv>
inline void softmax_values(float* scores, int64_t skip, int64_t length, int64_t own, float cap, const Kv* values,
                           int64_t head_dim, float* out) {
  softcap_scores(scores, skip, length, cap);
  skip_scores(scores, skip);
  const float inverse = softmax_weights(scores, length);
  std::fill(out, out + head_dim, 0.0f);
  add_row_values(scores, skip, length, length, own, values, head_dim, out);
  scale_values(out, head_dim, inverse);
}

template <int H, typename Kv>
inline void attend_heads(const float* q, const Kv* keys, const Kv* values, int64_t skip, int64_t length,
                         int64_t own, int64_t head_dim, float scale, float cap, float* out, float* scores) {
  const int64_t stride = key_blocks(length) * kKeyBlock;
  block_scores<H>(q, keys, key_blocks(length), head_dim, scale, scores, stride);
  for (int h = 0; own >= 0 && h < H; ++h)
    scores[h * stride + length - 1] = key_score(q + h * head_dim, keys, own, head_dim, scale);
  for (int h = 0; h < H; ++h)
    softmax_values(scores + h * stride, skip, length, own, cap, values, head_dim, out + h * head_dim);
}

#else
constexpr const char* kAttentionIsa = "scalar";

template <int H, typename Kv>
inline void attend_heads(const float* q, const Kv* keys, const Kv* values, int64_t skip, int64_t length,
                         int64_t own, int64_t head_dim, float scale, float cap, float* out, float* scores) {
  for (int h = 0; h < H; ++h) {
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t j = skip; j < length; ++j) {
      const int64_t index = own >= 0 && j == length - 1 ? own : j;
      float total = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) total += q[h * head_dim + d] * kv_float(keys[key_offset(index, d, head_dim)]);
      scores[j] = total * scale;
      softcap_scores(scores, j, j + 1, cap);
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (int64_t j = skip; j < length; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
    float* o = out + h * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int64_t j = skip; j < length; ++j) {
      const Kv* value = values + (own >= 0 && j == length - 1 ? own : j) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += scores[j] * kv_float(value[d]);
    }
    for (int64_t d = 0; d < head_dim; ++d) o[d] /= sum;
  }
}
#endif

// The query heads q [heads][D] of one KV head's group at position length - 1 (its key and value at index own >= 0 for a
// tree's leaf, else at length - 1), seeing positions skip..length - 1, their
// scores softcapped by `cap` (0: none): out [heads][D]. scores is scratch of at least 8 · key_blocks(length) · 16 floats. Heads go 8 at a time; each
// head's arithmetic is its own.
template <typename Kv>
inline void attend_group(const float* q, int64_t heads, const Kv* keys, const Kv* values, int64_t skip,
                         int64_t length, int64_t own, int64_t head_dim, float scale, float cap, float* out, float* scores) {
  const FlushSubnormals flush;
  for (int64_t first = 0; first < heads; first += 8) {
    const float* qs = q + first * head_dim;
    float* os = out + first * head_dim;
    switch (std::min<int64_t>(8, heads - first)) {
      case 1: attend_heads<1>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 2: attend_heads<2>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 3: attend_heads<3>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 4: attend_heads<4>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 5: attend_heads<5>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 6: attend_heads<6>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      case 7: attend_heads<7>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
      default: attend_heads<8>(qs, keys, values, skip, length, own, head_dim, scale, cap, os, scores); break;
    }
  }
}

constexpr int64_t kKeyTile = 16;    // key blocks (256 positions, 128 KB at D = 128) the rows of a run score in turn
constexpr int64_t kValueTile = 64;  // positions (32 KB of values at D = 128) the rows of a run add in turn

// Scratch attend_rows needs for rows of these lengths and `heads` query heads each.
inline int64_t rows_scratch(const int64_t* lengths, int64_t rows, int64_t heads) {
  int64_t total = 0, longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    total += heads * key_blocks(lengths[r]) * kKeyBlock;
    longest = std::max(longest, key_blocks(lengths[r]) * kKeyBlock);
  }
  return total + 8 * longest;
}

// Rows of one cache slot and one KV head's group: row r's heads q[r] [heads][D] at position lengths[r] - 1 (its key
// and value at index owns[r] >= 0 for a tree's leaf), seeing positions skips[r]..lengths[r] - 1 ->
// out[r] [heads][D]. Every row's arithmetic is attend_group's, in the same order (so the same bits); the rows take
// turns on each tile of keys and then of values while it is in cache, so a verify block of k rows reads the cache
// about once rather than k times. scores: scratch of rows_scratch(lengths, rows, heads) floats.
template <typename Kv>
inline void attend_rows(const float* const* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns,
                        int64_t rows, int64_t heads,
                        const Kv* keys, const Kv* values, int64_t head_dim, float scale, float cap,
                        float* const* out, float* scores) {
  const FlushSubnormals flush;
#if defined(QD_VECTOR_ATTENTION)
  float* row_scores[64];
  int64_t stride[64];
  float inverse[64 * 64];
  if (rows > 64 || heads > 64) {
    for (int64_t r = 0; r < rows; ++r)
      attend_group(q[r], heads, keys, values, skips[r], lengths[r], owns[r], head_dim, scale, cap, out[r], scores);
    return;
  }
  int64_t most_blocks = 0, longest = 0;
  float* next = scores;
  for (int64_t r = 0; r < rows; ++r) {
    stride[r] = key_blocks(lengths[r]) * kKeyBlock;
    row_scores[r] = next;
    next += heads * stride[r];
    most_blocks = std::max(most_blocks, key_blocks(lengths[r]));
    longest = std::max(longest, lengths[r]);
  }
  // 1. Scores: each tile of key blocks, for every row that reaches it.
  for (int64_t tile = 0; tile < most_blocks; tile += kKeyTile) {
    const Kv* tile_keys = keys + tile * head_dim * kKeyBlock;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t blocks = std::min(kKeyTile, key_blocks(lengths[r]) - tile);
      for (int64_t first = 0; blocks > 0 && first < heads; first += 8) {
        const float* qs = q[r] + first * head_dim;
        float* to = row_scores[r] + first * stride[r] + tile * kKeyBlock;
        switch (std::min<int64_t>(8, heads - first)) {
          case 1: block_scores<1>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 2: block_scores<2>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 3: block_scores<3>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 4: block_scores<4>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 5: block_scores<5>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 6: block_scores<6>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          case 7: block_scores<7>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
          default: block_scores<8>(qs, tile_keys, blocks, head_dim, scale, to, stride[r]); break;
        }
      }
    }
  }
  // 2. Each row's and head's weights (a leaf's last score from its own key first).
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      if (owns[r] >= 0)
        row_scores[r][h * stride[r] + lengths[r] - 1] = key_score(q[r] + h * head_dim, keys, owns[r], head_dim, scale);
      softcap_scores(row_scores[r] + h * stride[r], skips[r], lengths[r], cap);
      skip_scores(row_scores[r] + h * stride[r], skips[r]);
      inverse[r * heads + h] = softmax_weights(row_scores[r] + h * stride[r], lengths[r]);
      std::fill(out[r] + h * head_dim, out[r] + (h + 1) * head_dim, 0.0f);
    }
  // 3. Values: each tile of positions, for every row that reaches it. Several rows take all of a row's heads at
  //    once (a value vector widened once for them); a single row goes head by head, reading each value row whole.
  for (int64_t from = 0; from < longest; from += kValueTile)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t start = std::max(from, skips[r]), to = std::min(from + kValueTile, lengths[r]);
      if (rows > 1) {
        add_group_values(row_scores[r], stride[r], heads, start, to, lengths[r], owns[r], values, head_dim, out[r]);
        continue;
      }
      for (int64_t h = 0; start < to && h < heads; ++h)
        add_row_values(row_scores[r] + h * stride[r], start, to, lengths[r], owns[r], values, head_dim, out[r] + h * head_dim);
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) scale_values(out[r] + h * head_dim, head_dim, inverse[r * heads + h]);
#else
  for (int64_t r = 0; r < rows; ++r)
      attend_group(q[r], heads, keys, values, skips[r], lengths[r], owns[r], head_dim, scale, cap, out[r], scores);
#endif
}

}  // namespace qd
