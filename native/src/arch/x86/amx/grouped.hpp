// The grouped elements on tiles (int4, int4z, int8g; q2k and q3k with their scales folded in):
// a part of arch/x86/amx/kernels.cpp, included there after unpack.hpp (in the same unnamed
// namespace, using its scratch, gather and tile configurations), so it is compiled for the
// tiles and for the model.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "arch/x86/amx/tile.hpp"
#include "kernels/types.hpp"

namespace kt {
namespace {

// One group's sums of a row against 16 columns, less what unsigned weights carry (offsets[n] *
// x_sum: int8g's 128, int4z's zero points; none for int4's signed ones), times the group's
// scales, times the row's activation scale of the group (xs) into acc, each fused (one rounding,
// as vfmadd): the AVX-512 kernels' order, so the model, the hardware and they are bit-identical.
inline void flush_group(const int32_t* c, const uint8_t* offsets, int32_t x_sum, const float* ws, float xs, float* acc) {
#ifndef KTFORGE_AMX_MODEL
  __m512i sums = _mm512_loadu_si512(c);
  if (offsets)
    sums = _mm512_sub_epi32(sums, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets))),
                                                     _mm512_set1_epi32(x_sum)));
  const __m512 scaled = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_loadu_ps(ws), _mm512_setzero_ps());
  _mm512_storeu_ps(acc, _mm512_fmadd_ps(scaled, _mm512_set1_ps(xs), _mm512_loadu_ps(acc)));
#else
  for (int n = 0; n < 16; ++n)
    acc[n] = std::fma(std::fma(static_cast<float>(c[n] - (offsets ? offsets[n] * x_sum : 0)), ws[n], 0.f), xs, acc[n]);
#endif
}

// A 32-row block's float accumulators (acc[32][32], `halves` column blocks from blk), already
// scaled by each token's activation scales, into the task's output rows.
inline void store_rows(const GemmArgs& g, int i0, int rows, int blk, int halves, const float* acc) {
  for (int i = 0; i < rows; ++i) {
    float* out = g.out + static_cast<int64_t>(i0 + i) * g.ld_out + (blk * 16 - g.n0);
    for (int h = 0; h < halves; ++h) std::memcpy(out + h * 16, acc + i * 32 + h * 16, 16 * sizeof(float));
  }
}

// int8g's codes are w + 128 in every column
alignas(16) constexpr uint8_t kInt8gOffsets[16] = {128, 128, 128, 128, 128, 128, 128, 128,
                                                   128, 128, 128, 128, 128, 128, 128, 128};

// n bf16 scales widened to float32, exactly (n a multiple of 16).
inline void widen_bf16(const uint16_t* bits, int n, float* out) {
#ifndef KTFORGE_AMX_MODEL
  for (int k = 0; k < n; k += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + k));
    _mm512_storeu_ps(out + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
  }
#else
  for (int k = 0; k < n; ++k) out[k] = bf16_to_f32(bits[k]);
#endif
}

// The tile products of a group's sums: signed activations by unsigned weights (int8g's codes,
// int4z's, tdpbsud), by signed ones (int4 unpacked, tdpbssd), or bf16 by bf16 (fp8 converted, tdpbf16ps).
enum class GroupDot { unsigned_weights, signed_weights, bf16 };

template <GroupDot Dot, int C, int A, int B>
inline void group_dot() {
  if constexpr (Dot == GroupDot::unsigned_weights)
    tile::dpbsud<C, A, B>();
  else if constexpr (Dot == GroupDot::signed_weights)
    tile::dpbssd<C, A, B>();
  else
    tile::dpbf16ps<C, A, B>();
}

// One group's sums of a 32-row block against one or two column blocks (`pair`), K steps
// [ks0, ks0 + steps) of kbytes bytes, into c ([32][32] int32, or float for bf16): exact for
// the integer products.
template <GroupDot Dot>
void group_sums(const uint8_t* ai, std::size_t row_bytes, const uint8_t* const* b_blocks, bool pair, int ks0, int steps,
                int kbytes, int32_t* c) {
  tile::zero<0>(), tile::zero<1>(), tile::zero<2>(), tile::zero<3>();
  for (int ks = ks0; ks < ks0 + steps; ++ks) {
    tile::load<4>(ai + ks * kbytes, static_cast<int64_t>(row_bytes));
    tile::load<5>(ai + 16 * row_bytes + ks * kbytes, static_cast<int64_t>(row_bytes));
    tile::load<6>(b_blocks[0] + ks * kbytes * 16, 64);
    group_dot<Dot, 0, 4, 6>(), group_dot<Dot, 2, 5, 6>();
    if (pair) {
      tile::load<7>(b_blocks[1] + ks * kbytes * 16, 64);
      group_dot<Dot, 1, 4, 7>(), group_dot<Dot, 3, 5, 7>();
    }
  }
  tile::store<0>(c, 128), tile::store<2>(c + 16 * 32, 128);
  if (pair) tile::store<1>(c + 16, 128), tile::store<3>(c + 16 * 32 + 16, 128);
}

// A column block of int4, int4z or int8g as B tiles (int8g's panel as it is; the nibbles
// unpacked into `unpacked`) and its group scales widened to float32 into `scales`, exactly.
const uint8_t* tile_block_of(const PackedMatrix& w, int blk, int kp, int8_t* unpacked, float* scales) {
  const int G = w.groups();
  if (w.element == Element::int4z) {
    for (int grp = 0; grp < G; ++grp) std::memcpy(scales + grp * 16, w.block_meta(blk) + grp * kInt4zGroupBytes, 64);
    unpack_nibbles(w.block(blk), kp, unpacked);
    return reinterpret_cast<const uint8_t*>(unpacked);
  }
  widen_bf16(w.block_scales(blk), G * 16, scales);
  if (w.element == Element::int8g) return w.block(blk);
  unpack_int4(w.block(blk), kp, unpacked);
  return reinterpret_cast<const uint8_t*>(unpacked);
}

// int4, int4z and int8g on tiles. int4 (int4z): a column-block pair is unpacked once per task
// into int8 B tiles (2 x 16 x Kp bytes, L2-resident) that every 32-row block reuses, and
// tdpbssd on the signed activations gives each group's exact sums (int4z: tdpbsud, the sums
// plus the zero point times sum_k x, removed per group). int8g: the panels are B tiles already;
// tdpbsud (signed activations, unsigned codes w + 128) gives the sums plus 128 * sum_k x,
// removed per group. Sums are scaled into float accumulators at the group's end in the
// AVX-512 kernel's order (fma per group, then the token's scale): bit-identical results.
void amx_grouped(const GemmArgs& g) {
  const PackedMatrix& w = *g.w;
  const Activations& act = *g.act;
  const bool int8g = w.element == Element::int8g, int4z = w.element == Element::int4z;
  const int kp = act.Kp, G = w.groups(), kbytes = std::min(64, w.group), steps = w.group / kbytes;
  const std::size_t row_bytes = static_cast<std::size_t>(kp);
  const int m_pad = (g.m + 31) / 32 * 32;
  const uint8_t* a = gather(g, reinterpret_cast<const uint8_t*>(act.q.data()), row_bytes, m_pad);
  auto& b = scratch().b;
  if (!int8g) b.resize(static_cast<std::size_t>(2) * kp * 16);
  int8_t* unpacked[2] = {b.data(), b.data() + static_cast<std::size_t>(kp) * 16};
  const uint8_t* b_blocks[2] = {nullptr, nullptr};
  int32_t* c = scratch().c;
  float* acc = scratch().acc;
  auto& widened = scratch().scales;
  widened.resize(static_cast<std::size_t>(2) * G * 16);
  float* scales[2] = {widened.data(), widened.data() + static_cast<std::size_t>(G) * 16};
  tile::configure(int8_tiles(kbytes));  // per call: see amx_gemm
  for (int blk = g.n0 / 16; blk < g.n1 / 16; blk += 2) {
    const bool pair = blk + 1 < g.n1 / 16;
    const int halves = pair ? 2 : 1;
    for (int h = 0; h < halves; ++h) b_blocks[h] = tile_block_of(w, blk + h, kp, unpacked[h], scales[h]);
    // The next pair's panels stream into L2 while this pair computes: unpacking reads them
    // from there instead of waiting on memory.
    const int next_blocks = std::max(0, std::min(2, g.n1 / 16 - (blk + 2)));
    const int panel_lines = static_cast<int>(w.block_bytes() / 64), lines_per_group = (panel_lines + G - 1) / G;
    for (int i0 = 0; i0 < m_pad; i0 += 32) {
      const uint8_t* ai = a + static_cast<std::size_t>(i0) * row_bytes;
      const int rows = std::min(32, g.m - i0);
      std::fill(acc, acc + 32 * 32, 0.f);
      for (int grp = 0; grp < G; ++grp) {
        if (i0 == 0)
          for (int h = 0; h < next_blocks; ++h)
            for (int l = grp * lines_per_group; l < std::min(panel_lines, (grp + 1) * lines_per_group); ++l)
              _mm_prefetch(reinterpret_cast<const char*>(w.block(blk + 2 + h) + l * 64), _MM_HINT_T1);
        if (int8g || int4z)
          group_sums<GroupDot::unsigned_weights>(ai, row_bytes, b_blocks, pair, grp * steps, steps, kbytes, c);
        else
          group_sums<GroupDot::signed_weights>(ai, row_bytes, b_blocks, pair, grp * steps, steps, kbytes, c);
        for (int h = 0; h < halves; ++h) {
          const uint8_t* offsets = int8g ? kInt8gOffsets : int4z ? w.block_meta(blk + h) + grp * kInt4zGroupBytes + 64 : nullptr;
          for (int i = 0; i < rows; ++i) {
            const int64_t r = g.rows[i0 + i];
            flush_group(c + i * 32 + h * 16, offsets, act.gsum[r * G + grp], scales[h] + grp * 16, act.scales(r)[grp],
                        acc + i * 32 + h * 16);
          }
        }
      }
      store_rows(g, i0, rows, blk, halves, acc);
    }
  }
  tile::release();
}

// 16 float16 values (a record's d or dmin of 16 columns) widened to float32, exactly.
inline void widen_f16(const uint8_t* bits, float* out) {
#ifndef KTFORGE_AMX_MODEL
  _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits))));
#else
  for (int n = 0; n < 16; ++n) {
    uint16_t h;
    std::memcpy(&h, bits + 2 * n, 2);
    out[n] = f16_to_f32(h);
  }
#endif
}

// acc[16] += (float(sums[16]) * d[16] - float(mins[16]) * dmin[16]) * xs, each step fused: q2k's
// super-block flush in the AVX-512 kernel's order.
inline void flush_q2k(const int32_t* sums, const int32_t* mins, const float* d, const float* dmin, float xs, float* acc) {
#ifndef KTFORGE_AMX_MODEL
  const __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums)), _mm512_loadu_ps(d), _mm512_setzero_ps());
  const __m512 scaled = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(mins)), _mm512_loadu_ps(dmin), a);
  _mm512_storeu_ps(acc, _mm512_fmadd_ps(scaled, _mm512_set1_ps(xs), _mm512_loadu_ps(acc)));
#else
  for (int n = 0; n < 16; ++n)
    acc[n] = std::fma(std::fma(-static_cast<float>(mins[n]), dmin[n], std::fma(static_cast<float>(sums[n]), d[n], 0.f)), xs, acc[n]);
#endif
}

// q3k's folded codes carry kQ3kFoldBias (fold_scales) in every column
alignas(16) constexpr uint8_t kQ3kFoldOffsets[16] = {kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias,
                                                     kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias,
                                                     kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias,
                                                     kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias, kQ3kFoldBias};

// q2k and q3k on tiles, their groups' scales folded into the B tiles (fold_scales), so a tile
// group is a super-block of 256 values, 4 K steps of 64: one flush per 256 values, where a
// flush per 16 had made the tiles 1.5-1.9x slower than AVX-512. q3k: a column-block pair, the
// sums less kQ3kFoldBias times the super-block's activation sum, times d; q2k: one column block with
// its mins as the pair's second B tile, times d and dmin. The AVX-512 kernels' folded integer
// sums and order of scaling: bit-identical results.
void amx_folded(const GemmArgs& g) {
  const PackedMatrix& w = *g.w;
  const Activations& act = *g.act;
  const bool q2k = w.element == Element::q2k;
  const int kp = act.Kp, G = w.groups(), supers = kp / kQ4kSuperBlock;
  const int super_bytes = q2k ? kQ2kSuperBytes : kQ6kSuperBytes;
  const std::size_t row_bytes = static_cast<std::size_t>(kp);
  const int m_pad = (g.m + 31) / 32 * 32;
  const uint8_t* a = gather(g, reinterpret_cast<const uint8_t*>(act.q.data()), row_bytes, m_pad);
  auto& b = scratch().b;
  b.resize(static_cast<std::size_t>(2) * kp * 16);
  int8_t* unpacked[2] = {b.data(), b.data() + static_cast<std::size_t>(kp) * 16};  // q2k: codes, mins
  const uint8_t* b_blocks[2] = {reinterpret_cast<const uint8_t*>(unpacked[0]), reinterpret_cast<const uint8_t*>(unpacked[1])};
  auto& x_super = scratch().x_super;  // q3k: the task's rows' activation sums per super-block
  x_super.assign(q2k ? 0 : static_cast<std::size_t>(g.m) * supers, 0);
  for (int i = 0; i < (q2k ? 0 : g.m); ++i)
    for (int s = 0; s < supers; ++s)
      for (int j = 0; j < kQ6kGroupsPerSuper; ++j)
        x_super[static_cast<std::size_t>(i) * supers + s] += act.gsum[static_cast<int64_t>(g.rows[i]) * G + s * kQ6kGroupsPerSuper + j];
  auto& widened = scratch().scales;  // per block (q2k: d, dmin) and super-block, 16 columns
  widened.resize(static_cast<std::size_t>(2) * supers * 16);
  float* d[2] = {widened.data(), widened.data() + static_cast<std::size_t>(supers) * 16};
  int32_t* c = scratch().c;
  float* acc = scratch().acc;
  tile::configure(int8_tiles(64));  // per call: see amx_gemm
  for (int blk = g.n0 / 16; blk < g.n1 / 16; blk += q2k ? 1 : 2) {
    const int halves = q2k || blk + 1 == g.n1 / 16 ? 1 : 2;  // column blocks computed
    for (int h = 0; h < halves; ++h) {
      const uint8_t* meta = w.block_meta(blk + h);
      if (q2k) {
        unpack_planes<Q2kLine>(w.block(blk), kp, unpacked[0]);
        fold_scales<Element::q2k>(meta, kp, unpacked[0], unpacked[1]);
      } else {
        unpack_planes<Q3kLine, kQ3kOffset>(w.block(blk + h), kp, unpacked[h]);
        fold_scales<Element::q3k>(meta, kp, unpacked[h], nullptr);
      }
      for (int s = 0; s < supers; ++s) {
        widen_f16(meta + s * super_bytes, d[h] + s * 16);
        if (q2k) widen_f16(meta + s * super_bytes + 32, d[1] + s * 16);  // dmin
      }
    }
    for (int i0 = 0; i0 < m_pad; i0 += 32) {
      const uint8_t* ai = a + static_cast<std::size_t>(i0) * row_bytes;
      const int rows = std::min(32, g.m - i0);
      std::fill(acc, acc + 32 * 32, 0.f);
      for (int s = 0; s < supers; ++s) {
        group_sums<GroupDot::unsigned_weights>(ai, row_bytes, b_blocks, q2k || halves == 2, s * 4, 4, 64, c);
        for (int i = 0; i < rows; ++i) {
          const float xs = act.scales(g.rows[i0 + i])[s];  // a scale a super-block (activation_block)
          if (q2k) {
            flush_q2k(c + i * 32, c + i * 32 + 16, d[0] + s * 16, d[1] + s * 16, xs, acc + i * 32);
            continue;
          }
          const int32_t x_sum = x_super[static_cast<std::size_t>(i0 + i) * supers + s];
          for (int h = 0; h < halves; ++h)
            flush_group(c + i * 32 + h * 16, kQ3kFoldOffsets, x_sum, d[h] + s * 16, xs, acc + i * 32 + h * 16);
        }
      }
      store_rows(g, i0, rows, blk, halves, acc);
    }
  }
  tile::release();
}

}  // namespace
}  // namespace kt
