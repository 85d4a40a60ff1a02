// Text and JSON rendering for the CLI: progress lines, tables, durations,
// protobuf messages as JSON.
//
// Thread-safety: pure functions.
#ifndef DGCA_CLI_FORMAT_H_
#define DGCA_CLI_FORMAT_H_

#include <google/protobuf/message.h>

#include <map>
#include <string>
#include <vector>

#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "dgca/v1/metrics.pb.h"
#include "model/core/strings.h"

namespace dgca {
namespace cli {

// Job-level progress, from the ranks' latest step samples or a Job snapshot.
struct Progress {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  int64_t step = 0;
  int64_t total_steps = 0;
  double samples_per_second = 0;
  double loss = 0;
  bool has_loss = false;
  double eta_seconds = -1;  // < 0 = unknown
  double elapsed_seconds = 0;
};

// From a snapshot; per-rank samples (latest per rank) win when present:
// step = min over ranks, samples/s = sum, loss = mean, ETA from step time.
Progress ComputeProgress(const v1::Job& job, const std::map<int, v1::StepMetrics>& ranks);

// "RUNNING  step 37/200 [######..............]  18%  1234.5 samples/s  loss 3.2145  ETA 45s"
// `bar_width` 0 omits the bar.
std::string ProgressLine(const Progress& p, int bar_width = 20);

// "45s", "3m07s", "2h05m"; "?" when negative.
std::string FormatDuration(double seconds);

// Short state name: "RUNNING".
std::string StateName(v1::JobState s);
bool IsTerminal(v1::JobState s);

// The job's loss curve (Job.loss_curve: mean over ranks) as a text plot,
// `height` rows by `width` columns of '*' (each column the mean of the
// points that fall in it), the loss axis (the column means' range)
// labelled at the top and bottom rows, the step axis below; then one line: first, lowest and last loss
// with their steps. "" with fewer than two points.
std::string LossPlot(const v1::Job& job, int width = 60, int height = 10);

// Metric table "metric  value", sorted by name.
std::string EvalTable(const std::map<std::string, double>& eval);

// One JSON document, proto field names as in the .proto, enums by name,
// every field printed (defaults too). Ends with '\n'.
std::string ToJson(const google::protobuf::Message& m);

// "HH:MM:SS" UTC of a unix time in ms.
std::string ClockTime(int64_t unix_ms);

// "3m07s ago" for a unix time in ms before now; "-" for 0.
std::string Age(int64_t unix_ms);

// The first line of `message`, cut to `width` characters (UTF-8 aware) with
// "..." when anything was left out: a table cell that stays one row.
std::string OneLine(const std::string& message, size_t width = 80);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_FORMAT_H_
