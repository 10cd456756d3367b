// kt bench's measurements of the machine: a backend's dot-product peak, and read bandwidth
// (the whole machine's, and a NUMA node's CPUs from a node's memory). Python calls them with
// the GIL released.
#include "python/measure.hpp"

#include <pybind11/pybind11.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>

#include "kernels/registry.hpp"
#include "runtime/huge_pages.hpp"
#include "runtime/numa_memory.hpp"
#include "runtime/thread_pool.hpp"

namespace py = pybind11;

namespace kt {
namespace {

// Bytes per second of the pool's threads each streaming its own `share` of `data`, best of `repeats`.
double best_read(ThreadPool& pool, const KernelTable& table, const uint8_t* data, std::size_t share, int repeats) {
  const int threads = pool.size();
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    pool.parallel_for(threads, [&](int64_t task, int) { sink += table.read_stream(data + task * share, share); });
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(share * threads) / seconds);
  }
  return best;
}

}  // namespace

double measure_peak(const std::string& backend, const std::string& kind, int threads, int64_t iterations) {
  const KernelTable* t = select_backend(backend);
  const int k = kind == "fp32_fma"   ? 0
                : kind == "bf16_dot" ? 1
                : kind == "int8_dot" ? 2
                : kind == "int4_dot" ? 3
                                     : -1;
  if (k < 0) throw std::invalid_argument("kind must be fp32_fma, bf16_dot, int8_dot or int4_dot");
  py::gil_scoped_release release;
  ThreadPool pool(threads);
  std::vector<double> ops(threads, 0);
  auto start = std::chrono::steady_clock::now();
  pool.parallel_for(threads, [&](int64_t task, int) { ops[task] = t->peak_ops(k, iterations); });
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double total = 0;
  for (double o : ops) total += o;
  return total / seconds;  // operations per second (0: no such instruction)
}

double measure_read_bandwidth(const std::string& backend, int threads, std::size_t bytes, int repeats) {
  const KernelTable* t = select_backend(backend);
  py::gil_scoped_release release;
  // as the layer's weights are stored; kept for the next call (kt bench measures after
  // every round of a case: allocating and filling each time would cost more than the pass)
  static std::mutex cache_mutex;
  static HugePageBuffer cached;
  std::lock_guard<std::mutex> cache_lock(cache_mutex);
  if (cached.size() != bytes) {
    cached = HugePageBuffer();  // the old one goes first: never both in memory
    cached = HugePageBuffer(bytes);
    std::fill(cached.data(), cached.data() + bytes, uint8_t{1});
  }
  const HugePageBuffer& buffer = cached;
  ThreadPool pool(threads);
  const std::size_t share = bytes / threads / 256 * 256;
  return best_read(pool, *t, buffer.data(), share, repeats);
}

// Read bandwidth of threads pinned to `cpus` (one each, the caller too for the call) streaming a
// buffer asked of `memory_node` and filled by those threads: one cell of kt bench's node table.
double measure_node_read_bandwidth(const std::string& backend, const std::vector<int>& cpus, int memory_node,
                                   std::size_t bytes, int repeats) {
  const KernelTable* t = select_backend(backend);
  if (cpus.empty()) throw std::invalid_argument("cpus: name at least one CPU");
  const int threads = static_cast<int>(cpus.size());
  py::gil_scoped_release release;
  cpu_set_t saved, set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  if (sched_getaffinity(0, sizeof saved, &saved) != 0 || sched_setaffinity(0, sizeof set, &set) != 0)
    throw std::invalid_argument("cannot run on the CPUs given (outside this process's affinity?)");
  struct Restore {
    cpu_set_t& saved;
    ~Restore() { sched_setaffinity(0, sizeof saved, &saved); }
  } restore{saved};
  ThreadPool pool(std::vector<std::vector<int>>{cpus});
  HugePageBuffer buffer(bytes);
  prefer_node(buffer.data(), bytes, memory_node);
  const std::size_t share = bytes / threads / 256 * 256;
  pool.parallel_for(threads, [&](int64_t task, int) { std::fill_n(buffer.data() + task * share, share, uint8_t{1}); });
  return best_read(pool, *t, buffer.data(), share, repeats);
}
}  // namespace kt
