// A decoder's layers in one call: what Decoder._layer does with PyTorch operations, kernel by kernel (kernels.cpp),
// without going back to Python between them (the same kernels, so the same bits, as calling each from Python).
// module.cpp binds these structs; the kernels they call are kernels.cpp's.
#pragma once

#include "kernels.h"

#include <utility>

namespace qd {

// A range of a linear layer's output rows in one packed format (parts.py's WeightPart): kind 0 int8
// (codes, scale), 1 q4 (codes, sub_scale, sub_min, d, dmin), 2 q6 (codes, high, sub_scale, d), 3 q5 (codes, high,
// sub_scale, sub_min, d, dmin), 4 q8 (codes, d), 5 q8m (codes, d, mins), 6 iq4 (codes, table, sub_scale, d), 7 q4t
// (codes, table, d), 8 q4tm (codes, table, d, mins), 9 q2 (codes, scales, d, dmin), 10 iq4h (codes, table, sub_scale,
// d); its outputs start at `column` of the padded output.
struct Part {
  int64_t kind, column;
  std::vector<at::Tensor> tensors;

  Part(int64_t kind, int64_t column, std::vector<at::Tensor> tensors)
      : kind(kind), column(column), tensors(std::move(tensors)) {
    TORCH_CHECK((kind == 0 && this->tensors.size() == 2) || (kind == 1 && this->tensors.size() == 5) ||
                    (kind == 2 && this->tensors.size() == 4) || (kind == 3 && this->tensors.size() == 6) ||
                    (kind == 4 && this->tensors.size() == 2) || (kind == 5 && this->tensors.size() == 3) ||
                    (kind == 6 && this->tensors.size() == 4) || (kind == 7 && this->tensors.size() == 3) ||
                    (kind == 8 && this->tensors.size() == 4) || (kind == 9 && this->tensors.size() == 4) ||
                    (kind == 10 && this->tensors.size() == 4),
                "a weight part is kind 0 (int8: codes, scale), 1 (q4: codes, sub_scale, sub_min, d, dmin), 2 (q6: "
                "codes, high, sub_scale, d), 3 (q5: codes, high, sub_scale, sub_min, d, dmin), 4 (q8: codes, d), 5 "
                "(q8m: codes, d, mins), 6 (iq4: codes, table, sub_scale, d), 7 (q4t: codes, table, d), 8 (q4tm: codes, "
                "table, d, mins), 9 (q2: codes, scales, d, dmin) or 10 (iq4h: codes, table, sub_scale, d)");
  }
};

// linear.py's QuantizedLinear: parts side by side, the real columns when the parts are padded, the bias.
struct Linear {
  std::vector<Part> parts;
  int64_t padded_width = 0;
  at::Tensor real_columns, bias;  // real_columns empty: no padding; bias empty: none

  // int8 rows [M, K] -> [M, N] before the row scale and the bias (QuantizedLinear.matmul_rows).
  at::Tensor matmul(const at::Tensor& rows) const {
    auto out = at::empty({rows.size(0), padded_width}, at::kFloat);
    for (const auto& part : parts) {
      const auto& t = part.tensors;
      if (part.kind == 0) int8_matmul(rows, t[0], t[1], out, part.column);
      else if (part.kind == 1) q4_matmul(rows, t[0], t[1], t[2], t[3], t[4], out, part.column);
      else if (part.kind == 2) q6_matmul(rows, t[0], t[1], t[2], t[3], out, part.column);
      else if (part.kind == 3) q5_matmul(rows, t[0], t[1], t[2], t[3], t[4], t[5], out, part.column);
      else if (part.kind == 4) q8_matmul(rows, t[0], t[1], out, part.column);
      else if (part.kind == 5) q8m_matmul(rows, t[0], t[1], t[2], out, part.column);
      else if (part.kind == 6) iq4_matmul(rows, t[0], t[1], t[2], t[3], out, part.column);
      else if (part.kind == 7) q4t_matmul(rows, t[0], t[1], t[2], out, part.column);
      else if (part.kind == 8) q4tm_matmul(rows, t[0], t[1], t[2], t[3], out, part.column);
      else if (part.kind == 9) q2_matmul(rows, t[0], t[1], t[2], t[3], out, part.column);
      else iq4h_matmul(rows, t[0], t[1], t[2], t[3], out, part.column);
    }
    return real_columns.numel() == 0 ? out : out.index_select(1, real_columns).contiguous();
  }
};

// experts.py's Experts: a router [E, H] float32 and each expert's gate/up and down layers (none: a dense layer); with
// a shared expert's gate [H] (empty: none), the shared expert's layers follow the E routed experts'.
struct Experts {
  at::Tensor router;
  std::vector<Linear> gate_up, down;
  int64_t top_k = 0;
  bool normalize = false;
  at::Tensor shared_gate;

  bool empty() const { return gate_up.empty(); }

  // normed [R, H] float32 (the MLP's input) -> the mixture's output [R, H] (experts.py's rules): each expert's rows
  // gathered in row order through its gated MLP, each row's output weight × expert output added in expert order,
  // then the shared expert's over every row.
  at::Tensor forward(const at::Tensor& normed, int64_t activation, int64_t passes) const {
    const int64_t rows = normed.size(0), width = normed.size(1), experts = router.size(0);
    const auto routed = route(normed, router, top_k, normalize);  // chosen [R, k] int64, weights [R, k]
    const auto quantized = quantize_rows(normed, passes);  // rows [P·R, H] int8, row_scale [P·R, 1]
    const int64_t* chosen = routed[0].data_ptr<int64_t>();
    const float* weights = routed[1].data_ptr<float>();
    auto out = at::zeros({rows, width}, normed.options());
    float* out_data = out.data_ptr<float>();
    std::vector<int64_t> members;  // the expert's rows, ascending
    std::vector<float> member_weights;
    auto add = [&](int64_t expert) {  // out[r] += weight × expert's output, for each member row r
      const int64_t count = static_cast<int64_t>(members.size());
      std::vector<int64_t> gather;  // each pass's copy of the rows: pass p's row r is p·R + r
      for (int64_t p = 0; p < passes; ++p) {
        for (int64_t r : members) gather.push_back(p * rows + r);
      }
      const auto index = at::tensor(gather, at::kLong);
      const auto activated = gated_quantize(gate_up[expert].matmul(quantized[0].index_select(0, index)),
                                            quantized[1].index_select(0, index), activation, passes);
      const auto y = combine_rows(down[expert].matmul(activated[0]), activated[1], down[expert].bias, passes);
      const float* y_data = y.data_ptr<float>();
      for (int64_t i = 0; i < count; ++i) {
        float* row = out_data + members[i] * width;
        const float w = member_weights[i];
        for (int64_t n = 0; n < width; ++n) row[n] = row[n] + w * y_data[i * width + n];
      }
    };
    for (int64_t expert = 0; expert < experts; ++expert) {
      members.clear();
      member_weights.clear();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t rank = 0; rank < top_k; ++rank) {
          if (chosen[r * top_k + rank] != expert) continue;
          members.push_back(r);
          member_weights.push_back(weights[r * top_k + rank]);
        }
      }
      if (!members.empty()) add(expert);
    }
    if (shared_gate.defined() && shared_gate.numel() > 0 && rows > 0) {
      const auto gate = sigmoid_gate(normed, shared_gate);  // [R]
      members.resize(rows);
      for (int64_t r = 0; r < rows; ++r) members[r] = r;
      member_weights.assign(gate.data_ptr<float>(), gate.data_ptr<float>() + rows);
      add(experts);
    }
    return out;
  }
};

// model.py's DecoderLayer: norms (q_norm, k_norm, attention_out_norm, mlp_out_norm empty where the model has none),
// linear layers, its RoPE tables [C, D] and its sliding window (0: none).
struct Layer {
  at::Tensor input_norm, post_norm, q_norm, k_norm, attention_out_norm, mlp_out_norm;
  Linear qkv, out, gate_up, down;
  at::Tensor cos, sin;
  int64_t window;
  Experts experts;  // empty: the gated MLP of gate_up and down
};

class Layers {
 public:
  Layers(std::vector<Layer> layers, int64_t heads, double eps, double attention_scale, double attention_softcap,
         double residual_scale, int64_t activation, int64_t passes)
      : layers_(std::move(layers)), heads_(heads), eps_(eps), scale_(attention_scale), softcap_(attention_softcap),
        residual_scale_(residual_scale), activation_(activation), passes_(passes) {}

  // x [R, H] through the first `count` layers (model.py's _decode_rows; the same arguments). Returns the hidden
  // states [R, H] after each layer count in `capture` (ascending, 1..count), then after the last layer: keeping a
  // reference to a tensor each layer makes anyway, so capturing costs nothing.
  std::vector<at::Tensor> forward(at::Tensor x, const std::vector<at::Tensor>& keys,
                                  const std::vector<at::Tensor>& values, const std::vector<int64_t>& row_slot,
                                  const std::vector<int64_t>& row_position, const std::vector<int64_t>& row_index,
                                  int64_t count,
                                  const std::vector<int64_t>& capture) const {
    TORCH_CHECK(count >= 0 && count <= static_cast<int64_t>(layers_.size()));
    std::vector<at::Tensor> captured;
    size_t next = 0;
    for (int64_t index = 0; index < count; ++index) {
      const Layer& layer = layers_[index];
      auto normed = rms_norm_quantize(x, layer.input_norm, eps_, passes_);  // rows [P·R, H] int8, row_scale [P·R, 1]
      auto q = qkv_rope_cache(layer.qkv.matmul(normed[0]), normed[1], layer.qkv.bias, layer.q_norm, layer.k_norm,
                              eps_, layer.cos, layer.sin, keys, values, index, row_slot, row_position,
                              row_index, heads_);  // [R, heads, D]; k, v cached
      auto attended =
          quantize_rows(attend(q, keys, values, index, row_slot, row_position, row_index, scale_, layer.window, softcap_),
                        passes_);
      x = combine_residual(layer.out.matmul(attended[0]), attended[1], layer.out.bias, layer.attention_out_norm, eps_,
                           residual_scale_, x);  // [R, H]
      if (!layer.experts.empty()) {
        const auto mixture = layer.experts.forward(rms_norm(x, layer.post_norm, eps_), activation_, passes_);
        x = combine_residual(mixture, at::ones({mixture.size(0), 1}), at::empty({0}), layer.mlp_out_norm, eps_,
                             residual_scale_, x);  // a scale of 1 keeps the mixture's bits
      } else {
        normed = rms_norm_quantize(x, layer.post_norm, eps_, passes_);
        auto activated = gated_quantize(layer.gate_up.matmul(normed[0]), normed[1], activation_, passes_);  // [P·R, I]
        x = combine_residual(layer.down.matmul(activated[0]), activated[1], layer.down.bias, layer.mlp_out_norm, eps_,
                             residual_scale_, x);
      }
      if (next < capture.size() && capture[next] == index + 1) {
        captured.push_back(x);  // combine_residual wrote a new tensor: later layers leave it alone
        ++next;
      }
    }
    TORCH_CHECK(next == capture.size(), "capture names ascending layer counts in 1..count");
    captured.push_back(x);
    return captured;
  }

 private:
  std::vector<Layer> layers_;
  int64_t heads_;
  double eps_, scale_, softcap_, residual_scale_;
  int64_t activation_, passes_;  // passes: DecoderConfig.activation_passes
};

}  // namespace qd
