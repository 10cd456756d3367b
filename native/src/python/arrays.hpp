// What the extension's entry points check of the numpy arrays they are given.
#pragma once

#include <pybind11/numpy.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/pack.hpp"

namespace kt {
namespace py = pybind11;

inline DType dtype_of(const py::array& a, const char* what) {
  if (a.dtype().is(py::dtype::of<float>())) return DType::f32;
  if (a.dtype().is(py::dtype::of<uint16_t>())) return DType::bf16;  // bfloat16 viewed as uint16
  throw std::invalid_argument(std::string(what) + " must be float32 or bfloat16 (passed as uint16)");
}

inline void require(const py::array& a, const std::vector<py::ssize_t>& shape, const char* what) {
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(what) + " must be C-contiguous");
  if (a.ndim() != static_cast<py::ssize_t>(shape.size()))
    throw std::invalid_argument(std::string(what) + " has the wrong number of dimensions");
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (a.shape(i) != shape[i]) throw std::invalid_argument(std::string(what) + " has the wrong shape");
}

}  // namespace kt
