// AdamW over a ParamStore's flat buffers, learning-rate schedules and global
// gradient-norm clipping, with PyTorch semantics (torch.optim.AdamW):
//   p -= lr * wd * p                      (decoupled decay; only where
//                                          ParamInfo::weight_decay is true)
//   m = b1*m + (1-b1)*g ; v = b2*v + (1-b2)*g*g
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//
// Thread-safety: not thread-safe; one optimizer per model, used from the
// training thread.
#ifndef DGCA_MODEL_TRAIN_OPTIMIZER_H_
#define DGCA_MODEL_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/nn/params.h"

namespace dgca {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW {
 public:
  // `params` must be finalized and outlive the optimizer.
  AdamW(ParamStore* params, const AdamWOptions& options);

  // One update with learning rate `lr` from params->grads(). Increments step().
  void Step(float lr);

  int64_t step() const { return step_; }
  // Moment buffers (same flat layout as the ParamStore), for checkpoints.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  void set_step(int64_t step) { step_ = step; }
  const AdamWOptions& options() const { return options_; }

 private:
  ParamStore* params_;
  AdamWOptions options_;
  std::vector<float> m_, v_;
  int64_t step_ = 0;
};

// Learning rate for optimizer step `step` (0-based: the step about to run),
// as HF get_constant_schedule_with_warmup / get_linear_schedule_with_warmup:
// warmup: lr * step / warmup; linear: then lr * (total - step) / (total - warmup),
// clamped at 0.
double ScheduledLr(LrSchedule schedule, double base_lr, int64_t step, int64_t warmup,
                   int64_t total);

// Global L2 norm of `grads` (accumulated in double). When max_norm > 0 and
// the norm exceeds it, scales grads by max_norm / (norm + 1e-6) (PyTorch
// clip_grad_norm_). Returns the norm before clipping.
double ClipGradNorm(float* grads, int64_t n, double max_norm);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_OPTIMIZER_H_
