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

// q6k panel lines (types.hpp: int4's nibbles, then the codes' high two bits) -> signed int8
// B-tile rows of q - 32: tdpbssd's sums need no offset taken off.
void unpack_q6k(const uint8_t* panel, int kp, int8_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x30), offset = _mm512_set1_epi8(kQ6kOffset);
  for (int j = 0; j < kp / 8; ++j) {
    const uint8_t* line = panel + j * kQ6kLineBytes;
    const __m512i v = _mm512_loadu_si512(line);
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 64));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low), _mm512_and_si512(_mm512_slli_epi16(both, 4), two));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                       _mm512_and_si512(_mm512_slli_epi16(both, 2), two));
    _mm512_storeu_si512(out + 2 * j * 64, _mm512_sub_epi8(lo, offset));
    _mm512_storeu_si512(out + (2 * j + 1) * 64, _mm512_sub_epi8(hi, offset));
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b) {
      const uint8_t* line = panel + j * kQ6kLineBytes;
      const int bits = line[64 + b % 32] >> (4 * (b / 32));
      out[2 * j * 64 + b] = static_cast<int8_t>(((line[b] & 0x0F) | ((bits & 3) << 4)) - kQ6kOffset);
      out[(2 * j + 1) * 64 + b] = static_cast<int8_t>(((line[b] >> 4) | (((bits >> 2) & 3) << 4)) - kQ6kOffset);
    }
#endif
}

// q5k panel lines (types.hpp: int4's nibbles, then the codes' high bits) -> unsigned int8 B-tile
// rows of its codes, as q4k's.
void unpack_q5k(const uint8_t* panel, int kp, int8_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i low = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  const __m512i low_bit = _mm512_set_epi32(0x40404040, 0x40404040, 0x40404040, 0x40404040, 0x10101010, 0x10101010,
                                           0x10101010, 0x10101010, 0x04040404, 0x04040404, 0x04040404, 0x04040404,
                                           0x01010101, 0x01010101, 0x01010101, 0x01010101);
  for (int j = 0; j < kp / 8; ++j) {
    const uint8_t* line = panel + j * kQ5kLineBytes;
    const __m512i v = _mm512_loadu_si512(line);
    const __m512i bits = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(line + 64)));
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low),
                                       _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, low_bit), sixteen));
    const __m512i hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16(v, 4), low),
        _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, _mm512_add_epi8(low_bit, low_bit)), sixteen));
    _mm512_storeu_si512(out + 2 * j * 64, lo);
    _mm512_storeu_si512(out + (2 * j + 1) * 64, hi);
  }
#else
  for (int j = 0; j < kp / 8; ++j)
    for (int b = 0; b < 64; ++b) {
      const uint8_t* line = panel + j * kQ5kLineBytes;
      const int bits = line[64 + b % 16] >> (2 * (b / 16));
      out[2 * j * 64 + b] = static_cast<int8_t>((line[b] & 0x0F) | ((bits & 1) << 4));
      out[(2 * j + 1) * 64 + b] = static_cast<int8_t>((line[b] >> 4) | (((bits >> 1) & 1) << 4));
    }
#endif
}

// q6k's records widened: per group and column d * sc_j, exact in float32.
static_assert(kQ6kSubScales == kIq4xsSubScales, "q6k's and iq4xs's records keep sc at one offset");
// iq4xs's likewise (8 groups a super-block).
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
