// MoE.load_quantized's arrays (the portable layout of ktforge.formats.quantize) checked against a
// layer's formats and shapes, as the pointers MoeLayer::load_quantized packs from.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "moe/layer.hpp"

namespace kt {

namespace py = pybind11;

// One projection's values and scales (int4z: and zero points; else None), N rows of K, for
// `name` ("gate", "up" or "down") of a layer with config c. Throws std::invalid_argument naming
// the part that does not fit.
MoeLayer::QuantizedWeights portable_weights(const MoeConfig& c, const py::array& values, const py::array& scales,
                                            const py::object& zeros, py::ssize_t N, py::ssize_t K, const char* name);

// nvfp4's tensor scales, float32 [E, N] a projection (None for the other formats), set on parts;
// `held` keeps the arrays they point into until the layer has packed them.
void attach_global_scales(const MoeConfig& c, const py::object (&globals)[3], MoeLayer::QuantizedWeights* const (&parts)[3],
                          std::vector<py::array_t<float, py::array::c_style>>& held);

}  // namespace kt
