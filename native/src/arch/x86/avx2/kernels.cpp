// AVX2/FMA kernels: the portable path for any x86-64 CPU from Haswell / Zen 1 on.
//
// bf16 is widened to fp32 (exact, in vdpbf16ps order); int8 uses vpmaddubsw with the
// sign moved onto the weights (|x| * sign(w, x)), so with |x|, |w| <= 127 a pair sum
// stays below 32767 and never saturates; int4 nibbles (0..15) are the unsigned operand,
// whose pair sums (<= 2 * 15 * 127) cannot saturate either.
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

constexpr int kRows = 4;  // 16 ymm registers: 4 rows x 2 halves of 16 columns + operands

template <int M, int NB>
struct Bf16Tile {
  static void run(const uint16_t* const* x, const uint16_t* panel, int kp2, float* out, int64_t ld) {
    __m256 acc[M][2];
    for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    for (int p = 0; p < kp2; ++p) {
      __m256 b_odd[2], b_even[2];
      for (int h = 0; h < 2; ++h) {
        __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 32 + h * 16));
        b_odd[h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        b_even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      }
      for (int i = 0; i < M; ++i) {
        uint32_t pair = *reinterpret_cast<const uint32_t*>(x[i] + 2 * p);
        __m256 a_odd = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(pair & 0xFFFF0000u)));
        __m256 a_even = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(pair << 16)));
        for (int h = 0; h < 2; ++h) {
          acc[i][h] = _mm256_fmadd_ps(a_odd, b_odd[h], acc[i][h]);
          acc[i][h] = _mm256_fmadd_ps(a_even, b_even[h], acc[i][h]);
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + i * ld + h * 8, acc[i][h]);
  }
};

template <int M, int NB>
struct Int8Tile {
  static void run(const int8_t* const* x, const float* xs, const int8_t* panel, const float* ws, int kp4, float* out,
                  int64_t ld) {
    __m256i acc[M][2];
    for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int p = 0; p < kp4; ++p) {
      __m256i b[2];
      for (int h = 0; h < 2; ++h) b[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64 + h * 32));
      for (int i = 0; i < M; ++i) {
        __m256i a = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 4 * p));
        __m256i a_abs = _mm256_abs_epi8(a);
        for (int h = 0; h < 2; ++h) {
          __m256i pairs = _mm256_maddubs_epi16(a_abs, _mm256_sign_epi8(b[h], a));
          acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + h * 8), _mm256_set1_ps(xs[i]));
        _mm256_storeu_ps(out + i * ld + h * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), s));
      }
  }
};

template <int M, int NB>
struct Int4Tile {
  static void run(const int8_t* const* x, const int32_t* const* gsum, const float* xs, const uint8_t* panel,
                  const float* g_scale, int groups, int group, float* out, int64_t ld) {
    __m256 accf[M][2];
    for (int i = 0; i < M; ++i) accf[i][0] = accf[i][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int steps = group / 8;
    for (int g = 0; g < groups; ++g) {
      __m256i acc[M][2];
      for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
      for (int s = 0; s < steps; ++s) {
        const int p = g * steps + s;
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + p * 64 + h * 32));
          lo[h] = _mm256_and_si256(v, low);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        for (int i = 0; i < M; ++i) {
          __m256i a_lo = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p));
          __m256i a_hi = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x[i] + 8 * p + 4));
          for (int h = 0; h < 2; ++h) {
            __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], a_lo), _mm256_maddubs_epi16(hi[h], a_hi));
            acc[i][h] = _mm256_add_epi32(acc[i][h], _mm256_madd_epi16(t, ones));
          }
        }
      }
      for (int i = 0; i < M; ++i) {
        __m256i offset = _mm256_set1_epi32(8 * gsum[i][g]);
        for (int h = 0; h < 2; ++h) {
          __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][h], offset));
          accf[i][h] = _mm256_fmadd_ps(v, _mm256_loadu_ps(g_scale + g * 16 + h * 8), accf[i][h]);
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(out + i * ld + h * 8, _mm256_mul_ps(accf[i][h], _mm256_set1_ps(xs[i])));
  }
};

void gemm(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const Activations& act = *a.act;
  const int G = w.groups();
  for (int blk = a.n0 / 16; blk < a.n1 / 16; ++blk) {
    for (int i0 = 0; i0 < a.m; i0 += kRows) {
      const int m = std::min(kRows, a.m - i0);
      float* out = a.out + i0 * a.ld_out + (blk * 16 - a.n0);
      float xs[kRows];
      const int32_t* sums[kRows];
      const void* rows[kRows];
      for (int i = 0; i < m; ++i) {
        int64_t r = a.rows[i0 + i];
        if (w.method == Method::bf16) {
          rows[i] = act.bf16.data() + r * act.Kp;
        } else {
          rows[i] = act.q.data() + r * act.Kp;
          xs[i] = act.scale[r];
          if (w.method == Method::int4) sums[i] = act.gsum.data() + r * G;
        }
      }
      switch (w.method) {
        case Method::bf16:
          dispatch<kRows, 1, Bf16Tile>(m, 1, reinterpret_cast<const uint16_t* const*>(rows),
                                       reinterpret_cast<const uint16_t*>(w.block(blk)), w.Kp / 2, out, a.ld_out);
          break;
        case Method::int8:
          dispatch<kRows, 1, Int8Tile>(m, 1, reinterpret_cast<const int8_t* const*>(rows),
                                       static_cast<const float*>(xs), reinterpret_cast<const int8_t*>(w.block(blk)),
                                       w.scale.data() + blk * 16, w.Kp / 4, out, a.ld_out);
          break;
        case Method::int4:
          dispatch<kRows, 1, Int4Tile>(m, 1, reinterpret_cast<const int8_t* const*>(rows),
                                       static_cast<const int32_t* const*>(sums), static_cast<const float*>(xs),
                                       w.block(blk), w.scale.data() + static_cast<int64_t>(blk) * G * 16, G, w.group,
                                       out, a.ld_out);
          break;
      }
    }
  }
}

std::string describe(Method m) {
  return m == Method::bf16 ? "avx2 fp32 fma (exact vdpbf16ps emulation)"
         : m == Method::int8 ? "avx2 maddubs, sign on the weights"
                             : "avx2 maddubs on unpacked nibbles";
}

std::vector<std::string> features() { return compiled_features(); }

// ---- machine peaks (kt bench) -------------------------------------------------------------

double peak_ops(int kind, int64_t iterations) {
  constexpr int kChains = 12;
  __m256 f[kChains];
  __m256i q[kChains];
  for (int c = 0; c < kChains; ++c) {
    f[c] = _mm256_set1_ps(static_cast<float>(c));
    q[c] = _mm256_set1_epi32(c);
  }
  __m256 fa = _mm256_set1_ps(1.0000001f), fb = _mm256_set1_ps(1e-9f);
  __m256i ia = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  double ops = 0;
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile("" : "+x"(fa), "+x"(ia));
    if (kind == 0 || kind == 1) {  // bf16 runs as fp32 fma here: 2 fma per bf16 pair
      for (int c = 0; c < kChains; ++c) f[c] = _mm256_fmadd_ps(f[c], fa, fb);
      ops = 16;
    } else {  // the int8 dot sequence of the kernels: maddubs, madd, add
      for (int c = 0; c < kChains; ++c)
        q[c] = _mm256_add_epi32(q[c], _mm256_madd_epi16(_mm256_maddubs_epi16(ia, ia), ones));
      ops = 64;
    }
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

}  // namespace

const KernelTable avx2_kernels = {"avx2", features, describe, gemm, silu_mul, quantize_row_generic,
                                   to_bf16_row_generic, combine_generic, peak_ops, read_stream};

}  // namespace kt
