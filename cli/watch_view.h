// The `dgca watch JOB` screen: a progress bar, throughput, the loss
// with a sparkline of the last ~30 steps, the communication share and one row
// per rank (step, loss, samples/s, comm share, heartbeat age). Rendering is a
// pure function of the latest job snapshot, the latest step sample of each
// rank and the recent losses, so it is tested without a coordinator;
// FollowJob (commands.cc) redraws it in place on a TTY and prints it every
// few seconds otherwise.
//
// Thread-safety: pure functions; LossHistory is a value (one owner, or the
// caller's lock).
#ifndef DGCA_CLI_WATCH_VIEW_H_
#define DGCA_CLI_WATCH_VIEW_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dgca/v1/job.pb.h"
#include "dgca/v1/metrics.pb.h"

namespace dgca {
namespace cli {

// Job-level loss per step: the mean over the ranks that reported the step.
// Keeps the last `capacity` steps.
class LossHistory {
 public:
  explicit LossHistory(size_t capacity = 64) : capacity_(capacity) {}
  void Add(const v1::StepMetrics& m);
  // The losses of the last `n` steps, oldest first.
  std::vector<double> Last(size_t n) const;

 private:
  size_t capacity_;
  std::map<int64_t, std::pair<double, int>> by_step_;  // step -> (sum, count)
};

// "[██████░░░░]": `width` cells, frac clamped to 0..1.
std::string ProgressBar(double frac, int width);

// One of ▁▂▃▄▅▆▇█ per value (the last `max_points`), scaled between their
// minimum and maximum; all equal -> all ▄. Non-finite values are skipped.
std::string Sparkline(const std::vector<double>& values, size_t max_points = 30);

struct WatchInput {
  v1::Job job;                           // latest snapshot (ranks, heartbeat ages)
  std::map<int, v1::StepMetrics> ranks;  // latest step sample per rank
  std::vector<double> losses;            // recent job-level losses, oldest first
};

// The whole screen, lines ending in '\n'. Example:
//   job j-000001-ab12 (demo)  RUNNING  elapsed 1m05s  ETA 30s
//   progress  [████████████░░░░░░░░░░░░░░░░░░]  40%  step 80/200
//   speed     512.0 samples/s  0.031 s/step
//   loss      3.2145  ▇▆▆▅▄▄▃▂▁  (last 9 steps)
//   comm      exposed 12.5% of step time, all-reduce 25.0%
//
//   RANK  NODE  STATE    STEP  LOSS    SAMPLES/S  COMM   HB_AGE
//   0     n1    running  80    3.2001  256.0      12.5%  0.4s
std::string RenderWatch(const WatchInput& in, int bar_width = 30);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_WATCH_VIEW_H_
