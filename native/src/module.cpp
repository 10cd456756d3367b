// Python entry point of the native kernels (ktforge._native).
//
// This file and the runtime are compiled without ISA flags: importing the module is
// safe on any x86-64 CPU. ISA-specific code lives in arch/*, one translation unit per
// backend with its own flags, and runs only after select_backend() checked the CPU.
// Arguments are validated in Python (ktforge.kernels.moe) and again here where memory safety
// depends on them; C++ exceptions become Python ValueError/RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arch/features.hpp"
#include "blis/aocl.hpp"
#include "kernels/registry.hpp"
#include "kernels/lattice.hpp"
#include "kernels/pack.hpp"
#include "kernels/scalar.hpp"
#include "moe/layer.hpp"
#include "python/arrays.hpp"
#include "python/measure.hpp"
#include "python/portable_weights.hpp"
#include "python/quantize.hpp"
#include "runtime/numa_memory.hpp"
#include "runtime/aligned.hpp"
#include "runtime/amx_permission.hpp"
#include "runtime/cpu_features.hpp"
#include "runtime/thread_pool.hpp"

namespace py = pybind11;
using namespace kt;

#ifdef KTFORGE_HAVE_BLIS
namespace kt {
std::string blis_version();
bool blis_gemm_selftest();
}  // namespace kt
#endif

namespace {

// What a projection's input becomes (info): int8 with a scale per block of K (activation_block),
// or the float the kernels take.
std::string activation_scheme(Method m, int group, int K, bool token_scales) {
  const Element e = element_of(m);
  if (!int8_activations(e)) return e == Element::bf16 ? "bf16" : "fp32";
  const int Kp = static_cast<int>(round_up(K, k_step(e, group))), block = activation_block(e, group, Kp);
  return kActivationBlocks[static_cast<int>(e)] < 0 || token_scales ? "int8, a scale per token" : "int8, a scale per " + std::to_string(block) + " values of K";
}

py::dict backend_info(const KernelTable& t) {
  py::dict d;
  d["name"] = t.name;
  d["required_cpu_features"] = required_features(t);
  const bool runs = runs_here(t);
  // what this table runs for each format the kernels provider computes; only where it runs: its
  // description is code of its level (string building may take that level's instructions)
  py::dict kernels;
  for (int i = 0; runs && i < kFormatCount; ++i) {
    const FormatInfo& f = format_info(static_cast<Method>(i));
    for (int p = 0; p < f.provider_count; ++p)
      if (std::string(f.providers[p]) == "kernels") kernels[f.name] = t.describe(f.element);
  }
  d["kernels"] = kernels;
  d["runs_here"] = runs;
  return d;
}

class PyMoE {
 public:
  // down_method "": down in gate and up's format
  PyMoE(int experts, int top_k, int hidden, int intermediate, const std::string& method, int group,
        const std::string& backend, int threads, float alpha, float limit, float up_offset,
        const std::string& down_method, int down_group, const std::vector<std::pair<std::vector<int>, int>>& shares)
      : layer_(MoeConfig{experts, top_k, hidden, intermediate, parse_method(method), group,
                         GateActivation{alpha, limit, up_offset},
                         parse_method(down_method.empty() ? method : down_method),
                         down_method.empty() ? group : down_group},
               backend, threads, node_shares(shares)) {}

  static std::vector<NodeShare> node_shares(const std::vector<std::pair<std::vector<int>, int>>& shares) {
    std::vector<NodeShare> out;
    for (const auto& [cpus, node] : shares) out.push_back(NodeShare{cpus, node});
    return out;
  }

  // int8 activations with one scale a token, or a scale per block of K (activation_block)
  void set_token_scales(bool on) {
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.set_token_scales(on);
  }

  // int32 [E, H], each row a permutation of [0, H) (checked here: an index out of range would read
  // outside x); None: x's own order
  void load_input_order(const std::optional<py::array_t<int32_t, py::array::c_style>>& order) {
    const auto& c = layer_.config();
    const int32_t* o = nullptr;
    if (order) {
      require(*order, {c.experts, c.hidden}, "order");
      o = order->data();
      std::vector<char> seen(c.hidden);
      for (int e = 0; e < c.experts; ++e) {
        std::fill(seen.begin(), seen.end(), 0);
        for (int j = 0; j < c.hidden; ++j) {
          const int32_t v = o[static_cast<std::size_t>(e) * c.hidden + j];
          if (v < 0 || v >= c.hidden || seen[v]++)
            throw std::invalid_argument("order[" + std::to_string(e) + "] is not a permutation of range(" +
                                        std::to_string(c.hidden) + ")");
        }
      }
    }
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.load_input_order(o);
  }

  // gate, up: float32 [E, I]; down: float32 [E, H]; None: no bias
  void load_biases(const std::optional<py::array_t<float, py::array::c_style>>& gate,
                   const std::optional<py::array_t<float, py::array::c_style>>& up,
                   const std::optional<py::array_t<float, py::array::c_style>>& down) {
    const auto& c = layer_.config();
    if (gate) require(*gate, {c.experts, c.intermediate}, "gate_bias");
    if (up) require(*up, {c.experts, c.intermediate}, "up_bias");
    if (down) require(*down, {c.experts, c.hidden}, "down_bias");
    const float* g = gate ? gate->data() : nullptr;
    const float* u = up ? up->data() : nullptr;
    const float* d = down ? down->data() : nullptr;
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.load_biases(g, u, d);
  }

  void load(const py::array& gate, const py::array& up, const py::array& down) {
    const auto& c = layer_.config();
    DType d = dtype_of(gate, "gate");
    if (dtype_of(up, "up") != d || dtype_of(down, "down") != d)
      throw std::invalid_argument("gate, up and down must share one dtype");
    require(gate, {c.experts, c.intermediate, c.hidden}, "gate");
    require(up, {c.experts, c.intermediate, c.hidden}, "up");
    require(down, {c.experts, c.hidden, c.intermediate}, "down");
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.load(gate.data(), up.data(), down.data(), d);
  }

  void load_quantized(const py::array& gate, const py::array& gate_scale, const py::array& up,
                      const py::array& up_scale, const py::array& down, const py::array& down_scale,
                      const py::object& gate_zero, const py::object& up_zero, const py::object& down_zero,
                      const py::object& gate_global, const py::object& up_global, const py::object& down_global) {
    const auto& c = layer_.config();
    if (element_of(c.method) == Element::bf16 && element_of(c.down_method) == Element::bf16)
      throw std::invalid_argument(std::string("method '") + method_name(c.method) +
                                  "' takes load_weights, not quantized weights");
    auto g = portable_weights(c, gate, gate_scale, gate_zero, c.intermediate, c.hidden, "gate");
    auto u = portable_weights(c, up, up_scale, up_zero, c.intermediate, c.hidden, "up");
    auto d = portable_weights(c, down, down_scale, down_zero, c.hidden, c.intermediate, "down");
    std::vector<py::array_t<float, py::array::c_style>> held;  // nvfp4's tensor scales, until packed
    attach_global_scales(c, {gate_global, up_global, down_global}, {&g, &u, &d}, held);
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.load_quantized(g, u, d);
  }

  void forward(const py::array& x, const py::array& ids, const py::array& weights, py::array& out, bool skip_absent) {
    const auto& c = layer_.config();
    if (x.ndim() != 2) throw std::invalid_argument("x must be 2-D [tokens, hidden_size]");
    const py::ssize_t T = x.shape(0);
    require(x, {T, c.hidden}, "x");
    if (!ids.dtype().is(py::dtype::of<int64_t>())) throw std::invalid_argument("ids must be int64");
    if (!weights.dtype().is(py::dtype::of<float>())) throw std::invalid_argument("weights must be float32");
    require(ids, {T, c.top_k}, "ids");
    require(weights, {T, c.top_k}, "weights");
    require(out, {T, c.hidden}, "out");
    if (!out.writeable()) throw std::invalid_argument("out must be writeable");
    DType xd = dtype_of(x, "x"), od = dtype_of(out, "out");
    const void* xp = x.data();
    const auto* idp = static_cast<const int64_t*>(ids.data());
    const auto* wp = static_cast<const float*>(weights.data());
    void* op = out.mutable_data();
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    layer_.forward(xp, xd, T, idp, wp, op, od, skip_absent);
  }

  py::dict info() {
    std::size_t packed = 0;
    bool loaded = false, huge_pages = false;
    std::vector<int> min_rows;
    std::vector<ShareFacts> share_facts;
    {  // what a concurrent load changes
      py::gil_scoped_release release;
      auto lock = layer_.lock_calls();
      share_facts = layer_.share_facts();
      packed = layer_.packed_bytes();
      loaded = layer_.loaded();
      huge_pages = layer_.weights_huge_pages();
      for (const auto& p : layer_.providers()) min_rows.push_back(p->min_rows());
    }
    py::dict d = backend_info(layer_.kernels());
    d["method"] = method_name(layer_.config().method);
    d["down_method"] = method_name(layer_.config().down_method);
    d["kernel"] = describe_providers(min_rows);
    const MoeConfig& c = layer_.config();
    d["activations"] = py::dict(py::arg("gate_up") = activation_scheme(c.method, c.group, c.hidden, c.token_scales),
                                py::arg("down") = activation_scheme(c.down_method, c.down_group, c.intermediate,
                                                                    c.token_scales));
    if (const LibraryBackend* lib = layer_.library()) {
      d["name"] = lib->name;
      const auto& providers = layer_.providers();
      for (std::size_t p = 0; p + 1 < providers.size(); ++p) {  // the library's facts, and from which count it runs
        py::dict facts;
        for (const auto& [key, value] : providers[p]->facts()) facts[key.c_str()] = value;
        facts["min_tokens_per_expert"] = min_rows[p] >= kNever ? py::object(py::none()) : py::int_(min_rows[p]);
        d[providers[p]->name()] = facts;
      }
      if (providers.size() == 1)  // a format the library does not take: ktforge's kernels, and why
        d["kernel"] = providers.back()->describe() + " (" + lib->elsewhere + ")";
    }
    d["threads"] = layer_.threads();
    py::list shares;  // MoE(numa=...)'s node shares: what each holds, and where its pages are
    for (const ShareFacts& f : share_facts) {
      py::dict share;
      share["node"] = f.node;
      share["threads"] = f.threads;
      share["intermediate_columns"] = f.gate_up_columns;
      share["hidden_columns"] = f.down_columns;
      share["bytes"] = f.bytes;
      share["node_requested"] = f.preferred;
      share["policy_mode"] = f.policy;
      share["pages_sampled"] = f.pages_sampled;
      share["pages_on_node"] = f.pages_on_node;
      shares.append(share);
    }
    d["numa_shares"] = shares;
    d["pool_layers"] = layer_.pool_layers();  // layers sharing one set of worker threads
    d["packed_bytes"] = packed;
    d["loaded"] = loaded;
    d["huge_pages_advised"] = huge_pages;  // the packed weights, for transparent huge pages
    d["disabled_cpu_features"] = disabled_cpu_features();  // KTFORGE_DISABLE_CPU_FEATURES in force
    return d;
  }

  // "aocl_gemm_... for experts with >= 16 tokens, else <kernels>": the providers in the order
  // the layer asks them, without those that measured slower at every count.
  std::string describe_providers(const std::vector<int>& min_rows) const {
    const auto& providers = layer_.providers();
    std::string text, skipped;
    for (std::size_t p = 0; p < providers.size(); ++p) {
      if (p + 1 < providers.size() && min_rows[p] >= kNever) {
        skipped += std::string(" (") + providers[p]->name() +
                   " was not clearly faster at any token count up to 256, measured at load)";
        continue;
      }
      text += (text.empty() ? "" : ", else ") + providers[p]->describe();
    }
    return text + skipped;
  }

  std::vector<int64_t> gate_up_task_counts() {
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    return layer_.gate_up_task_counts();
  }
  std::map<std::string, double> last_profile() {
    py::gil_scoped_release release;
    auto lock = layer_.lock_calls();
    return layer_.last_profile();
  }

 private:
  MoeLayer layer_;
};

}  // namespace

static py::dict build_info() {
  py::dict info;
  info["version"] = KTFORGE_VERSION;
  info["compiler"] =
#if defined(__clang__)
      std::string("clang ") + __clang_version__;
#else
      std::string("gcc ") + __VERSION__;
#endif
  info["arch_flags"] = KTFORGE_ARCH_FLAGS;
  py::list backends;
  for (const KernelTable* t : compiled_backends()) backends.append(backend_info(*t));
  // The extension as a whole needs only what its least demanding backend needs;
  // each backend's own requirement is listed with it.
  info["required_cpu_features"] = compiled_features();
  info["backends"] = backends;
#ifdef KTFORGE_HAVE_BLIS
  info["blis"] = py::dict(py::arg("library") = KTFORGE_BLIS_LIBRARY, py::arg("version") = blis_version());
#else
  info["blis"] = py::none();
#endif
  return info;
}

static void use_blis_library(const std::string& path) {
  Aocl::load(path);  // throws std::invalid_argument naming what is missing
  Aocl::set_linked_library(path);
}


static std::pair<std::vector<int64_t>, std::vector<int64_t>> thread_pool_selftest(int threads, int tasks) {
  // Each thread's first task waits at a rendezvous: it is only reached if every thread
  // of the pool takes a task while the others are still busy (no thread left idle), and
  // while all wait, none can take another's task: the first task each thread takes is
  // the start of its own share. Returns (tasks each thread ran, each thread's first
  // task), or raises.
  py::gil_scoped_release release;
  ThreadPool pool(threads);
  std::vector<int64_t> first(threads, -1);
  std::atomic<int> arrived{0};
  std::atomic<bool> timed_out{false};
  pool.parallel_for(tasks, [&](int64_t task, int thread) {
    if (first[thread] >= 0) return;
    first[thread] = task;
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (arrived.load() < threads) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  if (timed_out) throw std::runtime_error("thread pool: not every thread took work");
  return std::make_pair(pool.last_task_counts(), first);
}

PYBIND11_MODULE(_native, m) {
  m.doc() = "ktforge native MoE kernels";
  // The CPU features this process must not use, from their one reader (an unknown name fails
  // the import with its message), before anything here asks what the CPU has.
  auto mask = py::module_::import("ktforge.detect.mask").attr("from_environment")();
  disable_cpu_features(mask.cast<std::vector<std::string>>());
  Aocl::follow_cpu_mask();
#ifdef KTFORGE_HAVE_BLIS
  // The one build-time setting the core needs at run time: it is compiled into this module only.
  Aocl::set_linked_library(KTFORGE_BLIS_LIBRARY);
#endif
  m.def(
      "build_info",
      &build_info,
      "What this extension was compiled with: version, compiler, flags, and each backend's CPU needs.");
#ifdef KTFORGE_HAVE_BLIS
  m.def("blis_gemm_selftest", &blis_gemm_selftest, "A 3x5x7 s8s8s32 GEMM through the linked AOCL-BLAS, checked.");
#endif
  m.def(
      "request_amx_permission",
      &request_amx_permission,
      "Ask Linux for AMX tile permission once per process; 0 or the errno.");
  m.def(
      "use_blis_library",
      &use_blis_library,
      py::arg("path"),
      "Use this AOCL-BLAS (with the aocl_gemm add-on) for library backends: a build that links none "
      "(portable) finds one at run time.");
  m.def("cpu_has", &cpu_has,
        "Whether the running CPU and OS support a feature (Linux flag name), less KTFORGE_DISABLE_CPU_FEATURES.");
  m.def("disabled_cpu_features", &disabled_cpu_features,
        "The features KTFORGE_DISABLE_CPU_FEATURES disabled in this process, as if the CPU lacked them.");
  m.def("cpu_feature_disabled", &cpu_feature_disabled,
        "Whether the CPU and OS have a feature that KTFORGE_DISABLE_CPU_FEATURES hides.");
  m.def(
      "measure_peak",
      &measure_peak,
      py::arg("backend"), py::arg("kind"), py::arg("threads"), py::arg("iterations"),
      "Operations per second of a backend's dot-product instruction, on `threads` threads.");
  m.def(
      "measure_read_bandwidth",
      &measure_read_bandwidth,
      py::arg("backend"), py::arg("threads"), py::arg("bytes"), py::arg("repeats"),
      "Read bandwidth of a buffer of `bytes` (larger than the caches: memory), best of repeats.");
  m.def("measure_node_read_bandwidth", &measure_node_read_bandwidth, py::arg("backend"), py::arg("cpus"),
        py::arg("memory_node"), py::arg("bytes"), py::arg("repeats"),
        "Read bandwidth of threads on `cpus` from a buffer on `memory_node`, best of repeats.");
  m.def(
      "thread_pool_selftest",
      &thread_pool_selftest,
      py::arg("threads"), py::arg("tasks"));
  m.def("quantize_weights", &quantize_weights, py::arg("weights"), py::arg("method"), py::arg("group_size"),
        py::arg("fp8_scale") = py::none(), py::arg("block_rows") = 128, py::arg("block_cols") = 128);
  m.def("dequantize_fp8", &dequantize_fp8, py::arg("weights"), py::arg("scale"), py::arg("block_rows"),
        py::arg("block_cols"));
  py::class_<PyMoE>(m, "MoELayer")
      .def(py::init<int, int, int, int, const std::string&, int, const std::string&, int, float, float, float,
                    const std::string&, int, const std::vector<std::pair<std::vector<int>, int>>&>(),
           py::arg("num_experts"), py::arg("top_k"), py::arg("hidden_size"), py::arg("intermediate_size"),
           py::arg("method"), py::arg("group_size"), py::arg("backend"), py::arg("threads"), py::arg("swiglu_alpha") = 1.f,
           py::arg("swiglu_limit") = __builtin_inff(), py::arg("up_offset") = 0.f, py::arg("down_method") = "",
           py::arg("down_group_size") = 128,
           py::arg("numa_shares") = std::vector<std::pair<std::vector<int>, int>>{})
      .def("load_biases", &PyMoE::load_biases, py::arg("gate"), py::arg("up"), py::arg("down"))
      .def("load_input_order", &PyMoE::load_input_order, py::arg("order"))
      .def("set_token_scales", &PyMoE::set_token_scales, py::arg("on"))
      .def("load_weights", &PyMoE::load, py::arg("gate"), py::arg("up"), py::arg("down"))
      .def("load_quantized", &PyMoE::load_quantized, py::arg("gate"), py::arg("gate_scale"), py::arg("up"),
           py::arg("up_scale"), py::arg("down"), py::arg("down_scale"), py::arg("gate_zero") = py::none(),
           py::arg("up_zero") = py::none(), py::arg("down_zero") = py::none(), py::arg("gate_global") = py::none(),
           py::arg("up_global") = py::none(), py::arg("down_global") = py::none())
      .def("forward", &PyMoE::forward, py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("out"),
           py::arg("skip_absent") = false)
      .def("info", &PyMoE::info)
      .def("gate_up_task_counts", &PyMoE::gate_up_task_counts)
      .def("last_profile", &PyMoE::last_profile);
}
