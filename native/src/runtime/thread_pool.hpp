// A small thread pool for the MoE layer: parallel_for over task indices, the calling
// thread working too. Each thread starts on its own contiguous share of the tasks (the MoE
// phases order tasks by weight address, so each thread streams its own weights and the
// hardware prefetcher follows it) and, when that is done, takes the remaining tasks of the
// others one at a time (balance under skew).
//
// Waiting: a worker that finds no work spins for kSpinMicros (a forward() is a burst of short
// phases, and a model calls its layers back to back), then parks on a condition variable, so
// an idle process burns no CPU after that. Layers share one pool per thread count
// (ThreadPool::shared), so a model of many layers has one set of workers, already spinning
// when the next layer starts, instead of a set per layer contending for the same cores.
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
  // How long an idle worker (and the caller, waiting for the last task) spins before it parks.
  static constexpr int kSpinMicros = 200;

  explicit ThreadPool(int threads);
  // One pool in groups (a NUMA node's share each): group g has groups[g].size() threads, its
  // workers pinned to the CPUs groups[g] lists; the calling thread is group 0's first, left where
  // it runs. An empty CPU list: that many threads (threads_of), unpinned.
  explicit ThreadPool(const std::vector<std::vector<int>>& groups);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // The pool of `threads` threads this process's layers share: made on first use, kept while
  // a layer holds it (its threads end with the last holder). A forked child gets its own: the
  // parent's threads do not exist there.
  static std::shared_ptr<ThreadPool> shared(int threads);
  static std::shared_ptr<ThreadPool> shared(const std::vector<std::vector<int>>& groups);

  int groups() const { return static_cast<int>(group_begin_.size()) - 1; }
  int group_size(int g) const { return group_begin_[g + 1] - group_begin_[g]; }

  // Runs fn(task, thread_index) for task in [0, n); returns when all are done. One call at a
  // time (callers on other threads wait their turn); fn must not call parallel_for.
  // The first exception thrown by a task is rethrown here. `counts`: the tasks each thread ran.
  void parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn, std::vector<int64_t>* counts = nullptr);
  // The same over tasks that belong to groups: tasks [ends[g - 1], ends[g]) run on group g's
  // threads only (a share's weights stay with its node's CPUs), which take each other's
  // leftovers but never another group's. ends.size() == groups().
  void parallel_for_groups(const std::vector<int64_t>& ends, const std::function<void(int64_t, int)>& fn,
                           std::vector<int64_t>* counts = nullptr);

  // Tasks each thread ran in the last parallel_for (for tests of balancing).
  std::vector<int64_t> last_task_counts() const { return last_counts_; }

 private:
  void start(const std::vector<std::vector<int>>& groups);
  void worker_loop(int index);
  void run_tasks(int index);
  void run(const std::function<void(int64_t, int)>& fn, std::vector<int64_t>* counts, bool wake);

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time
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
  // Thread index ranges of the groups: group g is [group_begin_[g], group_begin_[g + 1]).
  std::vector<int> group_begin_;
  std::vector<int> group_of_;  // each thread's group
  bool grouped_run_ = false;   // this parallel_for steals within groups only
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
