#include "kernels/pack.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>

#include "kernels/iq4.hpp"
#include "kernels/lattice.hpp"
#include "kernels/legacy.hpp"
#include "kernels/q6k.hpp"
#include "kernels/scalar.hpp"
#include "kernels/super_blocks.hpp"

namespace kt {
namespace {

float load(const void* src, DType dtype, int64_t index) {
  return dtype == DType::f32 ? static_cast<const float*>(src)[index]
                             : bf16_to_f32(static_cast<const uint16_t*>(src)[index]);
}

void shape(PackedMatrix& out, Element method, int group, int N, int K) {
  out.element = method, out.group = grouped(method) ? group : 0;
  out.N = N, out.K = K;
  out.Np = static_cast<int>(round_up(N, 16)), out.Kp = static_cast<int>(round_up(K, k_step(method, group)));
  if (out.values == nullptr || out.values == out.owned.data()) {
    out.owned.assign(out.value_bytes(), 0);
    out.values = out.owned.data();
  } else {
    std::memset(out.values, 0, out.value_bytes());  // the owner's memory, sized by value_bytes()
  }
  out.scale.clear();
  out.group_scale.clear();
  out.group_e8m0.clear();
  out.group_meta.clear();
  out.colsum.clear();
}

constexpr uint16_t kBf16One = 0x3F80, kF16One = 0x3C00;
constexpr uint8_t kE8m0One = 127, kUe4m3One = 0x38;

// Row n's int4z scales and zero points, one a group, into its blocks' records.
void put_int4z_meta(PackedMatrix& out, int n, const float* scales, const uint8_t* zeros) {
  const int G = out.groups();
  for (int g = 0; g < G; ++g) {
    uint8_t* record = out.group_meta.data() + (static_cast<std::size_t>(n / 16) * G + g) * kInt4zGroupBytes;
    std::memcpy(record + 4 * (n % 16), scales + g, 4);
    record[64 + n % 16] = zeros[g];
  }
}

void begin_quantized(PackedMatrix& out) {
  if (out.element == Element::int8) {
    out.scale.assign(out.Np, 1.f);
    out.colsum.assign(static_cast<std::size_t>(out.Np) * out.colsum_blocks(), 0);
  } else if (out.element == Element::fp8) {
    out.scale.assign(out.Np, 1.f);
    out.block_scale.assign(static_cast<std::size_t>(out.blocks()) * out.groups(), 1.f);
  } else if (out.element == Element::mxfp8) {
    out.group_e8m0.assign(static_cast<std::size_t>(out.Np) * out.groups(), kE8m0One);
  } else if (out.element == Element::fp4 || out.element == Element::nvfp4) {
    const bool nvfp4 = out.element == Element::nvfp4;
    out.group_e8m0.assign(static_cast<std::size_t>(out.Np) * out.groups(), nvfp4 ? kUe4m3One : kE8m0One);
    if (nvfp4) out.scale.assign(out.Np, 1.f);
  } else if (legacy(out.element)) {
    begin_legacy(out);
  } else if (k_quant(out.element) || lattice(out.element)) {
    out.group_meta.assign(static_cast<std::size_t>(out.blocks()) * out.meta_bytes_per_block(), 0);  // zero weights
  } else if (out.element == Element::int4z) {
    out.group_meta.assign(static_cast<std::size_t>(out.blocks()) * out.groups() * kInt4zGroupBytes, 0);
    const std::vector<float> ones(out.groups(), 1.f);
    const std::vector<uint8_t> zeros(out.groups(), 0);
    for (int n = 0; n < out.Np; ++n) put_int4z_meta(out, n, ones.data(), zeros.data());
  } else {
    // iq4nl: scale 0 (no code of its grid is 0): a row packed from no values is zero
    out.group_scale.assign(static_cast<std::size_t>(out.Np) * out.groups(),
                           out.element == Element::iq4nl ? 0 : out.element == Element::int8h ? kF16One : kBf16One);
  }
}

// Row n of an int8 matrix: Kp values (zero past K), its scale, its sums per activation block.
void put_int8_row(PackedMatrix& out, int n, const int8_t* q, float scale) {
  auto* dst = reinterpret_cast<int8_t*>(out.values);
  int16_t* sums = out.colsum.data() + static_cast<std::size_t>(n / 16) * out.colsum_blocks() * 16 + n % 16;
  const int size = out.Kp / out.colsum_blocks();  // starting from begin_quantized's zeros
  for (int k = 0; k < out.Kp; ++k) {
    dst[((static_cast<int64_t>(n / 16) * (out.Kp / 4) + k / 4) * 16 + n % 16) * 4 + k % 4] = q[k];
    int16_t& sum = sums[k / size * 16];
    sum = static_cast<int16_t>(sum + q[k]);
  }
  out.scale[n] = scale;
}

void put_group_scales(PackedMatrix& out, int n, const uint16_t* scales) {
  const int G = out.groups();
  for (int g = 0; g < G; ++g) out.group_scale[(static_cast<int64_t>(n / 16) * G + g) * 16 + n % 16] = scales[g];
}

// Row n of an int8g matrix: Kp values in [-127, 127] in int8's order, stored as q + 128, and
// one bf16 scale per group.
void put_int8g_row(PackedMatrix& out, int n, const int8_t* q, const uint16_t* scales) {
  put_group_scales(out, n, scales);
  for (int k = 0; k < out.Kp; ++k)
    out.values[((static_cast<int64_t>(n / 16) * (out.Kp / 4) + k / 4) * 16 + n % 16) * 4 + k % 4] =
        static_cast<uint8_t>(q[k] + 128);
}

// Row n of an int4 matrix: Kp values in [-8, 7], stored as q + 8, and one bf16 scale per group.
void put_int4_row(PackedMatrix& out, int n, const int8_t* q, const uint16_t* scales) {
  put_group_scales(out, n, scales);
  put_nibbles(out, n, q, 8);
}

// Row n of an fp4 (nvfp4) matrix: Kp E2M1 codes and one E8M0 (UE4M3) code per group.
void put_fp4_row(PackedMatrix& out, int n, const int8_t* codes, const uint8_t* e8m0) {
  const int G = out.groups();
  for (int g = 0; g < G; ++g) out.group_e8m0[(static_cast<int64_t>(n / 16) * G + g) * 16 + n % 16] = e8m0[g];
  put_nibbles(out, n, codes, 0);
}

// Row n of a checkpoint's nvfp4 matrix: its codes, a UE4M3 code a group and the tensor's scale,
// each checked (the scale codes unsigned and not NaN, the tensor's scale finite).
void put_nvfp4_row(PackedMatrix& out, int n, const int8_t* codes, const uint8_t* scale_codes, const float* global) {
  for (int g = 0; g < out.groups(); ++g)
    if (scale_codes[g] > 0x7E)
      throw std::invalid_argument("nvfp4 scale of row " + std::to_string(n) + ", group " + std::to_string(g) +
                                  " is UE4M3 code " + std::to_string(scale_codes[g]) +
                                  ": NaN or signed (the codes are 0-126)");
  if (global == nullptr || !std::isfinite(*global))
    throw std::invalid_argument("nvfp4 global scale of row " + std::to_string(n) + " is missing or not finite");
  put_fp4_row(out, n, codes, scale_codes);
  out.scale[n] = *global;
}

// Row n of an int4z matrix: Kp unsigned codes in [0, 15], a float32 scale and a zero point per group.
void put_int4z_row(PackedMatrix& out, int n, const int8_t* q, const float* scales, const uint8_t* zeros) {
  put_int4z_meta(out, n, scales, zeros);
  put_nibbles(out, n, q, 0);
}

// Asymmetric INT4 of one row, as GPTQ's and compressed-tensors' asymmetric schemes define it: per
// group the range [min(w, 0), max(w, 0)] in 15 steps, scale = range / 15 (1 where it is 0), zero =
// round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15).
bool quantize_int4z_row(const float* w, int K, int group, int8_t* q, float* scales, uint8_t* zeros) {
  bool finite = true;
  for (int g0 = 0; g0 < K; g0 += group) {
    float low = 0.f, high = 0.f;
    for (int k = g0; k < g0 + group; ++k) {
      finite &= std::isfinite(w[k]);
      low = std::min(low, w[k]), high = std::max(high, w[k]);
    }
    float scale = (high - low) / 15.f;
    if (!(scale > 0.f) || !std::isfinite(scale)) scale = 1.f;
    const int zero = std::clamp(static_cast<int>(std::nearbyint(-low / scale)), 0, 15);
    scales[g0 / group] = scale;
    zeros[g0 / group] = static_cast<uint8_t>(zero);
    for (int k = g0; k < g0 + group; ++k)
      q[k] = static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint(w[k] / scale)) + zero, 0, 15));
  }
  return finite;
}

// The E2M1 code nearest v (ties to the even code, whose mantissa bit is 0), saturating at 6, with
// v's sign (a negative v that rounds to zero is -0, as ml_dtypes' float4_e2m1fn cast gives).
int8_t fp4_code(float v) {
  static constexpr float kMidpoints[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const float m = std::fabs(v);
  int i = 0;
  while (i < 7 && (m > kMidpoints[i] || (m == kMidpoints[i] && (i + 1) % 2 == 0))) ++i;
  return static_cast<int8_t>((std::signbit(v) ? 8 : 0) | i);
}

// MXFP4 of one row: per group, the least power of two 2^s with max|w| / 2^s <= 6 (so no value
// saturates; OCP's floor(log2 max|w|) - 2 would clip the top of the range), in E8M0's range,
// 1 for a group of zeros; each value the E2M1 code nearest w / 2^s.
bool quantize_fp4_row(const float* w, int K, int group, int8_t* q, float* scales) {
  bool finite = true;
  for (int g0 = 0; g0 < K; g0 += group) {
    float max_abs = 0.f;
    for (int k = g0; k < g0 + group; ++k) {
      finite &= std::isfinite(w[k]);
      max_abs = std::max(max_abs, std::fabs(w[k]));
    }
    int e = 127;
    if (max_abs > 0.f && std::isfinite(max_abs)) {
      int exponent;
      const double mantissa = std::frexp(static_cast<double>(max_abs) / 6.0, &exponent);  // in [0.5, 1)
      e = std::clamp((mantissa == 0.5 ? exponent - 1 : exponent) + 127, 0, 254);
    }
    const float scale = e8m0_to_f32(static_cast<uint8_t>(e));
    scales[g0 / group] = scale;
    for (int k = g0; k < g0 + group; ++k) q[k] = fp4_code(w[k] / scale);
  }
  return finite;
}

// FP8 E4M3 (the "fn" variant: no infinities, 0x7F/0xFF are NaN) to float, exactly.
float fp8_e4m3_to_f32(uint8_t bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 0xF, mantissa = bits & 7;
  float magnitude;
  if (exponent == 0xF && mantissa == 7)
    magnitude = std::numeric_limits<float>::quiet_NaN();  // E4M3FN has no infinity
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m / 8 * 2^-6
  else
    magnitude = std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// FP8 E4M3 code of a finite float: round to nearest even, saturated at +-448 (the largest code;
// 0x7F is NaN). Steps of 2^(E - 3) in binade E, 2^-9 below 2^-6 (the subnormals).
uint8_t f32_to_fp8_e4m3(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  if (a == 0.f) return sign;
  if (a > 448.f) return sign | 0x7E;
  int e;
  std::frexp(a, &e);
  const int binade = std::max(e - 1, -6);
  const int steps = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - binade)));  // 0..16; 16 carries
  return static_cast<uint8_t>(sign | (((binade + 7) << 3) + steps - 8));
}

bool fp8_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

// Row scales that are all 1 (block-scaled weights) are not kept: 4 bytes a row, 0.5-1.5% of
// a small projection's bytes.
void drop_unit_row_scales(PackedMatrix& out) {
  if (std::all_of(out.scale.begin(), out.scale.end(), [](float s) { return s == 1.f; })) out.scale.clear();
}

void put_fp8_row(PackedMatrix& out, int n, const uint8_t* codes) {
  uint8_t* panel = out.values + static_cast<std::size_t>(n / 16) * out.block_bytes();
  for (int k = 0; k < out.K; ++k) panel[k * 16 + n % 16] = codes[k];
}

// f16, f32 ([N/16][Kp][16]; f16 rounded to nearest even, load_weights checks its range) and bf16
// (pairs of K: [N/16][Kp/2][16][2]) from floats.
void pack_plain_floats(PackedMatrix& out, const std::function<float(int, int)>& value) {
  auto* halves = reinterpret_cast<uint16_t*>(out.values);
  for (int n = 0; n < out.Np; ++n)
    for (int k = 0; k < out.Kp; ++k) {
      const float v = value(n, k);
      const std::size_t at = (static_cast<std::size_t>(n / 16) * out.Kp + k) * 16 + n % 16;
      if (out.element == Element::f32) std::memcpy(out.values + 4 * at, &v, 4);
      else if (out.element == Element::f16) halves[at] = f32_to_f16(v);
      else halves[((static_cast<int64_t>(n / 16) * (out.Kp / 2) + k / 2) * 16 + n % 16) * 2 + k % 2] = f32_to_bf16(v);
    }
}

// ktforge's own FP8 quantization (load_weights): per 16-row block and group of K, scale =
// max|w| / 448 (1 for a block of zeros), code = E4M3 of w / scale.
void pack_fp8_floats(PackedMatrix& out, const std::function<float(int, int)>& value) {
  begin_quantized(out);
  const int G = out.groups();
  std::vector<uint8_t> codes(out.K);
  for (int b = 0; b < out.blocks(); ++b)
    for (int g = 0; g < G; ++g) {
      float max_abs = 0.f;
      for (int n = b * 16; n < b * 16 + 16; ++n)
        for (int k = g * out.group; k < std::min(out.K, (g + 1) * out.group); ++k)
          max_abs = std::max(max_abs, std::fabs(value(n, k)));
      const float scale = max_abs >= std::numeric_limits<float>::min() ? max_abs / 448.f : 1.f;
      out.block_scale[static_cast<std::size_t>(b) * G + g] = scale;
      uint8_t* panel = out.values + static_cast<std::size_t>(b) * out.block_bytes();
      for (int n = 0; n < 16; ++n)
        for (int k = g * out.group; k < std::min(out.K, (g + 1) * out.group); ++k)
          panel[k * 16 + n] = f32_to_fp8_e4m3(value(b * 16 + n, k) / scale);
    }
  drop_unit_row_scales(out);
}

// mxfp8's rows: K E4M3 codes and an E8M0 code a group each (from `row`: a checkpoint's, checked;
// else quantized from the floats `value` gives: per group the least power of two 2^s with
// max|w| / 2^s <= 448, 1 for a group of zeros, the codes E4M3 of w / 2^s).
void pack_mxfp8(PackedMatrix& out, const std::function<float(int, int)>& value, const QuantizedRow* rows, int N) {
  begin_quantized(out);
  const int G = out.groups();
  std::vector<uint8_t> codes(out.K), scales(G);
  for (int n = 0; n < N; ++n) {
    if (rows != nullptr && !rows[n].values) continue;
    if (rows != nullptr) {
      std::memcpy(codes.data(), rows[n].values, out.K), std::memcpy(scales.data(), rows[n].scales, G);
      for (int g = 0; g < G; ++g)
        if (scales[g] > kMxfp8MaxScale)
          throw std::invalid_argument("mxfp8 scale of row " + std::to_string(n) + ", group " + std::to_string(g) +
                                      " is E8M0 code " + std::to_string(scales[g]) + ": NaN or beyond 2^63");
      for (int k = 0; k < out.K; ++k)
        if (fp8_nan(codes[k]))
          throw std::invalid_argument("mxfp8 weights hold a NaN code (row " + std::to_string(n) + ", column " +
                                      std::to_string(k) + ")");
    } else {
      for (int g = 0; g < G; ++g) {
        const int k0 = g * out.group, k1 = std::min(out.K, (g + 1) * out.group);
        float max_abs = 0.f;
        for (int k = k0; k < k1; ++k) max_abs = std::max(max_abs, std::fabs(value(n, k)));
        int exponent = 0;
        const double mantissa = max_abs > 0.f ? std::frexp(static_cast<double>(max_abs) / 448.0, &exponent) : 0.0;
        const int e = (mantissa == 0.5 ? exponent - 1 : exponent) + 127;  // past 2^63: saturated codes
        scales[g] = max_abs > 0.f ? static_cast<uint8_t>(std::clamp(e, 0, static_cast<int>(kMxfp8MaxScale))) : kE8m0One;
        const float scale = e8m0_to_f32(scales[g]);
        for (int k = k0; k < k1; ++k) codes[k] = f32_to_fp8_e4m3(value(n, k) / scale);
      }
    }
    put_fp8_row(out, n, codes.data());
    for (int g = 0; g < G; ++g) out.group_e8m0[(static_cast<std::size_t>(n / 16) * G + g) * 16 + n % 16] = scales[g];
  }
}

// A checkpoint's FP8 rows: K codes and one float scale per group of the row. Within a 16-row
// block the scales must be one per group (block scales) or one per row (channel scales): both
// are kept exactly, as block_scale or as scale[n]. Zero rows (padding) take any scale.
void pack_fp8_rows(PackedMatrix& out, const std::vector<QuantizedRow>& rows) {
  begin_quantized(out);
  const int G = out.groups(), N = static_cast<int>(rows.size());
  auto scales = [&](int n) { return static_cast<const float*>(rows[n].scales); };
  for (int n = 0; n < N; ++n) {
    if (!rows[n].values) continue;
    const auto* codes = static_cast<const uint8_t*>(rows[n].values);
    for (int k = 0; k < out.K; ++k)
      if (fp8_nan(codes[k]))
        throw std::invalid_argument("FP8 weights hold a NaN code (row " + std::to_string(n) + ", column " + std::to_string(k) + ")");
    for (int g = 0; g < G; ++g)
      if (!std::isfinite(scales(n)[g]) || std::fabs(scales(n)[g]) >= 0x1p64f)
        throw std::invalid_argument("FP8 scale of row " + std::to_string(n) + " is not finite or beyond 2^64");
    put_fp8_row(out, n, codes);
  }
  for (int b = 0; b * 16 < N; ++b) {
    int first = -1;
    bool per_block = true, per_row = true;
    for (int n = b * 16; n < std::min(N, b * 16 + 16); ++n) {
      if (!rows[n].values) continue;
      if (first < 0) first = n;
      for (int g = 0; g < G; ++g) {
        per_block &= scales(n)[g] == scales(first)[g];
        per_row &= scales(n)[g] == scales(n)[0];
      }
    }
    if (first < 0) continue;
    if (!per_block && !per_row)
      throw std::invalid_argument("FP8 scales of rows " + std::to_string(b * 16) + "-" + std::to_string(b * 16 + 15) +
                                  " vary both along K and between rows: neither block scales (whole 16-row blocks) "
                                  "nor channel scales");
    for (int n = b * 16; n < std::min(N, b * 16 + 16); ++n)
      if (rows[n].values && !per_block) out.scale[n] = scales(n)[0];
    if (per_block)
      for (int g = 0; g < G; ++g) out.block_scale[static_cast<std::size_t>(b) * G + g] = scales(first)[g];
  }
  drop_unit_row_scales(out);
}

}  // namespace

// NVFP4 of one row, as NVIDIA ModelOpt quantizes a tensor, with the row as the tensor: the global
// scale max|w| / (6 * 448) (1 for a row of zeros), per 16 values the UE4M3 code of max|w| / 6 /
// global (saturating at 448), each value the E2M1 code nearest w / (that scale * global).
bool quantize_nvfp4_row(const float* w, int K, int8_t* q, uint8_t* scale_codes, float* global) {
  float max_abs = 0.f;
  bool finite = true;
  for (int k = 0; k < K; ++k) finite &= std::isfinite(w[k]), max_abs = std::max(max_abs, std::fabs(w[k]));
  *global = finite && max_abs >= std::numeric_limits<float>::min() ? max_abs / (6.f * 448.f) : 1.f;
  for (int g0 = 0; g0 < K; g0 += kNvfp4Group) {
    float group_max = 0.f;
    for (int k = g0; k < g0 + kNvfp4Group; ++k) group_max = std::max(group_max, std::fabs(w[k]));
    const uint8_t code = finite ? f32_to_fp8_e4m3(group_max / 6.f / *global) : 0;
    scale_codes[g0 / kNvfp4Group] = code;
    const float scale = ue4m3_to_f32(code) * *global;
    for (int k = g0; k < g0 + kNvfp4Group; ++k) q[k] = scale > 0.f ? fp4_code(w[k] / scale) : 0;
  }
  return finite;
}

// Cloned for AVX-512/AVX2 with a run-time pick (this file has no ISA flags): converting a
// whole checkpoint runs through here. |w| is maximised on its bit pattern, which orders
// like the value for non-negative floats and puts NaN/inf above every finite value.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
bool quantize_weight_row(Element method, int group, const float* w, int K, int8_t* q, float* scales) {
  if (method == Element::fp4) return quantize_fp4_row(w, K, group, q, scales);
  const bool int4 = method == Element::int4;
  const int step = grouped(method) ? group : K;
  // int4 uses all 16 codes, as llama.cpp's Q4_0: the group's largest |w| becomes -8 (its scale
  // takes the opposite sign), the rest land in [-8, 7]; steps of max|w| / 8, not / 7.
  const int qmax = int4 ? 8 : 127, qmin = -qmax, qhigh = int4 ? 7 : 127;
  bool finite = true;
  for (int g0 = 0; g0 < K; g0 += step) {
    uint32_t max_bits = 0;
    for (int k = g0; k < g0 + step; ++k) {
      uint32_t bits;
      std::memcpy(&bits, w + k, 4);
      max_bits = std::max(max_bits, bits & 0x7fffffffu);
    }
    finite &= max_bits < 0x7f800000u;
    float max_abs;
    std::memcpy(&max_abs, &max_bits, 4);
    float scale = symmetric_scale(max_abs, qmax);
    if (int4) {
      bool negative = false;  // the sign of the first w of the largest magnitude
      for (int k = g0; k < g0 + step; ++k) {
        uint32_t bits;
        std::memcpy(&bits, w + k, 4);
        if ((bits & 0x7fffffffu) == max_bits) {
          negative = bits >> 31;
          break;
        }
      }
      if (scale == max_abs / static_cast<float>(qmax) && !negative) scale = -scale;  // not an all-zero group's 1
    }
    // 16-bit group scales; |scale| >= FLT_MIN still: it is a bf16 (int8h: Q8_0's float16 d, 1 for
    // a group too small for a normal float16)
    if (method == Element::int8h) scale = scale >= 0x1p-14f ? f16_to_f32(f32_to_f16(scale)) : 1.f;
    else if (grouped(method)) scale = bf16_to_f32(f32_to_bf16(scale));
    // int8g: of the bf16 scale nearest max|w| / 127 and its two neighbours, the one whose group
    // error is least (the nearest on ties; a smaller one clamps the largest |w|). The nearest
    // alone is 1% less accurate than Q8_0's fp16 scales; the best of three, 3% more accurate.
    const bool some_nonzero = max_abs / 127.f >= std::numeric_limits<float>::min();  // else scale 1, all q 0
    if (method == Element::int8g && max_bits < 0x7f800000u && some_nonzero) {
      auto error = [&](float c) {
        const float inv = 1.f / c;
        double sum = 0;
        for (int k = g0; k < g0 + step; ++k) {
          const float d = static_cast<float>(quantize(w[k], inv, -127, 127)) * c - w[k];
          sum += static_cast<double>(d) * d;
        }
        return sum;
      };
      const uint16_t nearest = f32_to_bf16(scale);
      double least = error(scale);
      for (const int candidate : {nearest - 1, nearest + 1}) {
        if (candidate < 0x0080 || candidate >= 0x7f80) continue;  // normal and finite only
        const float c = bf16_to_f32(static_cast<uint16_t>(candidate));
        const double e = error(c);
        if (e < least) least = e, scale = c;
      }
    }
    const float inverse = 1.f / scale;
    scales[g0 / step] = scale;
    for (int k = g0; k < g0 + step; ++k) q[k] = static_cast<int8_t>(quantize(w[k], inverse, qmin, qhigh));
  }
  return finite;
}

bool decode_fp8_row(const uint8_t* codes, int64_t K, const float* block_scales, int64_t bk, float* out) {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = fp8_e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  bool nan = false;
  for (int64_t k0 = 0; k0 < K; k0 += bk) {
    const float scale = block_scales[k0 / bk];
    for (int64_t k = k0; k < std::min(K, k0 + bk); ++k) {
      nan |= (codes[k] & 0x7F) == 0x7F;
      out[k] = table[codes[k]] * scale;
    }
  }
  return !nan;
}

void pack_rows(PackedMatrix& out, Element method, int group, const std::vector<const void*>& rows, DType dtype, int K) {
  const int N = static_cast<int>(rows.size());
  shape(out, method, group, N, K);
  auto value = [&](int n, int k) -> float {
    if (n >= N || k >= K || rows[n] == nullptr) return 0.f;
    return load(rows[n], dtype, k);
  };

  if (method == Element::fp8) return pack_fp8_floats(out, value);
  if (method == Element::mxfp8) return pack_mxfp8(out, value, nullptr, N);
  if (floats(method) || method == Element::bf16) return pack_plain_floats(out, value);
  // each row widened to Kp floats (zeros past K), then quantized as quantize_weight_row does
  std::vector<float> row(out.Kp);
  std::vector<int8_t> q(out.Kp);
  std::vector<float> scales(std::max(1, out.groups()));
  std::vector<uint16_t> bits(scales.size());
  begin_quantized(out);
  for (int n = 0; n < out.Np; ++n) {
    for (int k = 0; k < out.Kp; ++k) row[k] = value(n, k);
    if (super_block_rows(method)) {
      pack_super_block_floats(out, n, row.data());
      continue;
    }
    if (legacy(method)) {
      pack_legacy_floats(out, n, row.data());
      continue;
    }
    if (lattice(method)) {  // the file's blocks, then regrouped as a file's are
      pack_lattice_floats(out, n, row.data());
      continue;
    }
    if (iq4(method)) {
      std::vector<uint8_t> records(static_cast<std::size_t>(out.Kp / kQ4kSuperBlock + 1) * kIq4xsRowRecordBytes);
      quantize_iq4_row(row.data(), out.Kp, method == Element::iq4xs, q.data(), bits.data(), records.data());
      method == Element::iq4xs ? put_signed_records(out, n, records.data(), kQ4kGroupsPerSuper, kIq4xsSuperBytes) : put_group_scales(out, n, bits.data());
      put_nibbles(out, n, q.data(), 0);
      continue;
    }
    if (method == Element::nvfp4) {
      std::vector<uint8_t> codes(out.groups());
      quantize_nvfp4_row(row.data(), out.Kp, q.data(), codes.data(), &out.scale[n]);
      put_fp4_row(out, n, q.data(), codes.data());
      continue;
    }
    quantize_weight_row(method, group, row.data(), out.Kp, q.data(), scales.data());
    if (method == Element::int8) {
      put_int8_row(out, n, q.data(), scales[0]);
      continue;
    }
    if (method == Element::int4z) {
      std::vector<uint8_t> zeros(scales.size());
      quantize_int4z_row(row.data(), out.Kp, group, q.data(), scales.data(), zeros.data());
      put_int4z_row(out, n, q.data(), scales.data(), zeros.data());
      continue;
    }
    if (method == Element::fp4) {
      std::vector<uint8_t> e8m0(scales.size());
      for (std::size_t g = 0; g < scales.size(); ++g) e8m0[g] = f32_to_e8m0(scales[g]);
      put_fp4_row(out, n, q.data(), e8m0.data());
      continue;
    }
    for (std::size_t g = 0; g < scales.size(); ++g)  // exact: see quantize_weight_row
      bits[g] = method == Element::int8h ? f32_to_f16(scales[g]) : f32_to_bf16(scales[g]);
    if (int8_groups(method))
      put_int8g_row(out, n, q.data(), bits.data());
    else
      put_int4_row(out, n, q.data(), bits.data());
  }
}

void pack_quantized_rows(PackedMatrix& out, Element method, int group, const std::vector<QuantizedRow>& rows, int K) {
  const int N = static_cast<int>(rows.size());
  shape(out, method, group, N, K);
  if (method == Element::fp8) return pack_fp8_rows(out, rows);
  if (method == Element::mxfp8) return pack_mxfp8(out, {}, rows.data(), N);
  if (floats(method)) {  // portable f16, f32: K values a row, as the file has them
    const std::size_t bytes = method == Element::f32 ? 4 : 2;
    for (int n = 0; n < N; ++n)
      for (int k = 0; rows[n].values && k < K; ++k)
        std::memcpy(out.values + ((static_cast<std::size_t>(n / 16) * out.Kp + k) * 16 + n % 16) * bytes,
                    static_cast<const uint8_t*>(rows[n].values) + k * bytes, bytes);
    return;
  }
  begin_quantized(out);
  std::vector<int8_t> q(out.Kp);
  const std::vector<uint16_t> unit(out.groups() + 1, method == Element::int8h ? kF16One : kBf16One);
  const std::vector<uint8_t> unit_e8m0(out.groups() + 1, kE8m0One);
  for (int n = 0; n < out.Np; ++n) {
    const QuantizedRow row = n < N ? rows[n] : QuantizedRow{};
    std::fill(q.begin(), q.end(), int8_t{0});
    if (nibbles(method) && row.values) {  // int4's byte order: byte j holds k = 2j low, 2j + 1 high
      const auto* bytes = static_cast<const uint8_t*>(row.values);
      const int offset = method == Element::int4 ? 8 : 0;  // int4's q + 8; the others' codes as they are
      for (int k = 0; k < out.Kp; ++k) q[k] = static_cast<int8_t>(((bytes[k / 2] >> (4 * (k % 2))) & 0x0F) - offset);
    }
    if (method == Element::int8 || int8_groups(method)) {
      if (row.values) std::copy(static_cast<const int8_t*>(row.values), static_cast<const int8_t*>(row.values) + K, q.begin());
      if (method == Element::int8)
        put_int8_row(out, n, q.data(), row.values ? *static_cast<const float*>(row.scales) : 1.f);
      else
        put_int8g_row(out, n, q.data(), row.values ? static_cast<const uint16_t*>(row.scales) : unit.data());
    } else if (method == Element::int4z) {
      // portable int4z: int4's byte order, the nibbles unsigned codes; a float32 scale and a zero
      // point per group (a missing row keeps begin_quantized's zeros, scale 1)
      if (row.values) {
        put_int4z_row(out, n, q.data(), static_cast<const float*>(row.scales), static_cast<const uint8_t*>(row.zeros));
      }
    } else if (lattice(method)) {  // the file's blocks less d, and d; a missing row keeps d 0: zero weights
      if (row.values) put_lattice_row(out, n, static_cast<const uint8_t*>(row.values), static_cast<const uint16_t*>(row.scales));
    } else if (legacy(method)) {  // a missing row keeps begin_legacy's zero scales
      if (row.values) put_legacy_row(out, n, static_cast<const uint8_t*>(row.values), static_cast<const uint16_t*>(row.scales));
    } else if (super_block_rows(method)) {
      // a missing row keeps begin_quantized's zero records: zero weights
      if (row.values)
        put_super_block_row(out, n, static_cast<const uint8_t*>(row.values), static_cast<const uint8_t*>(row.scales));
    } else if (iq4(method)) {  // portable iq4: int4's bytes of codes; float16 scales (nl) or records (xs)
      if (row.values) {
        method == Element::iq4xs ? put_signed_records(out, n, static_cast<const uint8_t*>(row.scales), kQ4kGroupsPerSuper,
                                                     kIq4xsSuperBytes)
                                 : put_group_scales(out, n, static_cast<const uint16_t*>(row.scales));
        put_nibbles(out, n, q.data(), 0);
      }
    } else if (method == Element::nvfp4) {  // portable nvfp4: fp4's bytes, UE4M3 codes, the tensor's scale
      if (row.values) put_nvfp4_row(out, n, q.data(), static_cast<const uint8_t*>(row.scales), row.global_scale);
    } else if (method == Element::fp4) {
      // portable fp4: int4's byte order, the nibbles E2M1 codes; one E8M0 code per group
      put_fp4_row(out, n, q.data(), row.values ? static_cast<const uint8_t*>(row.scales) : unit_e8m0.data());
    } else {
      // portable int4: the codes q + 8
      put_int4_row(out, n, q.data(), row.values ? static_cast<const uint16_t*>(row.scales) : unit.data());
    }
  }
}

}  // namespace kt
