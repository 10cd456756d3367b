// The AVX2 kernels of the nibble elements (int4, fp4, int4z, q4k, iq4) and of the other K-quants'
// codes (q5k, q6k: nibbles and high bits; q3k, q2k: bit planes): a part of arch/x86/avx2/kernels.cpp, included
// there after its prefetch_panel and load_scales (in the same unnamed namespace).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/types.hpp"

namespace kt {
namespace {

// int4: a step's two pmaddubsw products (nibble x activation pairs, |sum| <= 2 * 15 * 127 each)
// add up in 16 bits for kInt4Steps16 steps (4 * 7620 = 30480 < 32767: exact, never wraps)
// before one pmaddwd widens them: 2.25 multiplies per 16 x 8 products instead of 3. Every
// int4 group size (32, 64, 128: 4, 8, 16 steps) is a multiple of it.
constexpr int kInt4Steps16 = 4;

// A group's int32 sums (half h of a block's 16 columns) into the float accumulator: the offset they
// carry taken off, then scaled (Codes: group(block, g) the group's metadata, scales(meta, h) half h's
// 8 scales, offset(meta, h, x_sum) what half h's sums carry).
template <class Codes>
struct OffsetThenScale {
  template <typename Scale>
  static __m256 accumulate(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, __m256 accf) {
    const Scale* meta = Codes::group(block, g);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums, Codes::offset(meta, h, x_sum))),
                           Codes::scales(meta, h), accf);
  }
};

// What a nibble element's panel holds. int4: the nibbles themselves, w + 8, bf16 group scales.
struct Int4Codes : OffsetThenScale<Int4Codes> {
  using Scale = uint16_t;
  static constexpr int kSteps16 = kInt4Steps16;
  static constexpr float kFinal = 1.f;
  static __m256i table() { return _mm256_setzero_si256(); }
  static __m256i decode(__m256i nibbles, __m256i) { return nibbles; }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m256 scales(const Scale* s, int h) { return load_scales(s + h * 8); }
  static __m256i offset(const Scale*, int, int32_t x_sum) { return _mm256_set1_epi32(8 * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_scales(b); }
};

// int4z: unsigned nibbles q (int4's sums: 16-bit safe for 4 steps), the record of
// kernels/types.hpp (float32 scales, then zero points), each column's zero times the group's
// activation sum taken off.
struct Int4zCodes : OffsetThenScale<Int4zCodes> {
  using Scale = uint8_t;
  static constexpr int kSteps16 = kInt4Steps16;
  static constexpr float kFinal = 1.f;
  static __m256i table() { return _mm256_setzero_si256(); }
  static __m256i decode(__m256i nibbles, __m256i) { return nibbles; }
  static const Scale* group(const Scale* block, int g) { return block + g * kInt4zGroupBytes; }
  static __m256 scales(const Scale* record, int h) { return _mm256_loadu_ps(reinterpret_cast<const float*>(record) + h * 8); }
  static __m256i offset(const Scale* record, int h, int32_t x_sum) {
    const __m256i zeros = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(record + 64 + h * 8)));
    return _mm256_mullo_epi32(zeros, _mm256_set1_epi32(x_sum));
  }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
};

// fp4: E2M1 codes looked up (vpshufb) as twice their value + 12, in [0, 24]: a step's pair sums
// reach 2 * 2 * 24 * 127 = 12192, so 16-bit sums hold 2 steps, not 4. E8M0 scales built as float
// bits (kernels/types.hpp), the doubling halved at the end.
struct Fp4Codes : OffsetThenScale<Fp4Codes> {
  using Scale = uint8_t;
  static constexpr int kSteps16 = 2;
  static constexpr float kFinal = 0.5f;
  static __m256i table() {
    alignas(16) int8_t t[16];
    for (int c = 0; c < 16; ++c) t[c] = static_cast<int8_t>(kFp4Doubled[c] + kFp4Offset);
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  static __m256i decode(__m256i nibbles, __m256i table) { return _mm256_shuffle_epi8(table, nibbles); }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m256 scales(const Scale* e, int h) {
    const __m256i bits =
        _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e + h * 8))), 23);
    return _mm256_castsi256_ps(_mm256_max_epu32(bits, _mm256_set1_epi32(static_cast<int>(kE8m0MinBits))));
  }
  static __m256i offset(const Scale*, int, int32_t x_sum) { return _mm256_set1_epi32(kFp4Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_e8m0(b); }
};

// nvfp4: fp4's codes and sums; its UE4M3 scales widened exactly through float16 (kernels/types.hpp),
// the 2^-8 that leaves and the doubling undone at the end (the tensor's scale: the kernels provider's).
struct Nvfp4Codes : OffsetThenScale<Nvfp4Codes> {
  using Scale = uint8_t;
  static constexpr int kSteps16 = Fp4Codes::kSteps16;
  static constexpr float kFinal = kNvfp4Final;
  static __m256i table() { return Fp4Codes::table(); }
  static __m256i decode(__m256i nibbles, __m256i table) { return _mm256_shuffle_epi8(table, nibbles); }
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m256 scales(const Scale* e, int h) {
    const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e + h * 8)));
    return _mm256_cvtph_ps(_mm_slli_epi16(codes, 7));
  }
  static __m256i offset(const Scale*, int, int32_t x_sum) { return _mm256_set1_epi32(kFp4Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_e8m0(b); }
};

// q4k (GGUF's Q4_K): unsigned nibbles as int4z's; each group's sums scaled by d * sc_j and its
// activation sum times dmin * m_j taken off, both from the super-block's record (types.hpp).
struct Q4kCodes {
  using Scale = uint8_t;
  static constexpr int kSteps16 = kInt4Steps16;
  static constexpr float kFinal = 1.f;
  static __m256i table() { return _mm256_setzero_si256(); }
  static __m256i decode(__m256i nibbles, __m256i) { return nibbles; }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m256 bytes(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static __m256 halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m256 accumulate(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, __m256 accf) {
    const uint8_t* r = block + (g / kQ4kGroupsPerSuper) * kQ4kSuperBytes;
    const int j = (g % kQ4kGroupsPerSuper) * 16 + h * 8;
    const __m256 scale = _mm256_mul_ps(halves(r + h * 16), bytes(r + kQ4kSubScales + j));
    const __m256 minimum = _mm256_mul_ps(halves(r + 32 + h * 16), bytes(r + kQ4kMins + j));
    accf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, accf);
    return _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(x_sum)), minimum, accf);
  }
};

// q6k (GGUF's Q6_K): unsigned 6-bit codes, w = d * sc_j * (q - 32): each group's sums less 32
// times its activation sum, scaled by d * sc_j from the super-block's record (types.hpp). A
// step's two pair sums reach 2 * 2 * 63 * 127 = 32004: 16-bit sums hold one step.
// A super-block record of d[16] (float16) then sc[Groups][16] (int8) a 16-column block (q6k's,
// iq4xs's, types.hpp): each group's sums less Offset times its activation sum, scaled by d * sc_j.
template <int Groups, int SuperBytes, int Offset>
struct SignedGroupScales {
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m256 accumulate(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, __m256 accf) {
    const uint8_t* r = block + (g / Groups) * SuperBytes;
    const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + kQ6kSubScales + (g % Groups) * 16 + h * 8));
    const __m256 scale = _mm256_mul_ps(Q4kCodes::halves(r + h * 16), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    if (Offset != 0) sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(Offset * x_sum));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, accf);
  }
};
// Codes that are their own values (no lookup, no final scale)
struct PlainCodes {
  static constexpr float kFinal = 1.f;
  static __m256i table() { return _mm256_setzero_si256(); }
  static __m256i decode(__m256i nibbles, __m256i) { return nibbles; }
};
struct Q6kCodes : PlainCodes, SignedGroupScales<kQ6kGroupsPerSuper, kQ6kSuperBytes, kQ6kOffset> {
  using Layout = Q6kLine;
  static constexpr int kSteps16 = 1;
};

// q3k (GGUF's Q3_K): unsigned 3-bit codes, q6k's record with offset 4. A step's two pair sums
// reach 2 * 2 * 7 * 127 = 3556: 16-bit sums hold a group's two steps. Scales folded (types.hpp's
// FoldsScales): sc_j (S_j - 4 X_j) summed over the super-block in int32 (|S_j - 4 X_j| <= 16 * 4
// * 128 an int16, so pmaddwd with sc_j's upper half cleared is the exact product), times d once.
struct Q3kCodes : PlainCodes, SignedGroupScales<kQ6kGroupsPerSuper, kQ6kSuperBytes, kQ3kOffset> {
  using Layout = Q3kLine;
  static constexpr int kSteps16 = 2, kFoldGroups = kQ6kGroupsPerSuper;
  struct Folded {
    __m256i scaled;
  };
  static void fold(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, Folded& f) {
    const uint8_t* r = block + (g / kFoldGroups) * kQ6kSuperBytes;
    const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + kQ6kSubScales + (g % kFoldGroups) * 16 + h * 8));
    const __m256i sc16 = _mm256_and_si256(_mm256_cvtepi8_epi32(sc), _mm256_set1_epi32(0xFFFF));
    const __m256i offset_sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(kQ3kOffset * x_sum));
    f.scaled = _mm256_add_epi32(f.scaled, _mm256_madd_epi16(offset_sums, sc16));
  }
  static __m256 flush(const Scale* block, int super, int h, const Folded& f, __m256 accf) {
    const uint8_t* r = block + super * kQ6kSuperBytes;
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(f.scaled), Q4kCodes::halves(r + h * 16), accf);
  }
};

// q2k (GGUF's Q2_K): unsigned 2-bit codes, w = d * sc_j * q - dmin * m_j, sc_j and m_j a byte's
// nibbles (types.hpp's record); scales folded: sum sc_j S_j and sum m_j X_j over the super-block
// in int32 (pmaddwd: |S_j| <= 16 * 3 * 128 and |X_j| <= 16 * 128 are int16, sc_j and m_j's upper
// halves zero), times d and dmin once
struct Q2kCodes : PlainCodes {
  using Layout = Q2kLine;
  using Scale = uint8_t;
  static constexpr int kSteps16 = 2;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static constexpr int kFoldGroups = kQ6kGroupsPerSuper;
  struct Folded {
    __m256i scaled, mins;
  };
  static void fold(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, Folded& f) {
    const uint8_t* r = block + (g / kFoldGroups) * kQ2kSuperBytes;
    const __m256i scm = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + kQ2kScalesMins + (g % kFoldGroups) * 16 + h * 8)));
    f.scaled = _mm256_add_epi32(f.scaled, _mm256_madd_epi16(sums, _mm256_and_si256(scm, _mm256_set1_epi32(0x0F))));
    f.mins = _mm256_add_epi32(f.mins, _mm256_madd_epi16(_mm256_srli_epi32(scm, 4), _mm256_set1_epi32(x_sum)));
  }
  static __m256 flush(const Scale* block, int super, int h, const Folded& f, __m256 accf) {
    const uint8_t* r = block + super * kQ2kSuperBytes;
    accf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f.scaled), Q4kCodes::halves(r + h * 16), accf);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(f.mins), Q4kCodes::halves(r + 32 + h * 16), accf);
  }
};

// q5k (GGUF's Q5_K): Q4_K's scales and mins on 5-bit codes: a step's two pair sums reach
// 2 * 2 * 31 * 127 = 15748, so 16-bit sums hold two steps.
struct Q5kCodes : Q4kCodes {
  using Layout = Q5kLine;
  static constexpr int kSteps16 = 2;
};

// iq4nl, iq4xs (GGUF's IQ4_NL, IQ4_XS): codes looked up (vpshufb) as the grid's signed values,
// which take int8's |w| * sign(x, w) products (as w + 128 a pmaddubsw pair would saturate), each
// pair sum widened at once (SignedValues). iq4nl: a float16 scale per group; iq4xs: d * sc from
// the super-block's record (types.hpp).
struct Iq4Lookup {
  static constexpr int kSteps16 = 1;
  static constexpr float kFinal = 1.f;
  static __m256i table() { return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values))); }
  static __m256i decode(__m256i nibbles, __m256i table) { return _mm256_shuffle_epi8(table, nibbles); }
};
// A float16 scale a group (int8h's group scales), Offset times the group's activation sum taken off.
template <int Offset>
struct HalfScales : OffsetThenScale<HalfScales<Offset>> {
  using Scale = uint16_t;
  static const Scale* group(const Scale* block, int g) { return block + g * 16; }
  static __m256 scales(const Scale* s, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + h * 8)));
  }
  static __m256i offset(const Scale*, int, int32_t x_sum) { return _mm256_set1_epi32(Offset * x_sum); }
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_scales(b); }
};
struct Iq4nlCodes : Iq4Lookup, HalfScales<0> {};  // signed values: no offset
struct Iq4xsCodes : Iq4Lookup, SignedGroupScales<kQ4kGroupsPerSuper, kIq4xsSuperBytes, 0> {};  // signed values: no offset
// q40, q50 (GGUF's Q4_0, Q5_0): unsigned codes less 8 (16), a float16 d a group; 16-bit sums hold
// int4's (q5k's) steps. q41, q51 (Q4_1, Q5_1): the group's record's d scales the sums, its m times
// the activation sum is added.
struct Q40Codes : PlainCodes, HalfScales<8> {
  static constexpr int kSteps16 = kInt4Steps16;
};
struct Q50Codes : PlainCodes, HalfScales<16> {
  using Layout = Q5kLine;
  static constexpr int kSteps16 = 2;
};
struct HalfScalesAndMins : PlainCodes {
  using Scale = uint8_t;
  static const Scale* scales_of(const PackedMatrix& w, int b) { return w.block_meta(b); }
  static __m256 accumulate(const Scale* block, int g, int h, __m256i sums, int32_t x_sum, __m256 accf) {
    const uint8_t* r = block + g * kLegacyGroupBytes + h * 16;
    accf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), Q4kCodes::halves(r), accf);
    return _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(x_sum)), Q4kCodes::halves(r + kLegacyMins), accf);
  }
};
struct Q41Codes : HalfScalesAndMins {
  static constexpr int kSteps16 = kInt4Steps16;
};
struct Q51Codes : HalfScalesAndMins {
  using Layout = Q5kLine;
  static constexpr int kSteps16 = 2;
};

template <class Codes>
struct SignedValues : std::false_type {};
template <>
struct SignedValues<Iq4nlCodes> : std::true_type {};
template <>
struct SignedValues<Iq4xsCodes> : std::true_type {};

// A 32-byte plane's two-bit fields (types.hpp's put_two_bits) or'd into bits Bit, Bit + 1 of the
// codes: byte b holds line bytes b (bits 0-3: low nibble's, high's) and b + 32 (bits 4-7).
template <int Shift>
inline __m256i shift_bytes(__m256i v) {
  if constexpr (Shift >= 0) return _mm256_slli_epi16(v, Shift);
  else return _mm256_srli_epi16(v, -Shift);
}
template <int Bit>
inline void add_two_bits(const uint8_t* plane, __m256i (&lo)[2], __m256i (&hi)[2]) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane));
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(3 << Bit));
  lo[0] = _mm256_or_si256(lo[0], _mm256_and_si256(shift_bytes<Bit>(bits), mask));
  hi[0] = _mm256_or_si256(hi[0], _mm256_and_si256(shift_bytes<Bit - 2>(bits), mask));
  lo[1] = _mm256_or_si256(lo[1], _mm256_and_si256(shift_bytes<Bit - 4>(bits), mask));
  hi[1] = _mm256_or_si256(hi[1], _mm256_and_si256(shift_bytes<Bit - 6>(bits), mask));
}
// A 16-byte plane's bits (types.hpp's put_one_bit) as Value: the plane in both 128-bit lanes, a
// code's bit tested in place (a mask a lane: bit 2 (b / 16) + t of byte b % 16).
template <int Value>
inline void add_one_bit(const uint8_t* plane, __m256i (&lo)[2], __m256i (&hi)[2]) {
  const __m256i bits = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
  const auto bit = [bits](int first) {  // lanes 0-15 test bit `first`, 16-31 bit first + 2
    const __m256i mask = _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(1 << first)),
                                           _mm_set1_epi8(static_cast<char>(1 << (first + 2))));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask), _mm256_set1_epi8(Value));
  };
  lo[0] = _mm256_or_si256(lo[0], bit(0)), hi[0] = _mm256_or_si256(hi[0], bit(1));
  lo[1] = _mm256_or_si256(lo[1], bit(4)), hi[1] = _mm256_or_si256(hi[1], bit(5));
}

// What a line's planes (types.hpp's LineLayout) add to the codes its nibbles (or zeros) begin.
template <class L>
inline void add_planes(const uint8_t* line, __m256i (&lo)[2], __m256i (&hi)[2]) {
  if constexpr (L::kTwoBits >= 0) add_two_bits<L::kTwoBitsAt>(line + L::kTwoBits, lo, hi);
  if constexpr (L::kOneBit >= 0) add_one_bit<1 << L::kOneBitAt>(line + L::kOneBit, lo, hi);
}

// A tile's folded sums (types.hpp's FoldsScales), each half of its 16 columns: each group's sums
// folded in, flushed into the float accumulators at each super-block's last group.
template <class Codes, int M, bool = FoldsScales<Codes>::value>
struct Folding {};
template <class Codes, int M>
struct Folding<Codes, M, true> {
  typename Codes::Folded sums[M][2] = {};
  // x_scale: each row's activation scales, one a super-block (activation_block)
  void add(const typename Codes::Scale* g_scale, int g, const __m256i (&acc)[M][2], const int32_t* const* gsum,
           const float* const* x_scale, __m256 (&accf)[M][2]) {
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) Codes::fold(g_scale, g, h, acc[i][h], gsum[i][g], sums[i][h]);
    if ((g + 1) % Codes::kFoldGroups != 0) return;
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) {
        accf[i][h] = _mm256_fmadd_ps(Codes::flush(g_scale, g / Codes::kFoldGroups, h, sums[i][h], _mm256_setzero_ps()),
                                     _mm256_set1_ps(x_scale[i][g / Codes::kFoldGroups]), accf[i][h]);
        sums[i][h] = typename Codes::Folded();
      }
  }
};

template <class Codes>
struct NibbleTile {
 template <int M, int NB>
 struct Tile {
  static void run(const int8_t* const* x, const int32_t* const* gsum, const float* const* xs, const uint8_t* panel,
                  const typename Codes::Scale* g_scale, int groups, int group, float* out, int64_t ld) {
    constexpr int kSteps16 = Codes::kSteps16;
    __m256 accf[M][2];
    for (int i = 0; i < M; ++i) accf[i][0] = accf[i][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), table = Codes::table();
    const int steps = (folded_group<Codes>() ? folded_group<Codes>() : group) / 8;
    [[maybe_unused]] Folding<Codes, M> folding;
    for (int g = 0; g < groups; ++g) {
      __m256i acc[M][2];
      for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
      for (int s0 = g * steps; s0 < (g + 1) * steps; s0 += kSteps16) {
        __m256i acc16[M][2];
        for (int i = 0; i < M; ++i) acc16[i][0] = acc16[i][1] = _mm256_setzero_si256();
        for (int p = s0; p < s0 + kSteps16; ++p) {
          constexpr int kLine = LayoutOf<Codes>::type::kBytes;
          const uint8_t* line = panel + p * kLine;
          prefetch_panel(line);
          if (kLine % 64 != 0 && 64 % kLine != 0) prefetch_panel(line + kLine - 1);  // it crosses cache lines
          __m256i lo[2], hi[2];
          for (int h = 0; h < 2; ++h) {
            if constexpr (LayoutOf<Codes>::type::kNibbles) {
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + h * 32));
              lo[h] = Codes::decode(_mm256_and_si256(v, low), table);
              hi[h] = Codes::decode(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), table);
            } else {
              lo[h] = hi[h] = _mm256_setzero_si256();
            }
          }
          add_planes<typename LayoutOf<Codes>::type>(line, lo, hi);
          if constexpr (SignedValues<Codes>::value) {
            const __m256i lo_abs[2] = {_mm256_abs_epi8(lo[0]), _mm256_abs_epi8(lo[1])};
            const __m256i hi_abs[2] = {_mm256_abs_epi8(hi[0]), _mm256_abs_epi8(hi[1])};
            for (int i = 0; i < M; ++i) {
              __m256i a_lo = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
              __m256i a_hi = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
              for (int h = 0; h < 2; ++h) {
                const __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(lo_abs[h], _mm256_sign_epi8(a_lo, lo[h])), ones);
                const __m256i u = _mm256_madd_epi16(_mm256_maddubs_epi16(hi_abs[h], _mm256_sign_epi8(a_hi, hi[h])), ones);
                acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_add_epi32(l, u));
              }
            }
            continue;
          }
          for (int i = 0; i < M; ++i) {
            __m256i a_lo = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
            __m256i a_hi = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
            for (int h = 0; h < 2; ++h)
              acc16[i][h] = _mm256_add_epi16(
                  acc16[i][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], a_lo), _mm256_maddubs_epi16(hi[h], a_hi)));
          }
        }
        if constexpr (!SignedValues<Codes>::value)  // the signed values' sums are int32 already
          for (int i = 0; i < M; ++i)
            for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(acc16[i][h], ones));
      }
      if constexpr (FoldsScales<Codes>::value) {
        folding.add(g_scale, g, acc, gsum, xs, accf);
      } else {  // the group's scaled sums times the row's activation scale of the group
        for (int i = 0; i < M; ++i)
          for (int h = 0; h < 2; ++h)
            accf[i][h] = _mm256_fmadd_ps(Codes::accumulate(g_scale, g, h, acc[i][h], gsum[i][g], _mm256_setzero_ps()),
                                         _mm256_set1_ps(xs[i][g]), accf[i][h]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(out + i * ld + h * 8,
                         Codes::kFinal == 1.f ? accf[i][h] : _mm256_mul_ps(accf[i][h], _mm256_set1_ps(Codes::kFinal)));
  }
 };
};

}  // namespace
}  // namespace kt
