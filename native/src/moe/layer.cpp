#include "moe/layer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <chrono>
#include <numeric>
#include <stdexcept>

#include "kernels/registry.hpp"
#include "kernels/scalar.hpp"

namespace kt {
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

// One unit of a parallel phase: rows [r0, r1) of an expert's sorted positions and output
// columns [n0, n1); n0 < 0 means every column at once, through AOCL.
struct Task {
  int expert, n0, n1;
  int64_t r0, r1;
};

}  // namespace

Method parse_method(const std::string& name) {
  if (name == "bf16") return Method::bf16;
  if (name == "int8") return Method::int8;
  if (name == "int4") return Method::int4;
  throw std::invalid_argument("method must be 'bf16', 'int8' or 'int4', not '" + name + "'");
}

const char* method_name(Method m) { return m == Method::bf16 ? "bf16" : m == Method::int8 ? "int8" : "int4"; }

namespace {

// The BLIS library of a library backend (amd-blis): KTFORGE_BLIS_LIBRARY, else the one its
// build linked (registered by the module when it is imported).
std::string blis_library_path(const LibraryBackend& lib) {
  if (const char* env = std::getenv("KTFORGE_BLIS_LIBRARY"); env && *env) return env;
  if (std::string linked = Aocl::linked_library(); !linked.empty()) return linked;
  throw std::invalid_argument(std::string("backend '") + lib.name +
                              "' needs AOCL-BLAS with the aocl_gemm add-on: build with `kt build --backend " + lib.name +
                              "`, or set KTFORGE_BLIS_LIBRARY to the library (`kt doctor --check blis.addon` shows "
                              "which works)");
}

// Whether a library backend hands this method to its library (the backend table says).
bool library_computes(const LibraryBackend* lib, Method m) {
  return lib && (m == Method::int8 ? lib->int8 : m == Method::bf16 ? lib->bf16 : lib->int4);
}

}  // namespace

ThreadPool& MoeLayer::pool() {
  if (getpid() != pool_pid_) {
    (void)pool_.release();  // the parent's: its threads do not exist here, so never joined
    pool_ = std::make_unique<ThreadPool>(pool_threads_);
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

MoeLayer::MoeLayer(const MoeConfig& config, const std::string& backend, int threads)
    : config_(config),
      library_(library_backend(backend)),
      kernels_(select_backend(library_ ? library_->kernels : backend)),
      pool_threads_(std::max(1, threads > 0 ? threads : available_cpus())),
      pool_(std::make_unique<ThreadPool>(pool_threads_)),
      pool_pid_(getpid()),
      call_mutex_(std::make_unique<std::mutex>()),
      mutex_pid_(getpid()) {
  if (library_computes(library_, config.method)) aocl_ = &Aocl::load(blis_library_path(*library_));
  if (aocl_ && config.method == Method::bf16 && !aocl_->has_bf16())
    throw std::invalid_argument(aocl_->path() + " lacks aocl_gemm_bf16bf16f32of32");
  if (aocl_) aocl_->verify(config.method);  // never a fast wrong answer (calibration only times)
  if (config.experts <= 0 || config.top_k <= 0 || config.hidden <= 0 || config.intermediate <= 0)
    throw std::invalid_argument("num_experts, top_k, hidden_size and intermediate_size must be positive");
  if (config.top_k > config.experts) throw std::invalid_argument("top_k cannot exceed num_experts");
  if (config.top_k > 64) throw std::invalid_argument("top_k above 64 is not supported");
  if (config.method == Method::int4 && config.group != 32 && config.group != 64 && config.group != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  inter_padded_ = static_cast<int>(round_up(config.intermediate, 16));
  thread_scratch_.resize(pool_threads_);
  thread_a_.resize(pool_threads_);
  thread_acc_.resize(pool_threads_);
}

template <typename Row, typename GateUpRow, typename DownRow, typename Pack>
void MoeLayer::pack_experts(GateUpRow gate_up_row, DownRow down_row, Pack pack) {
  const int E = config_.experts, H = config_.hidden, I = config_.intermediate;
  std::vector<PackedMatrix> gate_up(E), down_packed(E);
  // Every expert's values in one huge-page buffer, each expert's gate/up then down: a
  // forward streams them with few TLB misses.
  const Method m = config_.method;
  const std::size_t gate_up_bytes = PackedMatrix::value_bytes(m, config_.group, 2 * inter_padded_, H),
                    down_bytes = PackedMatrix::value_bytes(m, config_.group, H, I);
  HugePageBuffer arena(static_cast<std::size_t>(E) * (gate_up_bytes + down_bytes));
  for (int e = 0; e < E; ++e) {
    gate_up[e].values = arena.data() + e * (gate_up_bytes + down_bytes);
    down_packed[e].values = gate_up[e].values + gate_up_bytes;
  }
  pool().parallel_for(E, [&](int64_t e, int) {
    // gate and up as one matrix, 16-column blocks alternating: one pass over x serves both
    std::vector<Row> rows(2 * static_cast<std::size_t>(inter_padded_), Row{});
    for (int n = 0; n < I; ++n) {
      rows[(n / 16) * 32 + n % 16] = gate_up_row(e, n, false);
      rows[(n / 16) * 32 + 16 + n % 16] = gate_up_row(e, n, true);
    }
    pack(gate_up[e], rows, H);
    std::vector<Row> down_rows(H);
    for (int n = 0; n < H; ++n) down_rows[n] = down_row(e, n);
    pack(down_packed[e], down_rows, I);
  });
  gate_up_ = std::move(gate_up);
  down_ = std::move(down_packed);
  weights_ = std::move(arena);
  if (aocl_) {
    aocl_gate_up_.assign(E, {});
    aocl_down_.assign(E, {});
    pool().parallel_for(E, [&](int64_t e, int) {
      aocl_gate_up_[e] = aocl_->reorder(gate_up_[e]);
      aocl_down_[e] = aocl_->reorder(down_[e]);
    });
    calibrate_aocl();
  }
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
      [&](PackedMatrix& out, const std::vector<const void*>& rows, int K) {
        pack_rows(out, config_.method, config_.group, rows, dtype, K);
      });
}

void MoeLayer::load_quantized(const QuantizedWeights& gate, const QuantizedWeights& up,
                              const QuantizedWeights& down) {
  if (config_.method == Method::bf16) throw std::invalid_argument("bf16 weights are loaded with load_weights");
  const int H = config_.hidden, I = config_.intermediate;
  auto row = [&](const QuantizedWeights& w, int64_t index) {
    return QuantizedRow{static_cast<const char*>(w.values) + index * w.row_bytes, w.scales + index * w.row_scales};
  };
  pack_experts<QuantizedRow>(
      [&](int64_t e, int n, bool is_up) { return row(is_up ? up : gate, e * I + n); },
      [&](int64_t e, int n) { return row(down, e * H + n); },
      [&](PackedMatrix& out, const std::vector<QuantizedRow>& rows, int K) {
        pack_quantized_rows(out, config_.method, config_.group, rows, K);
      });
}

void MoeLayer::calibrate_aocl() {
  // Time AOCL against this layer's kernels on expert 0's gate/up, single-threaded, for
  // growing token counts; AOCL takes over from the first count where it is faster.
  using clock = std::chrono::steady_clock;
  const int H = config_.hidden, N = gate_up_[0].Np;
  std::vector<float> x(static_cast<std::size_t>(256) * H);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f;
  aocl_min_rows_ = 1 << 30;
  if (const char* forced = std::getenv("KTFORGE_AOCL_MIN_TOKENS"); forced && *forced) {
    char* end = nullptr;
    const long value = std::strtol(forced, &end, 10);
    if (*end != '\0' || value < 1 || value > (1 << 30))
      throw std::invalid_argument(std::string("KTFORGE_AOCL_MIN_TOKENS must be a positive token count, got '") +
                                  forced + "'");
    aocl_min_rows_ = static_cast<int>(value);  // the user (or a test) knows better
    return;
  }
  // AOCL must win clearly (by 10%) at two sizes in a row: the machine is noisy, and a
  // wrong switch costs more than a missed one.
  bool won_previous = false;
  for (int m : {1, 4, 16, 32, 64, 128, 256}) {
    Activations act;
    prepare_activations(*kernels_, act, config_.method, config_.group, gate_up_[0].Kp, x.data(), DType::f32, m, H, H,
                        nullptr, "calibration");
    std::vector<int32_t> rows(m);
    std::iota(rows.begin(), rows.end(), 0);
    aligned_vector<float> out(static_cast<std::size_t>(m) * N);
    aligned_vector<int32_t> acc(static_cast<std::size_t>(m) * N);
    auto best = [&](auto&& fn) {
      double t = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        auto start = clock::now();
        fn();
        t = std::min(t, std::chrono::duration<double>(clock::now() - start).count());
      }
      return t;
    };
    GemmArgs args{&act, rows.data(), m, &gate_up_[0], 0, N, out.data(), N};
    double ours = best([&] { kernels_->gemm(args); });
    double theirs = best([&] {
      if (config_.method == Method::int8)
        aocl_->gemm_s8(m, N, gate_up_[0].Kp, act.q.data(), act.Kp, aocl_gate_up_[0].data(), acc.data());
      else
        aocl_->gemm_bf16(m, N, gate_up_[0].Kp, act.bf16.data(), act.Kp, aocl_gate_up_[0].data(), out.data());
    });
    const bool wins = theirs * 1.1 < ours;
    if (wins && won_previous) break;
    if (wins && !won_previous) aocl_min_rows_ = m;
    if (!wins) aocl_min_rows_ = 1 << 30;
    won_previous = wins;
  }
  if (!won_previous) aocl_min_rows_ = 1 << 30;
}

// AOCL results -> floats with the int8 scales (AOCL's s8s8 GEMM takes the signed
// activations as they are: no offset to remove).
static void dequantize(const int32_t* acc, int m, int n, const float* x_scale, const float* w_scale, float* out,
                       int64_t ld) {
  for (int i = 0; i < m; ++i)
    for (int c = 0; c < n; ++c) out[i * ld + c] = static_cast<float>(acc[static_cast<int64_t>(i) * n + c]) * x_scale[i] * w_scale[c];
}

void MoeLayer::aocl_gate_up(int expert, int64_t r0, int64_t r1, const int32_t* rows, int thread) {
  const PackedMatrix& w = gate_up_[expert];
  const int m = static_cast<int>(r1 - r0), N = w.Np, Kp = w.Kp;
  auto& scratch = thread_scratch_[thread];
  scratch.resize(static_cast<std::size_t>(m) * N);
  const std::size_t elem = config_.method == Method::int8 ? 1 : 2;
  auto& a = thread_a_[thread];
  a.resize(static_cast<std::size_t>(m) * Kp * elem);
  for (int i = 0; i < m; ++i) {  // gather the expert's token rows into one matrix
    const int64_t row = rows[r0 + i];
    const uint8_t* src = config_.method == Method::int8 ? reinterpret_cast<const uint8_t*>(act_x_.q.data() + row * Kp)
                                                        : reinterpret_cast<const uint8_t*>(act_x_.bf16.data() + row * Kp);
    std::copy(src, src + Kp * elem, a.data() + static_cast<std::size_t>(i) * Kp * elem);
  }
  if (config_.method == Method::int8) {
    auto& acc = thread_acc_[thread];
    acc.resize(static_cast<std::size_t>(m) * N);
    aocl_->gemm_s8(m, N, Kp, reinterpret_cast<const int8_t*>(a.data()), Kp, aocl_gate_up_[expert].data(), acc.data());
    std::vector<float> xs(m);
    for (int i = 0; i < m; ++i) xs[i] = act_x_.scale[rows[r0 + i]];
    dequantize(acc.data(), m, N, xs.data(), w.scale.data(), scratch.data(), N);
  } else {
    aocl_->gemm_bf16(m, N, Kp, reinterpret_cast<const uint16_t*>(a.data()), Kp, aocl_gate_up_[expert].data(),
                     scratch.data());
  }
  for (int i = 0; i < m; ++i) {
    const float* s = scratch.data() + static_cast<int64_t>(i) * N;
    float* out = a_buf_.data() + (r0 + i) * inter_padded_;
    for (int c = 0; c < N; c += 32) kernels_->silu_mul(s + c, s + c + 16, out + c / 2, 16);
  }
}

void MoeLayer::aocl_down(int expert, int64_t r0, int64_t r1, int thread) {
  const PackedMatrix& w = down_[expert];
  const int m = static_cast<int>(r1 - r0), N = w.Np, Kp = w.Kp;
  float* out = slot_out_.data() + r0 * N;  // positions are contiguous per expert
  if (config_.method == Method::int8) {
    auto& acc = thread_acc_[thread];
    acc.resize(static_cast<std::size_t>(m) * N);
    aocl_->gemm_s8(m, N, Kp, act_a_.q.data() + r0 * Kp, Kp, aocl_down_[expert].data(), acc.data());
    dequantize(acc.data(), m, N, act_a_.scale.data() + r0, w.scale.data(), out, N);
  } else {
    aocl_->gemm_bf16(m, N, Kp, act_a_.bf16.data() + r0 * Kp, Kp, aocl_down_[expert].data(), out);
  }
}

std::size_t MoeLayer::packed_bytes() const {
  std::size_t total = 0;
  for (const auto* set : {&gate_up_, &down_})
    for (const auto& m : *set) total += m.value_bytes() + m.scale.size() * 4 + m.colsum.size() * 4;
  return total;
}

void MoeLayer::run_gate_up(const std::vector<int64_t>& offsets, const std::vector<int32_t>& token_of_pos) {
  std::vector<Task> tasks;
  const int N = 2 * inter_padded_;
  for (int e = 0; e < config_.experts; ++e) {
    const bool whole = aocl_ && offsets[e + 1] - offsets[e] >= aocl_min_rows_;  // AOCL: all columns at once
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += kRowChunk)
      for (int n0 = 0; n0 < N; n0 += whole ? N : kGateUpCols)
        tasks.push_back({e, whole ? -1 : n0, std::min(N, n0 + kGateUpCols), r0, std::min(offsets[e + 1], r0 + kRowChunk)});
  }
  pool().parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t index, int thread) {
    const Task& t = tasks[index];
    if (t.n0 < 0) return aocl_gate_up(t.expert, t.r0, t.r1, token_of_pos.data(), thread);
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
  std::vector<Task> tasks;
  const int Hp = static_cast<int>(round_up(config_.hidden, 16));
  for (int e = 0; e < config_.experts; ++e) {
    const bool whole = aocl_ && offsets[e + 1] - offsets[e] >= aocl_min_rows_;
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += kRowChunk)
      for (int n0 = 0; n0 < Hp; n0 += whole ? Hp : kDownCols)
        tasks.push_back({e, whole ? -1 : n0, std::min(Hp, n0 + kDownCols), r0, std::min(offsets[e + 1], r0 + kRowChunk)});
  }
  std::vector<int32_t> identity(static_cast<std::size_t>(offsets.back()));
  std::iota(identity.begin(), identity.end(), 0);
  pool().parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t index, int thread) {
    const Task& t = tasks[index];
    if (t.n0 < 0) return aocl_down(t.expert, t.r0, t.r1, thread);
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
      throw std::invalid_argument("weights contains NaN or infinite values (token " + std::to_string(s / k) + ")");
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
  prepare_activations(*kernels_, act_x_, config_.method, config_.group, kp_hidden, x, x_dtype, tokens, H, H, &pool(),
                      "x");
  lap("prepare_x_ms");
  a_buf_.resize(static_cast<std::size_t>(slots) * inter_padded_);
  slot_out_.resize(static_cast<std::size_t>(slots) * Hp);

  run_gate_up(offsets, token_of_pos);
  gate_up_task_counts_ = pool().last_task_counts();
  lap("gate_up_ms");
  prepare_activations(*kernels_, act_a_, config_.method, config_.group, kp_inter, a_buf_.data(), DType::f32, slots,
                      I, inter_padded_, &pool(), "the expert intermediate activation");
  lap("prepare_a_ms");
  run_down(offsets);
  lap("down_ms");

  // y[t] = sum_j w[t, j] * out[position of (t, j)]
  pool().parallel_for(tokens, [&](int64_t t, int thread) {
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
