// The int8 format's GEMM on AMX tiles (Intel's tile matrix multiply, Sapphire Rapids and later), for blocks of
// several rows: the same exact int32 sums as gemm.h's vector paths and the same float epilogue, so the same bits.
// The packed int8 weights already have the layout of an AMX B tile: 16 rows of (16 outputs x 4 consecutive k).
// The OS must grant the process AMX's tile state once (arch_prctl); where it does not, gemm.h's vector path runs.
#pragma once

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__)
#define QD_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>

namespace qd {

constexpr int64_t kAmxMinRows = 4;  // fewer rows: the vector path is as fast (a tile multiply costs the same)

struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

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
  _tile_loadconfig(&config);
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

}  // namespace qd
#endif
