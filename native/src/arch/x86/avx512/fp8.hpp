// The AVX-512 fp8 kernels: a part of arch/x86/avx512/kernels.cpp, included there after its
// kStreamAheadLines and kDecodeRows (in the same unnamed namespace), so they are compiled with
// each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "arch/common/dispatch.hpp"
#include "kernels/types.hpp"

namespace kt {
namespace {

// ---- fp8 --------------------------------------------------------------------------------

// 8 x 3 group sums in registers (fp32 FMA: no AVX-512 level has an FP8 dot product); the
// scaled sums wait in `out` (L1) between groups, as int8g's.
constexpr int kFp8Rows = 8, kFp8Blocks = 3, kFp8DecodeBlocks = 8;

// 16 E4M3 codes (one k of a 16-column block) as floats times 2^-120 (see kFp8BitsMask)
inline __m512 fp8_times_2_120(const uint8_t* codes) {
  const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(static_cast<int>(kFp8BitsMask))));
}

// Block j's scales of group g times factor: fp8's one for the block's 16 columns, or mxfp8's E8M0
// code of each column (their float bits, kernels/types.hpp; times factor, exactly: a power of two)
inline __m512 group_scale(const float* block_scales, int g, float factor) {
  return _mm512_set1_ps(block_scales[g] * factor);
}
inline __m512 group_scale(const uint8_t* e8m0, int g, float factor) {
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e8m0 + g * 16)));
  const __m512i bits = _mm512_max_epu32(_mm512_slli_epi32(codes, 23), _mm512_set1_epi32(static_cast<int>(kE8m0MinBits)));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(factor));
}
// The per-group scales a block of an fp8-code matrix has: fp8's float per block, mxfp8's E8M0 per column
template <typename Scale>
const Scale* group_scales_of(const PackedMatrix& w, int b) {
  if constexpr (std::is_same_v<Scale, float>) return w.fp8_block_scales(b);
  else return w.block_e8m0(b);
}

// out[i][j] += acc[i][j] * (block j's scales of group g) * factor: a group's sums, at its end
template <int M, int NB, typename Scale>
inline void add_group_sums(const __m512 (&acc)[M][NB], const Scale* const* b_scale, int g, float factor, float* out,
                           int64_t ld) {
  for (int j = 0; j < NB; ++j) {
    const __m512 scale = group_scale(b_scale[j], g, factor);
    for (int i = 0; i < M; ++i) {
      float* o = out + i * ld + j * 16;
      _mm512_storeu_ps(o, _mm512_fmadd_ps(acc[i][j], scale, _mm512_loadu_ps(o)));
    }
  }
}

// out *= the NB blocks' row scales (16 each, consecutive); nullptr: all 1
template <int M, int NB>
inline void scale_rows(const float* row_scale, float* out, int64_t ld) {
  if (row_scale == nullptr) return;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j)
      _mm512_storeu_ps(out + i * ld + j * 16,
                       _mm512_mul_ps(_mm512_loadu_ps(out + i * ld + j * 16), _mm512_loadu_ps(row_scale + j * 16)));
}

// x: rows times 2^64 (Activations::f32); b_scale[j]: block j's scales per group (group_scale);
// row_scale: the NB blocks' 16 row scales each, consecutive, or nullptr (all 1).
template <int M, int NB, typename Scale>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void fp8_tile(const float* const* x, const uint8_t* const* panel, const Scale* const* b_scale,
                                        const float* row_scale, int groups, int group, float* out, int64_t ld) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, _mm512_setzero_ps());
  const int lines = group / 4;  // a line is 4 k of a block
  for (int g = 0; g < groups; ++g) {
    __m512 acc[M][NB];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int p = g * lines; p < (g + 1) * lines; ++p) {
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (p + kStreamAheadLines) * 64), _MM_HINT_T1);
      for (int k = 4 * p; k < 4 * p + 4; ++k) {
        __m512 b[NB];
        for (int j = 0; j < NB; ++j) b[j] = fp8_times_2_120(panel[j] + k * 16);
        for (int i = 0; i < M; ++i) {
          const __m512 a = _mm512_set1_ps(x[i][k]);
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
        }
      }
    }
    add_group_sums<M, NB, Scale>(acc, b_scale, g, kFp8SumScale, out, ld);
  }
  scale_rows<M, NB>(row_scale, out, ld);
}

template <int M, int NB>
struct Fp8Tile {
  template <typename... A>
  static void run(A... a) { fp8_tile<M, NB>(a...); }
};

#ifdef __AVX512BF16__
// Prefill on bf16 dot products (twice fp32 FMA's rate): each task's panels are converted once
// to bf16 pairs ([Kp/2][16][2], the values exactly: E4M3 has 4 significant bits) and every row
// chunk reuses them from L2; activations are rounded to bf16, as the bf16 format's. From 16
// rows an expert: the conversion is spent on at least 16 rows (on the Zen 4 guest 8 and 16
// measured alike, within its noise, at 64-512 tokens a layer; 512: 1.37x the fp32 path).
constexpr int kFp8Bf16MinRows = 16, kFp8Bf16Rows = 6, kFp8Bf16Blocks = 4;

// A panel's codes, rows 2p and 2p+1 interleaved byte by byte (unpack), as bf16 pairs: the
// values times 2^-120 (fp32), times 2^120 (exact), narrowed (exact).
void fp8_panel_to_bf16(const uint8_t* panel, int kp, uint16_t* out) {
  const __m512 unscale = _mm512_set1_ps(0x1p120f);
  for (int p = 0; p < kp / 2; ++p) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + 2 * p * 16));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + (2 * p + 1) * 16));
    uint8_t pairs[32];  // columns 0-7, then 8-15, each (k, k + 1)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs), _mm_unpacklo_epi8(r0, r1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + 16), _mm_unpackhi_epi8(r0, r1));
    const __m512 low = _mm512_mul_ps(fp8_times_2_120(pairs), unscale);
    const __m512 high = _mm512_mul_ps(fp8_times_2_120(pairs + 16), unscale);
    _mm512_storeu_si512(out + p * 32, (__m512i)_mm512_cvtne2ps_pbh(high, low));
  }
}

// x: bf16 rows; panel[j]: block j converted; sums per group scaled by block_scale (true values
// on both sides: no power-of-two factors).
template <int M, int NB, typename Scale>
__attribute__((noinline)) void fp8_bf16_tile(const uint16_t* const* x, const uint16_t* const* panel,
                                             const Scale* const* b_scale, const float* row_scale, int groups, int group,
                                             float* out, int64_t ld) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, _mm512_setzero_ps());
  const int pairs = group / 2;
  for (int g = 0; g < groups; ++g) {
    __m512 acc[M][NB];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int p = g * pairs; p < (g + 1) * pairs; ++p) {
      __m512bh b[NB];
      for (int j = 0; j < NB; ++j) b[j] = (__m512bh)_mm512_loadu_si512(panel[j] + p * 32);
      for (int i = 0; i < M; ++i) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 2 * p));
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
      }
    }
    add_group_sums<M, NB, Scale>(acc, b_scale, g, 1.f, out, ld);
  }
  scale_rows<M, NB>(row_scale, out, ld);
}

template <int M, int NB>
struct Fp8Bf16Tile {
  template <typename... A>
  static void run(A... a) { fp8_bf16_tile<M, NB>(a...); }
};

template <typename Scale>
void gemm_fp8_bf16(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  thread_local aligned_vector<uint16_t> converted;
  converted.resize(static_cast<std::size_t>(kFp8Bf16Blocks) * w.Kp * 16);
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += kFp8Bf16Blocks) {
    const int nb = std::min(kFp8Bf16Blocks, a.n1 / 16 - b0);
    const uint16_t* panel[kFp8Bf16Blocks];
    const Scale* bs[kFp8Bf16Blocks];
    for (int j = 0; j < nb; ++j) {
      uint16_t* dst = converted.data() + static_cast<std::size_t>(j) * w.Kp * 16;
      fp8_panel_to_bf16(w.block(b0 + j), w.Kp, dst);
      panel[j] = dst;
      bs[j] = group_scales_of<Scale>(w, b0 + j);
    }
    for (int i0 = 0; i0 < a.m; i0 += kFp8Bf16Rows) {
      const int m = std::min(kFp8Bf16Rows, a.m - i0);
      const uint16_t* x[kFp8Bf16Rows];
      for (int i = 0; i < m; ++i) x[i] = a.act->bf16.data() + static_cast<int64_t>(a.rows[i0 + i]) * a.act->Kp;
      dispatch<kFp8Bf16Rows, kFp8Bf16Blocks, Fp8Bf16Tile>(
          m, nb, static_cast<const uint16_t* const*>(x), static_cast<const uint16_t* const*>(panel),
          static_cast<const Scale* const*>(bs), w.fp8_row_scales(b0), w.groups(), w.group,
          a.out + i0 * a.ld_out + (b0 * 16 - a.n0), a.ld_out);
    }
  }
}
#endif

// Decode: more blocks at once (more memory streams in flight), as gemm_grouped. Scale: fp8's
// float block scales, or mxfp8's E8M0 codes (group_scale).
template <typename Scale>
void gemm_fp8_scaled(const GemmArgs& a) {
#ifdef __AVX512BF16__
  if (a.m >= kFp8Bf16MinRows) return gemm_fp8_bf16<Scale>(a);
#endif
  const PackedMatrix& w = *a.w;
  const bool decode = a.m <= kDecodeRows;
  const int blocks = decode ? kFp8DecodeBlocks : kFp8Blocks;
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += blocks) {
    const int nb = std::min(blocks, a.n1 / 16 - b0);
    const uint8_t* panel[kFp8DecodeBlocks];
    const Scale* bs[kFp8DecodeBlocks];
    for (int j = 0; j < nb; ++j) {
      panel[j] = w.block(b0 + j);
      bs[j] = group_scales_of<Scale>(w, b0 + j);
    }
    for (int i0 = 0; i0 < a.m; i0 += kFp8Rows) {
      const int m = std::min(kFp8Rows, a.m - i0);
      const float* x[kFp8Rows];
      for (int i = 0; i < m; ++i) x[i] = a.act->f32.data() + a.rows[i0 + i] * a.act->f32_ld;
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      const auto args = std::make_tuple(static_cast<const float* const*>(x), static_cast<const uint8_t* const*>(panel),
                                        static_cast<const Scale* const*>(bs), w.fp8_row_scales(b0), w.groups(),
                                        w.group, out, a.ld_out);
      if (decode)
        std::apply([&](auto... v) { dispatch<kDecodeRows, kFp8DecodeBlocks, Fp8Tile>(m, nb, v...); }, args);
      else
        std::apply([&](auto... v) { dispatch<kFp8Rows, kFp8Blocks, Fp8Tile>(m, nb, v...); }, args);
    }
  }
}

void gemm_fp8(const GemmArgs& a) {
  return a.w->element == Element::mxfp8 ? gemm_fp8_scaled<uint8_t>(a) : gemm_fp8_scaled<float>(a);
}

}  // namespace
}  // namespace kt
