#include "runtime/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>

namespace kt {
namespace {
inline void cpu_relax() { __builtin_ia32_pause(); }
constexpr int kSpinMicros = ThreadPool::kSpinMicros;
}  // namespace

std::shared_ptr<ThreadPool> ThreadPool::shared(int threads) {
  return shared(std::vector<std::vector<int>>{std::vector<int>(static_cast<std::size_t>(std::max(1, threads)), -1)});
}

std::shared_ptr<ThreadPool> ThreadPool::shared(const std::vector<std::vector<int>>& groups) {
  static std::mutex registry_mutex;
  using Key = std::vector<std::vector<int>>;
  static std::map<Key, std::weak_ptr<ThreadPool>>* registry = nullptr;
  static pid_t registry_pid = 0;
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (registry == nullptr || registry_pid != getpid()) {
    // A forked child: the parent's pools have no threads here. Their entries are dropped
    // without destroying anything (the registry itself is leaked, never cleared in place).
    registry = new std::map<Key, std::weak_ptr<ThreadPool>>();
    registry_pid = getpid();
  }
  if (auto pool = (*registry)[groups].lock()) return pool;
  auto pool = std::make_shared<ThreadPool>(groups);
  (*registry)[groups] = pool;
  return pool;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

ThreadPool::ThreadPool(int threads)
    : ThreadPool(std::vector<std::vector<int>>{std::vector<int>(static_cast<std::size_t>(std::max(1, threads)), -1)}) {}

ThreadPool::ThreadPool(const std::vector<std::vector<int>>& groups) {
  if (groups.empty()) throw std::invalid_argument("a thread pool needs at least one group");
  group_begin_.push_back(0);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) throw std::invalid_argument("thread pool group " + std::to_string(g) + " has no threads");
    group_begin_.push_back(group_begin_.back() + static_cast<int>(groups[g].size()));
    group_of_.insert(group_of_.end(), groups[g].size(), static_cast<int>(g));
  }
  start(groups);
}

// Group g's CPU set (its entries >= 0), for pinning; empty where none is named.
static bool cpu_set_of(const std::vector<int>& cpus, cpu_set_t& set) {
  CPU_ZERO(&set);
  bool any = false;
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set), any = true;
  return any;
}

void ThreadPool::start(const std::vector<std::vector<int>>& groups) {
  const int threads = group_begin_.back();
  counts_.assign(threads, 0);
  shares_ = std::make_unique<Share[]>(threads);
  try {
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this, i] { worker_loop(i); });
      cpu_set_t set;
      if (cpu_set_of(groups[group_of_[i]], set)) {
        const int rc = pthread_setaffinity_np(workers_.back().native_handle(), sizeof set, &set);
        if (rc != 0) throw std::system_error(rc, std::generic_category(), "pinning a worker to its node's CPUs");
      }
    }
  } catch (const std::system_error& e) {
    // The system refused a thread (limits, memory): stop the ones started, then say so. A
    // constructor that throws runs no destructor, and joinable threads left behind would
    // terminate the process.
    const std::size_t started = workers_.size();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    throw std::runtime_error("could not start " + std::to_string(threads - 1) + " worker threads (" +
                             std::to_string(started) + " started): " + e.what() +
                             "; pass a smaller threads= or raise the process's thread limit");
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::divide(int64_t n, int parts) {
  for (int i = 0; i < size(); ++i) {  // threads from `parts` on get empty shares
    const int64_t start = i < parts ? n * i / parts : n, end = i < parts ? n * (i + 1) / parts : n;
    shares_[i].next.store(start, std::memory_order_relaxed);
    shares_[i].end = end;
  }
}

void ThreadPool::run_tasks(int index) {
  const auto& fn = *job_;
  const int threads = size();
  // whom it may help: every thread, or in a grouped run its own group's
  const int first = grouped_run_ ? group_begin_[group_of_[index]] : 0;
  const int span = grouped_run_ ? group_begin_[group_of_[index] + 1] - first : threads;
  int64_t ran = 0;
  for (int k = 0; k < span; ++k) {  // its own share first, then the others' leftovers
    Share& share = shares_[first + (index - first + k) % span];
    for (;;) {
      const int64_t task = share.next.fetch_add(1, std::memory_order_relaxed);
      if (task >= share.end) break;
      try {
        fn(task, index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        for (int i = 0; i < threads; ++i) shares_[i].next.store(shares_[i].end, std::memory_order_relaxed);
      }
      ++ran;
    }
  }
  counts_[index] = ran;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // A forward() is a burst of short parallel phases: spin briefly for the next one
    // before sleeping, so a phase does not start with a futex wake-up on every thread.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    while (published_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < spin_until) {
      cpu_relax();
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks(index);
    if (pending_atomic_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn,
                              std::vector<int64_t>* counts) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  grouped_run_ = false;
  const bool alone = workers_.empty() || n == 1;
  divide(n, alone ? 1 : size());  // alone: all of it for the calling thread
  run(fn, counts, !alone);
}

void ThreadPool::parallel_for_groups(const std::vector<int64_t>& ends, const std::function<void(int64_t, int)>& fn,
                                     std::vector<int64_t>* counts) {
  if (static_cast<int>(ends.size()) != groups())
    throw std::invalid_argument("parallel_for_groups: one task range a group");
  if (ends.empty() || ends.back() <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  grouped_run_ = true;
  int64_t begin = 0;
  for (int g = 0; g < groups(); ++g) {  // group g's tasks in contiguous shares over its threads
    const int first = group_begin_[g], parts = group_size(g);
    const int64_t n = ends[g] - begin;
    for (int i = 0; i < parts; ++i) {
      shares_[first + i].next.store(begin + n * i / parts, std::memory_order_relaxed);
      shares_[first + i].end = begin + n * (i + 1) / parts;
    }
    begin = ends[g];
  }
  run(fn, counts, !workers_.empty());
}

void ThreadPool::run(const std::function<void(int64_t, int)>& fn, std::vector<int64_t>* counts, bool wake) {
  std::fill(counts_.begin(), counts_.end(), 0);
  error_ = nullptr;
  if (!wake) {
    job_ = &fn;
    run_tasks(0);
  } else {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      pending_atomic_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    run_tasks(0);
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    while (pending_atomic_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < spin_until)
      cpu_relax();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_atomic_.load(std::memory_order_acquire) == 0; });
  }
  last_counts_ = counts_;
  if (counts) *counts = counts_;
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kt
