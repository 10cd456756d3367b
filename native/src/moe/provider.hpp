// Who computes an expert's GEMMs. A layer holds the providers its format's row of the format
// table names, preferred first, and asks for each expert which one takes its token count; the
// last takes every count. The layer shapes the work into tasks and applies silu(gate) * up;
// a provider computes out = act rows x W^T for one expert and one projection.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends.gen.hpp"
#include "kernels/types.hpp"
#include "runtime/thread_pool.hpp"

namespace kt {

// The gated activation between gate/up and down: (clamp(up, -limit, limit) + up_offset) *
// g * sigmoid(alpha * g), g = min(gate, limit). SwiGLU is alpha 1, no limit, offset 0; DeepSeek-V4
// clamps (limit); gpt-oss also has alpha 1.702 and offset 1. Biases (gpt-oss), when loaded, are
// added to gate, up and down before it.
struct GateActivation {
  float alpha = 1.f;
  float limit = __builtin_inff();
  float up_offset = 0.f;
  bool plain() const { return alpha == 1.f && limit == __builtin_inff() && up_offset == 0.f; }
};

struct MoeConfig {
  int experts = 0, top_k = 0, hidden = 0, intermediate = 0;
  Method method = Method::bf16;  // gate and up's (one matrix); down's where down_method says none
  int group = 128;
  GateActivation activation;
  // down's own format where a checkpoint stores it in another (a GGUF's Q4_K gate/up, Q8_0 down)
  Method down_method = Method::bf16;
  int down_group = 128;
  // int8 activations with one scale a token instead of a block of K (MoE(activations="per-token")):
  // the prefill tiles of the group-32 formats scale once at the end, for speed, where per-block
  // scales cost a multiply a group and row (docs/kernels.md, "Activations")
  bool token_scales = false;
  bool mixed() const { return down_method != method || down_group != group; }
  Method method_of(bool down) const { return down ? down_method : method; }
  int group_of(bool down) const { return down ? down_group : group; }
};

enum class Projection { gate_up, down };

// One call: rows[0..m) of `act` against columns [n0, n1) of expert `expert`'s packed `w`
// into out (m rows, ld_out apart). A whole-expert provider always gets every column.
struct ExpertGemm {
  const Activations* act;
  const int32_t* rows;
  int m;
  int expert;
  Projection projection;
  const PackedMatrix* w;
  int n0, n1;
  float* out;
  int64_t ld_out;
  int thread;  // the pool thread running the call, for per-thread scratch
};

// What a factory sees: the layer's shape and format, the backend's kernel table and, for a
// library backend, its row of the backend table.
struct ProviderContext {
  const MoeConfig& config;
  const KernelTable& kernels;
  const LibraryBackend* library;
  int threads;
};

class Provider {
 public:
  virtual ~Provider() = default;
  // The provider's name in the format table ("kernels", "aocl", ...).
  virtual const char* name() const = 0;
  // What computes the format, for MoE.info and kt bench.
  virtual std::string describe() const = 0;
  // The fewest tokens per expert this provider takes (above every count: never).
  virtual int min_rows() const { return 1; }
  // Whether it computes an expert's columns all at once rather than in column slices.
  virtual bool whole_expert() const { return false; }
  // After the layer packed its weights: a provider may keep its own copy (a library's layout)
  // and measure where it wins against `next`, the provider that would run otherwise.
  virtual void attach(const std::vector<PackedMatrix>& /*gate_up*/, const std::vector<PackedMatrix>& /*down*/,
                      ThreadPool& /*pool*/, Provider& /*next*/) {}
  virtual void gemm(const ExpertGemm& call) = 0;
  // Facts for MoE.info (a library's path and version), empty for none.
  virtual std::map<std::string, std::string> facts() const { return {}; }
};

// null: the provider does not apply here (a library provider without its library backend).
using ProviderFactory = std::unique_ptr<Provider> (*)(const ProviderContext&);

// The providers of a layer, preferred first, from the format table; the last takes every case.
std::vector<std::unique_ptr<Provider>> make_providers(const ProviderContext& context);

constexpr int kNever = 1 << 30;  // a min_rows above every token count

}  // namespace kt
