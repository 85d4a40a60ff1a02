// ThreadPool: a small fixed pool for the CPU kernels' parallel loops.
//
// Why not OpenMP: OpenBLAS (pthreads build) and libgomp both keep their
// threads spinning after a parallel region, and on a machine with few cores
// the two pools fight for them (measured: 2 threads 3-5x SLOWER than 1). So
// the model runs OpenBLAS single-threaded and splits GEMMs itself, on this
// pool, whose workers spin only briefly and then block.
//
// Run(fn) calls fn(part) for every part in [0, threads()) — part 0 on the
// calling thread — and returns when all have finished. Work is split
// statically by part, so results depend only on the thread count, never on
// scheduling (the basis of the kernels' bit-reproducibility).
//
// Thread-safety: Run() must not be called concurrently, nor from inside fn.
#ifndef DGCA_MODEL_CPU_THREAD_POOL_H_
#define DGCA_MODEL_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "model/core/mutex.h"

namespace dgca {
namespace cpu {

class ThreadPool {
 public:
  // threads >= 1; threads - 1 worker threads are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }
  void Run(const std::function<void(int part)>& fn);

 private:
  void Worker(int part);

  const int threads_;
  std::vector<std::thread> workers_;
  Mutex mu_;
  const std::function<void(int)>* fn_ DGCA_GUARDED_BY(mu_) = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  bool stop_ DGCA_GUARDED_BY(mu_) = false;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
};

}  // namespace cpu
}  // namespace dgca

#endif  // DGCA_MODEL_CPU_THREAD_POOL_H_
