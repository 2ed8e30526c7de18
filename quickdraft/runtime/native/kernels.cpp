// Kernels of the native runtime. Every output element is computed by one thread with a fixed
// order of operations that depends only on its own row (and, for attention, on the query's
// position p: it reads keys and values 0..p), never on how many other rows, queries or heads
// share the call. That makes a token's result bitwise identical whether it is decoded alone or
// inside a verify block at any offset.
//
// attend:          causal attention over a static KV cache, one (row, query, head) at a time.
// quantize_rows:   per-row 8-bit activation scales and the integer rows fed to fbgemm (with the sentinel).
// combine_rows:    fbgemm's output back to floats: row scale, bias.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
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

}  // namespace

// q: [B, K, H, D] float32 (RoPE applied); keys, values: [B, KVH, C, D] float32 caches already
// holding the K new positions; starts: [B] positions of each row's first new token.
// Returns [B, K, H * D].
torch::Tensor attend(torch::Tensor q, torch::Tensor keys, torch::Tensor values, std::vector<int64_t> starts,
                     double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && keys.dtype() == torch::kFloat32 && values.dtype() == torch::kFloat32);
  q = q.contiguous();
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "the caches must be contiguous");
  const int64_t batch = q.size(0), num_new = q.size(1), heads = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(static_cast<int64_t>(starts.size()) == batch);
  auto out = torch::empty({batch, num_new, heads * head_dim}, q.options());
  const float* q_data = q.data_ptr<float>();
  const float* k_data = keys.data_ptr<float>();
  const float* v_data = values.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const float scale_f = static_cast<float>(scale);

  at::parallel_for(0, batch * num_new * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights;
    std::vector<float> accumulator(head_dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % heads, i = (task / heads) % num_new, b = task / (heads * num_new);
      const int64_t length = starts[b] + i + 1;
      const int64_t g = h / group;
      const float* query = q_data + ((b * num_new + i) * heads + h) * head_dim;
      const float* key = k_data + (b * kv_heads + g) * capacity * head_dim;
      const float* value = v_data + (b * kv_heads + g) * capacity * head_dim;
      weights.resize(length);
      float max_score = -INFINITY;
      for (int64_t j = 0; j < length; ++j) {
        weights[j] = dot(query, key + j * head_dim, head_dim) * scale_f;
        max_score = std::max(max_score, weights[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < length; ++j) {
        weights[j] = std::exp(weights[j] - max_score);
        total += weights[j];
      }
      std::fill(accumulator.begin(), accumulator.end(), 0.0f);
      for (int64_t j = 0; j < length; ++j) {
        const float w = weights[j];
        const float* v = value + j * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) accumulator[d] += w * v[d];
      }
      float* o = out_data + (b * num_new + i) * heads * head_dim + h * head_dim;
      const float inverse = 1.0f / total;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = accumulator[d] * inverse;
    }
  });
  return out;
}

// x: [M, K] float32. Returns (rows, row_scale): rows [M + 1, K] holds round(x / s) in [-127, 127],
// the last row being the sentinel (-128, 127, 0, ...); row_scale [M, 1] = max(max|x|, 1e-30) / 127.
// The same arithmetic as the PyTorch path in linear.py.
std::vector<torch::Tensor> quantize_rows(torch::Tensor x) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2);
  x = x.contiguous();
  const int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(width >= 2);
  constexpr float kLevels = 127.0f;
  auto out = torch::empty({rows + 1, width}, x.options());
  auto scale = torch::empty({rows, 1}, x.options());
  const float* x_data = x.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  float* scale_data = scale.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x_data + r * width;
      float amax = 0.0f;
      for (int64_t k = 0; k < width; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float s = std::max(amax, 1e-30f) / kLevels;
      scale_data[r] = s;
      float* dst = out_data + r * width;
      for (int64_t k = 0; k < width; ++k) dst[k] = std::min(std::max(std::nearbyint(row[k] / s), -kLevels), kLevels);
    }
  });
  float* sentinel = out_data + rows * width;
  std::fill(sentinel, sentinel + width, 0.0f);
  sentinel[0] = -128.0f;
  sentinel[1] = 127.0f;
  return {out, scale};
}

// out: [M + 1, N] fbgemm output (the sentinel's row last); row_scale [M, 1]; bias [N] or empty.
// Returns y [M, N] = out * s + bias, operation by operation as in the PyTorch path.
torch::Tensor combine_rows(torch::Tensor out, torch::Tensor row_scale, torch::Tensor bias) {
  TORCH_CHECK(out.dtype() == torch::kFloat32 && out.is_contiguous());
  const int64_t rows = row_scale.size(0), width = out.size(1);
  auto y = torch::empty({rows, width}, out.options());
  const float* o = out.data_ptr<float>();
  row_scale = row_scale.contiguous();
  const float* s = row_scale.data_ptr<float>();
  const bool has_bias = bias.numel() > 0;
  if (has_bias) bias = bias.contiguous();
  const float* b = has_bias ? bias.data_ptr<float>() : nullptr;
  float* y_data = y.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = o + r * width;
      float* dst = y_data + r * width;
      for (int64_t n = 0; n < width; ++n) {
        const float v = src[n] * s[r];
        dst[n] = has_bias ? v + b[n] : v;
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "bit-stable causal attention over a static cache");
  m.def("quantize_rows", &quantize_rows, "per-row activation quantization for the int8 GEMM");
  m.def("combine_rows", &combine_rows, "the int8 GEMM's output back to floats");
}
