#include "kernels/legacy.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/q4k.hpp"

namespace kt {
namespace {

constexpr int kGroup = 32;

int top_code(Element e) { return e == Element::q40 || e == Element::q41 ? 15 : 31; }

void put_codes(PackedMatrix& out, int n, const int8_t* q) {
  out.element == Element::q50 || out.element == Element::q51 ? put_q5k_codes(out, n, q) : put_nibbles(out, n, q, 0);
}

void put_scales(PackedMatrix& out, int n, const uint16_t* scales) {
  const int G = out.groups(), c = n % 16;
  for (int g = 0; g < G; ++g) {
    if (!legacy_mins(out.element)) {
      out.group_scale[(static_cast<std::size_t>(n / 16) * G + g) * 16 + c] = scales[g];
      continue;
    }
    uint8_t* record = out.group_meta.data() + (static_cast<std::size_t>(n / 16) * G + g) * kLegacyGroupBytes;
    std::memcpy(record + 2 * c, scales + 2 * g, 2);
    std::memcpy(record + kLegacyMins + 2 * c, scales + 2 * g + 1, 2);
  }
}

// As llama.cpp's reference quantizers: Q4_0, Q5_0 d = m / -offset for the group's first value m
// of the largest magnitude (its code 0), q = clamp(round(w / d) + offset, 0, top); Q4_1, Q5_1 d
// = (max - min) / top, m = min, q = clamp(round((w - m) / d), 0, top). d and m float16, the codes
// taken from the rounded ones.
bool quantize_legacy_row(Element e, const float* w, int K, int8_t* q, uint16_t* scales) {
  bool finite = true;
  const int top = top_code(e), offset = legacy_offset(e);
  for (int g0 = 0; g0 < K; g0 += kGroup) {
    float lo = w[g0], hi = w[g0], largest = 0.f;
    for (int k = g0; k < g0 + kGroup; ++k) {
      finite &= std::isfinite(w[k]);
      lo = std::min(lo, w[k]), hi = std::max(hi, w[k]);
      if (std::fabs(w[k]) > std::fabs(largest)) largest = w[k];
    }
    const bool mins = legacy_mins(e);
    const uint16_t d_bits = f32_to_f16(mins ? (hi - lo) / static_cast<float>(top) : largest / static_cast<float>(-offset));
    const uint16_t m_bits = f32_to_f16(lo);
    const float d = f16_to_f32(d_bits), m = mins ? f16_to_f32(m_bits) : 0.f, inverse = d != 0.f ? 1.f / d : 0.f;
    for (int k = g0; k < g0 + kGroup; ++k)
      q[k] = static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint((w[k] - m) * inverse)) + offset, 0, top));
    if (mins)
      scales[2 * (g0 / kGroup)] = d_bits, scales[2 * (g0 / kGroup) + 1] = m_bits;
    else
      scales[g0 / kGroup] = d_bits;
  }
  return finite;
}

}  // namespace

void begin_legacy(PackedMatrix& out) {
  if (legacy_mins(out.element))
    out.group_meta.assign(static_cast<std::size_t>(out.blocks()) * out.meta_bytes_per_block(), 0);
  else
    out.group_scale.assign(static_cast<std::size_t>(out.Np) * out.groups(), 0);
}

bool pack_legacy_floats(PackedMatrix& out, int n, const float* row) {
  std::vector<int8_t> q(out.Kp);
  std::vector<uint16_t> scales(static_cast<std::size_t>(out.groups()) * 2);
  const bool finite = quantize_legacy_row(out.element, row, out.Kp, q.data(), scales.data());
  put_codes(out, n, q.data());
  put_scales(out, n, scales.data());
  return finite;
}

void put_legacy_row(PackedMatrix& out, int n, const uint8_t* codes, const uint16_t* scales) {
  std::vector<int8_t> q(out.Kp);
  const bool two_a_byte = out.element == Element::q40 || out.element == Element::q41;
  for (int k = 0; k < out.Kp; ++k)  // two a byte: byte j holds k = 2j low, 2j + 1 high
    q[k] = static_cast<int8_t>(two_a_byte ? (codes[k / 2] >> (4 * (k % 2))) & 0x0F : codes[k]);
  put_codes(out, n, q.data());
  put_scales(out, n, scales);
}

}  // namespace kt
