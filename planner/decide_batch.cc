// The planner's batch decisions (planner/decisions.h): the memory budget,
// micro-batch, accumulation, bucket, the rank count against one rank alone,
// the placement, the predictions, and whether the attention is timed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/compute_prior.h"
#include "planner/decisions.h"
#include "planner/fits.h"
#include "planner/units.h"

namespace dgca {
namespace {

using planner_text::Num;
using planner_text::Pct;
using planner_text::Rate;
using planner_text::Sec;

double HostMemory(const v1::Topology& t) {
  double mem = static_cast<double>(t.memory_bytes());
  if (t.cgroup_memory_limit_bytes() > 0 && (mem == 0 || t.cgroup_memory_limit_bytes() < mem))
    mem = static_cast<double>(t.cgroup_memory_limit_bytes());
  return mem;
}

int LargestMeasuredMicroBatch(const PlannerMeasurements& meas) {
  int m = meas.step_micro_batch;
  for (const auto& [pm, sec] : meas.step_points) m = std::max(m, pm);
  for (const auto& [pm, bytes] : meas.memory_points) m = std::max(m, pm);
  return m;
}

int TotalGpus(const std::vector<v1::Topology>& nodes) {
  int n = 0;
  for (const auto& t : nodes) n += t.gpus_size();
  return n;
}

// "2 ranks: 64 samples in 93 ms + exposed all-reduce 470 ms = 563 ms ->
// 227 samples/s" (k micro-steps of m samples when k > 1).
std::string StepArithmetic(const Prediction& p) {
  const std::string work =
      p.k > 1 ? absl::StrFormat("%d x %d samples in %d x %s", p.k, p.m, p.k, Sec(p.compute))
              : absl::StrFormat("%d samples in %s", p.m, Sec(p.compute));
  if (p.n == 1)
    return absl::StrFormat("1 rank: %s -> %s samples/s", work, Num(p.sps));
  return absl::StrFormat("%d ranks: %s + exposed all-reduce %s = %s -> %s samples/s", p.n, work,
                         Sec(p.exposed), Sec(p.step), Num(p.sps));
}

// The best (micro-batch, accumulation) for n ranks with a given bucket.
struct BatchSearch {
  Prediction p;
  LinkModel link;
  double bucket = 0;
  std::string bucket_why;
  v1::ValueSource bucket_source = v1::VALUE_SOURCE_UNSPECIFIED;
  std::string k_why;
  bool target_met = false;
  int64_t k_needed_global = 0;
};

// What the searches share: the spec's own values, c(m) and the memory bound.
struct SearchContext {
  const CostInputs& in;
  int global;
  int user_m;
  int user_k;
  const std::string& mem_why;
  const std::string& step_why;
};

// The (micro-batch, accumulation) search for n ranks with `bucket`-byte
// buckets: the user's values when set; else the fastest split (in practice
// the smallest k whose micro-batch fits memory), target_met saying whether
// it meets the communication target; with no step time, the smallest k
// whose micro-batch fits memory. `warn`: the
// search of the plan's own rank count, whose doubts are the plan's.
BatchSearch SearchBatch(int n, const LinkModel& link, double bucket, bool warn,
                        const SearchContext& cx, PlanBuilder* pb) {
  const CostInputs& in = cx.in;
  const int global = cx.global;
  BatchSearch b;
  b.link = link;
  b.bucket = bucket;
  if (warn && global % n != 0)
    pb->Warn(absl::StrCat("global_batch ", global, " is not a multiple of ", n,
                          " ranks: each step uses ", (global / n) * n, " samples"));
  if (cx.user_m > 0 || cx.user_k > 0) {
    int m = cx.user_m, k = cx.user_k;
    const int per_rank = std::max(1, global / n);
    if (m <= 0) m = std::max(1, per_rank / k);
    if (k <= 0) k = std::max(1, per_rank / m);
    if (warn && m * k != per_rank)
      pb->Warn(absl::StrCat("micro_batch ", m, " x accumulation ", k, " x ", n,
                            " ranks = ", m * k * n, " != global_batch ", global));
    b.p = Predict(n, m, k, bucket, in, link);
    b.target_met = b.p.share <= kTargetCommShare;
    return b;
  }
  auto splits = Splits(n, in);
  if (splits.empty()) {
    // Even one sample per micro-step is over the memory bound.
    splits.push_back({1, std::max(1, global / n)});
    if (warn)
      pb->Warn(absl::StrCat("even a micro-batch of 1 exceeds the memory estimate (", cx.mem_why,
                            "); planning micro_batch 1"));
  }
  // The fastest split; the first (smallest k) of equals. With the global
  // batch fixed, a larger k never hides more communication: it only splits
  // the same samples into more micro-steps (each with its fixed cost) and
  // shortens the last backward that overlaps the all-reduce. A larger k
  // that met the target would meet it by computing slower.
  bool found = false;
  Prediction fastest;
  for (const auto& [m, k] : splits) {
    Prediction p = Predict(n, m, k, bucket, in, link);
    if (!p.known) {  // No measurement: smallest feasible k.
      b.p = p;
      found = true;
      break;
    }
    if (p.sps > fastest.sps * (1 + 1e-9)) fastest = p;
  }
  if (!found) {
    b.p = fastest;
    b.target_met = fastest.share <= kTargetCommShare;
  }
  if (b.p.known && n > 1) {
    // What it would take: smallest k at this m with share <= target.
    const int k_need = AccumulationForTarget(b.p);
    b.k_needed_global = static_cast<int64_t>(std::max(1, k_need)) * b.p.m * n;
    b.k_why = absl::StrFormat(
        "%sstep(k) = k x c + exposed with c = %s%s x %d = %s, all-reduce C = %s in "
        "%.0f buckets, %s, exposed = %s: %s",
        cx.step_why.empty() ? "" : cx.step_why + "; ", in.fixed > 0 ? Sec(in.fixed) + " + " : "",
        Sec(in.per_sample), b.p.m, Sec(b.p.compute), Sec(b.p.comm), b.p.buckets,
        in.can_overlap ? absl::StrFormat("exposed = max(C/nb, C - 2/3 c (1 - 1/nb)) (only the "
                                         "last micro-step's backward overlaps)")
                       : std::string("no overlap (the CPU ranks use every core, so Gloo's "
                                     "thread cannot progress during backward)"),
        Sec(b.p.exposed),
        b.target_met
            ? absl::StrFormat("k=%d gives share %s / (%d x %s + %s) = %s <= 10%%", b.p.k,
                              Sec(b.p.exposed), b.p.k, Sec(b.p.compute), Sec(b.p.exposed),
                              Pct(b.p.share))
            : absl::StrFormat("no k within global_batch %d reaches 10%% (k=%d: "
                              "%s); 10%% needs k >= %d at m=%d, i.e. "
                              "global_batch >= %d",
                              global, b.p.k, Pct(b.p.share), std::max(1, k_need), b.p.m,
                              b.k_needed_global));
  }
  if (in.max_micro > 0) {
    b.k_why += absl::StrFormat("; k=%d is the smallest with micro-batch %d <= %d that fits memory",
                               splits.front().second, splits.front().first, in.max_micro);
  }
  return b;
}

// The bucket for n ranks, given the micro-batch the search found.
double ChooseBucket(int n, const Prediction& at, const LinkModel& link, double user_bucket,
                    const ModelFacts& model, std::string* why, v1::ValueSource* src) {
  if (user_bucket > 0) {
    *src = v1::USER;
    *why = "set in the spec";
    return user_bucket;
  }
  *src = v1::DEFAULT;
  if (n == 1) {
    *why = "one rank: no all-reduce; 25 MiB default kept";
    return 25 * kMiB;
  }
  if (model.mode == "off") {
    *why = "tuning.mode off: 25 MiB default (PyTorch DDP's)";
    return 25 * kMiB;
  }
  *src = v1::PLANNER;
  std::string w;
  // Whole MiB, rounded up so G/4 still makes 4 buckets (not 5).
  const double raw = BucketFor(n, at, link, model.grad_bytes(), &w);
  double s = std::max(kMiB, std::ceil(raw / kMiB - 1e-9) * kMiB);
  if (s != raw) w += absl::StrFormat("; rounded up to %s MiB", Num(s / kMiB));
  *why = absl::StrCat(w, " [", link.why, "]");
  return s;
}

// rank_nodes and rank_local_devices for n ranks: node 0 first; CUDA ranks
// one per GPU (a GPU-less node takes none while others have GPUs); CPU
// ranks one per NUMA node or min(2, cpus) per node, spread evenly when the
// user set the count.
void PlaceRanks(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes, bool cuda, int n,
                PlanBuilder* b) {
  v1::Plan& plan = b->plan();
  plan.clear_rank_nodes();
  plan.clear_rank_local_devices();
  const int total_gpus = TotalGpus(nodes);
  int left = n;
  for (size_t i = 0; i < nodes.size() && left > 0; ++i) {
    const int gpus = nodes[i].gpus_size();
    int cap = cuda ? gpus : left;
    // A node without GPUs takes no CUDA rank while others have GPUs (it
    // used to take every rank left, all on "GPU 0" it does not have).
    if (cuda && cap == 0 && total_gpus > 0) continue;
    if (!cuda) {
      std::string why;
      int cpus = EffectiveCpus(nodes[i], &why);
      int r = nodes[i].numa_nodes() > 1 ? std::min(nodes[i].numa_nodes(), cpus)
                                        : std::max(1, std::min(2, cpus));
      cap = spec.resources().ranks() > 0
                ? (left + static_cast<int>(nodes.size() - i) - 1) /
                      static_cast<int>(nodes.size() - i)
                : r;
    }
    if (i + 1 == nodes.size() || cap <= 0) cap = std::max(cap, left);
    int r = std::min(cap, left);
    for (int j = 0; j < r; ++j) {
      plan.add_rank_nodes(nodes[i].node());
      plan.add_rank_local_devices(cuda ? j % std::max(1, gpus) : j);
    }
    left -= r;
  }
}

// A CPU rank's threads: the spec's, else the node's CPUs shared by its
// ranks (as DecideThreads will decide).
int CpuThreadsPerRank(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                      int ranks) {
  if (spec.resources().threads_per_rank() > 0) return spec.resources().threads_per_rank();
  std::string why;
  const int cpus = EffectiveCpus(nodes[0], &why);
  const int per_node = std::max(
      1, (ranks + static_cast<int>(nodes.size()) - 1) / static_cast<int>(nodes.size()));
  return std::max(1, cpus / per_node);
}

// c(m): fitted to the measurements when there are any, else the compute
// prior; records which in the plan (compute_source) with the prior's ideal
// line either way, from which a finished job learns its class's efficiency.
StepTimeFit StepTimeOf(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                       const ModelFacts& model, bool cuda, Precision precision,
                       const PlannerMeasurements& meas, PlanBuilder* b) {
  StepTimeFit fit = FitStepTime(meas);
  const int ranks = b->plan().ranks();
  const int nodes_n = static_cast<int>(nodes.size());
  const ComputePrior prior = PriorStepTime(
      nodes, cuda, precision, model.cfg, model.seq_len,
      cuda ? 1 : CpuThreadsPerRank(spec, nodes, ranks), (ranks + nodes_n - 1) / nodes_n, meas);
  v1::Plan& plan = b->plan();
  if (prior.ok) {
    plan.set_compute_device_class(prior.device_class);
    plan.set_compute_ideal_fixed_seconds(prior.Ideal(0));
    plan.set_compute_ideal_seconds_per_sample(prior.Ideal(1) - prior.Ideal(0));
  }
  if (fit.per_sample > 0) {
    plan.set_compute_source("measured");
  } else if (prior.ok) {
    fit.fixed = prior.fixed;
    fit.per_sample = prior.per_sample;
    fit.why = prior.why;
    plan.set_compute_source("prior");
  } else {
    fit.why = prior.why;
  }
  return fit;
}

// c(m), G, the memory bound and whether communication can overlap, for the
// plan's ranks.
CostInputs CostInputsOf(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                        const ModelFacts& model, bool cuda, const MemoryPlan& memory,
                        const StepTimeFit& fit, const PlannerMeasurements& meas, int ranks) {
  CostInputs in;
  in.grad_bytes = model.grad_bytes();
  in.global = model.global;
  in.max_micro = memory.max_micro;
  in.skew = std::max(0.0, meas.allreduce_skew_per_compute);
  in.fixed = fit.fixed;
  in.per_sample = fit.per_sample;
  if (!cuda) {
    // Gloo progresses on a thread of its own; with every core computing it
    // only runs between GEMMs (measured here: exposed share == all-reduce
    // share with 2 ranks x 1 thread on 2 cores, bench/gloo/gloo-exposed).
    std::string why;
    const int cpus = EffectiveCpus(nodes[0], &why);
    const int per_node = std::max(
        1, (ranks + static_cast<int>(nodes.size()) - 1) / static_cast<int>(nodes.size()));
    in.can_overlap = per_node * CpuThreadsPerRank(spec, nodes, ranks) < cpus;
  }
  return in;
}

// The micro-batch and accumulation decisions of `chosen` for n ranks.
void DecideMicroBatchAndAccumulation(const BatchSearch& chosen, int n, const ModelFacts& model,
                                     const MemoryPlan& memory, int user_m, int user_k,
                                     const std::string& step_why, PlanBuilder* b) {
  const Prediction& p = chosen.p;
  const int global = model.global;
  b->plan().set_micro_batch(p.m);
  b->plan().set_accumulation(p.k);
  const bool over = memory.max_micro > 0 && p.m > memory.max_micro;
  if (user_m > 0) {
    b->Decide("train.micro_batch", absl::StrCat(p.m), v1::USER,
              over ? absl::StrFormat("set in the spec (the memory model allows %d: %s)",
                                     memory.max_micro, memory.why)
                   : "set in the spec");
  } else {
    b->Decide("train.micro_batch", absl::StrCat(p.m), v1::PLANNER,
              absl::StrFormat("global_batch %d / (%d rank(s) x accumulation %d%s) = %d; "
                              "memory: %s",
                              global, n, p.k, user_k > 0 ? " from the spec" : "", p.m,
                              memory.why));
  }
  if (over)
    b->Warn(absl::StrFormat("micro_batch %d exceeds the %d the memory model fits (%s)", p.m,
                            memory.max_micro, memory.why));
  if (user_k > 0) {
    b->Decide("train.accumulation", absl::StrCat(p.k), v1::USER, "set in the spec");
  } else if (user_m > 0) {
    b->Decide("train.accumulation", absl::StrCat(p.k), v1::PLANNER,
              absl::StrFormat("global_batch %d / (%d rank(s) x micro_batch %d from the "
                              "spec) = %d",
                              global, n, p.m, p.k));
  } else if (!p.known) {
    b->Decide("train.accumulation", absl::StrCat(p.k), v1::PLANNER,
              absl::StrFormat("no step-time measurement: the smallest k whose "
                              "micro-batch fits memory (%s)",
                              memory.why));
    b->Warn(absl::StrCat("no step-time measurement and ", step_why,
                         ": accumulation chosen from memory alone and no predictions made "
                         "(give a measurement or use tuning.mode: trial)"));
  } else if (n == 1) {
    b->Decide("train.accumulation", absl::StrCat(p.k), v1::PLANNER,
              absl::StrFormat("one rank: no gradient communication, so the smallest k "
                              "whose micro-batch fits memory (%d x %d = %d)",
                              p.m, p.k, p.m * p.k));
  } else {
    b->Decide("train.accumulation", absl::StrCat(p.k), v1::PLANNER,
              absl::StrCat("the fastest split of global_batch ", global,
                           " (at a fixed global batch a larger k does not lower the comm "
                           "share, it only adds micro-steps): ",
                           chosen.k_why));
    if (!chosen.target_met)
      b->Warn(absl::StrFormat("exposed communication is %s of the step (target 10%%): "
                              "raise train.global_batch to >= %d to reach it",
                              Pct(p.share), chosen.k_needed_global));
  }
}

// The plan's predictions at `p` (the chosen bucket) with their arithmetic.
void RecordPredictions(const Prediction& p, int n, const CostInputs& in, const LinkModel& link,
                       const std::string& step_why, const PlannerMeasurements& meas,
                       PlanBuilder* b) {
  v1::Plan& plan = b->plan();
  if (p.known) {
    plan.set_predicted_step_seconds(p.step);
    plan.set_predicted_comm_share(p.share);
    plan.set_predicted_samples_per_second(p.sps);
    plan.set_predicted_single_rank_samples_per_second(p.m / p.compute);
  }
  plan.set_predicted_allreduce_seconds(p.comm);  // known from the link alone
  plan.set_predicted_allreduce_probe_seconds(p.comm_probe);
  if (!p.known) return;
  // The prediction's arithmetic in one place (the decisions above may be
  // the user's, whose reasons are just "set in the spec").
  std::string comm_why = "one rank: no gradient all-reduce";
  if (n > 1 && link.busbw > 0) {
    const double f = 2.0 * (n - 1) / n;
    const double full = std::min(p.bucket > 0 ? p.bucket : in.grad_bytes, in.grad_bytes);
    const double rest = in.grad_bytes - (p.buckets - 1) * full;
    comm_why = absl::StrFormat(
        "all-reduce C = %st(%s)%s = %s (t: %s)%s",
        p.buckets > 1 ? absl::StrFormat("%.0f x t(%s) + ", p.buckets - 1, FormatBytes(full)) : "",
        FormatBytes(rest), in.skew > 0 ? absl::StrFormat(" + %.3f x c", in.skew) : "",
        Sec(p.comm),
        link.points.size() >= 2
            ? absl::StrFormat("interpolated between %d measured sizes",
                              static_cast<int>(link.points.size()))
            : absl::StrFormat("latency %s + bytes x %.2f / %s", Sec(link.latency), f,
                              Rate(link.busbw)),
        in.skew > 0 ? absl::StrCat("; ", absl::StrFormat("%.3f", in.skew),
                                   " x c = waiting for the slower peer, ",
                                   meas.allreduce_skew_source)
                    : "");
  }
  b->Decide("predicted.step_seconds", Sec(p.step), v1::PLANNER,
            absl::StrFormat("%s; c(%d) = %s; %s; exposed = %s (%s); step = %d x %s + %s = %s, "
                            "comm share %s",
                            step_why, p.m, Sec(p.compute), comm_why, Sec(p.exposed),
                            in.can_overlap ? "max(C/nb, C - 2/3 c (1 - 1/nb))"
                                           : "= C: CPU ranks use every core, no overlap",
                            p.k, Sec(p.compute), Sec(p.exposed), Sec(p.step), Pct(p.share)));
}

}  // namespace

MemoryPlan DecideMemory(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                        const ModelFacts& model, bool cuda, Precision precision,
                        const PlannerMeasurements& meas, PlanBuilder* b) {
  (void)spec;
  MemoryPlan out;
  MemoryEstimate est =
      EstimateMemory(model.cfg, model.seq_len, precision, b->plan().attention() != "gemm");
  double budget = 0;
  if (cuda) {
    double mem = 0;
    for (const auto& t : nodes)
      for (const auto& g : t.gpus())
        if (g.memory_bytes() > 0 && (mem == 0 || g.memory_bytes() < mem))
          mem = static_cast<double>(g.memory_bytes());
    out.device_memory = mem;
    if (mem > 0) {
      budget = kGpuMemoryTarget * mem - kCudaContextBytes;
      out.why = absl::StrFormat("%.0f%% of %s GPU memory - %s CUDA context = %s",
                                kGpuMemoryTarget * 100, FormatBytes(mem),
                                FormatBytes(kCudaContextBytes), FormatBytes(budget));
    }
  } else {
    double mem = 0;
    bool limited = false;
    for (const auto& t : nodes) {
      double h = HostMemory(t);
      if (h > 0 && (mem == 0 || h < mem)) {
        mem = h;
        limited = t.cgroup_memory_limit_bytes() > 0 &&
                  static_cast<double>(t.cgroup_memory_limit_bytes()) == h;
      }
    }
    const int ranks_here =
        std::max(1, (b->plan().ranks() + static_cast<int>(nodes.size()) - 1) /
                        static_cast<int>(nodes.size()));
    out.device_memory = mem / ranks_here;
    if (mem > 0) {
      budget = kCpuMemoryTarget * mem / ranks_here;
      out.why = absl::StrFormat("%.0f%% of %s %s / %d rank(s) per node = %s",
                                kCpuMemoryTarget * 100, FormatBytes(mem),
                                limited ? "(the cgroup memory limit)" : "host memory",
                                ranks_here, FormatBytes(budget));
    }
  }
  std::string measured_why;
  FitMemoryLine(meas.memory_points, meas.memory_source, cuda ? kCudaContextBytes : 0, budget,
                &est, &measured_why);
  out.budget = budget;
  b->plan().set_device_memory_bytes(out.device_memory);
  // The target includes the CUDA context, as predicted_memory_bytes does.
  b->plan().set_memory_target_bytes(budget > 0 ? budget + (cuda ? kCudaContextBytes : 0) : 0);
  if (budget > 0) {
    out.max_micro = MaxMicroBatch(est, budget);
    out.why += absl::StrFormat(
        "; state %s (weights, fp32 grads, AdamW) + %s workspace%s, %s activations per "
        "sample at seq_len %d%s -> at most %d samples",
        FormatBytes(est.params + est.grads + est.optimizer), FormatBytes(est.workspace),
        measured_why.empty() ? "" : " and runtime", FormatBytes(est.activations_per_sample),
        model.seq_len, measured_why, out.max_micro);
    if (out.max_micro == 0)
      b->Warn(absl::StrCat("the model state alone does not fit the memory budget (", out.why,
                           "); the job will likely run out of memory"));
  } else {
    if (LargestMeasuredMicroBatch(meas) > 0) {
      out.max_micro = LargestMeasuredMicroBatch(meas);
      out.why = absl::StrCat("device memory unknown; the measured micro-batch of ",
                             out.max_micro, " ran, so it fits");
    } else {
      out.why = "device memory unknown and no micro-batch measured: no memory bound";
    }
    b->Warn(out.why);
    out.why += measured_why;  // the prediction still goes through the measured points
  }
  b->plan().set_predicted_memory_bytes(0);
  out.est = est;
  return out;
}

void PredictMemory(const MemoryEstimate& est, int m, const std::string& why, bool cuda,
                   PlanBuilder* b) {
  v1::Plan& plan = b->plan();
  plan.set_predicted_memory_bytes(est.total(m) + (cuda ? kCudaContextBytes : 0));
  plan.set_predicted_activation_bytes_per_sample(est.activations_per_sample);
  b->Decide("predicted.memory_bytes", FormatBytes(plan.predicted_memory_bytes()), v1::PLANNER,
            absl::StrFormat("%s%s fixed + micro-batch %d x %s activations; %s",
                            cuda ? absl::StrCat(FormatBytes(kCudaContextBytes), " CUDA context + ")
                                 : std::string(),
                            FormatBytes(est.total(0)), m, FormatBytes(est.activations_per_sample),
                            why));
}

BatchPlan DecideBatch(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                      const ModelFacts& model, bool cuda, Precision precision,
                      const MemoryPlan& memory, const PlannerMeasurements& meas,
                      PlanBuilder* b) {
  if (meas.allreduce_skew_per_compute > 0)
    b->plan().set_allreduce_skew_per_compute(meas.allreduce_skew_per_compute);
  const StepTimeFit fit = StepTimeOf(spec, nodes, model, cuda, precision, meas, b);
  BatchPlan out;
  out.in = CostInputsOf(spec, nodes, model, cuda, memory, fit, meas, b->plan().ranks());
  const CostInputs& in = out.in;
  const int user_m = spec.train().micro_batch();
  const int user_k = spec.train().accumulation();
  const double user_bucket = spec.comm().bucket_mb() * kMiB;
  const SearchContext cx{in, model.global, user_m, user_k, memory.why, fit.why};

  // Candidate rank counts: the planned one, and 1 when the planner chose it.
  const int planned = b->plan().ranks();
  std::vector<int> ns = {planned};
  const bool auto_ranks = spec.resources().ranks() <= 0;
  if (auto_ranks && planned > 1 && cuda) ns.push_back(1);

  std::map<int, BatchSearch> best;
  for (int n : ns) {
    const LinkModel link = ModelLink(nodes, n, cuda, meas);
    // First with a provisional bucket (the user's, or G/4), then with the
    // bucket chosen for that micro-batch.
    BatchSearch s = SearchBatch(
        n, link, user_bucket > 0 ? user_bucket : in.grad_bytes / kMinBuckets, false, cx, b);
    std::string bucket_why;
    v1::ValueSource bucket_source = v1::VALUE_SOURCE_UNSPECIFIED;
    const double bucket = ChooseBucket(n, s.p, link, user_bucket, model, &bucket_why, &bucket_source);
    s = SearchBatch(n, link, bucket, n == planned, cx, b);
    s.bucket_why = bucket_why;
    s.bucket_source = bucket_source;
    best[n] = s;
  }

  // Ranks: compare with one rank when the planner chose the rank count.
  int n = planned;
  BatchSearch chosen = best[n];
  if (best.count(1) && n > 1 && chosen.p.known) {
    const BatchSearch& one = best[1];
    const std::string arithmetic =
        absl::StrCat(StepArithmetic(chosen.p), "; ", StepArithmetic(one.p), " (",
                     b->plan().compute_source() == "prior" ? "compute from the prior"
                                                           : "compute measured",
                     ", all-reduce over ", chosen.link.path, " at ", Rate(chosen.link.busbw), ")");
    if (one.p.sps > chosen.p.sps) {
      b->Decide("resources.ranks", "1", v1::PLANNER,
                absl::StrFormat("%d ranks would be slower: %s; raise train.global_batch "
                                "(>= %d) or improve the link to use all GPUs",
                                n, arithmetic, chosen.k_needed_global));
      b->Warn(absl::StrFormat("planned 1 rank instead of %d: data parallelism over %s "
                              "would be slower at global_batch %d",
                              n, chosen.link.path, model.global));
      n = 1;
      chosen = one;
      b->plan().set_ranks(1);
    } else {
      b->Decide("resources.ranks", absl::StrCat(n), v1::PLANNER,
                absl::StrFormat("one rank per GPU, %.2fx one GPU alone: %s",
                                one.p.sps > 0 ? chosen.p.sps / one.p.sps : 0, arithmetic));
    }
  }
  out.link = chosen.link;
  b->plan().set_allreduce_measured(out.link.measured);
  PlaceRanks(spec, nodes, cuda, n, b);
  DecideMicroBatchAndAccumulation(chosen, n, model, memory, user_m, user_k, fit.why, b);

  // Bucket.
  const double bucket = chosen.bucket;
  b->Decide("comm.bucket_mb",
            chosen.bucket_source == v1::USER ? Num(spec.comm().bucket_mb()) : Num(bucket / kMiB),
            chosen.bucket_source, chosen.bucket_why);
  b->plan().set_bucket_mb(bucket / kMiB);

  // Final predictions with the chosen bucket.
  const Prediction p = Predict(n, chosen.p.m, chosen.p.k, bucket, in, out.link);
  PredictMemory(memory.est, p.m, memory.why, cuda, b);
  RecordPredictions(p, n, in, out.link, fit.why, meas, b);
  // One rank alone as the rank decision compared it: at its own best split.
  if (best.count(1) && best[1].p.known)
    b->plan().set_predicted_single_rank_samples_per_second(best[1].p.sps);
  if (memory.High(b->plan().predicted_memory_bytes()))
    b->Warn(absl::StrFormat("predicted memory %s is above 85%% of %s",
                            FormatBytes(b->plan().predicted_memory_bytes()),
                            FormatBytes(memory.device_memory)));
  return out;
}

void DecideAttentionTimed(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                          Precision precision, const MemoryPlan& memory,
                          const PlannerMeasurements& meas, PlanBuilder* b) {
  v1::Plan& plan = b->plan();
  if (!cuda || plan.attention() != "fused") return;
  const std::string want = absl::AsciiStrToLower(spec.train().attention());
  if (!want.empty() && want != "auto") return;  // the user's "fused"
  const int m = plan.micro_batch();
  const double budget = memory.budget;
  // The GEMM version's memory: the line through earlier runs of it on these
  // nodes where there are any (an explicit gemm plan, or an "auto" plan whose
  // ranks kept it), else the plan's line (the fused kernels', through any
  // measured points) plus what the memory model says the GEMM version adds
  // (its [heads, L, L] probabilities per sample, workspace).
  MemoryEstimate gemm_est =
      EstimateMemory(model.cfg, model.seq_len, precision, /*fused_attention=*/false);
  std::string gemm_why;
  if (FitMemoryLine(meas.gemm_memory_points, meas.gemm_memory_source, kCudaContextBytes, budget,
                    &gemm_est, &gemm_why)) {
    gemm_why = absl::StrCat("the line through the GEMM version's own peaks", gemm_why);
  } else {
    const MemoryEstimate gemm_model = gemm_est;
    const MemoryEstimate fused_model =
        EstimateMemory(model.cfg, model.seq_len, precision, /*fused_attention=*/true);
    gemm_est = memory.est;
    gemm_est.activations_per_sample +=
        std::max(0.0, gemm_model.activations_per_sample - fused_model.activations_per_sample);
    gemm_est.workspace += std::max(0.0, gemm_model.workspace - fused_model.workspace);
    gemm_why = absl::StrCat(
        "the fused kernels' line plus the memory model's GEMM probabilities, ",
        FormatBytes(gemm_est.activations_per_sample - memory.est.activations_per_sample),
        " per sample");
  }
  const double gemm = gemm_est.total(m);
  const int d = model.cfg.heads > 0 ? model.cfg.hidden / model.cfg.heads : 0;
  if (budget <= 0 || gemm > budget) {
    b->Decide("train.attention", "fused", v1::PLANNER,
              absl::StrCat(b->ReasonOf("train.attention"),
                           "; not timed against the GEMM version: ",
                           budget <= 0
                               ? "device memory unknown, so nothing says its probabilities would "
                                 "fit"
                               : absl::StrCat("its probabilities would need ", FormatBytes(gemm),
                                              " at micro-batch ", m, ", over the ",
                                              FormatBytes(budget), " budget")));
    return;
  }
  // A rank may keep either version: predict the larger. The GEMM version's
  // is unless its own peaks measured it below the fused kernels' line.
  const bool was_high = memory.High(plan.predicted_memory_bytes());
  if (gemm >= memory.est.total(m)) {
    PredictMemory(gemm_est, m,
                  absl::StrCat("the GEMM attention's, which a rank keeps if it times faster (",
                               gemm_why, "), the larger of the two versions'; ", memory.why),
                  cuda, b);
  } else {
    PredictMemory(memory.est, m,
                  absl::StrCat("the fused attention's, which a rank keeps unless the GEMM "
                               "version times faster, the larger of the two versions' (the GEMM "
                               "version's: ",
                               FormatBytes(gemm + kCudaContextBytes), ", ", gemm_why, "); ",
                               memory.why),
                  cuda, b);
  }
  if (memory.High(plan.predicted_memory_bytes()) && !was_high)
    b->Warn(absl::StrFormat("predicted memory %s (with the attention version a rank may keep) is "
                            "above 85%% of %s",
                            FormatBytes(plan.predicted_memory_bytes()),
                            FormatBytes(memory.device_memory)));
  plan.set_attention("auto");
  b->Decide(
      "train.attention", "auto", v1::PLANNER,
      absl::StrFormat(
          "%s, head size %d, seq_len %d <= 512: each rank times the fused flash-style kernels and "
          "the GEMM version (one layer's forward + backward at micro-batch %d) when it starts and "
          "keeps the faster (the fused unless GEMM is 5%% faster; every rank takes rank 0's "
          "choice; the fused untimed in deterministic mode; a run resumed from a checkpoint keeps "
          "the checkpoint's, untimed); the GEMM version's [heads, L, L] probabilities fit too (%s "
          "at micro-batch %d, budget %s; the predicted memory is the larger version's)",
          plan.precision(), d, model.seq_len, m, FormatBytes(gemm), m, FormatBytes(budget)));
}

}  // namespace dgca
