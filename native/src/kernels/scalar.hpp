// Scalar conversions and quantization rules: the single definition every backend and
// the packing code follow.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kt {

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as hardware conversions do; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Symmetric quantization: q = round(x / scale) with scale = max|x| / qmax; 1 (so every q is 0)
// when that is below the smallest normal float (all zero, or subnormal: zero to float32
// accuracy), whose inverse would overflow to infinity and whose scale could underflow to 0.
inline float symmetric_scale(float max_abs, int qmax) {
  const float scale = max_abs / static_cast<float>(qmax);
  return scale >= std::numeric_limits<float>::min() ? scale : 1.f;
}
// Clamps, then rounds half to even by adding and subtracting 1.5 * 2^23: exact for the
// clamped range and equal to nearbyint in the default rounding mode, but without a libm
// call where the compiler has no SSE4.1 rounding instruction, so it vectorizes.
inline int quantize(float x, float inv_scale, int lo, int hi) {
  const float low = static_cast<float>(lo), high = static_cast<float>(hi), magic = 12582912.f;
  float v = x * inv_scale;
  v = v > high ? high : v < low ? low : v;
  return static_cast<int>((v + magic) - magic);
}
inline int quantize(float x, float inv_scale, int qmax) { return quantize(x, inv_scale, -qmax, qmax); }

inline float silu(float x) { return x / (1.f + std::exp(-x)); }

}  // namespace kt
