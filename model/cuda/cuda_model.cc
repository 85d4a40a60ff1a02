// CudaDgcaModel (cuda_model.h): the GPU assembly of the DGCA-ReLM model,
// step for step the order of model/nn/model.cc. Checked on the CUDA
// emulator (model/cuda_emu) and on an H200 (docs/benchmarks.md).
#include "model/cuda/cuda_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/cuda_bert.h"
#include "model/cuda/cuda_heads.h"
#include "model/cuda/cuda_prompt_encoder.h"
#include "model/cuda/gemm.h"
#include "model/cuda/kernels.h"
#include "model/nn/batch_index.h"

namespace dgca {
namespace cuda {

DType PrecisionDType(Precision p) {
  switch (p) {
    case Precision::kBf16: return DType::kBF16;
    case Precision::kFp16: return DType::kF16;
    case Precision::kFp32: break;
  }
  return DType::kF32;
}

namespace {

// Pinned host memory, freed on destruction.
template <typename E>
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  Status Allocate(size_t n) {
    void* p = nullptr;
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p, std::max<size_t>(1, n) * sizeof(E)),
                                    "cudaMallocHost " + std::to_string(n * sizeof(E)) + " bytes"));
    p_ = static_cast<E*>(p);
    n_ = n;
    return OkStatus();
  }
  E* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  E* p_ = nullptr;
  size_t n_ = 0;
};

class Event {
 public:
  Event() = default;
  ~Event() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Status Create() {
    return CudaStatus(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate");
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

template <typename T>
class CudaDgcaModelImpl final : public CudaDgcaModel {
 public:
  CudaDgcaModelImpl(const ModelConfig& cfg, int max_batch, int seq_len, Precision precision,
                    const CudaContext* ctx)
      : cfg_(cfg),
        max_batch_(max_batch),
        seq_len_(seq_len),
        max_rows_(BatchIndex::MaxRows(cfg, max_batch, seq_len)),
        precision_(precision),
        ctx_(ctx),
        gemm_(ctx),
        bert_(cfg, max_batch, seq_len, max_rows_),
        prompt_(cfg),
        heads_(cfg, max_rows_),
        heads_on_(cfg.detector || cfg.candidate),
        index_(cfg, max_batch, seq_len) {}

  ~CudaDgcaModelImpl() override {
    // Nothing may still read the staging buffers or write the device arrays.
    if (ctx_ != nullptr) cudaStreamSynchronize(ctx_->stream());
    if (copy_stream_ != nullptr) {
      cudaStreamSynchronize(copy_stream_);
      cudaStreamDestroy(copy_stream_);
    }
  }

  Status Init(uint64_t seed) {
    // The layout and initial values: the CPU model's own ParamStore.
    {
      DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DgcaModel> cpu,
                            DgcaModel::Create(cfg_, 1, seq_len_, seed, /*threads=*/1));
      host_ = cpu->params();
    }
    host_.ZeroGrads();
    DGCA_ASSIGN_OR_RETURN(dp_, DeviceParams::Create(&host_, kDType<T>));
    DGCA_RETURN_IF_ERROR(dp_->Upload(host_));
    DGCA_RETURN_IF_ERROR(dp_->ZeroGrads(stream()));
    DGCA_RETURN_IF_ERROR(AllocateMoments());
    DGCA_RETURN_IF_ERROR(bert_.Bind(host_, dp_.get(), ctx_, &gemm_));
    set_deterministic(false);  // the fast default; see cuda_model.h
    DGCA_RETURN_IF_ERROR(prompt_.Bind(host_, dp_.get(), ctx_, &gemm_));
    if (heads_on_) DGCA_RETURN_IF_ERROR(heads_.Bind(host_, dp_.get(), ctx_, &gemm_));
    wte_ = bert_.word_embeddings_index();

    const size_t N = static_cast<size_t>(max_batch_) * seq_len_;
    const size_t R = static_cast<size_t>(max_rows_);
    const int K = heads_on_ && heads_.candidate_enabled() ? heads_.top_k() : 0;
    // One staging layout for every int32 input (offsets in elements).
    off_ids_ = 0;
    off_mask_ = off_ids_ + N;
    off_types_ = off_mask_ + N;
    off_slots_ = off_types_ + N;
    off_rows_ = off_slots_ + N;
    off_targets_ = off_rows_ + R;
    off_src_ = off_targets_ + R;
    off_cand_ = off_src_ + R;
    // The rows' dropout keys, uint64 as int32 pairs at an even offset (the
    // device copy is 8-byte aligned there: cudaMalloc aligns the base).
    off_keys_ = (off_cand_ + R * static_cast<size_t>(K) + 1) / 2 * 2;
    staging_n_ = off_keys_ + 2 * static_cast<size_t>(max_batch_);
    DGCA_RETURN_IF_ERROR(staging_.Allocate(staging_n_));
    DGCA_RETURN_IF_ERROR(d_in_.Allocate(staging_n_));
    DGCA_RETURN_IF_ERROR(host_row_loss_.Allocate(R));
    DGCA_RETURN_IF_ERROR(host_heads_loss_.Allocate(1));
    DGCA_RETURN_IF_ERROR(row_loss_.Allocate(R));
    DGCA_RETURN_IF_ERROR(pred_.Allocate(R));
    DGCA_RETURN_IF_ERROR(dh_heads_.Allocate(R * cfg_.hidden));
    DGCA_RETURN_IF_ERROR(
        dprompt_.Allocate(static_cast<size_t>(std::max(1, 2 * cfg_.prompt_length)) * cfg_.hidden));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreate (copy stream)"));
    DGCA_RETURN_IF_ERROR(copied_.Create());
    DGCA_RETURN_IF_ERROR(consumed_.Create());
    // consumed_ must have been recorded once before the first copy waits on it.
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(consumed_.get(), stream()), "cudaEventRecord"));
    return Synchronize();
  }

  // ---- DgcaModel
  const ModelConfig& config() const override { return cfg_; }
  ParamStore& params() override { return host_; }

  StatusOr<LossBreakdown> ForwardBackward(const Batch& batch, float grad_scale,
                                          const GradReadyFn& on_grad_ready) override {
    return Run(batch, /*backward=*/true, grad_scale * loss_scale_, on_grad_ready);
  }

  StatusOr<LossBreakdown> Forward(const Batch& batch) override {
    return Run(batch, /*backward=*/false, 1.0f, GradReadyFn());
  }

  StatusOr<std::vector<int32_t>> Predict(const Batch& batch) override {
    DGCA_RETURN_IF_ERROR(index_.Check(batch, /*need_labels=*/false));
    DGCA_RETURN_IF_ERROR(UploadBatch(batch));
    SetDropout(false);
    Status s = RunPredict(batch);
    Status m = MarkConsumed();
    if (!s.ok()) return s;
    DGCA_RETURN_IF_ERROR(m);
    return pred_host_;
  }

 private:
  Status RunPredict(const Batch& batch) {
    pred_host_.clear();
    if (batch.batch_size == 0) return OkStatus();  // no slots either (Validate)
    DGCA_RETURN_IF_ERROR(RunEncoder(batch.batch_size));
    const int NS = batch.num_slots();
    const int V = cfg_.vocab_size;
    std::vector<int32_t>& pred = pred_host_;
    pred.assign(static_cast<size_t>(NS), 0);
    if (NS == 0) return OkStatus();
    DGCA_ASSIGN_OR_RETURN(T* z, bert_.MlmHeadForward(d_in_.get() + off_rows_, NS));
    if (heads_on_) {
      DGCA_RETURN_IF_ERROR(heads_.Predict(
          bert_.gathered(), z, dp_->weight<T>(wte_),
          heads_.candidate_enabled() ? d_in_.get() + off_cand_ : nullptr,
          d_in_.get() + off_src_, NS, V, pred_.get()));
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(pred.data(), pred_.get(), sizeof(int32_t) * NS,
                                                      cudaMemcpyDeviceToHost, stream()),
                                      "cudaMemcpyAsync predictions"));
      DGCA_RETURN_IF_ERROR(Synchronize());
    } else {
      // ReLM-only config: argmax on the host (ties to the smallest id, as
      // cpu::ArgmaxRows).
      std::vector<T> zh(static_cast<size_t>(NS) * V);
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(zh.data(), z, sizeof(T) * zh.size(),
                                                      cudaMemcpyDeviceToHost, stream()),
                                      "cudaMemcpyAsync logits"));
      DGCA_RETURN_IF_ERROR(Synchronize());
      for (int t = 0; t < NS; ++t) {
        int best = 0;
        float bv = ToF(zh[static_cast<size_t>(t) * V]);
        for (int v = 1; v < V; ++v) {
          const float x = ToF(zh[static_cast<size_t>(t) * V + v]);
          if (x > bv) bv = x, best = v;
        }
        pred[t] = best;
      }
    }
    return OkStatus();
  }

 public:
  // ---- CudaDgcaModel
  Precision precision() const override { return precision_; }
  DeviceParams* device_params() override { return dp_.get(); }

  Status DownloadGrads() override {
    DGCA_RETURN_IF_ERROR(Synchronize());
    return dp_->DownloadGrads(&host_);
  }
  Status UploadGrads() override {
    DGCA_RETURN_IF_ERROR(Synchronize());
    const size_t n = static_cast<size_t>(host_.total_numel());
    DGCA_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(dp_->grad(), host_.grads(), sizeof(float) * n, cudaMemcpyHostToDevice),
        "CudaDgcaModel::UploadGrads cudaMemcpy"));
    return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize (UploadGrads)");
  }
  Status DownloadValues() override {
    DGCA_RETURN_IF_ERROR(Synchronize());
    return dp_->DownloadValues(&host_);
  }
  Status UploadValues() override {
    DGCA_RETURN_IF_ERROR(Synchronize());
    return dp_->Upload(host_);
  }
  Status ZeroGrads() override {
    DGCA_RETURN_IF_ERROR(Mark("zero grads"));
    return dp_->ZeroGrads(stream());
  }

  Status AllocateMoments() {
    const int64_t n = host_.total_numel();
    if (m_.size() != 0 || n == 0) return OkStatus();
    DGCA_RETURN_IF_ERROR(m_.Allocate(static_cast<size_t>(n)));
    DGCA_RETURN_IF_ERROR(v_.Allocate(static_cast<size_t>(n)));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(m_.get(), 0, sizeof(float) * n, stream()),
                                    "cudaMemsetAsync adam m"));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(v_.get(), 0, sizeof(float) * n, stream()),
                                    "cudaMemsetAsync adam v"));
    DGCA_RETURN_IF_ERROR(found_inf_.Allocate(1));
    DGCA_RETURN_IF_ERROR(UploadDecayRuns());
    return norm_sq_.Allocate(1 + kSumSquaresMaxBlocks);  // the norm, then SumSquares' partials
  }
  // The maximal runs of consecutive tensors with the same weight-decay flag,
  // as AdamW's DecayRuns: run k ends where run k+1's first tensor begins
  // (the alignment gap before it goes with run k), the last at total_numel.
  Status UploadDecayRuns() {
    std::vector<int64_t> ends;
    bool first = true;
    for (int i = 0; i < host_.size(); ++i) {
      const bool decay = host_.info(i).weight_decay;
      if (i == 0) {
        first = decay;
      } else if (decay != host_.info(i - 1).weight_decay) {
        ends.push_back(host_.info(i).offset);
      }
    }
    ends.push_back(host_.total_numel());
    DGCA_RETURN_IF_ERROR(decay_run_ends_.Upload(ends));
    decay_runs_.run_ends = decay_run_ends_.get();
    decay_runs_.runs = static_cast<int>(ends.size());
    decay_runs_.first_decays = first;
    return OkStatus();
  }
  float* adam_m() override { return m_.get(); }
  float* adam_v() override { return v_.get(); }

  Status DownloadMoments(std::vector<float>* m, std::vector<float>* v) override {
    const size_t n = static_cast<size_t>(host_.total_numel());
    if (m->size() != n || v->size() != n)
      return InvalidArgumentError("CudaDgcaModel::DownloadMoments: host vectors have " +
                                  std::to_string(m->size()) + "/" + std::to_string(v->size()) +
                                  " elements, expected " + std::to_string(n));
    DGCA_RETURN_IF_ERROR(Synchronize());
    if (n == 0) return OkStatus();
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(m->data(), m_.get(), n * sizeof(float), cudaMemcpyDeviceToHost),
                                    "cudaMemcpy adam m"));
    return CudaStatus(cudaMemcpy(v->data(), v_.get(), n * sizeof(float), cudaMemcpyDeviceToHost),
                      "cudaMemcpy adam v");
  }
  Status UploadMoments(const std::vector<float>& m, const std::vector<float>& v,
                       int64_t optimizer_step) override {
    const size_t n = static_cast<size_t>(host_.total_numel());
    if (m.size() != n || v.size() != n)
      return InvalidArgumentError("CudaDgcaModel::UploadMoments: host vectors have " +
                                  std::to_string(m.size()) + "/" + std::to_string(v.size()) +
                                  " elements, expected " + std::to_string(n));
    DGCA_RETURN_IF_ERROR(Synchronize());
    if (n > 0) {
      // On the model stream and waited for: a plain cudaMemcpy from pageable
      // memory may return before the data lands, and the legacy stream does
      // not order against the model's non-blocking stream.
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(m_.get(), m.data(), n * sizeof(float),
                                                      cudaMemcpyHostToDevice, stream()),
                                      "cudaMemcpyAsync adam m"));
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(v_.get(), v.data(), n * sizeof(float),
                                                      cudaMemcpyHostToDevice, stream()),
                                      "cudaMemcpyAsync adam v"));
      DGCA_RETURN_IF_ERROR(Synchronize());
    }
    step_ = optimizer_step;
    return OkStatus();
  }
  void set_loss_scale(float scale) override { loss_scale_ = scale; }
  StatusOr<GradStats> UnscaleAndSquaredNorm(std::optional<float> inv_scale) override {
    const int64_t n = host_.total_numel();
    GradStats out;
    if (n == 0) return out;
    int32_t found = 0;
    if (inv_scale) {
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(found_inf_.get(), 0, sizeof(int32_t), stream()),
                                      "cudaMemsetAsync found_inf"));
      DGCA_RETURN_IF_ERROR(UnscaleCheck(stream(), dp_->grad(), n, *inv_scale, found_inf_.get()));
      DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(&found, found_inf_.get(), sizeof(int32_t),
                                                      cudaMemcpyDeviceToHost, stream()),
                                      "cudaMemcpyAsync found_inf"));
    }
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(norm_sq_.get(), 0, sizeof(double), stream()),
                                    "cudaMemsetAsync norm"));
    DGCA_RETURN_IF_ERROR(SumSquares(stream(), norm_sq_.get(), dp_->grad(), n, norm_sq_.get() + 1));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(&out.squared_norm, norm_sq_.get(), sizeof(double),
                                                    cudaMemcpyDeviceToHost, stream()),
                                    "cudaMemcpyAsync norm"));
    DGCA_RETURN_IF_ERROR(Synchronize());
    out.found_inf = found != 0;
    return out;
  }
  Status MasterChanged() override {
    if constexpr (std::is_same_v<T, float>) return OkStatus();
    return dp_->RefreshCopy(stream());
  }

  Status Step(float lr, const AdamWOptions& o, float grad_scale) override {
    DGCA_RETURN_IF_ERROR(Mark("adamw"));
    ++step_;
    // One launch over the flat buffer; weight decay by the runs of tensors
    // with the same flag (decay_runs_). The alignment gaps between tensors
    // hold zeros (weights, gradients, moments), which AdamW keeps at zero.
    // The forward's 16-bit copy is refreshed by the same kernel.
    using H = std::conditional_t<std::is_same_v<T, float>, bf16, T>;  // no copy for fp32
    H* copy = nullptr;
    if constexpr (!std::is_same_v<T, float>) copy = dp_->copy<T>();
    return AdamW(stream(), dp_->master(), m_.get(), v_.get(), dp_->grad(), copy, host_.total_numel(), lr, o.beta1,
                 o.beta2, o.eps, o.weight_decay, step_, grad_scale, decay_runs_);
  }
  int64_t optimizer_step() const override { return step_; }
  Status Synchronize() override { return ctx_->Synchronize(); }
  size_t gemm_fallback_plans() const override { return gemm_.fallback_plans(); }
  size_t gemm_underaligned_plans() const override { return gemm_.underaligned_plans(); }
  std::vector<std::string> gemm_underaligned_notes() const override { return gemm_.underaligned_notes(); }
  void set_cuda_graphs(bool on) override {
    // Two segments per (batch size, trimmed length), three with dropout
    // (the evaluation forward is a graph of its own then): room for every
    // length bucket of seq_len (multiples of 8, and seq_len itself) and a
    // short last batch. An executable graph of a few hundred nodes is small.
    const size_t per_shape = DropoutActive(cfg_) ? 3 : 2;
    const size_t capacity = per_shape * ((static_cast<size_t>(seq_len_) + 7) / 8 + 2);
    if (on && graphs_ == nullptr) graphs_ = std::make_unique<GraphCache>(stream(), capacity);
    if (!on) graphs_.reset();
  }
  GraphCache::Stats cuda_graph_stats() const override {
    return graphs_ != nullptr ? graphs_->stats() : GraphCache::Stats();
  }
  void set_profiler(StepProfiler* profiler) override {
    profiler_ = profiler;
    gemm_.set_profiler(profiler);
  }
  void set_deterministic(bool d) override {
    bert_.set_deterministic(d);
    heads_.set_deterministic(d);
    if (graphs_ != nullptr) graphs_->Clear();  // the graphs hold the other kernels
  }
  Status set_fused_attention(bool on) override {
    if (graphs_ != nullptr) graphs_->Clear();  // they hold the other kernels and buffers
    return bert_.set_fused_attention(on);
  }
  bool fused_attention() const override { return bert_.fused_attention(); }

 private:
  cudaStream_t stream() const { return ctx_->stream(); }
  Status Mark(const char* phase) { return profiler_ != nullptr ? profiler_->Mark(phase) : OkStatus(); }


  // As CpuDgcaModel::Trim, writing the [B, L_eff] arrays, the remapped rows,
  // the targets, source ids and candidates into the pinned staging buffer,
  // then one H2D copy on the copy stream. The model stream waits for it
  // (copied_), and the copy waits for the previous batch's consumers
  // (consumed_, recorded at the end of every Run/Predict's enqueue).
  // drop_keys: the batch's dropout keys are needed (a training step with
  // dropout); otherwise they are not copied.
  Status UploadBatch(const Batch& b, bool drop_keys = false) {
    const int B = b.batch_size, L = b.seq_len;
    // The batch's length (BatchIndex::TrimmedLength), rounded up to a
    // multiple of 8 (within L): the 16-bit GEMM attention
    // uses L_eff as the probabilities' leading dimension and L_eff^2 as
    // their batch stride, and cuBLASLt's tensor-core kernels want 16-byte
    // aligned rows (with an odd L_eff the alignment drops to 2 bytes); the
    // multiples of 8 are also the CUDA-graph length buckets. The extra
    // positions are padding (mask 0): no real token attends to them and
    // their gradients are exactly zero, so the result is the CPU model's,
    // which trims to the exact length.
    const int le = index_.TrimmedLength(b, /*multiple=*/8);
    L_eff_ = le;
    // The staging buffer may still be read by the previous copy.
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(copied_.get()), "cudaEventSynchronize"));
    int32_t* s = staging_.get();
    for (int r = 0; r < B; ++r)
      for (int pos = 0; pos < le; ++pos) {
        const size_t src = static_cast<size_t>(r) * L + pos, dst = static_cast<size_t>(r) * le + pos;
        s[off_ids_ + dst] = b.input_ids[src];
        s[off_mask_ + dst] = b.attention_mask[src];
        s[off_types_ + dst] = index_.token_types()[src];
        s[off_slots_ + dst] = index_.prompt_slots()[src];
      }
    const int R = static_cast<int>(index_.rows().size());
    for (int i = 0; i < R; ++i) {
      const int32_t row = index_.rows()[i];
      s[off_rows_ + i] = (row / L) * le + row % L;
      s[off_targets_ + i] = index_.targets()[i];
    }
    const int NS = b.num_slots();
    const bool src_ids = heads_on_ && static_cast<int>(b.slot_source_id.size()) == NS;
    for (int t = 0; t < NS; ++t) s[off_src_ + t] = src_ids ? b.slot_source_id[t] : 0;
    const bool cand = heads_on_ && heads_.candidate_enabled();
    if (cand) std::memcpy(s + off_cand_, b.candidates.data(), sizeof(int32_t) * b.candidates.size());
    const bool keys = drop_keys && b.dropout_keys.size() == static_cast<size_t>(B);
    if (keys) std::memcpy(s + off_keys_, b.dropout_keys.data(), sizeof(uint64_t) * B);
    // Copy only what is used: the four [B*le] arrays are at fixed offsets
    // (stride N), so copy each prefix; the row arrays likewise.
    const size_t n_in = static_cast<size_t>(B) * le;
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(copy_stream_, consumed_.get(), 0),
                                    "cudaStreamWaitEvent (copy waits for the previous step)"));
    auto copy = [&](size_t off, size_t n) -> Status {
      if (n == 0) return OkStatus();
      return CudaStatus(cudaMemcpyAsync(d_in_.get() + off, s + off, sizeof(int32_t) * n,
                                        cudaMemcpyHostToDevice, copy_stream_),
                        "cudaMemcpyAsync batch");
    };
    DGCA_RETURN_IF_ERROR(copy(off_ids_, n_in));
    DGCA_RETURN_IF_ERROR(copy(off_mask_, n_in));
    DGCA_RETURN_IF_ERROR(copy(off_types_, n_in));
    DGCA_RETURN_IF_ERROR(copy(off_slots_, n_in));
    DGCA_RETURN_IF_ERROR(copy(off_rows_, static_cast<size_t>(R)));
    DGCA_RETURN_IF_ERROR(copy(off_targets_, static_cast<size_t>(R)));
    DGCA_RETURN_IF_ERROR(copy(off_src_, static_cast<size_t>(NS)));
    if (cand) DGCA_RETURN_IF_ERROR(copy(off_cand_, b.candidates.size()));
    if (keys) DGCA_RETURN_IF_ERROR(copy(off_keys_, 2 * static_cast<size_t>(B)));
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(copied_.get(), copy_stream_), "cudaEventRecord"));
    return CudaStatus(cudaStreamWaitEvent(stream(), copied_.get(), 0),
                      "cudaStreamWaitEvent (model waits for the batch copy)");
  }

  // The keys' device copy is what the kernels read (captured graphs too).
  void SetDropout(bool on) {
    DropoutSpec d;
    if (on) {
      d.keys = reinterpret_cast<const uint64_t*>(d_in_.get() + off_keys_);
      d.hidden = cfg_.hidden_dropout;
      d.attention = cfg_.attention_dropout;
    }
    dropout_on_ = on;
    bert_.set_dropout(d);
  }

  Status MarkConsumed() {
    return CudaStatus(cudaEventRecord(consumed_.get(), stream()), "cudaEventRecord");
  }

  Status RunEncoder(int B) {
    const T* prompt_rows = nullptr;
    if (prompt_.enabled()) {
      if constexpr (std::is_same_v<T, float>) {
        const float* p = nullptr;
        DGCA_RETURN_IF_ERROR(prompt_.Forward(&p));
        prompt_rows = p;
      } else {
        const T* p = nullptr;
        DGCA_RETURN_IF_ERROR(prompt_.ForwardAs<T>(&p));
        prompt_rows = p;
      }
    }
    const int32_t* in = d_in_.get();
    DGCA_RETURN_IF_ERROR(bert_.EmbedForward(in + off_ids_, in + off_types_,
                                            prompt_rows != nullptr ? in + off_slots_ : nullptr,
                                            prompt_rows, B, L_eff_));
    return bert_.EncoderForward(in + off_mask_, B, L_eff_);
  }

  // Tells the caller that the backward up to this point is enqueued (see
  // cuda_model.h: consumers order themselves after the stream; a host wait
  // here would idle the GPU between layers).
  Status Ready(const GradReadyFn& ready, int first) {
    if (ready) ready(first);
    return OkStatus();
  }

  StatusOr<LossBreakdown> Run(const Batch& b, bool backward, float grad_scale,
                              const GradReadyFn& ready) {
    const int NS = b.num_slots();
    const bool have_labels = !b.slot_target_id.empty() || !b.labels.empty();
    if (backward && !have_labels && NS > 0)
      return InvalidArgumentError("DgcaModel: ForwardBackward needs batch.labels or slot_target_id");
    DGCA_RETURN_IF_ERROR(index_.Check(b, /*need_labels=*/have_labels));
    // Training drops (the config's rates, the batch's keys); evaluation not.
    const bool drop = backward && DropoutActive(cfg_);
    if (drop) DGCA_RETURN_IF_ERROR(CheckDropoutKeys(cfg_, b));
    DGCA_RETURN_IF_ERROR(UploadBatch(b, drop));
    SetDropout(drop);
    Status s = RunForwardBackward(b, backward, grad_scale, ready, NS, have_labels);
    // Whatever happened, later copies must not overwrite inputs still in use.
    Status m = MarkConsumed();
    if (!s.ok()) return s;
    DGCA_RETURN_IF_ERROR(m);
    return lb_;
  }

  Status RunForwardBackward(const Batch& b, bool backward, float grad_scale,
                            const GradReadyFn& ready, int NS, bool have_labels) {
    if (b.batch_size == 0) {
      // An empty batch (Validate allows it; it has no slots or MFT rows):
      // no device work, zero loss, gradients unchanged; the callbacks in
      // the CPU model's order.
      lb_ = LossBreakdown();
      if (!backward || !ready) return OkStatus();
      ready(bert_.head_first_index());
      for (int l = cfg_.layers - 1; l >= 0; --l) ready(bert_.layer_first_index(l));
      ready(bert_.body_first_index());
      ready(0);
      return OkStatus();
    }
    StepShape sh;
    sh.B = b.batch_size;
    sh.R = static_cast<int>(index_.rows().size());
    sh.NS = NS;
    sh.have_labels = have_labels;
    sh.backward = backward;
    sh.grad_scale = grad_scale;
    // CUDA graphs where they fit (cuda_model.h): not with per-layer
    // gradient callbacks (their consumers order themselves after each
    // layer's work) nor while profiling (the marks are host calls).
    sh.graphs = graphs_ != nullptr && !ready && profiler_ == nullptr;
    DGCA_RETURN_IF_ERROR(EnqueueForward(sh));
    // One host synchronization: the loss decides whether the backward runs.
    DGCA_RETURN_IF_ERROR(Mark("loss read-back"));
    LossBreakdown lb;
    lb.target_slots = NS;
    const int R = sh.R, M = R - NS;
    if (sh.compute_loss()) {
      DGCA_RETURN_IF_ERROR(Synchronize());
      if (sh.fusion_term()) {
        if (heads_on_) {
          const DeviceHeadLosses& hl = *host_heads_loss_.get();
          lb.fusion = hl.fusion;
          lb.detector = hl.detector;
          lb.candidate = hl.candidate;
          lb.total = hl.total;
        } else {
          double sum = 0;
          for (int t = 0; t < NS; ++t) sum += host_row_loss_.get()[t];
          lb.fusion = sum / NS;
          lb.total = lb.fusion;
        }
      }
      if (M > 0) {
        double sum = 0;
        for (int i = NS; i < R; ++i) sum += host_row_loss_.get()[i];
        lb.mft = sum / M;
        lb.total += lb.mft;
      }
    }
    if (!std::isfinite(lb.total))
      return InternalError("DgcaModel: the loss is not finite (" + std::to_string(lb.total) + ")");
    lb_ = lb;
    if (!backward) return OkStatus();
    return EnqueueBackward(sh, ready);
  }

  // One micro-batch's shape, as the enqueue functions need it.
  struct StepShape {
    int B = 0, R = 0, NS = 0;
    bool have_labels = false, backward = false;
    float grad_scale = 1.0f;
    bool graphs = false;  // the encoder segments run as CUDA graphs
    bool compute_loss() const { return have_labels || R > NS; }
    bool fusion_term() const { return have_labels && NS > 0; }
  };

  // CUDA graphs cover the encoder segments of a step: prompt encoder +
  // embeddings + layers forward, and layers + embedding + prompt backward. Their device work
  // depends only on the batch size and the trimmed length (L_eff, a
  // multiple of 8), which repeat from batch to batch in training, while the
  // head rows and target slots change with every batch: the heads and the
  // MLM head (a few dozen kernels) run eagerly. The graph key is what the
  // captured kernels' host arguments depend on: segment, B, L_eff.
  // With dropout the segments hold more kernels: their own keys (a
  // training forward and an evaluation forward of one shape differ).
  enum Segment : int64_t { kEncoderForward = 1, kEncoderBackward = 2, kDropoutSegment = 16 };
  Status RunSegment(const StepShape& sh, Segment seg, const std::function<Status()>& enqueue) {
    if (!sh.graphs) return enqueue();
    return graphs_->Run({seg + (dropout_on_ ? kDropoutSegment : 0), sh.B, L_eff_}, enqueue);
  }

  // The forward's device work: encoder (a graph segment when sh.graphs),
  // MLM head, heads / cross-entropy (eager), and the copies of the losses
  // into pinned host memory. Only enqueues.
  Status EnqueueForward(const StepShape& sh) {
    const int NS = sh.NS, R = sh.R, M = R - NS;
    const int V = cfg_.vocab_size;
    const float grad_scale = sh.grad_scale;
    DGCA_RETURN_IF_ERROR(Mark("encoder fwd"));
    if (sh.graphs) {
      // A replay calls none of CudaBert's forward methods: leave its host
      // state as they would have.
      bert_.SetEncoderShape(sh.B, L_eff_, prompt_.enabled());
    }
    DGCA_RETURN_IF_ERROR(RunSegment(sh, kEncoderForward, [&] { return RunEncoder(sh.B); }));
    const int32_t* in = d_in_.get();
    T* z = nullptr;
    if (sh.compute_loss() || sh.backward) {
      DGCA_RETURN_IF_ERROR(Mark("mlm head fwd"));
      DGCA_ASSIGN_OR_RETURN(z, bert_.MlmHeadForward(in + off_rows_, R));
    }
    DGCA_RETURN_IF_ERROR(Mark("heads+loss fwd"));
    T* dz = sh.backward ? z : nullptr;  // gradients overwrite the logits in place

    // Fusion / ReLM term on the target slots.
    if (sh.fusion_term()) {
      if (heads_on_) {
        DGCA_RETURN_IF_ERROR(heads_.Forward(
            bert_.gathered(), z, dp_->weight<T>(wte_),
            heads_.candidate_enabled() ? in + off_cand_ : nullptr, in + off_src_,
            in + off_targets_, NS, V, /*out=*/nullptr));
        DGCA_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpyAsync(host_heads_loss_.get(), heads_.device_losses(),
                            sizeof(DeviceHeadLosses), cudaMemcpyDeviceToHost, stream()),
            "cudaMemcpyAsync head losses"));
      } else {
        DGCA_RETURN_IF_ERROR(CrossEntropy(stream(), row_loss_.get(), dz, z, in + off_targets_, NS,
                                          V, grad_scale / static_cast<float>(NS)));
      }
    }
    // MFT term on the masked source positions (rows NS..R).
    if (M > 0) {
      const size_t off = static_cast<size_t>(NS) * V;
      DGCA_RETURN_IF_ERROR(CrossEntropy(stream(), row_loss_.get() + NS,
                                        dz != nullptr ? dz + off : nullptr, z + off,
                                        in + off_targets_ + NS, M, V,
                                        grad_scale / static_cast<float>(M)));
    }
    const int first_row = sh.fusion_term() && !heads_on_ ? 0 : NS;
    const int n_rows = R - first_row;
    if (n_rows > 0) {
      DGCA_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(host_row_loss_.get() + first_row, row_loss_.get() + first_row,
                          sizeof(float) * n_rows, cudaMemcpyDeviceToHost, stream()),
          "cudaMemcpyAsync row losses"));
    }
    return OkStatus();
  }

  // The backward, in reverse declaration order (as model.cc); `ready` gets
  // each stage's first parameter index once its work is enqueued.
  Status EnqueueBackward(const StepShape& sh, const GradReadyFn& ready) {
    const int NS = sh.NS, H = cfg_.hidden;
    T* dz = bert_.logits();  // the forward wrote the gradients over the logits
    const T* extra = nullptr;
    DGCA_RETURN_IF_ERROR(Mark("heads bwd"));
    if (heads_on_ && NS > 0) {
      DGCA_RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(dh_heads_.get(), 0, sizeof(T) * static_cast<size_t>(NS) * H, stream()),
          "cudaMemsetAsync dh_heads"));
      DGCA_RETURN_IF_ERROR(heads_.Backward(sh.grad_scale, dh_heads_.get(), dz, dp_->grad(wte_)));
      extra = dh_heads_.get();
    }
    DGCA_RETURN_IF_ERROR(Mark("mlm head bwd"));
    DGCA_RETURN_IF_ERROR(bert_.MlmHeadBackward(dz, extra, NS));
    DGCA_RETURN_IF_ERROR(Ready(ready, bert_.head_first_index()));
    return RunSegment(sh, kEncoderBackward, [&]() -> Status {
      DGCA_RETURN_IF_ERROR(Mark("encoder bwd"));
      DGCA_RETURN_IF_ERROR(bert_.EncoderBackward(
          [&](int l) -> Status { return Ready(ready, bert_.layer_first_index(l)); }));
      DGCA_RETURN_IF_ERROR(Mark("embed+prompt bwd"));
      float* dprompt = nullptr;
      if (prompt_.enabled()) {
        DGCA_RETURN_IF_ERROR(CudaStatus(
            cudaMemsetAsync(dprompt_.get(), 0, sizeof(float) * dprompt_.size(), stream()),
            "cudaMemsetAsync dprompt"));
        dprompt = dprompt_.get();
      }
      DGCA_RETURN_IF_ERROR(bert_.EmbedBackward(dprompt));
      DGCA_RETURN_IF_ERROR(Ready(ready, bert_.body_first_index()));
      if (prompt_.enabled()) DGCA_RETURN_IF_ERROR(prompt_.Backward(dprompt));
      return Ready(ready, 0);
    });
  }

  ModelConfig cfg_;
  int max_batch_, seq_len_, max_rows_;
  Precision precision_;
  const CudaContext* ctx_;
  GemmRunner gemm_;
  ParamStore host_;  // layout + host copy; must outlive dp_ and the modules
  std::unique_ptr<DeviceParams> dp_;
  CudaBert<T> bert_;
  CudaPromptEncoder prompt_;
  CudaHeads<T> heads_;
  bool heads_on_;
  int wte_ = 0;

  // The checked batch (token types, prompt slots, labelled rows, targets).
  BatchIndex index_;
  bool dropout_on_ = false;  // the current step drops (SetDropout)
  int L_eff_ = 1;
  LossBreakdown lb_;
  std::vector<int32_t> pred_host_;

  // Inputs: pinned staging -> d_in_ (same offsets).
  size_t off_ids_ = 0, off_mask_ = 0, off_types_ = 0, off_slots_ = 0, off_rows_ = 0,
         off_targets_ = 0, off_src_ = 0, off_cand_ = 0, off_keys_ = 0, staging_n_ = 0;
  PinnedArray<int32_t> staging_;
  DeviceArray<int32_t> d_in_;
  cudaStream_t copy_stream_ = nullptr;
  Event copied_, consumed_;

  // Losses.
  DeviceArray<float> row_loss_;  // [max_rows] per-row CE (fusion-none slots, MFT rows)
  PinnedArray<float> host_row_loss_;
  PinnedArray<DeviceHeadLosses> host_heads_loss_;
  DeviceArray<int32_t> pred_;
  // Backward scratch.
  DeviceArray<T> dh_heads_;     // [max_rows, H]
  DeviceArray<float> dprompt_;  // [2P, H]

  // AdamW state (fp32, flat like the params).
  DeviceArray<float> m_, v_;
  DeviceArray<int64_t> decay_run_ends_;  // AdamW's weight-decay runs (UploadDecayRuns)
  DecayRuns decay_runs_;
  int64_t step_ = 0;
  DeviceArray<double> norm_sq_;  // UnscaleAndSquaredNorm's norm accumulator, then SumSquares' partials
  DeviceArray<int32_t> found_inf_;  // UnscaleAndSquaredNorm's overflow flag
  StepProfiler* profiler_ = nullptr;
  std::unique_ptr<GraphCache> graphs_;  // null: no CUDA graphs
  float loss_scale_ = 1.0f;
};

}  // namespace

StatusOr<std::unique_ptr<CudaDgcaModel>> CudaDgcaModel::Create(const ModelConfig& cfg,
                                                               int max_batch, int seq_len,
                                                               uint64_t seed, Precision precision,
                                                               const CudaContext* ctx) {
  if (ctx == nullptr) return InvalidArgumentError("CudaDgcaModel: no CUDA context");
  // The config rules are the CPU model's (checked again by its Create).
  if (max_batch < 1) return InvalidArgumentError("CudaDgcaModel: max_batch must be >= 1");
  if (seq_len < 1 || seq_len > cfg.max_position)
    return InvalidArgumentError("CudaDgcaModel: seq_len " + std::to_string(seq_len) +
                                " must be in [1, max_position=" +
                                std::to_string(cfg.max_position) + "]");
  auto make = [&](auto tag) -> StatusOr<std::unique_ptr<CudaDgcaModel>> {
    using T = decltype(tag);
    auto m = std::make_unique<CudaDgcaModelImpl<T>>(cfg, max_batch, seq_len, precision, ctx);
    DGCA_RETURN_IF_ERROR(m->Init(seed));
    return std::unique_ptr<CudaDgcaModel>(std::move(m));
  };
  switch (precision) {
    case Precision::kBf16: return make(bf16());
    case Precision::kFp16: return make(__half());
    case Precision::kFp32: break;
  }
  return make(float());
}

}  // namespace cuda
}  // namespace dgca
