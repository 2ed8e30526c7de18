// The machine's ceiling for the native runtime's GEMM: multiply-accumulates per second of AVX2's
// int8 sequence (vpmaddubsw + vpmaddwd + vpaddd, fbgemm's inner loop without VNNI) from registers,
// on 1 and 2 threads; an fp32 FMA loop for comparison. No memory traffic: an upper bound.
//   g++ -O2 -mavx2 -mfma -pthread tools/int8_peak.cpp -o /tmp/int8_peak && /tmp/int8_peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
static const long ITERS = 200000000 / 8;
static int sink;
void int8_loop() {
  __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i b[8], acc[8];
  for (int i = 0; i < 8; i++) b[i] = _mm256_set1_epi8(static_cast<char>(i + 1)), acc[i] = _mm256_setzero_si256();
  for (long it = 0; it < ITERS; it++) {
    // a is opaque to the compiler each iteration but depends on nothing: the 8 products (distinct b's,
    // so none is shared) cannot be hoisted, and the only dependency chains are the 8 accumulators.
    // (Earlier versions fed acc[0] back into a and used one b: the 8 products were computed once
    // and each iteration waited for the previous one, so neither the count nor the time was right.)
    asm volatile("" : "+x"(a));
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      __m256i pairs = _mm256_maddubs_epi16(a, b[i]);  // 32 u8*s8 products -> 16 s16
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
    }
  }
  int s = 0; for (int i = 0; i < 8; i++) s += _mm256_extract_epi32(acc[i], 0);
  sink += s;
}
void fma_loop() {
  __m256 a = _mm256_set1_ps(1.0001f);
  __m256 b[10], acc[10];
  for (int i = 0; i < 10; i++) b[i] = _mm256_set1_ps(0.9999f - 0.0001f * i), acc[i] = _mm256_setzero_ps();
  for (long it = 0; it < ITERS; it++) {
    asm volatile("" : "+x"(a));
#pragma GCC unroll 10
    for (int i = 0; i < 10; i++) acc[i] = _mm256_fmadd_ps(a, b[i], acc[i]);
  }
  float s = 0; for (int i = 0; i < 10; i++) s += acc[i][0];
  sink += (int)s;
}
double run(void (*f)(), int threads) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) ts.emplace_back(f);
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main() {
  for (int threads : {1, 2}) {
    double s = run(int8_loop, threads);
    printf("int8 maddubs+madd: %d thread(s): %.1f GMAC/s\n", threads, threads * ITERS * 8.0 * 32 / s / 1e9);
    s = run(fma_loop, threads);
    printf("fp32 fma:          %d thread(s): %.1f GMAC/s\n", threads, threads * ITERS * 10.0 * 8 / s / 1e9);
  }
}
