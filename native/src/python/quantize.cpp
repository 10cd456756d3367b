#include "python/quantize.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <vector>

#include "kernels/lattice.hpp"
#include "kernels/pack.hpp"
#include "kernels/scalar.hpp"
#include "python/arrays.hpp"

namespace kt {

namespace {

// Weights [..., K] float32 -> an i-quant's portable layout: the GGUF blocks less their d (uint8
// [..., Kp / 256 * (block bytes - 2)]) and the d (float16 bits [..., Kp / 256]), K padded to 256.
py::tuple quantize_lattice_weights(const py::array& w, Element method) {
  if (w.ndim() < 1) throw std::invalid_argument("weights need at least one dimension");
  if (!(w.flags() & py::array::c_style)) throw std::invalid_argument("weights must be C-contiguous");
  const DType dtype = dtype_of(w, "weights");
  const py::ssize_t K = w.shape(w.ndim() - 1), rows = K ? w.size() / K : 0;
  const py::ssize_t Kp = (K + kQ4kSuperBlock - 1) / kQ4kSuperBlock * kQ4kSuperBlock, supers = Kp / kQ4kSuperBlock;
  const py::ssize_t bytes = supers * (lattice_block_bytes(method) - 2);
  std::vector<py::ssize_t> q_shape(w.shape(), w.shape() + w.ndim()), d_shape = q_shape;
  q_shape.back() = bytes, d_shape.back() = supers;
  py::array_t<uint8_t> codes(q_shape);
  py::array_t<uint16_t> d(d_shape);
  const auto* src = static_cast<const char*>(w.data());
  const std::size_t elem = dtype == DType::f32 ? 4 : 2;
  int64_t bad_row = -1;
  {
    py::gil_scoped_release release;
    std::vector<float> row(Kp, 0.f);
    for (py::ssize_t r = 0; r < rows && bad_row < 0; ++r) {
      for (py::ssize_t k = 0; k < K; ++k)
        row[k] = dtype == DType::f32 ? reinterpret_cast<const float*>(src + r * K * elem)[k]
                                     : bf16_to_f32(reinterpret_cast<const uint16_t*>(src + r * K * elem)[k]);
      if (!quantize_lattice_row(method, row.data(), static_cast<int>(Kp), codes.mutable_data() + r * bytes,
                                d.mutable_data() + r * supers))
        bad_row = r;
    }
  }
  if (bad_row >= 0) throw std::invalid_argument("weights contain NaN or infinite values (row " + std::to_string(bad_row) + ")");
  return py::make_tuple(codes, d);
}

// Weights [..., K] float32 -> nvfp4's portable layout (K padded to 16): E2M1 code pairs (uint8
// [..., Kp / 2], even k low), a UE4M3 scale code per 16 (uint8 [..., Kp / 16]) and each row's
// tensor scale (float32 [...]): each row quantized as ModelOpt quantizes a tensor.
py::tuple quantize_nvfp4_weights(const py::array& w) {
  if (w.ndim() < 1) throw std::invalid_argument("weights need at least one dimension");
  if (!(w.flags() & py::array::c_style)) throw std::invalid_argument("weights must be C-contiguous");
  const DType dtype = dtype_of(w, "weights");
  const py::ssize_t K = w.shape(w.ndim() - 1), rows = K ? w.size() / K : 0;
  const py::ssize_t Kp = (K + kNvfp4Group - 1) / kNvfp4Group * kNvfp4Group;
  std::vector<py::ssize_t> q_shape(w.shape(), w.shape() + w.ndim()), s_shape = q_shape;
  q_shape.back() = Kp / 2, s_shape.back() = Kp / kNvfp4Group;
  py::array_t<uint8_t> codes(q_shape), scales(s_shape);
  py::array_t<float> global(std::vector<py::ssize_t>(q_shape.begin(), q_shape.end() - 1));
  const auto* src = static_cast<const char*>(w.data());
  const std::size_t elem = dtype == DType::f32 ? 4 : 2;
  int64_t bad_row = -1;
  {
    py::gil_scoped_release release;
    std::vector<float> row(Kp, 0.f);
    std::vector<int8_t> q(Kp);
    for (py::ssize_t r = 0; r < rows && bad_row < 0; ++r) {
      for (py::ssize_t k = 0; k < K; ++k)
        row[k] = dtype == DType::f32 ? reinterpret_cast<const float*>(src + r * K * elem)[k]
                                     : bf16_to_f32(reinterpret_cast<const uint16_t*>(src + r * K * elem)[k]);
      if (!quantize_nvfp4_row(row.data(), static_cast<int>(Kp), q.data(), scales.mutable_data() + r * (Kp / kNvfp4Group),
                              global.mutable_data() + r))
        bad_row = r;
      uint8_t* bytes = codes.mutable_data() + r * (Kp / 2);
      for (py::ssize_t j = 0; j < Kp / 2; ++j) bytes[j] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
    }
  }
  if (bad_row >= 0) throw std::invalid_argument("weights contain NaN or infinite values (row " + std::to_string(bad_row) + ")");
  return py::make_tuple(codes, scales, global);
}

// Weights [..., K] float32 -> mxfp8's portable layout: E4M3 codes (uint8 [..., K]) and an E8M0 code
// per 32 values (uint8 [..., ceil(K / 32)]), as MoE.load_weights packs them (kernels/pack.cpp).
py::tuple quantize_mxfp8_weights(const py::array& w, int group) {
  if (w.ndim() < 1) throw std::invalid_argument("weights need at least one dimension");
  if (!(w.flags() & py::array::c_style)) throw std::invalid_argument("weights must be C-contiguous");
  const DType dtype = dtype_of(w, "weights");
  const py::ssize_t K = w.shape(w.ndim() - 1), rows = K ? w.size() / K : 0, groups = (K + group - 1) / group;
  std::vector<py::ssize_t> q_shape(w.shape(), w.shape() + w.ndim()), s_shape = q_shape;
  s_shape.back() = groups;
  py::array_t<uint8_t> codes(q_shape), scales(s_shape);
  const auto* src = static_cast<const char*>(w.data());
  int64_t bad_row = -1;
  {
    py::gil_scoped_release release;
    std::vector<const void*> one(1);
    for (py::ssize_t r = 0; r < rows && bad_row < 0; ++r) {
      one[0] = src + r * K * (dtype == DType::f32 ? 4 : 2);
      for (py::ssize_t k = 0; k < K && bad_row < 0; ++k)
        if (!std::isfinite(dtype == DType::f32 ? static_cast<const float*>(one[0])[k]
                                               : bf16_to_f32(static_cast<const uint16_t*>(one[0])[k])))
          bad_row = r;
      PackedMatrix packed;  // one row, packed as load_weights packs it, read back in the portable order
      pack_rows(packed, Element::mxfp8, group, one, dtype, static_cast<int>(K));
      for (py::ssize_t k = 0; k < K; ++k) codes.mutable_data()[r * K + k] = packed.values[k * 16];
      for (py::ssize_t g = 0; g < groups; ++g) scales.mutable_data()[r * groups + g] = packed.group_e8m0[g * 16];
    }
  }
  if (bad_row >= 0) throw std::invalid_argument("weights contain NaN or infinite values (row " + std::to_string(bad_row) + ")");
  return py::make_tuple(codes, scales);
}

}  // namespace

// Weights [..., K] float32 -> the portable layout of ktforge.formats.quantize: int8 values and one
// float32 scale per row; int8g: int8 values and a bfloat16 scale (its uint16 bits) per group of
// K padded to the group; int4 (K padded to the group): q + 8 nibble pairs and a bfloat16 scale
// per group.
py::tuple quantize_weights(const py::array& w, const std::string& method_name, int group,
                           const std::optional<py::array_t<float, py::array::c_style>>& fp8_scale, int bn, int bk) {
  const Method format = parse_method(method_name);
  const Element method = element_of(format);
  if (method == Element::bf16) throw std::invalid_argument("bf16 weights are rounded, not quantized");
  if (method == Element::fp8)
    throw std::invalid_argument("fp8 weights are served from FP8 checkpoints as they are (or packed by load_weights), "
                                "not quantized to a portable layout");
  if (method == Element::int8h)
    throw std::invalid_argument("q8_0 serves GGUF Q8_0 tensors as they are (or packs floats in load_weights); "
                                "kt convert writes int8g, its bfloat16-scaled peer");
  if (lattice(method)) return quantize_lattice_weights(w, method);
  if (method == Element::nvfp4) return quantize_nvfp4_weights(w);
  if (method == Element::mxfp8) {
    if (!takes_group(format, group)) throw std::invalid_argument("group_size must be " + group_sizes_text(format));
    return quantize_mxfp8_weights(w, group);
  }
  if (k_quant(method) || iq4(method) || legacy(method) || floats(method)) {
    std::string ggml = method_name;  // the ggml type's name: q4_k -> Q4_K
    std::transform(ggml.begin(), ggml.end(), ggml.begin(), [](unsigned char c) { return std::toupper(c); });
    throw std::invalid_argument(method_name + " serves GGUF " + ggml +
                                " tensors as they are (or packs floats in load_weights); kt convert writes int4, "
                                "int8g, int8 or bf16");
  }
  if (method == Element::int4z)
    throw std::invalid_argument("int4z serves checkpoints' asymmetric INT4 as they are (or packs floats in "
                                "load_weights); kt convert writes int4, int8g, int8 or bf16");
  if (!takes_group(format, group)) throw std::invalid_argument("group_size must be " + group_sizes_text(format));
  if (w.ndim() < 1) throw std::invalid_argument("weights need at least one dimension");
  if (!(w.flags() & py::array::c_style)) throw std::invalid_argument("weights must be C-contiguous");
  // float32, bfloat16 as its uint16 bits, or FP8 E4M3 codes (uint8) with their block scales
  const bool fp8 = w.dtype().is(py::dtype::of<uint8_t>());
  const DType dtype = fp8 ? DType::f32 : dtype_of(w, "weights");
  if (fp8 != fp8_scale.has_value()) throw std::invalid_argument("FP8 (uint8) weights need their block scales, and only they");
  const py::ssize_t K = w.shape(w.ndim() - 1), rows = K ? w.size() / K : 0;
  const bool int4 = nibbles(method), int8_values = !int4;
  const int nibble_offset = method == Element::int4 ? 8 : 0;  // fp4's nibbles are its codes
  const py::ssize_t Kp = method == Element::int8 ? K : (K + group - 1) / group * group;
  const py::ssize_t groups = method == Element::int8 ? 1 : Kp / group;
  std::vector<py::ssize_t> q_shape(w.shape(), w.shape() + w.ndim()), s_shape(q_shape.begin(), q_shape.end() - 1);
  q_shape.back() = int8_values ? K : Kp / 2;
  if (grouped(method)) s_shape.push_back(groups);
  py::array q = int8_values ? py::array(py::array_t<int8_t>(q_shape)) : py::array(py::array_t<uint8_t>(q_shape));
  py::array_t<float> scales(s_shape);  // grouped: narrowed to bf16 bits (exact) on return
  const auto* src = static_cast<const char*>(w.data());
  const std::size_t elem = fp8 ? 1 : dtype == DType::f32 ? 4 : 2;
  const float* block_scales = nullptr;
  py::ssize_t gk = 0;
  if (fp8) {
    const auto& sc = *fp8_scale;
    const py::ssize_t N = w.ndim() >= 2 ? w.shape(w.ndim() - 2) : 1;
    gk = (K + bk - 1) / bk;
    if (bn <= 0 || bk <= 0 || sc.ndim() != 2 || sc.shape(0) != (N + bn - 1) / bn || sc.shape(1) != gk || rows != N)
      throw std::invalid_argument("FP8 block scales do not match the weights' [N, K] blocks");
    block_scales = sc.data();
  }
  auto* q_out = static_cast<char*>(q.mutable_data());
  float* s_out = scales.mutable_data();
  const py::ssize_t q_row = q_shape.back();
  int64_t bad_row = -1;
  {
    py::gil_scoped_release release;
    std::vector<float> row(Kp, 0.f);
    std::vector<int8_t> values(Kp);
    for (py::ssize_t r = 0; r < rows && bad_row < 0; ++r) {
      // float32 rows of int8 (and of int4 with K a whole number of groups) are used in place
      const float* in = reinterpret_cast<const float*>(src + r * K * elem);
      if (fp8) {  // decoded and scaled here: the float32 matrix is never materialised
        if (!decode_fp8_row(reinterpret_cast<const uint8_t*>(src + r * K), K, block_scales + (r / bn) * gk, bk, row.data()))
          bad_row = r;
        in = row.data();
      } else if (dtype == DType::bf16) {
        const auto* bits = reinterpret_cast<const uint16_t*>(src + r * K * elem);
        for (py::ssize_t k = 0; k < K; ++k) row[k] = bf16_to_f32(bits[k]);
        in = row.data();
      } else if (Kp != K) {
        std::copy(in, in + K, row.begin());
        in = row.data();
      }
      // int8g's row is quantized over Kp (whole groups) and keeps its first K values
      int8_t* q_dst = method == Element::int8 ? reinterpret_cast<int8_t*>(q_out) + r * q_row : values.data();
      if (!quantize_weight_row(method, group, in, static_cast<int>(Kp), q_dst, s_out + r * groups) && bad_row < 0)
        bad_row = r;
      if (method == Element::int8g) std::copy(values.begin(), values.begin() + K, reinterpret_cast<int8_t*>(q_out) + r * q_row);
      if (int4) {
        auto* bytes = reinterpret_cast<uint8_t*>(q_out) + r * q_row;
        for (py::ssize_t j = 0; j < q_row; ++j)
          bytes[j] = static_cast<uint8_t>((values[2 * j] + nibble_offset) | ((values[2 * j + 1] + nibble_offset) << 4));
      }
    }
  }
  if (bad_row >= 0) throw std::invalid_argument("weights contain NaN or infinite values (row " + std::to_string(bad_row) + ")");
  if (method == Element::int8) return py::make_tuple(q, scales);
  if (method == Element::fp4) {
    py::array_t<uint8_t> e8m0(s_shape);
    std::transform(scales.data(), scales.data() + scales.size(), e8m0.mutable_data(), f32_to_e8m0);
    return py::make_tuple(q, e8m0);
  }
  py::array_t<uint16_t> bits(s_shape);
  std::transform(scales.data(), scales.data() + scales.size(), bits.mutable_data(), f32_to_bf16);
  return py::make_tuple(q, bits);
}

// FP8 E4M3 weights [N, K] (as bytes) times their [ceil(N / bn), ceil(K / bk)] block scales.
py::array_t<float> dequantize_fp8(const py::array_t<uint8_t, py::array::c_style>& w,
                                  const py::array_t<float, py::array::c_style>& scale, int bn, int bk) {
  if (w.ndim() != 2 || scale.ndim() != 2 || bn <= 0 || bk <= 0)
    throw std::invalid_argument("dequantize_fp8 takes [N, K] weights, 2-D block scales and positive block sizes");
  const py::ssize_t N = w.shape(0), K = w.shape(1), gk = scale.shape(1);
  if (scale.shape(0) != (N + bn - 1) / bn || gk != (K + bk - 1) / bk)
    throw std::invalid_argument("block scales do not match the weights' blocks");
  py::array_t<float> out({N, K});
  const uint8_t* src = w.data();
  const float* s = scale.data();
  float* dst = out.mutable_data();
  py::ssize_t nan_row = -1;
  {
    py::gil_scoped_release release;
    for (py::ssize_t n = 0; n < N; ++n)
      if (!decode_fp8_row(src + n * K, K, s + (n / bn) * gk, bk, dst + n * K) && nan_row < 0) nan_row = n;
  }
  if (nan_row >= 0) throw std::invalid_argument("NaN in FP8 weights (row " + std::to_string(nan_row) + ")");
  return out;
}

}  // namespace kt
