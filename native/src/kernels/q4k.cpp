#include "kernels/q4k.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kt {

// Row n's q4k super-block records (the portable kQ4kRowRecordBytes each) into its blocks' records.
void put_q4k_meta(PackedMatrix& out, int n, const uint8_t* row_records) {
  const int supers = out.groups() / kQ4kGroupsPerSuper, c = n % 16;
  for (int s = 0; s < supers; ++s) {
    const uint8_t* in = row_records + s * kQ4kRowRecordBytes;
    uint8_t* record = out.group_meta.data() + (static_cast<std::size_t>(n / 16) * supers + s) * kQ4kSuperBytes;
    std::memcpy(record + 2 * c, in, 2);
    std::memcpy(record + 32 + 2 * c, in + 2, 2);
    for (int j = 0; j < kQ4kGroupsPerSuper; ++j) {
      record[kQ4kSubScales + j * 16 + c] = in[4 + j];
      record[kQ4kMins + j * 16 + c] = in[4 + kQ4kGroupsPerSuper + j];
    }
  }
}

void put_q5k_codes(PackedMatrix& out, int n, const int8_t* codes) { put_line_codes<Q5kLine>(out, n, codes); }

namespace {

// Per `group` values the range [min(w, 0), max(w, 0)] in `levels` steps; per super-block d = the
// largest step / top and dmin = the largest -min / top (float16) into the record's first 4 bytes,
// each group's sc = round(step / d), m = round(-min / dmin) in [0, top] to put(record, j, sc, m),
// q = clamp(round((w + dmin * m) / (d * sc)), 0, levels). Simpler than llama.cpp's search, the
// same formats.
template <class Put>
bool quantize_with_mins(const float* w, int K, int8_t* q, uint8_t* records, int record_bytes, int group, int levels,
                        int top, Put put) {
  bool finite = true;
  const int groups = kQ4kSuperBlock / group;
  std::vector<float> step(groups), low(groups);
  for (int s0 = 0; s0 < K; s0 += kQ4kSuperBlock) {
    float max_step = 0.f, max_low = 0.f;
    for (int j = 0; j < groups; ++j) {
      float lo = 0.f, hi = 0.f;
      for (int k = s0 + group * j; k < s0 + group * (j + 1); ++k) {
        finite &= std::isfinite(w[k]);
        lo = std::min(lo, w[k]), hi = std::max(hi, w[k]);
      }
      step[j] = (hi - lo) / static_cast<float>(levels), low[j] = -lo;
      max_step = std::max(max_step, step[j]), max_low = std::max(max_low, low[j]);
    }
    const auto levels_of = static_cast<float>(top);
    const uint16_t d_bits = f32_to_f16(max_step / levels_of), dmin_bits = f32_to_f16(max_low / levels_of);
    const float d = f16_to_f32(d_bits), dmin = f16_to_f32(dmin_bits);
    uint8_t* record = records + (s0 / kQ4kSuperBlock) * record_bytes;
    std::memcpy(record, &d_bits, 2);
    std::memcpy(record + 2, &dmin_bits, 2);
    for (int j = 0; j < groups; ++j) {
      const int sc = d > 0.f ? std::clamp(static_cast<int>(std::nearbyint(step[j] / d)), 0, top) : 0;
      const int m = dmin > 0.f ? std::clamp(static_cast<int>(std::nearbyint(low[j] / dmin)), 0, top) : 0;
      put(record, j, sc, m);
      const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
      for (int k = s0 + group * j; k < s0 + group * (j + 1); ++k)
        q[k] = scale > 0.f ? static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint((w[k] + offset) / scale)), 0, levels))
                           : 0;
    }
  }
  return finite;
}

}  // namespace

bool quantize_q4k_row(const float* w, int K, int8_t* q, uint8_t* records, int levels) {
  return quantize_with_mins(w, K, q, records, kQ4kRowRecordBytes, 32, levels, 63, [](uint8_t* r, int j, int sc, int m) {
    r[4 + j] = static_cast<uint8_t>(sc), r[4 + kQ4kGroupsPerSuper + j] = static_cast<uint8_t>(m);
  });
}

bool quantize_q2k_row(const float* w, int K, int8_t* q, uint8_t* records) {
  return quantize_with_mins(w, K, q, records, kQ2kRowRecordBytes, 16, 3, 15,
                            [](uint8_t* r, int j, int sc, int m) { r[4 + j] = static_cast<uint8_t>(sc | (m << 4)); });
}

void put_q2k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records) {
  const int c = n % 16, supers = out.Kp / kQ4kSuperBlock;
  put_line_codes<Q2kLine>(out, n, codes);
  for (int s = 0; s < supers; ++s) {
    const uint8_t* in = row_records + s * kQ2kRowRecordBytes;
    uint8_t* record = out.group_meta.data() + (static_cast<std::size_t>(n / 16) * supers + s) * kQ2kSuperBytes;
    std::memcpy(record + 2 * c, in, 2);
    std::memcpy(record + 32 + 2 * c, in + 2, 2);
    for (int j = 0; j < kQ6kGroupsPerSuper; ++j) record[kQ2kScalesMins + j * 16 + c] = in[4 + j];
  }
}

}  // namespace kt
