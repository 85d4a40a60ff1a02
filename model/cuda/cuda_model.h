// CudaDgcaModel: the DGCA-ReLM model (model/nn/model.h) on one GPU — the
// assembly of CudaPromptEncoder, CudaBert<T> and CudaHeads<T> in exactly the
// order of the CPU model (model/nn/model.cc), for T = float, bf16 or fp16.
//
// Status: run by ctest on the CUDA emulator (model/cuda_emu) and on an H200 (docs/benchmarks.md). model/cuda_check/model_check.h
// (dgca-model-check "cuda_model") compares a whole training step against
// the CPU model.
//
// Parameters: Create() builds the CPU model (dgca::DgcaModel::Create with
// max_batch 1, the same seq_len, seed, one thread) and copies its ParamStore:
// the GPU model's layout (names, order, offsets, weight-decay flags) and
// initial values are the CPU model's BY CONSTRUCTION (the CPU init does not
// depend on max_batch). The CPU model is then destroyed. The values live on
// the device in a DeviceParams (fp32 master, bf16 copy for bf16, fp32 grad).
//
// params(): a HOST ParamStore (the layout and a host copy). On this model
// its values and grads are NOT kept in sync with the device:
//   - params().grads() are valid only after DownloadGrads();
//   - params().values() are valid after Create() and after DownloadValues();
//     edits to them reach the device only through UploadValues().
// The trainer's device (model/cuda/cuda_train_device.h) buckets the
// gradients over DeviceParams::grad() itself.
//
// ForwardBackward / Forward / Predict: same contract as DgcaModel. The batch
// is validated on the host with the CPU model's rules (the code is a copy of
// model.cc's Validate/Trim, which is in an anonymous namespace there), the
// trimmed index arrays are packed into one pinned staging buffer and copied
// on a separate copy stream; the model stream waits for that copy with an
// event. Gradients are ADDED into DeviceParams::grad() (zero them with
// ZeroGrads()). The loss needs one host synchronization after the forward
// (the LossBreakdown is returned, and a non-finite loss stops before the
// backward touches any gradient, as on the CPU); the backward is then
// enqueued without host synchronization. on_grad_ready is called right
// after the work producing the gradients of [first, size()) has been
// ENQUEUED on the model stream (context's stream): they are complete for
// anything ordered after that stream's current point — the NCCL
// communicator records an event on it at StartAllReduce
// (NcclOptions::compute_stream) — but not yet for the host (host
// params().grads() are never updated here). So the GPU never idles
// between layers while buckets start. The indices are the CPU model's:
// head_first, each layer's first from the last layer down, body_first, 0.
// ForwardBackward returns with the backward possibly still running on the
// device (Synchronize() waits).
//
// Predict with fusion none and no heads takes the argmax of the logits on
// the host (a download of [T, V]; only for ReLM-only configs).
//
// Step(lr, options): AdamW (model/cuda/kernels.h; PyTorch semantics, as
// model/train/optimizer.h) over all parameters on the device from
// DeviceParams::grad(): decay only where ParamInfo::weight_decay, moments
// allocated (zeroed) on the first Step, the bf16 copy refreshed by the same
// kernel (bf16_out). Does not zero the gradients. Enqueued, no host sync.
// The moments are allocated (and zeroed) by Create.
//
// Thread-safety: not thread-safe; one host thread, work ordered on the
// context's stream.
#ifndef DGCA_MODEL_CUDA_CUDA_MODEL_H_
#define DGCA_MODEL_CUDA_CUDA_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/device_params.h"
#include "model/cuda/dtype.h"
#include "model/cuda/graph_cache.h"
#include "model/cuda/step_profiler.h"
#include "model/nn/model.h"
#include "model/train/optimizer.h"

namespace dgca {
namespace cuda {

// fp32: the CPU's arithmetic (checks). bf16 / fp16: activations and a
// 16-bit weight copy in that type, fp32 accumulation, fp32 master weights,
// gradients and moments. fp16 gradients need loss scaling against underflow:
// the caller multiplies grad_scale by the loss scale (the CUDA train device
// does, model/cuda/cuda_train_device.h) and unscales (UnscaleAndSquaredNorm).
using Precision = ::dgca::Precision;  // model/core/config.h: names and parsing there
DType PrecisionDType(Precision p);     // the activations' and weight copy's type

class CudaDgcaModel : public DgcaModel {
 public:
  // Validates the config like DgcaModel::Create, declares and initialises
  // the parameters as the CPU model does for `seed`, uploads them and binds
  // the GPU modules (all activations allocated here for max_batch x
  // seq_len). ctx is not owned and must outlive the model.
  static StatusOr<std::unique_ptr<CudaDgcaModel>> Create(const ModelConfig& cfg, int max_batch,
                                                         int seq_len, uint64_t seed,
                                                         Precision precision, const CudaContext* ctx);
  ~CudaDgcaModel() override = default;

  virtual Precision precision() const = 0;
  virtual DeviceParams* device_params() = 0;

  // Device grads -> params().grads() (waits for the device first).
  virtual Status DownloadGrads() = 0;
  // params().grads() -> device grads (tests: both optimizers from the same
  // gradients). Synchronous.
  virtual Status UploadGrads() = 0;
  // Device fp32 master -> params().values() (waits for the device first).
  virtual Status DownloadValues() = 0;
  // params().values() -> device master (and the bf16 copy). Synchronous.
  virtual Status UploadValues() = 0;
  // Device grads = 0 (enqueued).
  virtual Status ZeroGrads() = 0;
  // One AdamW update (see the header comment); increments optimizer_step().
  // The update uses grad x grad_scale (gradient clipping's coefficient; the
  // stored gradients are not changed).
  virtual Status Step(float lr, const AdamWOptions& options, float grad_scale = 1.0f) = 0;
  virtual int64_t optimizer_step() const = 0;
  // AdamW moments on the device (flat, the ParamStore layout; zero until the
  // first Step). Allocated by Create, so a broadcast can address them.
  virtual float* adam_m() = 0;
  virtual float* adam_v() = 0;
  // Moments and step count to / from the host (checkpoints). Synchronous;
  // the vectors must have total_numel() elements (INVALID_ARGUMENT).
  virtual Status DownloadMoments(std::vector<float>* m, std::vector<float>* v) = 0;
  virtual Status UploadMoments(const std::vector<float>& m, const std::vector<float>& v,
                               int64_t optimizer_step) = 0;
  // fp16 loss scaling: ForwardBackward multiplies its grad_scale by
  // `scale` (1 by default), so the gradients come out scaled.
  virtual void set_loss_scale(float scale) = 0;
  // With `inv_scale` (fp16), first multiplies every device gradient by it
  // and records whether any result is inf or NaN; then the sum of squares
  // of every gradient (the global L2 norm squared; meaningless when
  // found_inf). One wait for the device.
  struct GradStats {
    bool found_inf = false;
    double squared_norm = 0.0;
  };
  virtual StatusOr<GradStats> UnscaleAndSquaredNorm(std::optional<float> inv_scale) = 0;
  // The fp32 master was written on the device by someone else (a
  // broadcast): refreshes the bf16 copy. Enqueued.
  virtual Status MasterChanged() = 0;
  // Waits for all of the model's work; reports asynchronous faults.
  virtual Status Synchronize() = 0;
  // Deterministic mode: every gradient reduction in a fixed order, so two
  // runs give bit-identical weights (the embedding backward then sums each
  // column's rows in order: slower). Off by default: the embedding
  // gradients use atomicAdd (order-dependent last bits), as PyTorch does
  // unless torch.use_deterministic_algorithms(True).
  virtual void set_deterministic(bool deterministic) = 0;
  // The fused (flash-style) attention kernels for bf16/fp16 (on by default
  // where the shape allows; CudaBert::set_fused_attention). Off: the GEMM
  // version, which stores each layer's [B,nh,L,L] probabilities. Call
  // between steps. The old choice's buffers are freed first: when the new
  // ones do not fit (RESOURCE_EXHAUSTED), call again with the old choice.
  virtual Status set_fused_attention(bool on) = 0;
  virtual bool fused_attention() const = 0;
  // GEMM shapes cuBLASLt had no algorithm for (run by the slow
  // FallbackGemm, model/cuda/gemm.h); dgca-bench reports it.
  virtual size_t gemm_fallback_plans() const = 0;
  // GEMM shapes whose operands were less than 16-byte aligned (slower
  // cuBLASLt kernels; GemmRunner::underaligned_notes says which operand).
  virtual size_t gemm_underaligned_plans() const = 0;
  virtual std::vector<std::string> gemm_underaligned_notes() const = 0;
  // Phase marks and GEMM brackets of every step go to `profiler`
  // (step_profiler.h; null: off): zero grads, encoder fwd, mlm head fwd,
  // heads+loss fwd, loss read-back (the host sync), heads bwd, mlm head bwd,
  // encoder bwd, embed+prompt bwd, adamw. Not owned.
  virtual void set_profiler(StepProfiler* profiler) = 0;
  // CUDA graphs for the encoder (graph_cache.h): the prompt encoder +
  // embeddings + layers forward and the layers + embedding + prompt
  // backward of a micro-batch
  // whose batch size and trimmed length (a multiple of 8) were seen before
  // are captured once and replayed with one launch each; the MLM head and
  // the heads, whose shapes change with every batch's labelled rows, run
  // eagerly (a few dozen launches). Off by default. Never used with
  // per-layer GradReadyFn callbacks (data parallel overlap: the all-reduces
  // order themselves after each layer) or with a profiler.
  virtual void set_cuda_graphs(bool on) = 0;
  virtual GraphCache::Stats cuda_graph_stats() const = 0;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_MODEL_H_
