// The AVX-512 kernels of the plain float elements (f16, f32: GGUF's F16 and F32), and the
// activation rows' conversion to bf16: a part of arch/x86/avx512/kernels.cpp, included there
// after its kStreamAheadLines and kDecodeRows (in the same unnamed namespace), so they are
// compiled with each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "arch/common/dispatch.hpp"
#include "kernels/types.hpp"

namespace kt {
namespace {

// 8 rows x 3 blocks of fp32 sums in registers (24 accumulators, 3 weight vectors, a broadcast);
// decode: more blocks at once, for more memory streams in flight.
constexpr int kFloatRows = 8, kFloatBlocks = 3, kFloatDecodeBlocks = 8;

// A k's 16 columns as floats: float16 widened (vcvtph2ps), or float32 as they are.
template <Element E>
inline __m512 float_values(const uint8_t* panel, int k) {
  if constexpr (E == Element::f16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * 32)));
  else
    return _mm512_loadu_ps(reinterpret_cast<const float*>(panel + k * 64));
}

template <Element E, int M, int NB>
// noinline: register allocation in isolation keeps every accumulator in a register
__attribute__((noinline)) void float_tile(const float* const* x, const uint8_t* const* panel, int kp, float* out,
                                          int64_t ld) {
  constexpr int kLine = E == Element::f16 ? 32 : 64;
  __m512 acc[M][NB];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int k = 0; k < kp; ++k) {
    __m512 b[NB];
    for (int j = 0; j < NB; ++j) {
      if (k % (64 / kLine) == 0)
        _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (k * kLine) + kStreamAheadLines * 64), _MM_HINT_T1);
      b[j] = float_values<E>(panel[j], k);
    }
    for (int i = 0; i < M; ++i) {
      const __m512 a = _mm512_set1_ps(x[i][k]);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(out + i * ld + j * 16, acc[i][j]);
}

template <Element E>
struct FloatTiles {
  template <int M, int NB>
  struct Tile {
    template <typename... A>
    static void run(A... a) { float_tile<E, M, NB>(a...); }
  };
};

template <Element E>
void gemm_floats(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const bool decode = a.m <= kDecodeRows;
  const int blocks = decode ? kFloatDecodeBlocks : kFloatBlocks;
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += blocks) {
    const int nb = std::min(blocks, a.n1 / 16 - b0);
    const uint8_t* panel[kFloatDecodeBlocks];
    for (int j = 0; j < nb; ++j) panel[j] = w.block(b0 + j);
    for (int i0 = 0; i0 < a.m; i0 += kFloatRows) {
      const int m = std::min(kFloatRows, a.m - i0);
      const float* x[kFloatRows];
      for (int i = 0; i < m; ++i) x[i] = a.act->f32.data() + a.rows[i0 + i] * a.act->f32_ld;
      float* out = a.out + i0 * a.ld_out + (b0 * 16 - a.n0);
      if (decode)
        dispatch<kDecodeRows, kFloatDecodeBlocks, FloatTiles<E>::template Tile>(
            m, nb, static_cast<const float* const*>(x), static_cast<const uint8_t* const*>(panel), w.Kp, out, a.ld_out);
      else
        dispatch<kFloatRows, kFloatBlocks, FloatTiles<E>::template Tile>(
            m, nb, static_cast<const float* const*>(x), static_cast<const uint8_t* const*>(panel), w.Kp, out, a.ld_out);
    }
  }
}

// to_bf16_row_generic's rounding (to nearest even; a NaN stays a quiet NaN), 16 lanes at a time
// with AVX-512F alone (no AVX512_BF16 needed): the intermediate activations of every token go
// through here, where the scalar loop cost prefill about 5% of its time
bool to_bf16_row(const float* x, int K, int Kp, uint16_t* out) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i rounding = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  __mmask16 bad = 0;
  for (int k = 0; k < Kp; k += 16) {  // Kp is a multiple of 16; lanes past K are 0
    const __mmask16 mask = K - k >= 16 ? 0xFFFF : K > k ? static_cast<__mmask16>((1u << (K - k)) - 1) : 0;
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, x + k));
    const __m512i magnitude = _mm512_and_si512(bits, abs_mask);
    bad |= _mm512_cmpge_epi32_mask(magnitude, inf);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(rounding, lsb)), 16);
    rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm512_cvtepi32_epi16(rounded));
  }
  return bad == 0;
}

}  // namespace
}  // namespace kt
