// Diagnosis of a job's measured steps: diagnosis.h has the stages and the
// rules; this file has the arithmetic and the words.
#include "planner/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/planner.h"

namespace dgca {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// Medians of one set of samples, written into the fields both
// StepBreakdown and RankStepMedians have.
struct Medians {
  int64_t samples = 0;
  double step = 0, data = 0, exposed = 0, compute = 0, allreduce = 0;
  double peak_memory = 0;  // the largest reading (not a median); 0 = none
};

// `gpu`: the memory that counts is the GPU's, not the process's.
Medians MediansOfSamples(const std::vector<const StepSample*>& samples, bool gpu) {
  std::vector<double> step, data, exposed, allreduce;
  Medians m;
  for (const StepSample* s : samples) {
    step.push_back(s->step_seconds);
    data.push_back(std::max(0.0, s->data_wait_seconds));
    exposed.push_back(std::max(0.0, s->exposed_seconds));
    allreduce.push_back(std::max(0.0, s->allreduce_seconds));
    m.peak_memory = std::max(m.peak_memory, gpu ? s->gpu_memory_bytes : s->host_memory_peak_bytes);
  }
  m.samples = static_cast<int64_t>(samples.size());
  m.step = MedianOf(step);
  m.data = MedianOf(data);
  m.exposed = MedianOf(exposed);
  m.allreduce = MedianOf(allreduce);
  // The rest of the median step, so that the parts add up to it (a median
  // of per-step remainders would not).
  m.compute = std::max(0.0, m.step - m.data - m.exposed);
  return m;
}

double Share(double part, double step) { return step > 0 ? part / step : 0; }

// Past `limit` by at most kNearLimitBand of it.
bool NearLimit(double measured, double limit) {
  return measured > limit && measured <= limit * (1 + kNearLimitBand);
}

// Percent more samples/s were `share` of the step to go away.
double GainWithout(double share) { return 100 * (1 / std::max(1e-9, 1 - share) - 1); }

std::string RankName(const v1::RankStepMedians& r) {
  return r.node().empty() ? absl::StrCat("rank ", r.rank())
                          : absl::StrCat("rank ", r.rank(), " (node ", r.node(), ")");
}

}  // namespace

v1::StepBreakdown BreakdownOf(const std::vector<StepSample>& samples, const v1::Plan& plan) {
  std::map<int, std::vector<const StepSample*>> by_rank;
  int64_t total = 0;
  for (const StepSample& s : samples) {
    if (!(s.step_seconds > 0)) continue;
    by_rank[s.rank].push_back(&s);
    ++total;
  }
  v1::StepBreakdown b;
  b.set_samples(total);
  const v1::RankStepMedians* critical = nullptr;
  for (const auto& [rank, rs] : by_rank) {
    const Medians r = MediansOfSamples(rs, plan.device() == "cuda");
    v1::RankStepMedians* out = b.add_ranks();
    out->set_rank(rank);
    if (rank >= 0 && rank < plan.rank_nodes_size()) out->set_node(plan.rank_nodes(rank));
    out->set_samples(r.samples);
    out->set_step_seconds(r.step);
    out->set_data_wait_seconds(r.data);
    out->set_exposed_comm_seconds(r.exposed);
    out->set_compute_seconds(r.compute);
    out->set_allreduce_seconds(r.allreduce);
    out->set_peak_memory_bytes(r.peak_memory);
  }
  // The critical rank: longest before the all-reduce (ties: the lowest).
  for (const auto& r : b.ranks()) {
    if (critical == nullptr || r.data_wait_seconds() + r.compute_seconds() >
                                   critical->data_wait_seconds() + critical->compute_seconds()) {
      critical = &r;
    }
  }
  if (critical != nullptr) {
    b.set_critical_rank(critical->rank());
    b.set_step_seconds(critical->step_seconds());
    b.set_data_wait_seconds(critical->data_wait_seconds());
    b.set_exposed_comm_seconds(critical->exposed_comm_seconds());
    b.set_compute_seconds(critical->compute_seconds());
    b.set_allreduce_seconds(critical->allreduce_seconds());
  }
  return b;
}

int64_t GlobalBatchForCommTarget(const v1::Plan& plan, double comm_share) {
  const int64_t unit = int64_t{std::max(1, plan.ranks())} * std::max(1, plan.micro_batch());
  const int64_t global = unit * std::max(1, plan.accumulation());
  if (comm_share <= kTargetCommShare) return global;
  if (comm_share >= 1) return 0;
  // Exposed time E is fixed, compute C grows with the samples per step G:
  // E / (E + C G'/G) <= t needs G' >= G s/(1-s) (1-t)/t, with s = E/(E+C).
  const double need = static_cast<double>(global) * comm_share / (1 - comm_share) *
                      (1 - kTargetCommShare) / kTargetCommShare;
  return static_cast<int64_t>(std::ceil(need / static_cast<double>(unit) - 1e-9)) * unit;
}

std::string NearLimitNote(const std::vector<std::string>& stages) {
  if (stages.empty()) return "";
  return absl::StrCat(" (", absl::StrJoin(stages, " and "), stages.size() == 1 ? " is" : " are",
                      " near its limit)");
}

v1::MemoryFinding DiagnoseMemory(const v1::Plan& plan, const v1::StepBreakdown& b) {
  v1::MemoryFinding out;
  const v1::RankStepMedians* most = nullptr;
  for (const auto& r : b.ranks()) {
    if (r.peak_memory_bytes() > 0 &&
        (most == nullptr || r.peak_memory_bytes() > most->peak_memory_bytes())) {
      most = &r;
    }
  }
  const bool cuda = plan.device() == "cuda";
  const char* what = cuda ? "GPU memory" : "peak resident set";
  if (most == nullptr) {
    out.set_finding(absl::StrFormat(
        "no rank reported its %s (e.g. %s)", what,
        cuda ? "NVML not available on the node"
             : "/proc not readable, or a job from before ranks reported it"));
    return out;
  }
  out.set_known(true);
  out.set_rank(most->rank());
  const double peak = most->peak_memory_bytes();
  out.set_peak_bytes(peak);
  out.set_predicted_bytes(plan.predicted_memory_bytes());
  out.set_target_bytes(plan.memory_target_bytes());
  out.set_device_bytes(plan.device_memory_bytes());
  const double target = plan.memory_target_bytes();
  out.set_above_target(target > 0 && peak > target);

  const int m = std::max(1, plan.micro_batch());
  const int k = std::max(1, plan.accumulation());
  const int per_rank = m * k;  // samples per optimizer step on one rank
  std::string f = absl::StrFormat("%s held %s at most (%s)", RankName(*most), FormatBytes(peak),
                                  what);
  if (plan.device_memory_bytes() > 0) {
    absl::StrAppendFormat(&f, ", %.0f%% of %s", 100 * peak / plan.device_memory_bytes(),
                          cuda ? absl::StrCat("its GPU's ", FormatBytes(plan.device_memory_bytes()))
                               : absl::StrCat("its ", FormatBytes(plan.device_memory_bytes()),
                                              " share of the host"));
  }
  if (target > 0) absl::StrAppendFormat(&f, "; target %s", FormatBytes(target));
  if (plan.predicted_memory_bytes() > 0) {
    const double err = plan.predicted_memory_bytes() / peak - 1;
    absl::StrAppendFormat(&f, "; the plan predicted %s at micro-batch %d, %.0f%% %s that",
                          FormatBytes(plan.predicted_memory_bytes()), m, 100 * std::fabs(err),
                          err < 0 ? "under" : "over");
  }
  out.set_finding(f);
  // Per sample (diagnosis.h): the measured excess over the model's state
  // includes fixed overheads, so it overstates what a smaller micro-batch
  // saves (the smaller of it and the model's then) and is the safe side for
  // a larger one (the larger of the two).
  const double model = plan.predicted_activation_bytes_per_sample();
  if (target <= 0 || plan.predicted_memory_bytes() <= 0 || model <= 0) return out;
  const double state = std::max(0.0, plan.predicted_memory_bytes() - m * model);
  const double measured = peak > state ? (peak - state) / m : 0;
  const bool shrink = out.above_target();
  const double per_sample =
      measured <= 0 ? model : shrink ? std::min(measured, model) : std::max(measured, model);
  auto at = [&](int mb) { return peak + per_sample * (mb - m); };
  int fit = 0;  // the largest divisor of per_rank under the target
  for (int mb = 1; mb <= per_rank; ++mb) {
    if (per_rank % mb == 0 && at(mb) <= target) fit = mb;
  }
  out.set_micro_batch_fit(fit);
  const std::string scale = absl::StrFormat(
      "(scaled from the measured peak by %s%s per sample)",
      per_sample == measured ? "" : "the plan's ", FormatBytes(per_sample));
  if (shrink) {
    if (fit > 0) {
      out.set_fix(absl::StrFormat(
          "above the target: set train.micro_batch %d and train.accumulation %d (the same "
          "global batch) for about %s %s",
          fit, per_rank / fit, FormatBytes(at(fit)), scale));
    } else {
      const bool fp32 = plan.precision().empty() || plan.precision() == "fp32";
      out.set_fix(absl::StrFormat(
          "above the target even at micro-batch 1 %s: %s", scale,
          cuda ? (fp32 ? "bf16 or fp16 precision, or a shorter data.max_seq_len"
                       : "a shorter data.max_seq_len, or a GPU with more memory")
               : "fewer ranks per node, or a shorter data.max_seq_len"));
    }
    const double device = plan.device_memory_bytes();
    if (device > 0 && peak > 0.95 * device) {
      out.set_fix(absl::StrCat(
          absl::StrFormat(cuda ? "at %.0f%% of the GPU's memory, one allocation from running "
                                 "out; "
                               : "at %.0f%% of its share of the host's memory: the node may "
                                 "swap or kill a rank; ",
                          100 * peak / device),
          out.fix()));
    }
  } else if (fit > m) {
    out.set_fix(absl::StrFormat(
        "memory left unused: train.micro_batch %d with train.accumulation %d (the same global "
        "batch) would take about %s of the %s target %s; fewer, larger micro-steps usually run "
        "faster (tuning.mode: trial times both before the job starts)",
        fit, per_rank / fit, FormatBytes(at(fit)), FormatBytes(target), scale));
  }
  return out;
}

absl::Status DiagnoseSteps(const v1::Plan& plan, const v1::JobSpec& spec,
                           const v1::StepBreakdown& b, v1::DiagnoseJobResponse* out) {
  const double step = b.step_seconds();
  if (!(step > 0)) {
    return absl::InvalidArgumentError("diagnose: the breakdown has no step time (no steps)");
  }
  out->clear_findings();
  const bool cuda = plan.device() == "cuda";

  // Straggler: the slowest compute against the median of the others (with
  // two ranks, the other one: a median over all would halve the gap).
  const v1::RankStepMedians* slowest = nullptr;
  double median_compute = 0, straggle = 0;
  if (b.ranks_size() >= 2) {
    for (const auto& r : b.ranks()) {
      if (slowest == nullptr || r.compute_seconds() > slowest->compute_seconds()) slowest = &r;
    }
    std::vector<double> others;
    for (const auto& r : b.ranks()) {
      if (&r != slowest) others.push_back(r.compute_seconds());
    }
    median_compute = MedianOf(others);
    straggle = median_compute > 0 ? slowest->compute_seconds() / median_compute - 1 : 0;
  }
  const bool straggler = slowest != nullptr && straggle > kStragglerLimit;

  const int k = std::max(1, plan.accumulation());
  const int m = std::max(1, plan.micro_batch());
  const int ranks = std::max(1, plan.ranks());

  // The critical rank (BreakdownOf): the job's figures are its own.
  const v1::RankStepMedians* critical = nullptr;
  for (const auto& r : b.ranks()) {
    if (r.rank() == b.critical_rank()) critical = &r;
  }
  const bool several = b.ranks_size() >= 2 && critical != nullptr;

  // data
  v1::DiagnoseFinding data;
  data.set_stage("data");
  data.set_share(Share(b.data_wait_seconds(), step));
  data.set_above_limit(data.share() > kDataWaitLimit);
  data.set_near_limit(NearLimit(data.share(), kDataWaitLimit));
  data.set_finding(absl::StrFormat(
      "%s waited %.4f s per step for its loader's batches (%.1f%% of the step, limit %.0f%%)",
      several ? absl::StrCat(RankName(*critical), ", the last to reach the all-reduce,")
              : std::string("the rank"),
      b.data_wait_seconds(), 100 * data.share(), 100 * kDataWaitLimit));
  if (data.above_limit()) {
    const int lt = std::max(1, plan.loader_threads());
    const int prefetch = spec.data().loader().prefetch() > 0 ? spec.data().loader().prefetch() : 2;
    std::string fix = absl::StrFormat(
        "the loader starves the trainer (about %+.0f%% samples/s without the wait): raise "
        "data.loader.threads to %d (the plan runs %d) and data.loader.prefetch to %d (now %d)",
        GainWithout(data.share()), 2 * lt, lt, std::max(4, 2 * prefetch), prefetch);
    if (!cuda) {
      absl::StrAppend(&fix, "; CPU ranks share the cores with their loaders: if that does not "
                            "help, lower resources.threads_per_rank by one to give them a core");
    }
    data.set_fix(fix);
  }

  // comm: the critical rank's exposed time, the link's alone (the other
  // ranks' includes waiting for it).
  v1::DiagnoseFinding comm;
  comm.set_stage("comm");
  comm.set_share(Share(b.exposed_comm_seconds(), step));
  comm.set_above_limit(comm.share() > kTargetCommShare);
  comm.set_near_limit(ranks >= 2 && NearLimit(comm.share(), kTargetCommShare));
  {
    std::string f;
    if (ranks < 2) {
      f = "one rank: no gradient all-reduce";
    } else {
      f = absl::StrFormat("exposed communication %.4f s per step on %s (%.1f%% of the step, "
                          "target %.0f%%)",
                          b.exposed_comm_seconds(),
                          several ? absl::StrCat("the critical rank, ", critical->rank())
                                  : std::string("the rank"),
                          100 * comm.share(), 100 * kTargetCommShare);
      // (A rank that does not report its all-reduce time has 0 here.)
      if (b.allreduce_seconds() > 0 && b.allreduce_seconds() >= b.exposed_comm_seconds()) {
        absl::StrAppendFormat(
            &f, "; the all-reduce of every gradient takes %.4f s, %.0f%% of it hidden behind the "
                "backward",
            b.allreduce_seconds(), 100 * (1 - b.exposed_comm_seconds() / b.allreduce_seconds()));
      }
      double most = 0;
      for (const auto& r : b.ranks()) {
        most = std::max(most, Share(r.exposed_comm_seconds(), r.step_seconds()));
      }
      if (several && most > comm.share() + 0.05) {
        absl::StrAppendFormat(&f, "; the other ranks' (up to %.1f%%) is mostly waiting for rank %d",
                              100 * most, critical->rank());
      }
    }
    comm.set_finding(f);
    if (comm.above_limit()) {
      const int64_t want = GlobalBatchForCommTarget(plan, comm.share());
      const int64_t now = int64_t{ranks} * m * k;
      std::string fix;
      if (want > 0) {
        // Samples/s at G' against G: exposed E fixed, the rest R = 1 - s
        // grows with the batch: (G'/G) / (s + (1 - s) G'/G).
        const double x = static_cast<double>(want) / static_cast<double>(now);
        const double gain = x / (comm.share() + (1 - comm.share()) * x) - 1;
        fix = absl::StrFormat(
            "raise train.global_batch to >= %d (now %d) to bring exposed communication under "
            "%.0f%% (about %+.0f%% samples/s; a larger global batch also changes the "
            "optimization); more accumulation at this global batch only moves compute between "
            "micro-steps",
            want, now, 100 * kTargetCommShare, 100 * gain);
      } else {
        fix = "the step is all communication: use fewer ranks or a faster link";
      }
      if (!plan.allreduce_measured()) {
        absl::StrAppendFormat(
            &fix, "; the plan's all-reduce time came from the topology's nominal bandwidth: "
                  "`dgca diagnose comm --ranks %d --device %s` measures the link for the next "
                  "plan",
            ranks, cuda ? "cuda" : "cpu");
      }
      comm.set_fix(fix);
    }
  }

  // straggler
  v1::DiagnoseFinding strag;
  const bool has_straggler_finding = b.ranks_size() >= 2;
  if (has_straggler_finding) {
    strag.set_stage("straggler");
    strag.set_share(Share(std::max(0.0, slowest->compute_seconds() - median_compute), step));
    strag.set_above_limit(straggler);
    strag.set_near_limit(NearLimit(straggle, kStragglerLimit));
    strag.set_finding(absl::StrFormat(
        "slowest compute: %s, %.4f s per step, %+.1f%% against the other ranks' median %.4f s "
        "(limit %+.0f%%)",
        RankName(*slowest), slowest->compute_seconds(), 100 * straggle, median_compute,
        100 * kStragglerLimit));
    if (straggler) {
      std::string fix = absl::StrFormat(
          "every rank waits for rank %d at each all-reduce (about %+.0f%% samples/s if it kept "
          "up): look at %s: ",
          slowest->rank(), GainWithout(strag.share()),
          slowest->node().empty() ? absl::StrCat("rank ", slowest->rank(), "'s node")
                                  : absl::StrCat("node ", slowest->node()));
      if (cuda) {
        fix += "its GPU's clocks and temperature (nvidia-smi -q -d PERFORMANCE,TEMPERATURE), "
               "other processes on that GPU, a slower GPU model than the others' or a narrower "
               "PCIe link";
      } else {
        absl::StrAppendFormat(&fix,
                              "other processes on its CPUs, fewer cores than "
                              "resources.threads_per_rank (%d) per rank, or a slower CPU",
                              std::max(1, plan.threads_per_rank()));
      }
      strag.set_fix(fix);
    }
  }

  // compute: the rest.
  v1::DiagnoseFinding compute;
  compute.set_stage("compute");
  compute.set_share(Share(b.compute_seconds(), step));
  compute.set_finding(absl::StrFormat(
      "forward, backward and optimizer take %.4f s per step (%.1f%% of the step): micro-batch "
      "%d x %d accumulation step(s), %s on %s",
      b.compute_seconds(), 100 * compute.share(), m, k,
      plan.precision().empty() ? "fp32" : plan.precision(), cuda ? "GPU" : "CPU"));

  // The limiting stage: the costliest clearly past its threshold, else
  // compute. One just past it is named, with its fix, but does not limit.
  v1::DiagnoseFinding* limiting = &compute;
  double cost = 0;
  std::vector<std::string> near;
  for (v1::DiagnoseFinding* f : {&data, &comm, &strag}) {
    if (f->near_limit()) {
      near.push_back(f->stage());
      f->set_finding(absl::StrFormat(
          "%s; within %.0f%% of its limit, where a few points of spread between runs move it "
          "across: not taken as limiting",
          f->finding(), 100 * kNearLimitBand));
    } else if (f->above_limit() && f->share() > cost) {
      limiting = f;
      cost = f->share();
    }
  }
  limiting->set_limiting(true);
  if (limiting == &compute) {
    compute.set_finding(compute.finding() +
                        "; the job is compute-bound: nothing in the orchestration holds it back");
    absl::StrAppend(compute.mutable_finding(), NearLimitNote(near));
  }
  out->set_limiting_stage(limiting->stage());
  *out->add_findings() = data;
  *out->add_findings() = compute;
  *out->add_findings() = comm;
  if (has_straggler_finding) *out->add_findings() = strag;
  *out->mutable_memory() = DiagnoseMemory(plan, b);
  return absl::OkStatus();
}

}  // namespace dgca
