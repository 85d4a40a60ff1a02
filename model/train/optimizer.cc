#include "model/train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace dgca {

AdamW::AdamW(ParamStore* params, const AdamWOptions& options)
    : params_(params), options_(options) {
  m_.assign(static_cast<size_t>(params->total_numel()), 0.0f);
  v_.assign(static_cast<size_t>(params->total_numel()), 0.0f);
}

void AdamW::Step(float lr) {
  ++step_;
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  // Bias corrections in double: 1-b2^t is tiny for small t and float pow
  // loses digits there.
  const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step_));
  // PyTorch: step_size = lr / bc1; denom = sqrt(v)/sqrt(bc2) + eps.
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  float* values = params_->values();
  const float* grads = params_->grads();
  for (int i = 0; i < params_->size(); ++i) {
    const ParamInfo& info = params_->info(i);
    const float decay = info.weight_decay ? lr * options_.weight_decay : 0.0f;
    float* p = values + info.offset;
    const float* g = grads + info.offset;
    float* m = m_.data() + info.offset;
    float* v = v_.data() + info.offset;
    for (int64_t j = 0; j < info.numel; ++j) {
      if (decay != 0.0f) p[j] -= decay * p[j];  // decoupled: before the Adam update
      m[j] = b1 * m[j] + (1.0f - b1) * g[j];
      v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
      const float denom = std::sqrt(v[j]) * inv_sqrt_bc2 + eps;
      p[j] -= step_size * m[j] / denom;
    }
  }
}

double ScheduledLr(LrSchedule schedule, double base_lr, int64_t step, int64_t warmup,
                   int64_t total) {
  if (warmup > 0 && step < warmup) {
    return base_lr * static_cast<double>(step) / static_cast<double>(warmup);
  }
  if (schedule == LrSchedule::kConstant) return base_lr;
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double f = static_cast<double>(total - step) / static_cast<double>(span);
  return base_lr * std::max(0.0, f);
}

double ClipGradNorm(float* grads, int64_t n, double max_norm) {
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(grads[i]) * grads[i];
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (int64_t i = 0; i < n; ++i) grads[i] *= scale;
  }
  return norm;
}

}  // namespace dgca
