// Persistent worker threads with a shared atomic task counter (dynamic
// scheduling: tasks of unequal cost, e.g. causal blocks, balance by
// themselves), and the dispatch to a host engine's parallel-for.

#include "lib/parallel.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace simdattn {

namespace {

// A worker waiting for the next call, and the caller waiting for the
// workers to finish, spin this long before they block on the condition
// variable: waking a blocked thread takes long on a VM whose idle vCPU is
// halted (decode, f16 K/V, Lk 16384, 2 threads: 9.4-10.9 GB/s blocking,
// 14.7-18.6 spinning). An idle pool costs at most this much CPU per call
// and worker.
constexpr int64_t kSpinMicros = 100;

// Spins (with a pause) until done() holds or about kSpinMicros have passed;
// returns whether done() held.
template <class Done>
bool SpinUntil(const Done& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield" ::: "memory");
#endif
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicros)) {
      return done();
    }
  }
}

}  // namespace

struct ThreadPool::Impl {
  int num_threads = 1;
  std::vector<std::thread> workers;
  std::mutex call_mutex;  // one ParallelFor at a time per pool

  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable done;
  std::atomic<uint64_t> generation{0};  // bumped per ParallelFor
  std::atomic<bool> stop{false};
  std::atomic<int> busy{0};  // workers still inside the current generation

  // The current job.
  void (*task)(void*, int64_t) = nullptr;
  void* arg = nullptr;
  int64_t num_tasks = 0;
  std::atomic<int64_t> next{0};

  void Drain() {
    const Impl* outer = t_running;
    t_running = this;
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= num_tasks) break;
      task(arg, i);
    }
    t_running = outer;
  }

  // The pool whose task this thread is running, if any: a ParallelFor on the
  // same pool from inside one of its tasks runs inline instead of waiting
  // for workers that are busy with the outer call (which would deadlock).
  static thread_local const Impl* t_running;

  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      const auto woken = [&] {
        return stop.load(std::memory_order_acquire) ||
               generation.load(std::memory_order_acquire) != seen;
      };
      if (!SpinUntil(woken)) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, woken);
      }
      if (stop.load(std::memory_order_acquire)) return;
      seen = generation.load(std::memory_order_acquire);
      Drain();
      if (busy.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex);
        done.notify_one();
      }
    }
  }
};

thread_local const ThreadPool::Impl* ThreadPool::Impl::t_running = nullptr;

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  // Never throws: when the system refuses a thread (or memory), the pool
  // keeps the workers it got; num_threads() reports the real count.
  try {
    impl_->workers.reserve(static_cast<size_t>(num_threads - 1));
    for (int i = 1; i < num_threads; ++i) {
      impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
    }
  } catch (...) {
  }
  impl_->num_threads = static_cast<int>(impl_->workers.size()) + 1;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop.store(true, std::memory_order_release);
  }
  impl_->wake.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  delete impl_;
}

int ThreadPool::num_threads() const { return impl_->num_threads; }

void ThreadPool::ParallelFor(int64_t num_tasks,
                             void (*task)(void* arg, int64_t i), void* arg) {
  if (num_tasks <= 0 || task == nullptr) return;
  Impl& p = *impl_;
  if (Impl::t_running == &p) {  // nested call from one of our own tasks
    for (int64_t i = 0; i < num_tasks; ++i) task(arg, i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(p.call_mutex);
  if (p.workers.empty() || num_tasks == 1) {
    const Impl* outer = Impl::t_running;
    Impl::t_running = &p;
    for (int64_t i = 0; i < num_tasks; ++i) task(arg, i);
    Impl::t_running = outer;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.task = task;
    p.arg = arg;
    p.num_tasks = num_tasks;
    p.next.store(0, std::memory_order_relaxed);
    p.busy.store(static_cast<int>(p.workers.size()), std::memory_order_relaxed);
    p.generation.fetch_add(1, std::memory_order_release);
  }
  p.wake.notify_all();
  p.Drain();  // the calling thread works too
  const auto finished = [&] { return p.busy.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(finished)) {
    std::unique_lock<std::mutex> lock(p.mutex);
    p.done.wait(lock, finished);
  }
}

namespace {

ThreadPool& DefaultPool() {
  static ThreadPool* pool = new ThreadPool(0);  // lives until exit
  return *pool;
}

}  // namespace

void RunTasks(const ExecutionOptions& exec, int64_t num_tasks,
              void (*task)(void* arg, int64_t i), void* arg) {
  if (exec.parallel_for != nullptr) {
    exec.parallel_for(exec.parallel_for_user, num_tasks, task, arg);
  } else if (exec.pool != nullptr) {
    exec.pool->ParallelFor(num_tasks, task, arg);
  } else {
    DefaultPool().ParallelFor(num_tasks, task, arg);
  }
}

int ExecutorThreads(const ExecutionOptions& exec) {
  if (exec.parallel_for != nullptr) {
    if (exec.parallel_for_threads > 0) return exec.parallel_for_threads;
    const int n = static_cast<int>(std::thread::hardware_concurrency());
    return n > 0 ? n : 1;
  }
  return exec.pool != nullptr ? exec.pool->num_threads()
                              : DefaultPool().num_threads();
}

}  // namespace simdattn
