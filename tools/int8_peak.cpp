// What bounds a forward on this machine: how fast can it read memory (a 1-token step streams every weight) and
// multiply-accumulate int8 (a k-token verify block)? Reads 1 GiB with 256-bit loads, then runs each int8
// instruction sequence the native GEMMs (quickdraft/runtime/native/gemm.h) can use from registers, with no memory
// traffic (an upper bound): AVX2's vpmaddubsw + vpmaddwd + vpaddd (no VNNI), AVX-512 VNNI's vpdpbusd, and AMX's
// tdpbusd where the processor and the OS allow them; an fp32 FMA loop beside. 1 and 2 threads each.
//   g++ -O2 -march=native -pthread tools/int8_peak.cpp -o /tmp/int8_peak && /tmp/int8_peak
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

static const long ITERS = 200000000 / 8;
static int sink;

// Every loop: 8 independent accumulators (no chain waits on another), an input opaque to the compiler each
// iteration (asm volatile) so nothing is hoisted, distinct operands so no product is computed once for all.
void avx2_loop() {
  __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i b[8], acc[8];
  for (int i = 0; i < 8; i++) b[i] = _mm256_set1_epi8(static_cast<char>(i + 1)), acc[i] = _mm256_setzero_si256();
  for (long it = 0; it < ITERS; it++) {
    asm volatile("" : "+x"(a));
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b[i]), ones));
  }
  for (int i = 0; i < 8; i++) sink += _mm256_extract_epi32(acc[i], 0);
}

#if defined(__AVX512VNNI__)
void vnni_loop() {
  __m512i a = _mm512_set1_epi8(3);
  __m512i b[8], acc[8];
  for (int i = 0; i < 8; i++) b[i] = _mm512_set1_epi8(static_cast<char>(i + 1)), acc[i] = _mm512_setzero_si512();
  for (long it = 0; it < ITERS; it++) {
    asm volatile("" : "+v"(a));
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b[i]);
  }
  for (int i = 0; i < 8; i++) sink += _mm_cvtsi128_si32(_mm512_castsi512_si128(acc[i]));
}
#endif

#if defined(__AMX_INT8__)
struct TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static const long AMX_ITERS = ITERS / 16;
void amx_loop() {  // 4 accumulator tiles, 16 x 16 int32 each, 16 x 64 bytes from two operand tiles
  TileConfig config;
  for (int t = 0; t < 6; t++) config.rows[t] = 16, config.colsb[t] = 64;
  _tile_loadconfig(&config);
  alignas(64) static thread_local int8_t data[16 * 64];
  std::memset(data, 1, sizeof data);
  _tile_loadd(4, data, 64);
  _tile_loadd(5, data, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long it = 0; it < AMX_ITERS; it++) {
    _tile_dpbusd(0, 4, 5);
    _tile_dpbusd(1, 5, 4);
    _tile_dpbusd(2, 4, 5);
    _tile_dpbusd(3, 5, 4);
  }
  alignas(64) int32_t c[256];
  _tile_stored(0, c, 64);
  sink += c[0];
  _tile_release();
}
#endif

void fma_loop() {
  __m256 a = _mm256_set1_ps(1.0001f);
  __m256 b[10], acc[10];
  for (int i = 0; i < 10; i++) b[i] = _mm256_set1_ps(0.9999f - 0.0001f * i), acc[i] = _mm256_setzero_ps();
  for (long it = 0; it < ITERS; it++) {
    asm volatile("" : "+x"(a));
#pragma GCC unroll 10
    for (int i = 0; i < 10; i++) acc[i] = _mm256_fmadd_ps(a, b[i], acc[i]);
  }
  float s = 0;
  for (int i = 0; i < 10; i++) s += acc[i][0];
  sink += static_cast<int>(s);
}

static const size_t READ_BYTES = size_t{1} << 30;
static char* memory;
static int reader_count;
void read_loop_part(int part) {
  const size_t share = READ_BYTES / reader_count;
  __m256i acc = _mm256_setzero_si256();
  for (size_t i = part * share; i < (part + 1) * share; i += 128) {
    acc = _mm256_xor_si256(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(memory + i)));
    acc = _mm256_xor_si256(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(memory + i + 32)));
    acc = _mm256_xor_si256(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(memory + i + 64)));
    acc = _mm256_xor_si256(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(memory + i + 96)));
  }
  sink += _mm256_extract_epi32(acc, 0);
}

double read_memory(int threads) {  // fastest of 5 passes over 1 GiB, split between the threads
  reader_count = threads;
  double best = 1e9;
  for (int pass = 0; pass < 5; pass++) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; i++) ts.emplace_back(read_loop_part, i);
    for (auto& t : ts) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = seconds < best ? seconds : best;
  }
  return READ_BYTES / best / 1e9;
}

double run(void (*f)(), int threads) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) ts.emplace_back(f);
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  memory = static_cast<char*>(std::aligned_alloc(64, READ_BYTES));
  std::memset(memory, 1, READ_BYTES);
  for (int threads : {1, 2}) printf("memory read:            %d thread(s): %6.1f GB/s\n", threads, read_memory(threads));
  std::free(memory);
  for (int threads : {1, 2}) {
    printf("int8 AVX2 maddubs+madd: %d thread(s): %6.1f GMAC/s\n", threads,
           threads * ITERS * 8.0 * 32 / run(avx2_loop, threads) / 1e9);
#if defined(__AVX512VNNI__)
    printf("int8 AVX-512 vpdpbusd:  %d thread(s): %6.1f GMAC/s\n", threads,
           threads * ITERS * 8.0 * 64 / run(vnni_loop, threads) / 1e9);
#endif
#if defined(__AMX_INT8__)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0)
      printf("int8 AMX tdpbusd:       %d thread(s): %6.1f GMAC/s\n", threads,
             threads * AMX_ITERS * 4.0 * 16 * 16 * 64 / run(amx_loop, threads) / 1e9);
#endif
    printf("fp32 AVX2 fma:          %d thread(s): %6.1f GMAC/s\n", threads,
           threads * ITERS * 10.0 * 8 / run(fma_loop, threads) / 1e9);
  }
}
