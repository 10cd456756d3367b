// Data layouts shared by every backend. All backends read the same packed weights, so
// they can be compared on identical data and switched at run time.
//
// A weight matrix W[N][K] (N outputs, K inputs; Hugging Face layout) is packed in
// blocks of 16 output columns, each block a contiguous K-long panel in the order the
// kernels read it:
//   bf16: [N/16][K/2][16][2]  bf16        one 64-byte line = 16 columns x 2 k
//   int8: [N/16][K/4][16][4]  int8        one 64-byte line = 16 columns x 4 k
//   int4: [N/16][K/8][16][4]  nibbles     byte (col, b): low = k 8q+b, high = k 8q+4+b,
//                                         stored as w+8 in [0, 15]
//   fp4:  [N/16][K/8][16][4]  nibbles     int4's order, each an E2M1 code (MXFP4's values)
//   int4z: [N/16][K/8][16][4] nibbles     int4's order, each q in [0, 15]: w = (q - zero) * scale
//   q4k:  [N/16][K/8][16][4]  nibbles     int4's order, each q in [0, 15]: GGUF's Q4_K (below)
//   q5k:  [N/16][K/8][80]     5-bit codes line j: int4's 64 bytes of low nibbles, then 16 bytes
//                                         of the codes' high bits (below): GGUF's Q5_K
//   q6k:  [N/16][K/8][96]     6-bit codes line j: int4's 64 bytes of low nibbles, then 32 bytes
//                                         of the codes' high two bits (below): GGUF's Q6_K
//   q3k:  [N/16][K/8][48]     3-bit codes line j: 32 bytes of their low two bits (q6k's high-bit
//                                         plane), then 16 of their third bits (q5k's): GGUF's Q3_K
//   q2k:  [N/16][K/8][32]     2-bit codes line j: q6k's high-bit plane alone: GGUF's Q2_K
//   iq4nl, iq4xs: [N/16][K/8][16][4] nibbles  int4's order, each a code of GGUF's IQ4 grid (below)
//   q40, q41: [N/16][K/8][16][4] nibbles  int4's order, unsigned codes: GGUF's Q4_0, Q4_1 (below)
//   q50, q51: q5k's lines, 5-bit codes: GGUF's Q5_0, Q5_1 (below)
//   int8g: [N/16][K/4][16][4] uint8       int8's order, each value stored as w+128 (the
//                                         unsigned operand of u8 x s8 dot products)
//   int8h: int8g's layout, float16 group scales (GGUF's Q8_0)
//   fp8:  [N/16][K][16]       E4M3 codes  one 64-byte line = 16 columns x 4 k: a k's 16
//                                         columns widen to one fp32 vector
//   f16, f32: [N/16][K][16]   float16 or float32 values: a k's 16 columns, one fp32 vector
// N is padded to a multiple of 16 and K to the element's step (32, 64, or the group size of
// a grouped element) with zeros, so kernels have no tails. A 16-column block's panel is also exactly an
// AMX B tile stream: 16 rows of 64 bytes per 32 bf16 / 64 int8 values of K.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "formats.gen.hpp"  // Element (the packed value families) and Method (the formats)
#include "runtime/aligned.hpp"

namespace kt {

// K is padded to whole AMX tiles (32 bf16 or 64 int8 values a row), so every backend reads
// the same layout and the tile kernels have no K tail.
// q4k, q5k, iq4xs: K is padded to whole super-blocks (formats.json's k_step), its groups are their
// 32-value sub-blocks; q6k, q3k and q2k likewise, their groups 16-value sub-blocks.
constexpr int kQ4kSuperBlock = 256, kQ4kGroupsPerSuper = 8, kQ6kGroupsPerSuper = 16;
// GGUF's K-quants; q4k and q5k share Q4_K's record of scales and mins (below)
inline bool k_quant(Element m) {
  return m == Element::q4k || m == Element::q5k || m == Element::q6k || m == Element::iq4xs || m == Element::q3k ||
         m == Element::q2k;
}
inline bool q4k_records(Element m) { return m == Element::q4k || m == Element::q5k; }
// Plain floats (GGUF's F16, F32): fp32 FMA on the exact activations, no scales.
inline bool floats(Element m) { return m == Element::f16 || m == Element::f32; }
// GGUF's i-quants (llama.cpp's IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S): per 8 values of K (IQ3_XXS: per
// 4) an index into a fixed grid of small values (kernels/lattice.hpp), with signs, per 16 or 32 a
// 4-bit (IQ1_S: 3-bit) scale, per super-block of 256 a float16 d.
inline bool lattice(Element m) {
  return m == Element::iq2xxs || m == Element::iq2xs || m == Element::iq3xxs || m == Element::iq1s;
}
inline int k_step(Element m, int group) {
  return m == Element::bf16 || floats(m) ? 32 : m == Element::int8 ? 64 : k_quant(m) || lattice(m) ? kQ4kSuperBlock : group;
}
// GGUF's Q4_0, Q4_1, Q5_0 and Q5_1, a float16 d per group of 32: q40 w = d * (q - 8), q50 w = d *
// (q - 16), their d int8h's group scales; q41, q51 w = d * q + m, d and m per 16-column block and
// group one record: d[16], m[16] (float16 bits). q40 and q41 are int4's panels of unsigned nibbles,
// q50 and q51 q5k's lines. A group's int32 sum, less its offset times the activation sum, is
// scaled by d; m times the activation sum is added.
inline bool legacy(Element m) {
  return m == Element::q40 || m == Element::q41 || m == Element::q50 || m == Element::q51;
}
inline bool legacy_mins(Element m) { return m == Element::q41 || m == Element::q51; }
constexpr int kLegacyGroupBytes = 16 * 2 * 2, kLegacyMins = 32;
inline int legacy_offset(Element m) { return m == Element::q40 ? 8 : m == Element::q50 ? 16 : 0; }

// Elements with a scale per group of K values (int4, int8g, fp8, fp4); the others have none or one a row.
inline bool grouped(Element m) {
  return m == Element::int4 || m == Element::int8g || m == Element::fp8 || m == Element::mxfp8 || m == Element::fp4 ||
         m == Element::nvfp4 || m == Element::int4z || m == Element::int8h || m == Element::iq4nl || k_quant(m) || legacy(m) || lattice(m);
}
// Elements whose activations are int8 (Activations::q); grouped ones also carry per-group sums.
inline bool int8_activations(Element m) {
  return m == Element::int8 || m == Element::int4 || m == Element::int8g || m == Element::fp4 || m == Element::nvfp4 ||
         m == Element::int4z || m == Element::int8h || m == Element::iq4nl || k_quant(m) || legacy(m) || lattice(m);
}
// GGUF's IQ4_NL and IQ4_XS: int4's nibbles, each a code of a fixed non-linear grid (llama.cpp's
// kvalues_iq4nl), w = scale * kIq4Values[code]. IQ4_NL: a float16 scale per 32 (int8h's scales);
// IQ4_XS: per super-block of 256 a float16 d and per 32 a 6-bit ls, scale d * (ls - 32), kept as
// q6k keeps its d and sc (one record a 16-column block and super-block: d[16], sc[8][16] int8).
// VNNI takes the codes looked up as value + 128 (in [1, 241], the unsigned operand) and 128
// times the group's activation sum off; AVX2's pmaddubsw would saturate on that, so it takes
// the values signed (|w| * sign(x, w), int8's trick); the tiles take them signed (tdpbssd).
inline bool iq4(Element m) { return m == Element::iq4nl || m == Element::iq4xs; }
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int kIq4Offset = 128;
constexpr int kIq4xsSuperBytes = 16 * 2 + kQ4kGroupsPerSuper * 16, kIq4xsSubScales = 32;
// iq4xs's portable row record, one a super-block (ktforge.formats.quantize): d (float16), sc[8] (ls - 32).
constexpr int kIq4xsRowRecordBytes = 2 + kQ4kGroupsPerSuper;

// Values of K one activation scale covers (int8 activations): the weights' group, whose int32
// sums every kernel scales anyway (one multiply more a group); a super-block of 256 where the
// kernels fold its groups' sums in int32 before scaling (q3k, q2k: llama.cpp's Q8_K blocks);
// for per-row int8, blocks of 128 (64 where K pads to an odd multiple of 64), each block's int32
// sums scaled and added in float. An outlier channel so sets the scale of its block only, not
// of the whole token. formats.json's activation_block says which (kActivationBlocks, generated
// from it).
inline int activation_block(Element m, int group, int Kp) {
  const int block = kActivationBlocks[static_cast<int>(m)];
  return block == 0 ? group : block < 0 ? Kp : std::gcd(block, Kp);
}

// Nibble elements: int4's panel layout, two values a byte.
inline bool nibbles(Element m) {
  return m == Element::int4 || m == Element::fp4 || m == Element::nvfp4 || m == Element::int4z || m == Element::q4k ||
         iq4(m);
}
// int8g's layout and kernels, its scales bfloat16 (int8g) or float16 (int8h)
inline bool int8_groups(Element m) { return m == Element::int8g || m == Element::int8h; }
inline bool group_sums(Element m) { return int8_groups(m) || nibbles(m) || k_quant(m) || legacy(m) || lattice(m); }

// The i-quants' panels: per 16-column block a chunk per 32 values of K, the file's bits of those
// 32 values of its 16 columns regrouped so a line (8 values of K x 16 columns) reads at fixed
// places; their float16 d in group_meta, d[16] a super-block (kernels/lattice.hpp says the rest).
constexpr int kLatticeChunkValues = 32, kLatticeSuperBytes = 16 * 2;
inline int lattice_chunk_bytes(Element m) {
  return m == Element::iq2xxs ? 128 : m == Element::iq2xs ? 144 : m == Element::iq3xxs ? 192 : 96;
}

// int4z: per 16-column block and group, 16 float32 scales then 16 zero points (uint8, in
// [0, 15]): one 80-byte record, so a tile reads one pointer a block.
constexpr int kInt4zGroupBytes = 16 * 4 + 16;

// q4k, GGUF's Q4_K as llama.cpp defines it: per super-block of 256 values of K, float16 d and dmin,
// and per 32-value group j a 6-bit scale sc_j and min m_j: w = d * sc_j * q - dmin * m_j. Per
// 16-column block and super-block one record: d[16], dmin[16] (float16 bits), sc[8][16], m[8][16]
// (bytes). d * sc_j and dmin * m_j are exact in float32 (11 + 6 significant bits), so a group's
// int32 sum of q * x is scaled once and its activation sum times the min taken off once.
constexpr int kQ4kSuperBytes = 16 * 2 * 2 + kQ4kGroupsPerSuper * 16 * 2;
constexpr int kQ4kSubScales = 64, kQ4kMins = 64 + kQ4kGroupsPerSuper * 16;  // offsets in a record
// IEEE half to float, exactly (subnormals included), without F16C (the reference backend).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    float f = static_cast<float>(mant) * 0x1p-24f;  // subnormal or zero: exact
    __builtin_memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
// float to IEEE half, round to nearest even (a finite f below 65520 in magnitude; larger saturate
// to infinity).
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float m = f < 0 ? -f : f;
  if (!(m < 65520.f)) return static_cast<uint16_t>(sign | 0x7C00);
  if (m < 0x1p-14f) {  // subnormal: a multiple of 2^-24, rounded to even by the float addition
    const float scaled = m * 0x1p24f + 0x1p23f;
    uint32_t s;
    __builtin_memcpy(&s, &scaled, 4);
    return static_cast<uint16_t>(sign | (s & 0x7FF));
  }
  const uint32_t a = bits & 0x7FFFFFFFu, rounded = a + 0x0FFF + ((a >> 13) & 1);
  return static_cast<uint16_t>(sign | (((rounded >> 13) - (112u << 10)) & 0x7FFF));
}
// q5k, GGUF's Q5_K: Q4_K's super-blocks and record (above), codes q in [0, 31]: w = d * sc_j * q -
// dmin * m_j. A panel line j is int4's 64 bytes of the codes' low nibbles, then 16 bytes of their
// high bits: bit 2 (b / 16) + t of byte b % 16 holds the high bit of nibble t (0: low, 1: high) of
// line byte b, so each 16-byte lane of a vector that repeats them has its two bits at fixed places.
constexpr int kQ5kLineBytes = 80;

// q6k, GGUF's Q6_K: per super-block of 256 values of K a float16 d, and per 16-value group j a
// signed 8-bit scale sc_j: w = d * sc_j * (q - 32), q in [0, 63]. A panel line j (8 values of K
// x 16 columns) is int4's 64 bytes of the codes' low nibbles, then 32 bytes of their high two
// bits: bits 2t..2t+1 of byte b of those 32 hold the high bits of nibble t of line byte
// b + 32 * (t / 2) (t even: its low nibble; odd: its high). So an AVX2 half's 32 bytes and an
// AVX-512 line's 64 take their high bits from the same 32 bytes by shifts. Per 16-column block
// and super-block one record: d[16] (float16 bits), sc[16][16] (int8). d * sc_j is exact in
// float32 (11 + 8 significant bits); a group's int32 sum of q * x, less 32 times its activation
// sum, is scaled once.
constexpr int kQ6kLineBytes = 96, kQ6kOffset = 32;
constexpr int kQ6kSuperBytes = 16 * 2 + kQ6kGroupsPerSuper * 16, kQ6kSubScales = 32;
// q6k's portable row record, one a super-block (ktforge.formats.quantize): d (float16), sc[16].
constexpr int kQ6kRowRecordBytes = 2 + kQ6kGroupsPerSuper;

// q3k, GGUF's Q3_K: q6k's super-blocks, groups of 16 and record (d, sc_j = the file's 6-bit scale
// less 32), codes q in [0, 7] (the file's 2 low bits, 4 where its hmask bit is set): w = d * sc_j *
// (q - 4). A panel line j is 32 bytes of the codes' low two bits as q6k's high-bit plane holds
// them (bits 2t..2t+1 of byte b for nibble t of int4's line byte b + 32 (t / 2)), then 16 bytes of
// their third bits as q5k's high bits (bit 2 (b / 16) + t of byte b % 16).
constexpr int kQ3kLineBytes = 48, kQ3kOffset = 4;
// q2k, GGUF's Q2_K: per super-block of 256 a float16 d and dmin, per 16-value group j a 4-bit
// scale sc_j and min m_j: w = d * sc_j * q - dmin * m_j, q in [0, 3]. A panel line j is q3k's
// first 32 bytes. Per 16-column block and super-block one record: d[16], dmin[16] (float16 bits),
// scm[16][16] (the file's byte: sc_j low nibble, m_j high), so it packs into the file's bytes.
constexpr int kQ2kLineBytes = 32;
constexpr int kQ2kSuperBytes = 16 * 2 * 2 + kQ6kGroupsPerSuper * 16, kQ2kScalesMins = 64;
// q2k's portable row record, one a super-block: d, dmin (float16), scm[16] (the file's bytes).
constexpr int kQ2kRowRecordBytes = 4 + kQ6kGroupsPerSuper;
// A code's bits in a line's planes, for int4's line byte b (c * 4 + k % 4) and nibble high ((k % 8)
// >= 4): two bits in the 32-byte plane (q6k's high bits, q3k's and q2k's low), one in the 16-byte
// plane (q5k's high bit, q3k's third).
inline void put_two_bits(uint8_t* plane, int b, int high, int v) {
  const int shift = 2 * (2 * (b / 32) + high);
  plane[b % 32] = static_cast<uint8_t>((plane[b % 32] & ~(3 << shift)) | ((v & 3) << shift));
}
inline int two_bits(const uint8_t* plane, int b, int high) { return (plane[b % 32] >> (2 * (2 * (b / 32) + high))) & 3; }
inline void put_one_bit(uint8_t* plane, int b, int high, int v) {
  const int bit = 2 * (b / 16) + high;
  plane[b % 16] = static_cast<uint8_t>((plane[b % 16] & ~(1 << bit)) | ((v & 1) << bit));
}
inline int one_bit(const uint8_t* plane, int b, int high) { return (plane[b % 16] >> (2 * (b / 16) + high)) & 1; }

// A panel line's layout (8 values of K x 16 columns): its bytes, whether int4's 64 bytes of
// nibbles lead (a code's bits 0-3), where a 32-byte plane of two-bit fields is (-1: none) and the
// code's bit it starts at, where a 16-byte plane of single bits is and the code's bit it gives.
// Every backend's decoding of the K-quants' codes reads these, and nothing else, of the layout.
template <int Bytes, bool Nibbles, int TwoBits, int TwoBitsAt, int OneBit, int OneBitAt>
struct LineLayout {
  static constexpr int kBytes = Bytes, kTwoBits = TwoBits, kTwoBitsAt = TwoBitsAt, kOneBit = OneBit;
  static constexpr int kOneBitAt = OneBitAt;
  static constexpr bool kNibbles = Nibbles;
  // a code into int4's line byte b, nibble `high`, and its planes (packing)
  static void put(uint8_t* line, int b, int high, int v) {
    if (Nibbles) line[b] = static_cast<uint8_t>(high ? (line[b] & 0x0F) | ((v & 0x0F) << 4) : (line[b] & 0xF0) | (v & 0x0F));
    if (TwoBits >= 0) put_two_bits(line + TwoBits, b, high, v >> TwoBitsAt);
    if (OneBit >= 0) put_one_bit(line + OneBit, b, high, v >> OneBitAt);
  }
  // the code of int4's line byte b, nibble `high` (scalar: the reference backend)
  static int code(const uint8_t* line, int b, int high) {
    int v = Nibbles ? (high ? line[b] >> 4 : line[b] & 0x0F) : 0;
    if (TwoBits >= 0) v |= two_bits(line + TwoBits, b, high) << TwoBitsAt;
    if (OneBit >= 0) v |= one_bit(line + OneBit, b, high) << OneBitAt;
    return v;
  }
};
using NibbleLine = LineLayout<64, true, -1, 0, -1, 0>;                  // int4's, and q4k's, q40's, ...
using Q5kLine = LineLayout<kQ5kLineBytes, true, -1, 0, 64, 4>;          // q5k's, q50's, q51's
using Q6kLine = LineLayout<kQ6kLineBytes, true, 64, 4, -1, 0>;          // q6k's
using Q3kLine = LineLayout<kQ3kLineBytes, false, 0, 0, 32, 2>;          // q3k's
using Q2kLine = LineLayout<kQ2kLineBytes, false, 0, 0, -1, 0>;          // q2k's
// A backend's codes struct names its line's layout (`using Layout = ...`); a nibble panel's need not.
template <class Codes, class = void>
struct LayoutOf {
  using type = NibbleLine;
};
template <class Codes>
struct LayoutOf<Codes, std::void_t<typename Codes::Layout>> {
  using type = typename Codes::Layout;
};

// Codes that fold their groups' scales in integers over a super-block (Codes::Folded: the
// int32 sums; fold() a group in, flush() scales them once a super-block), for codes of 2-3 bits
// whose group sums fit 16 bits: scaling each group's sums in float was the larger part of
// their decode (AVX-512 q2k, weights in cache on a Zen 4 guest: 1.4-1.8x faster without it).
template <class Codes, class = void>
struct FoldsScales : std::false_type {};
template <class Codes>
struct FoldsScales<Codes, std::void_t<typename Codes::Folded>> : std::true_type {};
// A folding format's group, its super-block's share (a constant count of lines a group,
// unrolled); 0 for the others (the panel's group)
template <class Codes>
constexpr int folded_group() {
  if constexpr (FoldsScales<Codes>::value) return kQ4kSuperBlock / Codes::kFoldGroups;
  else return 0;
}

// q4k's portable row record, one a super-block (ktforge.formats.quantize): d, dmin (float16, little
// endian), sc[8], m[8].
constexpr int kQ4kRowRecordBytes = 2 + 2 + 2 * kQ4kGroupsPerSuper;

// MXFP4 (OCP microscaling): E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2,
// 3, 4, 6) with an E8M0 scale 2^(e - 127) per 32 values. The kernels look a code up as twice its
// value plus 12, in [0, 24] (the unsigned operand of u8 x s8 dot products, as int4's w + 8), take
// 12 * sum_k x off each group's sum, and halve the result: every step exact.
constexpr int kFp4Offset = 12;
constexpr int8_t kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 127) as float bits: e << 23 for e >= 1; e = 0 is the subnormal 2^-127, 1 << 22, which
// is what max(e << 23, 1 << 22) gives (the SIMD kernels' two instructions). e = 255 (NaN) is
// refused at load.
constexpr uint32_t kE8m0MinBits = 1u << 22;
inline float e8m0_to_f32(uint8_t e) {
  const uint32_t bits = std::max(static_cast<uint32_t>(e) << 23, kE8m0MinBits);
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
// The E8M0 code of a power of two e8m0_to_f32 gives.
inline uint8_t f32_to_e8m0(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  return static_cast<uint8_t>(bits >= (1u << 23) ? bits >> 23 : 0);
}

// NVFP4 (NVIDIA's): mxfp4's E2M1 codes, looked up the same way, with per 16 values an unsigned FP8
// scale (UE4M3: 4 exponent bits, bias 7, 3 mantissa bits; 0x7F, NaN, is refused at load) and a
// float32 scale over the whole tensor (ModelOpt's weight_scale_2), kept per row in `scale` and
// applied to each output column after the GEMM (the kernels provider). A UE4M3 code shifted left
// by 7 is the float16 of its value times 2^-8, exactly, subnormals included: the SIMD kernels widen
// it with one shift and vcvtph2ps, and kNvfp4Final undoes the 2^-8 and the doubling.
constexpr float kNvfp4Final = 128.f;
constexpr int kNvfp4Group = 16;
inline float ue4m3_to_f32(uint8_t code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 7;
  return exponent == 0 ? static_cast<float>(mantissa) * 0x1p-9f
                        : (1.f + static_cast<float>(mantissa) / 8.f) * static_cast<float>(1 << exponent) * 0x1p-7f;
}

// MXFP8 (OCP microscaling, MiniMax-M3's release): fp8's E4M3 codes in fp8's panels, with per 32
// values of each row an E8M0 scale (fp4's group_e8m0 layout): fp8's kernels, each group's sums
// scaled by its 16 columns' scales (kE8m0MinBits's float bits) instead of the block's one. Codes
// above 190 (2^63, past what fp8's 2^56 sum scale leaves of float's range) are refused at load.
inline bool fp8_codes(Element m) { return m == Element::fp8 || m == Element::mxfp8; }
constexpr uint8_t kMxfp8MaxScale = 190;

// FP8 E4M3 in the kernels. A code's bits moved into a float's (sign to bit 31, exponent and
// mantissa to bits 26..20) are its value times 2^-120, exactly, subnormals included: two integer
// instructions, no table. The activations are stored times 2^64 (exact), so each product is the
// true one times 2^-56, far above fp32's underflow for every product that matters, and a group's
// sum is scaled by its block scale times 2^56.
constexpr float kFp8ActivationScale = 0x1p64f;
constexpr float kFp8SumScale = 0x1p56f;
constexpr uint32_t kFp8BitsMask = 0x87F00000u;  // of (sign-extended code) << 20
inline float fp8_code_times_2_120(uint8_t code) {
  const uint32_t bits = (static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(code))) << 20) & kFp8BitsMask;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct PackedMatrix {
  Element element = Element::bf16;
  int group = 0;  // the group size of a grouped element, else 0
  int N = 0, K = 0, Np = 0, Kp = 0;
  // The packed values, value_bytes() of them: in `owned`, or in memory the matrix's owner
  // provides by setting `values` before packing (a layer puts all its experts in one
  // huge-page buffer). Not copyable: `values` may point into `owned`.
  uint8_t* values = nullptr;
  aligned_vector<uint8_t> owned;
  // Where a layer's NUMA shares hold the matrix's blocks in their nodes' memory: block b at
  // block_at[b]; empty: every block in `values`, one after another. Kernels read blocks with block().
  std::vector<const uint8_t*> block_at;
  // Its metadata likewise, per kind below: block b's records at meta_at[b][kind] (nullptr: the kind
  // is not this matrix's), the vectors then empty; placed_meta_bytes counts what they held.
  enum MetaKind { kRowScale, kGroupScale, kColsum, kE8m0, kGroupMeta, kBlockScale, kMetaKinds };
  std::vector<std::array<const uint8_t*, kMetaKinds>> meta_at;
  std::size_t placed_meta_bytes = 0;
  // int8, fp8: scale[n]; nvfp4: the tensor's scale, one a row.
  aligned_vector<float> scale;
  // int4, int8g: bf16 group_scale[block][group][16] (16 consecutive columns per group; int8h:
  // float16, Q8_0's): 16-bit
  // scales keep group 32 at Q4_0's and Q8_0's bytes a weight (0.5625, 1.0625); bf16 (not
  // fp16) for its range.
  aligned_vector<uint16_t> group_scale;
  // fp4: the E8M0 scale codes, uint8 group_e8m0[block][group][16] (int4's order): the file's byte
  // a group, so MXFP4 packs into its own bytes; nvfp4: its UE4M3 codes, likewise; mxfp8: its E8M0
  // codes of each row's groups.
  aligned_vector<uint8_t> group_e8m0;
  // int4z: group_meta[block][group][kInt4zGroupBytes]; q41, q51: [block][group][kLegacyGroupBytes];
  // q4k, q5k, q6k, q3k, q2k: group_meta[block][super][k*SuperBytes]
  // (the records above)
  aligned_vector<uint8_t> group_meta;
  // int8: colsum[block][kb][16], sum_k w[n][k] over each activation block kb of K (|sum| <=
  // 128 * 127 fits int16), for the unsigned-activation offset of VNNI (u8 = s8 + 128).
  aligned_vector<int16_t> colsum;
  // fp8: float32 block_scale[block][group], one scale for a 16-column block's group of K (a
  // checkpoint's 128 x 128 blocks hold whole 16-column blocks); with `scale` per row (empty
  // where every row's is 1; a checkpoint's channel scales), w[n][k] = code * block_scale * scale[n].
  aligned_vector<float> block_scale;

  PackedMatrix() = default;
  PackedMatrix(PackedMatrix&&) = default;  // a vector's move keeps its buffer: `values` stays valid
  PackedMatrix& operator=(PackedMatrix&&) = default;
  PackedMatrix(const PackedMatrix&) = delete;
  PackedMatrix& operator=(const PackedMatrix&) = delete;

  int blocks() const { return Np / 16; }
  int groups() const { return group ? Kp / group : 0; }
  std::size_t block_bytes() const { return block_bytes(element, Kp); }
  std::size_t value_bytes() const { return static_cast<std::size_t>(blocks()) * block_bytes(); }
  const uint8_t* block(int b) const { return block_at.empty() ? values + b * block_bytes() : block_at[b]; }
  // Each kind's records: where they are (a vector's data), and the bytes a block of them takes
  std::array<std::pair<const uint8_t*, std::size_t>, kMetaKinds> meta_parts() const {
    const auto part = [this](const auto& v) {
      using T = typename std::decay_t<decltype(v)>::value_type;
      return std::pair<const uint8_t*, std::size_t>{reinterpret_cast<const uint8_t*>(v.data()),
                                                    blocks() ? v.size() * sizeof(T) / blocks() : 0};
    };
    return {part(scale), part(group_scale), part(colsum), part(group_e8m0), part(group_meta), part(block_scale)};
  }
  template <typename T>
  const T* meta(int b, MetaKind kind, const T* own, std::size_t per_block) const {
    return meta_at.empty() ? own + static_cast<std::size_t>(b) * per_block : reinterpret_cast<const T*>(meta_at[b][kind]);
  }
  // int8's 16 row scales of block b
  const float* row_scales(int b) const { return meta(b, kRowScale, scale.data(), 16); }
  const uint16_t* block_scales(int b) const { return meta(b, kGroupScale, group_scale.data(), static_cast<std::size_t>(groups()) * 16); }
  int colsum_blocks() const { return Kp / activation_block(element, group, Kp); }
  const int16_t* block_colsums(int b) const { return meta(b, kColsum, colsum.data(), static_cast<std::size_t>(colsum_blocks()) * 16); }
  const uint8_t* block_e8m0(int b) const { return meta(b, kE8m0, group_e8m0.data(), static_cast<std::size_t>(groups()) * 16); }
  std::size_t meta_bytes_per_block() const {
    return q4k_records(element)      ? static_cast<std::size_t>(groups() / kQ4kGroupsPerSuper) * kQ4kSuperBytes
           : element == Element::q6k || element == Element::q3k
               ? static_cast<std::size_t>(groups() / kQ6kGroupsPerSuper) * kQ6kSuperBytes
           : element == Element::q2k ? static_cast<std::size_t>(groups() / kQ6kGroupsPerSuper) * kQ2kSuperBytes
           : legacy_mins(element)    ? static_cast<std::size_t>(groups()) * kLegacyGroupBytes
           : element == Element::iq4xs ? static_cast<std::size_t>(groups() / kQ4kGroupsPerSuper) * kIq4xsSuperBytes
           : lattice(element)          ? static_cast<std::size_t>(Kp / kQ4kSuperBlock) * kLatticeSuperBytes
                                     : static_cast<std::size_t>(groups()) * kInt4zGroupBytes;
  }
  const uint8_t* block_meta(int b) const { return meta(b, kGroupMeta, group_meta.data(), meta_bytes_per_block()); }
  std::size_t metadata_bytes() const {
    return scale.size() * 4 + group_scale.size() * 2 + colsum.size() * 2 + block_scale.size() * 4 + group_e8m0.size() +
           group_meta.size() + placed_meta_bytes;
  }
  const float* fp8_block_scales(int b) const { return meta(b, kBlockScale, block_scale.data(), groups()); }
  // fp8: block b's 16 row scales, or nullptr where all are 1
  const float* fp8_row_scales(int b) const {
    return meta_at.empty() ? (scale.empty() ? nullptr : scale.data() + b * 16) : row_scales(b);
  }

  static std::size_t block_bytes(Element m, int Kp) {
    if (lattice(m)) return static_cast<std::size_t>(Kp / kLatticeChunkValues) * lattice_chunk_bytes(m);
    return static_cast<std::size_t>(Kp) * (m == Element::bf16 || m == Element::f16 ? 32
                                           : nibbles(m) || m == Element::q40 || m == Element::q41 ? 8
                                           : m == Element::q5k || m == Element::q50 || m == Element::q51 ? 10
                                           : m == Element::q6k ? 12
                                           : m == Element::q3k ? 6
                                           : m == Element::q2k ? 4
                                           : m == Element::f32 ? 64
                                                               : 16);
  }
  // The bytes of values an N x K matrix packs into.
  static std::size_t value_bytes(Element m, int group, int N, int K) {
    return static_cast<std::size_t>(round_up(N, 16) / 16) * block_bytes(m, static_cast<int>(round_up(K, k_step(m, group))));
  }
};

// Row n of a nibble matrix: Kp values q + offset in [0, 15] at k = 8j + b (low) and 8j + 4 + b
// (high) of byte b of its 16-column line j.
inline void put_nibbles(PackedMatrix& out, int n, const int8_t* q, int offset) {
  for (int k = 0; k < out.Kp; ++k) {
    const int v = q[k] + offset, high = (k % 8) >= 4;
    uint8_t& byte = out.values[((static_cast<int64_t>(n / 16) * (out.Kp / 8) + k / 8) * 16 + n % 16) * 4 + k % 4];
    byte = static_cast<uint8_t>(high ? (byte & 0x0F) | (v << 4) : (byte & 0xF0) | v);
  }
}

// Row n of a matrix whose lines have layout L: Kp codes into its panel's lines.
template <class L, typename Code>
void put_line_codes(PackedMatrix& out, int n, const Code* codes) {
  uint8_t* panel = out.values + static_cast<std::size_t>(n / 16) * out.block_bytes();
  for (int k = 0; k < out.Kp; ++k) L::put(panel + (k / 8) * L::kBytes, (n % 16) * 4 + k % 4, (k % 8) >= 4, codes[k]);
}

// Activation rows converted for an element family: bf16 values, or int8 with a per-row scale.
struct Activations {
  // a new value each time the rows are written (prepare_activations), so a kernel may keep what
  // it derived from them (a task's gathered rows) while it is unchanged
  uint64_t version = 0;
  Element element = Element::bf16;
  int group = 0;
  int64_t rows = 0;
  int Kp = 0;
  aligned_vector<uint16_t> bf16;  // [rows][Kp] (fp8 too: its bf16 dot products)
  // [rows][f32_ld]: the bf16 values widened, for kernels that ask; fp8: x * kFp8ActivationScale. The row stride is Kp + 16:
  // rows a power of two apart would share the same L1 sets (a tile reads 5 rows at one offset).
  aligned_vector<float> f32;
  int64_t f32_ld = 0;
  aligned_vector<int8_t> q;       // [rows][Kp], values in [-127, 127]
  aligned_vector<uint8_t> q_u8;   // [rows][Kp], q + 128 (for u8 x s8 dot products)
  int block = 0;                  // values of K a scale covers (activation_block), blocks = Kp / block
  int blocks = 1;
  aligned_vector<float> scale;    // [rows][blocks]: x[k] ~= q[k] * scale[k / block]
  const float* scales(int64_t row) const { return scale.data() + row * blocks; }
  // one scale a row, in each of its blocks' slots (so every kernel reads it as blocks): a
  // kernel may scale its sums once at the end instead of a block at a time
  bool token_scales = false;
  aligned_vector<int32_t> gsum;   // grouped elements: [rows][Kp/group] sums of q per group
};

// out[i][c] = sum_k act[rows[i]][k] * W[n0 + c][k], dequantized to float,
// for i < m and c < n1 - n0 (n0, n1 multiples of 16).
struct GemmArgs {
  const Activations* act;
  const int32_t* rows;
  int m;
  const PackedMatrix* w;
  int n0, n1;
  float* out;
  int64_t ld_out;
};

struct KernelTable {
  const char* name;
  // The CPU features its code was compiled for, null-terminated (kCompiledFeatures: data, read on
  // any CPU; required_features() makes the list).
  const char* const* compiled_features;
  // What runs for an element. Code of this table's level: call it only where the table runs.
  std::string (*describe)(Element);
  void (*gemm)(const GemmArgs&);
  // out[i] = silu(gate[i]) * up[i]
  void (*silu_mul)(const float* gate, const float* up, float* out, int n);
  // Symmetric int8 row quantization, a scale per `block` values (see Activations); false if the
  // row is not finite.
  bool (*quantize_row)(const float* x, int K, int Kp, int group, int block, int8_t* q, uint8_t* q_u8, float* scale,
                       int32_t* gsum);
  bool (*to_bf16_row)(const float* x, int K, int Kp, uint16_t* out);
  void (*combine)(const float* const* rows, const float* weights, int k, int n, float* out);
  // Machine peaks, for `kt bench`: runs `iterations` rounds of the instruction (sequence)
  // behind a method (kind 0 fp32 FMA, 1 bf16 dot, 2 int8 dot (int8g's too), 3 int4 dot) and returns the
  // operations executed (0 if this backend has no such instruction); and a streaming read.
  double (*peak_ops)(int kind, int64_t iterations);
  uint64_t (*read_stream)(const uint8_t* data, std::size_t bytes);
  // Whether bf16 GEMMs read the activations widened to fp32 (Activations::f32) rather than
  // as bf16: a kernel without a bf16 dot broadcasts each value from memory, a load, instead
  // of widening it in registers. nullptr: no.
  bool (*reads_f32_activations)() = nullptr;
};

}  // namespace kt
