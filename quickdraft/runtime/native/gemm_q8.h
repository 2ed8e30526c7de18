// The integer GEMM against weights in llama.cpp's Q8_0 structure, kept as the file stores them (gemm.h's rules:
// every output element depends on its own row and column alone, with the same bits on every instruction set).
// A Q5_0 block is the same structure with smaller codes, so it uses it too; Q5_1 adds a float16 min per group
// (format "q8m"). Q4_0, IQ4_NL and Q4_1 keep their 4-bit codes (formats "q4t" and "q4tm", below).
//
// Format "q8" (8-bit codes in groups of 32 along k, each group with a float16 scale):
//   w[n][k] = d[n][g] * q[n][k]   for k in group g = k / 32; q in [-128, 127].
//   out[m][n] = over the groups g in order, acc = fma(float(d[n][g]), float(I[m][n][g]), acc) from acc = 0
//   (q8_reference below), where I = sum_{k in g} q * x is an exact integer, exact as a float too
//   (|I| <= 32 * 128 * 127 < 2^24).
//   codes: q + 128 as unsigned bytes, [N/16][G][8 vectors][16 lanes][4 bytes]: vector j of group g holds
//   k = 32g + 4j + i of lane n0 + l (byte i) — int8's layout, with q + 128 for w + 64; d: [N/16][G][16] float16
//   bits. K must be a multiple of 32.
// Format "q8m": q8 with a float16 min per group, w[n][k] = d[n][g] * q[n][k] + m[n][g]; after each group's
//   d term, acc = fma(float(m[n][g]), float(X[m][g]), acc), X the group's sum of x (exact: |X| <= 32 * 127).
//   mins: [N/16][G][16] float16 bits, as d.
// Formats "q4t" and "q4tm": q8 and q8m whose codes are 4-bit indices into a table of 16 int8 values,
//   q[n][k] = table[code[n][k]]; the same sums. A GGUF file's Q4_0 (table -8..7), IQ4_NL (kvalues_iq4nl) and Q4_1
//   (0..15, with mins) tensors load into them exactly, at 4.5 and 5 bits a weight instead of 8.5 and 9.
//   codes: q4's layout and nibbles ([N/16][G][4][16][4]: the low nibble of vector j's byte (l, i) is q8's vector j,
//   k = 32g + 4j + i of lane n0 + l; the high nibble q8's vector j + 4); table: [N/16][16] int8, a panel's values.
#pragma once

#include <vector>

#include "gemm.h"

namespace qd {

constexpr int32_t kQ8Offset = kByteOffset;  // q8: codes hold q + 128 (group_offsets: where a group's sum starts)

struct Q8Weights {
  const uint8_t* codes;  // [N/16][G][8][16][4]
  const uint16_t* d;     // [N/16][G][16] float16 bits
  int64_t n, k;
  const uint16_t* mins = nullptr;  // q8m: [N/16][G][16] float16 bits; null for q8
  const int8_t* table = nullptr;   // q4t/q4tm: [N/16][16], the values each panel's 4-bit codes index; null: 8-bit codes
  int64_t groups() const { return k / kGroup; }
  int64_t group_bytes() const { return table == nullptr ? 512 : 256; }  // a 16-lane group's codes
};

// A float16's value as a float (exact: every float16 is a float).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, 4);
  bits |= sign;
  std::memcpy(&magnitude, &bits, 4);
  return magnitude;
}

// ---- the definition, one element at a time (the oracle of the tests; also the path without AVX2) ------------

inline int32_t q8_code(const Q8Weights& w, int64_t n, int64_t k) {
  const int64_t g = k / kGroup, j = (k % kGroup) / 4, i = k % 4;
  if (w.table != nullptr) {  // vector j's code in nibble j / 4 of vector j % 4's byte
    const uint8_t byte = w.codes[(((n / kLanes) * w.groups() + g) * 4 + j % 4) * 64 + (n % kLanes) * 4 + i];
    return w.table[(n / kLanes) * 16 + (j < 4 ? byte & 0x0F : byte >> 4)];
  }
  return static_cast<int32_t>(w.codes[(((n / kLanes) * w.groups() + g) * 8 + j) * 64 + (n % kLanes) * 4 + i]) - kQ8Offset;
}

inline float q8_reference(const Q8Weights& w, const int8_t* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t g = 0; g < w.groups(); ++g) {
    int32_t dot = 0;
    for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) dot += q8_code(w, n, k) * x[k];
    const int64_t at = ((n / kLanes) * w.groups() + g) * kLanes + n % kLanes;
    acc = std::fma(half_to_float(w.d[at]), static_cast<float>(dot), acc);
    if (w.mins != nullptr) acc = std::fma(half_to_float(w.mins[at]), static_cast<float>(row_sum(x + g * kGroup, kGroup)), acc);
  }
  return acc;
}

// ---- the fast paths: out[m][n] for rows [0, m) and the n-blocks [block_begin, block_end) ---------------------
//
// A group's 8 code vectors stay in registers while the tile's rows take turns on them. With VNNI a group's sum
// starts from the row's -128 * X offset and multiplies the unsigned codes; AVX2 without VNNI multiplies |q| by x
// carrying q's sign (pairs of products at most 2 * 128 * 127 = 32512 in size: exact in int16; x = -128, outside
// the activations' range, would not survive the sign). Without F16C the AVX2 build runs the plain definition. The sum goes into
// the row's float sum with one fused multiply-add by the group's scale. 4-bit codes (q4t) become q8's code vectors
// by one byte shuffle of the table per vector (q + 128 on the way: the table is stored XOR 0x80), as iq4's do.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

template <int R, bool Min, bool Nibbles>
inline void q8_tile(const Q8Weights& w, const int8_t* x, int64_t x_stride, const int32_t* offsets,
                    int64_t offset_stride, int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512i table = _mm512_setzero_si512();
  if constexpr (Nibbles)
    table = _mm512_xor_si512(
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16))),
        _mm512_set1_epi8(-128));
  __m512 acc[R];
  QD_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* codes = w.codes + (block * groups + g) * w.group_bytes();
    __m512i c[8];
    if constexpr (Nibbles) {
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        prefetch(codes + j * 64);
        const __m512i bytes = _mm512_loadu_si512(codes + j * 64);
        c[j] = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles));
        c[j + 4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles));
      }
    } else {
      QD_UNROLL for (int j = 0; j < 8; ++j) {
        prefetch(codes + j * 64);
        c[j] = _mm512_loadu_si512(codes + j * 64);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + (block * groups + g) * kLanes)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (Min) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.mins + (block * groups + g) * kLanes)));
    QD_UNROLL for (int r = 0; r < R; ++r) {
      const __m512i dot = group_dot(_mm512_set1_epi32(offsets[r * offset_stride + g]), c, x + r * x_stride + g * kGroup);
      acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc[r]);
      if constexpr (Min) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(offsets[r * offset_stride + g] / -128.0f), acc[r]);
    }
  }
  QD_UNROLL for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * out_stride + block * kLanes, acc[r]);
}

constexpr int kQ8Rows = 16;

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#if defined(__AVXVNNI__)
constexpr bool kQ8Offsets = true;
inline __m256i q8_dot(__m256i acc, __m256i codes, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, codes, x); }
#else
constexpr bool kQ8Offsets = false;
inline __m256i q8_dot(__m256i acc, __m256i codes, __m256i x) {
  const __m256i q = _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

// Two halves of 8 lanes each, as q4's (HalfSums keeps the rows' float sums).
template <int R, bool Min, bool Nibbles>
inline void q8_tile(const Q8Weights& w, const int8_t* x, int64_t x_stride, const int32_t* offsets,
                    int64_t offset_stride, int64_t block, float* out, int64_t out_stride) {
  const int64_t groups = w.groups();
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  __m256i table = _mm256_setzero_si256();
  if constexpr (Nibbles)
    table = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16))),
        _mm256_set1_epi8(static_cast<char>(0x80)));
  for (int h = 0; h < 2; ++h) {
    HalfSums<R> sums(out + block * kLanes + 8 * h, out_stride);
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* codes = w.codes + (block * groups + g) * w.group_bytes() + 32 * h;
      __m256i c[8];
      if constexpr (Nibbles) {
        QD_UNROLL for (int j = 0; j < 4; ++j) {
          if (h == 0) prefetch(codes + j * 64);
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * 64));
          c[j] = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, low_nibbles));
          c[j + 4] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibbles));
        }
      } else {
        QD_UNROLL for (int j = 0; j < 8; ++j) {
          if (h == 0) prefetch(codes + j * 64);
          c[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * 64));
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + (block * groups + g) * kLanes + 8 * h)));
      __m256 m = _mm256_setzero_ps();
      if constexpr (Min) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + (block * groups + g) * kLanes + 8 * h)));
      QD_UNROLL for (int r = 0; r < R; ++r) {
        const int8_t* row = x + r * x_stride + g * kGroup;
        __m256i dot = _mm256_set1_epi32(kQ8Offsets ? offsets[r * offset_stride + g] : 0);
        QD_UNROLL for (int j = 0; j < 8; ++j) dot = q8_dot(dot, c[j], _mm256_set1_epi32(load4(row + 4 * j)));
        sums.add(r, d, dot);
        if constexpr (Min) sums.add(r, m, _mm256_set1_epi32(offsets[r * offset_stride + g] / -kQ8Offset));
      }
    }
    sums.finish();
  }
}

constexpr int kQ8Rows = 8;

#else

template <int R, bool Min, bool Nibbles>
inline void q8_tile(const Q8Weights& w, const int8_t* x, int64_t x_stride, const int32_t*, int64_t, int64_t block,
                    float* out, int64_t out_stride) {
  reference_tile<R>([&](const int8_t* row, int64_t n) { return q8_reference(w, row, n); }, x, x_stride, block, out,
                    out_stride);
}

constexpr int kQ8Rows = 1;
#endif

#if defined(QD_AMX)

// AMX (gemm_amx.h), for many rows (a prompt): a group's exact I for a tile of 16 rows and an n-block's 16 outputs is
// one tile product of the rows' 32 bytes of x with the group's signed codes q, whose layout is already an AMX B tile's
// ([8 vectors][16 lanes][4 bytes]). An n-block's codes for a range of groups are written signed once (q8: the codes
// XOR 0x80; q4t: the table's values by one shuffle) and serve all its row tiles. Each group's I goes into the row's
// float sum (and q8m's min term after it) as in the definition, so the bits are the vector path's. Rows past the last
// multiple of 16 go into one more tile, copied and padded with zero rows, whose extra rows are computed and dropped.

constexpr int64_t kQ8AmxMinRows = 48;             // fewer rows: the vector path is as fast
constexpr int64_t kQ8AmxRangeBytes = 512 * 1024;  // the rows' bytes of one range of groups, kept in L2
constexpr int64_t kQ8AmxMaxRange = 128;           // groups a range holds at most (their signed codes: 64 KiB)

// n-block `block`'s signed codes of groups [group_begin, group_end), 512 bytes (one B tile) a group.
template <bool Nibbles>
inline void q8_amx_codes(const Q8Weights& w, int64_t block, int64_t group_begin, int64_t group_end, int8_t* tiles) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512i table = _mm512_setzero_si512();
  if constexpr (Nibbles) table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.table + block * 16)));
  for (int64_t g = group_begin; g < group_end; ++g) {
    const uint8_t* codes = w.codes + (block * w.groups() + g) * w.group_bytes();
    int8_t* tile = tiles + (g - group_begin) * 512;
    if constexpr (Nibbles) {
      QD_UNROLL for (int j = 0; j < 4; ++j) {
        const __m512i bytes = _mm512_loadu_si512(codes + j * 64);
        _mm512_store_si512(tile + j * 64, _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles)));
        _mm512_store_si512(tile + (j + 4) * 64,
                           _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles)));
      }
    } else {
      QD_UNROLL for (int j = 0; j < 8; ++j)
        _mm512_store_si512(tile + j * 64, _mm512_xor_si512(_mm512_loadu_si512(codes + j * 64), _mm512_set1_epi8(-128)));
    }
  }
}

// Tiles: 0, 1 two groups' I (16 rows x 16 int32), 2, 3 their rows' x (16 rows x 32 bytes), 4, 5 their codes.
inline void q8_configure_tiles() {
  TileConfig config;
  for (int t : {0, 1}) config.rows[t] = 16, config.colsb[t] = 64;
  for (int t : {2, 3}) config.rows[t] = 16, config.colsb[t] = 32;
  for (int t : {4, 5}) config.rows[t] = 8, config.colsb[t] = 64;
  load_tile_config(config);
}

// A tile of 16 rows (the first `rows` of them kept) for n-block `block`, groups [group_begin, group_end) whose signed
// codes start at `tiles`, two groups at a time, continuing the float sums in `out` unless the range starts at group 0.
template <bool Min>
inline void q8_amx_tile(const Q8Weights& w, const int8_t* x, const int32_t* offsets, int64_t block,
                        int64_t group_begin, int64_t group_end, const int8_t* tiles, float* out, int64_t out_stride,
                        int64_t rows) {
  alignas(64) int32_t dots[2][16 * 16];
  const int64_t groups = w.groups();
  __m512 acc[16];
  QD_UNROLL for (int r = 0; r < 16; ++r)
    acc[r] = group_begin > 0 && r < rows ? _mm512_loadu_ps(out + r * out_stride + block * kLanes) : _mm512_setzero_ps();
  for (int64_t g = group_begin; g < group_end; g += 2) {
    const bool pair = g + 1 < group_end;
    _tile_zero(0);
    _tile_loadd(2, x + g * kGroup, w.k);
    _tile_loadd(4, tiles + (g - group_begin) * 512, 64);
    _tile_dpbssd(0, 2, 4);
    if (pair) {
      _tile_zero(1);
      _tile_loadd(3, x + (g + 1) * kGroup, w.k);
      _tile_loadd(5, tiles + (g + 1 - group_begin) * 512, 64);
      _tile_dpbssd(1, 3, 5);
    }
    _tile_stored(0, dots[0], 64);
    if (pair) _tile_stored(1, dots[1], 64);
    for (int h = 0; h < (pair ? 2 : 1); ++h) {
      const int64_t at = (block * groups + g + h) * kLanes;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + at)));
      __m512 m = _mm512_setzero_ps();
      if constexpr (Min) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.mins + at)));
      QD_UNROLL for (int r = 0; r < 16; ++r) {
        acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_load_si512(dots[h] + r * 16)), acc[r]);
        if constexpr (Min) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(offsets[r * groups + g + h] / -128.0f), acc[r]);
      }
    }
  }
  QD_UNROLL for (int r = 0; r < 16; ++r)
    if (r < rows) _mm512_storeu_ps(out + r * out_stride + block * kLanes, acc[r]);
}

// Every row of n-blocks [block_begin, block_end): ranges of groups whose rows fit kQ8AmxRangeBytes, and within a range
// each n-block's signed codes once, then its row tiles. False when AMX cannot run here or the rows are too few (the
// caller takes the vector path).
inline bool q8_amx(const Q8Weights& w, const int8_t* x, int64_t rows, const int32_t* offsets, float* out,
                   int64_t out_stride, int64_t block_begin, int64_t block_end) {
  if (rows < kQ8AmxMinRows || !amx_granted()) return false;
  alignas(64) static thread_local int8_t tiles[kQ8AmxMaxRange * 512];
  static thread_local std::vector<int8_t> last_x;  // the rows past the last multiple of 16, padded to 16
  static thread_local std::vector<int32_t> last_offsets;
  const int64_t groups = w.groups(), full = rows / 16 * 16, last = rows - full;
  if (last > 0) {
    last_x.assign(16 * w.k, 0);
    std::memcpy(last_x.data(), x + full * w.k, last * w.k);
    last_offsets.assign(16 * groups, 0);
    std::memcpy(last_offsets.data(), offsets + full * groups, last * groups * sizeof(int32_t));
  }
  const int64_t fit = kQ8AmxRangeBytes / (rows * kGroup);
  const int64_t range = fit < 1 ? 1 : (fit > kQ8AmxMaxRange ? kQ8AmxMaxRange : fit);
  q8_configure_tiles();
  with_flag(w.mins != nullptr, [&](auto with_min) {
    with_flag(w.table != nullptr, [&](auto nibbles) {
      constexpr bool kMin = decltype(with_min)::value;
      for (int64_t g0 = 0; g0 < groups; g0 += range) {
        const int64_t g1 = g0 + range < groups ? g0 + range : groups;
        for (int64_t block = block_begin; block < block_end; ++block) {
          q8_amx_codes<decltype(nibbles)::value>(w, block, g0, g1, tiles);
          for (int64_t r = 0; r < full; r += 16)
            q8_amx_tile<kMin>(w, x + r * w.k, offsets + r * groups, block, g0, g1, tiles, out + r * out_stride,
                              out_stride, 16);
          if (last > 0)
            q8_amx_tile<kMin>(w, last_x.data(), last_offsets.data(), block, g0, g1, tiles,
                              out + full * out_stride, out_stride, last);
        }
      }
    });
  });
  _tile_release();
  return true;
}

#endif

// offsets [rows, K/32] from group_offsets (q8m's min term reads each group's sum of x from them too).
inline void q8_gemm(const Q8Weights& w, const int8_t* x, int64_t rows, const int32_t* offsets, float* out,
                    int64_t out_stride, int64_t block_begin, int64_t block_end) {
  const int64_t offset_stride = w.k / kGroup;
#if defined(QD_AMX)
  if (q8_amx(w, x, rows, offsets, out, out_stride, block_begin, block_end)) return;
#endif
  with_flag(w.mins != nullptr, [&](auto with_min) {
    with_flag(w.table != nullptr, [&](auto nibbles) {
      for_each_block_tile<kQ8Rows>(rows, w.k, block_begin, block_end, [&](int64_t block, int64_t row, auto tile_rows) {
        q8_tile<decltype(tile_rows)::value, decltype(with_min)::value, decltype(nibbles)::value>(
            w, x + row * w.k, w.k, offsets + row * offset_stride, offset_stride, block, out + row * out_stride,
            out_stride);
      });
    });
  });
}

}  // namespace qd
