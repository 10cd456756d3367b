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
#include <functional>
#include <vector>

#include "kernels/pack.hpp"
#include "kernels/registry.hpp"
#include "kernels/types.hpp"
#include "moe/provider.hpp"
#include "runtime/huge_pages.hpp"
#include "runtime/thread_pool.hpp"

namespace kt {

inline constexpr int64_t kAbsentExpert = -1;  // an expert held by another process

// A NUMA node's share of a layer (MoE(numa=...)): its CPUs run the tasks of its columns of
// every expert, whose packed blocks lie in its node's memory.
struct Task;  // a unit of a parallel phase (layer.cpp)

struct NodeShare {
  std::vector<int> cpus;  // one pool thread each, pinned to these CPUs
  int node = -1;          // the memory node of its blocks (-1: wherever first touch puts them)
};

// What a share holds and where it went, for MoE.info.
struct ShareFacts {
  int node, threads;
  int gate_up_columns, down_columns;  // of each expert: intermediate columns, hidden columns
  std::size_t bytes;
  bool preferred;                     // mbind took the node
  int policy;                         // the kernel's policy mode at the share's memory
  int64_t pages_sampled, pages_on_node;
};

class MoeLayer {
 public:
  // shares: one a node (threads then counts their CPUs); none: one pool of `threads`, unpinned.
  MoeLayer(const MoeConfig& config, const std::string& backend, int threads, std::vector<NodeShare> shares = {});

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
    const float* global_scales = nullptr;  // nvfp4's tensor scale, one a row
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
  // The node shares (empty: one pool, weights wherever packing put them).
  std::vector<ShareFacts> share_facts() const;
  // Layers of this process that share this layer's thread pool (this one included).
  long pool_layers() const { return pool_.use_count(); }
  std::size_t packed_bytes() const;
  // Whether Linux took the advice to back the packed weights with transparent huge pages.
  bool weights_huge_pages() const {
    return shares_.empty() || share_weights_.empty() ? weights_.advised() : share_weights_.front().advised();
  }
  // Tasks each thread ran in the gate/up phase of the last forward() (balance under skew).
  std::vector<int64_t> gate_up_task_counts() const { return gate_up_task_counts_; }
  // Milliseconds per phase of the last forward().
  const std::map<std::string, double>& last_profile() const { return profile_; }

 private:
  template <typename Row, typename GateUpRow, typename DownRow, typename Pack>
  void pack_experts(GateUpRow gate_up_row, DownRow down_row, Pack pack);
  // The tasks of a phase over N columns, by share (split: each share's first block, then the end;
  // empty: one group of all); returns each share's task end.
  std::vector<int64_t> build_tasks(std::vector<Task>& tasks, const std::vector<int64_t>& offsets, int N,
                                   const std::vector<int>& split, int cols) const;
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
  std::vector<NodeShare> shares_;
  std::vector<std::vector<int>> pool_groups_;  // the pool's groups: a share's CPUs each
  std::shared_ptr<ThreadPool> pool_;  // shared with the other layers of these groups
  // Share g's 16-column blocks of each expert: gate/up [gate_up_split_[g], [g + 1]) (whole
  // gate+up pairs), down [down_split_[g], [g + 1]); its blocks in share_weights_[g].
  std::vector<int> gate_up_split_, down_split_;
  std::vector<HugePageBuffer> share_weights_;
  std::vector<HugePageBuffer> share_metadata_;  // each share's blocks' scales and records (place_metadata)
  std::vector<bool> share_preferred_;
  // Runs tasks[0, ends.back()) on the pool: share g's [ends[g - 1], ends[g]) on its threads.
  void run_tasks(const std::vector<int64_t>& ends, const std::function<void(int64_t, int)>& fn,
                 std::vector<int64_t>* counts = nullptr);
  // After packing expert e into its usual contiguous values: its blocks moved into the shares'
  // buffers, which allocate_shares made (each asked of its node and first touched by its threads).
  void scatter_to_shares(std::vector<HugePageBuffer>& buffers, int e, PackedMatrix& gate_up, PackedMatrix& down) const;
  // The packed experts' metadata moved into one buffer a share, on its node like its values;
  // `preferred[g]` cleared where the node refused the request.
  std::vector<HugePageBuffer> place_metadata(std::vector<PackedMatrix>& gate_up, std::vector<PackedMatrix>& down,
                                             std::vector<bool>& preferred);
  std::vector<HugePageBuffer> allocate_shares(std::size_t gate_up_block, std::size_t down_block,
                                              std::vector<bool>& preferred);
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
