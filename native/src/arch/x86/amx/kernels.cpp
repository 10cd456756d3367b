// AMX kernels for prefill (tdpbf16ps, tdpbssd), AVX-512 for decode, in one backend.
//
// Compiled twice: with -mamx-* as the `amx` backend, and with KTFORGE_AMX_MODEL (AVX2 flags
// only) as `amx-model`, where kt::tile is a software model of the tile unit: the same kernel
// code runs (slowly) on any AVX2 CPU and is tested there. What is not tile code (decode, row
// operations) goes to the AVX-512 kernels, or in the model to the best SIMD table this CPU
// runs, so on an AVX-512 CPU the model and the hardware take the same non-tile paths.
//
// Tiles: C0..C3 hold a 32 x 32 fp32/int32 block of the output (2 x 2 tiles of 16 x 16),
// A4/A5 two 16-row slices of the activations, B6/B7 two 16-column blocks of the weights.
// The packed weight panels are already in B-tile order (16 rows of 64 bytes per K step),
// so B tiles load straight from them; activation rows are gathered into a contiguous,
// zero-padded buffer first (tokens of one expert are scattered).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include <immintrin.h>

#include "arch/features.hpp"
#include "arch/x86/amx/tile.hpp"
#include "kernels/scalar.hpp"
#include "kernels/registry.hpp"
#include "runtime/amx_permission.hpp"
#include "runtime/cpu_features.hpp"

#ifdef KTFORGE_AMX_MODEL
#define KT_AMX_TABLE amx_model_kernels
#define KT_AMX_NAME "amx-model"
#else
#define KT_AMX_TABLE amx_kernels
#define KT_AMX_NAME "amx"
#endif

namespace kt {
namespace {

// The kernels for everything that is not tile work: the best compiled SIMD backend this CPU
// runs (the real tiles: an AVX-512 level, e.g. avx512-bf16 in a portable build on Sapphire
// Rapids; the model: AVX-512 where it runs, else AVX2).
const KernelTable& simd() {
  static const KernelTable* best = [] {
    for (const KernelTable* t : compiled_backends()) {
      const std::string name = t->name;
      if (name == "amx" || name == "amx-model" || name == "reference") continue;
#ifndef KTFORGE_AMX_MODEL
      if (name.rfind("avx512", 0) != 0) continue;  // this backend's own flags include AVX-512
#endif
      if (runs_here(*t)) return t;
    }
#ifndef KTFORGE_AMX_MODEL
    return &avx512_kernels;
#else
    return &avx2_kernels;
#endif
  }();
  return *best;
}

// Fewest tokens per expert for which the tiles are used; below it the AVX-512 kernels are
// faster (a tile block computes 32 rows whatever the count). Measured on a 2-core Emerald
// Rapids guest, 2026-12-01 (Qwen3 layer, uniform routing, `kt bench --backend amx,avx512`,
// 3 runs; tiles from 4 tokens): at 8 tokens per expert the tiles took 1.02-1.18x AVX-512's
// time for bf16 and 1.27-1.53x for int8; at 16, 0.51-0.64x for bf16 and 0.96-1.04x for int8.
// (A Sapphire Rapids guest had measured 4 for bf16 against the AVX-512 kernels of then.)
// To be re-measured on other AMX machines: scripts/tile_crossover.py (in scripts/amx_report.sh).
constexpr int kAmxBf16MinRows = 12;
constexpr int kAmxInt8MinRows = 16;
// int4 pays a tile flush per group (scales are per group), so tiles win later: measured on
// the same machine (Qwen3 layer, tokens per expert 8 / 16 / 32 / 64 / 128: 0.66x / 0.82x /
// 1.07x / 1.41x / 1.50x the AVX-512 int4 speed, group 128).
constexpr int kAmxInt4MinRows = 32;
// int8g and int4z flush per group too: int4's.
constexpr int kAmxInt8gMinRows = 32;
// The smallest group the integer formats take tiles for. A group's sums leave the tiles
// through memory (4 tile stores, then a vector scaling per row), and tdpbusd with a K of 32
// bytes does half a tile's work: at groups of 32 that costs what the tiles save. Measured on a
// 2-core Sapphire Rapids guest, 2026-12-03 (8 experts of 2048 x 768, every token to each,
// amx/avx512 time, median of 4-5 alternating rounds, 32 to 512 tokens per expert): int4 0.76-0.79x
// at group 128, 0.96-0.97x at 64, 1.16-1.39x at 32; int8g 0.83-0.85x, 0.93-0.95x, 1.16-1.24x;
// int4z at 32 1.17-1.25x; and 0.85-1.9x, above 0.95x in all but 3 cells, for GGUF's groups of 16
// and 32 (q8_0, q4_0, q4_1, q5_0, iq4_nl, iq4_xs, q4_k, q5_k, q6_k, and q3_k and q2_k scaled per
// group of 16) and mxfp4's, whose tile kernels were removed for that (in git history). fp8's bf16 tiles win at every group
// (0.51-0.59x at 32). (With the flush a scalar loop, as it was before, q8_0 had taken 3.1-3.3x.)
constexpr int kAmxMinIntegerGroup = 64;
// q2k and q3k fold their scales into the B tiles and flush once per 256 values: from 32 tokens
// per expert 0.44-0.68x AVX-512's time, at 16 1.00-1.04x (the same guest and layer, 5 rounds).
constexpr int kAmxFoldedMinRows = 32;

// AMX tile data needs a per-process permission from Linux; asked for once. When refused,
// the backend keeps working on its AVX-512 kernels (describe() says why).
int amx_permission_errno() {
#ifdef KTFORGE_AMX_MODEL
  return 0;
#else
  return request_amx_permission();
#endif
}

tile::Config full_tiles() {
  tile::Config c;
  for (int t = 0; t < 8; ++t) c.set(t, 16, 64);
  return c;
}

// K steps of `kbytes` int8 values (64, or 32 for int4 group size 32): A tiles 16 x kbytes,
// B tiles kbytes / 4 rows of 64 bytes, C tiles 16 x 16 int32.
tile::Config int8_tiles(int kbytes) {
  tile::Config c = full_tiles();
  c.set(4, 16, kbytes), c.set(5, 16, kbytes);
  c.set(6, kbytes / 4, 64), c.set(7, kbytes / 4, 64);
  return c;
}

// What a task's gathered rows were gathered from: the next task of the same expert and rows
// (the other column slices of its gate/up or down) finds them already there.
struct GatherKey {
  const void* act;
  uint64_t version;
  const int32_t* rows;
  int m;
  bool operator==(const GatherKey& o) const { return act == o.act && version == o.version && rows == o.rows && m == o.m; }
};

struct Scratch {
  aligned_vector<uint8_t> a;  // gathered activation rows, [rows rounded to 32][Kp] elements
  GatherKey gathered{};
  aligned_vector<int8_t> b;   // int4: two column blocks unpacked to int8 B-tile rows
  aligned_vector<float> scales;  // int4: those two blocks' group scales, widened to float
  aligned_vector<int32_t> x_super;  // q3k: the rows' activation sums per super-block
  alignas(64) int32_t c[32 * 32];
  alignas(64) float acc[32 * 32];
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// Copies the m activation rows of a task, as raw bytes, into rows of a 32-aligned block.
const uint8_t* gather(const GemmArgs& g, const uint8_t* base, std::size_t row_bytes, int m_pad) {
  auto& a = scratch().a;
  const GatherKey key{base, g.act->version, g.rows, g.m};
  if (scratch().gathered == key && a.size() >= static_cast<std::size_t>(m_pad) * row_bytes) return a.data();
  scratch().gathered = key;
  a.resize(static_cast<std::size_t>(m_pad) * row_bytes);
  for (int i = 0; i < g.m; ++i)
    std::copy(base + static_cast<int64_t>(g.rows[i]) * row_bytes, base + (static_cast<int64_t>(g.rows[i]) + 1) * row_bytes,
              a.data() + static_cast<std::size_t>(i) * row_bytes);
  std::fill(a.data() + static_cast<std::size_t>(g.m) * row_bytes, a.data() + static_cast<std::size_t>(m_pad) * row_bytes,
            uint8_t{0});
  return a.data();
}

// One 32 x (16 or 32) output block over the whole K: A rows [i0, i0+32), B blocks b0(, b0+1).
template <bool Bf16>
void tile_block(const uint8_t* a, int64_t a_stride, const uint8_t* b0, const uint8_t* b1, int ksteps) {
  tile::zero<0>(), tile::zero<1>(), tile::zero<2>(), tile::zero<3>();
  for (int ks = 0; ks < ksteps; ++ks) {
    tile::load<4>(a + ks * 64, a_stride);
    tile::load<5>(a + 16 * a_stride + ks * 64, a_stride);
    tile::load<6>(b0 + ks * 1024, 64);
    if constexpr (Bf16) {
      tile::dpbf16ps<0, 4, 6>(), tile::dpbf16ps<2, 5, 6>();
    } else {
      tile::dpbssd<0, 4, 6>(), tile::dpbssd<2, 5, 6>();
    }
    if (b1) {
      tile::load<7>(b1 + ks * 1024, 64);
      if constexpr (Bf16) {
        tile::dpbf16ps<1, 4, 7>(), tile::dpbf16ps<3, 5, 7>();
      } else {
        tile::dpbssd<1, 4, 7>(), tile::dpbssd<3, 5, 7>();
      }
    }
  }
  int32_t* c = scratch().c;  // [32][32]: tiles 0/1 on top, 2/3 below
  tile::store<0>(c, 128), tile::store<2>(c + 16 * 32, 128);
  if (b1) tile::store<1>(c + 16, 128), tile::store<3>(c + 16 * 32 + 16, 128);
}

// int8: a 32 x 32 block's sums over each activation block of K (one over the whole K with a
// scale a token), times the rows' scales of the block, added in float; then the weights' scales.
// Signed activations (tdpbssd): no offset to remove.
void int8_blocks(const GemmArgs& g, const uint8_t* a, int64_t stride, int blk, bool pair, int i0) {
  const Activations& act = *g.act;
  const int ksteps = act.Kp / 64, block = g.act->token_scales ? ksteps : act.block / 64;
  const int rows = std::min(32, g.m - i0), cols = pair ? 32 : 16;
  float* acc = scratch().acc;
  for (int kb = 0; kb < ksteps; kb += block) {
    tile_block<false>(a + kb * 64, stride, g.w->block(blk) + kb * 1024, pair ? g.w->block(blk + 1) + kb * 1024 : nullptr,
                      block);
    const int32_t* c = scratch().c;
    for (int i = 0; i < rows; ++i) {
      const float xs = act.scales(g.rows[i0 + i])[kb * 64 / act.block];
      for (int n = 0; n < cols; ++n) acc[i * 32 + n] = (kb ? acc[i * 32 + n] : 0.f) + static_cast<float>(c[i * 32 + n]) * xs;
    }
  }
  for (int i = 0; i < rows; ++i) {
    float* out = g.out + static_cast<int64_t>(i0 + i) * g.ld_out + (blk * 16 - g.n0);
    for (int n = 0; n < cols; ++n) out[n] = acc[i * 32 + n] * g.w->row_scales(blk + n / 16)[n % 16];
  }
}

void amx_gemm(const GemmArgs& g) {
  const PackedMatrix& w = *g.w;
  const Activations& act = *g.act;
  const bool bf16 = w.element == Element::bf16;
  const std::size_t row_bytes = bf16 ? static_cast<std::size_t>(act.Kp) * 2 : act.Kp;
  const int m_pad = (g.m + 31) / 32 * 32;
  const uint8_t* base = bf16 ? reinterpret_cast<const uint8_t*>(act.bf16.data()) : reinterpret_cast<const uint8_t*>(act.q.data());
  const uint8_t* a = gather(g, base, row_bytes, m_pad);
  const int ksteps = static_cast<int>(row_bytes / 64);
  // Configured per call, released at the end: other AMX users in the process (oneDNN inside
  // torch) configure and release tiles on the same threads, so a "configured" flag kept per
  // thread goes stale (a tile instruction after their tilerelease is #UD: SIGILL).
  tile::configure(full_tiles());
  for (int blk = g.n0 / 16; blk < g.n1 / 16; blk += 2) {
    const bool pair = blk + 1 < g.n1 / 16;
    for (int i0 = 0; i0 < m_pad; i0 += 32) {
      const uint8_t* ai = a + static_cast<std::size_t>(i0) * row_bytes;
      if (!bf16) {
        int8_blocks(g, ai, static_cast<int64_t>(row_bytes), blk, pair, i0);
        continue;
      }
      tile_block<true>(ai, static_cast<int64_t>(row_bytes), w.block(blk), pair ? w.block(blk + 1) : nullptr, ksteps);
      const float* c = reinterpret_cast<const float*>(scratch().c);
      const int rows = std::min(32, g.m - i0), cols = pair ? 32 : 16;
      for (int i = 0; i < rows; ++i)
        std::copy(c + i * 32, c + i * 32 + cols, g.out + static_cast<int64_t>(i0 + i) * g.ld_out + (blk * 16 - g.n0));
    }
  }
  tile::release();
}

}  // namespace
}  // namespace kt

// The B tiles' unpacking, and int4's, int4z's, int8g's and the folded K-quants' kernels, in
// this file's unnamed namespace
#include "arch/x86/amx/unpack.hpp"
#include "arch/x86/amx/grouped.hpp"

namespace kt {
namespace {

// fp8 panel rows ([Kp][16] E4M3 codes) -> bf16 B-tile rows ([Kp/2][16][2]): row p holds k = 2p
// and 2p + 1 of each column, the values exactly (E4M3's 4 significant bits fit bf16's 8, so the
// float's upper half is the bf16; the code's bits give the value times 2^-120, see types.hpp).
void fp8_to_bf16_rows(const uint8_t* panel, int kp, uint16_t* out) {
#ifndef KTFORGE_AMX_MODEL
  const __m512i mask = _mm512_set1_epi32(static_cast<int>(kFp8BitsMask));
  const __m512 unscale = _mm512_set1_ps(0x1p120f);
  auto store = [&](__m128i codes, uint16_t* dst) {  // 16 codes (8 columns x k, k + 1) -> 16 bf16
    const __m512i bits = _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(codes), 20), mask);
    const __m512 value = _mm512_mul_ps(_mm512_castsi512_ps(bits), unscale);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(value), 16)));
  };
  for (int p = 0; p < kp / 2; ++p) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + 2 * p * 16));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + (2 * p + 1) * 16));
    store(_mm_unpacklo_epi8(r0, r1), out + p * 32);       // columns 0-7
    store(_mm_unpackhi_epi8(r0, r1), out + p * 32 + 16);  // columns 8-15
  }
#else
  for (int p = 0; p < kp / 2; ++p)
    for (int c = 0; c < 16; ++c)
      for (int q = 0; q < 2; ++q) {
        const float value = fp8_code_times_2_120(panel[(2 * p + q) * 16 + c]) * 0x1p120f;
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        out[p * 32 + c * 2 + q] = static_cast<uint16_t>(bits >> 16);
      }
#endif
}

// acc[16] += c[16] * s, fused
inline void fma_scalar(const float* c, float s, float* acc) {
#ifndef KTFORGE_AMX_MODEL
  _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_loadu_ps(c), _mm512_set1_ps(s), _mm512_loadu_ps(acc)));
#else
  for (int n = 0; n < 16; ++n) acc[n] = std::fma(c[n], s, acc[n]);
#endif
}

// fp8 on tiles: a column-block pair is converted once per task to bf16 B tiles (2 x 32 x Kp
// bytes, L2-resident) that every 32-row block reuses; tdpbf16ps on the bf16 activations sums
// each group of K, scaled into float accumulators at the group's end by the block's scale (one
// per 16 columns), and the row scales (a checkpoint's channel scales) at the end.
void amx_fp8(const GemmArgs& g) {
  const PackedMatrix& w = *g.w;
  const Activations& act = *g.act;
  const int kp = act.Kp, G = w.groups(), steps = w.group / 32;  // a tile step: 32 bf16 of K
  const std::size_t row_bytes = static_cast<std::size_t>(kp) * 2;
  const int m_pad = (g.m + 31) / 32 * 32;
  const uint8_t* a = gather(g, reinterpret_cast<const uint8_t*>(act.bf16.data()), row_bytes, m_pad);
  auto& b = scratch().b;
  b.resize(static_cast<std::size_t>(2) * kp * 32);
  uint16_t* converted[2] = {reinterpret_cast<uint16_t*>(b.data()), reinterpret_cast<uint16_t*>(b.data()) + kp * 16};
  const uint8_t* b_blocks[2] = {reinterpret_cast<const uint8_t*>(converted[0]), reinterpret_cast<const uint8_t*>(converted[1])};
  float* c = reinterpret_cast<float*>(scratch().c);
  float* acc = scratch().acc;
  tile::configure(full_tiles());  // per call: see amx_gemm
  for (int blk = g.n0 / 16; blk < g.n1 / 16; blk += 2) {
    const bool pair = blk + 1 < g.n1 / 16;
    const int halves = pair ? 2 : 1;
    for (int h = 0; h < halves; ++h) fp8_to_bf16_rows(w.block(blk + h), kp, converted[h]);
    for (int i0 = 0; i0 < m_pad; i0 += 32) {
      const uint8_t* ai = a + static_cast<std::size_t>(i0) * row_bytes;
      const int rows = std::min(32, g.m - i0);
      std::fill(acc, acc + 32 * 32, 0.f);
      for (int grp = 0; grp < G; ++grp) {
        group_sums<GroupDot::bf16>(ai, row_bytes, b_blocks, pair, grp * steps, steps, 64, reinterpret_cast<int32_t*>(c));
        for (int h = 0; h < halves; ++h)
          for (int i = 0; i < rows; ++i)
            fma_scalar(c + i * 32 + h * 16, w.fp8_block_scales(blk + h)[grp], acc + i * 32 + h * 16);
      }
      for (int i = 0; i < rows; ++i) {
        float* out = g.out + static_cast<int64_t>(i0 + i) * g.ld_out + (blk * 16 - g.n0);
        for (int h = 0; h < halves; ++h) {
          const float* row_scale = w.fp8_row_scales(blk + h);
          for (int n = 0; n < 16; ++n) out[h * 16 + n] = acc[i * 32 + h * 16 + n] * (row_scale ? row_scale[n] : 1.f);
        }
      }
    }
  }
  tile::release();
}

// fp8 flushes per group too (its scales are per group of K); taken from int4 until measured on
// an AMX machine.
constexpr int kAmxFp8MinRows = 32;

// q2k and q3k fold their scales into the tiles (amx_folded): a flush per super-block.
bool folded_tiles(Element m) { return m == Element::q2k || m == Element::q3k; }

int min_rows(Element m) {
  return m == Element::fp8     ? kAmxFp8MinRows
         : m == Element::bf16  ? kAmxBf16MinRows
         : m == Element::int8  ? kAmxInt8MinRows
         : m == Element::int8g ? kAmxInt8gMinRows
         : folded_tiles(m)     ? kAmxFoldedMinRows
                               : kAmxInt4MinRows;  // int4, int4z
}

// The elements with a tile kernel: the integer ones by group (kAmxMinIntegerGroup), fp8 and
// bf16, int8, q2k and q3k always. Every other element (GGUF's others, mxfp4; f16 and f32, which have no tile
// product before Granite Rapids' AMX-FP16) runs the AVX-512 kernels.
bool integer_tiles(Element m) { return m == Element::int4 || m == Element::int4z || m == Element::int8g; }
bool has_tiles(Element m) {
  return m == Element::bf16 || m == Element::int8 || m == Element::fp8 || integer_tiles(m) || folded_tiles(m);
}

bool use_tiles(const GemmArgs& g) {
  const Element m = g.w->element;
  return has_tiles(m) && (!integer_tiles(m) || g.w->group >= kAmxMinIntegerGroup) && g.m >= min_rows(m) &&
         amx_permission_errno() == 0;
}

void gemm(const GemmArgs& g) {
  if (use_tiles(g))
    return g.w->element == Element::fp8     ? amx_fp8(g)
           : folded_tiles(g.w->element)     ? amx_folded(g)
           : grouped(g.w->element)          ? amx_grouped(g)
                                            : amx_gemm(g);
  simd().gemm(g);  // decode, small groups, or no permission
}

std::string describe(Element m) {
  const std::string fallback = simd().describe(m);
  if (!has_tiles(m)) return fallback;
  if (const int err = amx_permission_errno())
    return fallback + " (AMX permission refused: errno " + std::to_string(err) + ")";
  const std::string op = m == Element::fp8     ? "tdpbf16ps per group on fp8 converted to bf16"
                         : m == Element::bf16  ? "tdpbf16ps"
                         : m == Element::int8  ? "tdpbssd, a tile flush per activation block"
                         : m == Element::int8g ? "tdpbsud per group"
                         : m == Element::int4z ? "tdpbsud per group, less zero points"
                         : m == Element::q2k   ? "tdpbsud per super-block, Q2_K's scales folded into the tiles, its mins a second product"
                         : m == Element::q3k   ? "tdpbsud per super-block, Q3_K's scales folded into the tiles"
                                               : "tdpbssd (nibbles unpacked to int8)";
  const std::string groups =
      integer_tiles(m) ? " at groups of " + std::to_string(kAmxMinIntegerGroup) + " or more," : "";
  return std::string(KT_AMX_NAME) + " " + op + groups + " for >= " + std::to_string(min_rows(m)) +
         " tokens per expert, else " + fallback;
}

// Row operations and bandwidth are the SIMD backend's (looked up when called, not at
// static initialisation, whose order across files is unspecified).
void silu_mul(const float* g, const float* u, float* o, int n) { simd().silu_mul(g, u, o, n); }
bool quantize_row(const float* x, int K, int Kp, int group, int block, int8_t* q, uint8_t* u8, float* s, int32_t* gs) {
  return simd().quantize_row(x, K, Kp, group, block, q, u8, s, gs);
}
bool to_bf16_row(const float* x, int K, int Kp, uint16_t* out) { return simd().to_bf16_row(x, K, Kp, out); }
void combine(const float* const* rows, const float* w, int k, int n, float* out) {
  simd().combine(rows, w, k, n, out);
}
uint64_t read_stream(const uint8_t* data, std::size_t bytes) { return simd().read_stream(data, bytes); }

// Tile peaks: 4 independent accumulator tiles, one 16x16x32 (bf16) or 16x16x64 (int8)
// product each per instruction.
double peak_ops(int kind, int64_t iterations) {
  if (kind == 0 || amx_permission_errno() != 0) return simd().peak_ops(kind, iterations);
  alignas(64) static uint8_t ones[1024];
  std::fill(ones, ones + 1024, uint8_t{1});
  tile::configure(full_tiles());
  tile::load<4>(ones, 64), tile::load<6>(ones, 64);
  for (int64_t it = 0; it < iterations / 64; ++it) {
    if (kind == 1)
      tile::dpbf16ps<0, 4, 6>(), tile::dpbf16ps<1, 4, 6>(), tile::dpbf16ps<2, 4, 6>(), tile::dpbf16ps<3, 4, 6>();
    else
      tile::dpbusd<0, 4, 6>(), tile::dpbusd<1, 4, 6>(), tile::dpbusd<2, 4, 6>(), tile::dpbusd<3, 4, 6>();
  }
  tile::release();
  return 4.0 * static_cast<double>(iterations / 64) * (kind == 1 ? 16 * 16 * 32 * 2 : 16 * 16 * 64 * 2);
}

// the tiles read bf16; what they hand to the SIMD backend (decode) is read its own way
bool reads_f32_activations() { return simd().reads_f32_activations && simd().reads_f32_activations(); }

}  // namespace

const KernelTable KT_AMX_TABLE = {KT_AMX_NAME, kCompiledFeatures,    describe, gemm,     silu_mul,   quantize_row,
                                  to_bf16_row, combine,     peak_ops, read_stream, reads_f32_activations};

}  // namespace kt
