// The AVX2 kernels of GGUF's i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S; kernels/lattice.hpp's
// chunks): a part of arch/x86/avx2/kernels.cpp, included there after its prefetch_panel (in the
// same unnamed namespace). Also what the AVX-512 level without VNNI runs.
//
// A line (8 values of K x 16 columns) decodes, per half of 8 columns, to the grid's values of
// each column (values 0-3 in one vector's dwords, 4-7 in another; gathered by index) and their
// signs as byte masks. pmaddubsw takes the values unsigned (at most 62: two products and their
// sum stay below 2^15) and the activations with each weight's sign (psignb), so no offset;
// IQ1_S's values 8 g +- 1 are signed, taken as |w| and sign(x, w) (int8's way).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/lattice.hpp"

namespace kt {
namespace {

// Sign bytes (7 bits a dword, their parity added as bit 7) -> 0xFF where values 0-3 (lo) and 4-7
// (hi) of each column are negative
inline void lattice_sign_masks(__m256i s7, __m256i& lo, __m256i& hi) {
  const __m256i folded = _mm256_and_si256(_mm256_xor_si256(s7, _mm256_srli_epi32(s7, 4)), _mm256_set1_epi32(15));
  const __m256i parity = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(0x6996), folded), _mm256_set1_epi32(1));
  const __m256i signs = _mm256_or_si256(s7, _mm256_slli_epi32(parity, 7));
  const __m256i spread = _mm256_shuffle_epi8(
      signs, _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12,
                              12, 12, 12));
  const __m256i bits_lo = _mm256_set1_epi32(0x08040201), bits_hi = _mm256_set1_epi32(static_cast<int>(0x80402010u));
  lo = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits_lo), bits_lo);
  hi = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits_hi), bits_hi);
}

// 8 columns' 8-value grid entries (8 dword indices) -> values 0-3 and 4-7 of each column
inline void lattice_gather8(const void* grid, __m256i index, __m256i& lo, __m256i& hi) {
  const auto* base = static_cast<const long long*>(grid);
  const __m256i split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // a qword's low dwords, then its high
  const __m256i first = _mm256_permutevar8x32_epi32(_mm256_i32gather_epi64(base, _mm256_castsi256_si128(index), 8), split);
  const __m256i second =
      _mm256_permutevar8x32_epi32(_mm256_i32gather_epi64(base, _mm256_extracti128_si256(index, 1), 8), split);
  lo = _mm256_permute2x128_si256(first, second, 0x20);
  hi = _mm256_permute2x128_si256(first, second, 0x31);
}

inline __m256i load8_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i load8_u16(const uint8_t* p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256i load8_u32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Each type: decode(panel, g, group, s, h, v, neg): half h (columns 8h .. 8h + 7) of line s of group
// g, the values' magnitudes and where they are negative; odd(panel, g, group, h): the half's 2 ls + 1.
template <int ChunkBytes>
struct Chunks {
  static const uint8_t* chunk(const uint8_t* panel, int g, int group) {
    return panel + static_cast<std::size_t>(g * group / kLatticeChunkValues) * ChunkBytes;
  }
  static int line(int g, int group, int s) { return (g * group % kLatticeChunkValues) / 8 + s; }
  static __m256i odd(__m256i ls) { return _mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)); }
};
struct Iq2xxsCodes : Chunks<128> {
  static void decode(const uint8_t* panel, int g, int group, int s, int h, __m256i (&v)[2], __m256i (&neg)[2]) {
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    lattice_gather8(kIq2xxsGrid, load8_u8(c + l * 16 + 8 * h), v[0], v[1]);
    const __m256i aux = load8_u32(c + 64 + 32 * h);
    lattice_sign_masks(_mm256_and_si256(_mm256_srli_epi32(aux, 7 * l), _mm256_set1_epi32(127)), neg[0], neg[1]);
  }
  static __m256i odd(const uint8_t* panel, int g, int group, int h) {
    return Chunks::odd(_mm256_srli_epi32(load8_u32(chunk(panel, g, group) + 64 + 32 * h), 28));
  }
};
struct Iq2xsCodes : Chunks<144> {
  static void decode(const uint8_t* panel, int g, int group, int s, int h, __m256i (&v)[2], __m256i (&neg)[2]) {
    const __m256i q = load8_u16(chunk(panel, g, group) + line(g, group, s) * 32 + 16 * h);
    lattice_gather8(kIq2xsGrid, _mm256_and_si256(q, _mm256_set1_epi32(511)), v[0], v[1]);
    lattice_sign_masks(_mm256_srli_epi32(q, 9), neg[0], neg[1]);
  }
  static __m256i odd(const uint8_t* panel, int g, int group, int h) {
    const int sub = g * group % kLatticeChunkValues / 16;
    return Chunks::odd(_mm256_and_si256(_mm256_srli_epi32(load8_u8(chunk(panel, g, group) + 128 + 8 * h), 4 * sub),
                                        _mm256_set1_epi32(15)));
  }
};
struct Iq3xxsCodes : Chunks<192> {
  static void decode(const uint8_t* panel, int g, int group, int s, int h, __m256i (&v)[2], __m256i (&neg)[2]) {
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    const __m256i pair = load8_u16(c + l * 32 + 16 * h);
    const auto* grid = reinterpret_cast<const int*>(kIq3xxsGrid);
    v[0] = _mm256_i32gather_epi32(grid, _mm256_and_si256(pair, _mm256_set1_epi32(255)), 4);
    v[1] = _mm256_i32gather_epi32(grid, _mm256_srli_epi32(pair, 8), 4);
    const __m256i aux = load8_u32(c + 128 + 32 * h);
    lattice_sign_masks(_mm256_and_si256(_mm256_srli_epi32(aux, 7 * l), _mm256_set1_epi32(127)), neg[0], neg[1]);
  }
  static __m256i odd(const uint8_t* panel, int g, int group, int h) {
    return Chunks::odd(_mm256_srli_epi32(load8_u32(chunk(panel, g, group) + 128 + 32 * h), 28));
  }
};
// IQ1_S's values 8 g +- 1: the grid as 8 g + 1 a byte (int8), made once; the group's shift of -1
// takes 2 off
struct Iq1sCodes : Chunks<96> {
  static void decode(const uint8_t* panel, int g, int group, int s, int h, __m256i (&v)[2], __m256i (&neg)[2]) {
    static const std::array<uint64_t, 2048> signed_values = [] {
      std::array<uint64_t, 2048> t{};
      for (int e = 0; e < 2048; ++e)
        for (int j = 0; j < 8; ++j)
          t[e] |= static_cast<uint64_t>(static_cast<uint8_t>(8 * static_cast<int8_t>(kIq1sGrid[e] >> (8 * j)) + 1)) << (8 * j);
      return t;
    }();
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    const __m256i qh = load8_u16(c + 64 + 16 * h);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi32(qh, 3 * l), _mm256_set1_epi32(7));
    lattice_gather8(signed_values.data(), _mm256_or_si256(load8_u8(c + l * 16 + 8 * h), _mm256_slli_epi32(high, 8)), v[0], v[1]);
    const __m256i down = _mm256_cmpeq_epi32(_mm256_and_si256(qh, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x8000));
    const __m256i minus2 = _mm256_and_si256(down, _mm256_set1_epi8(-2));
    for (int t = 0; t < 2; ++t) {
      const __m256i w = _mm256_add_epi8(v[t], minus2);  // 8 g +- 1, signed
      neg[t] = _mm256_cmpgt_epi8(_mm256_setzero_si256(), w);
      v[t] = _mm256_abs_epi8(w);
    }
  }
  static __m256i odd(const uint8_t* panel, int g, int group, int h) {
    return Chunks::odd(_mm256_and_si256(_mm256_srli_epi32(load8_u16(chunk(panel, g, group) + 64 + 16 * h), 12),
                                        _mm256_set1_epi32(7)));
  }
};

// A block decoded once for every row of a prefill: each line's signed values, [Kp / 8][2 halves][lo,
// hi][32] bytes, then each group's 2 ls + 1, [groups][16] int32.
struct DecodedCodes {
  static void decode(const uint8_t* panel, int g, int group, int s, int h, __m256i (&v)[2], __m256i (&neg)[2]) {
    const uint8_t* line = panel + (static_cast<std::size_t>(g * group / 8 + s) * 2 + h) * 64;
    for (int t = 0; t < 2; ++t) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32 * t));
      neg[t] = _mm256_cmpgt_epi8(_mm256_setzero_si256(), w);
      v[t] = _mm256_abs_epi8(w);
    }
  }
  static __m256i odd(const uint8_t* odds, int g, int, int h) { return load8_u32(odds + static_cast<std::size_t>(g) * 64 + 32 * h); }
};

// Block b of w decoded (DecodedCodes' layout) into `to`
template <class Codes>
void decode_lattice_block(const PackedMatrix& w, int b, uint8_t* to) {
  const uint8_t* panel = w.block(b);
  const int lines = w.group / 8;
  uint8_t* odds = to + static_cast<std::size_t>(w.Kp) * 16;
  for (int g = 0; g < w.groups(); ++g) {
    for (int s = 0; s < lines; ++s)
      for (int h = 0; h < 2; ++h) {
        __m256i v[2], neg[2];
        Codes::decode(panel, g, w.group, s, h, v, neg);
        uint8_t* line = to + (static_cast<std::size_t>(g * lines + s) * 2 + h) * 64;
        for (int t = 0; t < 2; ++t)  // (v ^ neg) - neg: v where neg is 0, -v where it is -1
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(line + 32 * t), _mm256_sub_epi8(_mm256_xor_si256(v[t], neg[t]), neg[t]));
      }
    for (int h = 0; h < 2; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(odds + g * 64 + 32 * h), Codes::odd(panel, g, w.group, h));
  }
}

template <class Codes>
struct LatticeTile {
  template <int M, int NB>
  struct Tile {
    // M rows x one block of 16 columns (two halves) over K: each line decoded once for all rows; a
    // group's sums times its 2 ls + 1 folded in int32 over the super-block (AVX-512's bound), scaled
    // by d times the type's factor and the row's activation scale of the super-block
    static void run(const int8_t* const* x, const float* const* xs, const uint8_t* panel, const uint8_t* odds,
                    const uint8_t* meta, int groups, int group, float* out, int64_t ld, float factor) {
      const int lines = group / 8, per_super = kQ4kSuperBlock / group;
      const __m256i ones = _mm256_set1_epi16(1);
      __m256 accf[M][2];
      for (int i = 0; i < M; ++i) accf[i][0] = accf[i][1] = _mm256_setzero_ps();
      for (int super = 0; super < groups / per_super; ++super) {
        __m256i folded[M][2];
        for (int i = 0; i < M; ++i) folded[i][0] = folded[i][1] = _mm256_setzero_si256();
        for (int g = super * per_super; g < (super + 1) * per_super; ++g) {
          __m256i acc[M][2];
          for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
          for (int s = 0; s < lines; ++s) {
            const int p = g * lines + s;
            if (s == 0) prefetch_panel(panel + static_cast<std::size_t>(p) * 16);
            for (int h = 0; h < 2; ++h) {
              __m256i v[2], neg[2];
              Codes::decode(panel, g, group, s, h, v, neg);
              // psignb takes a sign from a byte: -1 where negative, 1 elsewhere (never 0: it would zero x)
              const __m256i sign_lo = _mm256_or_si256(neg[0], _mm256_set1_epi8(1));
              const __m256i sign_hi = _mm256_or_si256(neg[1], _mm256_set1_epi8(1));
              for (int i = 0; i < M; ++i) {
                const __m256i a_lo = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
                const __m256i a_hi = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
                const __m256i l = _mm256_maddubs_epi16(v[0], _mm256_sign_epi8(a_lo, sign_lo));
                const __m256i u = _mm256_maddubs_epi16(v[1], _mm256_sign_epi8(a_hi, sign_hi));
                acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(_mm256_add_epi16(l, u), ones));
              }
            }
          }
          for (int h = 0; h < 2; ++h) {
            const __m256i odd = Codes::odd(odds, g, group, h);
            for (int i = 0; i < M; ++i) folded[i][h] = _mm256_add_epi32(folded[i][h], _mm256_mullo_epi32(acc[i][h], odd));
          }
        }
        for (int h = 0; h < 2; ++h) {
          const __m256 d = _mm256_mul_ps(
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + super * kLatticeSuperBytes + 16 * h))),
              _mm256_set1_ps(factor));
          for (int i = 0; i < M; ++i)
            accf[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(folded[i][h]), d), _mm256_set1_ps(xs[i][super]), accf[i][h]);
        }
      }
      for (int i = 0; i < M; ++i)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, accf[i][h]);
    }
  };
};

// An i-quant's rows against block blk: a couple of rows on the panel; more on the block decoded once
// into this thread's scratch (a tile of kRows rows would decode each line again)
template <class Codes>
void lattice_block(const GemmArgs& a, int blk) {
  static thread_local aligned_vector<uint8_t> scratch;
  const PackedMatrix& w = *a.w;
  const float factor = lattice_factor(w.element);
  const bool decoded = a.m > 2;
  const uint8_t *panel = w.block(blk), *odds = panel;
  if (decoded) {
    scratch.resize(static_cast<std::size_t>(w.Kp) * 16 + static_cast<std::size_t>(w.groups()) * 64);
    decode_lattice_block<Codes>(w, blk, scratch.data());
    panel = scratch.data(), odds = scratch.data() + static_cast<std::size_t>(w.Kp) * 16;
  }
  for (int i0 = 0; i0 < a.m; i0 += kRows) {
    const int m = std::min(kRows, a.m - i0);
    const int8_t* rows[kRows];
    const float* xs[kRows];
    for (int i = 0; i < m; ++i) {
      const int64_t r = a.rows[i0 + i];
      rows[i] = a.act->q.data() + r * a.act->Kp, xs[i] = a.act->scales(r);
    }
    float* out = a.out + i0 * a.ld_out + (blk * 16 - a.n0);
    const auto* x = static_cast<const int8_t* const*>(rows);
    const auto* s = static_cast<const float* const*>(xs);
    if (decoded)
      dispatch<kRows, 1, LatticeTile<DecodedCodes>::template Tile>(m, 1, x, s, panel, odds, w.block_meta(blk), w.groups(),
                                                                   w.group, out, a.ld_out, factor);
    else
      dispatch<kRows, 1, LatticeTile<Codes>::template Tile>(m, 1, x, s, panel, odds, w.block_meta(blk), w.groups(), w.group,
                                                            out, a.ld_out, factor);
  }
}
inline void lattice_gemm_block(const GemmArgs& a, int blk) {
  switch (a.w->element) {
    case Element::iq2xxs: return lattice_block<Iq2xxsCodes>(a, blk);
    case Element::iq2xs: return lattice_block<Iq2xsCodes>(a, blk);
    case Element::iq3xxs: return lattice_block<Iq3xxsCodes>(a, blk);
    default: return lattice_block<Iq1sCodes>(a, blk);
  }
}

}  // namespace
}  // namespace kt
