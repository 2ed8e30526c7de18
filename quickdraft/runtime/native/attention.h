// Causal attention over a static cache, one query row and one KV head's group of query heads at a time.
//
// A query at position p attends to the cache's positions 0..p. Its result is computed by one call, in an order of
// operations fixed by p alone (blocks of 16 keys, dimensions in order, blocks in order), never by how many other
// queries or rows share the forward: so a token's attention has the same bits whether it is decoded alone, inside
// a verify block at any offset, or again after a rollback. Positions past p are never used, whatever they hold.
//
// Keys are stored in blocks of 16 positions, transposed: [C/16][D][16] per KV head, so one vector load gives a
// dimension of 16 consecutive keys and a query's 16 scores need no horizontal sums. Values are [C][D].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "simd.h"

namespace qd {

constexpr int64_t kKeyBlock = 16;

inline int64_t key_offset(int64_t position, int64_t d, int64_t head_dim) {
  return (position / kKeyBlock) * head_dim * kKeyBlock + d * kKeyBlock + position % kKeyBlock;
}

inline int64_t key_blocks(int64_t positions) { return (positions + kKeyBlock - 1) / kKeyBlock; }

#if defined(__AVX512F__)
constexpr const char* kAttentionIsa = "avx512";

// Scores of H query heads (q: [H][D]) against `blocks` blocks of 16 keys, times scale: scores [H][blocks·16].
template <int H>
inline void block_scores(const float* q, const float* keys, int64_t blocks, int64_t head_dim, float scale,
                         float* scores, int64_t stride) {
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 acc[H];
    for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
    const float* block = keys + b * head_dim * kKeyBlock;
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m512 k = _mm512_loadu_ps(block + d * kKeyBlock);
      for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * head_dim + d]), k, acc[h]);
    }
    for (int h = 0; h < H; ++h) _mm512_storeu_ps(scores + h * stride + b * kKeyBlock, _mm512_mul_ps(acc[h], _mm512_set1_ps(scale)));
  }
}

// softmax(scores[0..length)) · values -> out [D]; scores are overwritten with the weights.
inline void softmax_values(float* scores, int64_t length, const float* values, int64_t head_dim, float* out) {
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
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int64_t first = 0; first < head_dim; first += 8 * 16) {  // 8 vectors of the output at a time
    const int64_t vectors = std::min<int64_t>(8, (head_dim - first + 15) / 16);
    const __mmask16 tail = static_cast<__mmask16>(head_dim - first >= 16 * vectors ? 0xFFFF : (1u << ((head_dim - first) % 16)) - 1u);
    __m512 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; ++j) {
      const __m512 w = _mm512_set1_ps(scores[j]);
      const float* v = values + j * head_dim + first;
      for (int i = 0; i < 8; ++i)
        if (i < vectors) acc[i] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(i + 1 < vectors ? 0xFFFF : tail, v + 16 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i)
      if (i < vectors) _mm512_mask_storeu_ps(out + first + 16 * i, i + 1 < vectors ? 0xFFFF : tail, _mm512_mul_ps(acc[i], inverse));
  }
}

template <int H>
inline void attend_heads(const float* q, const float* keys, const float* values, int64_t length, int64_t head_dim,
                         float scale, float* out, float* scores) {
  const int64_t stride = key_blocks(length) * kKeyBlock;
  block_scores<H>(q, keys, key_blocks(length), head_dim, scale, scores, stride);
  for (int h = 0; h < H; ++h) softmax_values(scores + h * stride, length, values, head_dim, out + h * head_dim);
}

#else
constexpr const char* kAttentionIsa = "scalar";

template <int H>
inline void attend_heads(const float* q, const float* keys, const float* values, int64_t length, int64_t head_dim,
                         float scale, float* out, float* scores) {
  for (int h = 0; h < H; ++h) {
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) {
      float total = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) total += q[h * head_dim + d] * keys[key_offset(j, d, head_dim)];
      scores[j] = total * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < length; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
    float* o = out + h * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    for (int64_t j = 0; j < length; ++j)
      for (int64_t d = 0; d < head_dim; ++d) o[d] += scores[j] * values[j * head_dim + d];
    for (int64_t d = 0; d < head_dim; ++d) o[d] /= sum;
  }
}
#endif

// The query heads q [heads][D] of one KV head's group at position length - 1: out [heads][D]. scores is scratch of
// at least 8 · key_blocks(length) · 16 floats. Heads go 8 at a time; each head's arithmetic is its own.
inline void attend_group(const float* q, int64_t heads, const float* keys, const float* values, int64_t length,
                         int64_t head_dim, float scale, float* out, float* scores) {
  for (int64_t first = 0; first < heads; first += 8) {
    const float* qs = q + first * head_dim;
    float* os = out + first * head_dim;
    switch (std::min<int64_t>(8, heads - first)) {
      case 1: attend_heads<1>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 2: attend_heads<2>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 3: attend_heads<3>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 4: attend_heads<4>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 5: attend_heads<5>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 6: attend_heads<6>(qs, keys, values, length, head_dim, scale, os, scores); break;
      case 7: attend_heads<7>(qs, keys, values, length, head_dim, scale, os, scores); break;
      default: attend_heads<8>(qs, keys, values, length, head_dim, scale, os, scores); break;
    }
  }
}

}  // namespace qd
