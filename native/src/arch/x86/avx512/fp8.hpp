// The AVX-512 fp8 kernels: a part of arch/x86/avx512/kernels.cpp, included there after its
// kStreamAheadLines and kDecodeRows (in the same unnamed namespace), so they are compiled with
// each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

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

// x: rows times 2^64 (Activations::f32); b_scale[j]: block j's scale per group; row_scale: the
// NB blocks' 16 row scales each, consecutive, or nullptr (all 1).
template <int M, int NB>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void fp8_tile(const float* const* x, const uint8_t* const* panel, const float* const* b_scale,
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
    for (int j = 0; j < NB; ++j) {
      const __m512 scale = _mm512_set1_ps(b_scale[j][g] * kFp8SumScale);
      for (int i = 0; i < M; ++i) {
        float* o = out + i * ld + j * 16;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(acc[i][j], scale, _mm512_loadu_ps(o)));
      }
    }
  }
  if (row_scale == nullptr) return;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j)
      _mm512_storeu_ps(out + i * ld + j * 16,
                       _mm512_mul_ps(_mm512_loadu_ps(out + i * ld + j * 16), _mm512_loadu_ps(row_scale + j * 16)));
}

template <int M, int NB>
struct Fp8Tile {
  template <typename... A>
  static void run(A... a) { fp8_tile<M, NB>(a...); }
};

// Decode: more blocks at once (more memory streams in flight), as gemm_grouped.
void gemm_fp8(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const bool decode = a.m <= kDecodeRows;
  const int blocks = decode ? kFp8DecodeBlocks : kFp8Blocks;
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += blocks) {
    const int nb = std::min(blocks, a.n1 / 16 - b0);
    const uint8_t* panel[kFp8DecodeBlocks];
    const float* bs[kFp8DecodeBlocks];
    for (int j = 0; j < nb; ++j) {
      panel[j] = w.block(b0 + j);
      bs[j] = w.fp8_block_scales(b0 + j);
    }
    for (int i0 = 0; i0 < a.m; i0 += kFp8Rows) {
      const int m = std::min(kFp8Rows, a.m - i0);
      const float* x[kFp8Rows];
      for (int i = 0; i < m; ++i) x[i] = a.act->f32.data() + a.rows[i0 + i] * a.act->f32_ld;
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      const auto args = std::make_tuple(static_cast<const float* const*>(x), static_cast<const uint8_t* const*>(panel),
                                        static_cast<const float* const*>(bs), w.fp8_row_scales(b0), w.groups(),
                                        w.group, out, a.ld_out);
      if (decode)
        std::apply([&](auto... v) { dispatch<kDecodeRows, kFp8DecodeBlocks, Fp8Tile>(m, nb, v...); }, args);
      else
        std::apply([&](auto... v) { dispatch<kFp8Rows, kFp8Blocks, Fp8Tile>(m, nb, v...); }, args);
    }
  }
}

}  // namespace
}  // namespace kt
