#include "moe/layer.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include "kernels/registry.hpp"
#include "kernels/scalar.hpp"

namespace kt {
namespace {

// Task shapes. A gate/up task covers 64 intermediate columns (4 gate + 4 up blocks of
// 16) for up to kRowChunk tokens; a down task 64 hidden columns. Small enough to
// balance a few hot experts across threads, large enough to amortise the dispatch.
constexpr int kGateUpCols = 192;
constexpr int kDownCols = 96;
constexpr int kRowChunk = 192;  // a multiple of every kernel's row blocking (4, 6)

}  // namespace

Method parse_method(const std::string& name) {
  if (name == "bf16") return Method::bf16;
  if (name == "int8") return Method::int8;
  if (name == "int4") return Method::int4;
  throw std::invalid_argument("method must be 'bf16', 'int8' or 'int4', not '" + name + "'");
}

const char* method_name(Method m) { return m == Method::bf16 ? "bf16" : m == Method::int8 ? "int8" : "int4"; }

MoeLayer::MoeLayer(const MoeConfig& config, const std::string& backend, int threads)
    : config_(config), kernels_(select_backend(backend)), pool_(threads > 0 ? threads : available_cpus()) {
  if (config.experts <= 0 || config.top_k <= 0 || config.hidden <= 0 || config.intermediate <= 0)
    throw std::invalid_argument("num_experts, top_k, hidden_size and intermediate_size must be positive");
  if (config.top_k > config.experts) throw std::invalid_argument("top_k cannot exceed num_experts");
  if (config.top_k > 64) throw std::invalid_argument("top_k above 64 is not supported");
  if (config.method == Method::int4 && config.group != 32 && config.group != 64 && config.group != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  inter_padded_ = static_cast<int>(round_up(config.intermediate, 16));
  thread_scratch_.resize(pool_.size());
}

void MoeLayer::load(const void* gate, const void* up, const void* down, DType dtype) {
  const int E = config_.experts, H = config_.hidden, I = config_.intermediate;
  const std::size_t elem = dtype == DType::f32 ? 4 : 2;
  auto row = [&](const void* base, int64_t index, int64_t length) {
    return static_cast<const void*>(static_cast<const char*>(base) + index * length * elem);
  };
  std::vector<PackedMatrix> gate_up(E), down_packed(E);
  pool_.parallel_for(E, [&](int64_t e, int) {
    // gate and up as one matrix, 16-column blocks alternating: one pass over x serves both
    std::vector<const void*> rows(2 * static_cast<std::size_t>(inter_padded_), nullptr);
    for (int n = 0; n < inter_padded_; ++n) {
      if (n >= I) continue;
      rows[(n / 16) * 32 + n % 16] = row(gate, e * I + n, H);
      rows[(n / 16) * 32 + 16 + n % 16] = row(up, e * I + n, H);
    }
    pack_rows(gate_up[e], config_.method, config_.group, rows, dtype, H);
    std::vector<const void*> down_rows(H);
    for (int n = 0; n < H; ++n) down_rows[n] = row(down, e * H + n, I);
    pack_rows(down_packed[e], config_.method, config_.group, down_rows, dtype, I);
  });
  gate_up_ = std::move(gate_up);
  down_ = std::move(down_packed);
  loaded_ = true;
}

std::size_t MoeLayer::packed_bytes() const {
  std::size_t total = 0;
  for (const auto* set : {&gate_up_, &down_})
    for (const auto& m : *set) total += m.data.size() + m.scale.size() * 4 + m.colsum.size() * 4;
  return total;
}

void MoeLayer::run_gate_up(const std::vector<int64_t>& offsets, const std::vector<int32_t>& token_of_pos) {
  struct Task {
    int expert, n0, n1;
    int64_t r0, r1;
  };
  std::vector<Task> tasks;
  const int N = 2 * inter_padded_;
  for (int e = 0; e < config_.experts; ++e)
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += kRowChunk)
      for (int n0 = 0; n0 < N; n0 += kGateUpCols)
        tasks.push_back({e, n0, std::min(N, n0 + kGateUpCols), r0, std::min(offsets[e + 1], r0 + kRowChunk)});
  pool_.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t index, int thread) {
    const Task& t = tasks[index];
    auto& scratch = thread_scratch_[thread];
    const int cols = t.n1 - t.n0, m = static_cast<int>(t.r1 - t.r0);
    if (scratch.size() < static_cast<std::size_t>(m) * cols) scratch.resize(static_cast<std::size_t>(m) * cols);
    GemmArgs args{&act_x_, token_of_pos.data() + t.r0, m, &gate_up_[t.expert], t.n0, t.n1, scratch.data(), cols};
    kernels_->gemm(args);
    // silu(gate) * up for each 16-column pair, into A's rows (expert-sorted positions)
    for (int i = 0; i < m; ++i) {
      const float* s = scratch.data() + static_cast<int64_t>(i) * cols;
      float* a = a_buf_.data() + (t.r0 + i) * inter_padded_ + t.n0 / 2;
      for (int c = 0; c < cols; c += 32) kernels_->silu_mul(s + c, s + c + 16, a + c / 2, 16);
    }
  });
}

void MoeLayer::run_down(const std::vector<int64_t>& offsets) {
  struct Task {
    int expert, n0, n1;
    int64_t r0, r1;
  };
  std::vector<Task> tasks;
  const int Hp = static_cast<int>(round_up(config_.hidden, 16));
  for (int e = 0; e < config_.experts; ++e)
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += kRowChunk)
      for (int n0 = 0; n0 < Hp; n0 += kDownCols)
        tasks.push_back({e, n0, std::min(Hp, n0 + kDownCols), r0, std::min(offsets[e + 1], r0 + kRowChunk)});
  std::vector<int32_t> identity(static_cast<std::size_t>(offsets.back()));
  std::iota(identity.begin(), identity.end(), 0);
  pool_.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t index, int) {
    const Task& t = tasks[index];
    GemmArgs args{&act_a_, identity.data() + t.r0, static_cast<int>(t.r1 - t.r0), &down_[t.expert], t.n0, t.n1,
                  slot_out_.data() + t.r0 * Hp + t.n0, Hp};
    kernels_->gemm(args);
  });
}

void MoeLayer::forward(const void* x, DType x_dtype, int64_t tokens, const int64_t* ids, const float* weights, void* y,
                       DType y_dtype) {
  if (!loaded_) throw std::runtime_error("forward() before load_weights()");
  const int E = config_.experts, k = config_.top_k, H = config_.hidden, I = config_.intermediate;
  if (tokens <= 0) return;
  const int64_t slots = tokens * k;
  for (int64_t s = 0; s < slots; ++s) {
    if (ids[s] < 0 || ids[s] >= E)
      throw std::invalid_argument("expert id " + std::to_string(ids[s]) + " at token " + std::to_string(s / k) +
                                  " is outside [0, " + std::to_string(E) + ")");
    if (!std::isfinite(weights[s]))
      throw std::invalid_argument("routing weight of token " + std::to_string(s / k) + " is NaN or infinite");
  }

  // Route: positions sorted by expert, so each expert's rows are contiguous.
  std::vector<int64_t> offsets(E + 1, 0);
  for (int64_t s = 0; s < slots; ++s) ++offsets[ids[s] + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1), pos_of_slot(slots);
  std::vector<int32_t> token_of_pos(slots);
  for (int64_t s = 0; s < slots; ++s) {
    int64_t p = fill[ids[s]]++;
    pos_of_slot[s] = p;
    token_of_pos[p] = static_cast<int32_t>(s / k);
  }

  using clock = std::chrono::steady_clock;
  auto mark = clock::now();
  auto lap = [&](const char* phase) {
    auto now = clock::now();
    profile_[phase] = std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
  };
  const int Hp = static_cast<int>(round_up(H, 16));
  const int kp_hidden = gate_up_[0].Kp, kp_inter = down_[0].Kp;
  lap("route_ms");
  prepare_activations(*kernels_, act_x_, config_.method, config_.group, kp_hidden, x, x_dtype, tokens, H, H, &pool_,
                      "x");
  lap("prepare_x_ms");
  a_buf_.resize(static_cast<std::size_t>(slots) * inter_padded_);
  slot_out_.resize(static_cast<std::size_t>(slots) * Hp);

  run_gate_up(offsets, token_of_pos);
  gate_up_task_counts_ = pool_.last_task_counts();
  lap("gate_up_ms");
  prepare_activations(*kernels_, act_a_, config_.method, config_.group, kp_inter, a_buf_.data(), DType::f32, slots,
                      I, inter_padded_, &pool_, "the expert intermediate activation");
  lap("prepare_a_ms");
  run_down(offsets);
  lap("down_ms");

  // y[t] = sum_j w[t, j] * out[position of (t, j)]
  pool_.parallel_for(tokens, [&](int64_t t, int thread) {
    const float* rows[64];
    for (int j = 0; j < k; ++j) rows[j] = slot_out_.data() + pos_of_slot[t * k + j] * Hp;
    if (y_dtype == DType::f32) {
      kernels_->combine(rows, weights + t * k, k, H, static_cast<float*>(y) + t * H);
    } else {
      auto& scratch = thread_scratch_[thread];
      if (scratch.size() < static_cast<std::size_t>(H)) scratch.resize(H);
      kernels_->combine(rows, weights + t * k, k, H, scratch.data());
      uint16_t* dst = static_cast<uint16_t*>(y) + t * H;
      for (int h = 0; h < H; ++h) dst[h] = f32_to_bf16(scratch[h]);
    }
  });
  lap("combine_ms");
}

}  // namespace kt
