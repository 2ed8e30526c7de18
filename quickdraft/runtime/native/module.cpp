// The Python module: every kernel of kernels.cpp and the layers of layers.h, bound with pybind11. The only source
// that includes torch's Python headers, which take longer to compile than the kernels themselves (the two sources
// compile side by side).
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"
#include "layers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();  // a drafter's thread runs meanwhile
  m.def("int8_matmul", &int8_matmul, "int8 rows x 7-bit per-channel weights (exact integer sums)", nogil);
  m.def("q4_matmul", &q4_matmul, "int8 rows x 4-bit Q4_K-structured weights (exact integer group sums)", nogil);
  m.def("q5_matmul", &q5_matmul, "int8 rows x 5-bit Q5_K-structured weights (exact integer group sums)", nogil);
  m.def("q8_matmul", &q8_matmul, "int8 rows x 8-bit Q8_0-structured weights (exact integer group sums)", nogil);
  m.def("q8m_matmul", &q8m_matmul, "int8 rows x Q5_1-structured weights (q8 with a min per group)", nogil);
  m.def("q4t_matmul", &q4t_matmul, "int8 rows x Q4_0/IQ4_NL-structured weights (q8 with 4-bit table codes)", nogil);
  m.def("q4tm_matmul", &q4tm_matmul, "int8 rows x Q4_1-structured weights (q4t with a min per group)", nogil);
  m.def("q6_matmul", &q6_matmul, "int8 rows x 6-bit Q6_K-structured weights (exact integer sub-block sums)", nogil);
  m.def("q2_matmul", &q2_matmul, "int8 rows x 2-bit Q2_K-structured weights (exact integer superblock sums)", nogil);
  m.def("iq4_matmul", &iq4_matmul, "int8 rows x IQ4_XS-structured weights, codes into a table (exact integer superblock sums)", nogil);
  m.def("iq4h_matmul", &iq4h_matmul, "iq4_matmul with a sub-scale per 16 weights (IQ2_XS, IQ2_S, IQ1_M)", nogil);
  m.def("isa", &isa, "the instruction sets the GEMMs and attention were compiled for");
  m.def("attend", &attend, "bit-stable causal attention over a static cache (optionally a sliding window)", nogil);
  m.def("quantize_rows", &quantize_rows, "per-row activation quantization for the integer GEMMs", nogil);
  m.def("combine_rows", &combine_rows, "an integer GEMM's output back to floats", nogil);
  m.def("rms_norm", &rms_norm, "RMSNorm per row", nogil);
  m.def("rms_norm_quantize", &rms_norm_quantize, "RMSNorm, then per-row quantization", nogil);
  m.def("qkv_rope_cache", &qkv_rope_cache, "q/k/v projection output: q/k norms, RoPE, keys and values cached", nogil);
  m.def("combine_residual", &combine_residual, "residual + an integer GEMM's output (optionally normed)", nogil);
  m.def("gated_quantize", &gated_quantize, "act(gate) * up, then per-row quantization", nogil);
  m.def("route", &route, "a mixture of experts' choice per row: the top k of the router's softmax", nogil);
  m.def("sigmoid_gate", &sigmoid_gate, "a shared expert's weight per row: sigmoid(x · gate)", nogil);
  namespace py = pybind11;
  using namespace qd;
  py::class_<Part>(m, "Part").def(py::init<int64_t, int64_t, std::vector<at::Tensor>>());
  py::class_<Linear>(m, "Linear")
      .def(py::init<std::vector<Part>, int64_t, at::Tensor, at::Tensor>());
  py::class_<Experts>(m, "Experts")
      .def(py::init<>())
      .def(py::init<at::Tensor, std::vector<Linear>, std::vector<Linear>, int64_t, bool, at::Tensor>());
  py::class_<Layer>(m, "Layer")
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, Linear,
                    Linear, Linear, Linear, at::Tensor, at::Tensor, int64_t, Experts>());
  py::class_<Layers>(m, "Layers")
      .def(py::init<std::vector<Layer>, int64_t, double, double, double, double, int64_t, int64_t>())
      .def("forward", &Layers::forward, "x [R, H] through the first `count` layers: [captured..., last]",
           py::call_guard<py::gil_scoped_release>());
}
