// The AMX tile unit, palette 1: eight tiles of up to 16 rows x 64 bytes.
//
// The kernels are written once against kt::tile. Built with -mamx-* flags, each operation
// is the hardware instruction; built with KTFORGE_AMX_MODEL, an exact software model of
// it (same shapes, same accumulation order and rounding), so the very same kernel source
// is tested on CPUs without AMX. Tile numbers are template parameters because the
// instructions encode them as immediates.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#ifndef KTFORGE_AMX_MODEL
#include <immintrin.h>
#endif

namespace kt::tile {

// The 64-byte operand of ldtilecfg (Intel SDM, "TILECFG").
struct alignas(64) Config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile i
  uint8_t rows[16] = {};

  void set(int tile, int rows_, int colsb_) {
    rows[tile] = static_cast<uint8_t>(rows_);
    colsb[tile] = static_cast<uint16_t>(colsb_);
  }
};
static_assert(sizeof(Config) == 64, "TILECFG is 64 bytes");

#ifndef KTFORGE_AMX_MODEL

// GCC's _tile_* macros paste their tile arguments into the asm text, which template
// parameters cannot feed; these are the same instructions with the tile as an immediate.
inline void configure(const Config& c) { _tile_loadconfig(&c); }
inline void release() { _tile_release(); }
template <int T>
inline void zero() { __asm__ volatile("tilezero %%tmm%c0" : : "i"(T)); }
template <int T>
inline void load(const void* base, int64_t stride) {
  __asm__ volatile("tileloadd (%1,%2,1), %%tmm%c0" : : "i"(T), "r"(base), "r"(stride) : "memory");
}
template <int T>
inline void store(void* base, int64_t stride) {
  __asm__ volatile("tilestored %%tmm%c0, (%1,%2,1)" : : "i"(T), "r"(base), "r"(stride) : "memory");
}
template <int C, int A, int B>
inline void dpbf16ps() { __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B)); }
template <int C, int A, int B>
inline void dpbusd() { __asm__ volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B)); }
template <int C, int A, int B>
inline void dpbsud() { __asm__ volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B)); }
template <int C, int A, int B>
inline void dpbssd() { __asm__ volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B)); }
template <int C, int A, int B>
inline void dpbuud() { __asm__ volatile("tdpbuud %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(C), "i"(A), "i"(B)); }
inline constexpr bool is_model = false;

#else  // ---- the software tile unit ------------------------------------------------------

namespace model {

struct Unit {
  Config cfg;
  bool configured = false;
  alignas(64) uint8_t data[8][16 * 64];
};
inline Unit& unit() {
  static thread_local Unit u;
  return u;
}
inline void check(int t) {
  if (!unit().configured || t < 0 || t > 7) __builtin_trap();  // hardware: #UD
}
inline float bf16(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// tdpbf16ps treats denormal inputs as zero and flushes denormal results (SDM pseudo-code).
inline float daz(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? 0.f * f : f; }

template <typename Ta, typename Tb>
inline void dot_bytes(int c, int a, int b) {
  check(c), check(a), check(b);
  Unit& u = unit();
  const int M = u.cfg.rows[c], N = u.cfg.colsb[c] / 4, K = u.cfg.colsb[a] / 4;
  auto* C = reinterpret_cast<int32_t*>(u.data[c]);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      int32_t acc = C[m * 16 + n];
      for (int k = 0; k < K; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<int32_t>(reinterpret_cast<const Ta*>(u.data[a])[m * 64 + 4 * k + i]) *
                 static_cast<int32_t>(reinterpret_cast<const Tb*>(u.data[b])[k * 64 + 4 * n + i]);
      C[m * 16 + n] = acc;
    }
}

}  // namespace model

inline void configure(const Config& c) {
  model::unit().cfg = c;
  model::unit().configured = true;
  std::memset(model::unit().data, 0, sizeof model::unit().data);  // ldtilecfg zeroes every tile
}
inline void release() {
  model::unit().configured = false;
  std::memset(model::unit().data, 0, sizeof model::unit().data);
}
template <int T>
inline void zero() {
  model::check(T);
  std::memset(model::unit().data[T], 0, sizeof model::unit().data[T]);
}
template <int T>
inline void load(const void* base, int64_t stride) {
  model::check(T);
  auto& u = model::unit();
  std::memset(u.data[T], 0, sizeof u.data[T]);
  for (int r = 0; r < u.cfg.rows[T]; ++r)
    std::memcpy(u.data[T] + r * 64, static_cast<const uint8_t*>(base) + r * stride, u.cfg.colsb[T]);
}
template <int T>
inline void store(void* base, int64_t stride) {
  model::check(T);
  auto& u = model::unit();
  for (int r = 0; r < u.cfg.rows[T]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, u.data[T] + r * 64, u.cfg.colsb[T]);
}
// C[m][n] += A[m][2k]*B[k][2n], then += A[m][2k+1]*B[k][2n+1], in fp32 with round to
// nearest even, k ascending, denormals in and out as zero (the SDM's TDPBF16PS pseudo-code).
template <int C, int A, int B>
inline void dpbf16ps() {
  using namespace model;
  check(C), check(A), check(B);
  Unit& u = unit();
  const int M = u.cfg.rows[C], N = u.cfg.colsb[C] / 4, K = u.cfg.colsb[A] / 4;
  auto* c = reinterpret_cast<float*>(u.data[C]);
  const auto* a = reinterpret_cast<const uint16_t*>(u.data[A]);
  const auto* b = reinterpret_cast<const uint16_t*>(u.data[B]);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float acc = c[m * 16 + n];
      for (int k = 0; k < K; ++k) {
        acc += daz(bf16(a[m * 32 + 2 * k])) * daz(bf16(b[k * 32 + 2 * n]));
        acc += daz(bf16(a[m * 32 + 2 * k + 1])) * daz(bf16(b[k * 32 + 2 * n + 1]));
      }
      c[m * 16 + n] = daz(acc);
    }
}
template <int C, int A, int B>
inline void dpbusd() { model::dot_bytes<uint8_t, int8_t>(C, A, B); }
template <int C, int A, int B>
inline void dpbsud() { model::dot_bytes<int8_t, uint8_t>(C, A, B); }
template <int C, int A, int B>
inline void dpbssd() { model::dot_bytes<int8_t, int8_t>(C, A, B); }
template <int C, int A, int B>
inline void dpbuud() { model::dot_bytes<uint8_t, uint8_t>(C, A, B); }
inline constexpr bool is_model = true;

#endif

}  // namespace kt::tile
