// Reference kernels: plain C++ over the packed layouts, the definition the others are
// tested against. Compiled without ISA flags.
#include <cstdint>
#include <cstring>

#include "arch/features.hpp"
#include "kernels/lattice.hpp"
#include "kernels/registry.hpp"
#include "kernels/rowops.hpp"
#include "kernels/scalar.hpp"

namespace kt {
namespace {

void gemm_bf16(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const int kp2 = w.Kp / 2;
  for (int i = 0; i < a.m; ++i) {
    const uint16_t* x = a.act->bf16.data() + static_cast<int64_t>(a.rows[i]) * a.act->Kp;
    for (int n = a.n0; n < a.n1; ++n) {
      const uint16_t* panel = reinterpret_cast<const uint16_t*>(w.block(n / 16)) + (n % 16) * 2;
      float acc = 0.f;
      // Same order as vdpbf16ps: the odd element of each pair first.
      for (int p = 0; p < kp2; ++p) {
        acc += bf16_to_f32(x[2 * p + 1]) * bf16_to_f32(panel[p * 32 + 1]);
        acc += bf16_to_f32(x[2 * p]) * bf16_to_f32(panel[p * 32]);
      }
      a.out[i * a.ld_out + (n - a.n0)] = acc;
    }
  }
}

// Each activation block's int32 sum, times the row's scale of the block, summed in float.
void gemm_int8(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const Activations& act = *a.act;
  for (int i = 0; i < a.m; ++i) {
    const int64_t r = a.rows[i];
    const int8_t* x = act.q.data() + r * act.Kp;
    for (int n = a.n0; n < a.n1; ++n) {
      const int8_t* panel = reinterpret_cast<const int8_t*>(w.block(n / 16)) + (n % 16) * 4;
      float sum = 0.f;
      for (int kb = 0; kb < act.blocks; ++kb) {
        int32_t acc = 0;
        for (int k = kb * act.block; k < (kb + 1) * act.block; ++k)
          acc += static_cast<int32_t>(x[k]) * panel[k / 4 * 64 + k % 4];
        sum += static_cast<float>(acc) * act.scales(r)[kb];
      }
      a.out[i * a.ld_out + (n - a.n0)] = sum * w.row_scales(n / 16)[n % 16];
    }
  }
}

// The grouped elements: each group's sum is exact in int32 and scaled at the group's end, times
// the row's activation scale of its block (activation_block: the group, or the super-block that
// holds it), as every backend does. code(block, c, k) reads value k of column c of a block's panel; scale(block, g, c) is
// column c of the block's scale for group g (bf16 unless given), zero(block, g, c) what each of
// its values is offset by (int4z's zero point; none unless given).
using GroupValue = float (*)(const PackedMatrix&, int, int, int);
inline float bf16_group_scale(const PackedMatrix& w, int block, int g, int c) {
  return bf16_to_f32(w.block_scales(block)[g * 16 + c]);
}
inline float no_zero(const PackedMatrix&, int, int, int) { return 0.f; }
inline float f16_group_scale(const PackedMatrix& w, int block, int g, int c) {
  return f16_to_f32(w.block_scales(block)[g * 16 + c]);
}

// minimum(block, g, c): what q4k takes off each value of the group (its dmin * m), in float.
template <typename Code>
void gemm_grouped(const GemmArgs& a, Code code, GroupValue scale = bf16_group_scale, float final_scale = 1.f,
                  GroupValue zero = no_zero, GroupValue minimum = no_zero) {
  const PackedMatrix& w = *a.w;
  const int G = w.groups(), group = w.group, block_of = a.act->block;
  for (int i = 0; i < a.m; ++i) {
    const int64_t r = a.rows[i];
    const int8_t* x = a.act->q.data() + r * a.act->Kp;
    const float* xs = a.act->scales(r);
    for (int n = a.n0; n < a.n1; ++n) {
      const uint8_t* block = w.block(n / 16);
      float acc = 0.f;
      for (int g = 0; g < G; ++g) {
        int32_t s = 0;
        for (int k = g * group; k < (g + 1) * group; ++k) s += code(block, n % 16, k) * x[k];
        s -= static_cast<int32_t>(zero(w, n / 16, g, n % 16)) * a.act->gsum[r * G + g];
        const float sums = static_cast<float>(s) * scale(w, n / 16, g, n % 16) -
                           static_cast<float>(a.act->gsum[r * G + g]) * minimum(w, n / 16, g, n % 16);
        acc += sums * xs[g * group / block_of];
      }
      a.out[i * a.ld_out + (n - a.n0)] = acc * final_scale;
    }
  }
}

// int4: nibbles q + 8, k = 8j + b in the low and 8j + 4 + b in the high half of byte b of line j
int int4_code(const uint8_t* block, int c, int k) {
  const uint8_t byte = block[(k / 8) * 64 + c * 4 + k % 4];
  return ((k % 8) >= 4 ? byte >> 4 : byte & 0x0F) - 8;
}

// fp4: int4's nibbles, E2M1 codes read as twice their value; the E8M0 scale 2^(e - 127), and
// a final 1/2 for the doubling (kernels/types.hpp)
int fp4_doubled(const uint8_t* block, int c, int k) {
  const uint8_t byte = block[(k / 8) * 64 + c * 4 + k % 4];
  return kFp4Doubled[(k % 8) >= 4 ? byte >> 4 : byte & 0x0F];
}
float e8m0_group_scale(const PackedMatrix& w, int block, int g, int c) {
  return e8m0_to_f32(w.block_e8m0(block)[g * 16 + c]);
}
// nvfp4: fp4's codes, a UE4M3 scale per group (its tensor scale: the kernels provider's, after)
float ue4m3_group_scale(const PackedMatrix& w, int block, int g, int c) {
  return ue4m3_to_f32(w.block_e8m0(block)[g * 16 + c]);
}

// int4z: unsigned nibbles in int4's order, a float32 scale and a zero point per group (its record
// of kernels/types.hpp): per group sum(q * x) - zero * sum(x), exact in int32
int nibble_code(const uint8_t* block, int c, int k) { return int4_code(block, c, k) + 8; }
float int4z_scale(const PackedMatrix& w, int block, int g, int c) {
  float scale;
  std::memcpy(&scale, w.block_meta(block) + g * kInt4zGroupBytes + 4 * c, 4);
  return scale;
}
float int4z_zero(const PackedMatrix& w, int block, int g, int c) {
  return w.block_meta(block)[g * kInt4zGroupBytes + 64 + c];
}

// q4k: unsigned nibbles in int4's order; per group d * sc_j and dmin * m_j from its super-block's
// record (kernels/types.hpp), exact in float32
const uint8_t* q4k_record(const PackedMatrix& w, int block, int g) {
  return w.block_meta(block) + (g / kQ4kGroupsPerSuper) * kQ4kSuperBytes;
}
float q4k_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
float q4k_scale(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = q4k_record(w, block, g);
  return q4k_half(r + 2 * c) * r[kQ4kSubScales + (g % kQ4kGroupsPerSuper) * 16 + c];
}
float q4k_min(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = q4k_record(w, block, g);
  return q4k_half(r + 32 + 2 * c) * r[kQ4kMins + (g % kQ4kGroupsPerSuper) * 16 + c];
}

// int8g: bytes q + 128 in int8's order
int int8g_code(const uint8_t* block, int c, int k) { return block[(k / 4) * 64 + c * 4 + k % 4] - 128; }

// iq4nl, iq4xs: int4's nibbles, each a code of the IQ4 grid; iq4nl's float16 scales, iq4xs's
// d * sc from its super-block's record (kernels/types.hpp), exact in float32
int iq4_value(const uint8_t* block, int c, int k) { return kIq4Values[nibble_code(block, c, k)]; }
float iq4xs_scale(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = w.block_meta(block) + (g / kQ4kGroupsPerSuper) * kIq4xsSuperBytes;
  return q4k_half(r + 2 * c) * static_cast<float>(static_cast<int8_t>(r[kIq4xsSubScales + (g % kQ4kGroupsPerSuper) * 16 + c]));
}

// The K-quants' codes: a line's nibble (int4's order) and its planes' bits (kernels/types.hpp's
// layouts): q5k's (and q50's, q51's) in [0, 31], q6k's in [0, 63] less 32 per group (its activation
// sum times 32 taken off, as the SIMD kernels do), q3k's in [0, 7] less 4, q2k's in [0, 3]
template <class L>
int plane_code(const uint8_t* block, int c, int k) {
  return L::code(block + (k / 8) * L::kBytes, c * 4 + k % 4, (k % 8) >= 4);
}
// q6k's (and q3k's) per group d * sc_j from its super-block's record, exact in float32
float q6k_scale(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = w.block_meta(block) + (g / kQ6kGroupsPerSuper) * kQ6kSuperBytes;
  return q4k_half(r + 2 * c) * static_cast<float>(static_cast<int8_t>(r[kQ6kSubScales + (g % kQ6kGroupsPerSuper) * 16 + c]));
}
float q6k_zero(const PackedMatrix&, int, int, int) { return kQ6kOffset; }

float q3k_zero(const PackedMatrix&, int, int, int) { return kQ3kOffset; }

// q2k: per group d * sc_j and dmin * m_j from its super-block's record (kernels/types.hpp), exact
// in float32
const uint8_t* q2k_record(const PackedMatrix& w, int block, int g) {
  return w.block_meta(block) + (g / kQ6kGroupsPerSuper) * kQ2kSuperBytes;
}
float q2k_scale(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = q2k_record(w, block, g);
  return q4k_half(r + 2 * c) * static_cast<float>(r[kQ2kScalesMins + (g % kQ6kGroupsPerSuper) * 16 + c] & 0x0F);
}
float q2k_min(const PackedMatrix& w, int block, int g, int c) {
  const uint8_t* r = q2k_record(w, block, g);
  return q4k_half(r + 32 + 2 * c) * static_cast<float>(r[kQ2kScalesMins + (g % kQ6kGroupsPerSuper) * 16 + c] >> 4);
}

// q40, q50: unsigned codes less 8 (16) per group, a float16 d; q41, q51: d from the group's record
// and m times the activation sum added (as a minimum taken off: -m)
float legacy_offset_of(const PackedMatrix& w, int, int, int) { return static_cast<float>(legacy_offset(w.element)); }
float legacy_half(const PackedMatrix& w, int block, int g, int at) {
  return q4k_half(w.block_meta(block) + static_cast<std::size_t>(g) * kLegacyGroupBytes + at);
}
float legacy_d(const PackedMatrix& w, int block, int g, int c) { return legacy_half(w, block, g, 2 * c); }
float legacy_negated_m(const PackedMatrix& w, int block, int g, int c) {
  return -legacy_half(w, block, g, kLegacyMins + 2 * c);
}

// the i-quants: each value the grid's, signed (IQ1_S: 8 times it plus the group's shift), per group
// d * (2 ls + 1) * their factor (kernels/lattice.hpp)
template <Element E>
int lattice_code(const uint8_t* block, int c, int k) {
  return lattice_value(E, block, c, k);
}

// fp8: per group, the sum of code * 2^-120 times x * 2^64 over the group (fp32, in k order, as
// the SIMD kernels), times block scale (mxfp8: the column's E8M0 scale) * 2^56; the row's scale at
// the end.
void gemm_fp8(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  const int G = w.groups(), group = w.group;
  for (int i = 0; i < a.m; ++i) {
    const float* x = a.act->f32.data() + a.rows[i] * a.act->f32_ld;
    for (int n = a.n0; n < a.n1; ++n) {
      const uint8_t* panel = w.block(n / 16) + n % 16;
      float acc = 0.f;
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
        for (int k = g * group; k < (g + 1) * group; ++k) s += fp8_code_times_2_120(panel[k * 16]) * x[k];
        const float scale = w.element == Element::mxfp8 ? e8m0_group_scale(w, n / 16, g, n % 16) : w.fp8_block_scales(n / 16)[g];
        acc += s * (scale * kFp8SumScale);
      }
      const float* row_scale = w.fp8_row_scales(n / 16);
      a.out[i * a.ld_out + (n - a.n0)] = row_scale ? acc * row_scale[n % 16] : acc;
    }
  }
}

// f16, f32: the values widened, fp32 sums in k order on the exact activations
void gemm_floats(const GemmArgs& a) {
  const PackedMatrix& w = *a.w;
  for (int i = 0; i < a.m; ++i) {
    const float* x = a.act->f32.data() + a.rows[i] * a.act->f32_ld;
    for (int n = a.n0; n < a.n1; ++n) {
      const uint8_t* panel = w.block(n / 16);
      const std::size_t at = n % 16;
      float acc = 0.f;
      for (int k = 0; k < w.Kp; ++k) {
        float v;
        if (w.element == Element::f32) std::memcpy(&v, panel + 4 * (at + k * 16), 4);
        else v = f16_to_f32(reinterpret_cast<const uint16_t*>(panel)[at + k * 16]);
        acc += v * x[k];
      }
      a.out[i * a.ld_out + (n - a.n0)] = acc;
    }
  }
}

void gemm(const GemmArgs& a) {
  switch (a.w->element) {
    case Element::fp8:
    case Element::mxfp8: return gemm_fp8(a);
    case Element::bf16: return gemm_bf16(a);
    case Element::f16:
    case Element::f32: return gemm_floats(a);
    case Element::int8: return gemm_int8(a);
    case Element::int4: return gemm_grouped(a, int4_code);
    case Element::int8g: return gemm_grouped(a, int8g_code);
    case Element::int8h: return gemm_grouped(a, int8g_code, f16_group_scale);
    case Element::fp4: return gemm_grouped(a, fp4_doubled, e8m0_group_scale, 0.5f);
    case Element::nvfp4: return gemm_grouped(a, fp4_doubled, ue4m3_group_scale, 0.5f);
    case Element::int4z: return gemm_grouped(a, nibble_code, int4z_scale, 1.f, int4z_zero);
    case Element::q4k: return gemm_grouped(a, nibble_code, q4k_scale, 1.f, no_zero, q4k_min);
    case Element::q6k: return gemm_grouped(a, plane_code<Q6kLine>, q6k_scale, 1.f, q6k_zero);
    case Element::q5k: return gemm_grouped(a, plane_code<Q5kLine>, q4k_scale, 1.f, no_zero, q4k_min);
    case Element::q3k: return gemm_grouped(a, plane_code<Q3kLine>, q6k_scale, 1.f, q3k_zero);
    case Element::q40: return gemm_grouped(a, nibble_code, f16_group_scale, 1.f, legacy_offset_of);
    case Element::q50: return gemm_grouped(a, plane_code<Q5kLine>, f16_group_scale, 1.f, legacy_offset_of);
    case Element::q41: return gemm_grouped(a, nibble_code, legacy_d, 1.f, no_zero, legacy_negated_m);
    case Element::q51: return gemm_grouped(a, plane_code<Q5kLine>, legacy_d, 1.f, no_zero, legacy_negated_m);
    case Element::q2k: return gemm_grouped(a, plane_code<Q2kLine>, q2k_scale, 1.f, no_zero, q2k_min);
    case Element::iq4nl: return gemm_grouped(a, iq4_value, f16_group_scale);
    case Element::iq4xs: return gemm_grouped(a, iq4_value, iq4xs_scale);
    case Element::iq2xxs: return gemm_grouped(a, lattice_code<Element::iq2xxs>, lattice_scale);
    case Element::iq2xs: return gemm_grouped(a, lattice_code<Element::iq2xs>, lattice_scale);
    case Element::iq3xxs: return gemm_grouped(a, lattice_code<Element::iq3xxs>, lattice_scale);
    case Element::iq1s: return gemm_grouped(a, lattice_code<Element::iq1s>, lattice_scale);
  }
}

std::string describe(Element m) {
  return m == Element::bf16   ? "scalar fp32 dot of bf16"
         : floats(m)          ? "scalar fp32 dot"
         : m == Element::int8 ? "scalar int32 dot"
         : m == Element::fp8  ? "scalar fp32 dot of fp8 per block"
         : m == Element::mxfp8 ? "scalar fp32 dot of fp8 per group, E8M0 scales"
         : m == Element::fp4  ? "scalar int32 dot of doubled fp4 per group"
         : m == Element::nvfp4 ? "scalar int32 dot of doubled fp4 per group of 16, UE4M3 scales"
         : m == Element::int4z ? "scalar int32 dot per group, less zero points"
         : q4k_records(m)     ? "scalar int32 dot per group, less mins"
         : iq4(m)             ? "scalar int32 dot per group of IQ4 grid values"
         : lattice(m)         ? "scalar int32 dot per group of signed i-quant grid values"
         : m == Element::int8h ? "scalar int32 dot per group, float16 scales"
         : m == Element::q6k  ? "scalar int32 dot per group of 16, less 32 times the activation sum"
         : m == Element::q3k  ? "scalar int32 dot per group of 16, less 4 times the activation sum"
         : m == Element::q2k  ? "scalar int32 dot per group of 16, less mins"
         : legacy_mins(m)     ? "scalar int32 dot per group, float16 scales, plus mins"
         : legacy(m)          ? "scalar int32 dot per group, float16 scales, less the codes' offset"
                              : "scalar int32 dot per group";
}

double peak_ops(int, int64_t) { return 0; }  // the reference backend has no peak of its own

uint64_t read_stream(const uint8_t* data, std::size_t bytes) {
  uint64_t sum = 0;
  for (std::size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v;
    std::memcpy(&v, data + i, 8);
    sum += v;
  }
  return sum;
}

void silu_mul(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

}  // namespace

const KernelTable reference_kernels = {"reference",      kCompiledFeatures,           describe,       gemm, silu_mul,
                                       quantize_row_generic, to_bf16_row_generic, combine_generic, peak_ops, read_stream};

}  // namespace kt
