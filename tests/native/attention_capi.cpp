// A C entry point to quickdraft/runtime/native/attention.h for the tests: compiled once per instruction set the
// machine has (AVX-512, AVX2, plain C++), like gemm_capi.cpp, so that every attention path is checked here. Each
// function comes for a float32 cache and, with _half, for a float16 one (keys and values as a half's bits).
#include "attention.h"

#include <vector>

namespace {

template <typename Kv>
void alone(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns, int64_t rows,
           int64_t heads, const Kv* keys, const Kv* values, int64_t head_dim, float scale, float cap, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> scores(8 * qd::key_blocks(lengths[r]) * qd::kKeyBlock);
    qd::attend_group(q + r * heads * head_dim, heads, keys, values, skips[r], lengths[r], owns[r], head_dim, scale, cap,
                     out + r * heads * head_dim, scores.data());
  }
}

template <typename Kv>
void together(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns, int64_t rows,
              int64_t heads, const Kv* keys, const Kv* values, int64_t head_dim, float scale, float cap, float* out) {
  std::vector<const float*> qs(rows);
  std::vector<float*> outs(rows);
  for (int64_t r = 0; r < rows; ++r) {
    qs[r] = q + r * heads * head_dim;
    outs[r] = out + r * heads * head_dim;
  }
  std::vector<float> scores(qd::rows_scratch(lengths, rows, heads));
  qd::attend_rows(qs.data(), skips, lengths, owns, rows, heads, keys, values, head_dim, scale, cap, outs.data(),
                  scores.data());
}

}  // namespace

extern "C" {

const char* attention_isa() { return qd::kAttentionIsa; }

// Each row alone (attend_group): q [rows][heads][D] at positions lengths[r] - 1 (a tree's leaf with its key and value
// at owns[r] >= 0), seeing positions skips[r] on -> out [rows][heads][D].
void attend_alone(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns, int64_t rows,
                  int64_t heads, const float* keys, const float* values, int64_t head_dim, float scale, float cap,
                  float* out) {
  alone(q, skips, lengths, owns, rows, heads, keys, values, head_dim, scale, cap, out);
}

// The rows together (attend_rows), taking turns on the cache's tiles.
void attend_together(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns, int64_t rows,
                     int64_t heads, const float* keys, const float* values, int64_t head_dim, float scale, float cap,
                     float* out) {
  together(q, skips, lengths, owns, rows, heads, keys, values, head_dim, scale, cap, out);
}

void attend_alone_half(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns, int64_t rows,
                       int64_t heads, const uint16_t* keys, const uint16_t* values, int64_t head_dim, float scale,
                       float cap, float* out) {
  alone(q, skips, lengths, owns, rows, heads, keys, values, head_dim, scale, cap, out);
}

void attend_together_half(const float* q, const int64_t* skips, const int64_t* lengths, const int64_t* owns,
                          int64_t rows, int64_t heads, const uint16_t* keys, const uint16_t* values, int64_t head_dim,
                          float scale, float cap, float* out) {
  together(q, skips, lengths, owns, rows, heads, keys, values, head_dim, scale, cap, out);
}
}
