// The AVX-512 kernels of GGUF's i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S; kernels/lattice.hpp's
// chunks): a part of arch/x86/avx512/kernels.cpp, included there after its kStreamAheadLines and
// dpbusd (in the same unnamed namespace), so it is compiled with each AVX-512 level's flags.
//
// A line (8 values of K x 16 columns) decodes to two vectors of 16 dwords, values 0-3 and 4-7 of
// each column: the grid entries gathered by index (8-value grids: two gathers of 8 qwords, split
// into their low and high dwords by a two-table permute; IQ3_XXS's 4-value grid: a gather each),
// each value + 128 (the unsigned operand of vpdpbusd; 128 times the group's activation sum is
// taken off), negated where its sign bit is set (signs: 7 bits and their parity, tested a byte at
// a time). IQ1_S's values are 8 times the grid's plus the group's shift of +-1, from a table of
// 8 g + 128 made once. A group's int32 sums are scaled by d * (2 ls + 1) * the type's factor.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>

#include "kernels/lattice.hpp"

namespace kt {
namespace {
#ifdef __AVX512VNNI__

// Each column's sign byte (7 bits in dword bits 0-6, their parity added as bit 7) tested for
// values 0-3 (lo) and 4-7 (hi), each dword's 4 bytes one value.
inline void lattice_sign_masks(__m512i s7, __mmask64& lo, __mmask64& hi) {
  const __m512i folded = _mm512_and_si512(_mm512_xor_si512(s7, _mm512_srli_epi32(s7, 4)), _mm512_set1_epi32(15));
  const __m512i parity = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(0x6996), folded), _mm512_set1_epi32(1));
  const __m512i signs = _mm512_or_si512(s7, _mm512_slli_epi32(parity, 7));
  const __m512i spread = _mm512_shuffle_epi8(
      signs, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12)));
  lo = _mm512_test_epi8_mask(spread, _mm512_set1_epi32(0x08040201));
  hi = _mm512_test_epi8_mask(spread, _mm512_set1_epi32(static_cast<int>(0x80402010u)));
}

// 16 columns' 8-value grid entries (16 dword indices) -> values 0-3 and 4-7 of each column
inline void lattice_gather8(const void* grid, __m512i index, __m512i& lo, __m512i& hi) {
  const __m512i first = _mm512_i32gather_epi64(_mm512_castsi512_si256(index), grid, 8);
  const __m512i second = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(index, 1), grid, 8);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  lo = _mm512_permutex2var_epi32(first, even, second);
  hi = _mm512_permutex2var_epi32(first, _mm512_add_epi32(even, _mm512_set1_epi32(1)), second);
}

// The grid's unsigned values + 128, negated (to 128 - value) where the sign is set
inline void lattice_signed(__m512i s7, __m512i& lo, __m512i& hi) {
  __mmask64 neg_lo, neg_hi;
  lattice_sign_masks(s7, neg_lo, neg_hi);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  lo = _mm512_xor_si512(lo, offset), hi = _mm512_xor_si512(hi, offset);
  lo = _mm512_mask_sub_epi8(lo, neg_lo, zero, lo), hi = _mm512_mask_sub_epi8(hi, neg_hi, zero, hi);
}

inline __m512i load16_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512i load16_u16(const uint8_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Each type: its group (values a scale covers), decode(chunk, line, lo, hi), and ls(chunk, sub)
// (sub: the group's place in its chunk), a vector of the 16 columns' 4-bit scales.
struct Iq2xxsCodes {
  static constexpr Element kElement = Element::iq2xxs;
  static void decode(const uint8_t* chunk, int line, __m512i& lo, __m512i& hi) {
    lattice_gather8(kIq2xxsGrid, load16_u8(chunk + line * 16), lo, hi);
    const __m512i aux = _mm512_loadu_si512(chunk + 64);
    lattice_signed(_mm512_and_si512(_mm512_srli_epi32(aux, 7 * line), _mm512_set1_epi32(127)), lo, hi);
  }
  static __m512i ls(const uint8_t* chunk, int) { return _mm512_srli_epi32(_mm512_loadu_si512(chunk + 64), 28); }
};
struct Iq2xsCodes {
  static constexpr Element kElement = Element::iq2xs;
  static void decode(const uint8_t* chunk, int line, __m512i& lo, __m512i& hi) {
    const __m512i q = load16_u16(chunk + line * 32);
    lattice_gather8(kIq2xsGrid, _mm512_and_si512(q, _mm512_set1_epi32(511)), lo, hi);
    lattice_signed(_mm512_srli_epi32(q, 9), lo, hi);
  }
  static __m512i ls(const uint8_t* chunk, int sub) {
    return _mm512_and_si512(_mm512_srli_epi32(load16_u8(chunk + 128), 4 * sub), _mm512_set1_epi32(15));
  }
};
struct Iq3xxsCodes {
  static constexpr Element kElement = Element::iq3xxs;
  static void decode(const uint8_t* chunk, int line, __m512i& lo, __m512i& hi) {
    const __m512i pair = load16_u16(chunk + line * 32);  // a column's two indices
    lo = _mm512_i32gather_epi32(_mm512_and_si512(pair, _mm512_set1_epi32(255)), kIq3xxsGrid, 4);
    hi = _mm512_i32gather_epi32(_mm512_srli_epi32(pair, 8), kIq3xxsGrid, 4);
    const __m512i aux = _mm512_loadu_si512(chunk + 128);
    lattice_signed(_mm512_and_si512(_mm512_srli_epi32(aux, 7 * line), _mm512_set1_epi32(127)), lo, hi);
  }
  static __m512i ls(const uint8_t* chunk, int) { return _mm512_srli_epi32(_mm512_loadu_si512(chunk + 128), 28); }
};
// IQ1_S's grid as 8 g + 128 a byte (g in -1, 0, 1), made once
const uint64_t* iq1s_offset_grid() {
  static const std::array<uint64_t, 2048> table = [] {
    std::array<uint64_t, 2048> t{};
    for (int e = 0; e < 2048; ++e)
      for (int j = 0; j < 8; ++j)
        t[e] |= static_cast<uint64_t>(8 * static_cast<int8_t>(kIq1sGrid[e] >> (8 * j)) + 128) << (8 * j);
    return t;
  }();
  return table.data();
}
struct Iq1sCodes {
  static constexpr Element kElement = Element::iq1s;
  static void decode(const uint8_t* chunk, int line, __m512i& lo, __m512i& hi) {
    const __m512i qh = load16_u16(chunk + 64);
    const __m512i high = _mm512_and_si512(_mm512_srli_epi32(qh, 3 * line), _mm512_set1_epi32(7));
    lattice_gather8(iq1s_offset_grid(), _mm512_or_si512(load16_u8(chunk + line * 16), _mm512_slli_epi32(high, 8)), lo, hi);
    const __mmask16 down = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(0x8000));
    const __m512i shift = _mm512_mask_blend_epi32(down, _mm512_set1_epi32(0x01010101), _mm512_set1_epi32(-1));
    lo = _mm512_add_epi8(lo, shift), hi = _mm512_add_epi8(hi, shift);
  }
  static __m512i ls(const uint8_t* chunk, int) {
    return _mm512_and_si512(_mm512_srli_epi32(load16_u16(chunk + 64), 12), _mm512_set1_epi32(7));
  }
};

// M token rows x NB blocks of 16 columns over the whole K: each group's lines decoded once per
// block and used by every row; sums start at -128 times the group's activation sum.
template <class Codes, int M, int NB>
__attribute__((noinline)) void lattice_tile(const int8_t* const* x, const int32_t* const* gsum, const float* const* x_scale,
                                            const uint8_t* const* panel, const uint8_t* const* meta, int groups, int group,
                                            float* out, int64_t ld, bool token_scales) {
  constexpr Element kE = Codes::kElement;
  const int chunk_bytes = lattice_chunk_bytes(kE), lines = group / 8, per_chunk = kLatticeChunkValues / group;
  const __m512 factor = _mm512_set1_ps(lattice_factor(kE));
  __m512 accf[M][NB];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) accf[i][j] = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    const int sub = g % per_chunk;
    __m512i acc[M][NB];
    for (int i = 0; i < M; ++i) {
      const __m512i start = _mm512_set1_epi32(-128 * gsum[i][g]);
      for (int j = 0; j < NB; ++j) acc[i][j] = start;
    }
    const std::size_t at = static_cast<std::size_t>(g / per_chunk) * chunk_bytes;
    for (int j = 0; j < NB; ++j)
      if (sub == 0)
        for (int o = 0; o < chunk_bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(panel[j] + at + kStreamAheadLines * 64 + o), _MM_HINT_T1);
    for (int s = 0; s < lines; ++s) {
      const int p = g * lines + s;  // the line's place in K: values 8p .. 8p + 7
      __m512i lo[NB], hi[NB];
      for (int j = 0; j < NB; ++j) Codes::decode(panel[j] + at, sub * lines + s, lo[j], hi[j]);
      for (int i = 0; i < M; ++i) {
        const __m512i a_lo = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
        const __m512i a_hi = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
        for (int j = 0; j < NB; ++j) {
          acc[i][j] = dpbusd(acc[i][j], lo[j], a_lo);
          acc[i][j] = dpbusd(acc[i][j], hi[j], a_hi);
        }
      }
    }
    const int super = g * group / kQ4kSuperBlock;
    for (int j = 0; j < NB; ++j) {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta[j] + super * kLatticeSuperBytes)));
      const __m512i odd = _mm512_add_epi32(_mm512_slli_epi32(Codes::ls(panel[j] + at, sub), 1), _mm512_set1_epi32(1));
      const __m512 scale = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(odd)), factor);
      for (int i = 0; i < M; ++i) {
        const __m512 sums = _mm512_cvtepi32_ps(acc[i][j]);
        accf[i][j] = token_scales ? _mm512_fmadd_ps(sums, scale, accf[i][j])
                                  : _mm512_fmadd_ps(_mm512_mul_ps(sums, scale), _mm512_set1_ps(x_scale[i][g]), accf[i][j]);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    const __m512 once = _mm512_set1_ps(token_scales ? x_scale[i][0] : 1.f);
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, token_scales ? _mm512_mul_ps(accf[i][j], once) : accf[i][j]);
  }
}

// lattice_tile as the grouped elements' driver takes a tile (kernels.cpp); the blocks' metadata
// (their d) is what it hands as scales
template <class Codes>
struct LatticeTile {
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  template <int M, int NB>
  struct Tile {
    template <typename... A>
    static void run(A... a) { lattice_tile<Codes, M, NB>(a...); }
  };
};

#endif  // __AVX512VNNI__
}  // namespace
}  // namespace kt
