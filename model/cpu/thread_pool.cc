#include "model/cpu/thread_pool.h"

#include <algorithm>

namespace dgca {
namespace cpu {
namespace {

// About 20-50 microseconds of polling before blocking: enough to catch the
// next kernel's region back to back, short enough not to starve other work.
constexpr int kSpin = 1000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  for (int p = 1; p < threads_; ++p) workers_.emplace_back([this, p] { Worker(p); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lk(&mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(const std::function<void(int part)>& fn) {
  if (threads_ == 1) {
    fn(0);
    return;
  }
  remaining_.store(threads_ - 1, std::memory_order_relaxed);
  {
    MutexLock lk(&mu_);
    fn_ = &fn;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  fn(0);
  for (int i = 0; i < kSpin && remaining_.load(std::memory_order_acquire) != 0; ++i) CpuRelax();
  if (remaining_.load(std::memory_order_acquire) != 0) {
    MutexLock lk(&mu_);
    mu_.Wait(done_cv_, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
  }
}

void ThreadPool::Worker(int part) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpin && generation_.load(std::memory_order_acquire) == seen; ++i)
      CpuRelax();
    const std::function<void(int)>* fn;
    {
      MutexLock lk(&mu_);
      mu_.Wait(start_cv_, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      fn = fn_;
    }
    (*fn)(part);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      MutexLock lk(&mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace cpu
}  // namespace dgca
