#include "model/train/loss_scaler.h"

#include <cmath>
#include <string>

namespace dgca {

StatusOr<LossScaler> LossScaler::Create(const LossScalerOptions& o) {
  auto bad = [](const char* field, double v, const char* valid) {
    return InvalidArgumentError(std::string("loss scaler: ") + field + " " + std::to_string(v) + ": must be " + valid);
  };
  if (!(o.init_scale > 0) || !std::isfinite(o.init_scale)) return bad("init_scale", o.init_scale, "finite and > 0");
  if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor))
    return bad("growth_factor", o.growth_factor, "finite and > 1");
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) return bad("backoff_factor", o.backoff_factor, "in (0, 1)");
  if (o.growth_interval < 1) return bad("growth_interval", double(o.growth_interval), ">= 1");
  return LossScaler(o);
}

void LossScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    tracker_ = 0;
    return;
  }
  if (++tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    tracker_ = 0;
  }
}

Status LossScaler::Restore(double scale, int64_t growth_tracker) {
  if (!(scale > 0) || !std::isfinite(scale))
    return InvalidArgumentError("loss scaler: restored scale " + std::to_string(scale) + " must be finite and > 0");
  if (growth_tracker < 0)
    return InvalidArgumentError("loss scaler: restored growth tracker " + std::to_string(growth_tracker) +
                                " must be >= 0");
  scale_ = scale;
  tracker_ = growth_tracker;
  return OkStatus();
}

}  // namespace dgca
