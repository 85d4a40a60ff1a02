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
  // The job's final loss (Job.final_loss) once it has one, else the last
  // step's loss (mean over ranks); loss_is_final says which.
  double loss = 0;
  bool has_loss = false;
  bool loss_is_final = false;
  int final_loss_steps = 0;
  double eta_seconds = -1;  // < 0 = unknown
  double elapsed_seconds = 0;
};

// From a snapshot; per-rank samples (latest per rank) win when present:
// step = min over ranks, samples/s = sum, loss = mean, ETA from step time.
// A job's final loss wins over both. Elapsed: from the job's start (its
// first RUNNING; its creation when it never ran) to its end, or to now.
Progress ComputeProgress(const v1::Job& job, const std::map<int, v1::StepMetrics>& ranks);

// "RUNNING  step 37/200 [######..............]  18%  1234.5 samples/s  last-step loss 3.2145  ETA 45s";
// an ended job's "... final loss 3.1002 (last 10 steps)". `bar_width` 0
// omits the bar.
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
// every field printed (defaults too), two-space indented. Unlike proto3
// JSON (which the gRPC API's JSON mapping keeps), 64-bit integer fields
// (int64, uint64 and their sint/fixed forms) are JSON numbers, not strings,
// wherever they are (nested messages, repeated fields, map values; map
// keys stay strings). Ends with '\n'.
std::string ToJson(const google::protobuf::Message& m);

// "HH:MM:SS" UTC of a unix time in ms.
std::string ClockTime(int64_t unix_ms);

// A unix time in ms as `dgca list` shows it, UTC: "14:05" (hour:minute)
// when it falls on the same UTC day as `now_unix_ms`, else "11-28 14:05"
// (month-day hour:minute); "-" for 0.
std::string ShortTime(int64_t unix_ms, int64_t now_unix_ms);
// "2026-11-28 14:05:09 UTC"; "-" for 0.
std::string FullTime(int64_t unix_ms);

// The cells of `dgca list` (docs/cli.md), each "-" when there is nothing
// to say:
// LOSS: the final loss ("4.0367") once the job has one, else the last
// step's loss marked "4.1913*" (LastStepMark explains the mark).
std::string LossCell(const v1::Job& job);
constexpr char kLastStepMark[] =
    "* the last step's loss (mean over ranks): the job has no final loss (yet)";
// ELAPSED: ended_unix_ms (or now, while active) - started_unix_ms.
std::string ElapsedCell(const v1::Job& job, int64_t now_unix_ms);
// EXIT: "-" while active; "0" for a job that succeeded; the failing rank's
// "3 (rank 1)" or "SIGKILL (rank 0)" ("unknown (rank 0)" for an adopted
// rank that ended without a status); "-" for a job that ended with no rank
// failing (cancelled, planning failed, a stall).
std::string ExitCell(const v1::Job& job);
// "SIGKILL", "SIGSEGV", ...; "signal N" for others.
std::string SignalAbbrev(int sig);
// Human bytes in binary units: "412 MiB", "1.5 GiB", "980 KiB"; "-" for <= 0.
std::string HumanBytes(double bytes);

// `dgca status`'s "ran" line: "started 2026-11-28 14:05:09 UTC, ended
// 2026-11-28 14:06:01 UTC after 52s, exit 0, peak memory 412 MiB" (while
// active "running for 52s, exit -"; "not started" before its first run).
std::string StatusRunLine(const v1::Job& job, int64_t now_unix_ms);
// `dgca status`'s "loss" line: "final 4.0367 (mean of the last 10 steps
// over 2 ranks)", or "4.1913 at step 40: the last step's (mean over ranks);
// ..." while there is no final loss; "" before the first step.
std::string StatusLossLine(const v1::Job& job);

// "3m07s ago" for a unix time in ms before now; "-" for 0.
std::string Age(int64_t unix_ms);

// The first line of `message`, cut to `width` characters (UTF-8 aware) with
// "..." when anything was left out: a table cell that stays one row.
std::string OneLine(const std::string& message, size_t width = 80);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_FORMAT_H_
