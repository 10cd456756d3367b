#include "moe/layer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include "kernels/registry.hpp"
#include "kernels/scalar.hpp"

namespace kt {

// One unit of a parallel phase: rows [r0, r1) of an expert's sorted positions and output
// columns [n0, n1), computed by providers_[provider].
struct Task {
  int expert, provider, n0, n1;
  int64_t r0, r1;
};

namespace {

// Task shapes. A gate/up task covers kGateUpCols packed columns: 6 pairs of a 16-column gate
// block and its 16-column up block (96 intermediate columns), for up to kRowChunk tokens; a
// down task kDownCols hidden columns (6 blocks of 16). Small enough to balance a few hot
// experts across threads, large enough to amortise the dispatch. Rows need no multiple: every
// kernel spreads a task's rows over its row groups, ragged ends included.
constexpr int kGateUpCols = 192;
constexpr int kDownCols = 96;
constexpr int kRowChunk = 192;
static_assert(kGateUpCols % 32 == 0, "a gate/up task holds whole gate+up block pairs: silu(gate) * up pairs them");
static_assert(kDownCols % 16 == 0, "a down task holds whole 16-column panel blocks");


// An expert's tasks: row chunks, each split into column slices of `cols` unless its
// provider computes whole experts.
// Columns [n_begin, n_end): a NUMA share's, or all of them.
void add_tasks(std::vector<Task>& tasks, int expert, int provider, bool whole, int64_t begin, int64_t end,
               int n_begin, int n_end, int cols) {
  const int step = whole ? n_end - n_begin : cols;
  for (int64_t r0 = begin; r0 < end; r0 += kRowChunk)
    for (int n0 = n_begin; n0 < n_end; n0 += step)
      tasks.push_back({expert, provider, n0, std::min(n_end, n0 + step), r0, std::min(end, r0 + kRowChunk)});
}

// `units` split over the shares in proportion to their threads: share g's [split[g], split[g + 1]).
std::vector<int> split_units(int units, const std::vector<NodeShare>& shares) {
  int64_t total = 0;
  for (const auto& share : shares) total += static_cast<int64_t>(share.cpus.size());
  std::vector<int> split{0};
  int64_t before = 0;
  for (const auto& share : shares) {
    before += static_cast<int64_t>(share.cpus.size());
    split.push_back(static_cast<int>(units * before / total));
  }
  return split;
}

// The pool's groups: each share's CPUs, or one group of `threads` unpinned threads.
std::vector<std::vector<int>> pool_groups(const std::vector<NodeShare>& shares, int threads) {
  if (shares.empty()) return {std::vector<int>(static_cast<std::size_t>(threads), -1)};
  std::vector<std::vector<int>> groups;
  for (const auto& share : shares) {
    if (share.cpus.empty()) throw std::invalid_argument("a NUMA share needs at least one CPU");
    for (int c : share.cpus)
      if (c < 0) throw std::invalid_argument("a NUMA share's CPU ids must not be negative");
    groups.push_back(share.cpus);
  }
  return groups;
}

int pool_size(const std::vector<NodeShare>& shares, int threads) {
  if (shares.empty()) return std::max(1, threads > 0 ? threads : available_cpus());
  int total = 0;
  for (const auto& share : shares) total += static_cast<int>(share.cpus.size());
  return total;
}

}  // namespace

ThreadPool& MoeLayer::pool() {
  if (getpid() != pool_pid_) {
    // The parent's: its threads do not exist here, so it is never destroyed (that would join them).
    new std::shared_ptr<ThreadPool>(std::move(pool_));
    pool_ = ThreadPool::shared(pool_groups_);
    pool_pid_ = getpid();
  }
  return *pool_;
}

std::unique_lock<std::mutex> MoeLayer::lock_calls() {
  if (getpid() != mutex_pid_) {
    (void)call_mutex_.release();  // possibly held by a parent thread that is not here
    call_mutex_ = std::make_unique<std::mutex>();
    mutex_pid_ = getpid();
  }
  return std::unique_lock<std::mutex>(*call_mutex_);
}

MoeLayer::MoeLayer(const MoeConfig& config, const std::string& backend, int threads, std::vector<NodeShare> shares)
    : config_(config),
      library_(library_backend(backend)),
      kernels_(select_backend(library_ ? library_->kernels : backend)),
      pool_threads_(pool_size(shares, threads)),
      shares_(std::move(shares)),
      pool_groups_(pool_groups(shares_, pool_threads_)),
      pool_(ThreadPool::shared(pool_groups_)),
      pool_pid_(getpid()),
      call_mutex_(std::make_unique<std::mutex>()),
      mutex_pid_(getpid()) {
  if (config.experts <= 0 || config.top_k <= 0 || config.hidden <= 0 || config.intermediate <= 0)
    throw std::invalid_argument("num_experts, top_k, hidden_size and intermediate_size must be positive");
  if (config.top_k > config.experts) throw std::invalid_argument("top_k cannot exceed num_experts");
  if (config.top_k > 64) throw std::invalid_argument("top_k above 64 is not supported");
  const GateActivation& act = config.activation;
  if (!(act.alpha > 0.f && std::isfinite(act.alpha)) || !(act.limit > 0.f) || !std::isfinite(act.up_offset))
    throw std::invalid_argument("swiglu_alpha must be positive and finite, swiglu_limit positive (or None), up_offset finite");
  if (!takes_group(config.method, config.group))
    throw std::invalid_argument("group_size must be " + group_sizes_text(config.method));
  if (!takes_group(config.down_method, config.down_group))
    throw std::invalid_argument("down's group_size must be " + group_sizes_text(config.down_method));
  inter_padded_ = static_cast<int>(round_up(config.intermediate, 16));
  if (!shares_.empty()) {  // gate/up in whole gate+up block pairs, down in blocks of hidden columns
    gate_up_split_ = split_units(inter_padded_ / 16, shares_);
    for (int& b : gate_up_split_) b *= 2;
    down_split_ = split_units(static_cast<int>(round_up(config.hidden, 16) / 16), shares_);
  }
  thread_scratch_.resize(pool_threads_);
  providers_ = make_providers(ProviderContext{config_, *kernels_, library_, pool_threads_});
}

int MoeLayer::provider_for(int64_t rows) const {
  for (std::size_t p = 0; p + 1 < providers_.size(); ++p)
    if (rows >= providers_[p]->min_rows()) return static_cast<int>(p);
  return static_cast<int>(providers_.size()) - 1;
}

template <typename Row, typename GateUpRow, typename DownRow, typename Pack>
void MoeLayer::pack_experts(GateUpRow gate_up_row, DownRow down_row, Pack pack) {
  const int E = config_.experts, H = config_.hidden, I = config_.intermediate;
  std::vector<PackedMatrix> gate_up(E), down_packed(E);
  // Every expert's values in one huge-page buffer, each expert's gate/up then down: a
  // forward streams them with few TLB misses.
  const std::size_t gate_up_bytes =
                        PackedMatrix::value_bytes(element_of(config_.method), config_.group, 2 * inter_padded_, H),
                    down_bytes = PackedMatrix::value_bytes(element_of(config_.down_method), config_.down_group, H, I);
  // With NUMA shares each expert packs into its thread's staging, then its blocks move to the shares.
  HugePageBuffer arena(shares_.empty() ? static_cast<std::size_t>(E) * (gate_up_bytes + down_bytes) : 0);
  std::vector<aligned_vector<uint8_t>> staging(shares_.empty() ? 0 : pool_threads_);
  if (shares_.empty()) {
    for (int e = 0; e < E; ++e) {
      gate_up[e].values = arena.data() + e * (gate_up_bytes + down_bytes);
      down_packed[e].values = gate_up[e].values + gate_up_bytes;
    }
  }
  // the shares' buffers, kept by the layer only once every expert packed (a failed load keeps the old)
  std::vector<bool> preferred;
  std::vector<HugePageBuffer> shares =
      shares_.empty() ? std::vector<HugePageBuffer>{}
                      : allocate_shares(gate_up_bytes / (2 * inter_padded_ / 16),  // a 16-column block's bytes
                                        down_bytes / (round_up(H, 16) / 16), preferred);
  pool().parallel_for(E, [&](int64_t e, int thread) {
    if (!shares_.empty()) {  // packing writes only what is not padding: the staging starts zeroed
      auto& stage = staging[thread];
      stage.assign(gate_up_bytes + down_bytes, 0);
      gate_up[e].values = stage.data();
      down_packed[e].values = stage.data() + gate_up_bytes;
    }
    // gate and up as one matrix, 16-column blocks alternating: one pass over x serves both
    std::vector<Row> rows(2 * static_cast<std::size_t>(inter_padded_), Row{});
    for (int n = 0; n < I; ++n) {
      rows[(n / 16) * 32 + n % 16] = gate_up_row(e, n, false);
      rows[(n / 16) * 32 + 16 + n % 16] = gate_up_row(e, n, true);
    }
    pack(gate_up[e], rows, H, false);
    std::vector<Row> down_rows(H);
    for (int n = 0; n < H; ++n) down_rows[n] = down_row(e, n);
    pack(down_packed[e], down_rows, I, true);
    if (!shares_.empty()) scatter_to_shares(shares, static_cast<int>(e), gate_up[e], down_packed[e]);
  });
  std::vector<HugePageBuffer> metadata =
      shares_.empty() ? std::vector<HugePageBuffer>{} : place_metadata(gate_up, down_packed, preferred);
  gate_up_ = std::move(gate_up);
  down_ = std::move(down_packed);
  weights_ = std::move(arena);
  share_weights_ = std::move(shares);
  share_metadata_ = std::move(metadata);
  share_preferred_ = std::move(preferred);
  for (std::size_t p = 0; p + 1 < providers_.size(); ++p) providers_[p]->attach(gate_up_, down_, pool(), *providers_.back());
  loaded_ = true;
}

void MoeLayer::load(const void* gate, const void* up, const void* down, DType dtype) {
  const int H = config_.hidden, I = config_.intermediate;
  const std::size_t elem = dtype == DType::f32 ? 4 : 2;
  auto row = [&](const void* base, int64_t index, int64_t length) {
    return static_cast<const void*>(static_cast<const char*>(base) + index * length * elem);
  };
  pack_experts<const void*>(
      [&](int64_t e, int n, bool is_up) { return row(is_up ? up : gate, e * I + n, H); },
      [&](int64_t e, int n) { return row(down, e * H + n, I); },
      [&](PackedMatrix& out, const std::vector<const void*>& rows, int K, bool is_down) {
        pack_rows(out, element_of(config_.method_of(is_down)), config_.group_of(is_down), rows, dtype, K);
      });
}

void MoeLayer::load_quantized(const QuantizedWeights& gate, const QuantizedWeights& up,
                              const QuantizedWeights& down) {
  if (element_of(config_.method) == Element::bf16 && element_of(config_.down_method) == Element::bf16)
    throw std::invalid_argument("bf16 weights are loaded with load_weights");
  const int H = config_.hidden, I = config_.intermediate;
  auto row = [&](const QuantizedWeights& w, int64_t index) {
    return QuantizedRow{static_cast<const char*>(w.values) + index * w.row_bytes,
                        static_cast<const char*>(w.scales) + index * w.row_scale_bytes,
                        w.zeros ? static_cast<const char*>(w.zeros) + index * w.row_zero_bytes : nullptr,
                        w.global_scales ? w.global_scales + index : nullptr};
  };
  pack_experts<QuantizedRow>(
      [&](int64_t e, int n, bool is_up) { return row(is_up ? up : gate, e * I + n); },
      [&](int64_t e, int n) { return row(down, e * H + n); },
      [&](PackedMatrix& out, const std::vector<QuantizedRow>& rows, int K, bool is_down) {
        const Element m = element_of(config_.method_of(is_down));
        if (m != Element::bf16) return pack_quantized_rows(out, m, config_.group_of(is_down), rows, K);
        std::vector<const void*> values(rows.size());  // a mixed layer's bf16 projection: its bits as they are
        for (std::size_t n = 0; n < rows.size(); ++n) values[n] = rows[n].values;
        pack_rows(out, m, config_.group_of(is_down), values, DType::bf16, K);
      });
}

void MoeLayer::run_tasks(const std::vector<int64_t>& ends, const std::function<void(int64_t, int)>& fn,
                         std::vector<int64_t>* counts) {
  if (shares_.empty()) pool().parallel_for(ends.back(), fn, counts);
  else pool().parallel_for_groups(ends, fn, counts);
}

std::size_t MoeLayer::packed_bytes() const {
  std::size_t total = 0;
  for (const auto* set : {&gate_up_, &down_})
    for (const auto& m : *set) total += m.value_bytes() + m.metadata_bytes();
  return total;
}

void MoeLayer::load_input_order(const int32_t* order) {
  const std::size_t size = static_cast<std::size_t>(config_.experts) * config_.hidden;
  if (order)
    input_order_.assign(order, order + size);
  else
    input_order_.clear();
}

void MoeLayer::order_inputs(const void* x, DType x_dtype, const std::vector<int64_t>& offsets,
                            const std::vector<int32_t>& token_of_pos) {
  const int H = config_.hidden;
  // x's own rows checked first, so an error names the token, not a slot
  const int64_t tokens = offsets.back() / config_.top_k;
  for (int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < H; ++j) {
      const float v = x_dtype == DType::f32 ? static_cast<const float*>(x)[t * H + j]
                                            : bf16_to_f32(static_cast<const uint16_t*>(x)[t * H + j]);
      if (!std::isfinite(v))
        throw std::invalid_argument("x contains NaN or infinite values (row " + std::to_string(t) + ")");
    }
  x_ordered_.resize(static_cast<std::size_t>(offsets.back()) * H);
  pool().parallel_for(config_.experts, [&](int64_t e, int) {
    const int32_t* order = input_order_.data() + e * H;
    for (int64_t p = offsets[e]; p < offsets[e + 1]; ++p) {
      const int64_t row = static_cast<int64_t>(token_of_pos[p]) * H;
      float* dst = x_ordered_.data() + p * H;
      if (x_dtype == DType::f32)
        for (int j = 0; j < H; ++j) dst[j] = static_cast<const float*>(x)[row + order[j]];
      else
        for (int j = 0; j < H; ++j) dst[j] = bf16_to_f32(static_cast<const uint16_t*>(x)[row + order[j]]);
    }
  });
}

std::vector<int64_t> MoeLayer::build_tasks(std::vector<Task>& tasks, const std::vector<int64_t>& offsets, int N,
                                           const std::vector<int>& split, int cols) const {
  // share g's columns of every expert, then g + 1's (one group of all columns without shares); an
  // expert whose provider takes it whole (a library's copy, not split) goes to one share in turn
  const int G = split.empty() ? 1 : static_cast<int>(split.size()) - 1;
  std::vector<int64_t> ends;
  for (int g = 0; g < G; ++g) {
    const int n0 = split.empty() ? 0 : split[g] * 16, n1 = split.empty() ? N : std::min(N, split[g + 1] * 16);
    for (int e = 0; e < config_.experts; ++e) {
      const int p = provider_for(offsets[e + 1] - offsets[e]);
      if (providers_[p]->whole_expert()) {
        if (e % G == g) add_tasks(tasks, e, p, true, offsets[e], offsets[e + 1], 0, N, cols);
      } else if (n1 > n0) {
        add_tasks(tasks, e, p, false, offsets[e], offsets[e + 1], n0, n1, cols);
      }
    }
    ends.push_back(static_cast<int64_t>(tasks.size()));
  }
  return ends;
}

void MoeLayer::run_gate_up(const std::vector<int64_t>& offsets, const int32_t* rows) {
  std::vector<Task> tasks;
  const std::vector<int64_t> ends = build_tasks(tasks, offsets, 2 * inter_padded_, gate_up_split_, kGateUpCols);
  run_tasks(ends, [&](int64_t index, int thread) {
    const Task& t = tasks[index];
    auto& scratch = thread_scratch_[thread];
    const int cols = t.n1 - t.n0, m = static_cast<int>(t.r1 - t.r0);
    if (scratch.size() < static_cast<std::size_t>(m) * cols) scratch.resize(static_cast<std::size_t>(m) * cols);
    providers_[t.provider]->gemm(ExpertGemm{&act_x_, rows + t.r0, m, t.expert, Projection::gate_up,
                                            &gate_up_[t.expert], t.n0, t.n1, scratch.data(), cols, thread});
    // silu(gate) * up for each 16-column pair, into A's rows (expert-sorted positions)
    const bool shaped = !config_.activation.plain() || !gate_bias_.empty();
    for (int i = 0; i < m; ++i) {
      float* s = scratch.data() + static_cast<int64_t>(i) * cols;
      float* a = a_buf_.data() + (t.r0 + i) * inter_padded_ + t.n0 / 2;
      for (int c = 0; c < cols; c += 32) {
        if (shaped) shape_gate_up(s + c, s + c + 16, t.expert, (t.n0 + c) / 2);
        kernels_->silu_mul(s + c, s + c + 16, a + c / 2, 16);
      }
    }
  }, &gate_up_task_counts_);
}

// Biases, then the clamp, alpha and offset of config_.activation, on 16 gate and 16 up values
// (intermediate columns n..n+15 of expert e), so that silu_mul gives the activation:
// silu(alpha * g) * (u + offset) / alpha = g * sigmoid(alpha * g) * (u + offset).
void MoeLayer::shape_gate_up(float* gate, float* up, int expert, int n) const {
  const GateActivation& act = config_.activation;
  const int I = config_.intermediate;
  const float inverse_alpha = 1.f / act.alpha;
  for (int c = 0; c < 16 && n + c < I; ++c) {
    float g = gate[c], u = up[c];
    if (!gate_bias_.empty()) {
      g += gate_bias_[static_cast<std::size_t>(expert) * I + n + c];
      u += up_bias_[static_cast<std::size_t>(expert) * I + n + c];
    }
    g = std::min(g, act.limit);
    u = std::min(std::max(u, -act.limit), act.limit);
    gate[c] = act.alpha * g;
    up[c] = act.alpha == 1.f ? u + act.up_offset : (u + act.up_offset) * inverse_alpha;
  }
}

void MoeLayer::load_biases(const float* gate, const float* up, const float* down) {
  const int E = config_.experts, H = config_.hidden, I = config_.intermediate;
  const int Hp = static_cast<int>(round_up(H, 16));
  gate_bias_.clear(), up_bias_.clear(), down_bias_.clear();
  if (gate || up) {
    gate_bias_.assign(static_cast<std::size_t>(E) * I, 0.f), up_bias_.assign(static_cast<std::size_t>(E) * I, 0.f);
    if (gate) std::copy(gate, gate + static_cast<std::size_t>(E) * I, gate_bias_.begin());
    if (up) std::copy(up, up + static_cast<std::size_t>(E) * I, up_bias_.begin());
  }
  if (down) {
    down_bias_.assign(static_cast<std::size_t>(E) * Hp, 0.f);
    for (int e = 0; e < E; ++e) std::copy(down + static_cast<std::size_t>(e) * H, down + static_cast<std::size_t>(e + 1) * H, down_bias_.begin() + static_cast<std::size_t>(e) * Hp);
  }
}

void MoeLayer::run_down(const std::vector<int64_t>& offsets) {
  std::vector<Task> tasks;
  const int Hp = static_cast<int>(round_up(config_.hidden, 16));
  const std::vector<int64_t> ends = build_tasks(tasks, offsets, Hp, down_split_, kDownCols);
  std::vector<int32_t> identity(static_cast<std::size_t>(offsets.back()));
  std::iota(identity.begin(), identity.end(), 0);
  run_tasks(ends, [&](int64_t index, int thread) {
    const Task& t = tasks[index];
    providers_[t.provider]->gemm(ExpertGemm{&act_a_, identity.data() + t.r0, static_cast<int>(t.r1 - t.r0), t.expert,
                                            Projection::down, &down_[t.expert], t.n0, t.n1,
                                            slot_out_.data() + t.r0 * Hp + t.n0, Hp, thread});
    if (!down_bias_.empty()) {  // each slot's expert output plus its bias, before the routing weight
      const float* bias = down_bias_.data() + static_cast<std::size_t>(t.expert) * Hp;
      for (int64_t r = t.r0; r < t.r1; ++r)
        for (int n = t.n0; n < t.n1; ++n) slot_out_[r * Hp + n] += bias[n];
    }
  });
}

void MoeLayer::forward(const void* x, DType x_dtype, int64_t tokens, const int64_t* ids, const float* weights, void* y,
                       DType y_dtype, bool skip_absent) {
  if (!loaded_) throw std::runtime_error("forward() before load_weights()");
  const int E = config_.experts, k = config_.top_k, H = config_.hidden, I = config_.intermediate;
  if (tokens <= 0) return;
  const int64_t slots = tokens * k;
  int64_t absent = 0;  // slots of id -1 (another process's expert under expert parallelism), with skip_absent
  for (int64_t s = 0; s < slots; ++s) {
    if (skip_absent && ids[s] == kAbsentExpert) {
      ++absent;
      continue;
    }
    if (ids[s] < 0 || ids[s] >= E)
      throw std::invalid_argument("expert id " + std::to_string(ids[s]) + " at token " + std::to_string(s / k) +
                                  " is outside [0, " + std::to_string(E) + ")");
    if (!std::isfinite(weights[s]))
      throw std::invalid_argument("weights contains NaN or infinite values (token " + std::to_string(s / k) + ")");
  }

  // Route: positions sorted by expert, so each expert's rows are contiguous; absent slots get none.
  std::vector<int64_t> offsets(E + 1, 0);
  for (int64_t s = 0; s < slots; ++s)
    if (ids[s] != kAbsentExpert) ++offsets[ids[s] + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1), pos_of_slot(slots, kAbsentExpert);
  const int64_t routed = slots - absent;
  std::vector<int32_t> token_of_pos(routed);
  for (int64_t s = 0; s < slots; ++s) {
    if (ids[s] == kAbsentExpert) continue;
    int64_t p = fill[ids[s]]++;
    pos_of_slot[s] = p;
    token_of_pos[p] = static_cast<int32_t>(s / k);
  }

  if (routed == 0) {  // every slot is another process's: this layer adds nothing
    if (y_dtype == DType::f32) std::fill(static_cast<float*>(y), static_cast<float*>(y) + tokens * H, 0.0f);
    else std::fill(static_cast<uint16_t*>(y), static_cast<uint16_t*>(y) + tokens * H, uint16_t{0});
    return;
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
  // With input orders (GPTQ act-order) each slot takes x in its expert's order: one row a slot
  std::vector<int32_t> positions;
  const int32_t* gate_up_rows = token_of_pos.data();
  if (!input_order_.empty()) {
    order_inputs(x, x_dtype, offsets, token_of_pos);
    positions.resize(static_cast<std::size_t>(routed));
    std::iota(positions.begin(), positions.end(), 0);
    gate_up_rows = positions.data();
    prepare_activations(*kernels_, act_x_, element_of(config_.method), config_.group, kp_hidden, x_ordered_.data(),
                        DType::f32, routed, H, H, &pool(), "x", config_.token_scales);
  } else {
    prepare_activations(*kernels_, act_x_, element_of(config_.method), config_.group, kp_hidden, x, x_dtype, tokens, H,
                        H, &pool(), "x", config_.token_scales);
  }
  lap("prepare_x_ms");
  a_buf_.resize(static_cast<std::size_t>(routed) * inter_padded_);
  slot_out_.resize(static_cast<std::size_t>(routed) * Hp);

  run_gate_up(offsets, gate_up_rows);
  lap("gate_up_ms");
  prepare_activations(*kernels_, act_a_, element_of(config_.down_method), config_.down_group, kp_inter, a_buf_.data(), DType::f32, routed,
                      I, inter_padded_, &pool(), "the expert intermediate activation", config_.token_scales);
  lap("prepare_a_ms");
  run_down(offsets);
  lap("down_ms");

  // y[t] = sum_j w[t, j] * out[position of (t, j)], over the token's slots routed here
  pool().parallel_for(tokens, [&](int64_t t, int thread) {
    const float* rows[64];
    float row_weights[64];
    int n = 0;
    for (int j = 0; j < k; ++j) {
      const int64_t p = pos_of_slot[t * k + j];
      if (p == kAbsentExpert) continue;
      rows[n] = slot_out_.data() + p * Hp;
      row_weights[n++] = weights[t * k + j];
    }
    if (y_dtype == DType::f32) {
      float* dst = static_cast<float*>(y) + t * H;
      if (n == 0) std::fill(dst, dst + H, 0.0f);
      else kernels_->combine(rows, row_weights, n, H, dst);
    } else {
      auto& scratch = thread_scratch_[thread];
      if (scratch.size() < static_cast<std::size_t>(H)) scratch.resize(H);
      if (n == 0) std::fill(scratch.begin(), scratch.begin() + H, 0.0f);
      else kernels_->combine(rows, row_weights, n, H, scratch.data());
      uint16_t* dst = static_cast<uint16_t*>(y) + t * H;
      for (int h = 0; h < H; ++h) dst[h] = f32_to_bf16(scratch[h]);
    }
  });
  lap("combine_ms");
}

}  // namespace kt
