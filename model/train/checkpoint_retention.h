// Checkpoint retention (train.keep_checkpoints, docs/job-spec.md): which
// step directories of a checkpoint DIR (model/train/checkpoint.h) to keep,
// and deleting the others.
//
// The rule, for keep = N > 0:
//   - the N newest step directories by step number are kept, and the one
//     DIR/latest names is always one of them (it is the resume point: the
//     coordinator and Train() resume from it);
//   - in addition (not counted in N), the one with the best eval metric:
//     kRetentionMetric, higher is better, the newer on a tie, among the step
//     directories whose eval at their own step was recorded
//     (DIR/step-N/eval.json, WriteCheckpointEval). An eval at a step with no
//     checkpoint describes no directory and is not considered;
//   - every other step directory is deleted, oldest first.
// N = 0 keeps everything. A directory is deleted by first renaming it to
// DIR/.step-NNNNNNNN.pruning and then removing that: a prune cut short (the
// rank killed mid-way) leaves a name no reader takes for a checkpoint
// (LatestCheckpoint lists step-NNNNNNNN only, `latest` never names it), and
// the next prune removes it. Temporary directories of saves
// (.step-NNNNNNNN.tmp.PID) are never touched: one may be being written.
//
// Thread-safety: free functions; callers serialise access to one DIR (rank 0
// is its only writer).
#ifndef DGCA_MODEL_TRAIN_CHECKPOINT_RETENTION_H_
#define DGCA_MODEL_TRAIN_CHECKPOINT_RETENTION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/core/status.h"

namespace dgca {

// The metric the best checkpoint is chosen by: character-level correction
// F1, the number docs/benchmarks.md and docs/model.md compare runs by.
inline constexpr const char* kRetentionMetric = "char_correction_f1";

// A step directory's eval record, beside model.safetensors: {"step": N,
// "metrics": {"char_correction_f1": 0.45, ...}}. Not part of the checkpoint
// LoadCheckpoint reads (a checkpoint without one loads the same).
inline constexpr const char* kCheckpointEvalFile = "eval.json";

struct CheckpointEntry {
  int64_t step = 0;
  bool has_metric = false;  // an eval at this step was recorded
  double metric = 0;        // kRetentionMetric then
};

struct RetentionPlan {
  std::vector<int64_t> newest;  // ascending: the N (latest's step among them)
  int64_t best = -1;            // the best by its metric; -1: no eval recorded
  std::vector<int64_t> keep;    // ascending: newest and best
  std::vector<int64_t> prune;   // ascending: deleted oldest first
};

// The rule above over `entries` (any order, steps distinct). `latest_step`
// is the step DIR/latest names (-1: none among the entries). keep <= 0
// keeps everything.
RetentionPlan PlanRetention(const std::vector<CheckpointEntry>& entries, int64_t latest_step,
                            int keep);

// Writes `step_dir`/eval.json (under a temporary name, renamed) with the
// eval at that step. Non-finite metrics are left out.
Status WriteCheckpointEval(const std::string& step_dir, int64_t step,
                           const std::map<std::string, double>& metrics);

// `metric` from `step_dir`/eval.json: NOT_FOUND when there is no such file
// (no eval at that step) or no such metric in it; DATA_LOSS naming the file
// when it is not what WriteCheckpointEval writes (read up to 64 KiB).
StatusOr<double> ReadCheckpointMetric(const std::string& step_dir, const std::string& metric);

// The step directories of DIR (step-NNNNNNNN as CheckpointDirName names
// them; nothing else) with the kRetentionMetric each recorded, ascending by
// step. An unreadable eval.json leaves its entry without a metric. INTERNAL
// naming DIR when it cannot be listed.
StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir);

struct PruneReport {
  std::vector<std::string> pruned;  // step directory names deleted, oldest first
  std::vector<std::string> kept;    // the newest N step directory names, ascending
  std::string best;                 // the best by kRetentionMetric ("" none), kept too
  double best_metric = 0;
  int leftovers = 0;                // .step-*.pruning of an earlier, cut-short prune removed
  // One log line, "" when nothing was deleted: "pruned 2 checkpoints
  // (step-00000020, step-00000040); kept step-00000060, step-00000080, best
  // step-00000010 by char_correction_f1 (0.4530)"; when the best is one of
  // the newest: "...; kept step-00000060, step-00000080 (step-00000080 also
  // the best by char_correction_f1, 0.4530)"; with no eval recorded: "...;
  // kept ... (no checkpoint has an eval at its step to pick a best by
  // char_correction_f1)".
  std::string Summary() const;
};

// Deletes a directory tree (the default: std::filesystem::remove_all).
// Tests pass one that fails part-way, as a killed rank would.
using RemoveTreeFn = std::function<Status(const std::string& path)>;

// Applies the rule to DIR with keep = `keep` (<= 0: nothing is done).
// FAILED_PRECONDITION (naming DIR, nothing deleted) when DIR/latest cannot
// be read: without the resume point no directory is known to be safe to
// delete. A rename or removal that fails stops the prune with INTERNAL naming
// the path; what was deleted before stays deleted, nothing newer was touched.
StatusOr<PruneReport> PruneCheckpoints(const std::string& dir, int keep,
                                       const RemoveTreeFn& remove_tree = nullptr);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_CHECKPOINT_RETENTION_H_
