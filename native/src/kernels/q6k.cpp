#include "kernels/q6k.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kt {

void put_signed_records(PackedMatrix& out, int n, const uint8_t* row_records, int groups, int super_bytes) {
  const int supers = out.Kp / kQ4kSuperBlock, c = n % 16;
  for (int s = 0; s < supers; ++s) {
    const uint8_t* in = row_records + s * (2 + groups);
    uint8_t* record = out.group_meta.data() + (static_cast<std::size_t>(n / 16) * supers + s) * super_bytes;
    std::memcpy(record + 2 * c, in, 2);
    for (int j = 0; j < groups; ++j) record[kQ6kSubScales + j * 16 + c] = in[2 + j];
  }
}
static_assert(kQ6kSubScales == kIq4xsSubScales, "q6k's and iq4xs's records keep sc at one offset");

void put_q6k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records) {
  put_line_codes<Q6kLine>(out, n, codes);
  put_signed_records(out, n, row_records, kQ6kGroupsPerSuper, kQ6kSuperBytes);
}

void put_q3k_row(PackedMatrix& out, int n, const uint8_t* codes, const uint8_t* row_records) {
  put_line_codes<Q3kLine>(out, n, codes);
  put_signed_records(out, n, row_records, kQ6kGroupsPerSuper, kQ6kSuperBytes);
}

// Per 16-value group a step of max|w| / levels; per super-block d = the largest step / scale_max
// (float16), each group's sc = round(step / d) in [0, scale_max] and q = clamp(round(w / (d * sc))
// + offset, 0, 2 offset - 1). Simpler than llama.cpp's search, the same format.
bool quantize_q6k_row(const float* w, int K, uint8_t* q, uint8_t* records, int levels, int offset, int scale_max) {
  bool finite = true;
  constexpr int kGroup = kQ4kSuperBlock / kQ6kGroupsPerSuper;
  for (int s0 = 0; s0 < K; s0 += kQ4kSuperBlock) {
    float step[kQ6kGroupsPerSuper], max_step = 0.f;
    for (int j = 0; j < kQ6kGroupsPerSuper; ++j) {
      float amax = 0.f;
      for (int k = s0 + kGroup * j; k < s0 + kGroup * (j + 1); ++k) {
        finite &= std::isfinite(w[k]);
        amax = std::max(amax, std::fabs(w[k]));
      }
      step[j] = amax / static_cast<float>(levels);
      max_step = std::max(max_step, step[j]);
    }
    const uint16_t d_bits = f32_to_f16(max_step / static_cast<float>(scale_max));
    const float d = f16_to_f32(d_bits);
    uint8_t* record = records + (s0 / kQ4kSuperBlock) * kQ6kRowRecordBytes;
    std::memcpy(record, &d_bits, 2);
    for (int j = 0; j < kQ6kGroupsPerSuper; ++j) {
      const int sc = d > 0.f ? std::clamp(static_cast<int>(std::nearbyint(step[j] / d)), 0, scale_max) : 0;
      record[2 + j] = static_cast<uint8_t>(sc);
      const float scale = d * static_cast<float>(sc);
      for (int k = s0 + kGroup * j; k < s0 + kGroup * (j + 1); ++k)
        q[k] = static_cast<uint8_t>(
            scale > 0.f ? std::clamp(static_cast<int>(std::nearbyint(w[k] / scale)) + offset, 0, 2 * offset - 1) : offset);
    }
  }
  return finite;
}

}  // namespace kt
