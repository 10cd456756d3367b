// Row operations around the GEMMs: activation quantization and conversion, the
// weighted combine of expert outputs. Written as plain loops and included by every
// backend translation unit, so each compiles (and vectorizes) them for its own ISA.
// Internal linkage (anonymous namespace): the copies never get merged across TUs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/scalar.hpp"

namespace kt {
namespace {

// Sum of each group of quantized activations (int4 removes the weights' +8 offset with them).
inline void group_sums(const int8_t* q, int Kp, int group, int32_t* gsum) {
  for (int g = 0; g < Kp / group; ++g) {
    int32_t sum = 0;
    for (int k = g * group; k < (g + 1) * group; ++k) sum += q[k];
    gsum[g] = sum;
  }
}

// A scale per `block` values of K (a multiple of 16 dividing Kp); false when the row holds NaN or
// infinity (nothing useful can be quantized).
bool quantize_row_generic(const float* x, int K, int Kp, int group, int block, int8_t* q, uint8_t* q_u8, float* scale,
                          int32_t* gsum) {
  bool finite = true;
  for (int k = 0; k < K; ++k) finite &= std::fabs(x[k]) <= 3.4028235e38f;  // false for NaN and inf
  if (!finite) return false;
  for (int b0 = 0; b0 < Kp; b0 += block) {
    const int end = std::min(K, b0 + block);
    float max_abs = 0.f;
    for (int k = b0; k < end; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
    const float s = symmetric_scale(max_abs, 127), inv = 1.f / s;
    scale[b0 / block] = s;
    for (int k = b0; k < end; ++k) {
      float v = std::nearbyint(x[k] * inv);
      v = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
      q[k] = static_cast<int8_t>(v);
    }
  }
  std::fill(q + std::min(K, Kp), q + Kp, int8_t{0});
  for (int k = 0; k < Kp; ++k) q_u8[k] = static_cast<uint8_t>(q[k] + 128);
  if (gsum) group_sums(q, Kp, group, gsum);
  return true;
}

bool to_bf16_row_generic(const float* x, int K, int Kp, uint16_t* out) {
  bool finite = true;
  for (int k = 0; k < K; ++k) {
    finite &= std::fabs(x[k]) <= 3.4028235e38f;
    out[k] = f32_to_bf16(x[k]);
  }
  std::fill(out + K, out + Kp, uint16_t{0});
  return finite;
}

// out[h] = sum_j weights[j] * rows[j][h]
void combine_generic(const float* const* rows, const float* weights, int k, int n, float* out) {
  std::fill(out, out + n, 0.f);
  for (int j = 0; j < k; ++j) {
    const float w = weights[j];
    const float* r = rows[j];
    for (int h = 0; h < n; ++h) out[h] += w * r[h];
  }
}

}  // namespace
}  // namespace kt
