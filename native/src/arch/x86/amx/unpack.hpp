// The AMX backend's B tiles of the packed nibble elements (int4, int4z) and the 2-3 bit
// K-quants (q2k, q3k), unpacked to int8: a part of arch/x86/amx/kernels.cpp, included there (in the same unnamed namespace), so it is
// compiled for the tiles and for the model.
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

// q2k's and q3k's B tiles with their groups' scales folded in, unsigned (tdpbsud): per group of
// 16 values and column, q2k's sc_j * q (<= 15 * 3) and q3k's sc_j * (q - 4) + 124 (sc_j in [-32,
// 31]: in [0, 252]), so a tile's sums over a super-block are the AVX-512 kernels' folded sums
// (q3k's plus 124 times the activations' sum); for q2k also its mins m_j, each on its group's
// 4 rows, into `mins`: their sums are sum_j m_j X_j. `out` holds the codes as unpack_planes
// left them (q3k's less 4); bytes multiply modulo 256, exact as the products fit a byte.
constexpr uint8_t kQ3kFoldBias = 124;  // q3k's sc_j * (q - 4) lies in [-124, 128]: plus this, a byte

template <Element E>
void fold_scales(const uint8_t* meta, int kp, int8_t* out, int8_t* mins) {
  static_assert(E == Element::q2k || E == Element::q3k);
  constexpr int kSuperBytes = E == Element::q2k ? kQ2kSuperBytes : kQ6kSuperBytes;
  constexpr int kScales = E == Element::q2k ? kQ2kScalesMins : kQ6kSubScales;
  constexpr int kAdd = E == Element::q3k ? kQ3kFoldBias : 0;
  for (int grp = 0; grp < kp / 16; ++grp) {
    const uint8_t* sc = meta + (grp / kQ6kGroupsPerSuper) * kSuperBytes + kScales + (grp % kQ6kGroupsPerSuper) * 16;
    int8_t* rows = out + grp * 4 * 64;
#ifndef KTFORGE_AMX_MODEL
    // the 16 columns' bytes, each 4 times (a B row: 16 columns x 4 values of K), in every lane
    const __m512i by_column = _mm512_set_epi32(0x0F0F0F0F, 0x0E0E0E0E, 0x0D0D0D0D, 0x0C0C0C0C, 0x0B0B0B0B, 0x0A0A0A0A,
                                               0x09090909, 0x08080808, 0x07070707, 0x06060606, 0x05050505, 0x04040404,
                                               0x03030303, 0x02020202, 0x01010101, 0x00000000);
    const __m512i bytes = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))), by_column);
    const __m512i low = _mm512_set1_epi16(0x00FF);
    const __m512i scale = E == Element::q2k ? _mm512_and_si512(bytes, _mm512_set1_epi8(0x0F)) : bytes;
    for (int t = 0; t < 4; ++t) {
      const __m512i v = _mm512_loadu_si512(rows + t * 64);
      const __m512i even = _mm512_mullo_epi16(v, scale);
      const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(v, 8), _mm512_srli_epi16(scale, 8));
      const __m512i product = _mm512_or_si512(_mm512_and_si512(even, low), _mm512_slli_epi16(odd, 8));
      _mm512_storeu_si512(rows + t * 64, _mm512_add_epi8(product, _mm512_set1_epi8(kAdd)));
      if constexpr (E == Element::q2k)
        _mm512_storeu_si512(mins + (grp * 4 + t) * 64, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), _mm512_set1_epi8(0x0F)));
    }
#else
    for (int t = 0; t < 4; ++t)
      for (int b = 0; b < 64; ++b) {
        const uint8_t byte = sc[b / 4];
        const int scale = E == Element::q2k ? (byte & 0x0F) : static_cast<int8_t>(byte);
        rows[t * 64 + b] = static_cast<int8_t>(static_cast<uint8_t>(rows[t * 64 + b] * scale + kAdd));
        if constexpr (E == Element::q2k) mins[(grp * 4 + t) * 64 + b] = static_cast<int8_t>(byte >> 4);
      }
#endif
  }
}

}  // namespace
}  // namespace kt
