#include "coordinator/tuning_trials.h"

#include "absl/strings/str_format.h"

namespace dgca {

bool WantsTrials(const v1::JobSpec& spec) {
  return spec.tuning().mode() == "trial" && spec.kind() != "comm_probe";
}

v1::JobSpec TrialSpec(const v1::JobSpec& spec) {
  v1::JobSpec t = spec;
  t.mutable_train()->set_steps(kTrialWarmupSteps + kTrialTimedSteps);
  t.mutable_train()->set_eval_every(0);
  t.mutable_train()->set_checkpoint_every(0);
  t.mutable_data()->clear_eval();
  t.mutable_tuning()->set_mode("off");
  return t;
}

std::string CandidateLabel(const v1::Plan& p) {
  return absl::StrFormat("micro_batch %d x accumulation %d, bucket %g MB", p.micro_batch(),
                         p.accumulation(), p.bucket_mb());
}

}  // namespace dgca
