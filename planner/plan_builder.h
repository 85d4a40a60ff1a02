// PlanBuilder: the Plan under construction. Each decision step of the
// planner (planner/decisions.h) records its value with Decide() and its
// doubts with Warn(); a later step may revise an earlier decision (the rank
// count after the throughput comparison, the batch after trials), which
// replaces that decision's row in place so `dgca plan` shows one row per
// setting.
//
// Thread-safety: none; one builder per MakePlan call.
#ifndef DGCA_PLANNER_PLAN_BUILDER_H_
#define DGCA_PLANNER_PLAN_BUILDER_H_

#include <string>

#include "dgca/v1/plan.pb.h"

namespace dgca {

class PlanBuilder {
 public:
  // Sets (or replaces) the decision `name` ("train.micro_batch", "env.X").
  void Decide(const std::string& name, const std::string& value, v1::ValueSource source,
              const std::string& reason);
  // The reason recorded for `name` ("" when not decided yet).
  std::string ReasonOf(const std::string& name) const;
  void Warn(const std::string& warning) { plan_.add_warnings(warning); }

  v1::Plan& plan() { return plan_; }
  const v1::Plan& plan() const { return plan_; }

 private:
  v1::Plan plan_;
};

}  // namespace dgca

#endif  // DGCA_PLANNER_PLAN_BUILDER_H_
