// Dynamic loss scaling for fp16 training, with the rules and defaults of
// torch.cuda.amp.GradScaler: the loss gradient is multiplied by scale()
// before the backward, so small fp16 gradients do not flush to zero; the
// gradients are then divided by it and checked; a step whose gradients
// overflowed (any inf or NaN) is skipped and the scale backs off; after
// growth_interval clean steps in a row the scale grows.
//
// Only the bookkeeping lives here (host side, checkable without a GPU); the
// CUDA train device (model/cuda/cuda_train_device.h) scales, unscales and
// checks the gradients and asks Update() what happens next.
//
// Thread-safety: not thread-safe; the training thread only.
#ifndef DGCA_MODEL_TRAIN_LOSS_SCALER_H_
#define DGCA_MODEL_TRAIN_LOSS_SCALER_H_

#include <cstdint>

#include "model/core/status.h"

namespace dgca {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  // INVALID_ARGUMENT (naming the field) for a non-positive or non-finite
  // scale or factor, a growth factor <= 1, a backoff outside (0, 1), or an
  // interval < 1.
  static StatusOr<LossScaler> Create(const LossScalerOptions& options);

  double scale() const { return scale_; }
  // Clean steps since the scale last changed.
  int64_t growth_tracker() const { return tracker_; }
  const LossScalerOptions& options() const { return options_; }

  // After a step's gradients were unscaled and checked: found_inf ->
  // scale *= backoff_factor and the tracker restarts; otherwise the tracker
  // counts the clean step and at growth_interval the scale grows by
  // growth_factor and the tracker restarts.
  void Update(bool found_inf);

  // The state a checkpoint saved. INVALID_ARGUMENT for a non-positive or
  // non-finite scale or a negative tracker; nothing changes then.
  Status Restore(double scale, int64_t growth_tracker);

 private:
  explicit LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale) {}
  LossScalerOptions options_;
  double scale_;
  int64_t tracker_ = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_LOSS_SCALER_H_
