// Lock annotations for libdgca_model, which builds without Abseil
// (model/core/status.h says why): the clang thread-safety attributes behind
// DGCA_GUARDED_BY and friends (nothing under other compilers), and Mutex, a
// std::mutex that carries them. tools/thread_safety_check.py compiles the
// annotated sources with clang -Wthread-safety (ctest thread_safety_check).
// The control plane uses absl::Mutex and ABSL_GUARDED_BY the same way.
//
// Waiting: Mutex::Wait and Mutex::WaitFor wait on a std::condition_variable
// while the caller holds the mutex through a MutexLock (the lock is released
// while waiting, as condition_variable::wait does).
//
// Thread-safety: Mutex is a mutex.
#ifndef DGCA_MODEL_CORE_MUTEX_H_
#define DGCA_MODEL_CORE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define DGCA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DGCA_THREAD_ANNOTATION(x)
#endif
#define DGCA_CAPABILITY(x) DGCA_THREAD_ANNOTATION(capability(x))
#define DGCA_SCOPED_CAPABILITY DGCA_THREAD_ANNOTATION(scoped_lockable)
#define DGCA_GUARDED_BY(x) DGCA_THREAD_ANNOTATION(guarded_by(x))
#define DGCA_PT_GUARDED_BY(x) DGCA_THREAD_ANNOTATION(pt_guarded_by(x))
#define DGCA_REQUIRES(...) DGCA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DGCA_ACQUIRE(...) DGCA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DGCA_RELEASE(...) DGCA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DGCA_EXCLUDES(...) DGCA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace dgca {

class DGCA_CAPABILITY("mutex") Mutex {
 public:
  void Lock() DGCA_ACQUIRE() { mu_.lock(); }
  void Unlock() DGCA_RELEASE() { mu_.unlock(); }

  // cv.wait(pred) with this mutex, which the caller holds.
  template <class Pred>
  void Wait(std::condition_variable& cv, Pred pred) DGCA_REQUIRES(this) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    cv.wait(l, pred);
    l.release();  // still held: the caller's MutexLock releases it
  }
  // cv.wait_for(timeout, pred); false when it timed out with pred false.
  template <class Rep, class Period, class Pred>
  bool WaitFor(std::condition_variable& cv, std::chrono::duration<Rep, Period> timeout, Pred pred)
      DGCA_REQUIRES(this) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    const bool ok = cv.wait_for(l, timeout, pred);
    l.release();
    return ok;
  }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class DGCA_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) DGCA_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() DGCA_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_MUTEX_H_
