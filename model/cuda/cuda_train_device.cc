#include "model/cuda/cuda_train_device.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/comm/communicator.h"
#include "model/cuda/attention_tune.h"
#include "model/cuda/cuda_model.h"

namespace dgca {
namespace cuda {
namespace {

// A failure the fused kernels can carry on after: out of memory, or a
// shape the timer does not take. Anything else may have broken the context.
bool Recoverable(const Status& s) {
  return s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kInvalidArgument;
}

// What ApplyAttention chose: the note for the log's device line ("" when
// nothing was timed or chosen), and whether the ranks must agree on it.
// `agree` depends only on the spec (auto, a shape the fused kernels take,
// not deterministic), the same on every rank: every rank then reaches
// AdoptRankZeroChoices' broadcast, also one whose own timing failed (a
// collective some ranks skip would hang the others).
struct AttentionChoice {
  std::string note;
  bool agree = false;
};

// Switches `model` to the GEMM attention. When that version's buffers do
// not fit (a recoverable error), switches back to the fused kernels and
// returns false with *why the error.
StatusOr<bool> SwitchToGemm(CudaDgcaModel* model, Status* why) {
  Status s = model->set_fused_attention(false);
  if (s.ok()) return true;
  if (!Recoverable(s)) return s;
  DGCA_RETURN_IF_ERROR(model->set_fused_attention(true));
  *why = s;
  return false;
}

// spec.attention on the built model (CudaTrainDeviceFactory says how).
StatusOr<AttentionChoice> ApplyAttention(const TrainDeviceSpec& spec, Precision p, const CudaContext& ctx,
                                     const AttentionTimer& timer, CudaDgcaModel* model) {
  DGCA_RETURN_IF_ERROR(model->set_fused_attention(spec.attention != AttentionKernels::kGemm));
  if (spec.attention != AttentionKernels::kAuto || !model->fused_attention()) return AttentionChoice{};
  if (spec.deterministic) return AttentionChoice{"attention auto: fused, not timed (deterministic run)"};
  // A resumed run keeps the kernels its checkpoint's run ran (agree: ranks
  // that did not find the checkpoint time, then take rank 0's).
  if (spec.resumed_attention == "fused")
    return AttentionChoice{"attention auto: fused, as the resumed checkpoint's run (not timed)", true};
  Status no_fit;
  if (spec.resumed_attention == "gemm") {
    DGCA_ASSIGN_OR_RETURN(bool gemm, SwitchToGemm(model, &no_fit));
    if (!gemm)
      return AttentionChoice{"attention auto: fused; the resumed checkpoint's run had the GEMM version, whose "
                             "buffers did not fit (" + no_fit.ToString() + ")",
                             true};
    return AttentionChoice{"attention auto: GEMM, as the resumed checkpoint's run (not timed)", true};
  }
  const DType t = PrecisionDType(p);
  const int B = spec.micro_batch, L = spec.seq_len, H = spec.model.hidden, nh = spec.model.heads;
  StatusOr<AttentionTiming> timing =
      timer ? timer(ctx, t, B, L, H, nh)
            : TimeAttention(ctx, t, B, L, H, nh, /*warmup=*/2, /*reps=*/7, spec.model.attention_dropout);
  if (!timing.ok()) {
    if (!Recoverable(timing.status()))
      return Status(timing.status().code(), "timing the attention kernels: " + timing.status().message());
    return AttentionChoice{"attention auto: fused, the timing failed (" + timing.status().ToString() + ")", true};
  }
  const std::string timed = DescribeTiming(*timing);
  if (PreferFused(*timing)) return AttentionChoice{"attention auto: fused kept (" + timed + ")", true};
  DGCA_ASSIGN_OR_RETURN(bool gemm, SwitchToGemm(model, &no_fit));
  if (!gemm)
    return AttentionChoice{
        "attention auto: fused kept, the faster GEMM version's buffers did not fit (" + no_fit.ToString() + "; " +
            timed + ")",
        true};
  return AttentionChoice{"attention auto: GEMM chosen (" + timed + ")", true};
}


class CudaTrainDevice : public TrainDevice {
 public:
  // `scaler`: the fp16 loss scaler (empty for fp32 and bf16).
  CudaTrainDevice(std::shared_ptr<const CudaContext> ctx, std::unique_ptr<CudaDgcaModel> model,
                  const AdamWOptions& aopt, bool deterministic, std::optional<LossScaler> scaler,
                  AttentionChoice attention)
      : ctx_(std::move(ctx)),
        model_(std::move(model)),
        aopt_(aopt),
        adam_(&model_->params(), aopt),
        deterministic_(deterministic),
        scaler_(std::move(scaler)),
        attention_(std::move(attention)) {}

  std::string Describe() const override {
    return "cuda:" + std::to_string(ctx_->device()) + " " + ctx_->description() + ", " +
           PrecisionName(model_->precision()) + (model_->fused_attention() ? ", fused attention" : "") +
           (deterministic_ ? ", deterministic" : "") + (attention_.note.empty() ? "" : "; " + attention_.note);
  }
  // The ranks' attention timings differ a little; rank 0's choice wins,
  // so every rank runs the same kernels (one flag broadcast over NCCL).
  Status AdoptRankZeroChoices(Communicator* comm, bool* changed) override {
    *changed = false;
    if (!attention_.agree || comm->world_size() <= 1) return OkStatus();
    DeviceArray<float> flag;
    DGCA_RETURN_IF_ERROR(flag.Upload({model_->fused_attention() ? 1.0f : 0.0f}));
    DGCA_RETURN_IF_ERROR(comm->Broadcast(flag.get(), 1, 0));
    std::vector<float> v;
    DGCA_RETURN_IF_ERROR(flag.Download(&v));
    const bool fused = v[0] > 0.5f;
    if (fused == model_->fused_attention()) return OkStatus();
    if (Status s = model_->set_fused_attention(fused); !s.ok()) {
      return Status(s.code(), std::string("taking rank 0's attention kernels (") + (fused ? "fused" : "GEMM") +
                                  "): " + s.message());
    }
    attention_.note += std::string("; rank 0 kept ") + (fused ? "the fused kernels" : "GEMM") + ", adopted";
    *changed = true;
    return OkStatus();
  }
  Status AllReduceHost(Communicator* comm, float* host, size_t count, ReduceOp op) override {
    if (comm->world_size() <= 1) return OkStatus();
    // NCCL reduces device memory: the values go through a small device
    // buffer (once per run: the final loss).
    DeviceArray<float> buf;
    DGCA_RETURN_IF_ERROR(buf.Upload(std::vector<float>(host, host + count)));
    DGCA_RETURN_IF_ERROR(comm->AllReduce(buf.get(), count, op));
    std::vector<float> v;
    DGCA_RETURN_IF_ERROR(buf.Download(&v));
    std::copy(v.begin(), v.begin() + count, host);
    return OkStatus();
  }
  std::string attention_kernels() const override { return model_->fused_attention() ? "fused" : "gemm"; }
  DgcaModel* model() override { return model_.get(); }
  ParamStore& params() override { return model_->params(); }
  AdamW& adam() override { return adam_; }
  bool device_memory() const override { return true; }
  float* grad_buffer() override { return model_->device_params()->grad(); }
  float* value_buffer() override { return model_->device_params()->master(); }
  float* moment1_buffer() override { return model_->adam_m(); }
  float* moment2_buffer() override { return model_->adam_v(); }
  Status BuffersChanged(int64_t optimizer_step) override {
    // Moments written in place keep the device's step count in line.
    DGCA_RETURN_IF_ERROR(model_->MasterChanged());
    adam_.set_step(optimizer_step);
    if (optimizer_step != model_->optimizer_step()) {
      DGCA_RETURN_IF_ERROR(model_->DownloadMoments(&adam_.m(), &adam_.v()));
      DGCA_RETURN_IF_ERROR(model_->UploadMoments(adam_.m(), adam_.v(), optimizer_step));
    }
    return OkStatus();
  }
  Status ZeroGrads() override {
    clip_scale_ = 1.0f;
    found_inf_ = false;
    // The scaler is the one record of the scale (a resume restores it);
    // the model's backward takes it from there every step.
    if (scaler_) model_->set_loss_scale(static_cast<float>(scaler_->scale()));
    return model_->ZeroGrads();
  }
  StatusOr<double> ClipGradNorm(double max_norm) override {
    // fp16: the all-reduced gradients are scale x the true ones: divide
    // and check them, with the norm, in one device round trip.
    std::optional<float> inv_scale;
    if (scaler_) inv_scale = static_cast<float>(1.0 / scaler_->scale());
    DGCA_ASSIGN_OR_RETURN(CudaDgcaModel::GradStats g, model_->UnscaleAndSquaredNorm(inv_scale));
    found_inf_ = g.found_inf;
    if (found_inf_) return std::numeric_limits<double>::infinity();
    const double norm = std::sqrt(g.squared_norm);
    clip_scale_ = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
    return norm;
  }
  Status OptimizerStep(float lr) override {
    if (!found_inf_) {
      DGCA_RETURN_IF_ERROR(model_->Step(lr, aopt_, clip_scale_));
      adam_.set_step(model_->optimizer_step());
    }
    if (scaler_) scaler_->Update(found_inf_);
    return OkStatus();
  }
  LossScaler* loss_scaler() override { return scaler_ ? &*scaler_ : nullptr; }
  std::string Summary() const override {
    const GraphCache::Stats s = model_->cuda_graph_stats();
    const int64_t passes = s.eager + s.captured + s.replayed;
    if (passes == 0) return "";
    return "CUDA graphs: " + std::to_string(s.replayed) + " of " + std::to_string(passes) +
           " encoder forward/backward passes replayed, " + std::to_string(s.captured) + " captured, " +
           std::to_string(s.eager) + " without a graph (new batch size or length, " +
           std::to_string(s.capture_failures) + " failed captures)";
  }
  bool last_step_skipped() const override { return found_inf_; }
  Status FinishStep() override { return model_->Synchronize(); }
  Status PullToHost() override {
    DGCA_RETURN_IF_ERROR(model_->DownloadValues());
    DGCA_RETURN_IF_ERROR(model_->DownloadMoments(&adam_.m(), &adam_.v()));
    adam_.set_step(model_->optimizer_step());
    return OkStatus();
  }
  Status PushFromHost() override {
    DGCA_RETURN_IF_ERROR(model_->UploadValues());
    return model_->UploadMoments(adam_.m(), adam_.v(), adam_.step());
  }

 private:
  std::shared_ptr<const CudaContext> ctx_;
  std::unique_ptr<CudaDgcaModel> model_;
  AdamWOptions aopt_;
  AdamW adam_;  // host copy of the moments (checkpoints); not used to step
  float clip_scale_ = 1.0f;
  bool deterministic_;
  std::optional<LossScaler> scaler_;
  bool found_inf_ = false;  // this step's gradients overflowed (fp16): its update is skipped
  AttentionChoice attention_;  // how train.attention auto chose (ApplyAttention)
};

}  // namespace

TrainDeviceFactory CudaTrainDeviceFactory(std::shared_ptr<const CudaContext> ctx, AttentionTimer timer) {
  return [ctx, timer](const TrainDeviceSpec& spec) -> StatusOr<std::unique_ptr<TrainDevice>> {
    if (ctx == nullptr) return InvalidArgumentError("cuda train device: no CUDA context");
    const Precision p = spec.precision;
    std::optional<LossScaler> scaler;
    if (p == Precision::kFp16) {
      DGCA_ASSIGN_OR_RETURN(LossScaler s, LossScaler::Create(spec.loss_scaler));
      scaler = s;
    }
    DGCA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDgcaModel> model,
                          CudaDgcaModel::Create(spec.model, spec.micro_batch, spec.seq_len,
                                                spec.seed, p, ctx.get()));
    model->set_deterministic(spec.deterministic);
    model->set_cuda_graphs(spec.cuda_graphs);
    DGCA_ASSIGN_OR_RETURN(AttentionChoice attention, ApplyAttention(spec, p, *ctx, timer, model.get()));
    return std::unique_ptr<TrainDevice>(new CudaTrainDevice(ctx, std::move(model), spec.adam, spec.deterministic,
                                                            std::move(scaler), std::move(attention)));
  };
}

}  // namespace cuda
}  // namespace dgca
