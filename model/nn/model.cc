// DgcaModel on the CPU: the assembly of Bert (model/nn/bert.h), the ReLM
// prompt encoder (prompt_encoder.h) and the DGCA heads (heads.h).
//
// Parameter declaration order (= forward order; backward completes them in
// exactly the reverse order, which GradReadyFn and the gradient buckets rely
// on):
//   0                bert.embeddings.word_embeddings.weight  (tied MLM decoder:
//                    its gradient comes from the head at the start of backward
//                    AND from the lookup at the end, so it is complete last)
//   1 ..             prompt.*  (prompt encoder; none for kind none)
//   ..               bert.embeddings.{position,token_type}_embeddings, LayerNorm
//   ..               bert.encoder.layer.0 .. layer.N-1
//   ..               cls.predictions.{transform.*, bias}
//   ..               detector.*, candidate.*, fusion.*  (enabled heads only)
// on_grad_ready is called with: the first cls.predictions index (heads and
// MLM head done), then each layer's first index from the last layer down,
// then the position-embedding index, then 0.
//
// Loss: fusion term on the target slots (plain MLM cross-entropy = ReLM
// when no DGCA head is on; DgcaHeads otherwise), plus the MLM cross-entropy
// mean over MFT positions (mft_labels != -100), plus the weighted detector
// and candidate terms. The MLM head runs only on the gathered target-slot and
// MFT rows, never on all B*L positions. Columns that are padding in every row
// are dropped before the encoder runs (exact; see Trim).
#include <algorithm>
#include <cmath>
#include <string>

#include "model/cpu/ops.h"
#include "model/cpu/thread_pool.h"
#include "model/nn/batch_index.h"
#include "model/nn/bert.h"
#include "model/nn/heads.h"
#include "model/nn/model.h"
#include "model/nn/prompt_encoder.h"

namespace dgca {
namespace {

Status ValidateConfig(const ModelConfig& c, int max_batch, int seq_len, int threads) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("DgcaModel: " + m); };
  if (c.vocab_size < 1) return bad("vocab_size must be >= 1, got " + std::to_string(c.vocab_size));
  if (c.hidden < 1 || c.heads < 1 || c.hidden % c.heads != 0)
    return bad("hidden (" + std::to_string(c.hidden) + ") must be a positive multiple of heads (" +
               std::to_string(c.heads) + ")");
  if (c.layers < 0) return bad("layers must be >= 0, got " + std::to_string(c.layers));
  if (c.ffn < 1) return bad("ffn must be >= 1, got " + std::to_string(c.ffn));
  if (c.type_vocab < 1) return bad("type_vocab must be >= 1");
  if (c.prompt_length < 0) return bad("prompt_length must be >= 0");
  if (c.candidate && c.candidate_top_k < 1) return bad("candidate_top_k must be >= 1");
  if (!ValidDropout(c.hidden_dropout))
    return bad("hidden_dropout must be in [0, 1), got " + std::to_string(c.hidden_dropout));
  if (!ValidDropout(c.attention_dropout))
    return bad("attention_dropout must be in [0, 1), got " + std::to_string(c.attention_dropout));
  if (max_batch < 1) return bad("max_batch must be >= 1, got " + std::to_string(max_batch));
  if (seq_len < 1 || seq_len > c.max_position)
    return bad("seq_len " + std::to_string(seq_len) + " must be in [1, max_position=" +
               std::to_string(c.max_position) + "]");
  if (threads < 1) return bad("threads must be >= 1, got " + std::to_string(threads));
  return OkStatus();
}

}  // namespace

Status CheckDropoutKeys(const ModelConfig& c, const Batch& b) {
  if (!DropoutActive(c) || b.dropout_keys.size() == static_cast<size_t>(b.batch_size)) return OkStatus();
  return InvalidArgumentError("DgcaModel: dropout is on (hidden " + std::to_string(c.hidden_dropout) +
                              ", attention " + std::to_string(c.attention_dropout) + ") and batch.dropout_keys has " +
                              std::to_string(b.dropout_keys.size()) + " entries; it needs one per row (" +
                              std::to_string(b.batch_size) + ")");
}

namespace {

uint64_t Mix(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class CpuDgcaModel final : public DgcaModel {
 public:
  CpuDgcaModel(const ModelConfig& cfg, int max_batch, int seq_len, int threads)
      : cfg_(cfg),
        max_batch_(max_batch),
        seq_len_(seq_len),
        max_rows_(BatchIndex::MaxRows(cfg, max_batch, seq_len)),  // sizes the logits buffer
        pool_(threads),
        ctx_{&pool_},
        bert_(cfg, max_batch, seq_len, max_rows_),
        prompt_(cfg),
        heads_(cfg, max_rows_),
        heads_on_(cfg.detector || cfg.candidate),
        index_(cfg, max_batch, seq_len) {}

  Status Init(uint64_t seed) {
    DGCA_RETURN_IF_ERROR(bert_.DeclareWordEmbeddings(&store_));
    DGCA_RETURN_IF_ERROR(prompt_.Declare(&store_));
    DGCA_RETURN_IF_ERROR(bert_.DeclareBody(&store_));
    DGCA_RETURN_IF_ERROR(bert_.DeclareMlmHead(&store_));
    if (heads_on_) DGCA_RETURN_IF_ERROR(heads_.Declare(&store_));
    store_.Finalize();
    DGCA_RETURN_IF_ERROR(bert_.Bind(&store_));
    DGCA_RETURN_IF_ERROR(prompt_.Bind(&store_));
    if (heads_on_) DGCA_RETURN_IF_ERROR(heads_.Bind(&store_));
    bert_.InitParams(Mix(seed, 0));
    if (prompt_.enabled()) prompt_.InitParams(Mix(seed, 1));
    if (heads_on_) heads_.InitParams(Mix(seed, 2));
    const size_t N = static_cast<size_t>(max_batch_) * seq_len_;
    types_.assign(N, 0);
    slots_.assign(N, -1);
    ids_.assign(N, 0);
    mask_.assign(N, 0);
    rows_.reserve(N);
    dprompt_.assign(static_cast<size_t>(std::max(1, 2 * cfg_.prompt_length)) * cfg_.hidden, 0.0f);
    dh_heads_.assign(N * cfg_.hidden, 0.0f);
    return OkStatus();
  }

  const ModelConfig& config() const override { return cfg_; }
  ParamStore& params() override { return store_; }

  StatusOr<LossBreakdown> ForwardBackward(const Batch& batch, float grad_scale,
                                          const GradReadyFn& on_grad_ready) override {
    return Run(batch, /*backward=*/true, grad_scale, on_grad_ready);
  }

  StatusOr<LossBreakdown> Forward(const Batch& batch) override {
    return Run(batch, /*backward=*/false, 1.0f, GradReadyFn());
  }

  StatusOr<std::vector<int32_t>> Predict(const Batch& batch) override {
    DGCA_RETURN_IF_ERROR(CheckAndTrim(batch, /*need_labels=*/false));
    DGCA_RETURN_IF_ERROR(SetDropout(batch, /*train=*/false));
    RunEncoder(batch);
    const int T = batch.num_slots();
    std::vector<int32_t> pred(static_cast<size_t>(T), 0);
    if (T == 0) return pred;
    float* z = bert_.MlmHeadForward(ctx_, rows_.data(), T);  // rows_ starts with the slots
    if (heads_on_) {
      DGCA_RETURN_IF_ERROR(heads_.Predict(
          bert_.gathered(), z, store_.value(bert_.word_embeddings_index()),
          heads_.candidate_enabled() ? batch.candidates.data() : nullptr,
          batch.slot_source_id.data(), T, cfg_.vocab_size, pred.data()));
    } else {
      cpu::ArgmaxRows(ctx_, pred.data(), z, T, cfg_.vocab_size);
    }
    return pred;
  }

 private:
  // Checks b (errors name the field and index) and lays it out for the
  // encoder at its trimmed length.
  Status CheckAndTrim(const Batch& b, bool need_labels) {
    DGCA_RETURN_IF_ERROR(index_.Check(b, need_labels));
    Trim(b);
    return OkStatus();
  }

  // Drops the trailing columns that are padding in every row (and carry no
  // label): the encoder then runs on [B, L_eff] instead of [B, L]. Exact,
  // since padding keys get probability 0 and padding rows feed nothing.
  // Repacks ids, mask, token types and prompt slots at stride L_eff and
  // remaps rows_.
  void Trim(const Batch& b) {
    const int B = b.batch_size, L = b.seq_len;
    const int le = index_.TrimmedLength(b, /*multiple=*/1);
    L_eff_ = le;
    const std::vector<int32_t>& types = index_.token_types();
    const std::vector<int32_t>& slots = index_.prompt_slots();
    for (int r = 0; r < B; ++r)
      for (int pos = 0; pos < le; ++pos) {
        const size_t src = static_cast<size_t>(r) * L + pos, dst = static_cast<size_t>(r) * le + pos;
        ids_[dst] = b.input_ids[src];
        mask_[dst] = b.attention_mask[src];
        types_[dst] = types[src];
        slots_[dst] = slots[src];
      }
    rows_.clear();
    for (int32_t row : index_.rows()) rows_.push_back((row / L) * le + row % L);
  }

  // Training (ForwardBackward) runs with the config's dropout and the
  // batch's keys; evaluation never drops.
  Status SetDropout(const Batch& b, bool train) {
    DropoutSpec d;
    if (train && DropoutActive(cfg_)) {
      DGCA_RETURN_IF_ERROR(CheckDropoutKeys(cfg_, b));
      d.keys = b.dropout_keys.data();
      d.hidden = cfg_.hidden_dropout;
      d.attention = cfg_.attention_dropout;
    }
    bert_.set_dropout(d);
    return OkStatus();
  }

  void RunEncoder(const Batch& b) {
    cpu::SetBlasThreads();
    const float* prompt_rows = prompt_.enabled() ? prompt_.Forward() : nullptr;
    bert_.EmbedForward(ctx_, ids_.data(), types_.data(), slots_.data(), prompt_rows, b.batch_size,
                       L_eff_);
    bert_.EncoderForward(ctx_, mask_.data(), b.batch_size, L_eff_);
  }

  StatusOr<LossBreakdown> Run(const Batch& b, bool backward, float grad_scale,
                              const GradReadyFn& ready) {
    const int T = b.num_slots();
    const bool have_labels = !b.slot_target_id.empty() || !b.labels.empty();
    if (backward && !have_labels && T > 0)
      return InvalidArgumentError("DgcaModel: ForwardBackward needs batch.labels or slot_target_id");
    DGCA_RETURN_IF_ERROR(CheckAndTrim(b, /*need_labels=*/have_labels));
    DGCA_RETURN_IF_ERROR(SetDropout(b, /*train=*/backward));
    RunEncoder(b);
    LossBreakdown lb;
    lb.target_slots = T;
    const int R = static_cast<int>(rows_.size());
    const int M = R - T;
    const int V = cfg_.vocab_size, H = cfg_.hidden;
    const bool compute_loss = have_labels || M > 0;
    // Without labels Forward only checks and runs the encoder.
    float* z = nullptr;
    if (compute_loss || backward) z = bert_.MlmHeadForward(ctx_, rows_.data(), R);
    float* dz = backward ? z : nullptr;  // gradients overwrite the logits in place

    // Fusion / ReLM term on the target slots.
    if (have_labels && T > 0) {
      if (heads_on_) {
        HeadLosses hl;
        DGCA_RETURN_IF_ERROR(heads_.Forward(
            bert_.gathered(), z, store_.value(bert_.word_embeddings_index()),
            heads_.candidate_enabled() ? b.candidates.data() : nullptr, b.slot_source_id.data(),
            index_.targets().data(), T, V, &hl));
        lb.fusion = hl.fusion;
        lb.detector = hl.detector;
        lb.candidate = hl.candidate;
        lb.total = hl.total;
      } else {
        const double sum = cpu::CrossEntropy(ctx_, dz, z, index_.targets().data(), T, V,
                                             grad_scale / static_cast<float>(T), nullptr);
        lb.fusion = sum / T;
        lb.total = lb.fusion;
      }
    }
    // MFT term on the masked source positions (rows T..R).
    if (M > 0) {
      const size_t off = static_cast<size_t>(T) * V;
      const double sum =
          cpu::CrossEntropy(ctx_, dz != nullptr ? dz + off : nullptr, z + off,
                            index_.targets().data() + T, M, V, grad_scale / static_cast<float>(M), nullptr);
      lb.mft = sum / M;
      lb.total += lb.mft;
    }
    if (!std::isfinite(lb.total))
      return InternalError("DgcaModel: the loss is not finite (" + std::to_string(lb.total) + ")");
    if (!backward) return lb;

    // ---- backward, in reverse declaration order.
    const float* extra = nullptr;
    if (heads_on_ && T > 0) {
      std::fill(dh_heads_.begin(), dh_heads_.begin() + static_cast<size_t>(T) * H, 0.0f);
      heads_.Backward(grad_scale, dh_heads_.data(), dz,
                      store_.grad(bert_.word_embeddings_index()));
      extra = dh_heads_.data();
    }
    bert_.MlmHeadBackward(ctx_, dz, extra, T);
    if (ready) ready(bert_.head_first_index());
    bert_.EncoderBackward(ctx_, [&](int l) {
      if (ready) ready(bert_.layer_first_index(l));
    });
    float* dprompt = nullptr;
    if (prompt_.enabled()) {
      std::fill(dprompt_.begin(), dprompt_.end(), 0.0f);
      dprompt = dprompt_.data();
    }
    bert_.EmbedBackward(ctx_, dprompt);
    if (ready) ready(bert_.body_first_index());
    if (prompt_.enabled()) prompt_.Backward(dprompt);
    if (ready) ready(0);
    return lb;
  }

  ModelConfig cfg_;
  int max_batch_, seq_len_, max_rows_;
  cpu::ThreadPool pool_;  // the compute threads of this model
  cpu::Context ctx_;
  ParamStore store_;
  Bert bert_;
  PromptEncoder prompt_;
  DgcaHeads heads_;
  bool heads_on_;
  BatchIndex index_;  // the checked batch: token types, prompt slots, labelled rows and targets
  // Per-batch scratch (allocated once).
  // The batch's inputs at stride L_eff_ (see Trim), and the gathered rows
  // (target slots, then MFT positions) with their targets.
  std::vector<int32_t> ids_, mask_, types_, slots_, rows_;
  int L_eff_ = 1;
  std::vector<float> dprompt_, dh_heads_;
};

}  // namespace

StatusOr<std::unique_ptr<DgcaModel>> DgcaModel::Create(const ModelConfig& cfg, int max_batch,
                                                       int seq_len, uint64_t seed, int threads) {
  DGCA_RETURN_IF_ERROR(ValidateConfig(cfg, max_batch, seq_len, threads));
  auto m = std::make_unique<CpuDgcaModel>(cfg, max_batch, seq_len, threads);
  DGCA_RETURN_IF_ERROR(m->Init(seed));
  return std::unique_ptr<DgcaModel>(std::move(m));
}

}  // namespace dgca
