// The text of a Plan, as `dgca plan` prints it and the tests read it: a
// header line, a table (setting, value, source, reason) of every decision,
// the environment, the predictions (step time, comm share, memory,
// samples/s against one rank alone), the trials and the warnings.
//
// Thread-safety: pure functions.
#ifndef DGCA_PLANNER_PLAN_FORMAT_H_
#define DGCA_PLANNER_PLAN_FORMAT_H_

#include <string>

#include "dgca/v1/plan.pb.h"

namespace dgca {

// `job_name` ("" = none) names the job in the header line.
std::string FormatPlan(const v1::Plan& plan, const std::string& job_name = "");

// One line for events and logs: "ranks=2 device=cpu backend=gloo
// micro_batch=16 accumulation=1 bucket_mb=25 precision=fp32" and the
// warnings.
std::string PlanSummary(const v1::Plan& plan);

// The trials of a tuning.mode trial plan, one line each (a failed trial's
// note is cut at its first line); "" when there were none. Also in `dgca
// status`.
std::string FormatTrials(const v1::Plan& plan);

}  // namespace dgca

#endif  // DGCA_PLANNER_PLAN_FORMAT_H_
