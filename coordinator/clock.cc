#include "coordinator/clock.h"

namespace dgca {
namespace {

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock* Clock::Real() {
  static const SteadyClock* clock = new SteadyClock();
  return clock;
}

}  // namespace dgca
