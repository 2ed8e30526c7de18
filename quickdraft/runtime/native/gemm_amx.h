// gemm.h's GEMMs on AMX tiles (Intel's tile matrix multiply, Sapphire Rapids and later), for blocks of several
// rows: the same exact int32 sums as gemm.h's vector paths and the same float epilogue, so the same bits.
// - int8: the packed weights already have the layout of an AMX B tile: 16 rows of (16 outputs x 4 consecutive k).
// - q4 and q5, for many rows (a prompt): a superblock's exact total sum_g sub_scale[g] * sum_{k in g} code * x is one
//   integer product of x with w' = sub_scale * code (< 2^12 for q4, 2^13 for q5's codes up to 31), which goes on
//   tiles as two unsigned byte products, w' = 64 * high + low: an n-block's w' halves are written once per range of
//   superblocks and serve all its rows.
// The OS must grant the process AMX's tile state once (arch_prctl); where it does not, gemm.h's vector path runs.
// Included by gemm.h after its weight formats (Q4Weights, kLanes, ...), which the q4 path reads.
#pragma once

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define QD_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace qd {

constexpr int64_t kAmxMinRows = 4;  // fewer rows: the vector path is as fast (a tile multiply costs the same)

struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads `config` into the tile registers. GCC's _tile_loadconfig (12) tells the compiler that it reads only the
// config's first 8 bytes, so an optimizer may drop the stores of the rows and widths as dead and ldtilecfg fault on
// what is left (seen in an -O3 build); the barrier keeps them.
inline void load_tile_config(const TileConfig& config) {
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

inline bool amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

// Tiles: 0, 1 accumulate two n-blocks (rows x 16 int32), 2 holds rows x 64 activation bytes, 3, 4 the two
// n-blocks' weights for those 64 k. One A tile load serves two blocks.
inline void configure_tiles(int64_t rows) {
  TileConfig config;
  for (int t : {0, 1, 2}) config.rows[t] = static_cast<uint8_t>(rows), config.colsb[t] = 64;
  for (int t : {3, 4}) config.rows[t] = 16, config.colsb[t] = 64;
  load_tile_config(config);
}

// One or two n-blocks (block, block + 1 if pair) for `rows` rows (at most 16; tiles configured for them):
// out = float(sum x·(w + 64) − 64·sum x)·scale.
inline void int8_amx_tile(const uint8_t* codes, const float* scale, int64_t k, const int8_t* x, int64_t rows,
                          const int32_t* sums, float* out, int64_t out_stride, int64_t block, bool pair) {
  alignas(64) int32_t c[16 * 16];
  const int64_t block_bytes = (k / 4) * 64;
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t q = 0; q < k / 64; ++q) {
    _tile_loadd(2, x + q * 64, k);
    _tile_loadd(3, codes + block * block_bytes + q * 1024, 64);
    _tile_dpbsud(0, 2, 3);
    if (pair) {
      _tile_loadd(4, codes + (block + 1) * block_bytes + q * 1024, 64);
      _tile_dpbsud(1, 2, 4);
    }
  }
  for (int half = 0; half < (pair ? 2 : 1); ++half) {
    if (half == 0) _tile_stored(0, c, 64);
    else _tile_stored(1, c, 64);
    const __m512 lane_scale = _mm512_loadu_ps(scale + (block + half) * 16);
    for (int64_t r = 0; r < rows; ++r) {
      const __m512i exact = _mm512_sub_epi32(_mm512_load_si512(c + r * 16), _mm512_set1_epi32(64 * sums[r]));
      _mm512_storeu_ps(out + r * out_stride + (block + half) * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(exact), lane_scale));
    }
  }
}

// Every row of n-blocks [block_begin, block_end), two blocks (one A tile) at a time and, within them, 16 rows at a
// time (a block's weights stay in cache across the rows); false when AMX cannot run here (the caller takes the
// vector path). Full 16-row tiles first, then the rest, so the tiles are configured twice at most.
inline bool int8_amx(const uint8_t* codes, const float* scale, int64_t k, const int8_t* x, int64_t rows,
                     const int32_t* sums, float* out, int64_t out_stride, int64_t block_begin, int64_t block_end) {
  if (rows < kAmxMinRows || k % 64 != 0 || !amx_granted()) return false;
  const int64_t full = rows / 16 * 16;
  for (const int64_t count : {int64_t{16}, rows - full}) {
    const int64_t first = count == 16 ? 0 : full, last = count == 16 ? full : rows;
    if (first == last) continue;
    configure_tiles(count);
    for (int64_t block = block_begin; block < block_end; block += 2)
      for (int64_t r = first; r < last; r += count)
        int8_amx_tile(codes, scale, k, x + r * k, count, sums + r, out + r * out_stride, out_stride, block,
                      block + 1 < block_end);
  }
  _tile_release();
  return true;
}

// ---- q4 ----------------------------------------------------------------------------------------------------------

constexpr int64_t kQ4AmxMinRows = 48;  // fewer rows: the vector path is as fast (writing the w' halves costs)
constexpr int64_t kQ4AmxRangeBytes = 512 * 1024;  // the rows' bytes of one range of superblocks, kept in L2
constexpr int64_t kQ4AmxMaxRange = 16;    // superblocks a range holds at most (their w' halves: 128 KiB)

// The w' halves of n-block `block` for groups [group_begin, group_end) as B tiles, one per 64 k (two groups):
// [16 quads][16 outputs][4 bytes], quad q of the tile holding k = 64c + 4q .. 4q + 3. A group's code vector j holds
// k = 32g + 4j + i in its low nibbles and k = 32g + 4(j + 4) + i in its high ones (gemm.h); q5 adds code vector j's
// fifth bits, bit j of the plane's bytes, as bit 4 (the 16-bit shift carries bits across bytes, which the mask drops).
inline void q4_amx_halves(const Q4Weights& w, int64_t block, int64_t group_begin, int64_t group_end, uint8_t* high,
                          uint8_t* low) {
  const __m512i nibble = _mm512_set1_epi8(0x0F), even_bytes = _mm512_set1_epi16(0x00FF), six_bits = _mm512_set1_epi16(63);
  for (int64_t g = group_begin; g < group_end; ++g) {
    const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_scale + (block * w.groups() + g) * kLanes)));
    const __m512i scale_words = _mm512_or_si512(scale, _mm512_slli_epi32(scale, 16));  // each output's scale in both words
    const uint8_t* packed = w.codes + (block * w.groups() + g) * 256;
    const __m512i plane = w.high == nullptr ? _mm512_setzero_si512() : _mm512_loadu_si512(w.high + (block * w.groups() + g) * 64);
    const int64_t tile = (g - group_begin) / 2, half = (g - group_begin) % 2;
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(packed + j * 64);
      for (int nib = 0; nib < 2; ++nib) {
        __m512i codes = _mm512_and_si512(nib == 0 ? v : _mm512_srli_epi16(v, 4), nibble);
        if (w.high != nullptr) {
          const __m512i fifth = _mm512_srl_epi16(plane, _mm_cvtsi32_si128(j + 4 * nib));
          codes = _mm512_or_si512(codes, _mm512_slli_epi16(_mm512_and_si512(fifth, _mm512_set1_epi8(1)), 4));
        }
        const __m512i even = _mm512_mullo_epi16(_mm512_and_si512(codes, even_bytes), scale_words);  // w' < 2^13
        const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(codes, 8), scale_words);
        const int64_t at = (tile * 16 + half * 8 + nib * 4 + j) * 64;
        _mm512_store_si512(high + at, _mm512_or_si512(_mm512_srli_epi16(even, 6), _mm512_slli_epi16(_mm512_srli_epi16(odd, 6), 8)));
        _mm512_store_si512(low + at, _mm512_or_si512(_mm512_and_si512(even, six_bits), _mm512_slli_epi16(_mm512_and_si512(odd, six_bits), 8)));
      }
    }
  }
}

// Tiles: 0, 1 the high and low products of the first 16-row tile, 2, 3 the second's; 4, 5 their 64 k of x; 6, 7 the
// w' halves (16 quads x 64 bytes).
inline void q4_configure_tiles(int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 6; ++t) config.rows[t] = static_cast<uint8_t>(rows), config.colsb[t] = 64;
  for (int t : {6, 7}) config.rows[t] = 16, config.colsb[t] = 64;
  load_tile_config(config);
}

// Superblock s's high and low products for one or two (Pair) tiles of rows (tiles as q4_configure_tiles sets them):
// its 64-k chunks of x (row stride k, `groups` groups a row) against the w' halves of a range of superblocks from
// s_begin at high/low, stored into sums (0, 1 the first tile's high and low products, 2, 3 the second's). SignedHigh:
// the high bytes are signed (iq4's w' = 256 * high + low), else unsigned (q4's 64 * high + low); the low bytes are
// unsigned.
template <bool Pair, bool SignedHigh>
inline void superblock_products(const int8_t* x, int64_t k, int64_t groups, int64_t s, int64_t s_begin,
                                const uint8_t* high, const uint8_t* low, int32_t (&sums)[4][16 * 16]) {
  _tile_zero(0);
  _tile_zero(1);
  if (Pair) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t c = s * kGroupsPerSuper / 2; c < super_end(s, groups) / 2; ++c) {
    const int64_t at = (c - s_begin * kGroupsPerSuper / 2) * 1024;
    _tile_loadd(4, x + c * 64, k);
    _tile_loadd(6, high + at, 64);
    _tile_loadd(7, low + at, 64);
    if constexpr (SignedHigh) _tile_dpbssd(0, 4, 6);
    else _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    if (Pair) {
      _tile_loadd(5, x + 16 * k + c * 64, k);
      if constexpr (SignedHigh) _tile_dpbssd(2, 5, 6);
      else _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
  }
  _tile_stored(0, sums[0], 64);
  _tile_stored(1, sums[1], 64);
  if (Pair) {
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
  }
}

// Every row of n-blocks [block_begin, block_end) of a superblock format (q4, q5, iq4, iq4h) with `groups` groups a
// row: ranges of superblocks whose rows fit kQ4AmxRangeBytes, and within a range each n-block's w' halves once
// (write_halves(block, group_begin, group_end, high, low)), then its rows in pairs of 16-row tiles and a last shorter
// tile (tiles(pair, first_row, tile_rows, block, s_begin, s_end, high, low), pair a std::bool_constant). A range
// continues the float sums of the one before, superblock by superblock, so any range gives the same bits.
template <typename WriteHalves, typename Tiles>
inline void superblock_amx(int64_t rows, int64_t groups, int64_t block_begin, int64_t block_end,
                           WriteHalves write_halves, Tiles tiles) {
  alignas(64) static thread_local uint8_t high[kQ4AmxMaxRange * 4 * 1024], low[kQ4AmxMaxRange * 4 * 1024];
  const int64_t supers = (groups + kGroupsPerSuper - 1) / kGroupsPerSuper, full = rows / 16, tail = rows - full * 16;
  const int64_t fit = kQ4AmxRangeBytes / (rows * 256), range = fit < 1 ? 1 : (fit > kQ4AmxMaxRange ? kQ4AmxMaxRange : fit);
  int64_t configured = 0;
  const auto configure = [&](int64_t tile_rows) {
    if (configured != tile_rows) q4_configure_tiles(tile_rows), configured = tile_rows;
  };
  for (int64_t s0 = 0; s0 < supers; s0 += range) {
    const int64_t s1 = s0 + range < supers ? s0 + range : supers;
    for (int64_t block = block_begin; block < block_end; ++block) {
      write_halves(block, s0 * kGroupsPerSuper, super_end(s1 - 1, groups), high, low);
      configure(16);
      int64_t t = 0;
      for (; t + 2 <= full; t += 2) tiles(std::true_type{}, t * 16, int64_t{16}, block, s0, s1, high, low);
      if (t < full) tiles(std::false_type{}, t * 16, int64_t{16}, block, s0, s1, high, low);
      if (tail > 0) {
        configure(tail);
        tiles(std::false_type{}, full * 16, tail, block, s0, s1, high, low);
      }
    }
  }
  _tile_release();
}

// One or two (Pair) tiles of `rows` rows, n-block `block`, superblocks [s_begin, s_end) whose halves start at
// high/low: per superblock, out = fma(d, float(total), out), then out = fma(dmin, float(sum_g sub_min[g] * X[g]), out)
// (the sums of gemm.h's q4 tiles; out starts at 0 with the first superblock).
template <bool Pair>
inline void q4_amx_tiles(const Q4Weights& w, const int8_t* x, int64_t rows, const int32_t* pairs, int64_t pair_stride,
                         int64_t block, int64_t s_begin, int64_t s_end, const uint8_t* high, const uint8_t* low,
                         float* out, int64_t out_stride) {
  alignas(64) int32_t sums[4][16 * 16];
  const int64_t groups = w.groups(), supers = w.supers();
  for (int64_t s = s_begin; s < s_end; ++s) {
    const int64_t g0 = s * kGroupsPerSuper, g1 = super_end(s, groups);
    superblock_products<Pair, false>(x, w.k, groups, s, s_begin, high, low, sums);
    const __m512 d = _mm512_loadu_ps(w.d + (block * supers + s) * kLanes);
    const __m512 dmin = _mm512_loadu_ps(w.dmin + (block * supers + s) * kLanes);
    const int64_t pair_count = (g1 - g0) / 2;
    __m512i min_pairs[4];
    for (int p = 0; p < pair_count; ++p)
      min_pairs[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.sub_min + (block * groups + g0 + 2 * p) * kLanes)));
    for (int t = 0; t < (Pair ? 2 : 1); ++t)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = 16 * t + r;
        float* o = out + row * out_stride + block * kLanes;
        const __m512i total = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[2 * t] + r * 16), 6),
                                               _mm512_load_si512(sums[2 * t + 1] + r * 16));
        __m512 acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(total), s == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o));
        __m512i offset = _mm512_setzero_si512();
        for (int p = 0; p < pair_count; ++p)
          offset = _mm512_dpwssd_epi32(offset, min_pairs[p], _mm512_set1_epi32(pairs[row * pair_stride + g0 / 2 + p]));
        _mm512_storeu_ps(o, _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(offset), acc));
      }
  }
}

// Every row of n-blocks [block_begin, block_end) on tiles (superblock_amx). False when AMX cannot run here or the rows
// are too few (the caller takes the vector path).
inline bool q4_amx(const Q4Weights& w, const int8_t* x, int64_t rows, const int32_t* pairs, int64_t pair_stride,
                   float* out, int64_t out_stride, int64_t block_begin, int64_t block_end) {
  if (rows < kQ4AmxMinRows || !amx_granted()) return false;
  superblock_amx(
      rows, w.groups(), block_begin, block_end,
      [&](int64_t block, int64_t group_begin, int64_t group_end, uint8_t* high, uint8_t* low) {
        q4_amx_halves(w, block, group_begin, group_end, high, low);
      },
      [&](auto pair, int64_t row, int64_t tile_rows, int64_t block, int64_t s0, int64_t s1, const uint8_t* high,
          const uint8_t* low) {
        q4_amx_tiles<decltype(pair)::value>(w, x + row * w.k, tile_rows, pairs + row * pair_stride, pair_stride, block,
                                            s0, s1, high, low, out + row * out_stride, out_stride);
      });
  return true;
}

}  // namespace qd
#endif
