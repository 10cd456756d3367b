// A small thread pool for the MoE layer: parallel_for over task indices, the calling
// thread working too. Each thread starts on its own contiguous share of the tasks (the MoE
// phases order tasks by weight address, so each thread streams its own weights and the
// hardware prefetcher follows it) and, when that is done, takes the remaining tasks of the
// others one at a time (balance under skew). One pool per layer
// owns its threads; nothing else in ktforge spawns threads, so there is no
// oversubscription unless the caller asks for more threads than CPUs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kt {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, thread_index) for task in [0, n); returns when all are done.
  // The first exception thrown by a task is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn);

  // Tasks each thread ran in the last parallel_for (for tests of balancing).
  std::vector<int64_t> last_task_counts() const { return last_counts_; }

 private:
  void worker_loop(int index);
  void run_tasks(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* job_ = nullptr;
  // Thread i's share is [next, end) of shares_[i]; anyone may claim from it with fetch_add.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Share[]> shares_;
  // Tasks [0, n) in `parts` contiguous shares, one per thread from the first.
  void divide(int64_t n, int parts);
  std::atomic<int> pending_atomic_{0};
  std::atomic<uint64_t> published_{0};
  uint64_t generation_ = 0;
  std::atomic<bool> stop_{false};  // read while spinning, set under the mutex
  std::exception_ptr error_;
  std::vector<int64_t> counts_, last_counts_;
};

// CPUs this process may run on (sched_getaffinity), at least 1.
int available_cpus();

}  // namespace kt
