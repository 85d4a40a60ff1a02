// TrainDevice: where one rank's model, gradients and optimizer state live —
// host memory (MakeCpuTrainDevice, here) or one GPU (model/cuda/
// cuda_train_device.h). Train() (trainer.h) creates one through a
// TrainDeviceFactory and drives every step through it:
//
//   ZeroGrads -> model()->ForwardBackward (GradientBuckets all-reduce the
//   slices of grad_buffer()) -> ClipGradNorm -> OptimizerStep -> FinishStep
//
// The flat buffers (grad_buffer, value_buffer, moment buffers) have the
// ParamStore layout and live in the memory the data-parallel communicator
// works on: host for Gloo, device for NCCL. So the trainer's bucketing,
// broadcast and averaging are the same code for both.
//
// Host views: params() is always the layout (names, offsets, weight-decay
// flags). Its values and the adam() moments are the live state on the CPU;
// on a GPU they are a copy that is current only after PullToHost(), and
// PushFromHost() copies them to the device (checkpoints, init_from).
//
// Thread-safety: not thread-safe; the training thread only.
#ifndef DGCA_MODEL_TRAIN_TRAIN_DEVICE_H_
#define DGCA_MODEL_TRAIN_TRAIN_DEVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "model/comm/communicator.h"
#include "model/core/config.h"
#include "model/core/status.h"
#include "model/nn/model.h"
#include "model/nn/params.h"
#include "model/train/loss_scaler.h"
#include "model/train/optimizer.h"

namespace dgca {


class TrainDevice {
 public:
  virtual ~TrainDevice() = default;

  // "cpu (2 threads)", "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 132 SMs), bf16,
  // fused attention".
  virtual std::string Describe() const = 0;
  virtual DgcaModel* model() = 0;
  virtual ParamStore& params() = 0;
  virtual AdamW& adam() = 0;

  // True when the flat buffers below are GPU memory (data parallel then
  // needs a communicator that works on device memory: NCCL).
  virtual bool device_memory() const = 0;
  // Flat fp32 buffers of total_numel() floats (see the header comment).
  virtual float* grad_buffer() = 0;
  virtual float* value_buffer() = 0;
  virtual float* moment1_buffer() = 0;
  virtual float* moment2_buffer() = 0;
  // value_buffer()/moment buffers were overwritten in place (a broadcast)
  // and the optimizer step count set: refresh whatever derives from them.
  virtual Status BuffersChanged(int64_t optimizer_step) = 0;

  virtual Status ZeroGrads() = 0;
  // The global L2 norm of the gradients (after the all-reduce). When
  // max_norm > 0 and the norm exceeds it, the next OptimizerStep uses the
  // gradients scaled by max_norm / (norm + 1e-6), as torch's
  // clip_grad_norm_ (the CPU scales them in place). A device with a loss
  // scaler first divides the gradients by the loss scale and checks them:
  // when any overflowed the norm is +inf and the next OptimizerStep skips.
  virtual StatusOr<double> ClipGradNorm(double max_norm) = 0;
  // AdamW at learning rate `lr`; increments adam().step() (after PullToHost
  // on a GPU). With a loss scaler: skips the update when the gradients
  // overflowed (last_step_skipped(); the step count does not advance), then
  // updates the scale (LossScaler::Update).
  virtual Status OptimizerStep(float lr) = 0;
  // fp16 dynamic loss scaling (loss_scaler.h): the device's scaler, or null
  // when it does not scale the loss (fp32, bf16, the CPU). The trainer
  // reports and checkpoints it.
  virtual LossScaler* loss_scaler() { return nullptr; }
  // Whether the last OptimizerStep skipped the update (fp16 overflow).
  virtual bool last_step_skipped() const { return false; }
  // Waits for the step's device work (so step times are honest) and reports
  // asynchronous device errors. No-op on the CPU. Train() also calls it
  // after the last micro-step's backward, so exposed communication is timed
  // from the end of the backward, not from its enqueueing.
  virtual Status FinishStep() = 0;

  // One line about how the run used the device, for the end of the log
  // ("" when there is nothing to say).
  virtual std::string Summary() const { return ""; }

  // The attention kernels the device runs now, "fused" or "gemm" (after any
  // startup timing and AdoptRankZeroChoices); "" where there is no choice
  // (the CPU). Reported with every step (StepReport.attention_kernels).
  virtual std::string attention_kernels() const { return ""; }

  // Data parallel: where the device chose something by timing it (the CUDA
  // device's train.attention auto), every rank takes rank 0's choice, so
  // all ranks run the same kernels (the same rounding, the same step time).
  // Called by Train() on every rank once the communicator is up, before the
  // weights are broadcast; `changed` says whether this rank switched.
  // Default: nothing was timed.
  virtual Status AdoptRankZeroChoices(Communicator* comm, bool* changed) {
    (void)comm;
    *changed = false;
    return OkStatus();
  }

  // All-reduces `count` floats of host memory over `comm` (a figure every
  // rank must agree on, e.g. the final loss): directly where the
  // communicator works on host memory; a device whose communicator works on
  // device memory (NCCL) stages them through it. Every rank must call it.
  virtual Status AllReduceHost(Communicator* comm, float* host, size_t count, ReduceOp op);

  virtual Status PullToHost() = 0;   // device values + moments + step -> params()/adam()
  virtual Status PushFromHost() = 0; // params()/adam() -> device
};

// Everything a device needs to build the rank's model.
struct TrainDeviceSpec {
  ModelConfig model;       // vocab_size already set from the vocabulary
  int micro_batch = 1;     // the model's max batch
  int seq_len = 128;
  uint64_t seed = 42;      // random init
  int threads = 1;         // CPU compute threads
  Precision precision = Precision::kFp32;
  bool deterministic = false;  // TrainConfig::deterministic
  bool cuda_graphs = true;     // TrainConfig::cuda_graphs
  AttentionKernels attention = AttentionKernels::kAuto;  // TrainConfig::attention
  // Under kAuto, the kernels ("fused" or "gemm") the checkpoint this run
  // resumes from ran (CheckpointState::attention_kernels): kept without
  // timing, so the resumed steps are the uninterrupted run's arithmetic.
  // "" = none (time both).
  std::string resumed_attention;
  AdamWOptions adam;
  LossScalerOptions loss_scaler;  // fp16 only
};

using TrainDeviceFactory =
    std::function<StatusOr<std::unique_ptr<TrainDevice>>(const TrainDeviceSpec&)>;

// The CPU device: DgcaModel::Create + AdamW in host memory. Precision must
// be fp32 (INVALID_ARGUMENT naming the valid value otherwise).
StatusOr<std::unique_ptr<TrainDevice>> MakeCpuTrainDevice(const TrainDeviceSpec& spec);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_TRAIN_DEVICE_H_
