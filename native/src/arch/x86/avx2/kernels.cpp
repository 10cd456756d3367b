// AVX2/FMA kernels: the portable path for any x86-64 CPU from Haswell / Zen 1 on.
//
// bf16 is widened to fp32 (exact, in vdpbf16ps order); int8 uses vpmaddubsw on |w| and
// the weight's sign moved onto the activation (|w| * sign(x, w)): |w| <= 128 fits a u8 (the
// full int8 range, -128 included), |x| <= 127, so a pair sum (<= 32512) never saturates;
// int4 nibbles (0..15) are the unsigned operand,
// whose pair sums (<= 2 * 15 * 127) cannot saturate either; int8g's codes (w + 128) are made
// signed again and take int8's path, with a scale per group.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "arch/common/dispatch.hpp"
#include "arch/features.hpp"
#include "kernels/registry.hpp"
#include "kernels/silu.hpp"
#include "kernels/rowops.hpp"

namespace kt {
namespace {

constexpr int kRows = 4;  // int8/int4 tiles: 4 rows x 2 halves of 16 columns + operands in 16 ymm
// bf16: 5 rows x 2 halves = 10 accumulators. Each accumulator takes 2 dependent FMAs per
// step (odd then even k, the vdpbf16ps order), so it needs more than 8 of them to keep both
// FMA pipes busy through the 4-cycle latency; + 4 weight vectors + 1 broadcast = 15 registers.
constexpr int kBf16Rows = 5;
// Every tile step reads one 64-byte line of the panel. Decode (one row) does little work per
// line, so the out-of-order window alone keeps too few lines in flight: ask for the line
// this far ahead (the next block of a task follows its panel in memory).
constexpr int kPrefetchBytes = 1024;

inline void prefetch_panel(const void* line) {
  _mm_prefetch(static_cast<const char*>(line) + kPrefetchBytes, _MM_HINT_T0);
}

// K is taken in chunks whose panel slice (16 KB) and activation slices (5 x 2 KB) stay in L1
// across a block's row groups; the partial sums wait in `out` (fp32, exact: the same FMA
// chain resumes).
constexpr int kBf16ChunkPairs = 256;

// x: rows of the activations widened to fp32 (Activations::f32); each value is broadcast
// straight from memory (a load, no shuffle), the weights widened in registers. Steps
// [p0, p1) of the panel; `resume`: add to the partial sums in out. `ahead`: the next chunk,
// whose line i this tile prefetches for every i = first (mod every): the row groups of a
// chunk share its prefetching, so the weight stream runs under all of their arithmetic.
template <int M, int NB>
struct Bf16Tile {
  static void run(const float* const* x, const uint16_t* panel, int p0, int p1, bool resume, const uint16_t* ahead,
                  int first, int every, float* out, int64_t ld) {
    __m256 acc[M][2];
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) acc[i][h] = resume ? _mm256_loadu_ps(out + i * ld + h * 8) : _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    int countdown = ahead ? first : p1;
    for (int p = p0; p < p1; ++p) {
      if (countdown-- == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (p - p0) * 32), _MM_HINT_T0);
        countdown = every - 1;
      }
      __m256 b_odd[2], b_even[2];
      for (int h = 0; h < 2; ++h) {
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 32 + h * 16));
        b_odd[h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        b_even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      }
      for (int i = 0; i < M; ++i) {
        const __m256 a_odd = _mm256_broadcast_ss(x[i] + 2 * p + 1);
        for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_fmadd_ps(a_odd, b_odd[h], acc[i][h]);
        const __m256 a_even = _mm256_broadcast_ss(x[i] + 2 * p);
        for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_fmadd_ps(a_even, b_even[h], acc[i][h]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, acc[i][h]);
  }
};

// A block's bf16 GEMM: chunk by chunk of K, every row group per chunk. The row groups of a
// chunk prefetch the next chunk (the next block's first, at the end of a block) between
// them, so the weight stream overlaps the arithmetic.
void gemm_bf16_block(const GemmArgs& a, int blk) {
  const PackedMatrix& w = *a.w;
  const Activations& act = *a.act;
  const int kp2 = w.Kp / 2, last_blk = a.n1 / 16 - 1;
  const auto* panel = reinterpret_cast<const uint16_t*>(w.block(blk));
  const float* rows[kBf16Rows];
  const int groups = (a.m + kBf16Rows - 1) / kBf16Rows;
  for (int p0 = 0; p0 < kp2; p0 += kBf16ChunkPairs) {
    const int p1 = std::min(kp2, p0 + kBf16ChunkPairs);
    const uint16_t* next = p1 < kp2 ? panel + p1 * 32
                           : blk < last_blk ? reinterpret_cast<const uint16_t*>(w.block(blk + 1))
                                            : nullptr;
    for (int g = 0, i0 = 0; g < groups; ++g) {
      // Rows spread evenly over the groups (16 rows: 4 x 4, not 5 + 5 + 5 + 1): a group of
      // fewer than 4 rows has too few accumulator chains to hide the FMA latency.
      const int m = (a.m - i0) / (groups - g);
      for (int i = 0; i < m; ++i) rows[i] = act.f32.data() + a.rows[i0 + i] * act.f32_ld;
      dispatch<kBf16Rows, 1, Bf16Tile>(m, 1, static_cast<const float* const*>(rows), panel, p0, p1, p0 > 0, next,
                                       g, groups, a.out + i0 * a.ld_out + (blk * 16 - a.n0), a.ld_out);
      i0 += m;
    }
  }
}

// One K step (4 values) of signed bytes b (the 16 columns' halves) against M activation rows:
// pmaddubsw multiplies unsigned by signed bytes, so |weight| is the unsigned operand (128 fits
// a u8: a weight of -128 is exact) and the weight's sign moves onto the activation
// (|activation| <= 127, so negating it cannot overflow); a pair sums to at most
// 2 * 128 * 127 = 32512, which never saturates.
template <int M>
inline void signed_bytes_step(const __m256i (&b)[2], const int8_t* const* x, int p, __m256i (&acc)[M][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i b_abs[2] = {_mm256_abs_epi8(b[0]), _mm256_abs_epi8(b[1])};
  for (int i = 0; i < M; ++i) {
    __m256i a = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 4 * p));
    for (int h = 0; h < 2; ++h) {
      __m256i pairs = _mm256_maddubs_epi16(b_abs[h], _mm256_sign_epi8(a, b[h]));
      acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(pairs, ones));
    }
  }
}

// Per-row weights: each activation block's (`block_steps` steps; with a scale a token, the
// whole K) int32 sums, times the row's scale of the block, added in float in `out` (L1), which
// the weights' row scales multiply at the end.
template <int M, int NB>
struct Int8Tile {
  static void run(const int8_t* const* x, const float* const* xs, const int8_t* panel, const float* ws, int kp4,
                  int block_steps, float* out, int64_t ld) {
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, _mm256_setzero_ps());
    for (int p0 = 0; p0 < kp4; p0 += block_steps) {
      __m256i acc[M][2];
      for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
      for (int p = p0; p < p0 + block_steps; ++p) {
        prefetch_panel(panel + p * 64);
        const __m256i b[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64 + 32))};
        signed_bytes_step<M>(b, x, p, acc);
      }
      for (int i = 0; i < M; ++i) {
        const __m256 s = _mm256_set1_ps(xs[i][p0 / block_steps]);
        for (int h = 0; h < 2; ++h) {
          float* o = out + i * ld + h * 8;
          _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][h]), s, _mm256_loadu_ps(o)));
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(out + i * ld + h * 8, _mm256_mul_ps(_mm256_loadu_ps(out + i * ld + h * 8), _mm256_loadu_ps(ws + h * 8)));
  }
};

// 8 bf16 group scales, widened exactly
inline __m256 load_scales(const uint16_t* bf16) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bf16))), 16));
}

}  // namespace
}  // namespace kt

// The nibble elements' tiles and codes, the float elements' tiles, in this file's unnamed
// namespace (they use prefetch_panel and load_scales)
#include "arch/x86/avx2/floats.hpp"
#include "arch/x86/avx2/nibbles.hpp"
#include "arch/x86/avx2/lattice.hpp"

namespace kt {
namespace {

// 8 float16 group scales, widened exactly (F16C)
inline __m256 load_f16_scales(const uint16_t* f16) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f16)));
}

// int8g: the codes w + 128 back to w (xor 0x80), then int8's |w| * sign(x, w) products, summed
// exactly per group and scaled at its end in the order of the other backends (int8h: float16
// scales, Half).
template <bool Half>
struct Int8gTiles {
 template <int M, int NB>
 struct Tile {
  static void run(const int8_t* const* x, const float* const* xs, const uint8_t* panel, const uint16_t* g_scale, int groups,
                  int group, float* out, int64_t ld) {
    __m256 accf[M][2];
    for (int i = 0; i < M; ++i) accf[i][0] = accf[i][1] = _mm256_setzero_ps();
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
    const int steps = group / 4;
    for (int g = 0; g < groups; ++g) {
      __m256i acc[M][2];
      for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
      for (int p = g * steps; p < (g + 1) * steps; ++p) {
        prefetch_panel(panel + p * 64);
        const __m256i b[2] = {
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64)), offset),
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64 + 32)), offset)};
        signed_bytes_step<M>(b, x, p, acc);
      }
      for (int i = 0; i < M; ++i)  // the group's scaled sums times the row's activation scale of the group
        for (int h = 0; h < 2; ++h) {
          const __m256 sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][h]),
                                              Half ? load_f16_scales(g_scale + g * 16 + h * 8)
                                                   : load_scales(g_scale + g * 16 + h * 8),
                                              _mm256_setzero_ps());
          accf[i][h] = _mm256_fmadd_ps(sums, _mm256_set1_ps(xs[i][g]), accf[i][h]);
        }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, accf[i][h]);
  }
 };
};

// fp8: a k's 16 codes as two vectors of 8 floats times 2^-120 (see kFp8BitsMask), fp32 FMA with
// x times 2^64. Two sums per accumulator (even and odd k), so one row keeps 4 FMA chains in
// flight; 3 rows x 2 halves x 2 = 12 accumulators, + 2 weight vectors + 1 broadcast. The scaled
// group sums wait in `out`.
constexpr int kFp8Rows = 3;

// A group's scales of half h's 8 columns, times 2^56: fp8's one for the block, or mxfp8's E8M0 code
// of each column (their float bits, kernels/types.hpp)
inline __m256 fp8_group_scale(const float* block_scales, int g, int) {
  return _mm256_set1_ps(block_scales[g] * kFp8SumScale);
}
inline __m256 fp8_group_scale(const uint8_t* e8m0, int g, int h) {
  const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e8m0 + g * 16 + h * 8)));
  const __m256i bits = _mm256_max_epu32(_mm256_slli_epi32(codes, 23), _mm256_set1_epi32(static_cast<int>(kE8m0MinBits)));
  return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(kFp8SumScale));
}

template <int M, int NB>
struct Fp8Tile {
  template <typename Scale>
  static void run(const float* const* x, const uint8_t* panel, const Scale* b_scale, const float* row_scale, int groups,
                  int group, float* out, int64_t ld) {
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, _mm256_setzero_ps());
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(kFp8BitsMask));
    for (int g = 0; g < groups; ++g) {
      __m256 acc[M][2][2];
      for (int i = 0; i < M; ++i)
        for (int h = 0; h < 2; ++h) acc[i][h][0] = acc[i][h][1] = _mm256_setzero_ps();
      for (int k = g * group; k < (g + 1) * group; k += 2) {
        if (k % 4 == 0) prefetch_panel(panel + k * 16);
        for (int parity = 0; parity < 2; ++parity) {
          const uint8_t* codes = panel + (k + parity) * 16;
          __m256 b[2];
          for (int h = 0; h < 2; ++h) {
            const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * h)));
            b[h] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), mask));
          }
          for (int i = 0; i < M; ++i) {
            const __m256 xa = _mm256_set1_ps(x[i][k + parity]);
            for (int h = 0; h < 2; ++h) acc[i][h][parity] = _mm256_fmadd_ps(xa, b[h], acc[i][h][parity]);
          }
        }
      }
      const __m256 scale[2] = {fp8_group_scale(b_scale, g, 0), fp8_group_scale(b_scale, g, 1)};
      for (int i = 0; i < M; ++i)
        for (int h = 0; h < 2; ++h) {
          float* o = out + i * ld + h * 8;
          _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_add_ps(acc[i][h][0], acc[i][h][1]), scale[h], _mm256_loadu_ps(o)));
        }
    }
    if (row_scale == nullptr) return;  // every row's is 1
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(out + i * ld + h * 8, _mm256_mul_ps(_mm256_loadu_ps(out + i * ld + h * 8), _mm256_loadu_ps(row_scale + h * 8)));
  }
};

void gemm_fp8_block(const GemmArgs& a, int blk) {
  const PackedMatrix& w = *a.w;
  for (int i0 = 0; i0 < a.m; i0 += kFp8Rows) {
    const int m = std::min(kFp8Rows, a.m - i0);
    const float* x[kFp8Rows];
    for (int i = 0; i < m; ++i) x[i] = a.act->f32.data() + a.rows[i0 + i] * a.act->f32_ld;
    float* out = a.out + i0 * a.ld_out + (blk * 16 - a.n0);
    if (w.element == Element::mxfp8)
      dispatch<kFp8Rows, 1, Fp8Tile>(m, 1, static_cast<const float* const*>(x), w.block(blk), w.block_e8m0(blk),
                                     w.fp8_row_scales(blk), w.groups(), w.group, out, a.ld_out);
    else
      dispatch<kFp8Rows, 1, Fp8Tile>(m, 1, static_cast<const float* const*>(x), w.block(blk), w.fp8_block_scales(blk),
                                     w.fp8_row_scales(blk), w.groups(), w.group, out, a.ld_out);
  }
}

// A nibble element's (or q5k's, q6k's) rows against block blk, its codes chosen by element.
template <class Codes>
void nibble_rows_of(int m, const int8_t* const* rows, const int32_t* const* sums, const float* const* xs, const PackedMatrix& w,
                    int blk, float* out, int64_t ld) {
  dispatch<kRows, 1, NibbleTile<Codes>::template Tile>(m, 1, rows, sums, xs, w.block(blk), Codes::scales_of(w, blk),
                                                       w.groups(), w.group, out, ld);
}
void nibble_rows(Element e, int m, const int8_t* const* rows, const int32_t* const* sums, const float* const* xs,
                 const PackedMatrix& w, int blk, float* out, int64_t ld) {
  const auto run = e == Element::int4z   ? nibble_rows_of<Int4zCodes>
                   : e == Element::q4k   ? nibble_rows_of<Q4kCodes>
                   : e == Element::q5k   ? nibble_rows_of<Q5kCodes>
                   : e == Element::q6k   ? nibble_rows_of<Q6kCodes>
                   : e == Element::q3k   ? nibble_rows_of<Q3kCodes>
                   : e == Element::q2k   ? nibble_rows_of<Q2kCodes>
                   : e == Element::q40   ? nibble_rows_of<Q40Codes>
                   : e == Element::q41   ? nibble_rows_of<Q41Codes>
                   : e == Element::q50   ? nibble_rows_of<Q50Codes>
                   : e == Element::q51   ? nibble_rows_of<Q51Codes>
                   : e == Element::iq4nl ? nibble_rows_of<Iq4nlCodes>
                   : e == Element::iq4xs ? nibble_rows_of<Iq4xsCodes>
                   : e == Element::fp4   ? nibble_rows_of<Fp4Codes>
                   : e == Element::nvfp4 ? nibble_rows_of<Nvfp4Codes>
                                         : nibble_rows_of<Int4Codes>;
  run(m, rows, sums, xs, w, blk, out, ld);
}

void gemm(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const Activations& act = *a.act;
  const int G = w.groups();
  for (int blk = a.n0 / 16; blk < a.n1 / 16; ++blk) {
    if (w.element == Element::bf16) {
      gemm_bf16_block(a, blk);
      continue;
    }
    if (fp8_codes(w.element)) {
      gemm_fp8_block(a, blk);
      continue;
    }
    if (floats(w.element)) {
      w.element == Element::f16 ? gemm_floats_block<Element::f16>(a, blk) : gemm_floats_block<Element::f32>(a, blk);
      continue;
    }
    if (lattice(w.element)) {
      lattice_gemm_block(a, blk);
      continue;
    }
    for (int i0 = 0; i0 < a.m; i0 += kRows) {
      const int m = std::min(kRows, a.m - i0);
      float* out = a.out + i0 * a.ld_out + (blk * 16 - a.n0);
      const float* bxs[kRows];  // a row's scale per block (activation_block)
      const int32_t* sums[kRows];
      const int8_t* rows[kRows];
      for (int i = 0; i < m; ++i) {
        int64_t r = a.rows[i0 + i];
        rows[i] = act.q.data() + r * act.Kp;
        bxs[i] = act.scales(r);
        if (group_sums(w.element)) sums[i] = act.gsum.data() + r * G;
      }
      if (w.element == Element::int8)
        dispatch<kRows, 1, Int8Tile>(m, 1, static_cast<const int8_t* const*>(rows), static_cast<const float* const*>(bxs),
                                     reinterpret_cast<const int8_t*>(w.block(blk)), w.row_scales(blk),
                                     w.Kp / 4, act.token_scales ? w.Kp / 4 : act.block / 4, out, a.ld_out);
      else if (w.element == Element::int8g)
        dispatch<kRows, 1, Int8gTiles<false>::Tile>(m, 1, static_cast<const int8_t* const*>(rows),
                                                    static_cast<const float* const*>(bxs), w.block(blk), w.block_scales(blk),
                                                    G, w.group, out, a.ld_out);
      else if (w.element == Element::int8h)
        dispatch<kRows, 1, Int8gTiles<true>::Tile>(m, 1, static_cast<const int8_t* const*>(rows),
                                                   static_cast<const float* const*>(bxs), w.block(blk), w.block_scales(blk),
                                                   G, w.group, out, a.ld_out);
      else
        nibble_rows(w.element, m, static_cast<const int8_t* const*>(rows), static_cast<const int32_t* const*>(sums),
                    static_cast<const float* const*>(bxs), w, blk, out, a.ld_out);
    }
  }
}

std::string describe(Element m) {
  return m == Element::bf16 ? "avx2 fp32 fma (exact vdpbf16ps emulation)"
         : m == Element::fp8   ? "avx2 fp32 fma on fp8 decoded in registers"
         : m == Element::mxfp8 ? "avx2 fp32 fma on fp8 decoded in registers, E8M0 scales per column and 32"
         : m == Element::f16   ? "avx2 fp32 fma on float16 widened in registers"
         : m == Element::f32   ? "avx2 fp32 fma"
         : m == Element::int8  ? "avx2 maddubs, sign on the weights"
         : m == Element::int8g ? "avx2 maddubs, sign on the weights, per group"
         : m == Element::int8h ? "avx2 maddubs, sign on the weights, per group, float16 scales"
         : m == Element::fp4   ? "avx2 maddubs on fp4 looked up as doubled int8"
         : m == Element::nvfp4 ? "avx2 maddubs on fp4 looked up as doubled int8, UE4M3 scales per 16"
         : m == Element::int4z ? "avx2 maddubs on unpacked nibbles, less zero points"
         : m == Element::q4k   ? "avx2 maddubs on unpacked nibbles, Q4_K's scales and mins per group"
         : iq4(m)              ? "avx2 maddubs on the IQ4 grid's values looked up, sign on the weights, per group"
         : lattice(m)          ? "avx2 maddubs on the i-quant grid's values gathered, sign on the activations, per group"
         : m == Element::q5k   ? "avx2 maddubs on 5-bit codes (nibbles and high bits), Q5_K's scales and mins per group"
         : m == Element::q6k   ? "avx2 maddubs on 6-bit codes (nibbles and high bits), Q6_K's scales per group of 16"
         : m == Element::q3k   ? "avx2 maddubs on 3-bit codes (two bit planes), Q3_K's scales folded in int32 per super-block"
         : m == Element::q2k   ? "avx2 maddubs on 2-bit codes, Q2_K's scales and mins folded in int32 per super-block"
         : legacy_mins(m)      ? "avx2 maddubs on unsigned codes, float16 scales and mins per group"
         : legacy(m)           ? "avx2 maddubs on unsigned codes less their offset, float16 scales per group"
                               : "avx2 maddubs on unpacked nibbles";
}

// ---- machine peaks (kt bench) -------------------------------------------------------------

// Each chain carries its accumulator into the next step's inputs, so no two steps compute
// the same value (a compiler would otherwise compute a loop-invariant product once).
double peak_ops(int kind, int64_t iterations) {
  constexpr int kChains = 12;  // > latency x throughput for every sequence below
  __m256 fa = _mm256_set1_ps(1.0000001f), fb = _mm256_set1_ps(1e-9f);
  __m256i wa = _mm256_set1_epi8(3), wb = _mm256_set1_epi8(5);
  __asm__ volatile("" : "+x"(fa), "+x"(fb), "+x"(wa), "+x"(wb));  // opaque: no constant folding
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 f[kChains];
  __m256i q[kChains];
  for (int c = 0; c < kChains; ++c) {
    f[c] = _mm256_set1_ps(static_cast<float>(c));
    q[c] = _mm256_set1_epi32(c);
  }
  double ops = 0;
  if (kind == 0 || kind == 1) {  // bf16 runs as fp32 FMA here: 2 FMAs per bf16 pair
    for (int64_t it = 0; it < iterations; ++it)
      for (int c = 0; c < kChains; ++c) f[c] = _mm256_fmadd_ps(f[c], fa, fb);
    ops = 16;
  } else if (kind == 2) {
    // signed x signed bytes: pmaddubsw multiplies unsigned by signed bytes, so the weight's
    // sign moves onto the activation first (vpsignb); |weight| is taken once per panel load
    // and shared by every row, not here
    for (int64_t it = 0; it < iterations; ++it)
      for (int c = 0; c < kChains; ++c)
        q[c] = _mm256_add_epi32(q[c], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(wb, q[c])), ones));
    ops = 64;
  } else if (kind == 3) {
    // int4, as the kernel runs it: nibbles are unsigned already; a step's two pmaddubsw products
    // add up in 16 bits for kInt4Steps16 steps, then one pmaddwd widens them. Each 16-bit sum
    // feeds its own next products (the compiler cannot compute them once for all the steps); 8
    // chains, so sums, 2 wide accumulators and the constants fit the 16 registers.
    constexpr int kInt4Chains = 8;
    __m256i sum16[kInt4Chains];
    for (int c = 0; c < kInt4Chains; ++c) sum16[c] = _mm256_set1_epi16(static_cast<int16_t>(c));
    for (int64_t it = 0; it < iterations; ++it) {
      for (int s = 0; s < kInt4Steps16; ++s)
        for (int c = 0; c < kInt4Chains; ++c)
          sum16[c] = _mm256_add_epi16(
              sum16[c], _mm256_add_epi16(_mm256_maddubs_epi16(wa, sum16[c]), _mm256_maddubs_epi16(wb, sum16[c])));
      for (int c = 0; c < kInt4Chains; ++c) q[c & 1] = _mm256_add_epi32(q[c & 1], _mm256_madd_epi16(sum16[c], ones));
    }
    ops = 128.0 * kInt4Steps16 * kInt4Chains / kChains;  // per chain of the common count below
  } else {
    return 0;
  }
  float sink = 0;
  alignas(32) float fl[8];
  alignas(32) int32_t il[8];
  for (int c = 0; c < kChains; ++c) {
    _mm256_store_ps(fl, f[c]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(il), q[c]);
    for (int l = 0; l < 8; ++l) sink += fl[l] + static_cast<float>(il[l]);
  }
  __asm__ volatile("" : : "x"(sink));
  return ops * kChains * static_cast<double>(iterations);
}

uint64_t read_stream(const uint8_t* data, std::size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// silu(g) * u with exp from a degree-6 polynomial on [-ln2/2, ln2/2], 2^k built in the
// exponent field: relative error below 2e-7 (inputs clamped where exp overflows).
void silu_mul(const float* gate, const float* up, float* out, int n) {
  using namespace silu_poly;
  const __m256 log2e = _mm256_set1_ps(kLog2e), ln2_hi = _mm256_set1_ps(kLn2Hi), ln2_lo = _mm256_set1_ps(kLn2Lo),
               one = _mm256_set1_ps(1.f);
  const __m256 c2 = _mm256_set1_ps(kC2), c3 = _mm256_set1_ps(kC3), c4 = _mm256_set1_ps(kC4), c5 = _mm256_set1_ps(kC5),
               c6 = _mm256_set1_ps(kC6);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
    __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(kMinArg)),
                             _mm256_set1_ps(kMaxArg));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, ln2_hi, x);
    r = _mm256_fnmadd_ps(k, ln2_lo, r);
    __m256 p = _mm256_fmadd_ps(c6, r, c5);
    p = _mm256_fmadd_ps(p, r, c4);
    p = _mm256_fmadd_ps(p, r, c3);
    p = _mm256_fmadd_ps(p, r, c2);
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));  // exp(-g)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
  }
  for (; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

bool reads_f32_activations() { return true; }

}  // namespace

const KernelTable avx2_kernels = {"avx2",          kCompiledFeatures,     describe,        gemm,
                                   silu_mul,        quantize_row_generic, to_bf16_row_generic, combine_generic,
                                   peak_ops,        read_stream,  reads_f32_activations};

}  // namespace kt
