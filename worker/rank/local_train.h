// `dgca-worker train SPEC [--json]`: one process, no coordinator. Parses and
// validates the spec (problems -> "file:line:col: field: message" lines on
// stderr, exit 2), plans it for this node (the planner on the local topology;
// SimplePlan when the planner cannot), runs dgca::Train in-process with a
// local communicator, progress on stderr. With --json, ONE JSON document on
// stdout at the end:
//   {"final_loss":..., "steps":..., "samples_per_second":..., "seconds":...,
//    "eval": {"sentence_correction_f1": ..., ...}}
// final_loss is the trainer's (model/train/trainer.h TrainResult; docs/
// metrics.md "Final loss"): the mean loss over the last 10 steps (fewer when
// the run trained fewer), of this one process here.
// Exit codes: 0 trained, 1 training failed, 2 bad usage or invalid spec.
//
// Thread-safety: meant to be the only thing its process does.
#ifndef DGCA_WORKER_RANK_LOCAL_TRAIN_H_
#define DGCA_WORKER_RANK_LOCAL_TRAIN_H_

#include <map>
#include <string>

namespace dgca {

struct LocalTrainArgs {
  std::string spec_path;
  bool json = false;
  std::string topology_root = "/";
  // Optional overrides (0 / "" = from the spec): handy for smoke runs.
  long long steps = 0;
  std::string checkpoint_dir;
};

int RunLocalTrain(const LocalTrainArgs& args);

// The --json document for a finished run (exposed for tests).
std::string TrainResultJson(double final_loss, long long steps, double samples_per_second,
                            double seconds, const std::map<std::string, double>& eval);

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_LOCAL_TRAIN_H_
