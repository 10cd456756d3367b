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
// 8 g + 128 made once. A group's int32 sums times its 2 ls + 1 fold in int32 over the super-block,
// scaled once by d times the type's factor (lattice_tile).
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <tuple>

#include "kernels/lattice.hpp"

namespace kt {
namespace {
#ifdef __AVX512VNNI__

// Each column's sign byte (7 bits in dword bits 0-6, their parity added as bit 7) tested for
// values 0-3 (lo) and 4-7 (hi), each dword's 4 bytes one value. The parity: bits 0-3 xor bits 4-6
// (a nibble), looked up as 0x80 or 0 (vpshufb reads an index byte's low 4 bits; bit 7 is clear).
inline void lattice_sign_masks(__m512i s7, __mmask64& lo, __mmask64& hi) {
  const __m512i parity_of_nibble = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
  const __m512i folded = _mm512_xor_si512(s7, _mm512_srli_epi32(s7, 4));
  const __m512i signs = _mm512_or_si512(s7, _mm512_shuffle_epi8(parity_of_nibble, folded));
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

// Each type: decode(panel, g, group, s, lo, hi), line s of group g (of `group` values), and
// odd(panel, g, group), a vector of the 16 columns' 2 ls + 1 (the chunk's scales).
template <int ChunkBytes>
struct Chunks {
  static const uint8_t* chunk(const uint8_t* panel, int g, int group) {
    return panel + static_cast<std::size_t>(g * group / kLatticeChunkValues) * ChunkBytes;
  }
  static int line(int g, int group, int s) { return (g * group % kLatticeChunkValues) / 8 + s; }
  static __m512i odd(__m512i ls) { return _mm512_add_epi32(_mm512_add_epi32(ls, ls), _mm512_set1_epi32(1)); }
};
struct Iq2xxsCodes : Chunks<128> {
  static constexpr Element kElement = Element::iq2xxs;
  static void decode(const uint8_t* panel, int g, int group, int s, __m512i& lo, __m512i& hi) {
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    lattice_gather8(kIq2xxsGrid, load16_u8(c + l * 16), lo, hi);
    const __m512i aux = _mm512_loadu_si512(c + 64);
    lattice_signed(_mm512_and_si512(_mm512_srli_epi32(aux, 7 * l), _mm512_set1_epi32(127)), lo, hi);
  }
  static __m512i odd(const uint8_t* panel, int g, int group) {
    return Chunks::odd(_mm512_srli_epi32(_mm512_loadu_si512(chunk(panel, g, group) + 64), 28));
  }
};
struct Iq2xsCodes : Chunks<144> {
  static constexpr Element kElement = Element::iq2xs;
  static void decode(const uint8_t* panel, int g, int group, int s, __m512i& lo, __m512i& hi) {
    const __m512i q = load16_u16(chunk(panel, g, group) + line(g, group, s) * 32);
    lattice_gather8(kIq2xsGrid, _mm512_and_si512(q, _mm512_set1_epi32(511)), lo, hi);
    lattice_signed(_mm512_srli_epi32(q, 9), lo, hi);
  }
  static __m512i odd(const uint8_t* panel, int g, int group) {
    const int sub = g * group % kLatticeChunkValues / 16;  // lines 0-1's ls in the low nibble, 2-3's in the high
    return Chunks::odd(_mm512_and_si512(_mm512_srli_epi32(load16_u8(chunk(panel, g, group) + 128), 4 * sub),
                                        _mm512_set1_epi32(15)));
  }
};
struct Iq3xxsCodes : Chunks<192> {
  static constexpr Element kElement = Element::iq3xxs;
  static void decode(const uint8_t* panel, int g, int group, int s, __m512i& lo, __m512i& hi) {
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    const __m512i pair = load16_u16(c + l * 32);  // a column's two indices
    lo = _mm512_i32gather_epi32(_mm512_and_si512(pair, _mm512_set1_epi32(255)), kIq3xxsGrid, 4);
    hi = _mm512_i32gather_epi32(_mm512_srli_epi32(pair, 8), kIq3xxsGrid, 4);
    const __m512i aux = _mm512_loadu_si512(c + 128);
    lattice_signed(_mm512_and_si512(_mm512_srli_epi32(aux, 7 * l), _mm512_set1_epi32(127)), lo, hi);
  }
  static __m512i odd(const uint8_t* panel, int g, int group) {
    return Chunks::odd(_mm512_srli_epi32(_mm512_loadu_si512(chunk(panel, g, group) + 128), 28));
  }
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
struct Iq1sCodes : Chunks<96> {
  static constexpr Element kElement = Element::iq1s;
  static void decode(const uint8_t* panel, int g, int group, int s, __m512i& lo, __m512i& hi) {
    const uint8_t* c = chunk(panel, g, group);
    const int l = line(g, group, s);
    const __m512i qh = load16_u16(c + 64);
    const __m512i high = _mm512_and_si512(_mm512_srli_epi32(qh, 3 * l), _mm512_set1_epi32(7));
    lattice_gather8(iq1s_offset_grid(), _mm512_or_si512(load16_u8(c + l * 16), _mm512_slli_epi32(high, 8)), lo, hi);
    const __mmask16 down = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(0x8000));
    const __m512i shift = _mm512_mask_blend_epi32(down, _mm512_set1_epi32(0x01010101), _mm512_set1_epi32(-1));
    lo = _mm512_add_epi8(lo, shift), hi = _mm512_add_epi8(hi, shift);
  }
  static __m512i odd(const uint8_t* panel, int g, int group) {
    return Chunks::odd(_mm512_and_si512(_mm512_srli_epi32(load16_u16(chunk(panel, g, group) + 64), 12), _mm512_set1_epi32(7)));
  }
};

// A block decoded once for every row of a prefill (a task's rows would decode each line again per
// tile of 6): its lines' values + 128 as vpdpbusd takes them, [Kp / 8][128] bytes, then each
// group's 2 ls + 1, [groups][16] int32.
struct DecodedCodes {
  static void decode(const uint8_t* panel, int g, int group, int s, __m512i& lo, __m512i& hi) {
    const uint8_t* line = panel + static_cast<std::size_t>(g * group / 8 + s) * 128;
    lo = _mm512_loadu_si512(line), hi = _mm512_loadu_si512(line + 64);
  }
  static __m512i odd(const uint8_t* odds, int g, int) { return _mm512_loadu_si512(odds + static_cast<std::size_t>(g) * 64); }
  static const uint8_t* chunk(const uint8_t* panel, int g, int group) { return panel + static_cast<std::size_t>(g) * group * 16; }
};

// M token rows x NB blocks of 16 columns over the whole K. A group's int32 sums, less 128 times its
// activation sum, times its 2 ls + 1 fold in int32 over the super-block (at most 8 x 32 x 62 x 127 x
// 31 < 2^31), scaled once by d times the type's factor and the row's activation scale of the
// super-block (activation_block: llama.cpp's Q8_K blocks of 256).
template <class Codes, int M, int NB>
__attribute__((noinline)) void lattice_tile(const int8_t* const* x, const int32_t* const* gsum, const float* const* x_scale,
                                            const uint8_t* const* panel, const uint8_t* const* meta, int groups, int group,
                                            float* out, int64_t ld, bool token_scales, const uint8_t* const* odds,
                                            float factor) {
  const int lines = group / 8, per_super = kQ4kSuperBlock / group;
  __m512 accf[M][NB];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) accf[i][j] = _mm512_setzero_ps();
  for (int super = 0; super < groups / per_super; ++super) {
    __m512i folded[M][NB];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) folded[i][j] = _mm512_setzero_si512();
    for (int g = super * per_super; g < (super + 1) * per_super; ++g) {
      __m512i acc[M][NB];
      for (int i = 0; i < M; ++i) {
        const __m512i start = _mm512_set1_epi32(-128 * gsum[i][g]);
        for (int j = 0; j < NB; ++j) acc[i][j] = start;
      }
      for (int s = 0; s < lines; ++s) {
        const int p = g * lines + s;  // the line's place in K: values 8p .. 8p + 7
        __m512i lo[NB], hi[NB];
        for (int j = 0; j < NB; ++j) {
          if (s == 0)  // the chunk 8 KiB ahead (and the next 64 bytes: chunks are up to 192 bytes)
            for (int o = 0; o < 128; o += 64)
              _mm_prefetch(reinterpret_cast<const char*>(Codes::chunk(panel[j], g, group)) + kStreamAheadLines * 64 + o,
                           _MM_HINT_T1);
          Codes::decode(panel[j], g, group, s, lo[j], hi[j]);
        }
        for (int i = 0; i < M; ++i) {
          const __m512i a_lo = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
          const __m512i a_hi = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
          for (int j = 0; j < NB; ++j) {
            acc[i][j] = dpbusd(acc[i][j], lo[j], a_lo);
            acc[i][j] = dpbusd(acc[i][j], hi[j], a_hi);
          }
        }
      }
      for (int j = 0; j < NB; ++j) {
        const __m512i odd = Codes::odd(odds[j], g, group);
        for (int i = 0; i < M; ++i) folded[i][j] = _mm512_add_epi32(folded[i][j], _mm512_mullo_epi32(acc[i][j], odd));
      }
    }
    for (int j = 0; j < NB; ++j) {
      const __m512 d = _mm512_mul_ps(
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta[j] + super * kLatticeSuperBytes))),
          _mm512_set1_ps(factor));
      for (int i = 0; i < M; ++i) {
        const __m512 sums = _mm512_cvtepi32_ps(folded[i][j]);
        accf[i][j] = token_scales ? _mm512_fmadd_ps(sums, d, accf[i][j])
                                  : _mm512_fmadd_ps(_mm512_mul_ps(sums, d), _mm512_set1_ps(x_scale[i][super]), accf[i][j]);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    const __m512 once = _mm512_set1_ps(token_scales ? x_scale[i][0] : 1.f);
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, token_scales ? _mm512_mul_ps(accf[i][j], once) : accf[i][j]);
  }
}

// lattice_tile as dispatch takes a tile
template <class Codes>
struct LatticeTile {
  template <int M, int NB>
  struct Tile {
    template <typename... A>
    static void run(A... a) { lattice_tile<Codes, M, NB>(a...); }
  };
};

// Block b of w decoded (DecodedCodes' layout) into `to`, Kp * 16 bytes of values then the groups' odd
template <class Codes>
void decode_lattice_block(const PackedMatrix& w, int b, uint8_t* to) {
  const uint8_t* panel = w.block(b);
  const int lines = w.group / 8;
  uint8_t* odds = to + static_cast<std::size_t>(w.Kp) * 16;
  for (int g = 0; g < w.groups(); ++g) {
    for (int s = 0; s < lines; ++s) {
      __m512i lo, hi;
      Codes::decode(panel, g, w.group, s, lo, hi);
      uint8_t* line = to + static_cast<std::size_t>(g * lines + s) * 128;
      _mm512_storeu_si512(line, lo), _mm512_storeu_si512(line + 64, hi);
    }
    _mm512_storeu_si512(odds + g * 64, Codes::odd(panel, g, w.group));
  }
}

// The i-quants' driver: decode (a few rows) runs the tile on the panels; prefill decodes each block
// of NB once into a scratch and runs the tile on that, every chunk of rows.
template <class Codes, int Rows, int Blocks, int DecodeRows, int DecodeBlocks>
void gemm_lattice_rows(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const int G = w.groups();
  const bool decode = a.m <= DecodeRows;
  const int blocks = decode ? DecodeBlocks : Blocks;
  const float factor = lattice_factor(Codes::kElement);
  const std::size_t decoded_bytes = static_cast<std::size_t>(w.Kp) * 16 + static_cast<std::size_t>(G) * 64;
  static thread_local aligned_vector<uint8_t> scratch;
  if (!decode && scratch.size() < decoded_bytes * Blocks) scratch.resize(decoded_bytes * Blocks);
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += blocks) {
    const int nb = std::min(blocks, a.n1 / 16 - b0);
    const uint8_t* panel[std::max(Blocks, DecodeBlocks)];
    const uint8_t* meta[std::max(Blocks, DecodeBlocks)];
    const uint8_t* odds[std::max(Blocks, DecodeBlocks)];
    for (int j = 0; j < nb; ++j) {
      meta[j] = w.block_meta(b0 + j);
      if (decode) {
        panel[j] = odds[j] = w.block(b0 + j);
        continue;
      }
      uint8_t* to = scratch.data() + j * decoded_bytes;
      decode_lattice_block<Codes>(w, b0 + j, to);
      panel[j] = to, odds[j] = to + static_cast<std::size_t>(w.Kp) * 16;
    }
    for (int i0 = 0; i0 < a.m; i0 += Rows) {
      const int m = std::min(Rows, a.m - i0);
      const int8_t* x[Rows];
      const int32_t* sums[Rows];
      const float* xs[Rows];
      for (int i = 0; i < m; ++i) {
        const int64_t r = a.rows[i0 + i];
        x[i] = a.act->q.data() + r * a.act->Kp, sums[i] = a.act->gsum.data() + r * G, xs[i] = a.act->scales(r);
      }
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      const auto args = std::make_tuple(static_cast<const int8_t* const*>(x), static_cast<const int32_t* const*>(sums),
                                        static_cast<const float* const*>(xs), static_cast<const uint8_t* const*>(panel),
                                        static_cast<const uint8_t* const*>(meta), G, w.group, out, a.ld_out,
                                        a.act->token_scales, static_cast<const uint8_t* const*>(odds), factor);
      if (decode)
        std::apply([&](auto... v) { dispatch<DecodeRows, DecodeBlocks, LatticeTile<Codes>::template Tile>(m, nb, v...); }, args);
      else
        std::apply([&](auto... v) { dispatch<Rows, Blocks, LatticeTile<DecodedCodes>::template Tile>(m, nb, v...); }, args);
    }
  }
}

#endif  // __AVX512VNNI__
}  // namespace
}  // namespace kt
