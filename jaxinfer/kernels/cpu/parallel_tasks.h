// Splitting a kernel's work over XLA's intra-op thread pool.
//
// The calling thread claims tasks too and afterwards waits only for tasks other threads have
// started, so it cannot deadlock when every pool thread is itself inside such a call. A pool
// thread that starts after all tasks are claimed returns at once; the shared state outlives the
// call for it.

#ifndef JAXINFER_CPU_KERNELS_PARALLEL_TASKS_H_
#define JAXINFER_CPU_KERNELS_PARALLEL_TASKS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jaxinfer {

#ifndef JAXINFER_MIN_TASK_BYTES
#define JAXINFER_MIN_TASK_BYTES (64 << 10)
#endif

// Below this much data a task is not worth handing to another thread: waking it and waiting
// for it costs more than reading the data (small models call kernels thousands of times a step).
constexpr int64_t kMinTaskBytes = JAXINFER_MIN_TASK_BYTES;
constexpr int64_t kTasksPerThread = 2;  // evens out threads that start late

// How many tasks to split `units` of `unit_bytes` each into.
inline int64_t TaskCount(xla::ffi::ThreadPool& pool, int64_t units, int64_t unit_bytes) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t worth = std::max<int64_t>(1, units * unit_bytes / kMinTaskBytes);
  return std::max<int64_t>(1, std::min({units, threads * kTasksPerThread, worth}));
}

// Per-thread state for tasks that need none.
struct NoState {};

// Runs task(i, state) for every i in [0, count); each thread builds one State and reuses it.
// `task` is copied into shared state: capture pointers and sizes by value.
template <typename State, typename Task>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count, Task task) {
  struct Shared {
    Task task;
    int64_t count;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};

    Shared(Task t, int64_t n) : task(std::move(t)), count(n) {}

    void Work() {
      State state;
      for (int64_t i; (i = next.fetch_add(1)) < count;) {
        task(i, state);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>(std::move(task), count);
  const int64_t helpers = std::min<int64_t>(std::max<int64_t>(1, pool.num_threads()), count) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { shared->Work(); });
  shared->Work();
  while (shared->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

}  // namespace jaxinfer

#endif  // JAXINFER_CPU_KERNELS_PARALLEL_TASKS_H_
