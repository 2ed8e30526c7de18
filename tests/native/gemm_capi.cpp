// A C entry point to quickdraft/runtime/native/gemm.h for the tests: they compile it once per instruction set
// the machine has (e.g. -mavx2 -mno-avx512f beside -march=native) and check that every build gives the bits of
// the element-by-element definitions.
#include "gemm.h"
#include "gemm_iq4.h"
#include "gemm_q2.h"
#include "gemm_q6.h"
#include "gemm_q8.h"

#include <vector>

namespace {

// q8, q8m, q4t and q4tm: the weights `w` against int8 rows `x`.
void q8_family_gemm(const qd::Q8Weights& w, const int8_t* x, int64_t rows, float* out, int which) {
  const int64_t n = w.n, k = w.k;
  std::vector<int32_t> offsets(rows * k / qd::kGroup);
  for (int64_t r = 0; r < rows; ++r) qd::group_offsets(x + r * k, k, offsets.data() + r * k / qd::kGroup);
  if (which == 0) return qd::q8_gemm(w, x, rows, offsets.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::q8_reference(w, x + r * k, j);
}

// iq4 and iq4h: the weights `w` against int8 rows `x`.
void iq4_family_gemm(const qd::Iq4Weights& w, const int8_t* x, int64_t rows, float* out, int which) {
  const int64_t k = w.k, stride = w.sub_blocks();
  std::vector<int32_t> offsets(rows * stride);
  for (int64_t r = 0; r < rows; ++r)
    (w.halves ? qd::half_group_offsets : qd::group_offsets)(x + r * k, k, offsets.data() + r * stride);
  if (which == 0) return qd::iq4_gemm(w, x, rows, offsets.data(), out, w.n, 0, w.n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w.n; ++j) out[r * w.n + j] = qd::iq4_reference(w, x + r * k, j);
}

}  // namespace

extern "C" {

const char* isa() { return qd::kIsa; }

// which: 0 the fast path, 1 the element-by-element definition.
void int8_gemm(const uint8_t* codes, const float* scale, int64_t n, int64_t k, const int8_t* x, int64_t rows,
               float* out, int which) {
  const qd::Int8Weights w{codes, scale, n, k};
  std::vector<int32_t> sums(rows);
  for (int64_t r = 0; r < rows; ++r) sums[r] = qd::row_sum(x + r * k, k);
  if (which == 0) return qd::int8_gemm(w, x, rows, sums.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::int8_reference(w, x + r * k, j);
}

void q4_gemm(const uint8_t* codes, const uint8_t* sub_scale, const uint8_t* sub_min, const float* d, const float* dmin,
             int64_t n, int64_t k, const int8_t* x, int64_t rows, float* out, int which) {
  const qd::Q4Weights w{codes, sub_scale, sub_min, d, dmin, n, k};
  std::vector<int32_t> pairs(rows * k / (2 * qd::kGroup));
  for (int64_t r = 0; r < rows; ++r) qd::group_sum_pairs(x + r * k, k, pairs.data() + r * k / (2 * qd::kGroup));
  if (which == 0) return qd::q4_gemm(w, x, rows, pairs.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::q4_reference(w, x + r * k, j);
}

void q5_gemm(const uint8_t* codes, const uint8_t* high, const uint8_t* sub_scale, const uint8_t* sub_min,
             const float* d, const float* dmin, int64_t n, int64_t k, const int8_t* x, int64_t rows, float* out,
             int which) {
  const qd::Q4Weights w{codes, sub_scale, sub_min, d, dmin, n, k, high};
  std::vector<int32_t> pairs(rows * k / (2 * qd::kGroup));
  for (int64_t r = 0; r < rows; ++r) qd::group_sum_pairs(x + r * k, k, pairs.data() + r * k / (2 * qd::kGroup));
  if (which == 0) return qd::q4_gemm(w, x, rows, pairs.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::q4_reference(w, x + r * k, j);
}

void q6_gemm(const uint8_t* codes, const uint8_t* high, const int8_t* sub_scale, const float* d, int64_t n, int64_t k,
             const int8_t* x, int64_t rows, float* out, int which) {
  const qd::Q6Weights w{codes, high, sub_scale, d, n, k};
  std::vector<int32_t> offsets(rows * k / qd::kSubBlock);
  for (int64_t r = 0; r < rows; ++r) qd::sub_block_offsets(x + r * k, k, offsets.data() + r * k / qd::kSubBlock);
  if (which == 0) return qd::q6_gemm(w, x, rows, offsets.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::q6_reference(w, x + r * k, j);
}

void q2_gemm(const uint8_t* codes, const uint8_t* scales, const float* d, const float* dmin, int64_t n, int64_t k,
             const int8_t* x, int64_t rows, float* out, int which) {
  const qd::Q2Weights w{codes, scales, d, dmin, n, k};
  std::vector<int32_t> pairs(rows * w.groups());
  for (int64_t r = 0; r < rows; ++r) qd::sub_block_sum_pairs(x + r * k, k, pairs.data() + r * w.groups());
  if (which == 0) return qd::q2_gemm(w, x, rows, pairs.data(), out, n, 0, n / qd::kLanes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = qd::q2_reference(w, x + r * k, j);
}

void iq4_gemm(const uint8_t* codes, const int8_t* table, const int8_t* sub_scale, const float* d, int64_t n, int64_t k,
              const int8_t* x, int64_t rows, float* out, int which) {
  iq4_family_gemm({codes, table, sub_scale, d, n, k, false}, x, rows, out, which);
}

void iq4h_gemm(const uint8_t* codes, const int8_t* table, const int8_t* sub_scale, const float* d, int64_t n, int64_t k,
               const int8_t* x, int64_t rows, float* out, int which) {
  iq4_family_gemm({codes, table, sub_scale, d, n, k, true}, x, rows, out, which);
}

void q8_gemm(const uint8_t* codes, const uint16_t* d, int64_t n, int64_t k, const int8_t* x, int64_t rows, float* out,
             int which) {
  const qd::Q8Weights w{codes, d, n, k};
  q8_family_gemm(w, x, rows, out, which);
}

void q8m_gemm(const uint8_t* codes, const uint16_t* d, const uint16_t* mins, int64_t n, int64_t k, const int8_t* x,
              int64_t rows, float* out, int which) {
  const qd::Q8Weights w{codes, d, n, k, mins};
  q8_family_gemm(w, x, rows, out, which);
}

void q4t_gemm(const uint8_t* codes, const int8_t* table, const uint16_t* d, int64_t n, int64_t k, const int8_t* x,
              int64_t rows, float* out, int which) {
  const qd::Q8Weights w{codes, d, n, k, nullptr, table};
  q8_family_gemm(w, x, rows, out, which);
}

void q4tm_gemm(const uint8_t* codes, const int8_t* table, const uint16_t* d, const uint16_t* mins, int64_t n, int64_t k,
               const int8_t* x, int64_t rows, float* out, int which) {
  const qd::Q8Weights w{codes, d, n, k, mins, table};
  q8_family_gemm(w, x, rows, out, which);
}
}
