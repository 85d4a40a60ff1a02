// The scheduler's clock: monotonic time for heartbeat timeouts, stop
// graces, restart waits and the plan check's pacing. Production uses the
// steady clock; tests use a FakeClock they advance by hand, so that the
// scheduler's timeouts are exercised without sleeping
// (coordinator/scheduler_test.cc).
//
// Thread-safety: Now() and Advance() are safe from any thread.
#ifndef DGCA_COORDINATOR_CLOCK_H_
#define DGCA_COORDINATOR_CLOCK_H_

#include <atomic>
#include <chrono>

namespace dgca {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // The process-wide steady clock.
  static const Clock* Real();
};

// A duration of `s` seconds (fractions kept to the clock's resolution).
inline Clock::Duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(s));
}

// Seconds from a to b (negative when b is earlier).
inline double SecondsBetween(Clock::TimePoint a, Clock::TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

// Stands still until Advance()d. Starts at an arbitrary fixed point.
class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  void Advance(double seconds) { now_.fetch_add(Seconds(seconds).count()); }

 private:
  std::atomic<Duration::rep> now_{std::chrono::duration_cast<Duration>(std::chrono::hours(1)).count()};
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_CLOCK_H_
