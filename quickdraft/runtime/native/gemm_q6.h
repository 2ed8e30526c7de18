// The integer GEMM against weights in llama.cpp's Q6_K structure, kept as the file stores them (gemm.h's rules:
// every output element depends on its own row and column alone, with the same bits on every instruction set).
//
// Format "q6" (6-bit codes in sub-blocks of 16 along k, each with a signed 8-bit sub-scale, under a float d per
// superblock of 256):
//   w[n][k] = d[n][s] * sub_scale[n][j] * (code[n][k] - 32)
//   for k in sub-block j = k / 16 of superblock s = k / 256; codes in [0, 63], sub-scales in [-128, 127].
//   out[m][n] = over the sub-blocks j in order, acc = fma(d[n][s] * float(sub_scale[n][j]), float(I[m][n][j]), acc)
//   from acc = 0 (q6_reference below), where I = sum_{k in j} code * x - 32 * X[m][j] is an exact integer and
//   exact as a float (|I| <= 16 * 63 * 127 + 32 * 16 * 127 < 2^24), X[m][j] = sum_{k in j} x[m][k].
//   codes: the low 4 bits, laid out as q4's codes ([N/16][G][4][16][4], G = K/32 groups of two sub-blocks, code
//   vector j of a group being k = 32g + 4j + i of lane n0 + l); high: [N/16][G][2][16][4], byte (h, l, i) holding
//   the top 2 bits of code vector 4h + c at bits 2c (c = 0..3); sub_scale: [N/16][G][16][2] int8 (a group's two
//   sub-blocks side by side); d: [N/16][S][16] float. K must be a multiple of 32.
#pragma once

#include "gemm.h"

namespace qd {

constexpr int64_t kSubBlock = 16;  // q6: weights per sub-scale
constexpr int32_t kQ6Offset = 32;  // q6: codes hold w / (d * sub_scale) + 32

struct Q6Weights {
  const uint8_t* codes;     // [N/16][G][4][16][4] low 4 bits
  const uint8_t* high;      // [N/16][G][2][16][4] top 2 bits
  const int8_t* sub_scale;  // [N/16][G][16][2]
  const float* d;           // [N/16][S][16]
  int64_t n, k;
  int64_t groups() const { return k / kGroup; }
  int64_t supers() const { return (groups() + kGroupsPerSuper - 1) / kGroupsPerSuper; }
};

// offsets [K/16]: -32 * X[j] for each sub-block j, where a sub-block's sum of code * x starts.
inline void sub_block_offsets(const int8_t* x, int64_t k, int32_t* offsets) {
  for (int64_t j = 0; j < k / kSubBlock; ++j) offsets[j] = -kQ6Offset * row_sum(x + j * kSubBlock, kSubBlock);
}

// ---- the definition, one element at a time (the oracle of the tests; also the path without AVX2) ------------

inline uint8_t q6_code(const Q6Weights& w, int64_t n, int64_t k) {
  const int64_t g = k / kGroup, j = (k % kGroup) / 4, i = k % 4, lane_byte = (n % kLanes) * 4 + i;
  const int64_t group = (n / kLanes) * w.groups() + g;
  const uint8_t low = w.codes[(group * 4 + j % 4) * 64 + lane_byte];
  const uint8_t high = w.high[(group * 2 + j / 4) * 64 + lane_byte];
  return static_cast<uint8_t>((j < 4 ? low & 0x0F : low >> 4) | (((high >> (2 * (j % 4))) & 3) << 4));
}

inline float q6_reference(const Q6Weights& w, const int8_t* x, int64_t n) {
  const int64_t block = n / kLanes, lane = n % kLanes, groups = w.groups();
  float acc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const float d = w.d[(block * w.supers() + g / kGroupsPerSuper) * kLanes + lane];
    for (int64_t half = 0; half < 2; ++half) {
      int32_t dot = 0, sum = 0;
      for (int64_t k = g * kGroup + half * kSubBlock; k < g * kGroup + (half + 1) * kSubBlock; ++k)
        dot += q6_code(w, n, k) * x[k], sum += x[k];
      const float scale = d * static_cast<float>(w.sub_scale[((block * groups + g) * kLanes + lane) * 2 + half]);
      acc = std::fma(scale, static_cast<float>(dot - kQ6Offset * sum), acc);
    }
  }
  return acc;
}

// ---- the fast paths: out[m][n] for rows [0, m) and the n-blocks [block_begin, block_end) ---------------------
//
// Each group's 8 code vectors are rebuilt from their low 4 bits and top 2 bits, then multiplied as q4's are. A
// sub-block's integer sum starts from the row's -32 * X offset, and goes into the row's float sum with one fused
// multiply-add by the sub-block's float scale.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// The top 2 bits of code vector 4h + c (in `high`, vector h) moved to bits 4-5 of each byte (c is a constant
// once the loops over it are unrolled).
inline __m512i q6_top_bits(__m512i high, int c) {
  const __m512i shifted = c < 2 ? _mm512_slli_epi16(high, 4 - 2 * c) : _mm512_srli_epi16(high, 2 * c - 4);
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x30));
}

template <int R>
inline void q6_tile(const Q6Weights& w, const int8_t* x, int64_t x_stride, const int32_t* offsets,
                    int64_t offset_stride, int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* low = w.codes + (block * groups + g) * 256;
    const uint8_t* top = w.high + (block * groups + g) * 128;
    prefetch(top);
    prefetch(top + 64);
    const __m512i high0 = _mm512_loadu_si512(top), high1 = _mm512_loadu_si512(top + 64);
    __m512i c[8];
    QD_UNROLL for (int j = 0; j < 4; ++j) {
      prefetch(low + j * 64);
      const __m512i v = _mm512_loadu_si512(low + j * 64);
      c[j] = _mm512_or_si512(_mm512_and_si512(v, low_nibbles), q6_top_bits(high0, j));
      c[j + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles), q6_top_bits(high1, j));
    }
    const __m512i scale_pairs = _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.sub_scale + (block * groups + g) * 2 * kLanes)));
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + g / kGroupsPerSuper) * kLanes);
    const __m512 scale_a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(scale_pairs, 16), 16)));
    const __m512 scale_b = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(scale_pairs, 16)));
    QD_UNROLL for (int r = 0; r < R; ++r) {
      const int8_t* row = x + r * x_stride + g * kGroup;
      const int32_t* offset = offsets + r * offset_stride + 2 * g;
      __m512i dot_a = _mm512_set1_epi32(offset[0]), dot_b = _mm512_set1_epi32(offset[1]);
      group_halves(dot_a, dot_b, c, row);
      acc[r] = _mm512_fmadd_ps(scale_a, _mm512_cvtepi32_ps(dot_a), acc[r]);
      acc[r] = _mm512_fmadd_ps(scale_b, _mm512_cvtepi32_ps(dot_b), acc[r]);
    }
  }
  QD_UNROLL for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * out_stride + block * kLanes, acc[r]);
}

constexpr int kQ6Rows = 16;

#elif defined(__AVX2__) && defined(__FMA__)

inline __m256i q6_top_bits(__m256i high, int c) {
  const __m256i shifted = c < 2 ? _mm256_slli_epi16(high, 4 - 2 * c) : _mm256_srli_epi16(high, 2 * c - 4);
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x30));
}

#if defined(__AVXVNNI__)
inline __m256i q6_dot(__m256i acc, __m256i a, __m256i b, __m256i x_a, __m256i x_b) {
  return dot_bytes(dot_bytes(acc, a, x_a), b, x_b);
}
#else
// Two code vectors' products summed in int16 before one widening: codes <= 63 and |x| <= 127 keep a pair at most
// 2 * 63 * 127 = 16002 in size, and two pairs at most 32004 < 2^15, so the sums are exact.
inline __m256i q6_dot(__m256i acc, __m256i a, __m256i b, __m256i x_a, __m256i x_b) {
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(a, x_a), _mm256_maddubs_epi16(b, x_b));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

// Two halves of 8 lanes each, as q4's. A sub-block's 4 code vectors stay in registers while the tile's rows take
// turns on them (HalfSums keeps the rows' sums, locally: they take an addition per sub-block).
template <int R>
inline void q6_tile(const Q6Weights& w, const int8_t* x, int64_t x_stride, const int32_t* offsets,
                    int64_t offset_stride, int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    HalfSums<R, SumsIn::kLocal> sums(out + block * kLanes + 8 * h, out_stride);
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* low = w.codes + (block * groups + g) * 256 + 32 * h;
      const uint8_t* top = w.high + (block * groups + g) * 128 + 32 * h;
      const __m256i scale_pairs = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_scale + ((block * groups + g) * kLanes + 8 * h) * 2)));
      const __m256 d = _mm256_loadu_ps(w.d + (block * supers + g / kGroupsPerSuper) * kLanes + 8 * h);
      const __m256 scales[2] = {
          _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(scale_pairs, 16), 16))),
          _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srai_epi32(scale_pairs, 16)))};
      QD_UNROLL for (int half = 0; half < 2; ++half) {  // the group's sub-blocks: code vectors 4 * half + j
        prefetch(top + half * 64);
        const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(top + half * 64));
        __m256i c[4];
        QD_UNROLL for (int j = 0; j < 4; ++j) {
          if (half == 0) prefetch(low + j * 64);
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + j * 64));
          const __m256i nibbles = half == 0 ? v : _mm256_srli_epi16(v, 4);
          c[j] = _mm256_or_si256(_mm256_and_si256(nibbles, low_nibbles), q6_top_bits(high, j));
        }
        QD_UNROLL for (int r = 0; r < R; ++r) {
          const int8_t* row = x + r * x_stride + g * kGroup + 16 * half;
          __m256i dot = _mm256_set1_epi32(offsets[r * offset_stride + 2 * g + half]);
          dot = q6_dot(dot, c[0], c[1], _mm256_set1_epi32(load4(row)), _mm256_set1_epi32(load4(row + 4)));
          dot = q6_dot(dot, c[2], c[3], _mm256_set1_epi32(load4(row + 8)), _mm256_set1_epi32(load4(row + 12)));
          sums.add(r, scales[half], dot);
        }
      }
    }
    sums.finish();
  }
}

constexpr int kQ6Rows = 16;

#else

template <int R>
inline void q6_tile(const Q6Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                    float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return q6_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

constexpr int kQ6Rows = 1;
#endif

// offsets [rows, K/16] from sub_block_offsets.
inline void q6_gemm(const Q6Weights& w, const int8_t* x, int64_t rows, const int32_t* offsets, float* out,
                    int64_t out_stride, int64_t block_begin, int64_t block_end) {
  const int64_t offset_stride = w.k / kSubBlock;
  for_each_block_tile<kQ6Rows>(rows, w.k, block_begin, block_end, [&](int64_t block, int64_t row, auto tile_rows) {
    q6_tile<decltype(tile_rows)::value>(w, x + row * w.k, w.k, offsets + row * offset_stride, offset_stride, block,
                                        out + row * out_stride, out_stride);
  });
}

}  // namespace qd
