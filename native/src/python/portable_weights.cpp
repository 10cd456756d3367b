// The portable layout's parts (ktforge.formats.quantize, what `kt convert` writes) as MoE.load_quantized
// passes them, checked where memory safety depends on them, as the layer packs them.
#include "python/portable_weights.hpp"

#include <algorithm>
#include <string>

#include "kernels/lattice.hpp"
#include "python/arrays.hpp"

namespace kt {
namespace {

// The super-block elements' portable parts (ktforge.formats.quantize): values uint8 [E, N, Kp /
// codes_per_byte] (two codes a byte in int4's order, or one), scales uint8 [E, N, Kp / 256,
// record_bytes] whose first `halves` fields are float16 (d; q4k's and q5k's d and dmin). Kp = K
// rounded up to 256.
struct SuperBlockParts {
  int codes_per_byte, bits, record_bytes, halves;
};
SuperBlockParts super_block_parts(Element e) {
  switch (e) {
    case Element::q5k: return {1, 5, kQ4kRowRecordBytes, 2};
    case Element::q6k: return {1, 6, kQ6kRowRecordBytes, 1};
    case Element::q3k: return {1, 3, kQ6kRowRecordBytes, 1};
    case Element::q2k: return {1, 2, kQ2kRowRecordBytes, 2};
    case Element::iq4xs: return {2, 4, kIq4xsRowRecordBytes, 1};
    default: return {2, 4, kQ4kRowRecordBytes, 2};  // q4k
  }
}
MoeLayer::QuantizedWeights super_block_weights(const MoeConfig& c, const py::array& values, const py::array& scales, py::ssize_t N,
                                               py::ssize_t K, const char* name, Method method) {
  const SuperBlockParts parts = super_block_parts(element_of(method));
  const py::ssize_t E = c.experts, supers = (K + kQ4kSuperBlock - 1) / kQ4kSuperBlock;
  const std::string scale_name = std::string(name) + "_scale", format = format_info(method).name;
  if (!values.dtype().is(py::dtype::of<uint8_t>()))
    throw std::invalid_argument(std::string(name) + (parts.codes_per_byte == 2 ? " must be uint8 (two 4-bit codes per byte)"
                                                      : " must be uint8 (one " + std::to_string(parts.bits) +
                                                            "-bit code per byte)"));
  if (!scales.dtype().is(py::dtype::of<uint8_t>()))
    throw std::invalid_argument(scale_name + " must be uint8 (" + format + "'s super-block records)");
  require(values, {E, N, supers * kQ4kSuperBlock / parts.codes_per_byte}, name);
  require(scales, {E, N, supers, parts.record_bytes}, scale_name.c_str());
  const auto* q = static_cast<const uint8_t*>(values.data());
  const int top = (1 << parts.bits) - 1;
  if (parts.codes_per_byte == 1 && std::any_of(q, q + values.size(), [top](uint8_t v) { return v > top; }))
    throw std::invalid_argument(std::string(name) + " holds codes above " + std::to_string(top) + " (" + format +
                                "'s are " + std::to_string(parts.bits) + "-bit)");
  const auto* r = static_cast<const uint8_t*>(scales.data());
  for (py::ssize_t i = 0; i < scales.size(); i += parts.record_bytes)
    for (int h = 0; h < parts.halves; ++h)
      if (((r[i + 2 * h + 1] >> 2) & 0x1F) == 0x1F)  // a float16 exponent of all ones: inf or NaN
        throw std::invalid_argument(scale_name + (parts.halves == 2 ? " holds a d or dmin that is not finite"
                                                                    : " holds a d that is not finite"));
  return {values.data(), values.shape(2), scales.data(), supers * parts.record_bytes};
}

// GGUF's i-quants (ktforge.formats.quantize): values uint8 [E, N, Kp / 256 * (block bytes - 2)],
// the file's blocks less their d, and the d, float16 (as uint16) [E, N, Kp / 256].
MoeLayer::QuantizedWeights lattice_weights(const MoeConfig& c, const py::array& values, const py::array& scales, py::ssize_t N,
                                           py::ssize_t K, const char* name, Method method) {
  const Element e = element_of(method);
  const py::ssize_t E = c.experts, supers = (K + kQ4kSuperBlock - 1) / kQ4kSuperBlock;
  const std::string scale_name = std::string(name) + "_scale", format = format_info(method).name;
  if (!values.dtype().is(py::dtype::of<uint8_t>()))
    throw std::invalid_argument(std::string(name) + " must be uint8 (" + format + "'s blocks, less their d)");
  if (!scales.dtype().is(py::dtype::of<uint16_t>()))
    throw std::invalid_argument(scale_name + " must be float16 (passed as uint16: the blocks' d)");
  require(values, {E, N, supers * (lattice_block_bytes(e) - 2)}, name);
  require(scales, {E, N, supers}, scale_name.c_str());
  const auto* d = static_cast<const uint16_t*>(scales.data());
  if (std::any_of(d, d + scales.size(), [](uint16_t v) { return (v & 0x7C00) == 0x7C00; }))
    throw std::invalid_argument(scale_name + " holds a d that is not finite");
  return {values.data(), values.shape(2), scales.data(), supers * 2};
}

// GGUF's Q4_0, Q4_1, Q5_0, Q5_1 (ktforge.formats.quantize): values uint8 [E, N, Kg / 2] (two
// codes a byte in int4's order; q50, q51: [E, N, Kg], one code a byte), scales float16 (as
// uint16) [E, N, Kg / 32] (q41, q51: [E, N, Kg / 32, 2], d and m).
MoeLayer::QuantizedWeights legacy_weights(const MoeConfig& c, const py::array& values, const py::array& scales, py::ssize_t N,
                                          py::ssize_t K, const char* name, Method method) {
  const Element e = element_of(method);
  const bool five = e == Element::q50 || e == Element::q51, mins = legacy_mins(e);
  const py::ssize_t E = c.experts, groups = (K + 31) / 32;
  const std::string scale_name = std::string(name) + "_scale";
  if (!values.dtype().is(py::dtype::of<uint8_t>()))
    throw std::invalid_argument(std::string(name) + (five ? " must be uint8 (one 5-bit code per byte)"
                                                           : " must be uint8 (two 4-bit codes per byte)"));
  if (!scales.dtype().is(py::dtype::of<uint16_t>()))
    throw std::invalid_argument(scale_name + " must be float16 (passed as uint16)");
  require(values, {E, N, groups * (five ? 32 : 16)}, name);
  if (mins)
    require(scales, {E, N, groups, 2}, scale_name.c_str());
  else
    require(scales, {E, N, groups}, scale_name.c_str());
  const auto* q = static_cast<const uint8_t*>(values.data());
  if (five && std::any_of(q, q + values.size(), [](uint8_t v) { return v > 31; }))
    throw std::invalid_argument(std::string(name) + " holds codes above 31 (" + format_info(method).name +
                                "'s are 5-bit)");
  const auto* h = static_cast<const uint16_t*>(scales.data());
  if (std::any_of(h, h + scales.size(), [](uint16_t v) { return (v & 0x7C00) == 0x7C00; }))
    throw std::invalid_argument(scale_name + (mins ? " holds a d or m that is not finite" : " holds a d that is not finite"));
  return {values.data(), values.shape(2), scales.data(), groups * 2 * (mins ? 2 : 1)};
}

}  // namespace

// int8: values int8 [rows..., K], scales float32 [rows...]; int8g: values int8 [rows..., K];
// int4: values uint8 [rows..., Kg / 2]; both with scales bfloat16 (as uint16); fp4: int4's
// values (E2M1 codes), scales uint8 (E8M0 codes)
// [rows..., Kg / group], Kg = K rounded up to the group. fp8: E4M3 codes uint8 [rows..., K],
// scales float32 [rows..., Kg / group] (a checkpoint's block or channel scales, one per row).
MoeLayer::QuantizedWeights portable_weights(const MoeConfig& c, const py::array& values, const py::array& scales, const py::object& zeros,
                                     py::ssize_t N, py::ssize_t K, const char* name) {
  const bool down = std::string(name) == "down";
  const Method method = c.method_of(down);
  const int group = c.group_of(down);
  const py::ssize_t E = c.experts;
  const std::string scale_name = std::string(name) + "_scale";
  const bool int4z = element_of(method) == Element::int4z;
  if (int4z == zeros.is_none())
    throw std::invalid_argument(int4z ? std::string(name) + " needs its zero points (int4z)"
                                      : std::string(name) + ": only int4z takes zero points");
  if (int4z) {
    const py::ssize_t groups = (K + group - 1) / group;
    const auto zero = zeros.cast<py::array>();
    if (!values.dtype().is(py::dtype::of<uint8_t>()))
      throw std::invalid_argument(std::string(name) + " must be uint8 (two 4-bit values per byte)");
    require(values, {E, N, groups * group / 2}, name);
    require(scales, {E, N, groups}, scale_name.c_str());
    require(zero, {E, N, groups}, (std::string(name) + "_zero").c_str());
    if (!scales.dtype().is(py::dtype::of<float>())) throw std::invalid_argument(scale_name + " must be float32");
    if (!zero.dtype().is(py::dtype::of<uint8_t>()))
      throw std::invalid_argument(std::string(name) + "_zero must be uint8 (zero points in [0, 15])");
    const auto* z = static_cast<const uint8_t*>(zero.data());
    if (std::any_of(z, z + zero.size(), [](uint8_t v) { return v > 15; }))
      throw std::invalid_argument(std::string(name) + "_zero holds zero points above 15");
    return {values.data(), values.shape(2), scales.data(), groups * 4, zero.data(), groups};
  }
  if (k_quant(element_of(method))) return super_block_weights(c, values, scales, N, K, name, method);
  if (lattice(element_of(method))) return lattice_weights(c, values, scales, N, K, name, method);
  if (legacy(element_of(method))) return legacy_weights(c, values, scales, N, K, name, method);
  if (element_of(method) == Element::bf16 || floats(element_of(method))) {  // values only (scale: unused)
    const Element e = element_of(method);  // bf16: a mixed layer's projection
    const bool f32 = e == Element::f32;
    if (!values.dtype().is(f32 ? py::dtype::of<float>() : py::dtype::of<uint16_t>()))
      throw std::invalid_argument(std::string(name) + (f32                     ? " must be float32"
                                                       : e == Element::f16 ? " must be float16 (passed as uint16)"
                                                                           : " must be bfloat16 (passed as uint16)"));
    require(values, {E, N, K}, name);
    if (e == Element::f16) {
      const auto* h = static_cast<const uint16_t*>(values.data());
      if (std::any_of(h, h + values.size(), [](uint16_t v) { return (v & 0x7C00) == 0x7C00; }))
        throw std::invalid_argument(std::string(name) + " holds values that are not finite");
    }
    return {values.data(), K * (f32 ? 4 : 2), values.data(), 0};
  }
  if (element_of(method) == Element::mxfp8) {  // E4M3 codes and an E8M0 code a group of 32
    const py::ssize_t groups = (K + group - 1) / group;
    if (!values.dtype().is(py::dtype::of<uint8_t>()))
      throw std::invalid_argument(std::string(name) + " must be uint8 (FP8 E4M3 codes)");
    if (!scales.dtype().is(py::dtype::of<uint8_t>())) throw std::invalid_argument(scale_name + " must be uint8 (E8M0 codes)");
    require(values, {E, N, K}, name);
    require(scales, {E, N, groups}, scale_name.c_str());
    return {values.data(), values.shape(2), scales.data(), groups};
  }
  if (element_of(method) == Element::fp8) {
    const py::ssize_t groups = (K + group - 1) / group;
    if (!values.dtype().is(py::dtype::of<uint8_t>()))
      throw std::invalid_argument(std::string(name) + " must be uint8 (FP8 E4M3 codes)");
    require(values, {E, N, K}, name);
    require(scales, {E, N, groups}, scale_name.c_str());
    if (!scales.dtype().is(py::dtype::of<float>())) throw std::invalid_argument(scale_name + " must be float32");
    return {values.data(), values.shape(2), scales.data(), groups * 4};
  }
  if (element_of(method) == Element::int8) {
    if (!values.dtype().is(py::dtype::of<int8_t>())) throw std::invalid_argument(std::string(name) + " must be int8");
    require(values, {E, N, K}, name);
    require(scales, {E, N}, scale_name.c_str());
    if (!scales.dtype().is(py::dtype::of<float>())) throw std::invalid_argument(scale_name + " must be float32");
    return {values.data(), values.shape(2), scales.data(), 4};
  } else {
    const py::ssize_t groups = (K + group - 1) / group;
    if (int8_groups(element_of(method))) {
      if (!values.dtype().is(py::dtype::of<int8_t>())) throw std::invalid_argument(std::string(name) + " must be int8");
      require(values, {E, N, K}, name);
    } else {
      if (!values.dtype().is(py::dtype::of<uint8_t>()))
        throw std::invalid_argument(std::string(name) + " must be uint8 (two 4-bit values per byte)");
      require(values, {E, N, groups * group / 2}, name);
    }
    require(scales, {E, N, groups}, scale_name.c_str());
    if (element_of(method) == Element::fp4 || element_of(method) == Element::nvfp4) {
      if (!scales.dtype().is(py::dtype::of<uint8_t>()))
        throw std::invalid_argument(scale_name + (element_of(method) == Element::fp4 ? " must be uint8 (E8M0 codes)"
                                                                                     : " must be uint8 (UE4M3 codes)"));
      return {values.data(), values.shape(2), scales.data(), scales.shape(2)};
    }
    if (!scales.dtype().is(py::dtype::of<uint16_t>()))
      throw std::invalid_argument(scale_name + (element_of(method) == Element::int8h || element_of(method) == Element::iq4nl
                                                    ? " must be float16 (passed as uint16)"
                                                                                       : " must be bfloat16 (passed as uint16)"));
    return {values.data(), values.shape(2), scales.data(), scales.shape(2) * 2};
  }
}

void attach_global_scales(const MoeConfig& c, const py::object (&globals)[3], MoeLayer::QuantizedWeights* const (&parts)[3],
                          std::vector<py::array_t<float, py::array::c_style>>& held) {
  const char* names[3] = {"gate", "up", "down"};
  for (int p = 0; p < 3; ++p) {
    const bool nvfp4 = element_of(c.method_of(p == 2)) == Element::nvfp4;
    const std::string part = std::string(names[p]) + "_global";
    if (nvfp4 == globals[p].is_none())
      throw std::invalid_argument(nvfp4 ? std::string(names[p]) + " needs its tensor scales (nvfp4: " + part + ")"
                                        : part + ": only nvfp4 takes tensor scales");
    if (!nvfp4) continue;
    const py::array array = globals[p].cast<py::array>();
    if (!array.dtype().is(py::dtype::of<float>())) throw std::invalid_argument(part + " must be float32");
    require(array, {c.experts, p == 2 ? c.hidden : c.intermediate}, part.c_str());
    held.push_back(array.cast<py::array_t<float, py::array::c_style>>());
    parts[p]->global_scales = held.back().data();
  }
}

}  // namespace kt
