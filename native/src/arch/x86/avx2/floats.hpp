// The AVX2 kernels of the plain float elements (f16, f32: GGUF's F16 and F32): a part of
// arch/x86/avx2/kernels.cpp, included there after its prefetch_panel (in the same unnamed
// namespace).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "arch/common/dispatch.hpp"
#include "kernels/types.hpp"

namespace kt {
namespace {

// 4 rows x 2 halves of a block's 16 columns: 8 accumulators, 2 weight vectors, a broadcast.
constexpr int kFloatRows = 4;

template <Element E>
struct FloatTiles {
  // A k's 8 columns of half h as floats: float16 widened (F16C), or float32 as they are.
  static __m256 values(const uint8_t* panel, int k, int h) {
    if constexpr (E == Element::f16)
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k * 32 + h * 16)));
    else
      return _mm256_loadu_ps(reinterpret_cast<const float*>(panel + k * 64 + h * 32));
  }
  template <int M, int NB>
  struct Tile {
    static void run(const float* const* x, const uint8_t* panel, int kp, float* out, int64_t ld) {
      constexpr int kLine = E == Element::f16 ? 32 : 64;
      __m256 acc[M][2];
      for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      for (int k = 0; k < kp; ++k) {
        if (k % (64 / kLine) == 0) prefetch_panel(panel + k * kLine);
        const __m256 b[2] = {values(panel, k, 0), values(panel, k, 1)};
        for (int i = 0; i < M; ++i) {
          const __m256 a = _mm256_set1_ps(x[i][k]);
          for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_fmadd_ps(a, b[h], acc[i][h]);
        }
      }
      for (int i = 0; i < M; ++i)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, acc[i][h]);
    }
  };
};

template <Element E>
void gemm_floats_block(const GemmArgs& a, int blk) {
  for (int i0 = 0; i0 < a.m; i0 += kFloatRows) {
    const int m = std::min(kFloatRows, a.m - i0);
    const float* x[kFloatRows];
    for (int i = 0; i < m; ++i) x[i] = a.act->f32.data() + a.rows[i0 + i] * a.act->f32_ld;
    dispatch<kFloatRows, 1, FloatTiles<E>::template Tile>(m, 1, static_cast<const float* const*>(x), a.w->block(blk),
                                                          a.w->Kp, a.out + i0 * a.ld_out + (blk * 16 - a.n0), a.ld_out);
  }
}

}  // namespace
}  // namespace kt
