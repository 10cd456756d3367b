// The extension's quantization entry points: float weights into the portable layouts of
// ktforge.formats.quantize, FP8 blocks back to float32.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace kt {
namespace py = pybind11;

py::tuple quantize_weights(const py::array& w, const std::string& method_name, int group,
                           const std::optional<py::array_t<float, py::array::c_style>>& fp8_scale, int bn, int bk);
py::array_t<float> dequantize_fp8(const py::array_t<uint8_t, py::array::c_style>& w,
                                  const py::array_t<float, py::array::c_style>& scale, int bn, int bk);

}  // namespace kt
