#include "kernels/pack.hpp"

#include <algorithm>
#include <atomic>
#include <string>
#include <cmath>
#include <stdexcept>

#include "kernels/scalar.hpp"

namespace kt {
namespace {

float load(const void* src, DType dtype, int64_t index) {
  return dtype == DType::f32 ? static_cast<const float*>(src)[index]
                             : bf16_to_f32(static_cast<const uint16_t*>(src)[index]);
}

}  // namespace

void pack_rows(PackedMatrix& out, Method method, int group, const std::vector<const void*>& rows, DType dtype, int K) {
  const int N = static_cast<int>(rows.size());
  out.method = method;
  out.group = method == Method::int4 ? group : 0;
  out.N = N;
  out.K = K;
  out.Np = static_cast<int>(round_up(N, 16));
  out.Kp = static_cast<int>(round_up(K, k_step(method, group)));
  out.data.assign(static_cast<std::size_t>(out.blocks()) * out.block_bytes(), 0);
  out.scale.clear();
  out.colsum.clear();
  auto value = [&](int n, int k) -> float {
    if (n >= N || k >= K || rows[n] == nullptr) return 0.f;
    return load(rows[n], dtype, k);
  };

  if (method == Method::bf16) {
    auto* dst = reinterpret_cast<uint16_t*>(out.data.data());
    for (int n = 0; n < out.Np; ++n)
      for (int k = 0; k < out.Kp; ++k)
        dst[((static_cast<int64_t>(n / 16) * (out.Kp / 2) + k / 2) * 16 + n % 16) * 2 + k % 2] =
            f32_to_bf16(value(n, k));
    return;
  }
  if (method == Method::int8) {
    out.scale.assign(out.Np, 1.f);
    out.colsum.assign(out.Np, 0);
    auto* dst = reinterpret_cast<int8_t*>(out.data.data());
    for (int n = 0; n < out.Np; ++n) {
      float max_abs = 0.f;
      for (int k = 0; k < K; ++k) max_abs = std::max(max_abs, std::fabs(value(n, k)));
      float scale = symmetric_scale(max_abs, 127);
      out.scale[n] = scale;
      int32_t sum = 0;
      for (int k = 0; k < out.Kp; ++k) {
        int q = quantize(value(n, k), 1.f / scale, 127);
        sum += q;
        dst[((static_cast<int64_t>(n / 16) * (out.Kp / 4) + k / 4) * 16 + n % 16) * 4 + k % 4] =
            static_cast<int8_t>(q);
      }
      out.colsum[n] = sum;
    }
    return;
  }
  // int4, symmetric per (column, group) in [-7, 7], stored as w + 8
  const int G = out.groups();
  out.scale.assign(static_cast<std::size_t>(out.Np) * G, 1.f);
  for (int n = 0; n < out.Np; ++n) {
    for (int g = 0; g < G; ++g) {
      float max_abs = 0.f;
      for (int k = g * group; k < (g + 1) * group; ++k) max_abs = std::max(max_abs, std::fabs(value(n, k)));
      float scale = symmetric_scale(max_abs, 7);
      out.scale[(static_cast<int64_t>(n / 16) * G + g) * 16 + n % 16] = scale;
      for (int k = g * group; k < (g + 1) * group; ++k) {
        int q = quantize(value(n, k), 1.f / scale, 7) + 8;
        int q8 = k / 8, b = k % 4, high = (k % 8) >= 4;
        uint8_t& byte = out.data[((static_cast<int64_t>(n / 16) * (out.Kp / 8) + q8) * 16 + n % 16) * 4 + b];
        byte = static_cast<uint8_t>(high ? (byte & 0x0F) | (q << 4) : (byte & 0xF0) | q);
      }
    }
  }
}

void prepare_activations(const KernelTable& ops, Activations& act, Method method, int group, int Kp, const void* x,
                         DType dtype, int64_t rows, int K, int64_t ld, ThreadPool* pool, const char* what) {
  act.method = method;
  act.group = method == Method::int4 ? group : 0;
  act.rows = rows;
  act.Kp = Kp;
  const std::size_t total = static_cast<std::size_t>(rows) * Kp;
  if (method == Method::bf16) {
    if (act.bf16.size() < total) act.bf16.resize(total);
  } else {
    if (act.q.size() < total) act.q.resize(total);
    if (act.q_u8.size() < total) act.q_u8.resize(total);
    if (act.scale.size() < static_cast<std::size_t>(rows)) act.scale.resize(rows);
    if (method == Method::int4) {
      std::size_t g = static_cast<std::size_t>(rows) * (Kp / group);
      if (act.gsum.size() < g) act.gsum.resize(g);
    }
  }
  std::atomic<int64_t> bad_row{-1};
  auto convert_row = [&](int64_t r, int) {
    const int64_t base = r * ld;
    if (method == Method::bf16 && dtype == DType::bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(x) + base;
      uint16_t* dst = act.bf16.data() + r * Kp;
      std::copy(src, src + K, dst);
      std::fill(dst + K, dst + Kp, uint16_t{0});
      for (int k = 0; k < K; ++k)
        if ((src[k] & 0x7f80) == 0x7f80) bad_row = r;  // exponent all ones: inf or NaN
      return;
    }
    thread_local std::vector<float> widened;
    const float* row = static_cast<const float*>(x) + base;
    if (dtype == DType::bf16) {
      widened.resize(K);
      const uint16_t* src = static_cast<const uint16_t*>(x) + base;
      for (int k = 0; k < K; ++k) widened[k] = bf16_to_f32(src[k]);
      row = widened.data();
    }
    bool finite;
    if (method == Method::bf16) {
      finite = ops.to_bf16_row(row, K, Kp, act.bf16.data() + r * Kp);
    } else {
      int32_t* gsum = method == Method::int4 ? act.gsum.data() + r * (Kp / group) : nullptr;
      finite = ops.quantize_row(row, K, Kp, group, act.q.data() + r * Kp, act.q_u8.data() + r * Kp,
                                act.scale.data() + r, gsum);
    }
    if (!finite) bad_row = r;
  };
  if (pool && rows > 1)
    pool->parallel_for(rows, convert_row);
  else
    for (int64_t r = 0; r < rows; ++r) convert_row(r, 0);
  if (bad_row >= 0)
    throw std::invalid_argument(std::string(what) + " contains NaN or infinite values (row " +
                                std::to_string(bad_row.load()) + ")");
}

}  // namespace kt
