// The AVX-512 kernels of the nibble elements (int4, fp4, int4z, q4k, iq4) and of the other
// K-quants' codes (q5k, q6k: nibbles and high bits; q3k, q2k: bit planes): a part of arch/x86/avx512/kernels.cpp,
// included there after its kStreamAheadLines, dpbusd and load_scales (in the same unnamed
// namespace), so they are compiled with each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/types.hpp"

namespace kt {
namespace {
#ifdef __AVX512VNNI__

// acc += a . b over int16 pairs (vpdpwssd), in place: dpbusd's asm form, for its reason
inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpwssd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}

// A group's int32 sums into the float accumulator: the offset they carry taken off, then scaled
// (Codes: a block's metadata per group: group(), its 16 scales: scales(), the offset its sums
// carry: offset()).
template <class Codes>
struct OffsetThenScale {
  template <typename Scale>
  static __m512 accumulate(const Scale* block, int g, __m512i sums, int32_t x_sum, __m512 accf) {
    const Scale* meta = Codes::group(block, g);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums, Codes::offset(meta, x_sum))), Codes::scales(meta),
                           accf);
  }
};

// What a nibble element's panel holds: how its nibbles decode to unsigned bytes, and how a group's
// sums are scaled (accumulate). int4: the nibbles themselves, w + 8, bf16 group scales.
struct Int4Codes : OffsetThenScale<Int4Codes> {
  using Scale = uint16_t;
  static constexpr int kOffset = 8;
  static constexpr float kFinal = 1.f;
  static __m512i table() { return _mm512_setzero_si512(); }
  static __m512i decode(__m512i nibbles, __m512i) { return nibbles; }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m512 scales(const Scale* s) { return load_scales(s); }
  static __m512i offset(const Scale*, int32_t x_sum) { return _mm512_set1_epi32(8 * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_scales(b); }
};

// int4z: unsigned nibbles q, w = (q - zero) * scale: the record of kernels/types.hpp, float32
// scales then zero points, each column's zero point times the group's activation sum taken off.
struct Int4zCodes : OffsetThenScale<Int4zCodes> {
  using Scale = uint8_t;
  static constexpr float kFinal = 1.f;
  static __m512i table() { return _mm512_setzero_si512(); }
  static __m512i decode(__m512i nibbles, __m512i) { return nibbles; }
  static const Scale* group(const Scale* block, int g) { return block + g * kInt4zGroupBytes; }
  static __m512 scales(const Scale* record) { return _mm512_loadu_ps(record); }
  static __m512i offset(const Scale* record, int32_t x_sum) {
    const __m512i zeros = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(record + 64)));
    return _mm512_mullo_epi32(zeros, _mm512_set1_epi32(x_sum));
  }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
};

// fp4: E2M1 codes looked up (vpshufb, in each 128-bit lane) as twice their value + 12, E8M0
// scales built as float bits (kernels/types.hpp), the doubling halved at the end.
struct Fp4Codes : OffsetThenScale<Fp4Codes> {
  using Scale = uint8_t;
  static constexpr int kOffset = kFp4Offset;
  static constexpr float kFinal = 0.5f;
  static __m512i table() {
    alignas(16) int8_t t[16];
    for (int c = 0; c < 16; ++c) t[c] = static_cast<int8_t>(kFp4Doubled[c] + kFp4Offset);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  static __m512i decode(__m512i nibbles, __m512i table) { return _mm512_shuffle_epi8(table, nibbles); }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m512 scales(const Scale* e) {
    const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e))), 23);
    return _mm512_castsi512_ps(_mm512_max_epu32(bits, _mm512_set1_epi32(static_cast<int>(kE8m0MinBits))));
  }
  static __m512i offset(const Scale*, int32_t x_sum) { return _mm512_set1_epi32(kFp4Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_e8m0(b); }
};

// nvfp4: fp4's codes; its UE4M3 scales widened exactly through float16 (kernels/types.hpp), the
// 2^-8 that leaves and the doubling undone at the end (the tensor's scale: the kernels provider's).
struct Nvfp4Codes : OffsetThenScale<Nvfp4Codes> {
  using Scale = uint8_t;
  static constexpr int kOffset = kFp4Offset;
  static constexpr float kFinal = kNvfp4Final;
  static __m512i table() { return Fp4Codes::table(); }
  static __m512i decode(__m512i nibbles, __m512i table) { return _mm512_shuffle_epi8(table, nibbles); }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m512 scales(const Scale* e) {
    const __m256i halves = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e))), 7);
    return _mm512_cvtph_ps(halves);
  }
  static __m512i offset(const Scale*, int32_t x_sum) { return _mm512_set1_epi32(kFp4Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_e8m0(b); }
};

// q4k (GGUF's Q4_K): unsigned nibbles as int4z's; each group's sums scaled by d * sc_j and its
// activation sum times dmin * m_j taken off, both from the super-block's record (types.hpp).
struct Q4kCodes {
  using Scale = uint8_t;
  static constexpr float kFinal = 1.f;
  static __m512i table() { return _mm512_setzero_si512(); }
  static __m512i decode(__m512i nibbles, __m512i) { return nibbles; }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m512 bytes(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static __m512 halves(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 accumulate(const Scale* block, int g, __m512i sums, int32_t x_sum, __m512 accf) {
    const uint8_t* r = block + (g / kQ4kGroupsPerSuper) * kQ4kSuperBytes;
    const int j = (g % kQ4kGroupsPerSuper) * 16;
    const __m512 scale = _mm512_mul_ps(halves(r), bytes(r + kQ4kSubScales + j));
    const __m512 minimum = _mm512_mul_ps(halves(r + 32), bytes(r + kQ4kMins + j));
    accf = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, accf);
    return _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(x_sum)), minimum, accf);
  }
};

// q6k (GGUF's Q6_K): unsigned 6-bit codes, w = d * sc_j * (q - 32): each group's sums less 32
// times its activation sum, scaled by d * sc_j from the super-block's record (types.hpp).
// A super-block record of d[16] (float16) then sc[Groups][16] (int8) a 16-column block (q6k's,
// iq4xs's, types.hpp): each group's sums less Offset times its activation sum, scaled by d * sc_j.
template <int Groups, int SuperBytes, int Offset>
struct SignedGroupScales {
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m512 accumulate(const Scale* block, int g, __m512i sums, int32_t x_sum, __m512 accf) {
    const uint8_t* r = block + (g / Groups) * SuperBytes;
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + kQ6kSubScales + (g % Groups) * 16));
    const __m512 scale = _mm512_mul_ps(Q4kCodes::halves(r), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    const __m512i offset = _mm512_set1_epi32(Offset * x_sum);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums, offset)), scale, accf);
  }
};
// Codes that are their own values (no lookup, no final scale)
struct PlainCodes {
  static constexpr float kFinal = 1.f;
  static __m512i table() { return _mm512_setzero_si512(); }
  static __m512i decode(__m512i nibbles, __m512i) { return nibbles; }
};
struct Q6kCodes : PlainCodes, SignedGroupScales<kQ6kGroupsPerSuper, kQ6kSuperBytes, kQ6kOffset> {
  using Layout = Q6kLine;
};

// q5k (GGUF's Q5_K): Q4_K's scales and mins on 5-bit codes
struct Q5kCodes : Q4kCodes {
  using Layout = Q5kLine;
};

// iq4nl, iq4xs (GGUF's IQ4_NL, IQ4_XS): codes looked up (vpshufb, in each 128-bit lane) as the
// grid's values + 128, the unsigned operand; 128 times the group's activation sum taken off.
// iq4nl: a float16 scale per group; iq4xs: d * sc from the super-block's record (types.hpp).
struct Iq4Lookup {
  static constexpr float kFinal = 1.f;
  static __m512i table() {
    alignas(16) uint8_t t[16];
    for (int c = 0; c < 16; ++c) t[c] = static_cast<uint8_t>(kIq4Values[c] + kIq4Offset);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  static __m512i decode(__m512i nibbles, __m512i table) { return _mm512_shuffle_epi8(table, nibbles); }
};
// A float16 scale a group (int8h's group scales), Offset times the group's activation sum taken off.
template <int Offset>
struct HalfScales : OffsetThenScale<HalfScales<Offset>> {
  using Scale = uint16_t;
  static constexpr int kOffset = Offset;
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m512 scales(const Scale* s) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s))); }
  static __m512i offset(const Scale*, int32_t x_sum) { return _mm512_set1_epi32(Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_scales(b); }
};
struct Iq4nlCodes : Iq4Lookup, HalfScales<kIq4Offset> {};

// q40, q50 (GGUF's Q4_0, Q5_0): unsigned codes less 8 (16), a float16 d a group. q41, q51 (Q4_1,
// Q5_1): the group's record's d scales the sums, its m times the activation sum is added.
struct Q40Codes : PlainCodes, HalfScales<8> {};
struct Q50Codes : PlainCodes, HalfScales<16> {
  using Layout = Q5kLine;
};
struct HalfScalesAndMins : PlainCodes {
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m512 accumulate(const Scale* block, int g, __m512i sums, int32_t x_sum, __m512 accf) {
    const uint8_t* r = block + g * kLegacyGroupBytes;
    accf = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), Q4kCodes::halves(r), accf);
    return _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(x_sum)), Q4kCodes::halves(r + kLegacyMins), accf);
  }
};
struct Q41Codes : HalfScalesAndMins {};
struct Q51Codes : HalfScalesAndMins {
  using Layout = Q5kLine;
};
struct Iq4xsCodes : Iq4Lookup, SignedGroupScales<kQ4kGroupsPerSuper, kIq4xsSuperBytes, kIq4Offset> {};

// q3k (GGUF's Q3_K): unsigned 3-bit codes, q6k's record with offset 4, scales folded: the
// sum of sc_j (S_j - 4 X_j) over the super-block (S_j: a group's sums, X_j its activation sum)
// in int32, times d once (|S_j - 4 X_j| <= 16 * 4 * 128 fits int16, |the sum| <= 2^22 a float).
struct Q3kCodes : PlainCodes, SignedGroupScales<kQ6kGroupsPerSuper, kQ6kSuperBytes, kQ3kOffset> {
  using Layout = Q3kLine;
  static constexpr int kFoldGroups = kQ6kGroupsPerSuper;
  struct Folded {
    __m512i scaled;
  };
  static void fold(const Scale* block, int g, __m512i sums, int32_t x_sum, Folded& f) {
    const uint8_t* r = block + (g / kFoldGroups) * kQ6kSuperBytes;
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + kQ6kSubScales + (g % kFoldGroups) * 16));
    // sc's upper 16 bits cleared: the pairs' second products vanish whatever the sums' sign
    const __m512i sc16 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc), _mm512_set1_epi32(0xFFFF));
    f.scaled = dpwssd(f.scaled, _mm512_sub_epi32(sums, _mm512_set1_epi32(kQ3kOffset * x_sum)), sc16);
  }
  static __m512 flush(const Scale* block, int super, const Folded& f, __m512 accf) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(f.scaled), Q4kCodes::halves(block + super * kQ6kSuperBytes), accf);
  }
};

// q2k (GGUF's Q2_K): unsigned 2-bit codes, w = d * sc_j * q - dmin * m_j, sc_j and m_j a byte's
// nibbles (types.hpp's record); scales folded: sum sc_j S_j and sum m_j X_j over the super-block
// in int32, times d and dmin once (|S_j| <= 16 * 3 * 128, |X_j| <= 16 * 128: int16; sc_j, m_j < 16)
struct Q2kCodes : PlainCodes {
  using Layout = Q2kLine;
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static constexpr int kFoldGroups = kQ6kGroupsPerSuper;
  struct Folded {
    __m512i scaled, mins;
  };
  static void fold(const Scale* block, int g, __m512i sums, int32_t x_sum, Folded& f) {
    const uint8_t* r = block + (g / kFoldGroups) * kQ2kSuperBytes;
    const __m512i scm = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + kQ2kScalesMins + (g % kFoldGroups) * 16)));
    f.scaled = dpwssd(f.scaled, sums, _mm512_and_si512(scm, _mm512_set1_epi32(0x0F)));
    f.mins = dpwssd(f.mins, _mm512_srli_epi32(scm, 4), _mm512_set1_epi32(x_sum));
  }
  static __m512 flush(const Scale* block, int super, const Folded& f, __m512 accf) {
    const uint8_t* r = block + super * kQ2kSuperBytes;
    accf = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f.scaled), Q4kCodes::halves(r), accf);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(f.mins), Q4kCodes::halves(r + 32), accf);
  }
};

// A 32-byte plane's two-bit fields (types.hpp's put_two_bits) or'd into bits Bit, Bit + 1 of the
// codes: the 32 bytes as both halves of a vector, the upper one shifted by 4, hold line bytes
// b < 32 at bits 0-3 and b >= 32 at bits 4-7 (low nibbles' fields first).
template <int Shift>
inline __m512i shift_bytes(__m512i v) {
  if constexpr (Shift >= 0) return _mm512_slli_epi16(v, Shift);
  else return _mm512_srli_epi16(v, -Shift);
}
template <int Bit>
inline void add_two_bits(const uint8_t* plane, __m512i& lo, __m512i& hi) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
  const __m512i mask = _mm512_set1_epi8(static_cast<char>(3 << Bit));
  lo = _mm512_or_si512(lo, _mm512_and_si512(shift_bytes<Bit>(both), mask));
  hi = _mm512_or_si512(hi, _mm512_and_si512(shift_bytes<Bit - 2>(both), mask));
}
// A 16-byte plane's bits (types.hpp's put_one_bit) as Value: the plane in every 128-bit lane,
// lane l's nibbles t testing bit 2 l + t.
template <int Value>
inline void add_one_bit(const uint8_t* plane, __m512i& lo, __m512i& hi) {
  const __m512i bits = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
  const __m512i low_bit = _mm512_set_epi32(0x40404040, 0x40404040, 0x40404040, 0x40404040, 0x10101010, 0x10101010,
                                           0x10101010, 0x10101010, 0x04040404, 0x04040404, 0x04040404, 0x04040404,
                                           0x01010101, 0x01010101, 0x01010101, 0x01010101);
  const __m512i value = _mm512_set1_epi8(Value);
  lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, low_bit), value));
  hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, _mm512_add_epi8(low_bit, low_bit)), value));
}

// What a line's planes (types.hpp's LineLayout) add to the codes its nibbles (or zeros) begin.
template <class L>
inline void add_planes(const uint8_t* line, __m512i& lo, __m512i& hi) {
  if constexpr (L::kTwoBits >= 0) add_two_bits<L::kTwoBitsAt>(line + L::kTwoBits, lo, hi);
  if constexpr (L::kOneBit >= 0) add_one_bit<1 << L::kOneBitAt>(line + L::kOneBit, lo, hi);
}

// Codes whose sums carry one offset in every column (kOffset times the group's activation sum):
// the tile starts each group's sums at minus that, so no column subtracts it (int8g's way).
template <class Codes, class = void>
struct ConstantOffset : std::integral_constant<int, 0> {};
template <class Codes>
struct ConstantOffset<Codes, std::void_t<decltype(Codes::kOffset)>> : std::integral_constant<int, Codes::kOffset> {};

// A tile's folded sums (FoldsScales): each group's sums folded in, flushed into the float
// accumulators at each super-block's last group.
template <class Codes, int M, int NB, bool = FoldsScales<Codes>::value>
struct Folding {};
template <class Codes, int M, int NB>
struct Folding<Codes, M, NB, true> {
  typename Codes::Folded sums[M][NB] = {};
  // x_scale: each row's activation scales, one a super-block (activation_block)
  void add(const typename Codes::Scale* const* g_scale, int g, const __m512i (&acc)[M][NB],
           const int32_t* const* gsum, const float* const* x_scale, __m512 (&accf)[M][NB]) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) Codes::fold(g_scale[j], g, acc[i][j], gsum[i][g], sums[i][j]);
    if ((g + 1) % Codes::kFoldGroups != 0) return;
    const int super = g / Codes::kFoldGroups;
    for (int i = 0; i < M; ++i) {
      const __m512 xs = _mm512_set1_ps(x_scale[i][super]);
      for (int j = 0; j < NB; ++j) {
        accf[i][j] = _mm512_fmadd_ps(Codes::flush(g_scale[j], super, sums[i][j], _mm512_setzero_ps()), xs, accf[i][j]);
        sums[i][j] = typename Codes::Folded();
      }
    }
  }
};

// Weights are unsigned codes (the u8 operand: int4's w + 8, fp4's 2w + 12, int4z's q), activations
// signed: the sum over a group carries offset * sum_k x (int4z: zero * sum_k x, by column), removed
// per group before scaling. Each group's scaled sums (a super-block's, where they fold) times the
// row's activation scale of that block (x_scale[i][b]), fused into the accumulators; with one
// scale a row (token_scales: each block's slot holds it), the scaled sums accumulate and that
// scale is applied once at the end, a multiply a group and row fewer.
template <class Codes, int M, int NB>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void nibble_tile(const int8_t* const* x, const int32_t* const* gsum, const float* const* x_scale,
                                           const uint8_t* const* panel, const typename Codes::Scale* const* g_scale,
                                           int groups, int group, float* out, int64_t ld, bool token_scales) {
  __m512 accf[M][NB];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) accf[i][j] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), table = Codes::table();
  const int steps = (folded_group<Codes>() ? folded_group<Codes>() : group) / 8;
  [[maybe_unused]] Folding<Codes, M, NB> folding;
  for (int g = 0; g < groups; ++g) {
    constexpr int kOffset = ConstantOffset<Codes>::value;
    __m512i acc[M][NB];
    for (int i = 0; i < M; ++i) {
      const __m512i start = _mm512_set1_epi32(-kOffset * gsum[i][g]);
      for (int j = 0; j < NB; ++j) acc[i][j] = start;
    }
    for (int s = 0; s < steps; ++s) {
      const int p = g * steps + s;
      __m512i lo[NB], hi[NB];
      for (int j = 0; j < NB; ++j) {
        constexpr int kLine = LayoutOf<Codes>::type::kBytes;
        const uint8_t* line = panel[j] + p * kLine;
        if (kLine >= 64 || 64 % kLine != 0 || (p * kLine) % 64 == 0)  // a cache line's first line
          _mm_prefetch(reinterpret_cast<const char*>(line + kStreamAheadLines * kLine), _MM_HINT_T1);
        if (kLine % 64 != 0 && 64 % kLine != 0)  // lines that cross cache lines: their last byte's too
          _mm_prefetch(reinterpret_cast<const char*>(line + (kStreamAheadLines + 1) * kLine - 1), _MM_HINT_T1);
        if constexpr (LayoutOf<Codes>::type::kNibbles) {
          const __m512i v = _mm512_loadu_si512(line);
          lo[j] = Codes::decode(_mm512_and_si512(v, low), table);
          hi[j] = Codes::decode(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), table);
        } else {
          lo[j] = hi[j] = _mm512_setzero_si512();
        }
        add_planes<typename LayoutOf<Codes>::type>(line, lo[j], hi[j]);
      }
      for (int i = 0; i < M; ++i) {
        __m512i a_lo = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
        __m512i a_hi = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
        for (int j = 0; j < NB; ++j) {
          acc[i][j] = dpbusd(acc[i][j], lo[j], a_lo);
          acc[i][j] = dpbusd(acc[i][j], hi[j], a_hi);
        }
      }
    }
    if constexpr (FoldsScales<Codes>::value) {
      folding.add(g_scale, g, acc, gsum, x_scale, accf);
    } else if (token_scales) {
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < NB; ++j)
          accf[i][j] = Codes::accumulate(g_scale[j], g, acc[i][j], kOffset ? 0 : gsum[i][g], accf[i][j]);
    } else {
      for (int i = 0; i < M; ++i) {
        const __m512 xs = _mm512_set1_ps(x_scale[i][g]);
        for (int j = 0; j < NB; ++j)
          accf[i][j] = _mm512_fmadd_ps(
              Codes::accumulate(g_scale[j], g, acc[i][j], kOffset ? 0 : gsum[i][g], _mm512_setzero_ps()), xs, accf[i][j]);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    const bool once = !FoldsScales<Codes>::value && token_scales;
    const __m512 final_scale = _mm512_set1_ps(Codes::kFinal * (once ? x_scale[i][0] : 1.f));
    for (int j = 0; j < NB; ++j)
      _mm512_storeu_ps(out + i * ld + j * 16,
                       Codes::kFinal == 1.f && !once ? accf[i][j] : _mm512_mul_ps(accf[i][j], final_scale));
  }
}

// nibble_tile as the grouped elements' driver takes a tile (kernels.cpp)
template <class Codes>
struct NibbleTile {
  template <int M, int NB>
  struct Tile {
    template <typename... A>
    static void run(A... a) { nibble_tile<Codes, M, NB>(a...); }
  };
};

#endif  // __AVX512VNNI__
}  // namespace
}  // namespace kt
