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
#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/status.h"
#include "model/train/train_device.h"
#include "model/train/train_phase.h"

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
  // fp16 dynamic loss scaling (0 when the device does not scale): the scale
  // after this step, and whether this step's update was skipped because the
  // gradients overflowed.
  double loss_scale = 0;
  bool overflow_skipped = false;
  // TrainDevice::attention_kernels(): "fused" | "gemm" | "" (CPU).
  std::string attention_kernels;
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
  // Every training micro-batch, before it runs: `step` is the 1-based
  // optimizer step, `micro` the 0-based index within its accumulation. Lets
  // a tool record the data order (model/core/batch_io.h) for a peer.
  virtual void OnBatch(const Batch& /*batch*/, int64_t /*step*/, int /*micro*/) {}
  virtual void OnCheckpoint(const std::string& /*dir*/, int64_t /*step*/) {}
  // Polled once per step; true stops training with CANCELLED.
  virtual bool StopRequested() { return false; }
  // Polled once per step: save a checkpoint after this step besides those
  // of checkpoint_every (0 = none). Every rank must return the same step
  // before reaching it (the coordinator picks it far enough ahead).
  virtual int64_t CheckpointAtStep() { return 0; }
  // Where Train() records its phase (model/train/train_phase.h: data wait,
  // forward, backward, all-reduce k/K, optimizer, checkpoint, eval), for
  // another thread to read; null = not recorded. Asked once, at the start.
  virtual PhaseTracker* phases() { return nullptr; }
};

// How many of the last steps the final loss averages (TrainResult).
constexpr int kFinalLossSteps = 10;

struct TrainResult {
  int64_t steps = 0;
  // The run's final loss: each rank's mean loss over its last
  // final_loss_steps steps (kFinalLossSteps, fewer when this run trained
  // fewer), averaged over the final_loss_ranks ranks by an all-reduce at
  // the end of training, so every rank holds the same value: the mean over
  // those steps of the global batch's loss. 0 with final_loss_steps 0 when
  // the run trained no step (resumed at or past its last).
  double final_loss = 0;
  int final_loss_steps = 0;
  int final_loss_ranks = 0;
  double samples_per_second = 0;        // whole run, this rank
  std::vector<double> losses;           // per step (this rank)
  std::map<std::string, double> eval;   // final evaluation
};

// `comm` may be null (world of one). `observer` may be null.
//
// Behaviour (model/train/trainer.cc):
// - Vocabulary: vocab_path; else checkpoint_dir/vocab.txt when present (a
//   resumed run keeps its ids); else built from train_path (and saved to
//   checkpoint_dir/vocab.txt by rank 0). model.vocab_size is set from it. A
//   loaded vocabulary must hold [PAD], [UNK], [CLS], [SEP] and [MASK]
//   (INVALID_ARGUMENT naming the file and the missing ones).
// - Confusion set (candidate head only): confusion_path JSON, else Unihan.
// - Start: resume_from (a step dir, or a dir with `latest`), else
//   checkpoint_dir/latest when present, else init_from (HF safetensors), else
//   random from `seed`. A checkpoint_dir holding step-NNNNNNNN directories
//   but no `latest` is FAILED_PRECONDITION (LatestCheckpoint), not a fresh
//   start. Then rank 0's weights and Adam moments are broadcast.
// - Step: zero grads; `accumulation` micro-batches with grad scale 1/k; the
//   bucketed average all-reduce runs only on the last one (overlapped with
//   its backward when `overlap`); clip (clip_norm > 0); AdamW at the
//   scheduled LR (HF warmup + constant/linear); StepReport; StopRequested()
//   -> CANCELLED (after any checkpoint of that step).
// - Checkpoints every checkpoint_every steps and at the end (rank 0 writes,
//   all ranks barrier); eval every eval_every steps and at the end: every
//   rank decodes the whole eval set (capped by max_eval_samples), no MFT.
//   Rank 0 records an eval at a checkpoint's step in its eval.json, and
//   after each checkpoint and each such record prunes checkpoint_dir to
//   keep_checkpoints (> 0; model/train/checkpoint_retention.h), logging
//   "pruned N checkpoints (...); kept ..."; a failed prune is a logged
//   warning, not an error.
// - Log lines (OnLog): data counts ("train data F: N lines, K kept, S
//   skipped (unequal lengths), E empty, T truncated to C chars"), init,
//   "training: rank r/W, steps a..b, global batch G (micro m x accumulation
//   k x ranks W), B gradient buckets, overlap on", progress about 20 times
//   per run and at least every 10 s ("step s/T loss L (fusion .. mft .. det
//   .. cand ..) lr .. gnorm .. X samples/s data D% comm C% exposed E% eta
//   1m05s"), "eval step s (...)", "checkpoint DIR", "done: ...".
// - TrainResult.final_loss: the mean over ranks (one all-reduce after the
//   final eval, every rank taking part) of each rank's mean loss over its
//   last kFinalLossSteps steps; "done: ..." logs it (model/core/strings.h
//   FinalLossText).
// - Device: the factory's (CPU by default); its Describe() is logged.
// Errors: bad config (INVALID_ARGUMENT naming the field), data and
// checkpoint errors as their readers report them, a non-finite loss
// (INTERNAL, naming the step), collective failures ("train: gradient
// all-reduce at step N: gloo allreduce failed on rank r of W (lost peer
// rank p, ...)").
StatusOr<TrainResult> Train(const TrainConfig& config, Communicator* comm,
                            TrainObserver* observer);

// The same on the device `make_device` builds (model/train/train_device.h;
// the overload above uses MakeCpuTrainDevice). With a GPU device the
// communicator must work on device memory (NCCL) or be a world of one.
StatusOr<TrainResult> Train(const TrainConfig& config, Communicator* comm,
                            TrainObserver* observer, const TrainDeviceFactory& make_device);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_TRAINER_H_
