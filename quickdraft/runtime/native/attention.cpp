// Causal attention over a static KV cache, one (row, query, head) at a time.
//
// Each output is computed by one thread with a fixed order of operations that depends only on
// the query's position p (it reads keys and values 0..p), never on how many other queries,
// heads or rows share the call. That makes the result bitwise identical for a token decoded
// alone and for the same token inside a verify block at any offset.
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("attend", &attend, "bit-stable causal attention over a static cache"); }
