// The GPU TrainDevice (model/train/train_device.h): CudaDgcaModel with its
// fp32 master weights, gradients and AdamW moments on one device, driven by
// Train() through the same steps as the CPU.
//
// Status: run by ctest on the CUDA emulator (model/cuda_emu) and on an H200 (docs/benchmarks.md).
//
// - Precision: fp32 (the CPU arithmetic, for checks), bf16 or fp16 (16-bit
//   activations and weight copies, fp32 accumulation, master and moments).
//   fp16 adds dynamic loss scaling (model/train/loss_scaler.h, options from
//   TrainDeviceSpec::loss_scaler): the model's backward is seeded with
//   grad_scale x scale; ClipGradNorm divides the all-reduced gradients by
//   the scale and checks them, in the same device round trip as the norm
//   (one host sync); an overflow skips the AdamW update and backs the
//   scale off.
// - Buffers: grad_buffer/value_buffer/moments are DEVICE pointers: data
//   parallel needs a communicator on device memory (NCCL). Train() with
//   Gloo and this device would hand device pointers to Gloo: the factory
//   cannot see the communicator, so the caller (the rank) must pair them.
// - ClipGradNorm: one reduction on the device and one host sync; clipping
//   is applied inside the AdamW kernel (grad_scale), gradients unchanged.
// - FinishStep synchronizes the stream: step times include the device work.
// - PullToHost / PushFromHost: values (master), moments and the step count
//   to / from params()/adam() (checkpoints, init_from, resume).
//
// Thread-safety: the training thread only.
#ifndef DGCA_MODEL_CUDA_CUDA_TRAIN_DEVICE_H_
#define DGCA_MODEL_CUDA_CUDA_TRAIN_DEVICE_H_

#include <functional>
#include <memory>

#include "model/core/status.h"
#include "model/cuda/attention_tune.h"
#include "model/cuda/cuda_context.h"
#include "model/train/train_device.h"

namespace dgca {
namespace cuda {

// A factory for Train(): builds the model on `ctx`'s device and stream.
// `ctx` is shared so the caller can give the same stream to the NCCL
// communicator (NcclOptions::compute_stream) before training starts; it
// must stay alive as long as the device.
//
// train.attention (TrainDeviceSpec::attention) is applied when the device is
// built. kAuto where the fused kernels take the shape: both versions are
// timed at the spec's micro-batch and seq_len by `timer` (empty: TimeAttention
// with 2 warm-up and 7 timed rounds) and the faster kept (PreferFused); the
// device line (Describe) says which and both times. The fused kernels are
// kept untimed in deterministic runs, and kept when the timing or the GEMM
// version's buffers run out of memory (RESOURCE_EXHAUSTED) or the timer
// rejects the shape; any other timing error fails the build (the context may
// be unusable). A resumed run (TrainDeviceSpec::resumed_attention) keeps its
// checkpoint's kernels untimed (the fused when the GEMM version's buffers do
// not fit). Data parallel: Train() then makes every rank take rank 0's
// choice (AdoptRankZeroChoices: one flag broadcast, reached by every rank
// whose spec is auto, whatever its own timing did).
using AttentionTimer =
    std::function<StatusOr<AttentionTiming>(const CudaContext& ctx, DType t, int B, int L, int H, int nh)>;
TrainDeviceFactory CudaTrainDeviceFactory(std::shared_ptr<const CudaContext> ctx, AttentionTimer timer = nullptr);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_TRAIN_DEVICE_H_
