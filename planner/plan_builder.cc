#include "planner/plan_builder.h"

namespace dgca {

void PlanBuilder::Decide(const std::string& name, const std::string& value,
                         v1::ValueSource source, const std::string& reason) {
  for (auto& d : *plan_.mutable_decisions()) {
    if (d.name() == name) {
      d.set_value(value);
      d.set_source(source);
      d.set_reason(reason);
      return;
    }
  }
  v1::PlanDecision* d = plan_.add_decisions();
  d->set_name(name);
  d->set_value(value);
  d->set_source(source);
  d->set_reason(reason);
}

std::string PlanBuilder::ReasonOf(const std::string& name) const {
  for (const auto& d : plan_.decisions()) {
    if (d.name() == name) return d.reason();
  }
  return "";
}

}  // namespace dgca
