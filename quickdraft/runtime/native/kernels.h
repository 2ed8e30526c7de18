// The kernels of kernels.cpp, for the layers (layers.h) and the Python module (module.cpp). Shapes are in kernels.cpp.
// ATen's headers only: torch/extension.h's would add more compile time than the kernels take.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <string>
#include <vector>

at::Tensor attend(at::Tensor q, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                  int64_t layer, std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                  std::vector<int64_t> row_index, double scale, int64_t window, double softcap);
std::vector<at::Tensor> quantize_rows(at::Tensor x, int64_t passes);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor combine_rows(at::Tensor out, at::Tensor row_scale, at::Tensor bias, int64_t passes);
std::vector<at::Tensor> route(at::Tensor x, at::Tensor router, int64_t top_k, bool normalize);
at::Tensor sigmoid_gate(at::Tensor x, at::Tensor gate);
std::vector<at::Tensor> rms_norm_quantize(at::Tensor x, at::Tensor weight, double eps, int64_t passes);
at::Tensor qkv_rope_cache(at::Tensor out, at::Tensor row_scale, at::Tensor bias, at::Tensor q_norm,
                          at::Tensor k_norm, double eps, at::Tensor cos, at::Tensor sin,
                          std::vector<at::Tensor> keys, std::vector<at::Tensor> values, int64_t layer,
                          std::vector<int64_t> row_slot, std::vector<int64_t> row_position,
                          std::vector<int64_t> row_index, int64_t heads);
at::Tensor combine_residual(at::Tensor out, at::Tensor row_scale, at::Tensor bias, at::Tensor norm,
                            double eps, double scale, at::Tensor residual);
std::vector<at::Tensor> gated_quantize(at::Tensor out, at::Tensor row_scale, int64_t activation,
                                       int64_t passes);
void int8_matmul(at::Tensor x, at::Tensor codes, at::Tensor scale, at::Tensor out, int64_t column);
void q4_matmul(at::Tensor x, at::Tensor codes, at::Tensor sub_scale, at::Tensor sub_min, at::Tensor d,
               at::Tensor dmin, at::Tensor out, int64_t column);
void q5_matmul(at::Tensor x, at::Tensor codes, at::Tensor high, at::Tensor sub_scale, at::Tensor sub_min,
               at::Tensor d, at::Tensor dmin, at::Tensor out, int64_t column);
void q8_matmul(at::Tensor x, at::Tensor codes, at::Tensor d, at::Tensor out, int64_t column);
void q8m_matmul(at::Tensor x, at::Tensor codes, at::Tensor d, at::Tensor mins, at::Tensor out,
                int64_t column);
void q6_matmul(at::Tensor x, at::Tensor codes, at::Tensor high, at::Tensor sub_scale, at::Tensor d,
               at::Tensor out, int64_t column);
void q4t_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor d, at::Tensor out,
                int64_t column);
void q4tm_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor d, at::Tensor mins,
                 at::Tensor out, int64_t column);
void q2_matmul(at::Tensor x, at::Tensor codes, at::Tensor scales, at::Tensor d, at::Tensor dmin, at::Tensor out,
               int64_t column);
void iq4_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor sub_scale, at::Tensor d, at::Tensor out,
                int64_t column);
void iq4h_matmul(at::Tensor x, at::Tensor codes, at::Tensor table, at::Tensor sub_scale, at::Tensor d, at::Tensor out,
                 int64_t column);
std::string isa();  // the instruction sets the GEMMs and attention were compiled for
