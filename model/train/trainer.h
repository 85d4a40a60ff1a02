// Train(): the training loop every rank runs (and `dgca-worker train`).
// Data loader -> micro-steps (forward/backward, gradients accumulated) ->
// bucketed all-reduce (overlapped with backward on the last micro-step only)
// -> clip -> AdamW -> metrics -> periodic eval and checkpoints.
//
// Thread-safety: Train() runs on the caller's thread; the observer's methods
// are called on that thread.
#ifndef DGCA_MODEL_TRAIN_TRAINER_H_
#define DGCA_MODEL_TRAIN_TRAINER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/comm/communicator.h"
#include "model/core/config.h"
#include "model/core/status.h"

namespace dgca {

struct StepReport {
  int64_t step = 0;          // 1-based optimizer step just finished
  int64_t total_steps = 0;
  double loss = 0;           // mean over this step's micro-batches (this rank)
  std::map<std::string, double> loss_by_head;  // "fusion", "mft", "detector", "candidate"
  double learning_rate = 0;
  double grad_norm = 0;      // before clipping, after all-reduce
  double samples_per_second = 0;  // this rank, this step
  double step_seconds = 0;
  double data_wait_seconds = 0;
  double allreduce_seconds = 0;      // sum of all-reduce durations this step
  double exposed_comm_seconds = 0;   // time the step waited on communication
  double bus_bandwidth_bytes_per_second = 0;
  int64_t samples = 0;       // this rank, this step
  double eta_seconds = 0;
  // Overlap evidence (Communicator::Now() time base; -1 when nothing was
  // communicated this step): when the first bucket all-reduce started running
  // and when backward of the last micro-step ended.
  double first_allreduce_start = -1;
  double backward_end = -1;
  int buckets = 0;           // bucket all-reduces this step
};

struct EvalReport {
  int64_t step = 0;
  std::map<std::string, double> metrics;  // "sentence_correction_f1", ...
  int64_t samples = 0;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void OnStep(const StepReport&) {}
  virtual void OnEval(const EvalReport&) {}
  virtual void OnLog(const std::string& /*line*/) {}
  virtual void OnCheckpoint(const std::string& /*dir*/, int64_t /*step*/) {}
  // Polled once per step; true stops training with CANCELLED.
  virtual bool StopRequested() { return false; }
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  double samples_per_second = 0;        // whole run, this rank
  std::vector<double> losses;           // per step (this rank)
  std::map<std::string, double> eval;   // final evaluation
};

// `comm` may be null (world of one). `observer` may be null.
StatusOr<TrainResult> Train(const TrainConfig& config, Communicator* comm,
                            TrainObserver* observer);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_TRAINER_H_
