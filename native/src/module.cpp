// Python entry point of the native kernels (ktforge._native).
//
// This file and the runtime are compiled without ISA flags: importing the module is
// safe on any x86-64 CPU. ISA-specific code lives in arch/*, one translation unit per
// backend with its own flags, and runs only after select_backend() checked the CPU.
// Arguments are validated in Python (ktforge.moe) and again here where memory safety
// depends on them; C++ exceptions become Python ValueError/RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "arch/features.hpp"
#include "kernels/registry.hpp"
#include "moe/layer.hpp"
#include "runtime/aligned.hpp"
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

DType dtype_of(const py::array& a, const char* what) {
  if (a.dtype().is(py::dtype::of<float>())) return DType::f32;
  if (a.dtype().is(py::dtype::of<uint16_t>())) return DType::bf16;  // bfloat16 viewed as uint16
  throw std::invalid_argument(std::string(what) + " must be float32 or bfloat16 (passed as uint16)");
}

void require(const py::array& a, const std::vector<py::ssize_t>& shape, const char* what) {
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(what) + " must be C-contiguous");
  if (a.ndim() != static_cast<py::ssize_t>(shape.size()))
    throw std::invalid_argument(std::string(what) + " has the wrong number of dimensions");
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (a.shape(i) != shape[i]) throw std::invalid_argument(std::string(what) + " has the wrong shape");
}

py::dict backend_info(const KernelTable& t) {
  py::dict d;
  d["name"] = t.name;
  d["required_cpu_features"] = t.compiled_features();
  d["kernels"] = py::dict(py::arg("bf16") = t.describe(Method::bf16), py::arg("int8") = t.describe(Method::int8),
                          py::arg("int4") = t.describe(Method::int4));
  d["runs_here"] = missing_features(t.compiled_features()).empty();
  return d;
}

class PyMoE {
 public:
  PyMoE(int experts, int top_k, int hidden, int intermediate, const std::string& method, int group,
        const std::string& backend, int threads)
      : layer_(MoeConfig{experts, top_k, hidden, intermediate, parse_method(method), group}, backend, threads) {}

  void load(const py::array& gate, const py::array& up, const py::array& down) {
    const auto& c = layer_.config();
    DType d = dtype_of(gate, "gate");
    if (dtype_of(up, "up") != d || dtype_of(down, "down") != d)
      throw std::invalid_argument("gate, up and down must share one dtype");
    require(gate, {c.experts, c.intermediate, c.hidden}, "gate");
    require(up, {c.experts, c.intermediate, c.hidden}, "up");
    require(down, {c.experts, c.hidden, c.intermediate}, "down");
    py::gil_scoped_release release;
    layer_.load(gate.data(), up.data(), down.data(), d);
  }

  // int8: values int8 [rows..., K], scales float32 [rows...]; int4: values uint8
  // [rows..., Kg / 2], scales float32 [rows..., Kg / group] with Kg = K rounded up to the group.
  MoeLayer::QuantizedWeights quantized(const py::array& values, const py::array& scales, py::ssize_t N, py::ssize_t K,
                                       const char* name) {
    const auto& c = layer_.config();
    const py::ssize_t E = c.experts;
    if (c.method == Method::int8) {
      if (!values.dtype().is(py::dtype::of<int8_t>())) throw std::invalid_argument(std::string(name) + " must be int8");
      require(values, {E, N, K}, name);
      require(scales, {E, N}, (std::string(name) + "_scale").c_str());
    } else {
      const py::ssize_t groups = (K + c.group - 1) / c.group;
      if (!values.dtype().is(py::dtype::of<uint8_t>()))
        throw std::invalid_argument(std::string(name) + " must be uint8 (two int4 values per byte)");
      require(values, {E, N, groups * c.group / 2}, name);
      require(scales, {E, N, groups}, (std::string(name) + "_scale").c_str());
    }
    if (!scales.dtype().is(py::dtype::of<float>())) throw std::invalid_argument(std::string(name) + "_scale must be float32");
    return {values.data(), values.shape(2) * 1, static_cast<const float*>(scales.data()),
            c.method == Method::int8 ? 1 : scales.shape(2)};
  }

  void load_quantized(const py::array& gate, const py::array& gate_scale, const py::array& up,
                      const py::array& up_scale, const py::array& down, const py::array& down_scale) {
    const auto& c = layer_.config();
    if (c.method == Method::bf16) throw std::invalid_argument("method 'bf16' takes load_weights, not quantized weights");
    auto g = quantized(gate, gate_scale, c.intermediate, c.hidden, "gate");
    auto u = quantized(up, up_scale, c.intermediate, c.hidden, "up");
    auto d = quantized(down, down_scale, c.hidden, c.intermediate, "down");
    py::gil_scoped_release release;
    layer_.load_quantized(g, u, d);
  }

  void forward(const py::array& x, const py::array& ids, const py::array& weights, py::array& out) {
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
    layer_.forward(xp, xd, T, idp, wp, op, od);
  }

  py::dict info() const {
    py::dict d = backend_info(layer_.kernels());
    d["method"] = method_name(layer_.config().method);
    d["kernel"] = layer_.kernels().describe(layer_.config().method);
    if (const Aocl* aocl = layer_.aocl()) {
      const bool never = layer_.aocl_min_rows() >= (1 << 30);
      const std::string gemm = layer_.config().method == Method::int8 ? "aocl_gemm_s8s8s32os32" : "aocl_gemm_bf16bf16f32of32";
      d["name"] = "amd-blis";
      d["aocl"] = py::dict(py::arg("library") = aocl->path(), py::arg("version") = aocl->version(),
                           py::arg("min_tokens_per_expert") = never ? py::object(py::none()) : py::int_(layer_.aocl_min_rows()));
      d["kernel"] = never ? std::string(layer_.kernels().describe(layer_.config().method)) +
                                " (AOCL was not clearly faster at any token count up to 256, measured at load)"
                          : gemm + " (" + aocl->version() + ") for experts with >= " +
                                std::to_string(layer_.aocl_min_rows()) + " tokens, else " +
                                layer_.kernels().describe(layer_.config().method);
    }
    d["threads"] = layer_.threads();
    d["packed_bytes"] = layer_.packed_bytes();
    d["loaded"] = layer_.loaded();
    return d;
  }

  std::vector<int64_t> gate_up_task_counts() const { return layer_.gate_up_task_counts(); }
  std::map<std::string, double> last_profile() const { return layer_.last_profile(); }

 private:
  MoeLayer layer_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "ktforge native MoE kernels";
  m.def(
      "build_info",
      [] {
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
      },
      "What this extension was compiled with: version, compiler, flags, and each backend's CPU needs.");
#ifdef KTFORGE_HAVE_BLIS
  m.def("blis_gemm_selftest", &blis_gemm_selftest, "A 3x5x7 s8s8s32 GEMM through the linked AOCL-BLAS, checked.");
#endif
  m.def(
      "request_amx_permission",
      [] {
        // Linux hands out AMX tile state per process, on request (arch_prctl, since 5.16).
        // Returns 0 when granted, else the errno (EOPNOTSUPP: no AMX; EINVAL: old kernel).
        static const int result = [] {
          long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
          return rc == 0 ? 0 : errno;
        }();
        return result;
      },
      "Ask Linux for AMX tile permission once per process; 0 or the errno.");
  m.def("cpu_has", &cpu_has, "Whether the running CPU and OS support a feature (Linux flag name).");
  m.def(
      "measure_peak",
      [](const std::string& backend, const std::string& kind, int threads, int64_t iterations) {
        const KernelTable* t = select_backend(backend);
        const int k = kind == "fp32_fma" ? 0 : kind == "bf16_dot" ? 1 : kind == "int8_dot" ? 2 : -1;
        if (k < 0) throw std::invalid_argument("kind must be fp32_fma, bf16_dot or int8_dot");
        py::gil_scoped_release release;
        ThreadPool pool(threads);
        std::vector<double> ops(threads, 0);
        auto start = std::chrono::steady_clock::now();
        pool.parallel_for(threads, [&](int64_t task, int) { ops[task] = t->peak_ops(k, iterations); });
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double total = 0;
        for (double o : ops) total += o;
        return total / seconds;  // operations per second (0: no such instruction)
      },
      py::arg("backend"), py::arg("kind"), py::arg("threads"), py::arg("iterations"),
      "Operations per second of a backend's dot-product instruction, on `threads` threads.");
  m.def(
      "measure_read_bandwidth",
      [](const std::string& backend, int threads, std::size_t bytes, int repeats) {
        const KernelTable* t = select_backend(backend);
        py::gil_scoped_release release;
        aligned_vector<uint8_t> buffer(bytes, 1);
        ThreadPool pool(threads);
        const std::size_t share = bytes / threads / 256 * 256;
        std::atomic<uint64_t> sink{0};
        double best = 0;
        for (int r = 0; r < repeats; ++r) {
          auto start = std::chrono::steady_clock::now();
          pool.parallel_for(threads, [&](int64_t task, int) { sink += t->read_stream(buffer.data() + task * share, share); });
          double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          best = std::max(best, static_cast<double>(share * threads) / seconds);
        }
        return best;  // bytes per second, best of `repeats`
      },
      py::arg("backend"), py::arg("threads"), py::arg("bytes"), py::arg("repeats"),
      "Read bandwidth of a buffer of `bytes` (larger than the caches: memory), best of repeats.");
  m.def(
      "thread_pool_selftest",
      [](int threads, int tasks) {
        // The first `threads` tasks meet at a rendezvous: it is only reached if every
        // thread of the pool takes a task while the others are still busy (dynamic
        // hand-out, no thread left idle). Returns the tasks each thread ran, or raises.
        py::gil_scoped_release release;
        ThreadPool pool(threads);
        std::atomic<int> arrived{0};
        std::atomic<bool> timed_out{false};
        pool.parallel_for(tasks, [&](int64_t task, int) {
          if (task >= threads) return;
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
        return pool.last_task_counts();
      },
      py::arg("threads"), py::arg("tasks"));
  py::class_<PyMoE>(m, "MoELayer")
      .def(py::init<int, int, int, int, const std::string&, int, const std::string&, int>(), py::arg("num_experts"),
           py::arg("top_k"), py::arg("hidden_size"), py::arg("intermediate_size"), py::arg("method"),
           py::arg("group_size"), py::arg("backend"), py::arg("threads"))
      .def("load_weights", &PyMoE::load, py::arg("gate"), py::arg("up"), py::arg("down"))
      .def("load_quantized", &PyMoE::load_quantized, py::arg("gate"), py::arg("gate_scale"), py::arg("up"),
           py::arg("up_scale"), py::arg("down"), py::arg("down_scale"))
      .def("forward", &PyMoE::forward, py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("out"))
      .def("info", &PyMoE::info)
      .def("gate_up_task_counts", &PyMoE::gate_up_task_counts)
      .def("last_profile", &PyMoE::last_profile);
}
