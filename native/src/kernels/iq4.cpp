#include "kernels/iq4.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kt {

namespace {

constexpr int kGroup = 32;

// The grid code nearest v (the first of two as near).
int8_t nearest_code(float v) {
  int best = 0;
  for (int c = 1; c < 16; ++c)
    if (std::fabs(v - kIq4Values[c]) < std::fabs(v - kIq4Values[best])) best = c;
  return static_cast<int8_t>(best);
}

// A group's scale: its first value of the largest magnitude m lands on the grid's -127 (m / -127).
float group_scale(const float* w, bool& finite) {
  float m = 0.f;
  for (int k = 0; k < kGroup; ++k) {
    finite &= std::isfinite(w[k]);
    if (std::fabs(w[k]) > std::fabs(m)) m = w[k];
  }
  return m / -127.f;
}

void codes_of(const float* w, float scale, int8_t* q) {
  for (int k = 0; k < kGroup; ++k) q[k] = scale != 0.f ? nearest_code(w[k] / scale) : nearest_code(0.f);
}

}  // namespace

// Simpler than llama.cpp's search, the same formats. IQ4_NL: per 32 the scale m / -127 rounded to
// float16, each code the grid's nearest to w / scale. IQ4_XS: per 256 d = the largest |m / -127|
// / 31 (float16) and per 32 sc = round((m / -127) / d) in [-32, 31], codes nearest w / (d * sc).
bool quantize_iq4_row(const float* w, int K, bool xs, int8_t* q, uint16_t* nl_scales, uint8_t* xs_records) {
  bool finite = true;
  if (!xs) {
    for (int g = 0; g < K / kGroup; ++g) {
      nl_scales[g] = f32_to_f16(group_scale(w + g * kGroup, finite));
      codes_of(w + g * kGroup, f16_to_f32(nl_scales[g]), q + g * kGroup);
    }
    return finite;
  }
  for (int s0 = 0; s0 < K; s0 += kQ4kSuperBlock) {
    float scale[kQ4kGroupsPerSuper], largest = 0.f;
    for (int j = 0; j < kQ4kGroupsPerSuper; ++j) {
      scale[j] = group_scale(w + s0 + kGroup * j, finite);
      largest = std::max(largest, std::fabs(scale[j]));
    }
    const uint16_t d_bits = f32_to_f16(largest / 31.f);
    const float d = f16_to_f32(d_bits);
    uint8_t* record = xs_records + (s0 / kQ4kSuperBlock) * kIq4xsRowRecordBytes;
    std::memcpy(record, &d_bits, 2);
    for (int j = 0; j < kQ4kGroupsPerSuper; ++j) {
      const int sc = d > 0.f ? std::clamp(static_cast<int>(std::nearbyint(scale[j] / d)), -32, 31) : 0;
      record[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc));
      codes_of(w + s0 + kGroup * j, d * static_cast<float>(sc), q + s0 + kGroup * j);
    }
  }
  return finite;
}

}  // namespace kt
