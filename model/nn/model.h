// DgcaModel: the DGCA-ReLM network (BERT encoder + ReLM prompts + MLM head,
// detector, candidate head, gated fusion) with explicit forward and backward.
// docs/model.md ("The DGCA-ReLM model") is the specification.
//
// Activation memory is allocated once in Create() for (max_batch, seq_len);
// a batch may be smaller, never larger.
//
// Thread-safety: not thread-safe. One model per rank; ForwardBackward and
// Predict may use the model's internal compute threads.
#ifndef DGCA_MODEL_NN_MODEL_H_
#define DGCA_MODEL_NN_MODEL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/status.h"
#include "model/nn/params.h"

namespace dgca {

struct LossBreakdown {
  double total = 0;      // what backward differentiates (before loss scale)
  double fusion = 0;     // -log P_i[y_i] on target slots (ReLM's loss when fusion is none)
  double mft = 0;        // MLM CE on MFT-masked source positions
  double detector = 0;   // BCE (unweighted)
  double candidate = 0;  // CE over candidates (unweighted)
  int64_t target_slots = 0;
};

// Called during backward, in reverse declaration order, each time the
// gradients of parameters [first, ParamStore::size()) are all complete.
// `first` only decreases. Used to start bucket all-reduces early.
using GradReadyFn = std::function<void(int first_complete_param)>;

// Whether training drops anything (either dropout rate > 0).
inline bool DropoutActive(const ModelConfig& c) { return c.hidden_dropout > 0.0f || c.attention_dropout > 0.0f; }
// INVALID_ARGUMENT naming the field when dropout is active and the batch
// lacks a key per row (Batch::dropout_keys); OK otherwise.
Status CheckDropoutKeys(const ModelConfig& c, const Batch& b);

class DgcaModel {
 public:
  // Declares and allocates parameters (random init from `seed`, BERT-style:
  // N(0, 0.02) weights, zero biases, unit LayerNorm gains) and activations.
  static StatusOr<std::unique_ptr<DgcaModel>> Create(const ModelConfig& cfg,
                                                     int max_batch, int seq_len,
                                                     uint64_t seed, int threads);
  virtual ~DgcaModel() = default;

  virtual const ModelConfig& config() const = 0;
  virtual ParamStore& params() = 0;

  // Forward and backward on `batch`. Gradients are ADDED to params().grads()
  // (the caller zeroes them at the start of an optimizer step), scaled by
  // `grad_scale` (1/accumulation for averaging over micro-steps; the loss
  // itself is a mean over the batch's target slots). `on_grad_ready` may be
  // empty.
  virtual StatusOr<LossBreakdown> ForwardBackward(const Batch& batch, float grad_scale,
                                                  const GradReadyFn& on_grad_ready) = 0;

  // Forward only; the loss is computed when the batch has labels.
  virtual StatusOr<LossBreakdown> Forward(const Batch& batch) = 0;

  // argmax P_i per target slot, in batch.slot_index order.
  virtual StatusOr<std::vector<int32_t>> Predict(const Batch& batch) = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_NN_MODEL_H_
