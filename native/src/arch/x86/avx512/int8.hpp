// The AVX-512 per-row int8 kernels: a part of arch/x86/avx512/kernels.cpp, included there after
// its dpbusd, kStreamAheadLines and kDecodeRows (in the same unnamed namespace), so they are
// compiled with each AVX-512 level's flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "arch/common/dispatch.hpp"
#include "kernels/types.hpp"

namespace kt {
namespace {
#ifdef __AVX512VNNI__

// ---- int8 -------------------------------------------------------------------------------

// K steps (of 4) per L1 block: 3 panels x 128 steps x 64 bytes = 24 KiB
constexpr int kInt8Rows = 8, kInt8Blocks = 3, kInt8StepsPerBlock = 128;

// Accumulates K steps [p0, p1) in flushes of `flush` steps (one activation block; with a scale
// a token, the whole range): a flush's int32 sums start at -128 times the weights' column sums
// over it (the u8 activations' offset, at no instruction in the loop) and are added, times the
// row's activation scale there, to the float sums in `sums` ([M][NB * 16]: fixed offsets, no
// pointer a row), which stay in L1 while every row chunk passes over the NB panels' K block. No
// branches around the step loop: GCC then keeps all M x NB accumulators in registers.
template <int M, int NB>
__attribute__((noinline)) void int8_tile(const uint8_t* const* x, const float* const* x_scale, const int8_t* const* panel,
                                         const int16_t* const* colsum, int p0, int p1, int flush, int block_steps,
                                         float* sums) {
  for (int f0 = p0; f0 < p1; f0 += flush) {
    const int f1 = std::min(p1, f0 + flush);
    __m512i start[NB];
    for (int j = 0; j < NB; ++j) {
      __m512i sum = _mm512_setzero_si512();
      for (int s = f0 / block_steps; s < f1 / block_steps; ++s)
        sum = _mm512_add_epi32(sum, _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(colsum[j] + s * 16))));
      start[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
    }
    __m512i acc[M][NB];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) acc[i][j] = start[j];
    for (int p = f0; p < f1; ++p) {
      __m512i b[NB];
      for (int j = 0; j < NB; ++j) {
        // one K block ahead, into L2: the next block streams from memory while this one computes
        _mm_prefetch(reinterpret_cast<const char*>(panel[j] + (p + kInt8StepsPerBlock) * 64), _MM_HINT_T1);
        b[j] = _mm512_loadu_si512(panel[j] + p * 64);
      }
      for (int i = 0; i < M; ++i) {
        __m512i a = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 4 * p));
        for (int j = 0; j < NB; ++j) acc[i][j] = dpbusd(acc[i][j], a, b[j]);
      }
    }
    for (int i = 0; i < M; ++i) {
      const __m512 xs = _mm512_set1_ps(x_scale[i][f0 / block_steps]);
      for (int j = 0; j < NB; ++j) {
        float* o = sums + (i * NB + j) * 16;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]), xs, _mm512_loadu_ps(o)));
      }
    }
    // the float sums stay in `sums` between flushes: without this GCC carries them in spilled
    // registers too, a second store of each every flush (15% of prefill at a flush a block of 128)
    __asm__ volatile("" ::: "memory");
  }
}

// m rows of nb blocks of 16 outputs: the tiles' sums ([m][nb * 16]) times the weights' row scales
void int8_finish(const float* sums, int m, int nb, const PackedMatrix& w, int b0, float* out, int64_t ld) {
  for (int j = 0; j < nb; ++j) {
    const __m512 ws = _mm512_loadu_ps(w.row_scales(b0 + j));
    for (int i = 0; i < m; ++i)
      _mm512_storeu_ps(out + i * ld + j * 16, _mm512_mul_ps(_mm512_loadu_ps(sums + (i * nb + j) * 16), ws));
  }
}

template <int M, int NB>
struct Int8Tile {
  template <typename... A>
  static void run(A... a) { int8_tile<M, NB>(a...); }
};

// Decode: see gemm_bf16_decode. One K block spans the whole K (the panels are read once).
void gemm_int8_decode(const GemmArgs& a, int flush, int block_steps) {
  const PackedMatrix& w = *a.w;
  const uint8_t* x[kDecodeRows];
  const float* xs[kDecodeRows];
  for (int i = 0; i < a.m; ++i) {
    x[i] = a.act->q_u8.data() + static_cast<int64_t>(a.rows[i]) * a.act->Kp;
    xs[i] = a.act->scales(a.rows[i]);
  }
  alignas(64) float sums[kDecodeRows * kDecodeBlocks * 16];
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += kDecodeBlocks) {
    const int nb = std::min(kDecodeBlocks, a.n1 / 16 - b0);
    const int8_t* panel[kDecodeBlocks];
    const int16_t* colsum[kDecodeBlocks];
    for (int j = 0; j < nb; ++j) {
      panel[j] = reinterpret_cast<const int8_t*>(w.block(b0 + j));
      colsum[j] = w.block_colsums(b0 + j);
    }
    std::fill(sums, sums + a.m * nb * 16, 0.f);
    dispatch<kDecodeRows, kDecodeBlocks, Int8Tile>(a.m, nb, static_cast<const uint8_t* const*>(x),
                                                   static_cast<const float* const*>(xs),
                                                   static_cast<const int8_t* const*>(panel),
                                                   static_cast<const int16_t* const*>(colsum), 0, w.Kp / 4, flush,
                                                   block_steps, static_cast<float*>(sums));
    int8_finish(sums, a.m, nb, w, b0, a.out + (b0 * 16 - a.n0), a.ld_out);
  }
}

// Per-row weights, int8 activations a scale per block (activation_block): each block's sums
// scaled in the tile. With a scale a token the tiles flush once a K block (today's int32
// partial sums' one load and store), or once a call in decode.
void gemm_int8(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const int kp4 = w.Kp / 4, block_steps = a.act->block / 4;
  if (a.m <= kDecodeRows) return gemm_int8_decode(a, a.act->token_scales ? kp4 : block_steps, block_steps);
  const int flush = a.act->token_scales ? kInt8StepsPerBlock : block_steps;
  // each row chunk's float sums, [M][NB * 16] together (L1-resident between K blocks)
  thread_local aligned_vector<float> partial;
  const int chunks = (a.m + kInt8Rows - 1) / kInt8Rows;
  const std::size_t per_chunk = static_cast<std::size_t>(kInt8Rows) * kInt8Blocks * 16;
  if (partial.size() < chunks * per_chunk) partial.resize(chunks * per_chunk);
  for (int b0 = a.n0 / 16; b0 < a.n1 / 16; b0 += kInt8Blocks) {
    const int nb = std::min(kInt8Blocks, a.n1 / 16 - b0);
    const int8_t* panel[kInt8Blocks];
    const int16_t* colsum[kInt8Blocks];
    for (int j = 0; j < nb; ++j) {
      panel[j] = reinterpret_cast<const int8_t*>(w.block(b0 + j));
      colsum[j] = w.block_colsums(b0 + j);
    }
    std::fill(partial.begin(), partial.begin() + chunks * per_chunk, 0.f);
    for (int p0 = 0; p0 < kp4; p0 += kInt8StepsPerBlock) {
      const int p1 = std::min(kp4, p0 + kInt8StepsPerBlock);
      for (int c = 0; c < chunks; ++c) {
        const int i0 = c * kInt8Rows, m = std::min(kInt8Rows, a.m - i0);
        const uint8_t* x[kInt8Rows];
        const float* xs[kInt8Rows];
        for (int i = 0; i < m; ++i) {
          x[i] = a.act->q_u8.data() + static_cast<int64_t>(a.rows[i0 + i]) * a.act->Kp;
          xs[i] = a.act->scales(a.rows[i0 + i]);
        }
        dispatch<kInt8Rows, kInt8Blocks, Int8Tile>(m, nb, static_cast<const uint8_t* const*>(x),
                                                   static_cast<const float* const*>(xs),
                                                   static_cast<const int8_t* const*>(panel),
                                                   static_cast<const int16_t* const*>(colsum), p0, p1, flush,
                                                   block_steps, partial.data() + c * per_chunk);
      }
    }
    for (int c = 0; c < chunks; ++c) {
      const int i0 = c * kInt8Rows, m = std::min(kInt8Rows, a.m - i0);
      int8_finish(partial.data() + c * per_chunk, m, nb, w, b0,
                  a.out + i0 * a.ld_out + (b0 * 16 - a.n0), a.ld_out);
    }
  }
}

#endif  // __AVX512VNNI__
}  // namespace
}  // namespace kt
