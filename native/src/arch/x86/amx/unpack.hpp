// The AMX backend's B tiles of the packed nibble and 6-bit elements, unpacked to int8, and
// their super-block records widened to float: a part of arch/x86/amx/kernels.cpp, included
// there (in the same unnamed namespace), so it is compiled for the tiles and for the model.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/types.hpp"

namespace kt {
namespace {

// int4 panel rows ([Kp/8][16 columns][4 bytes], byte b holding k = 8j+b low and 8j+4+b high,
// each as q + 8) -> signed int8 B-tile rows ([Kp/4][16][4]): row 2j the low nibbles, 2j+1
// the high ones.
void unpack_int4(const uint8_t* panel, int kp, int8_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int j = 0; j < kp / 8; ++j) {
    const __m512i v = _mm512_loadu_si512(panel + j * 64);
    _mm512_storeu_si512(out + 2 * j * 64, _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
    _mm512_storeu_si512(out + (2 * j + 1) * 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b) {
      out[2 * j * 64 + b] = static_cast<int8_t>((panel[j * 64 + b] & 0x0F) - 8);
      out[(2 * j + 1) * 64 + b] = static_cast<int8_t>((panel[j * 64 + b] >> 4) - 8);
    }
#endif
}

// int4z panel rows (int4's order, unsigned codes) -> unsigned int8 B-tile rows, as int4's.
void unpack_nibbles(const uint8_t* panel, int kp, int8_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < kp / 8; ++j) {
    const __m512i v = _mm512_loadu_si512(panel + j * 64);
    _mm512_storeu_si512(out + 2 * j * 64, _mm512_and_si512(v, low));
    _mm512_storeu_si512(out + (2 * j + 1) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b) {
      out[2 * j * 64 + b] = static_cast<int8_t>(panel[j * 64 + b] & 0x0F);
      out[(2 * j + 1) * 64 + b] = static_cast<int8_t>(panel[j * 64 + b] >> 4);
    }
#endif
}

// fp4 panel rows (int4's order, E2M1 codes) -> signed int8 B-tile rows of twice their values
// (kernels/types.hpp), looked up with vpshufb.
void unpack_looked_up(const uint8_t* panel, int kp, int8_t* out, const int8_t* values) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
  for (int j = 0; j < kp / 8; ++j) {
    const __m512i v = _mm512_loadu_si512(panel + j * 64);
    _mm512_storeu_si512(out + 2 * j * 64, _mm512_shuffle_epi8(table, _mm512_and_si512(v, low)));
    _mm512_storeu_si512(out + (2 * j + 1) * 64, _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low)));
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b) {
      out[2 * j * 64 + b] = values[panel[j * 64 + b] & 0x0F];
      out[(2 * j + 1) * 64 + b] = values[panel[j * 64 + b] >> 4];
    }
#endif
}
void unpack_fp4(const uint8_t* panel, int kp, int8_t* out) { unpack_looked_up(panel, kp, out, kFp4Doubled); }
// iq4nl, iq4xs: the IQ4 grid's signed values (tdpbssd)
void unpack_iq4(const uint8_t* panel, int kp, int8_t* out) { unpack_looked_up(panel, kp, out, kIq4Values); }

#ifndef KTFORGE_AMX_MODEL
template <int Shift>
inline __m512i shift_bytes(__m512i v) {
  if constexpr (Shift >= 0) return _mm512_slli_epi16(v, Shift);
  else return _mm512_srli_epi16(v, -Shift);
}
#endif

// Panel lines of layout L (types.hpp) -> int8 B-tile rows ([Kp/4][16][4]): row 2j the codes of
// line j's low nibbles' places, 2j + 1 of its high ones', each less Offset (signed tiles: q6k's q -
// 32, q3k's q - 4, q50's q - 16; 0 for the unsigned ones).
template <class L, int Offset = 0>
void unpack_planes(const uint8_t* panel, int kp, int8_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F), offset = _mm512_set1_epi8(Offset);
  const __m512i single = _mm512_set_epi32(0x40404040, 0x40404040, 0x40404040, 0x40404040, 0x10101010, 0x10101010,
                                          0x10101010, 0x10101010, 0x04040404, 0x04040404, 0x04040404, 0x04040404,
                                          0x01010101, 0x01010101, 0x01010101, 0x01010101);  // lane l's bit 2 l
  for (int j = 0; j < kp / 8; ++j) {
    const uint8_t* line = panel + j * L::kBytes;
    __m512i lo = _mm512_setzero_si512(), hi = lo;
    if constexpr (L::kNibbles) {
      const __m512i v = _mm512_loadu_si512(line);
      lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if constexpr (L::kTwoBits >= 0) {  // the 32 bytes twice, the upper copy shifted by 4 (types.hpp)
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + L::kTwoBits));
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
      const __m512i mask = _mm512_set1_epi8(static_cast<char>(3 << L::kTwoBitsAt));
      lo = _mm512_or_si512(lo, _mm512_and_si512(shift_bytes<L::kTwoBitsAt>(both), mask));
      hi = _mm512_or_si512(hi, _mm512_and_si512(shift_bytes<L::kTwoBitsAt - 2>(both), mask));
    }
    if constexpr (L::kOneBit >= 0) {
      const __m512i bits = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(line + L::kOneBit)));
      const __m512i value = _mm512_set1_epi8(1 << L::kOneBitAt);
      lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, single), value));
      hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, _mm512_add_epi8(single, single)), value));
    }
    _mm512_storeu_si512(out + 2 * j * 64, _mm512_sub_epi8(lo, offset));
    _mm512_storeu_si512(out + (2 * j + 1) * 64, _mm512_sub_epi8(hi, offset));
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b)
      for (int t = 0; t < 2; ++t) out[(2 * j + t) * 64 + b] = static_cast<int8_t>(L::code(panel + j * L::kBytes, b, t) - Offset);
#endif
}

// q41's and q51's records (types.hpp) widened: per group and column d, and m negated (the tiles
// take mins off, as q4k's: -(x_sum * -m) + acc is x_sum * m + acc, rounded once).
void legacy_scales_of(const uint8_t* meta, int G, float* scales, float* mins) {
  for (int k = 0; k < G * 16; ++k) {
    uint16_t d, m;
    const uint8_t* r = meta + (k / 16) * kLegacyGroupBytes + 2 * (k % 16);
    std::memcpy(&d, r, 2), std::memcpy(&m, r + kLegacyMins, 2);
    scales[k] = f16_to_f32(d), mins[k] = -f16_to_f32(m);
  }
}

// q2k's records (types.hpp) widened: per group and column d * sc_j and dmin * m_j, exact in float32.
void q2k_scales_of(const uint8_t* meta, int G, float* scales, float* mins) {
  for (int grp = 0; grp < G; ++grp) {
    const uint8_t* r = meta + (grp / kQ6kGroupsPerSuper) * kQ2kSuperBytes;
    for (int n = 0; n < 16; ++n) {
      uint16_t d, dmin;
      std::memcpy(&d, r + 2 * n, 2), std::memcpy(&dmin, r + 32 + 2 * n, 2);
      const uint8_t scm = r[kQ2kScalesMins + (grp % kQ6kGroupsPerSuper) * 16 + n];
      scales[grp * 16 + n] = f16_to_f32(d) * static_cast<float>(scm & 0x0F);
      mins[grp * 16 + n] = f16_to_f32(dmin) * static_cast<float>(scm >> 4);
    }
  }
}

// q6k's and q3k's records widened: per group and column d * sc_j, exact in float32; iq4xs's
// likewise (8 groups a super-block, sc at the same offset).
void signed_scales_of(const uint8_t* meta, int G, float* scales, int per_super, int super_bytes) {
  for (int grp = 0; grp < G; ++grp) {
    const uint8_t* r = meta + (grp / per_super) * super_bytes;
    for (int n = 0; n < 16; ++n) {
      uint16_t d;
      std::memcpy(&d, r + 2 * n, 2);
      const auto sc = static_cast<int8_t>(r[kQ6kSubScales + (grp % per_super) * 16 + n]);  // iq4xs's at 32 too
      scales[grp * 16 + n] = f16_to_f32(d) * static_cast<float>(sc);
    }
  }
}

// q4k's record (types.hpp) widened: per group and column d * sc_j and dmin * m_j, exact in float32.
void q4k_scales_of(const uint8_t* meta, int G, float* scales, float* mins) {
  for (int grp = 0; grp < G; ++grp) {
    const uint8_t* r = meta + (grp / kQ4kGroupsPerSuper) * kQ4kSuperBytes;
    const int j = (grp % kQ4kGroupsPerSuper) * 16;
    for (int n = 0; n < 16; ++n) {
      uint16_t d, dmin;
      std::memcpy(&d, r + 2 * n, 2), std::memcpy(&dmin, r + 32 + 2 * n, 2);
      scales[grp * 16 + n] = f16_to_f32(d) * r[kQ4kSubScales + j + n];
      mins[grp * 16 + n] = f16_to_f32(dmin) * r[kQ4kMins + j + n];
    }
  }
}

}  // namespace
}  // namespace kt
