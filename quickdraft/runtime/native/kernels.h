// The kernels of kernels.cpp, for the other sources of the extension (layers.cpp). Shapes are in kernels.cpp.
#pragma once

#include <torch/extension.h>

#include <vector>

torch::Tensor attend(torch::Tensor q, std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                     int64_t layer, std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                     std::vector<int64_t> row_index, double scale, int64_t window, double softcap);
std::vector<torch::Tensor> quantize_rows(torch::Tensor x, int64_t passes);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor combine_rows(torch::Tensor out, torch::Tensor row_scale, torch::Tensor bias, int64_t passes);
std::vector<torch::Tensor> route(torch::Tensor x, torch::Tensor router, int64_t top_k, bool normalize);
torch::Tensor sigmoid_gate(torch::Tensor x, torch::Tensor gate);
std::vector<torch::Tensor> rms_norm_quantize(torch::Tensor x, torch::Tensor weight, double eps, int64_t passes);
torch::Tensor qkv_rope_cache(torch::Tensor out, torch::Tensor row_scale, torch::Tensor bias, torch::Tensor q_norm,
                             torch::Tensor k_norm, double eps, torch::Tensor cos, torch::Tensor sin,
                             std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values, int64_t layer,
                             std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                             std::vector<int64_t> row_index, int64_t heads);
torch::Tensor combine_residual(torch::Tensor out, torch::Tensor row_scale, torch::Tensor bias, torch::Tensor norm,
                               double eps, double scale, torch::Tensor residual);
std::vector<torch::Tensor> gated_quantize(torch::Tensor out, torch::Tensor row_scale, int64_t activation,
                                          int64_t passes);
void int8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scale, torch::Tensor out, int64_t column);
void q4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor sub_scale, torch::Tensor sub_min, torch::Tensor d,
               torch::Tensor dmin, torch::Tensor out, int64_t column);
void q5_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor high, torch::Tensor sub_scale, torch::Tensor sub_min,
               torch::Tensor d, torch::Tensor dmin, torch::Tensor out, int64_t column);
void q8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d, torch::Tensor out, int64_t column);
void q8m_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d, torch::Tensor mins, torch::Tensor out,
                int64_t column);
void q6_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor high, torch::Tensor sub_scale, torch::Tensor d,
               torch::Tensor out, int64_t column);
void q4t_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor table, torch::Tensor d, torch::Tensor out,
                int64_t column);
void q4tm_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor table, torch::Tensor d, torch::Tensor mins,
                 torch::Tensor out, int64_t column);
void iq4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor sub_scale, torch::Tensor d, torch::Tensor out,
                int64_t column);

void register_layers(pybind11::module& m);  // layers.cpp
