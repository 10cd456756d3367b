// AVX-512 kernels (F/BW/VL/DQ), with vdpbf16ps and vpdpbusd where compiled in.
//
// Register blocking: M token rows x NB blocks of 16 output columns accumulate in zmm
// registers over the whole K panel. The panels of the NB blocks (NB x K x 64 bytes at
// most 256 KiB for K = 2048 bf16) stay in L2 while successive M-row chunks reuse them,
// so weights come from memory once per task: the decode case (a few rows) streams them
// at memory bandwidth, prefill reuses each loaded line across M rows.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "arch/common/dispatch.hpp"
#include "arch/features.hpp"
#include "kernels/registry.hpp"
#include "kernels/silu.hpp"
#include "kernels/rowops.hpp"

// One source, three levels in a portable build (the backend table's avx512, avx512-vnni and
// avx512-bf16 rows: the same kernels, each compiled with exactly its level's flags; the VNNI
// and BF16 dot products are used where the compiler's macros say the level has them).
#if defined(KTFORGE_AVX512_LEVEL_BF16)
#define KT_AVX512_TABLE avx512_bf16_kernels
#define KT_AVX512_NAME "avx512-bf16"
#elif defined(KTFORGE_AVX512_LEVEL_VNNI)
#define KT_AVX512_TABLE avx512_vnni_kernels
#define KT_AVX512_NAME "avx512-vnni"
#else
#define KT_AVX512_TABLE avx512_kernels
#define KT_AVX512_NAME "avx512"
#endif

namespace kt {
namespace {

// Software prefetch distance, in 64-byte lines of each panel, into L2: 8 KiB of each panel
// ahead (int8's K block), enough bytes in flight to cover memory latency when a few token rows
// make the kernel memory-bound (decode). 1 KiB ahead into L1 streamed bf16, int8g and int4
// decode 10-20% below int8's rate on a Zen 4 guest.
constexpr int kStreamAheadLines = 128;

// ---- bf16 -------------------------------------------------------------------------------

#ifdef __AVX512BF16__
constexpr int kBf16Rows = 6, kBf16Blocks = 4;
#else
constexpr int kBf16Rows = 4, kBf16Blocks = 4;  // even/odd halves of B need registers too
#endif

template <int M, int NB>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void bf16_tile(const uint16_t* const* x, const uint16_t* const* panel, int kp2, float* out, int64_t ld) {
  __m512 acc[M][NB];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int p = 0; p < kp2; ++p) {
#ifdef __AVX512BF16__
    __m512bh b[NB];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (p + kStreamAheadLines) * 32), _MM_HINT_T1);
      b[j] = (__m512bh)_mm512_loadu_si512(panel[j] + p * 32);
    }
    for (int i = 0; i < M; ++i) {
      __m512bh a = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 2 * p));
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
#else
    // Exact emulation of vdpbf16ps: the odd element's product first, then the even one.
    __m512 b_odd[NB], b_even[NB];
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    for (int j = 0; j < NB; ++j) {
      __m512i v = _mm512_loadu_si512(panel[j] + p * 32);
      b_odd[j] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
      b_even[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    for (int i = 0; i < M; ++i) {
      uint32_t pair = *reinterpret_cast<const uint32_t*>(x[i] + 2 * p);
      __m512 a_odd = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(pair & 0xFFFF0000u)));
      __m512 a_even = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(pair << 16)));
      for (int j = 0; j < NB; ++j) {
        acc[i][j] = _mm512_fmadd_ps(a_odd, b_odd[j], acc[i][j]);
        acc[i][j] = _mm512_fmadd_ps(a_even, b_even[j], acc[i][j]);
      }
    }
#endif
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, acc[i][j]);
}

// ---- int8 dot products (per-row int8's tile and drivers: avx512/int8.hpp) ---------------

#ifdef __AVX512VNNI__
// acc += u8 a . s8 b, in place. GCC 12 compiles the intrinsic as a copy, the instruction and
// a copy back, which doubles the registers an accumulator needs and made the 8x3 tile spill
// every accumulator to the stack each iteration; the asm form is the instruction alone.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}

// ---- int4, fp4 (their tile: avx512/nibbles.hpp) ---------------------------------------

constexpr int kInt4Blocks = 2, kInt4DecodeBlocks = 4;

// 16 bf16 group scales, widened exactly
inline __m512 load_scales(const uint16_t* bf16) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bf16))), 16));
}

#endif  // __AVX512VNNI__, reopened after the nibble kernels
}  // namespace
}  // namespace kt

// nibble_tile (int4, fp4) and its codes, in this file's unnamed namespace (they use
// kStreamAheadLines, dpbusd and load_scales)
#include "arch/x86/avx512/nibbles.hpp"
// the i-quants' tile and codes, likewise
#include "arch/x86/avx512/lattice.hpp"

namespace kt {
namespace {
#ifdef __AVX512VNNI__

// ---- int8g ------------------------------------------------------------------------------

// 8 x 3 group sums and 3 weight vectors in registers; the float sums wait in `out` (L1) between
// groups, so a wide tile does not spill its integer accumulators.
constexpr int kInt8gRows = 8, kInt8gBlocks = 3, kInt8gDecodeBlocks = 8;

// Weights are codes w+128 (the u8 operand), activations signed: a group's sum carries
// 128 * sum_k x, which each sum starts without (at -128 * sum_k x).
template <int M, int NB, bool Half>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void int8g_tile(const int8_t* const* x, const int32_t* const* gsum, const float* const* x_scale,
                                          const uint8_t* const* panel, const uint16_t* const* g_scale, int groups,
                                          int group, float* out, int64_t ld, bool /*token_scales: as per block*/) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, _mm512_setzero_ps());
  const int steps = group / 4;
  for (int g = 0; g < groups; ++g) {
    // starting at -128 * sum_k x instead of 0, the offset costs no instruction
    __m512i acc[M][NB];
    for (int i = 0; i < M; ++i) {
      const __m512i start = _mm512_set1_epi32(-128 * gsum[i][g]);
      for (int j = 0; j < NB; ++j) acc[i][j] = start;
    }
    for (int s = 0; s < steps; ++s) {
      const int p = g * steps + s;
      __m512i b[NB];
      for (int j = 0; j < NB; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (p + kStreamAheadLines) * 64), _MM_HINT_T1);
        b[j] = _mm512_loadu_si512(panel[j] + p * 64);
      }
      for (int i = 0; i < M; ++i) {
        __m512i a = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 4 * p));
        for (int j = 0; j < NB; ++j) acc[i][j] = dpbusd(acc[i][j], b[j], a);
      }
    }
    __m512 scale[NB];
    for (int j = 0; j < NB; ++j) {
      // the scales are a stream of their own, 32 bytes a group: one line ahead
      _mm_prefetch(reinterpret_cast<const char*>(g_scale[j] + (g + 2) * 16), _MM_HINT_T0);
      scale[j] = Half ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g_scale[j] + g * 16)))
                      : load_scales(g_scale[j] + g * 16);
    }
    for (int i = 0; i < M; ++i) {  // the group's sums, scaled, times the row's activation scale of the group
      const __m512 xs = _mm512_set1_ps(x_scale[i][g]);
      for (int j = 0; j < NB; ++j) {
        float* o = out + i * ld + j * 16;
        const __m512 sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]), scale[j], _mm512_setzero_ps());
        _mm512_storeu_ps(o, _mm512_fmadd_ps(sums, xs, _mm512_loadu_ps(o)));
      }
    }
  }
}
#endif

// ---- drivers ----------------------------------------------------------------------------

template <int M, int NB>
struct Bf16Tile {
  template <typename... A>
  static void run(A... a) { bf16_tile<M, NB>(a...); }
};

// Decode (a couple of token rows): memory-bound, so stream more panels at once; more
// concurrent streams keep more cache-line requests in flight.
constexpr int kDecodeRows = 2, kDecodeBlocks = 8;

void gemm_bf16_decode(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const uint16_t* x[kDecodeRows];
  for (int i = 0; i < a.m; ++i) x[i] = a.act->bf16.data() + static_cast<int64_t>(a.rows[i]) * a.act->Kp;
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += kDecodeBlocks) {
    const int nb = std::min(kDecodeBlocks, a.n1 / 16 - b0);
    const uint16_t* panel[kDecodeBlocks];
    for (int j = 0; j < nb; ++j) panel[j] = reinterpret_cast<const uint16_t*>(w.block(b0 + j));
    dispatch<kDecodeRows, kDecodeBlocks, Bf16Tile>(a.m, nb, static_cast<const uint16_t* const*>(x),
                                                   static_cast<const uint16_t* const*>(panel), w.Kp / 2,
                                                   a.out + (b0 * 16 - a.n0), a.ld_out);
  }
}

void gemm_bf16(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const int kp2 = w.Kp / 2;
  if (a.m <= kDecodeRows) return gemm_bf16_decode(a);
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += kBf16Blocks) {
    const int nb = std::min(kBf16Blocks, a.n1 / 16 - b0);
    const uint16_t* panel[kBf16Blocks];
    for (int j = 0; j < nb; ++j) panel[j] = reinterpret_cast<const uint16_t*>(w.block(b0 + j));
    for (int i0 = 0; i0 < a.m; i0 += kBf16Rows) {
      const int m = std::min(kBf16Rows, a.m - i0);
      const uint16_t* x[kBf16Rows];
      for (int i = 0; i < m; ++i) x[i] = a.act->bf16.data() + static_cast<int64_t>(a.rows[i0 + i]) * a.act->Kp;
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      dispatch<kBf16Rows, kBf16Blocks, Bf16Tile>(m, nb, static_cast<const uint16_t* const*>(x),
                                                 static_cast<const uint16_t* const*>(panel), kp2, out, a.ld_out);
    }
  }
}

}  // namespace
}  // namespace kt

// fp8_tile and gemm_fp8, float_tile and gemm_floats, int8_tile and gemm_int8, in this file's
// unnamed namespace (they use kStreamAheadLines, kDecodeRows and dpbusd)
#include "arch/x86/avx512/floats.hpp"
#include "arch/x86/avx512/fp8.hpp"
#include "arch/x86/avx512/int8.hpp"

namespace kt {
namespace {

#ifdef __AVX512VNNI__
// int8g; Half: int8h (float16 scales)
template <bool Half>
struct Int8gTiles {
  template <int M, int NB>
  struct Tile {
    template <typename... A>
    static void run(A... a) { int8g_tile<M, NB, Half>(a...); }
  };
};

// The grouped elements' driver: panels and their group scales, NB blocks at a time, over
// chunks of Rows token rows (Decode x DecodeBlocks for a couple of rows: more panels at once,
// for more memory streams in flight).
template <template <int, int> class Tile, int Rows, int Blocks, int DecodeBlocks, class Scales = Int4Codes>
void gemm_grouped(const GemmArgs& a) {
  using Scale = typename Scales::Scale;
  const PackedMatrix& w = *a.w;
  const int G = w.groups();
  const bool decode = a.m <= kDecodeRows;
  const int blocks = decode ? DecodeBlocks : Blocks;
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += blocks) {
    const int nb = std::min(blocks, a.n1 / 16 - b0);
    const uint8_t* panel[std::max(Blocks, DecodeBlocks)];
    const Scale* gs[std::max(Blocks, DecodeBlocks)];
    for (int j = 0; j < nb; ++j) {
      panel[j] = w.block(b0 + j);
      gs[j] = Scales::scales_of(w, b0 + j);
    }
    for (int i0 = 0; i0 < a.m; i0 += Rows) {
      const int m = std::min(Rows, a.m - i0);
      const int8_t* x[Rows];
      const int32_t* sums[Rows];
      const float* xs[Rows];
      for (int i = 0; i < m; ++i) {
        int64_t r = a.rows[i0 + i];
        x[i] = a.act->q.data() + r * a.act->Kp;
        sums[i] = a.act->gsum.data() + r * G;
        xs[i] = a.act->scales(r);
      }
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      if (decode) {
        dispatch<kDecodeRows, DecodeBlocks, Tile>(
            m, nb, static_cast<const int8_t* const*>(x), static_cast<const int32_t* const*>(sums),
            static_cast<const float* const*>(xs), static_cast<const uint8_t* const*>(panel),
            static_cast<const Scale* const*>(gs), G, w.group, out, a.ld_out, a.act->token_scales);
        continue;
      }
      dispatch<Rows, Blocks, Tile>(
          m, nb, static_cast<const int8_t* const*>(x), static_cast<const int32_t* const*>(sums),
          static_cast<const float* const*>(xs), static_cast<const uint8_t* const*>(panel), static_cast<const Scale* const*>(gs),
          G, w.group, out, a.ld_out, a.act->token_scales);
    }
  }
}

// Prefill tiles: 8 token rows where the codes are plain nibbles (int4, q4_0) or folded (q3_k); 6
// where a lookup table or a record's scales and mins take registers too (measured, a Zen 4 guest,
// 2026-12-06, one thread, 16 experts of 2048 x 768, 128 tokens each: q4_k 76 ms at 6 rows against
// 88 at 8, q6_k 88 against 111, q2_k 115 against 132; int4 62 against 67, q3_k 77 against 86).
template <class Codes>
constexpr int nibble_rows() {
  return std::is_same_v<Codes, Int4Codes> || std::is_same_v<Codes, Q40Codes> || std::is_same_v<Codes, Q3kCodes> ? 8 : 6;
}
// the nibble elements, and the super-blocks' other codes (q5k, q6k, q3k, q2k)
template <class Codes>
void gemm_nibbles(const GemmArgs& a) {
  gemm_grouped<NibbleTile<Codes>::template Tile, nibble_rows<Codes>(), kInt4Blocks, kInt4DecodeBlocks, Codes>(a);
}
// GGUF's i-quants: 6 rows as the other looked-up codes (their gathers and signs take registers)
template <class Codes>
void gemm_lattice(const GemmArgs& a) {
  gemm_lattice_rows<Codes, 6, kInt4Blocks, kDecodeRows, kInt4DecodeBlocks>(a);
}
void gemm_int8g(const GemmArgs& a) {
  gemm_grouped<Int8gTiles<false>::Tile, kInt8gRows, kInt8gBlocks, kInt8gDecodeBlocks>(a);
}
void gemm_int8h(const GemmArgs& a) {
  gemm_grouped<Int8gTiles<true>::Tile, kInt8gRows, kInt8gBlocks, kInt8gDecodeBlocks>(a);
}
#endif

void gemm(const GemmArgs& a) {
  switch (a.w->element) {
    case Element::bf16: return gemm_bf16(a);
    case Element::fp8:
    case Element::mxfp8: return gemm_fp8(a);
    case Element::f16: return gemm_floats<Element::f16>(a);
    case Element::f32: return gemm_floats<Element::f32>(a);
#ifdef __AVX512VNNI__
    case Element::int8: return gemm_int8(a);
    case Element::int4: return gemm_nibbles<Int4Codes>(a);
    case Element::fp4: return gemm_nibbles<Fp4Codes>(a);
    case Element::nvfp4: return gemm_nibbles<Nvfp4Codes>(a);
    case Element::int4z: return gemm_nibbles<Int4zCodes>(a);
    case Element::q4k: return gemm_nibbles<Q4kCodes>(a);
    case Element::q6k: return gemm_nibbles<Q6kCodes>(a);
    case Element::q5k: return gemm_nibbles<Q5kCodes>(a);
    case Element::q3k: return gemm_nibbles<Q3kCodes>(a);
    case Element::q2k: return gemm_nibbles<Q2kCodes>(a);
    case Element::q40: return gemm_nibbles<Q40Codes>(a);
    case Element::q41: return gemm_nibbles<Q41Codes>(a);
    case Element::q50: return gemm_nibbles<Q50Codes>(a);
    case Element::q51: return gemm_nibbles<Q51Codes>(a);
    case Element::iq4nl: return gemm_nibbles<Iq4nlCodes>(a);
    case Element::iq4xs: return gemm_nibbles<Iq4xsCodes>(a);
    case Element::iq2xxs: return gemm_lattice<Iq2xxsCodes>(a);
    case Element::iq2xs: return gemm_lattice<Iq2xsCodes>(a);
    case Element::iq3xxs: return gemm_lattice<Iq3xxsCodes>(a);
    case Element::iq1s: return gemm_lattice<Iq1sCodes>(a);
    case Element::int8g: return gemm_int8g(a);
    case Element::int8h: return gemm_int8h(a);
#else
    // AVX-512 without VNNI (Skylake-SP): the AVX2 maddubs kernels are exact and close in speed.
#ifdef KTFORGE_HAVE_AVX2
    default: return avx2_kernels.gemm(a);
#else
    default: return reference_kernels.gemm(a);
#endif
#endif
  }
}

std::string describe(Element m) {
#ifdef __AVX512BF16__
  const char* bf16 = "avx512 vdpbf16ps";
#else
  const char* bf16 = "avx512 fp32 fma (exact vdpbf16ps emulation)";
#endif
#ifdef __AVX512VNNI__
  const std::string dot = "avx512 vpdpbusd", without = "", iq4_grid = " on the IQ4 grid's values looked up (+ 128), per group";
  const std::string lattice_grid = " on the i-quant grid's values gathered and signed (+ 128), per group";
#else
  const std::string dot = "avx2 maddubs", without = " (no VNNI)";
  const std::string iq4_grid = " on the IQ4 grid's values looked up, sign on the weights, per group";
  const std::string lattice_grid = " on the i-quant grid's values gathered, sign on the activations, per group";
#endif
  const std::string e8m0 = m == Element::mxfp8 ? ", E8M0 scales per column and 32" : "";
#ifdef __AVX512BF16__
  if (fp8_codes(m))
    return "avx512 vdpbf16ps on fp8 converted to bf16 for >= " + std::to_string(kFp8Bf16MinRows) +
           " tokens per expert, else fp32 fma on fp8 decoded in registers" + e8m0;
#else
  if (fp8_codes(m)) return "avx512 fp32 fma on fp8 decoded in registers" + e8m0;
#endif
  if (m == Element::bf16) return bf16;
  if (floats(m)) return m == Element::f16 ? "avx512 fp32 fma on float16 widened in registers" : "avx512 fp32 fma";
  const std::string what = m == Element::int8    ? ""
                           : m == Element::int8g ? " per group"
                           : m == Element::int8h ? " per group, float16 scales"
                           : m == Element::fp4   ? " on fp4 looked up as doubled int8"
                           : m == Element::nvfp4 ? " on fp4 looked up as doubled int8, UE4M3 scales per 16"
                           : m == Element::int4z ? " on unpacked nibbles, less zero points"
                           : m == Element::q4k   ? " on unpacked nibbles, Q4_K's scales and mins per group"
                           : m == Element::q5k   ? " on 5-bit codes (nibbles and high bits), Q5_K's scales and mins per group"
                           : m == Element::q6k   ? " on 6-bit codes (nibbles and high bits), Q6_K's scales per group of 16"
                           : m == Element::q3k   ? " on 3-bit codes (two bit planes), Q3_K's scales folded in int32 per super-block"
                           : m == Element::q2k   ? " on 2-bit codes, Q2_K's scales and mins folded in int32 per super-block"
                           : legacy_mins(m)      ? " on unsigned codes, float16 scales and mins per group"
                           : legacy(m)           ? " on unsigned codes less their offset, float16 scales per group"
                           : iq4(m)              ? iq4_grid
                           : lattice(m)          ? lattice_grid
                                                 : " on unpacked nibbles";
  return dot + what + without;
}

// ---- machine peaks (kt bench) -------------------------------------------------------------

// Each kind keeps only its own accumulators live (16 chains: latency x ports with room),
// so nothing spills and the loop runs at the instruction's throughput.
template <typename Acc, typename Step>
double peak_loop(int64_t iterations, Acc init, Step step, double ops_per_instruction) {
  constexpr int kChains = 16;
  Acc acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = init;
  for (int64_t it = 0; it < iterations; ++it)
    for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c]);
  for (int c = 1; c < kChains; ++c) __asm__ volatile("" : : "v"(acc[c]));
  __asm__ volatile("" : : "v"(acc[0]));
  return ops_per_instruction * kChains * static_cast<double>(iterations);
}

// The instruction each kind's kernels really run here: without BF16, bf16 runs on fp32 FMA
// (the kernels widen bf16 to fp32); without VNNI, the integer formats on AVX2's maddubs kernels.
double peak_ops(int kind, int64_t iterations) {
#if !defined(__AVX512VNNI__) && defined(KTFORGE_HAVE_AVX2)
  if (kind == 2 || kind == 3) return avx2_kernels.peak_ops(kind, iterations);
#endif
#ifndef __AVX512BF16__
  if (kind == 1) kind = 0;
#endif
  if (kind == 3) kind = 2;  // int4: nibbles widened to bytes, then the int8 dot
  __m512 fa = _mm512_set1_ps(1.0000001f), fb = _mm512_set1_ps(1e-9f);
  __m512i ia = _mm512_set1_epi8(1);
  __asm__ volatile("" : "+v"(fa), "+v"(fb), "+v"(ia));  // opaque operands: no constant folding
  if (kind == 0)
    return peak_loop(iterations, _mm512_set1_ps(1.f), [&](__m512 a) { return _mm512_fmadd_ps(a, fa, fb); }, 32);
#ifdef __AVX512BF16__
  if (kind == 1)
    return peak_loop(iterations, _mm512_set1_ps(1.f),
                     [&](__m512 a) { return _mm512_dpbf16_ps(a, (__m512bh)ia, (__m512bh)ia); }, 64);
#endif
#ifdef __AVX512VNNI__
  if (kind == 2)
    return peak_loop(iterations, _mm512_set1_epi32(1), [&](__m512i a) { return _mm512_dpbusd_epi32(a, ia, ia); }, 128);
#endif
  return 0;
}

uint64_t read_stream(const uint8_t* data, std::size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(data + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(data + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(data + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(data + i + 192));
  }
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
}

// silu(g) * u with exp from a degree-6 polynomial on [-ln2/2, ln2/2] and vscalefps:
// relative error below 2e-7 over the whole float range (clamped where exp overflows).
void silu_mul(const float* gate, const float* up, float* out, int n) {
  using namespace silu_poly;
  const __m512 log2e = _mm512_set1_ps(kLog2e), ln2_hi = _mm512_set1_ps(kLn2Hi), ln2_lo = _mm512_set1_ps(kLn2Lo),
               one = _mm512_set1_ps(1.f);
  const __m512 c2 = _mm512_set1_ps(kC2), c3 = _mm512_set1_ps(kC3), c4 = _mm512_set1_ps(kC4), c5 = _mm512_set1_ps(kC5),
               c6 = _mm512_set1_ps(kC6);
  int i = 0;
  for (; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 g = _mm512_maskz_loadu_ps(mask, gate + i), u = _mm512_maskz_loadu_ps(mask, up + i);
    __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(kMinArg)),
                             _mm512_set1_ps(kMaxArg));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, x);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 p = _mm512_fmadd_ps(c6, r, c5);
    p = _mm512_fmadd_ps(p, r, c4);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    __m512 e = _mm512_scalef_ps(p, k);  // exp(-g)
    __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(s, u));
  }
}


}  // namespace
}  // namespace kt

// quantize_row, in this file's unnamed namespace
#include "arch/x86/avx512/quantize.hpp"

namespace kt {

const KernelTable KT_AVX512_TABLE = {KT_AVX512_NAME, kCompiledFeatures,       describe, gemm,       silu_mul, quantize_row,
                                    to_bf16_row, combine_generic, peak_ops, read_stream};

}  // namespace kt
