// Turns a job spec and its plan into the trainer's TrainConfig: the one place
// where YAML-level names meet libdgca_model's plain structs. Used by the rank
// runtime and by `dgca-worker train`.
//
// Thread-safety: pure functions.
#ifndef DGCA_WORKER_RANK_TRAIN_CONFIG_H_
#define DGCA_WORKER_RANK_TRAIN_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/plan.pb.h"
#include "model/core/config.h"

namespace dgca {

// Relative paths of the spec (data, vocab, confusion set, init_from) resolve
// against spec.base_dir. Model sizes come from the preset (dgca::ApplyPreset)
// with explicit layers/hidden/heads/ffn (> 0) overriding it. Precision,
// micro-batch, accumulation, bucket size, loader threads and compute threads
// come from the plan; where the plan leaves one at 0 the spec's value is used,
// and where both are "auto" a safe default (see SimplePlan).
// model.dropout.hidden/attention map to ModelConfig's hidden_dropout and
// attention_dropout; each one unset is kDefaultDropout (0.1,
// spec/spec.h).
// Errors: INVALID_ARGUMENT naming the field (unknown preset, encoder,
// precision; dropout outside [0, 1); no training data).
absl::StatusOr<TrainConfig> TrainConfigFromSpec(const v1::JobSpec& spec, const v1::Plan& plan);

// A plan without the planner: what the spec says, and for "auto" values
// accumulation 1, micro_batch = global_batch / (accumulation * ranks) (at
// least 1), fp32, 1 thread per rank, 25 MB buckets. Used by
// `dgca-worker train` when the planner cannot plan (each decision says so).
v1::Plan SimplePlan(const v1::JobSpec& spec, int ranks);

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_TRAIN_CONFIG_H_
