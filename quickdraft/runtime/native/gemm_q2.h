// The integer GEMM against weights in llama.cpp's Q2_K structure, kept as the file stores them (gemm.h's rules:
// every output element depends on its own row and column alone, with the same bits on every instruction set).
//
// Format "q2" (2-bit codes in sub-blocks of 16 along k, each with a 4-bit sub-scale and a 4-bit sub-min, under a
// float d and dmin per superblock of 256):
//   w[n][k] = d[n][s] * sub_scale[n][j] * code[n][k] + dmin[n][s] * sub_min[n][j]
//   for k in sub-block j = k / 16 of superblock s = k / 256; codes in [0, 3], sub-scales and sub-mins in [0, 15]
//   (a file's dmin is stored negated: its weights are d * sub_scale * code - dmin * sub_min).
//   out[m][n] = q4's float sequence with sub-blocks for groups (q2_reference below): per superblock s, in order,
//     acc = fma(d[n][s], float(T), acc),   T = sum_{j in s} sub_scale[n][j] * sum_{k in j} code * x   (exact int32)
//     acc = fma(dmin[n][s], float(O), acc), O = sum_{j in s} sub_min[n][j] * X[m][j], X[m][j] = sum_{k in j} x[m][k]
//   (|T| <= 16 * 15 * 16 * 3 * 127 and |O| <= 16 * 15 * 16 * 127, both below 2^24: exact as floats).
//   codes: [N/16][G][2][16][4], G = K/32 groups of two sub-blocks: byte (h, l, i) holds code vector 4h + c at bits
//   2c (c = 0..3), code vector j of a group being k = 32g + 4j + i of lane n0 + l (q6's `high` layout), so a
//   sub-block's 4 code vectors are one 64-byte vector. scales: [N/16][G][16][2] uint8, a sub-block's sub-scale in
//   the low nibble and its sub-min in the high one (the file's byte), a group's two sub-blocks side by side.
//   d, dmin: [N/16][S][16] float. K must be a multiple of 32.
#pragma once

#include "gemm.h"

namespace qd {

constexpr int64_t kQ2SubBlock = 16;  // q2: weights per sub-scale and sub-min

struct Q2Weights {
  const uint8_t* codes;   // [N/16][G][2][16][4]
  const uint8_t* scales;  // [N/16][G][16][2]: sub_scale | sub_min << 4
  const float* d;         // [N/16][S][16]
  const float* dmin;      // [N/16][S][16]
  int64_t n, k;
  int64_t groups() const { return k / kGroup; }
  int64_t supers() const { return (groups() + kGroupsPerSuper - 1) / kGroupsPerSuper; }
};

// pairs [K/32]: (X of sub-block 2g, X of sub-block 2g + 1) as int16 words packed in 32 bits (the second in the high
// half), for one multiply-add with a group's two sub-mins; |X| <= 16 * 127 fits in 16 bits.
inline void sub_block_sum_pairs(const int8_t* x, int64_t k, int32_t* pairs) {
  for (int64_t g = 0; g < k / kGroup; ++g) {
    const int32_t low = row_sum(x + g * kGroup, kQ2SubBlock), high = row_sum(x + g * kGroup + kQ2SubBlock, kQ2SubBlock);
    pairs[g] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(low)) |
                                    (static_cast<uint32_t>(static_cast<uint16_t>(high)) << 16));
  }
}

// ---- the definition, one element at a time (the oracle of the tests; also the path without AVX2) ------------

inline uint8_t q2_code(const Q2Weights& w, int64_t n, int64_t k) {
  const int64_t g = k / kGroup, j = (k % kGroup) / 4, i = k % 4;
  const uint8_t byte = w.codes[(((n / kLanes) * w.groups() + g) * 2 + j / 4) * 64 + (n % kLanes) * 4 + i];
  return static_cast<uint8_t>((byte >> (2 * (j % 4))) & 3);
}

inline float q2_reference(const Q2Weights& w, const int8_t* x, int64_t n) {
  const int64_t block = n / kLanes, lane = n % kLanes, groups = w.groups();
  float acc = 0.0f;
  for (int64_t s = 0; s < w.supers(); ++s) {
    int32_t total = 0, offset = 0;
    for (int64_t j = 2 * s * kGroupsPerSuper; j < 2 * super_end(s, groups); ++j) {
      int32_t dot = 0, sum = 0;
      for (int64_t k = j * kQ2SubBlock; k < (j + 1) * kQ2SubBlock; ++k) dot += q2_code(w, n, k) * x[k], sum += x[k];
      const uint8_t scales = w.scales[((block * groups + j / 2) * kLanes + lane) * 2 + j % 2];
      total += static_cast<int32_t>(scales & 0x0F) * dot;
      offset += static_cast<int32_t>(scales >> 4) * sum;
    }
    acc = std::fma(w.d[(block * w.supers() + s) * kLanes + lane], static_cast<float>(total), acc);
    acc = std::fma(w.dmin[(block * w.supers() + s) * kLanes + lane], static_cast<float>(offset), acc);
  }
  return acc;
}

// ---- the fast paths: out[m][n] for rows [0, m) and the n-blocks [block_begin, block_end) ---------------------
//
// A group's two 64-byte vectors hold its 8 code vectors, 2 bits each, shifted and masked into bytes. The min term
// is summed at the end of each superblock, as q4's.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// Each code byte times its sub-scale, once per group for all the tile's rows: code * sub_scale <= 45 fits in a
// byte, so a 16-bit multiply by the sub-scale in both bytes' words carries nothing across them, and each row's byte
// multiply-adds sum sub_scale * code * x straight into the superblock's total (the same integer as scaling each
// sub-block's sum).
template <int R>
inline void q2_tile(const Q2Weights& w, const int8_t* x, int64_t x_stride, const int32_t* pairs, int64_t pair_stride,
                    int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m512i two_bits = _mm512_set1_epi8(0x03), low_word_nibble = _mm512_set1_epi32(0x0F);
  RowSums<R> sums(out + block * kLanes, out_stride);
  for (int64_t s = 0; s < supers; ++s) {
    const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
    __m512i total[R];
    QD_UNROLL for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_si512();
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* packed = w.codes + (block * groups + g) * 128;
      prefetch(packed);
      prefetch(packed + 64);
      const __m512i v0 = _mm512_loadu_si512(packed), v1 = _mm512_loadu_si512(packed + 64);
      __m512i c[8];
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        c[j] = _mm512_and_si512(_mm512_srli_epi16(v0, 2 * j), two_bits);
        c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v1, 2 * j), two_bits);
      }
      const __m512i bytes = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + (block * groups + g) * 2 * kLanes)));
      const __m512i scale_a = _mm512_and_si512(bytes, low_word_nibble);  // (sub_scale a, 0) as int16 words
      const __m512i scale_b = _mm512_and_si512(_mm512_srli_epi32(bytes, 16), low_word_nibble);
      const __m512i words_a = _mm512_or_si512(scale_a, _mm512_slli_epi32(scale_a, 16));  // in both words
      const __m512i words_b = _mm512_or_si512(scale_b, _mm512_slli_epi32(scale_b, 16));
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        c[j] = _mm512_mullo_epi16(c[j], words_a);
        c[j + 4] = _mm512_mullo_epi16(c[j + 4], words_b);
      }
      QD_UNROLL for (int r = 0; r < R; ++r) {
        const int8_t* row = x + r * x_stride + g * kGroup;
        __m512i dot_b = _mm512_setzero_si512();  // two chains of 4 multiply-adds
        QD_UNROLL for (int j = 0; j < 4; ++j) {
          total[r] = _mm512_dpbusd_epi32(total[r], c[j], _mm512_set1_epi32(load4(row + 4 * j)));
          dot_b = _mm512_dpbusd_epi32(dot_b, c[j + 4], _mm512_set1_epi32(load4(row + 4 * (j + 4))));
        }
        total[r] = _mm512_add_epi32(total[r], dot_b);
      }
    }
    __m512i min_pairs[kGroupsPerSuper];  // 16 lanes of (sub-min of sub-block 2g, of 2g + 1) as int16
    QD_UNROLL for (int p = 0; p < kGroupsPerSuper; ++p)
      if (begin + p < end)
        min_pairs[p] = _mm512_srli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w.scales + (block * groups + begin + p) * 2 * kLanes))), 4);
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + s) * kLanes);
    const __m512 dmin = _mm512_loadu_ps(w.dmin + (block * supers + s) * kLanes);
    QD_UNROLL for (int r = 0; r < R; ++r) {
      __m512 sum = sums.get(r);
      sum = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(total[r]), sum);
      __m512i offset = _mm512_setzero_si512();
      QD_UNROLL for (int p = 0; p < kGroupsPerSuper; ++p)
        if (begin + p < end)
          offset = _mm512_dpwssd_epi32(offset, min_pairs[p], _mm512_set1_epi32(pairs[r * pair_stride + begin + p]));
      sum = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(offset), sum);
      sums.set(r, sum);
    }
  }
  sums.finish();
}

constexpr int kQ2Rows = 16;

#elif defined(__AVX2__) && defined(__FMA__)

// A sub-block's sum of code * x for one row: u8 x s8 products in int16 words, 8 products a word (at most
// 8 * 3 * 127 = 3048: exact), then times the sub-scale (in both words of a lane) into the int32 total.
inline __m256i q2_add_scaled(__m256i total, const __m256i* c, const int8_t* row, __m256i scale_words) {
  __m256i words = _mm256_maddubs_epi16(c[0], _mm256_set1_epi32(load4(row)));
  QD_UNROLL for (int j = 1; j < 4; ++j)
    words = _mm256_add_epi16(words, _mm256_maddubs_epi16(c[j], _mm256_set1_epi32(load4(row + 4 * j))));
  return _mm256_add_epi32(total, _mm256_madd_epi16(words, scale_words));
}

// Two halves of 8 lanes each, as q4's: a group's 8 code vectors of one half stay in registers while the tile's rows
// take turns on them (HalfTotals keeps the rows' superblock totals, HalfSums their float sums).
template <int R>
inline void q2_tile(const Q2Weights& w, const int8_t* x, int64_t x_stride, const int32_t* pairs, int64_t pair_stride,
                    int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m256i two_bits = _mm256_set1_epi8(0x03), nibble_words = _mm256_set1_epi16(0x0F);
  for (int h = 0; h < 2; ++h) {
    HalfSums<R> sums(out + block * kLanes + 8 * h, out_stride);
    for (int64_t s = 0; s < supers; ++s) {
      const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
      HalfTotals<R> totals;
      for (int64_t g = begin; g < end; ++g) {
        const uint8_t* packed = w.codes + (block * groups + g) * 128 + 32 * h;
        prefetch(packed);
        prefetch(packed + 64);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + 64));
        __m256i c[8];
        QD_UNROLL for (int j = 0; j < 4; ++j) {
          c[j] = _mm256_and_si256(_mm256_srli_epi16(v0, 2 * j), two_bits);
          c[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v1, 2 * j), two_bits);
        }
        const __m256i bytes = _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + ((block * groups + g) * kLanes + 8 * h) * 2)));
        const __m256i scale_pairs = _mm256_and_si256(bytes, nibble_words);  // (sub_scale a, sub_scale b) words
        const __m256i scale_a = _mm256_or_si256(_mm256_slli_epi32(scale_pairs, 16), _mm256_srli_epi32(_mm256_slli_epi32(scale_pairs, 16), 16));
        const __m256i scale_b = _mm256_or_si256(_mm256_srli_epi32(scale_pairs, 16), _mm256_slli_epi32(_mm256_srli_epi32(scale_pairs, 16), 16));
        QD_UNROLL for (int r = 0; r < R; ++r) {
          const int8_t* row = x + r * x_stride + g * kGroup;
          totals.set(r, q2_add_scaled(q2_add_scaled(totals.get(r), c, row, scale_a), c + 4, row + 16, scale_b));
        }
      }
      const __m256 d = _mm256_loadu_ps(w.d + (block * supers + s) * kLanes + 8 * h);
      const __m256 dmin = _mm256_loadu_ps(w.dmin + (block * supers + s) * kLanes + 8 * h);
      QD_UNROLL for (int r = 0; r < R; ++r) {
        sums.add(r, d, totals.get(r));
        __m256i offset = _mm256_setzero_si256();
        for (int64_t g = begin; g < end; ++g) {
          const __m256i mins = _mm256_srli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(
              reinterpret_cast<const __m128i*>(w.scales + ((block * groups + g) * kLanes + 8 * h) * 2))), 4);
          offset = _mm256_add_epi32(offset, _mm256_madd_epi16(mins, _mm256_set1_epi32(pairs[r * pair_stride + g])));
        }
        sums.add(r, dmin, offset);
      }
    }
    sums.finish();
  }
}

constexpr int kQ2Rows = 8;

#else

template <int R>
inline void q2_tile(const Q2Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                    float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return q2_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

constexpr int kQ2Rows = 1;
#endif

// pairs [rows, K/32] from sub_block_sum_pairs.
inline void q2_gemm(const Q2Weights& w, const int8_t* x, int64_t rows, const int32_t* pairs, float* out,
                    int64_t out_stride, int64_t block_begin, int64_t block_end) {
  const int64_t pair_stride = w.groups();
  for_each_block_tile<kQ2Rows>(rows, w.k, block_begin, block_end, [&](int64_t block, int64_t row, auto tile_rows) {
    q2_tile<decltype(tile_rows)::value>(w, x + row * w.k, w.k, pairs + row * pair_stride, pair_stride, block,
                                        out + row * out_stride, out_stride);
  });
}

}  // namespace qd
