// The AVX-512 backend's activation quantization: a part of arch/x86/avx512/kernels.cpp, included
// there (in its unnamed namespace), so it is compiled with each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/rowops.hpp"
#include "kernels/scalar.hpp"

namespace kt {
namespace {

// The generic quantize_row, vectorized by hand (GCC keeps its NaN-aware max loop scalar):
// the same scales, the same round-to-nearest-even and clamp, so results are bit-identical.
bool quantize_row(const float* x, int K, int Kp, int group, int block, int8_t* q, uint8_t* q_u8, float* scale,
                  int32_t* gsum) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)), largest = _mm512_set1_ps(3.4028235e38f);
  const __m512 hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  const __m128i offset = _mm_set1_epi8(static_cast<char>(0x80));
  // lanes past K read as 0 (Kp and block are multiples of 16)
  auto load = [&](int k) {
    const __mmask16 mask = K - k >= 16 ? 0xFFFF : K > k ? static_cast<__mmask16>((1u << (K - k)) - 1) : 0;
    return _mm512_maskz_loadu_ps(mask, x + k);
  };
  __mmask16 finite = 0xFFFF;
  for (int k = 0; k < K; k += 16) finite &= _mm512_cmp_ps_mask(_mm512_and_ps(load(k), sign), largest, _CMP_LE_OQ);
  if (finite != 0xFFFF) return false;  // NaN or inf somewhere
  for (int b0 = 0; b0 < Kp; b0 += block) {
    __m512 max_abs = _mm512_setzero_ps();
    for (int k = b0; k < b0 + block; k += 16) max_abs = _mm512_max_ps(max_abs, _mm512_and_ps(load(k), sign));
    const float s = symmetric_scale(_mm512_reduce_max_ps(max_abs), 127);
    scale[b0 / block] = s;
    const __m512 inv = _mm512_set1_ps(1.f / s);
    for (int k = b0; k < b0 + block; k += 16) {
      __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(load(k), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      __m128i q8 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), q8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q_u8 + k), _mm_xor_si128(q8, offset));
    }
  }
  if (gsum) group_sums(q, Kp, group, gsum);
  return true;
}

}  // namespace
}  // namespace kt
