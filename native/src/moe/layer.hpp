// One MoE layer's routed experts on the CPU:
//   y[t] = sum_j w[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]),  e = ids[t, j]
// with Hugging Face layouts gate, up: [E, I, H], down: [E, H, I].
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/pack.hpp"
#include "kernels/registry.hpp"
#include "kernels/types.hpp"
#include "moe/provider.hpp"
#include "runtime/huge_pages.hpp"
#include "runtime/thread_pool.hpp"

namespace kt {

inline constexpr int64_t kAbsentExpert = -1;  // an expert held by another process

class MoeLayer {
 public:
  MoeLayer(const MoeConfig& config, const std::string& backend, int threads);

  // gate, up: [E, I, H]; down: [E, H, I]; row-major, dtype f32 or bf16.
  void load(const void* gate, const void* up, const void* down, DType dtype);
  // The same from weights already quantized for config().method, in the portable layout of
  // pack_quantized_rows: row r of a projection starts at values + r * row_bytes, its scales
  // (int8: a float; int8g, int4: bf16 bits) at scales + r * row_scale_bytes.
  struct QuantizedWeights {
    const void* values;
    int64_t row_bytes;
    const void* scales;
    int64_t row_scale_bytes;
    const void* zeros = nullptr;  // int4z's zero points, uint8, a row's groups row_zero_bytes apart
    int64_t row_zero_bytes = 0;
  };
  void load_quantized(const QuantizedWeights& gate, const QuantizedWeights& up, const QuantizedWeights& down);
  bool loaded() const { return loaded_; }
  // Per-expert biases, float32: gate, up [E, I], down [E, H]; nullptr for none (zero). Replaces
  // the ones loaded before; kept in float32 whatever the weights' format.
  void load_biases(const float* gate, const float* up, const float* down);
  // Each expert's gate/up input order, int32 [E, H] (a permutation of the input a row): expert e's
  // input j is x[order[e * H + j]] (GPTQ act-order). nullptr: x's own order.
  void load_input_order(const int32_t* order);

  // x: [T, H]; ids: [T, k] in [0, E); weights: [T, k]; y: [T, H].
  // skip_absent: a slot whose id is kAbsentExpert (-1: another process's expert, as vLLM's expert_map
  // marks it) adds nothing; otherwise every id must lie in [0, experts).
  void forward(const void* x, DType x_dtype, int64_t tokens, const int64_t* ids, const float* weights, void* y,
               DType y_dtype, bool skip_absent = false);

  // One call at a time per layer: forward, load, load_quantized and reads of what they
  // change take this lock (with the GIL released while they wait), so Python threads may
  // share a layer. In a forked child the lock is new: the parent's may be held by a thread
  // that does not exist there.
  std::unique_lock<std::mutex> lock_calls();

  const MoeConfig& config() const { return config_; }
  void set_token_scales(bool on) { config_.token_scales = on; }
  const KernelTable& kernels() const { return *kernels_; }
  // A library backend (amd-blis), or null: the backend table's entry this layer was made with.
  const LibraryBackend* library() const { return library_; }
  // Who computes the expert GEMMs, preferred first (the format table's providers that apply
  // here); a provider's min_rows() is known once the weights are loaded.
  const std::vector<std::unique_ptr<Provider>>& providers() const { return providers_; }
  int threads() const { return pool_threads_; }
  // Layers of this process that share this layer's thread pool (this one included).
  long pool_layers() const { return pool_.use_count(); }
  std::size_t packed_bytes() const;
  // Whether Linux took the advice to back the packed weights with transparent huge pages.
  bool weights_huge_pages() const { return weights_.advised(); }
  // Tasks each thread ran in the gate/up phase of the last forward() (balance under skew).
  std::vector<int64_t> gate_up_task_counts() const { return gate_up_task_counts_; }
  // Milliseconds per phase of the last forward().
  const std::map<std::string, double>& last_profile() const { return profile_; }

 private:
  template <typename Row, typename GateUpRow, typename DownRow, typename Pack>
  void pack_experts(GateUpRow gate_up_row, DownRow down_row, Pack pack);
  void run_gate_up(const std::vector<int64_t>& offsets, const int32_t* rows);
  // x's rows in their experts' input orders, one a slot (expert-sorted positions), widened to float32
  void order_inputs(const void* x, DType x_dtype, const std::vector<int64_t>& offsets,
                    const std::vector<int32_t>& token_of_pos);
  void run_down(const std::vector<int64_t>& offsets);
  void shape_gate_up(float* gate, float* up, int expert, int n) const;
  // The index of the provider that takes an expert with `rows` tokens.
  int provider_for(int64_t rows) const;
  // The pool this layer shares with the other layers of its thread count, in this process: a
  // forked child has none of the parent's threads, so it gets its own on first use (the
  // parent's pool object is left alone: its threads are not here).
  ThreadPool& pool();

  MoeConfig config_;
  const LibraryBackend* library_;
  const KernelTable* kernels_;
  int pool_threads_;
  std::shared_ptr<ThreadPool> pool_;  // shared with the other layers of this thread count
  pid_t pool_pid_;
  std::unique_ptr<std::mutex> call_mutex_;
  pid_t mutex_pid_;
  int inter_padded_;  // I rounded up to 16
  std::vector<PackedMatrix> gate_up_, down_;
  HugePageBuffer weights_;  // the values of gate_up_ and down_
  std::vector<std::unique_ptr<Provider>> providers_;
  bool loaded_ = false;
  // load_biases': [E][I] gate and up, [E][Hp] down (zero-padded), or empty
  aligned_vector<float> gate_bias_, up_bias_, down_bias_;
  std::vector<int32_t> input_order_;  // load_input_order's [E][H], or empty
  // forward() scratch, kept between calls
  Activations act_x_, act_a_;
  aligned_vector<float> a_buf_, slot_out_;
  aligned_vector<float> x_ordered_;  // with an input order: each slot's x in its expert's order
  std::vector<aligned_vector<float>> thread_scratch_;
  std::vector<int64_t> gate_up_task_counts_;
  std::map<std::string, double> profile_;
};

}  // namespace kt
