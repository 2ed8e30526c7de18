// Kernels of the native runtime. Every output element is computed by one thread with a fixed
// order of operations that depends only on its own row (and, for attention, on the query's
// position p: it reads keys and values 0..p), never on how many other rows, queries or heads
// share the call. That makes a token's result bitwise identical whether it is decoded alone or
// inside a verify block at any offset.
//
// attend:             causal attention over static KV caches, float32 or float16 (attention.h), one row and KV
//                     head's group of query heads at a time; rows may belong to different caches (requests) at
//                     different positions.
// quantize_rows:      per-row 8-bit activation scales and the int8 rows the GEMMs take, in one pass or two (the
//                     second quantizes what the first left: a model's DecoderConfig.activation_passes).
// int8_matmul:        the integer GEMM against 7-bit weights with per-channel scales (gemm.h).
// q4_matmul:          the integer GEMM against 4-bit weights in llama.cpp's Q4_K structure (gemm.h).
// q5_matmul:          the same against 5-bit weights in llama.cpp's Q5_K structure (gemm.h).
// q8_matmul:          the integer GEMM against 8-bit weights in llama.cpp's Q8_0 structure (gemm_q8.h).
// q8m_matmul:         the same with a min per group (Q5_1).
// q4t_matmul:         q8's sums with 4-bit codes into a table of 16 values (Q4_0, IQ4_NL; gemm_q8.h).
// q4tm_matmul:        the same with a min per group (Q4_1).
// q6_matmul:          the integer GEMM against 6-bit weights in llama.cpp's Q6_K structure (gemm_q6.h).
// q2_matmul:          the integer GEMM against 2-bit weights in llama.cpp's Q2_K structure (gemm_q2.h).
// iq4_matmul:         the integer GEMM against 4-bit table indices in llama.cpp's IQ4_XS structure (gemm_iq4.h).
// iq4h_matmul:        the same with a sub-scale per 16 weights (IQ2_XS's, IQ2_S's and IQ1_M's structure).
// combine_rows:       a GEMM's output back to floats: row scale, bias.
// The fused steps of a decoder layer (layers.h runs a model's layers with them in one call; on a 1-token step
// dispatching many small operations, not their arithmetic, is what costs):
// rms_norm:           RMSNorm of each row.
// rms_norm_quantize:  RMSNorm, then quantize_rows.
// qkv_rope_cache:     combine_rows of the q/k/v projection, RMSNorm of each q and k head (if the model has it),
//                     RoPE on q and k, k and v written into the cache (rounded to halves in a float16 one).
// combine_residual:   residual + combine_rows, RMSNorm'd first (if the model norms a sublayer's output), times a
//                     scale (Granite's residual multiplier; 1 leaves the bits as they are).
// gated_quantize:     combine_rows of gate/up, act(gate) * up (act: SiLU or tanh-approximated GELU), quantize_rows.
// route:              a mixture of experts' router: each row's top k experts and their weights.
// sigmoid_gate:       a shared expert's weight per row: the sigmoid of the row's dot product with its gate.
#include <ATen/Parallel.h>

#include "kernels.h"
#include "attention.h"
#include "gemm.h"
#include "gemm_iq4.h"
#include "gemm_q2.h"
#include "gemm_q6.h"
#include "gemm_q8.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kLanes = 8;  // partial sums of a dot product, in a fixed order

inline float dot(const float* a, const float* b, int64_t n) {
  float partial[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += a[d + l] * b[d + l];
  }
  for (; d < n; ++d) partial[d % kLanes] += a[d] * b[d];
  float total = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) total += partial[l];
  return total;
}

constexpr float kLevels = 127.0f;  // 8-bit activations

// Quantizes one row to integers in [-127, 127]; returns its scale max(max|x|, 1e-30) / 127.
inline float quantize_row(const float* row, int8_t* dst, int64_t width) {
  float amax = 0.0f;
  for (int64_t k = 0; k < width; ++k) amax = std::max(amax, std::fabs(row[k]));
  const float s = std::max(amax, 1e-30f) / kLevels;
  for (int64_t k = 0; k < width; ++k)
    dst[k] = static_cast<int8_t>(std::min(std::max(std::nearbyint(row[k] / s), -kLevels), kLevels));
  return s;
}

// dst = weight * (x * 1 / sqrt(mean(x^2) + eps)).
inline void rms_norm_row(const float* x, const float* weight, float* dst, int64_t width, float eps) {
  const float variance = dot(x, x, width) / static_cast<float>(width);
  const float inverse = 1.0f / std::sqrt(variance + eps);
  for (int64_t k = 0; k < width; ++k) dst[k] = weight[k] * (x[k] * inverse);
}

// The first `dims` of a head's head_dim values: dst = x * cos + rotate_half(x) * sin with rotate_half(x) =
// (-x[half:dims], x[:half]); the rest copied (partial rotary). dst may not alias x.
inline void rope_row(const float* x, const float* cos, const float* sin, float* dst, int64_t dims, int64_t head_dim) {
  const int64_t half = dims / 2;
  for (int64_t d = 0; d < half; ++d) dst[d] = x[d] * cos[d] + (-x[d + half]) * sin[d];
  for (int64_t d = half; d < dims; ++d) dst[d] = x[d] * cos[d] + x[d - half] * sin[d];
  for (int64_t d = dims; d < head_dim; ++d) dst[d] = x[d];
}

at::Tensor float_tensor(at::Tensor t, const char* name) {
  TORCH_CHECK(t.dtype() == at::kFloat, name, " must be float32");
  return t.contiguous();
}

// An optional bias's data, nullptr when it is empty; bias is made contiguous in place so the pointer stays valid.
inline const float* bias_data(at::Tensor& bias) {
  if (bias.numel() == 0) return nullptr;
  bias = float_tensor(bias, "bias");
  return bias.data_ptr<float>();
}

// Quantized activations: rows [P·M, width] int8 and row_scale [P·M, 1] float, P passes of M rows. Pass 1 quantizes
// each row x; pass 2 (P = 2) quantizes what pass 1 left, x − q·s (a multiply, then a subtraction), the same way.
// activations(r, buffer) returns row r's floats: computed into buffer (width floats), or found elsewhere.
template <typename Activations>
std::vector<at::Tensor> quantized_rows(int64_t rows, int64_t width, const at::TensorOptions& options,
                                       int64_t passes, Activations activations) {
  TORCH_CHECK(passes == 1 || passes == 2, "activations are quantized in 1 or 2 passes");
  auto out = at::empty({passes * rows, width}, options.dtype(at::kChar));
  auto scale = at::empty({passes * rows, 1}, options);
  int8_t* out_data = out.data_ptr<int8_t>();
  float* scale_data = scale.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(width), residual(passes > 1 ? width : 0);
    for (int64_t r = begin; r < end; ++r) {
      const float* row = activations(r, buffer.data());
      int8_t* first = out_data + r * width;
      const float s = scale_data[r] = quantize_row(row, first, width);
      if (passes == 1) continue;
      for (int64_t k = 0; k < width; ++k) residual[k] = row[k] - static_cast<float>(first[k]) * s;
      scale_data[rows + r] = quantize_row(residual.data(), out_data + (rows + r) * width, width);
    }
  });
  return {out, scale};
}

// A GEMM's float output [P·M, N] (gemm.h) on quantized_rows' P passes of M rows, with their scales [P·M, 1]; the
// combining kernels read it through combined().
struct GemmOutput {
  const float* out;
  const float* scale;
  int64_t rows, width, passes;

  // Row r's value in column n: each pass's output times its scale, summed in pass order, plus the bias if any.
  float combined(int64_t r, int64_t n, const float* bias) const {
    float v = out[r * width + n] * scale[r];
    for (int64_t p = 1; p < passes; ++p) v = v + out[(p * rows + r) * width + n] * scale[p * rows + r];
    return bias != nullptr ? v + bias[n] : v;
  }
};

// out [P·M, N] and row_scale [P·M, 1] (float32, contiguous) for M = rows; bias [N] or empty.
GemmOutput gemm_output(const at::Tensor& out, const at::Tensor& row_scale, const at::Tensor& bias,
                       int64_t rows) {
  TORCH_CHECK(out.dim() == 2 && row_scale.numel() == out.size(0), "a GEMM output needs one row scale per row");
  TORCH_CHECK(bias.numel() == 0 || bias.numel() == out.size(1), "a bias needs one value per output column");
  TORCH_CHECK(out.size(0) == rows || out.size(0) == 2 * rows, "a GEMM output holds 1 or 2 passes");
  const int64_t passes = rows == 0 ? 1 : out.size(0) / rows;
  return {out.data_ptr<float>(), row_scale.data_ptr<float>(), rows, out.size(1), passes};
}

at::Tensor checked(at::Tensor t, at::ScalarType type, const char* name) {
  TORCH_CHECK(t.scalar_type() == type && t.is_contiguous(), name, " has the wrong type or is not contiguous");
  return t;
}

// The GEMMs write columns [column, column + N) of out [M, width]; their n-blocks are shared among the threads.
template <typename Gemm>
void blocked_matmul(const at::Tensor& x, at::Tensor& out, int64_t column, int64_t n, Gemm gemm) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == x.size(0));
  TORCH_CHECK(column % qd::kLanes == 0 && column + n <= out.size(1) && n % qd::kLanes == 0);
  float* destination = out.data_ptr<float>() + column;
  at::parallel_for(0, n / qd::kLanes, 1, [&](int64_t begin, int64_t end) { gemm(destination, begin, end); });
}

// One layer's keys or values of every cache slot a call touches: slot s's plane for layer l and KV head g starts at
// base[s] + l * layer_stride[s] + g * head_stride[s] elements, float32 or float16 (`half`: a half's bits) alike in
// every slot. Values are [layers, kv_heads, C, D] per slot; keys are [layers, kv_heads, C/16, D, 16] (attention.h's
// blocks). The dimensions after the layer's must be contiguous.
struct CachePlanes {
  std::vector<void*> base;
  std::vector<int64_t> layer_stride, head_stride;
  int64_t kv_heads = 0, capacity = 0, head_dim = 0;
  bool half = false;

  CachePlanes(const std::vector<at::Tensor>& slots, bool blocked, int64_t layer) {
    TORCH_CHECK(!slots.empty() && layer >= 0 && layer < slots[0].size(0), "no cache slots, or no such layer");
    half = slots[0].scalar_type() == at::kHalf;
    for (const auto& t : slots) {
      TORCH_CHECK(t.scalar_type() == (half ? at::kHalf : at::kFloat) && t.dim() == (blocked ? 5 : 4),
                  "cache slots are all float32 or all float16, of the cache's shape");
      TORCH_CHECK(t[0].is_contiguous() && t.sizes() == slots[0].sizes(), "cache slots must match and be contiguous");
      base.push_back(t.data_ptr());
      layer_stride.push_back(t.stride(0));
      head_stride.push_back(t.stride(1));
    }
    kv_heads = slots[0].size(1);
    capacity = blocked ? slots[0].size(2) * qd::kKeyBlock : slots[0].size(2);
    head_dim = slots[0].size(3);
  }
  // Kv: float for a float32 cache, uint16_t for a float16 one.
  template <typename Kv>
  Kv* plane(int64_t slot, int64_t layer, int64_t g) const {
    return static_cast<Kv*>(base[slot]) + layer * layer_stride[slot] + g * head_stride[slot];
  }
};

// run(float{}) for a float32 cache, run(uint16_t{}) for a float16 one: the element type chosen once per call.
template <typename Run>
void with_cache_type(const CachePlanes& planes, Run run) {
  if (planes.half) run(uint16_t{});
  else run(float{});
}

// A float as a cache element: itself, or the half nearest to it (ties to even, as PyTorch's conversion).
template <typename Kv>
Kv cache_element(float value) {
  if constexpr (std::is_same_v<Kv, float>) return value;
  else return c10::Half(value).x;
}

// Row r: slot row_slot[r], position row_position[r], its key and value at index row_index[r] (its position, or for a
// tree's leaf a place past the verify block: attention.h).
void check_rows(const std::vector<int64_t>& row_slot, const std::vector<int64_t>& row_position,
                const std::vector<int64_t>& row_index, int64_t rows, const CachePlanes& planes) {
  TORCH_CHECK(static_cast<int64_t>(row_slot.size()) == rows && static_cast<int64_t>(row_position.size()) == rows &&
              static_cast<int64_t>(row_index.size()) == rows);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(row_slot[r] >= 0 && row_slot[r] < static_cast<int64_t>(planes.base.size()), "row slot out of range");
    TORCH_CHECK(row_position[r] >= 0 && row_position[r] < planes.capacity, "row position outside the cache");
    TORCH_CHECK(row_index[r] >= row_position[r] && row_index[r] < planes.capacity,
                "a row's key is kept at its position or past it, inside the cache");
  }
}

}  // namespace

// q: [R, H, D] float32 (RoPE applied), one row per new token; keys, values: the cache slots (see CachePlanes),
// already holding the rows' own keys and values; row r sits in slot row_slot[r] at position row_position[r], its key
// and value at index row_index[r], and attends to that slot's positions 0..row_position[r] of layer `layer`, its own
// key in the place of its position (attention.h), or with a sliding `window`
// (0: none) to the last `window` of them; scores are softcapped by `softcap` (0: none). Returns [R, H * D].
at::Tensor attend(at::Tensor q, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                  int64_t layer, std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                  std::vector<int64_t> row_index, double scale, int64_t window, double softcap) {
  TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && window >= 0 && softcap >= 0);
  q = q.contiguous();
  const CachePlanes key_planes(keys, true, layer), value_planes(values, false, layer);
  const int64_t rows = q.size(0), heads = q.size(1), head_dim = q.size(2), kv_heads = key_planes.kv_heads;
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(head_dim == key_planes.head_dim && heads % kv_heads == 0);
  TORCH_CHECK(value_planes.kv_heads == kv_heads && value_planes.head_dim == head_dim &&
                  value_planes.half == key_planes.half, "keys and values differ");
  check_rows(row_slot, row_position, row_index, rows, key_planes);
  check_rows(row_slot, row_position, row_index, rows, value_planes);
  auto out = at::empty({rows, heads * head_dim}, q.options());
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  // Row r reads the cache from the block holding its window's first position: start[r] (a multiple of 16).
  std::vector<int64_t> start(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = window > 0 ? std::max<int64_t>(0, row_position[r] + 1 - window) : 0;
    start[r] = first / qd::kKeyBlock * qd::kKeyBlock;
  }
  // Runs: consecutive rows of one slot reading from one block (a verify block, a prompt chunk), at most kRunRows,
  // attended together.
  constexpr int64_t kRunRows = 16;
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t r = 0; r < rows;) {
    int64_t e = r + 1;
    while (e < rows && row_slot[e] == row_slot[r] && start[e] == start[r] && e - r < kRunRows) ++e;
    runs.emplace_back(r, e);
    r = e;
  }
  with_cache_type(key_planes, [&](auto element) {
    using Kv = decltype(element);
    at::parallel_for(0, static_cast<int64_t>(runs.size()) * kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      const float* qs[kRunRows];
      float* outs[kRunRows];
      int64_t skips[kRunRows], lengths[kRunRows], owns[kRunRows];
      for (int64_t task = begin; task < end; ++task) {
        const int64_t g = task % kv_heads;
        const auto [first, last] = runs[task / kv_heads];
        const int64_t from = start[first];
        for (int64_t r = first; r < last; ++r) {
          qs[r - first] = q_data + (r * heads + g * group) * head_dim;
          outs[r - first] = out_data + (r * heads + g * group) * head_dim;
          lengths[r - first] = row_position[r] + 1 - from;
          skips[r - first] = window > 0 ? std::max<int64_t>(0, row_position[r] + 1 - window) - from : 0;
          owns[r - first] = row_index[r] != row_position[r] ? row_index[r] - from : -1;
        }
        scores.resize(qd::rows_scratch(lengths, last - first, group));
        qd::attend_rows(qs, skips, lengths, owns, last - first, group,
                        key_planes.plane<Kv>(row_slot[first], layer, g) + from * head_dim,
                        value_planes.plane<Kv>(row_slot[first], layer, g) + from * head_dim, head_dim,
                        static_cast<float>(scale), static_cast<float>(softcap), outs, scores.data());
      }
    });
  });
  return out;
}

// x: [M, K] float32; passes 1 or 2. Returns (rows, row_scale): rows [P·M, K] int8 holds round(x / s) in
// [-127, 127] (then, pass 2, round(x' / s') of x' = x − round(x / s)·s); row_scale [P·M, 1] = max(max|x|, 1e-30) /
// 127 (then s' of x'). The same arithmetic as the PyTorch path in linear.py.
std::vector<at::Tensor> quantize_rows(at::Tensor x, int64_t passes) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2);
  x = x.contiguous();
  const int64_t width = x.size(1);
  const float* x_data = x.data_ptr<float>();
  return quantized_rows(x.size(0), width, x.options(), passes, [&](int64_t r, float*) { return x_data + r * width; });
}

// out: [P·M, N] a GEMM's output over `passes` passes of M rows; row_scale [P·M, 1]; bias [N] or empty.
// Returns y [M, N] = out * s (summed over the passes) + bias, operation by operation as in the PyTorch path.
at::Tensor combine_rows(at::Tensor out, at::Tensor row_scale, at::Tensor bias, int64_t passes) {
  out = float_tensor(out, "out");
  row_scale = float_tensor(row_scale, "row_scale");
  TORCH_CHECK(passes == 1 || passes == 2, "activations are quantized in 1 or 2 passes");
  const GemmOutput gemm = gemm_output(out, row_scale, bias, out.size(0) / passes);
  const int64_t rows = gemm.rows, width = gemm.width;
  auto y = at::empty({rows, width}, out.options());
  const float* b = bias_data(bias);
  float* y_data = y.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t n = 0; n < width; ++n) y_data[r * width + n] = gemm.combined(r, n, b);
    }
  });
  return y;
}

// x: [R, H] float32 rows (a layer's normed MLP input); router: [E, H] float32. Returns (chosen [R, k] int64, weights
// [R, k] float32): per row, logits = dot(x, router[e]) for each expert, their softmax p (exp(l − max), summed in
// expert order, each divided by the sum), the k largest p in descending order (ties to the lower expert), and their
// p, divided by their sum (added in rank order) when `normalize` (experts.py's rules).
std::vector<at::Tensor> route(at::Tensor x, at::Tensor router, int64_t top_k, bool normalize) {
  x = float_tensor(x, "x");
  router = float_tensor(router, "router");
  const int64_t rows = x.size(0), width = x.size(1), experts = router.size(0);
  TORCH_CHECK(x.dim() == 2 && router.dim() == 2 && router.size(1) == width, "routing needs x [R, H] and a router [E, H]");
  TORCH_CHECK(top_k >= 1 && top_k <= experts, "1 to E experts a row");
  auto chosen = at::empty({rows, top_k}, x.options().dtype(at::kLong));
  auto weights = at::empty({rows, top_k}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* w = router.data_ptr<float>();
  int64_t* chosen_data = chosen.data_ptr<int64_t>();
  float* weight_data = weights.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(experts);
    std::vector<char> taken(experts);
    for (int64_t r = begin; r < end; ++r) {
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t e = 0; e < experts; ++e) top = std::max(top, p[e] = dot(x_data + r * width, w + e * width, width));
      float sum = 0.0f;
      for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(p[e] - top));
      for (int64_t e = 0; e < experts; ++e) p[e] = p[e] / sum;
      std::fill(taken.begin(), taken.end(), 0);
      int64_t* row_chosen = chosen_data + r * top_k;
      float* row_weights = weight_data + r * top_k;
      for (int64_t rank = 0; rank < top_k; ++rank) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e) {
          if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        }
        taken[best] = 1;
        row_chosen[rank] = best;
        row_weights[rank] = p[best];
      }
      if (!normalize) continue;
      float total = row_weights[0];
      for (int64_t rank = 1; rank < top_k; ++rank) total = total + row_weights[rank];
      for (int64_t rank = 0; rank < top_k; ++rank) row_weights[rank] = row_weights[rank] / total;
    }
  });
  return {chosen, weights};
}

// x: [R, H] float32 rows; gate: [H] float32. Returns [R] float32: 1 / (1 + exp(−dot(x[r], gate))), the dot product in
// route's fixed order (experts.py's shared expert).
at::Tensor sigmoid_gate(at::Tensor x, at::Tensor gate) {
  x = float_tensor(x, "x");
  gate = float_tensor(gate, "gate");
  TORCH_CHECK(x.dim() == 2 && gate.numel() == x.size(1), "a shared expert's gate needs x [R, H] and a gate [H]");
  const int64_t rows = x.size(0), width = x.size(1);
  auto out = at::empty({rows}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* g = gate.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) out_data[r] = 1.0f / (1.0f + std::exp(-dot(x_data + r * width, g, width)));
  return out;
}

// RMSNorm's inputs as the kernels read them: x [M, H] and weight [H] (or empty: no norm), float32 and contiguous.
// Returns the weight's data, nullptr for none.
const float* norm_inputs(at::Tensor& x, at::Tensor& weight) {
  x = float_tensor(x, "x");
  TORCH_CHECK(x.dim() == 2 && (weight.numel() == 0 || weight.numel() == x.size(1)),
              "RMSNorm needs x [M, H] and a weight [H] (or none)");
  return weight.numel() ? (weight = float_tensor(weight, "weight")).data_ptr<float>() : nullptr;
}

// x: [M, H]; weight: [H], or empty for none (x as it is). Returns [M, H].
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  const float* w = norm_inputs(x, weight);
  if (w == nullptr) return x;
  const int64_t rows = x.size(0), width = x.size(1);
  auto y = at::empty({rows, width}, x.options());
  const float* x_data = x.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      rms_norm_row(x_data + r * width, w, y_data + r * width, width, static_cast<float>(eps));
  });
  return y;
}

// x: [M, H]; weight: [H], or empty for none. Returns quantize_rows(rms_norm(x), passes): rows [P·M, H] int8,
// row_scale [P·M, 1].
std::vector<at::Tensor> rms_norm_quantize(at::Tensor x, at::Tensor weight, double eps, int64_t passes) {
  const float* w = norm_inputs(x, weight);
  if (w == nullptr) return quantize_rows(x, passes);
  const int64_t width = x.size(1);
  const float* x_data = x.data_ptr<float>();
  return quantized_rows(x.size(0), width, x.options(), passes, [&](int64_t r, float* normed) {
    rms_norm_row(x_data + r * width, w, normed, width, static_cast<float>(eps));
    return normed;
  });
}

// out: [P·R, (H + 2·KVH)·D] the GEMM output of the q/k/v projection (P passes); row_scale [P·R, 1]; bias [(H + 2·KVH)·D] or
// empty; q_norm, k_norm: RMSNorm weights of q and k, both empty (none) or each normalizing spans of its own width:
// [D] each head, or [H·D] and [KVH·D] all of q's and all of k's heads as one row (OLMo); cos, sin: [C, R] RoPE tables of
// the first R dimensions of a head (R < D: partial rotary, the rest unchanged);
// keys, values: the cache slots (see CachePlanes). Row r is position row_position[r] of slot row_slot[r]: its k and
// v, rotated for that position, are written at index row_index[r] in layer `layer`. Returns q [R, H, D], normed and
// rotated.
at::Tensor qkv_rope_cache(at::Tensor out, at::Tensor row_scale, at::Tensor bias, at::Tensor q_norm,
                          at::Tensor k_norm, double eps, at::Tensor cos, at::Tensor sin,
                          std::vector<at::Tensor> keys, std::vector<at::Tensor> values, int64_t layer,
                          std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                          std::vector<int64_t> row_index, int64_t heads) {
  out = float_tensor(out, "out");
  row_scale = float_tensor(row_scale, "row_scale");
  cos = float_tensor(cos, "cos");
  sin = float_tensor(sin, "sin");
  const CachePlanes key_planes(keys, true, layer), value_planes(values, false, layer);
  TORCH_CHECK(value_planes.half == key_planes.half, "keys and values differ");
  const int64_t kv_heads = key_planes.kv_heads, head_dim = key_planes.head_dim;
  const int64_t rows = static_cast<int64_t>(row_slot.size()), width = out.size(1);
  TORCH_CHECK(width == (heads + 2 * kv_heads) * head_dim);
  const GemmOutput gemm = gemm_output(out, row_scale, bias, rows);
  check_rows(row_slot, row_position, row_index, rows, key_planes);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(1) <= head_dim && cos.size(1) % 2 == 0,
              "RoPE tables [C, R] for the first R (even) of a head's D dimensions");
  const int64_t dims = cos.size(1);
  for (const int64_t position : row_position) TORCH_CHECK(position < cos.size(0), "a position past the RoPE tables");
  const int64_t q_span = q_norm.numel(), k_span = k_norm.numel();
  TORCH_CHECK((q_span == 0) == (k_span == 0) && (q_span == 0 || q_span == head_dim || q_span == heads * head_dim) &&
                  (k_span == 0 || k_span == head_dim || k_span == kv_heads * head_dim),
              "q and k norms are both empty, or each [D] or as wide as all its heads");
  const float* qn = q_norm.numel() ? (q_norm = float_tensor(q_norm, "q_norm")).data_ptr<float>() : nullptr;
  const float* kn = k_norm.numel() ? (k_norm = float_tensor(k_norm, "k_norm")).data_ptr<float>() : nullptr;
  const float norm_eps = static_cast<float>(eps);
  const float* b = bias_data(bias);
  auto q = at::empty({rows, heads, head_dim}, out.options());
  const float *cos_data = cos.data_ptr<float>(), *sin_data = sin.data_ptr<float>();
  float* q_data = q.data_ptr<float>();
  with_cache_type(key_planes, [&](auto element) {
    using Kv = decltype(element);
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> projected(width), rotated(head_dim);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t position = row_position[r];
        for (int64_t n = 0; n < width; ++n) projected[n] = gemm.combined(r, n, b);
        for (int64_t n = 0; qn != nullptr && n < heads * head_dim; n += q_span) {  // in place: a span reads only itself
          rms_norm_row(projected.data() + n, qn, projected.data() + n, q_span, norm_eps);
        }
        for (int64_t n = heads * head_dim; kn != nullptr && n < (heads + kv_heads) * head_dim; n += k_span) {
          rms_norm_row(projected.data() + n, kn, projected.data() + n, k_span, norm_eps);
        }
        const float* c = cos_data + position * dims;
        const float* si = sin_data + position * dims;
        for (int64_t h = 0; h < heads; ++h)
          rope_row(projected.data() + h * head_dim, c, si, q_data + (r * heads + h) * head_dim, dims, head_dim);
        const float* k = projected.data() + heads * head_dim;
        const float* v = k + kv_heads * head_dim;
        for (int64_t g = 0; g < kv_heads; ++g) {
          rope_row(k + g * head_dim, c, si, rotated.data(), dims, head_dim);
          Kv* key_plane = key_planes.plane<Kv>(row_slot[r], layer, g);
          Kv* value_row = value_planes.plane<Kv>(row_slot[r], layer, g) + row_index[r] * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) {
            key_plane[qd::key_offset(row_index[r], d, head_dim)] = cache_element<Kv>(rotated[d]);
            value_row[d] = cache_element<Kv>(v[g * head_dim + d]);
          }
        }
      }
    });
  });
  return q;
}

// out: [P·M, N] a GEMM's output (P passes); row_scale [P·M, 1]; bias [N] or empty; norm [N] or empty; residual [M, N].
// Returns residual + scale · combine_rows(out, row_scale, bias), the combined rows RMSNorm'd by `norm` first if it is
// given.
at::Tensor combine_residual(at::Tensor out, at::Tensor row_scale, at::Tensor bias, at::Tensor norm,
                            double eps, double scale, at::Tensor residual) {
  out = float_tensor(out, "out");
  row_scale = float_tensor(row_scale, "row_scale");
  residual = float_tensor(residual, "residual");
  const int64_t rows = residual.size(0), width = out.size(1);
  const GemmOutput gemm = gemm_output(out, row_scale, bias, rows);
  TORCH_CHECK(residual.dim() == 2 && residual.size(1) == width);
  TORCH_CHECK(norm.numel() == 0 || norm.numel() == width, "a norm needs one weight per column");
  const float* w = norm.numel() ? (norm = float_tensor(norm, "norm")).data_ptr<float>() : nullptr;
  const float* b = bias_data(bias);
  auto y = at::empty({rows, width}, out.options());
  const float* x = residual.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row(w != nullptr ? width : 0);
    for (int64_t r = begin; r < end; ++r) {
      if (w == nullptr) {
        for (int64_t n = 0; n < width; ++n)
          y_data[r * width + n] = x[r * width + n] + s * gemm.combined(r, n, b);
        continue;
      }
      for (int64_t n = 0; n < width; ++n) row[n] = gemm.combined(r, n, b);
      rms_norm_row(row.data(), w, row.data(), width, static_cast<float>(eps));
      for (int64_t n = 0; n < width; ++n) y_data[r * width + n] = x[r * width + n] + s * row[n];
    }
  });
  return y;
}

// The activation of a gated MLP's gate (model.py's ACTIVATIONS, in this order).
enum Activation : int64_t { kSilu = 0, kGeluTanh = 1, kGelu = 2 };

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kInverseSqrt2 = 0.7071067811865476f;

// out: [P·M, 2·I] the GEMM output of the fused gate/up projection over `passes` passes; row_scale [P·M, 1];
// activation: an Activation. Returns quantize_rows(act(gate) * up, passes): rows [P·M, I] int8, row_scale [P·M, 1]
// (gate and up are combine_rows' values). SiLU is g / (1 + exp(−g)); the GELU is
// tanh-approximated, 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) with tanh(y) = 2 / (1 + exp(−2y)) − 1, or exact,
// 0.5·g·(1 + erf(g / √2)) (std::erf, one element at a time).
std::vector<at::Tensor> gated_quantize(at::Tensor out, at::Tensor row_scale, int64_t activation,
                                       int64_t passes) {
  out = float_tensor(out, "out");
  row_scale = float_tensor(row_scale, "row_scale");
  TORCH_CHECK(passes == 1 || passes == 2, "activations are quantized in 1 or 2 passes");
  const GemmOutput gemm = gemm_output(out, row_scale, at::Tensor(), out.size(0) / passes);
  TORCH_CHECK(out.size(1) % 2 == 0, "gate and up need the same width");
  TORCH_CHECK(activation == kSilu || activation == kGeluTanh || activation == kGelu, "an unknown activation");
  const int64_t width = out.size(1) / 2;
  const bool gelu = activation == kGeluTanh, exact = activation == kGelu;
  return quantized_rows(gemm.rows, width, out.options(), passes, [&](int64_t r, float* activated) {
    int64_t n = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    // gemm.combined(r, column .. column + 15, no bias): the same multiplies and adds, 16 columns at a time
    const auto combined16 = [&](int64_t column) {
      __m512 v = _mm512_mul_ps(_mm512_loadu_ps(gemm.out + r * gemm.width + column), _mm512_set1_ps(gemm.scale[r]));
      for (int64_t p = 1; p < gemm.passes; ++p) {
        const int64_t row = p * gemm.rows + r;
        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_loadu_ps(gemm.out + row * gemm.width + column),
                                           _mm512_set1_ps(gemm.scale[row])));
      }
      return v;
    };
    for (; !exact && n + 16 <= width; n += 16) {
      const __m512 g = combined16(n);
      __m512 act;
      if (gelu) {
        const __m512 cubic = _mm512_mul_ps(_mm512_set1_ps(kGeluCubic), _mm512_mul_ps(g, _mm512_mul_ps(g, g)));
        const __m512 y = _mm512_mul_ps(_mm512_set1_ps(kGeluScale), _mm512_add_ps(g, cubic));
        const __m512 e = qd::exp_ps(_mm512_sub_ps(zero, _mm512_add_ps(y, y)));
        const __m512 tanh = _mm512_sub_ps(_mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)), one);
        act = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), g), _mm512_add_ps(one, tanh));
      } else {
        act = _mm512_div_ps(g, _mm512_add_ps(one, qd::exp_ps(_mm512_sub_ps(zero, g))));
      }
      _mm512_storeu_ps(activated + n, _mm512_mul_ps(act, combined16(width + n)));
    }
#endif
    for (; n < width; ++n) {
      const float g = gemm.combined(r, n, nullptr);
      float act;
      if (exact) {
        act = (0.5f * g) * (1.0f + std::erf(g * kInverseSqrt2));
      } else if (gelu) {
        const float y = kGeluScale * (g + kGeluCubic * (g * (g * g)));
        act = (0.5f * g) * (1.0f + (2.0f / (1.0f + std::exp(-(y + y))) - 1.0f));
      } else {
        act = g / (1.0f + std::exp(-g));
      }
      activated[n] = act * gemm.combined(r, width + n, nullptr);
    }
    return activated;
  });
}

// x: [M, K] int8 rows; codes [N/16, K/4, 16, 4] uint8 (w + 64); scale [N]. Writes out[:, column : column + N].
void int8_matmul(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor out, int64_t column) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(scale, at::kFloat, "scale").size(0);
  TORCH_CHECK(checked(codes, at::kByte, "codes").numel() == n * k && k % 4 == 0);
  const qd::Int8Weights weights{codes.data_ptr<uint8_t>(), scale.data_ptr<float>(), n, k};
  const int8_t* x_data = x.data_ptr<int8_t>();
  std::vector<int32_t> sums(rows);
  for (int64_t r = 0; r < rows; ++r) sums[r] = qd::row_sum(x_data + r * k, k);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::int8_gemm(weights, x_data, rows, sums.data(), destination, out.size(1), begin, end);
  });
}

namespace {

// The per-row integers a GEMM takes besides the rows: fill(row, k, values) writes a row's `count` of them.
template <typename Fill>
std::vector<int32_t> per_row(const int8_t* x, int64_t rows, int64_t k, int64_t count, Fill fill) {
  std::vector<int32_t> values(rows * count);
  for (int64_t r = 0; r < rows; ++r) fill(x + r * k, k, values.data() + r * count);
  return values;
}

// q4_matmul, and q5_matmul with `high` (the codes' fifth bits [N/16, K/32, 16, 4] uint8; undefined for q4).
void q4_family_matmul(at::Tensor x, at::Tensor codes, at::Tensor high, at::Tensor sub_scale,
                      at::Tensor sub_min, at::Tensor d, at::Tensor dmin, at::Tensor out, int64_t column) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(codes, at::kByte, "codes").size(0) * qd::kLanes;
  TORCH_CHECK(k % (2 * qd::kGroup) == 0 && codes.numel() * 2 == n * k, "q4/q5 weights need K a multiple of 64");
  const uint8_t* fifth = nullptr;
  if (high.defined()) {
    TORCH_CHECK(checked(high, at::kByte, "high").numel() * 8 == n * k, "q5's fifth bits: one bit a weight");
    fifth = high.data_ptr<uint8_t>();
  }
  const qd::Q4Weights weights{codes.data_ptr<uint8_t>(), checked(sub_scale, at::kByte, "sub_scale").data_ptr<uint8_t>(),
                              checked(sub_min, at::kByte, "sub_min").data_ptr<uint8_t>(),
                              checked(d, at::kFloat, "d").data_ptr<float>(),
                              checked(dmin, at::kFloat, "dmin").data_ptr<float>(), n, k, fifth};
  TORCH_CHECK(sub_scale.numel() == n * weights.groups() && d.numel() == n * weights.supers() && dmin.numel() == d.numel() &&
              sub_min.numel() == sub_scale.numel());
  const int8_t* x_data = x.data_ptr<int8_t>();
  const auto pairs = per_row(x_data, rows, k, k / (2 * qd::kGroup), qd::group_sum_pairs);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::q4_gemm(weights, x_data, rows, pairs.data(), destination, out.size(1), begin, end);
  });
}

}  // namespace

// x: [M, K] int8 rows (K a multiple of 64); codes [N/16, K/32, 4, 16, 4] uint8; sub_scale [N/16, K/32, 16] and
// sub_min [N/16, K/64, 16, 2] uint8; d, dmin [N/16, S, 16] float (gemm.h). Writes out[:, column : column + N].
void q4_matmul(at::Tensor x, at::Tensor codes, at::Tensor sub_scale, at::Tensor sub_min, at::Tensor d,
               at::Tensor dmin, at::Tensor out, int64_t column) {
  q4_family_matmul(x, codes, at::Tensor(), sub_scale, sub_min, d, dmin, out, column);
}

// q4_matmul's arguments and high [N/16, K/32, 16, 4] uint8, the codes' fifth bits (gemm.h's q5).
void q5_matmul(at::Tensor x, at::Tensor codes, at::Tensor high, at::Tensor sub_scale, at::Tensor sub_min,
               at::Tensor d, at::Tensor dmin, at::Tensor out, int64_t column) {
  TORCH_CHECK(high.defined(), "q5 weights need their fifth bits");
  q4_family_matmul(x, codes, high, sub_scale, sub_min, d, dmin, out, column);
}

// x: [M, K] int8 rows (K a multiple of 32); codes [N/16, K/32, 4, 16, 4] and high [N/16, K/32, 2, 16, 4] uint8;
// sub_scale [N/16, K/32, 16, 2] int8; d [N/16, S, 16] float (gemm_q6.h). Writes out[:, column : column + N].
void q6_matmul(at::Tensor x, at::Tensor codes, at::Tensor high, at::Tensor sub_scale, at::Tensor d,
               at::Tensor out, int64_t column) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(codes, at::kByte, "codes").size(0) * qd::kLanes;
  TORCH_CHECK(k % qd::kGroup == 0 && codes.numel() * 2 == n * k, "q6 weights need K a multiple of 32");
  const qd::Q6Weights weights{codes.data_ptr<uint8_t>(), checked(high, at::kByte, "high").data_ptr<uint8_t>(),
                              checked(sub_scale, at::kChar, "sub_scale").data_ptr<int8_t>(),
                              checked(d, at::kFloat, "d").data_ptr<float>(), n, k};
  TORCH_CHECK(high.numel() * 4 == n * k && sub_scale.numel() * qd::kSubBlock == n * k &&
              d.numel() == n * weights.supers());
  const int8_t* x_data = x.data_ptr<int8_t>();
  const auto offsets = per_row(x_data, rows, k, k / qd::kSubBlock, qd::sub_block_offsets);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::q6_gemm(weights, x_data, rows, offsets.data(), destination, out.size(1), begin, end);
  });
}

// x: [M, K] int8 rows (K a multiple of 32); codes [N/16, K/32, 2, 16, 4] and scales [N/16, K/32, 16, 2] uint8;
// d, dmin [N/16, S, 16] float (gemm_q2.h). Writes out[:, column : column + N].
void q2_matmul(at::Tensor x, at::Tensor codes, at::Tensor scales, at::Tensor d, at::Tensor dmin, at::Tensor out,
               int64_t column) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(codes, at::kByte, "codes").size(0) * qd::kLanes;
  TORCH_CHECK(k % qd::kGroup == 0 && codes.numel() * 4 == n * k, "q2 weights need K a multiple of 32");
  const qd::Q2Weights weights{codes.data_ptr<uint8_t>(), checked(scales, at::kByte, "scales").data_ptr<uint8_t>(),
                              checked(d, at::kFloat, "d").data_ptr<float>(),
                              checked(dmin, at::kFloat, "dmin").data_ptr<float>(), n, k};
  TORCH_CHECK(scales.numel() * qd::kQ2SubBlock == n * k && d.numel() == n * weights.supers() &&
              dmin.numel() == d.numel());
  const int8_t* x_data = x.data_ptr<int8_t>();
  const auto pairs = per_row(x_data, rows, k, weights.groups(), qd::sub_block_sum_pairs);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::q2_gemm(weights, x_data, rows, pairs.data(), destination, out.size(1), begin, end);
  });
}

namespace {

// iq4_matmul and iq4h_matmul: `halves` says whether sub_scale holds a sub-scale per 32 weights or per 16.
void iq4_family_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor sub_scale, at::Tensor d,
                       at::Tensor out, int64_t column, bool halves) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(codes, at::kByte, "codes").size(0) * qd::kLanes;
  TORCH_CHECK(k % qd::kGroup == 0 && codes.numel() * 2 == n * k, "iq4 weights need K a multiple of 32");
  const qd::Iq4Weights weights{codes.data_ptr<uint8_t>(), checked(table, at::kChar, "table").data_ptr<int8_t>(),
                               checked(sub_scale, at::kChar, "sub_scale").data_ptr<int8_t>(),
                               checked(d, at::kFloat, "d").data_ptr<float>(), n, k, halves};
  TORCH_CHECK(table.numel() == n && sub_scale.numel() == n * weights.sub_blocks() && d.numel() == n * weights.supers());
  const int8_t* x_data = x.data_ptr<int8_t>();
  const auto offsets = halves ? per_row(x_data, rows, k, weights.sub_blocks(), qd::half_group_offsets)
                              : per_row(x_data, rows, k, weights.sub_blocks(), qd::group_offsets);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::iq4_gemm(weights, x_data, rows, offsets.data(), destination, out.size(1), begin, end);
  });
}

}  // namespace

// x: [M, K] int8 rows (K a multiple of 32); codes [N/16, K/32, 4, 16, 4] uint8; table [N/16, 16] int8; sub_scale
// [N/16, K/32, 16] int8; d [N/16, S, 16] float (gemm_iq4.h). Writes out[:, column : column + N].
void iq4_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor sub_scale, at::Tensor d, at::Tensor out,
                int64_t column) {
  iq4_family_matmul(x, codes, table, sub_scale, d, out, column, false);
}

// iq4_matmul with a sub-scale per 16 weights: sub_scale [N/16, K/32, 2, 16] int8 (gemm_iq4.h's iq4h).
void iq4h_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor sub_scale, at::Tensor d, at::Tensor out,
                 int64_t column) {
  iq4_family_matmul(x, codes, table, sub_scale, d, out, column, true);
}

namespace {

// q8_matmul, and q8m_matmul with `mins` ([N/16, K/32, 16] float16; undefined for q8); with a `table` ([N/16, 16]
// int8; undefined for 8-bit codes) q4t_matmul and q4tm_matmul.
void q8_family_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor d, at::Tensor mins,
                      at::Tensor out, int64_t column) {
  checked(x, at::kChar, "x");
  const int64_t rows = x.size(0), k = x.size(1), n = checked(codes, at::kByte, "codes").size(0) * qd::kLanes;
  const int64_t codes_per_byte = table.defined() ? 2 : 1;
  TORCH_CHECK(k % qd::kGroup == 0 && codes.numel() * codes_per_byte == n * k, "q8 weights need K a multiple of 32");
  const int8_t* values = nullptr;
  if (table.defined()) {
    TORCH_CHECK(checked(table, at::kChar, "table").numel() == n, "q4t: a table of 16 values a panel of 16 rows");
    values = table.data_ptr<int8_t>();
  }
  TORCH_CHECK(checked(d, at::kHalf, "d").numel() * qd::kGroup == n * k, "q8: one scale a group of 32");
  const uint16_t* min_bits = nullptr;
  if (mins.defined()) {
    TORCH_CHECK(checked(mins, at::kHalf, "mins").numel() == d.numel(), "q8m: one min a group of 32");
    min_bits = reinterpret_cast<const uint16_t*>(mins.data_ptr<at::Half>());
  }
  const qd::Q8Weights weights{codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>()), n,
                              k, min_bits, values};
  const int8_t* x_data = x.data_ptr<int8_t>();
  const auto offsets = per_row(x_data, rows, k, k / qd::kGroup, qd::group_offsets);
  blocked_matmul(x, out, column, n, [&](float* destination, int64_t begin, int64_t end) {
    qd::q8_gemm(weights, x_data, rows, offsets.data(), destination, out.size(1), begin, end);
  });
}

}  // namespace

// x: [M, K] int8 rows (K a multiple of 32); codes [N/16, K/32, 8, 16, 4] uint8 (q + 128); d [N/16, K/32, 16]
// float16 (gemm_q8.h). Writes out[:, column : column + N].
void q8_matmul(at::Tensor x, at::Tensor codes, at::Tensor d, at::Tensor out, int64_t column) {
  q8_family_matmul(x, codes, at::Tensor(), d, at::Tensor(), out, column);
}

// q8_matmul's arguments and mins [N/16, K/32, 16] float16, a min per group (gemm_q8.h's q8m).
void q8m_matmul(at::Tensor x, at::Tensor codes, at::Tensor d, at::Tensor mins, at::Tensor out,
                int64_t column) {
  TORCH_CHECK(mins.defined(), "q8m weights need their mins");
  q8_family_matmul(x, codes, at::Tensor(), d, mins, out, column);
}

// x: [M, K] int8 rows (K a multiple of 32); codes [N/16, K/32, 4, 16, 4] uint8 (q4's nibbles); table [N/16, 16] int8,
// the values each panel's codes index; d [N/16, K/32, 16] float16 (gemm_q8.h's q4t). Writes out[:, column : column + N].
void q4t_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor d, at::Tensor out,
                int64_t column) {
  TORCH_CHECK(table.defined(), "q4t weights need their table");
  q8_family_matmul(x, codes, table, d, at::Tensor(), out, column);
}

// q4t_matmul's arguments and mins [N/16, K/32, 16] float16, a min per group (gemm_q8.h's q4tm).
void q4tm_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor d, at::Tensor mins,
                 at::Tensor out, int64_t column) {
  TORCH_CHECK(table.defined() && mins.defined(), "q4tm weights need their table and mins");
  q8_family_matmul(x, codes, table, d, mins, out, column);
}

std::string isa() { return std::string(qd::kIsa) + ", attention " + qd::kAttentionIsa; }
