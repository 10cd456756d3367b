// Activation rows converted for a method's kernels (kernels/pack.hpp's prepare_activations): bf16,
// fp32, or int8 with a scale per activation block and per-group sums.
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/pack.hpp"
#include "kernels/scalar.hpp"

namespace kt {

void prepare_activations(const KernelTable& ops, Activations& act, Element method, int group, int Kp, const void* x,
                         DType dtype, int64_t rows, int K, int64_t ld, ThreadPool* pool, const char* what,
                         bool token_scales) {
  static std::atomic<uint64_t> versions{0};
  act.version = ++versions;
  act.element = method;
  act.group = grouped(method) ? group : 0;
  act.rows = rows;
  act.Kp = Kp;
  const std::size_t total = static_cast<std::size_t>(rows) * Kp;
  const bool widen = method == Element::bf16 && ops.reads_f32_activations && ops.reads_f32_activations();
  if (method == Element::bf16) {
    if (act.bf16.size() < total) act.bf16.resize(total);
    act.f32_ld = Kp + 16;
    if (widen && act.f32.size() < static_cast<std::size_t>(rows * act.f32_ld)) act.f32.resize(rows * act.f32_ld);
  } else if (fp8_codes(method) || floats(method)) {
    act.f32_ld = Kp + 16;
    if (act.f32.size() < static_cast<std::size_t>(rows * act.f32_ld)) act.f32.resize(rows * act.f32_ld);
    if (fp8_codes(method) && act.bf16.size() < total) act.bf16.resize(total);
  } else {
    if (act.q.size() < total) act.q.resize(total);
    if (act.q_u8.size() < total) act.q_u8.resize(total);
    act.block = activation_block(method, group, Kp), act.blocks = Kp / act.block, act.token_scales = token_scales;
    act.scale.resize(std::max(act.scale.size(), static_cast<std::size_t>(rows) * act.blocks));
    if (group_sums(method)) {
      std::size_t g = static_cast<std::size_t>(rows) * (Kp / group);
      if (act.gsum.size() < g) act.gsum.resize(g);
    }
  }
  std::atomic<int64_t> bad_row{-1};
  auto widen_row = [&](int64_t r) {
    const uint16_t* src = act.bf16.data() + r * Kp;
    float* dst = act.f32.data() + r * act.f32_ld;
    for (int k = 0; k < Kp; ++k) dst[k] = bf16_to_f32(src[k]);
  };
  auto convert_row = [&](int64_t r, int) {
    const int64_t base = r * ld;
    if (method == Element::bf16 && dtype == DType::bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(x) + base;
      uint16_t* dst = act.bf16.data() + r * Kp;
      std::copy(src, src + K, dst);
      std::fill(dst + K, dst + Kp, uint16_t{0});
      for (int k = 0; k < K; ++k)
        if ((src[k] & 0x7f80) == 0x7f80) bad_row = r;  // exponent all ones: inf or NaN
      if (widen) widen_row(r);
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
    bool finite = true;
    if (fp8_codes(method) || floats(method)) {
      // exact fp32 (fp8: scaled by a power of two, kFp8ActivationScale) for the fp32 kernels;
      // fp8's bf16 too, for the bf16 dot products of prefill
      const float factor = fp8_codes(method) ? kFp8ActivationScale : 1.f;
      float* dst = act.f32.data() + r * act.f32_ld;
      for (int k = 0; k < K; ++k) {
        dst[k] = row[k] * factor;
        finite &= std::fabs(dst[k]) <= std::numeric_limits<float>::max();
      }
      std::fill(dst + K, dst + Kp, 0.f);
      if (fp8_codes(method)) finite &= ops.to_bf16_row(row, K, Kp, act.bf16.data() + r * Kp);
    } else if (method == Element::bf16) {
      finite = ops.to_bf16_row(row, K, Kp, act.bf16.data() + r * Kp);
      if (widen) widen_row(r);
    } else {
      int32_t* gsum = group_sums(method) ? act.gsum.data() + r * (Kp / group) : nullptr;
      float* scales = act.scale.data() + r * act.blocks;
      finite = ops.quantize_row(row, K, Kp, group, token_scales ? Kp : act.block, act.q.data() + r * Kp,
                                act.q_u8.data() + r * Kp, scales, gsum);
      if (token_scales) std::fill(scales + 1, scales + act.blocks, scales[0]);
    }
    if (!finite) bad_row = r;
  };
  if (pool && rows > 1)
    pool->parallel_for(rows, convert_row);
  else
    for (int64_t r = 0; r < rows; ++r) convert_row(r, 0);
  if (bad_row >= 0)
    throw std::invalid_argument(std::string(what) + " contains NaN or infinite values" +
                                (fp8_codes(method) ? " (or of magnitude 2^64 or more)" : "") + " (row " +
                                std::to_string(bad_row.load()) + ")");
}

}  // namespace kt
