// The AMX backend's B tiles of the packed nibble elements (int4, int4z), unpacked to int8: a
// part of arch/x86/amx/kernels.cpp, included there (in the same unnamed namespace), so it is
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

}  // namespace
}  // namespace kt
