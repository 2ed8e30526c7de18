// The integer GEMM against weights in llama.cpp's IQ4_XS structure, kept as the file stores them (gemm.h's rules:
// every output element depends on its own row and column alone, with the same bits on every instruction set).
// The IQ2 and IQ1 types load into it, and into iq4h below, with tables of their own (iquants.py).
//
// Format "iq4" (4-bit indices into a table of 16 int8 values, in groups of 32 along k, each group with a signed
// sub-scale, under a float d per superblock of 8 groups):
//   w[n][k] = d[n][s] * sub_scale[n][g] * table[n / 16][code[n][k]]
//   for k in group g = k / 32 of superblock s = g / 8; codes in [0, 15], sub-scales and table values in [-128, 127].
//   out[m][n] = over the superblocks s in order, acc = fma(d[n][s], float(T), acc) from acc = 0 (iq4_reference
//   below), where T = sum_{g in s} sub_scale[n][g] * sum_{k in g} value * x is an exact int32
//   (|T| <= 8 * 128 * 32 * 128 * 127 < 2^31).
//   codes: q4's layout and nibbles ([N/16][G][4][16][4]: the low nibble of vector j's byte (l, i) is k = 32g + 4j + i
//   of lane n0 + l, the high nibble k = 32g + 4(j + 4) + i); table: [N/16][16] int8, a panel's values (IQ4_XS:
//   llama.cpp's kvalues_iq4nl); sub_scale: [N/16][G][16] int8; d: [N/16][S][16] float. K must be a multiple of 32.
// Format "iq4h": iq4 with a sub-scale per half group (16 weights: IQ2_XS's, IQ2_S's and IQ1_M's), the same sums
//   with sub-blocks of 16 for groups: T = sum_{j in s} sub_scale[n][j] * sum_{k in j} value * x. sub_scale:
//   [N/16][G][2][16] int8, a group's two halves one after the other.
#pragma once

#include "gemm.h"

namespace qd {

struct Iq4Weights {
  const uint8_t* codes;     // [N/16][G][4][16][4] nibbles
  const int8_t* table;      // [N/16][16] the values a panel's codes index
  const int8_t* sub_scale;  // [N/16][G][16]
  const float* d;           // [N/16][S][16]
  int64_t n, k;
  bool halves = false;  // iq4h: a sub-scale per 16 weights
  int64_t groups() const { return k / kGroup; }
  int64_t supers() const { return (groups() + kGroupsPerSuper - 1) / kGroupsPerSuper; }
  int64_t sub_blocks() const { return halves ? 2 * groups() : groups(); }  // sub-scales per row
};

constexpr int64_t kIq4HalfBlock = 16;  // iq4h: weights per sub-scale

// offsets [K/16]: -128 * X[j] for each half group j, where iq4h's sums of (value + 128) * x start on VNNI.
inline void half_group_offsets(const int8_t* x, int64_t k, int32_t* offsets) {
  for (int64_t j = 0; j < k / kIq4HalfBlock; ++j) offsets[j] = -kByteOffset * row_sum(x + j * kIq4HalfBlock, kIq4HalfBlock);
}

// ---- the definition, one element at a time (the oracle of the tests; also the path without AVX2) ------------

inline int32_t iq4_value(const Iq4Weights& w, int64_t n, int64_t k) {
  const int64_t g = k / kGroup, within = k % kGroup, j = (within / 4) % 4, i = within % 4;
  const uint8_t byte = w.codes[(((n / kLanes) * w.groups() + g) * 4 + j) * 64 + (n % kLanes) * 4 + i];
  return w.table[(n / kLanes) * 16 + (within < 16 ? byte & 0x0F : byte >> 4)];
}

inline float iq4_reference(const Iq4Weights& w, const int8_t* x, int64_t n) {
  const int64_t block = n / kLanes, lane = n % kLanes, groups = w.groups();
  float acc = 0.0f;
  for (int64_t s = 0; s < w.supers(); ++s) {
    int32_t total = 0;
    const int64_t per_group = w.halves ? 2 : 1, width = kGroup / per_group;
    for (int64_t j = s * kGroupsPerSuper * per_group; j < super_end(s, groups) * per_group; ++j) {
      int32_t dot = 0;
      for (int64_t k = j * width; k < (j + 1) * width; ++k) dot += iq4_value(w, n, k) * x[k];
      total += static_cast<int32_t>(w.sub_scale[(block * w.sub_blocks() + j) * kLanes + lane]) * dot;
    }
    acc = std::fma(w.d[(block * w.supers() + s) * kLanes + lane], static_cast<float>(total), acc);
  }
  return acc;
}

// ---- the fast paths: out[m][n] for rows [0, m) and the n-blocks [block_begin, block_end) ---------------------
//
// Each vector of a group's nibbles becomes its values by one byte shuffle, and the tile's rows take turns on it while
// their superblock totals stay in integer registers; a superblock's total goes into the row's float sum by one fused
// multiply-add, as in the definition.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// AVX-512 VNNI: the shuffle gives value + 128 (value XOR 0x80, an unsigned byte), and a group's 8 byte multiply-adds
// per row (group_dot) start from its offset -128 * X[g] (group_offsets), so they end at the exact sum of
// value * x (|.| <= 32 * 255 * 128 during the sum, far inside int32). One 32-bit multiply by the lane's sub-scale and an
// addition take it into the row's superblock total. iq4h's halves each start from their own offset (half_group_offsets)
// and take their own sub-scale (group_halves), multiplied apart.
template <int R, bool Halves>
inline void iq4_tile(const Iq4Weights& w, const int8_t* x, int64_t x_stride, const int32_t* offsets,
                     int64_t offset_stride, int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512i table = _mm512_xor_si512(
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16))),
      _mm512_set1_epi8(-128));
  __m512 acc[R];
  QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
    __m512i totals[R];
    QD_UNROLL for (int r = 0; r < R; ++r) totals[r] = _mm512_setzero_si512();
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* packed = w.codes + (block * groups + g) * 256;
      const int8_t* scales = w.sub_scale + (block * groups + g) * (Halves ? 2 : 1) * kLanes;
      const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      const __m512i scale_b = Halves ? _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + kLanes)))
                                     : scale;
      __m512i c[8];  // code vector j: k = 32g + 4j + i of lane l in bytes (l, i)
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        prefetch(packed + j * 64);
        const __m512i bytes = _mm512_loadu_si512(packed + j * 64);
        c[j] = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles));
        c[j + 4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles));
      }
      QD_UNROLL for (int r = 0; r < R; ++r) {
        const int8_t* row = x + r * x_stride + g * kGroup;
        if constexpr (Halves) {
          const int32_t* offset = offsets + r * offset_stride + 2 * g;
          __m512i dot_a = _mm512_set1_epi32(offset[0]), dot_b = _mm512_set1_epi32(offset[1]);
          group_halves(dot_a, dot_b, c, row);
          totals[r] = _mm512_add_epi32(totals[r], _mm512_add_epi32(_mm512_mullo_epi32(dot_a, scale), _mm512_mullo_epi32(dot_b, scale_b)));
        } else {
          const __m512i dot = group_dot(_mm512_set1_epi32(offsets[r * offset_stride + g]), c, row);
          totals[r] = _mm512_add_epi32(totals[r], _mm512_mullo_epi32(dot, scale));
        }
      }
    }
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + s) * kLanes);
    QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(totals[r]), acc[r]);
  }
  QD_UNROLL for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * out_stride + block * kLanes, acc[r]);
}

constexpr int kIq4Rows = 8;

#elif defined(__AVX2__) && defined(__FMA__)

// AVX2: the values are signed, so each row multiplies |value| by x carrying the value's sign (0 for a value 0; a
// pair of products is at most 2 * 128 * 127 = 32512: exact in int16), and one word multiply-add per pair of products adds
// the lane's sub-scale times their sum to the row's total. That sign is one more operation per 32 products than the
// int8 format's AVX2 path takes, and without VNNI a tile's rows are bound by such operations, not by memory. iq4h's
// code vectors 0-3 take the group's first sub-scale, 4-7 its second.
template <int R, bool Halves>
inline void iq4_tile(const Iq4Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                     float* out, int64_t out_stride) {
  const int64_t groups = w.groups(), supers = w.supers();
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16)));
  for (int h = 0; h < 2; ++h) {
    HalfSums<R> sums(out + block * kLanes + 8 * h, out_stride);
    for (int64_t s = 0; s < supers; ++s) {
      const __m256 d = _mm256_loadu_ps(w.d + (block * supers + s) * kLanes + 8 * h);
      const int64_t begin = s * kGroupsPerSuper, end = super_end(s, groups);
      __m256i totals[R];
      QD_UNROLL for (int r = 0; r < R; ++r) totals[r] = _mm256_setzero_si256();
      for (int64_t g = begin; g < end; ++g) {
        const uint8_t* packed = w.codes + (block * groups + g) * 256;
        // each lane's sub-scale in both int16 words of its int32 (iq4h: the group's first half's, then its second's)
        const int8_t* scales = w.sub_scale + (block * groups + g) * (Halves ? 2 : 1) * kLanes + 8 * h;
        __m256i both[2];
        QD_UNROLL for (int half = 0; half < 2; ++half) {
          const __m256i scale32 = _mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + (Halves ? half * kLanes : 0))));
          both[half] = _mm256_or_si256(_mm256_and_si256(scale32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(scale32, 16));
        }
        QD_UNROLL for (int j = 0; j < 8; ++j) {  // vector j % 4's low (j < 4) or high nibbles: k = 32g + 4j + i
          if (j < 4) prefetch(packed + j * 64);
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + (j % 4) * 64 + 32 * h));
          const __m256i nibbles = _mm256_and_si256(j < 4 ? bytes : _mm256_srli_epi16(bytes, 4), low_nibbles);
          const __m256i values = _mm256_shuffle_epi8(table, nibbles), magnitudes = _mm256_abs_epi8(values);
          QD_UNROLL for (int r = 0; r < R; ++r) {
            const __m256i xs = _mm256_set1_epi32(load4(x + r * x_stride + g * kGroup + 4 * j));
            const __m256i pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(xs, values));
            totals[r] = _mm256_add_epi32(totals[r], _mm256_madd_epi16(pairs, both[j / 4]));
          }
        }
      }
      QD_UNROLL for (int r = 0; r < R; ++r) sums.add(r, d, totals[r]);
    }
    sums.finish();
  }
}

constexpr int kIq4Rows = 8;

#else

template <int R, bool Halves>
inline void iq4_tile(const Iq4Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                     float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return iq4_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

constexpr int kIq4Rows = 1;
#endif

#if defined(QD_AMX)

// AMX (gemm_amx.h), for many rows (a prompt), as q4's: a superblock's exact total T is one integer product of x with
// w' = sub_scale * value (|w'| <= 128 * 128), which goes on tiles as two byte products, w' = 256 * high + low with
// high signed (|high| <= 64) and low unsigned: an n-block's w' halves are written once per range of superblocks and
// serve all its rows. T goes into the row's float sum as in the definition, so the bits are the vector path's. K must
// be a multiple of 64 here (two groups a tile); other widths take the vector path.

constexpr int64_t kIq4AmxMinRows = 32;  // fewer rows: the vector path is as fast (writing the w' halves costs)

// The w' halves of n-block `block` for groups [group_begin, group_end) as B tiles, one per 64 k (two groups), in
// q4_amx_halves' layout; iq4h's code vectors 0-3 take the group's first sub-scale, 4-7 its second.
inline void iq4_amx_halves(const Iq4Weights& w, int64_t block, int64_t group_begin, int64_t group_end, uint8_t* high,
                           uint8_t* low) {
  const __m512i nibble = _mm512_set1_epi8(0x0F), low_byte = _mm512_set1_epi16(0x00FF);
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16)));
  for (int64_t g = group_begin; g < group_end; ++g) {
    const int8_t* scales = w.sub_scale + (block * w.groups() + g) * (w.halves ? 2 : 1) * kLanes;
    __m512i scale_words[2];  // each output's sub-scale in both words of its lane (iq4h: the first half's, the second's)
    for (int half = 0; half < 2; ++half) {
      const __m512i scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + (w.halves ? half * kLanes : 0))));
      scale_words[half] = _mm512_or_si512(_mm512_and_si512(scale, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(scale, 16));
    }
    const uint8_t* packed = w.codes + (block * w.groups() + g) * 256;
    const int64_t tile = (g - group_begin) / 2, half = (g - group_begin) % 2;
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(packed + j * 64);
      for (int nib = 0; nib < 2; ++nib) {
        const __m512i values = _mm512_shuffle_epi8(table, _mm512_and_si512(nib == 0 ? v : _mm512_srli_epi16(v, 4), nibble));
        const __m512i even = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(values, 8), 8), scale_words[nib]);
        const __m512i odd = _mm512_mullo_epi16(_mm512_srai_epi16(values, 8), scale_words[nib]);
        const int64_t at = (tile * 16 + half * 8 + nib * 4 + j) * 64;
        _mm512_store_si512(high + at, _mm512_or_si512(_mm512_and_si512(_mm512_srai_epi16(even, 8), low_byte),
                                                      _mm512_slli_epi16(_mm512_srai_epi16(odd, 8), 8)));
        _mm512_store_si512(low + at, _mm512_or_si512(_mm512_and_si512(even, low_byte), _mm512_slli_epi16(odd, 8)));
      }
    }
  }
}

// One or two (Pair) tiles of `rows` rows, n-block `block`, superblocks [s_begin, s_end) whose halves start at
// high/low (tiles as q4_configure_tiles sets them): per superblock, out = fma(d, float(256 * high + low), out), out
// starting at 0 with the first superblock.
template <bool Pair>
inline void iq4_amx_tiles(const Iq4Weights& w, const int8_t* x, int64_t rows, int64_t block, int64_t s_begin,
                          int64_t s_end, const uint8_t* high, const uint8_t* low, float* out, int64_t out_stride) {
  alignas(64) int32_t sums[4][16 * 16];
  const int64_t groups = w.groups(), supers = w.supers();
  for (int64_t s = s_begin; s < s_end; ++s) {
    superblock_products<Pair, true>(x, w.k, groups, s, s_begin, high, low, sums);
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + s) * kLanes);
    for (int t = 0; t < (Pair ? 2 : 1); ++t)
      for (int64_t r = 0; r < rows; ++r) {
        float* o = out + (16 * t + r) * out_stride + block * kLanes;
        const __m512i total = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[2 * t] + r * 16), 8),
                                               _mm512_load_si512(sums[2 * t + 1] + r * 16));
        _mm512_storeu_ps(o, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(total), s == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o)));
      }
  }
}

// Every row of n-blocks [block_begin, block_end) on tiles (superblock_amx). False when AMX cannot run here, the rows
// are too few or K is not a multiple of 64 (the caller takes the vector path).
inline bool iq4_amx(const Iq4Weights& w, const int8_t* x, int64_t rows, float* out, int64_t out_stride,
                    int64_t block_begin, int64_t block_end) {
  if (rows < kIq4AmxMinRows || w.k % 64 != 0 || !amx_granted()) return false;
  superblock_amx(
      rows, w.groups(), block_begin, block_end,
      [&](int64_t block, int64_t group_begin, int64_t group_end, uint8_t* high, uint8_t* low) {
        iq4_amx_halves(w, block, group_begin, group_end, high, low);
      },
      [&](auto pair, int64_t row, int64_t tile_rows, int64_t block, int64_t s0, int64_t s1, const uint8_t* high,
          const uint8_t* low) {
        iq4_amx_tiles<decltype(pair)::value>(w, x + row * w.k, tile_rows, block, s0, s1, high, low,
                                             out + row * out_stride, out_stride);
      });
  return true;
}

#endif

// offsets [rows, sub_blocks] from group_offsets (iq4) or half_group_offsets (iq4h), read by the VNNI path only.
inline void iq4_gemm(const Iq4Weights& w, const int8_t* x, int64_t rows, const int32_t* offsets, float* out,
                     int64_t out_stride, int64_t block_begin, int64_t block_end) {
  const int64_t offset_stride = w.sub_blocks();
#if defined(QD_AMX)
  if (iq4_amx(w, x, rows, out, out_stride, block_begin, block_end)) return;
#endif
  with_flag(w.halves, [&](auto halves) {
    for_each_block_tile<kIq4Rows>(rows, w.k, block_begin, block_end, [&](int64_t block, int64_t row, auto tile_rows) {
      iq4_tile<decltype(tile_rows)::value, decltype(halves)::value>(w, x + row * w.k, w.k, offsets + row * offset_stride,
                                                                    offset_stride, block, out + row * out_stride,
                                                                    out_stride);
    });
  });
}

}  // namespace qd
