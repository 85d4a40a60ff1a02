#include "coordinator/measured_planning.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "planner/diagnosis.h"
#include "spec/spec.h"

namespace dgca {
namespace {

// Step measurements (distinct micro-batches) fed to one plan.
constexpr int kMaxStepPoints = 6;
// Micro-batches whose newest peak memory the next plan's memory line fits.
constexpr int kMaxMemoryPoints = 4;
// Jobs whose all-reduce skew is taken into a plan (median).
constexpr int kMaxSkewJobs = 5;
constexpr int kMaxEfficiencyJobs = 5;

std::string UtcTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

// Adds the newest `dgca diagnose comm` rows for (node_set, backend, ranks)
// to *meas; false when there are none.
bool AddCommMeasurement(JobStore* store, const std::string& node_set, const v1::Plan& plan,
                        PlannerMeasurements* meas) {
  auto m = store->LatestCommMeasurement(node_set, plan.backend(), plan.ranks());
  if (!m.ok() || m->rows.empty()) return false;
  // Bandwidth from the largest size (bandwidth-bound, like the buckets the
  // planner sizes) and latency from the smallest (latency-bound). A least-
  // squares fit over all sizes is dominated by the largest points and gave a
  // latency of 0 on this machine's sweeps.
  const v1::CommProbeRow* big = nullptr;
  const v1::CommProbeRow* small = nullptr;
  for (const auto& r : m->rows) {
    if (r.seconds_per_op() <= 0 || r.busbw_bytes_per_second() <= 0) continue;
    if (!big || r.bytes() > big->bytes()) big = &r;
    if (!small || r.bytes() < small->bytes()) small = &r;
  }
  if (!big) return false;
  meas->allreduce_bus_bandwidth = big->busbw_bytes_per_second();
  if (small != big) meas->allreduce_latency_s = small->seconds_per_op();
  for (const auto& r : m->rows) {
    if (r.bytes() > 0 && r.seconds_per_op() > 0) {
      meas->allreduce_points.emplace_back(static_cast<double>(r.bytes()), r.seconds_per_op());
    }
  }
  meas->allreduce_source =
      absl::StrCat("measured by dgca diagnose comm at ", UtcTime(m->time_unix_ms), " (job ",
                   m->job_id, "; busbw at ", big->bytes(), " B",
                   small != big ? absl::StrCat(", latency at ", small->bytes(), " B") : "", ")");
  return true;
}

// How much longer the all-reduce took inside earlier jobs than the probe
// predicted, per second of compute (median of the newest few).
void AddSkew(JobStore* store, const std::string& comm_key, PlannerMeasurements* meas) {
  auto skews = store->AllReduceSkews(comm_key, kMaxSkewJobs);
  if (!skews.ok() || skews->empty()) return;
  std::vector<double> r;
  std::vector<std::string> from;
  for (const AllReduceSkew& x : *skews) {
    r.push_back(x.skew);
    from.push_back(absl::StrFormat("%s %.3f", x.job_id, x.skew));
  }
  meas->allreduce_skew_per_compute = std::max(0.0, MedianOf(r));
  meas->allreduce_skew_source = absl::StrCat(
      "the median of (measured all-reduce - probe) / compute over the newest ", r.size(),
      " job(s) on these nodes: ", absl::StrJoin(from, ", "));
}

// Compute time per micro-step from earlier jobs of the same key (per
// micro-batch, the median of its newest three jobs).
bool AddStepPoints(JobStore* store, const std::string& step_key, PlannerMeasurements* meas) {
  auto steps = store->StepMeasurements(step_key, kMaxStepPoints);
  if (!steps.ok() || steps->empty()) return false;
  std::vector<std::string> from;
  for (const StepMeasurement& m : *steps) {
    meas->step_points.emplace_back(m.micro_batch, m.compute_seconds);
    if (m.jobs.size() <= 1) {
      from.push_back(absl::StrFormat("job %s m=%d %.1f ms (median of %d steps)", m.job_id,
                                     m.micro_batch, m.compute_seconds * 1e3, m.samples));
    } else {
      std::vector<std::string> js;
      for (const auto& [job, c] : m.jobs) js.push_back(absl::StrFormat("%s %.1f", job, c * 1e3));
      from.push_back(absl::StrFormat("m=%d %.1f ms (median of the newest %d jobs: %s ms)",
                                     m.micro_batch, m.compute_seconds * 1e3, m.jobs.size(),
                                     absl::StrJoin(js, ", ")));
    }
  }
  meas->step_source = absl::StrCat(
      "compute per micro-step measured by earlier jobs of this model on these nodes, newest ",
      UtcTime((*steps)[0].time_unix_ms), ": ", absl::StrJoin(from, "; "));
  return true;
}

// Peak memory from earlier jobs of `memory_key` (per micro-batch, the
// newest job's); `what` follows each in the source.
bool AddMemoryPoints(JobStore* store, const std::string& memory_key, const std::string& what,
                     std::vector<std::pair<int, double>>* points, std::string* source) {
  auto mem = store->MemoryMeasurements(memory_key, kMaxMemoryPoints);
  if (!mem.ok()) return false;
  std::vector<std::string> from;
  for (const MemoryMeasurement& m : *mem) {
    if (m.micro_batch <= 0 || m.peak_bytes <= 0) continue;
    points->emplace_back(m.micro_batch, m.peak_bytes);
    from.push_back(absl::StrFormat("job %s held %s at micro-batch %d%s", m.job_id,
                                   FormatBytes(m.peak_bytes), m.micro_batch, what));
  }
  if (from.empty()) return false;
  *source = absl::StrJoin(from, ", ");
  return true;
}

// The compute prior's efficiency on `device_class`: the median of the
// newest kMaxEfficiencyJobs jobs' there (one disturbed job moves it less).
bool AddEfficiency(JobStore* store, const std::string& device_class, PlannerMeasurements* meas) {
  if (device_class.empty()) return false;
  auto rows = store->EfficiencyMeasurements(device_class, kMaxEfficiencyJobs);
  if (!rows.ok() || rows->empty()) return false;
  std::vector<double> e;
  std::vector<std::string> from;
  for (const EfficiencyMeasurement& r : *rows) {
    e.push_back(r.efficiency);
    from.push_back(absl::StrFormat("%s %.3f at micro-batch %d", r.job_id, r.efficiency,
                                   r.micro_batch));
  }
  meas->compute_efficiency = MedianOf(e);
  meas->compute_efficiency_source =
      absl::StrFormat("the median of the newest %d job(s) on %s (%s)", static_cast<int>(e.size()),
                      device_class, absl::StrJoin(from, ", "));
  return true;
}

}  // namespace

std::string StepKey(const v1::JobSpec& spec, const v1::Plan& plan, const std::string& node_set) {
  v1::ModelSpec model = spec.model();
  model.clear_init_from();  // the starting weights do not change the timing
  // Dropout as the ranks train it: unset means the default; none at all
  // keys as specs from before model.dropout did (their measurements were
  // taken without dropout).
  const SpecDropout dropout = DropoutOf(spec.model());
  model.clear_dropout();
  if (dropout.hidden > 0 || dropout.attention > 0) {
    model.mutable_dropout()->set_hidden(dropout.hidden);
    model.mutable_dropout()->set_attention(dropout.attention);
  }
  return absl::StrCat("nodes=", node_set, " device=", plan.device(), " ranks=", plan.ranks(),
                      " threads=", plan.threads_per_rank(), " precision=", plan.precision(),
                      " seq=", spec.data().max_seq_len(),
                      " mft=", spec.data().mft().ShortDebugString(),
                      " model=", model.ShortDebugString());
}

std::string MemoryKey(const v1::JobSpec& spec, const v1::Plan& plan, const std::string& node_set,
                      const std::string& kept) {
  std::string attention = plan.attention();
  if (attention == "auto") attention = kept.empty() ? "fused" : kept;
  return StepKey(spec, plan, node_set) + " attention=" + attention;
}

std::string CommKey(const std::string& node_set, const v1::Plan& plan) {
  return absl::StrCat(node_set, "|", plan.backend(), "|", plan.ranks());
}

absl::StatusOr<v1::Plan> PlanMeasured(JobStore* store, const v1::JobSpec& spec,
                                      const std::vector<v1::Topology>& topo,
                                      TrialRunner* trials, const std::string& node_set_key,
                                      bool* step_measured, const PlannerMeasurements& base) {
  if (step_measured != nullptr) *step_measured = false;
  auto plan = MakePlan(spec, topo, base);
  if (!plan.ok() || spec.kind() == "comm_probe") return plan;
  std::set<std::string> nodes(plan->rank_nodes().begin(), plan->rank_nodes().end());
  nodes.erase("");
  if (nodes.empty() && !topo.empty()) nodes.insert(topo[0].node());
  const std::string node_set = node_set_key.empty() ? absl::StrJoin(nodes, ",") : node_set_key;
  PlannerMeasurements meas = base;
  bool measured = false;
  if (plan->ranks() >= 2 && AddCommMeasurement(store, node_set, *plan, &meas)) {
    measured = true;
    AddSkew(store, CommKey(node_set, *plan), &meas);
  }
  measured |= AddEfficiency(store, plan->compute_device_class(), &meas);
  const bool steps = AddStepPoints(store, StepKey(spec, *plan, node_set), &meas);
  measured |= steps;
  measured |= AddMemoryPoints(store, MemoryKey(spec, *plan, node_set), "", &meas.memory_points,
                              &meas.memory_source);
  // The GEMM attention's, for a plan that may keep it ("auto", or the
  // planner's "fused" that may become "auto" at the new micro-batch; not the
  // user's "fused").
  const std::string asked = absl::AsciiStrToLower(spec.train().attention());
  if ((plan->attention() == "auto" || plan->attention() == "fused") &&
      (asked.empty() || asked == "auto")) {
    v1::Plan gemm_plan = *plan;  // the key's other parts as this plan's
    gemm_plan.set_attention("gemm");
    measured |= AddMemoryPoints(store, MemoryKey(spec, gemm_plan, node_set),
                                " with the GEMM attention", &meas.gemm_memory_points,
                                &meas.gemm_memory_source);
  }
  if (!measured && trials == nullptr) return plan;
  auto again = MakePlan(spec, topo, meas, trials);
  if (!again.ok()) return plan;
  if (step_measured != nullptr) *step_measured = steps;
  return again;
}

}  // namespace dgca
