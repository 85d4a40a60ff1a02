// The planner. Cost model (all per rank, seconds and bytes):
//
//   c(m)      = a + b m                                  forward+backward
//               (+optimizer) of a micro-batch of m samples on one rank,
//               measured: b = step_seconds / step_micro_batch, a = 0 from one
//               point; a least-squares line through step_points of two or
//               more micro-batches (a >= 0)
//   G         = 4 * parameters                           fp32 gradient bytes
//               (the communicators all-reduce floats)
//   f         = 2(n-1)/n                                 ring all-reduce factor
//   t(S)      = latency + S * f / busbw                  one all-reduce of S bytes
//   C         = ceil(G/S) * latency + G * f / busbw      all gradients, S-byte buckets
//   B_w       = 2/3 * c(m)                               backward of the last
//               micro-step: only it can hide communication (there is no
//               all-reduce on accumulation micro-steps)
//   exposed   = max(C/nb, C - B_w * (1 - 1/nb))          nb = ceil(G/S) buckets:
//               the first bucket is ready after 1/nb of backward, the last one
//               only when backward ends; exposed = C when no core is free to
//               progress the collectives (CPU ranks using every core)
//   overlap   = C - exposed
//   step(k)   = k * c(m) + exposed                       one optimizer step
//   samples/s = n * m * k / step(k);  comm share = exposed / step(k)
//
// Decisions follow DESIGN.md "Planner"; every one carries its arithmetic.
#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spec/spec.h"
#include "model/core/config.h"
#include "model/core/memory_model.h"

namespace dgca {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGpuMemoryTarget = 0.80;   // DESIGN.md: 70-85% of device memory
constexpr double kMemoryWarnShare = 0.85;   // a predicted peak above this share of the device warns
constexpr double kCpuMemoryTarget = 0.70;   // host memory is shared with the OS
constexpr double kCudaContextBytes = 512 * kMiB;
constexpr double kBackwardShare = 2.0 / 3.0;
constexpr int kMinBuckets = 4;
constexpr double kFastLinkBucketBytes = 25 * kMiB;  // PyTorch DDP's default
// One NCCL shared-memory segment, as a failing NCCL run reported it
// ("Error while creating shared memory segment /dev/shm/nccl-... (size
// 9637888)", microsoft/WSL#12467): NCCL_BUFFSIZE 4 MiB for the Simple
// protocol plus the LL and LL128 buffers of one connection.
constexpr double kShmSegmentBytes = 9637888;
constexpr int kShmChannels = 2;  // NCCL opens at least 2 channels on PCIe

std::string Num(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return absl::StrFormat("%.0f", x);
  if (std::fabs(x) >= 100) return absl::StrFormat("%.0f", x);
  if (std::fabs(x) >= 10) return absl::StrFormat("%.1f", x);
  if (std::fabs(x) >= 0.1) return absl::StrFormat("%.3g", x);
  return absl::StrFormat("%.2g", x);
}
std::string Sec(double s) {
  if (s <= 0) return "0 s";
  if (s < 1e-3) return absl::StrFormat("%.0f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.3g ms", s * 1e3);
  return absl::StrFormat("%.3g s", s);
}
std::string Bytes(double b) { return FormatBytes(b); }
std::string Rate(double bytes_per_s) {
  if (bytes_per_s >= 1e9) return absl::StrFormat("%.3g GB/s", bytes_per_s / 1e9);
  return absl::StrFormat("%.3g MB/s", bytes_per_s / 1e6);
}
std::string Pct(double x) { return absl::StrFormat("%.1f%%", 100 * x); }

void Decide(v1::Plan* plan, const std::string& name, const std::string& value,
            v1::ValueSource source, const std::string& reason) {
  for (auto& d : *plan->mutable_decisions()) {
    if (d.name() == name) {
      d.set_value(value);
      d.set_source(source);
      d.set_reason(reason);
      return;
    }
  }
  v1::PlanDecision* d = plan->add_decisions();
  d->set_name(name);
  d->set_value(value);
  d->set_source(source);
  d->set_reason(reason);
}

// CPU ranks per CPU past which a spec is refused (Planner::Ranks).
constexpr int kMaxCpuRanksPerCore = 4;

int EffectiveCpus(const v1::Topology& t, std::string* why) {
  int cpus = t.cpu_count();
  if (cpus <= 0) {
    cpus = 1;
    *why = "CPU count unknown, assuming 1";
  } else {
    *why = absl::StrCat(cpus, " CPUs");
  }
  if (t.cgroup_cpu_limit() > 0 && t.cgroup_cpu_limit() < cpus) {
    int lim = std::max(1, static_cast<int>(std::floor(t.cgroup_cpu_limit())));
    *why = absl::StrCat(cpus, " CPUs, cgroup limit ", Num(t.cgroup_cpu_limit()),
                        " -> ", lim);
    cpus = lim;
  }
  return cpus;
}

double HostMemory(const v1::Topology& t) {
  double mem = static_cast<double>(t.memory_bytes());
  if (t.cgroup_memory_limit_bytes() > 0 &&
      (mem == 0 || t.cgroup_memory_limit_bytes() < mem))
    mem = static_cast<double>(t.cgroup_memory_limit_bytes());
  return mem;
}

// Worst path rank: higher is worse. NV# best.
int PathRank(const std::string& p) {
  if (absl::StartsWith(p, "NV")) return 0;
  if (p == "PIX") return 1;
  if (p == "PXB") return 2;
  if (p == "PHB") return 3;
  if (p == "NODE") return 4;
  if (p == "SYS") return 5;
  return 6;  // unknown
}

// PCIe bandwidth of a GPU's link in bytes/s from "16.0 GT/s PCIe" x16.
double PcieBytesPerSecond(const v1::Gpu& g) {
  double gts = 16.0;
  std::string s = g.link_speed();
  double v = 0;
  if (!s.empty() && absl::SimpleAtod(s.substr(0, s.find(' ')), &v) && v > 0) gts = v;
  int w = g.link_width() > 0 ? g.link_width() : 16;
  // 128b/130b encoding (PCIe 3.0 and later).
  return gts * 1e9 * w * (128.0 / 130.0) / 8.0;
}

struct LinkModel {
  double busbw = 0;    // bytes/s
  double latency = 0;  // s
  std::string path;    // worst path among the ranks ("NV18", "SYS", "net", ...)
  std::string why;     // how busbw/latency were obtained
  bool measured = false;
  // Measured (bytes, seconds) of one all-reduce among the job's ranks, by
  // size; when there are two or more, a bucket's time is interpolated
  // between them instead of latency + bytes f / busbw (small sizes on a
  // shared host are far from that line).
  std::vector<std::pair<double, double>> points;
};

// Seconds of one all-reduce of `bytes` among n ranks.
double AllReduceSeconds(const LinkModel& link, double bytes, int n) {
  const double f = 2.0 * (n - 1) / n;
  const auto& pts = link.points;
  if (pts.size() >= 2) {
    if (bytes <= pts.front().first) return pts.front().second;
    for (size_t i = 1; i < pts.size(); ++i) {
      if (bytes <= pts[i].first) {
        const auto& a = pts[i - 1];
        const auto& b = pts[i];
        return a.second + (b.second - a.second) * (bytes - a.first) / (b.first - a.first);
      }
    }
    return pts.back().second + (link.busbw > 0 ? (bytes - pts.back().first) * f / link.busbw : 0);
  }
  return link.latency + (link.busbw > 0 ? bytes * f / link.busbw : 0);
}

// Everything the predictions need for one candidate rank count.
struct Inputs {
  double per_sample = 0;  // b: seconds per sample per rank (0 = unknown)
  double fixed = 0;       // a: seconds per micro-step independent of m
  double skew = 0;        // in-job extra all-reduce time per second of c(m)
  bool can_overlap = true;  // false: CPU ranks use every core, Gloo cannot progress
  double grad_bytes = 0;
  int max_micro = 0;      // from memory (0 = unknown)
  int global = 0;         // global batch
};

struct Prediction {
  int n = 1, m = 1, k = 1;
  double bucket = 0;
  double compute = 0, comm = 0, overlap = 0, exposed = 0, step = 0;
  double comm_probe = 0;  // comm without the learned peer wait
  double buckets = 1;
  double sps = 0, share = 0;
  bool known = false;
};

Prediction Predict(int n, int m, int k, double bucket, const Inputs& in,
                   const LinkModel& link) {
  Prediction p;
  p.n = n;
  p.m = m;
  p.k = k;
  p.bucket = bucket;
  const double nb = bucket > 0 ? std::max(1.0, std::ceil(in.grad_bytes / bucket)) : 1;
  p.buckets = nb;
  if (n > 1 && link.busbw > 0) {
    // nb - 1 full buckets and the rest.
    const double full = bucket > 0 ? std::min(bucket, in.grad_bytes) : in.grad_bytes;
    p.comm = (nb - 1) * AllReduceSeconds(link, full, n) +
             AllReduceSeconds(link, in.grad_bytes - (nb - 1) * full, n);
  }
  p.comm_probe = p.comm;
  if (in.per_sample <= 0) return p;
  p.known = true;
  p.compute = in.fixed + in.per_sample * m;
  // Waiting for the slower peer inside the all-reduce (learned from earlier
  // jobs; see PlannerMeasurements::allreduce_skew_per_compute).
  if (n > 1) p.comm += in.skew * p.compute;
  if (in.can_overlap) {
    const double backward = kBackwardShare * p.compute;
    p.exposed = std::max(p.comm / nb, p.comm - backward * (1 - 1 / nb));
  } else {
    p.exposed = p.comm;
  }
  p.overlap = p.comm - p.exposed;
  p.step = k * p.compute + p.exposed;
  p.sps = p.step > 0 ? static_cast<double>(n) * m * k / p.step : 0;
  p.share = p.step > 0 ? p.exposed / p.step : 0;
  return p;
}

// Feasible (m, k) with n*m*k == global (per-rank batch divisible by k) and
// m <= max_micro (when known).
std::vector<std::pair<int, int>> Splits(int n, const Inputs& in) {
  // Divisors of the per-rank batch, by ascending k (O(sqrt) even for huge
  // batches).
  const int per_rank = std::max(1, in.global / n);
  std::vector<int> ks;
  for (int64_t d = 1; d * d <= per_rank; ++d) {
    if (per_rank % d) continue;
    ks.push_back(static_cast<int>(d));
    if (d * d != per_rank) ks.push_back(static_cast<int>(per_rank / d));
  }
  std::sort(ks.begin(), ks.end());
  std::vector<std::pair<int, int>> out;
  for (int k : ks) {
    int m = per_rank / k;
    if (in.max_micro > 0 && m > in.max_micro) continue;
    out.push_back({m, k});
    if (out.size() >= 64) break;  // enough candidates; k only grows from here
  }
  return out;
}

// Earlier jobs' peaks `points` (micro-batch, bytes with the CUDA context
// `ctx`), from `source`: `est` with the line through them. One point's
// excess over the model at its micro-batch m1 includes fixed overheads (a
// CPU rank's runtime and loader, NCCL's buffers) as well as any activations
// the model misses, so the slope is the larger of the model's and the
// measured per sample when the point fits `budget` (0 = unknown; larger
// micro-batches are predicted high), the smaller when it does not (smaller
// ones are predicted high too); the rest is fixed. Two or more micro-batches
// measure the slope itself (least squares, never below the model's); the
// fixed part then puts the line on or above every point. Returns whether a
// point was usable (else `est` is unchanged); *why says how.
bool FitMemoryLine(const std::vector<std::pair<int, double>>& points, const std::string& source, double ctx,
                   double budget, MemoryEstimate* est, std::string* why) {
  why->clear();
  const double modelled = est->activations_per_sample;
  std::vector<std::pair<int, double>> held;  // (micro-batch, bytes without the CUDA context)
  for (const auto& [m, bytes] : points)
    if (m > 0 && bytes > 0 && std::isfinite(bytes)) held.emplace_back(m, bytes - ctx);
  std::set<int> distinct;
  for (const auto& p : held) distinct.insert(p.first);
  if (distinct.size() == 1) held.resize(1);  // one micro-batch: its newest peak
  double slope = modelled;
  if (distinct.size() >= 2) {
    double mm = 0, mh = 0;
    for (const auto& [m, h] : held) mm += m, mh += h;
    mm /= held.size();
    mh /= held.size();
    double sxx = 0, sxy = 0;
    for (const auto& [m, h] : held) sxx += (m - mm) * (m - mm), sxy += (m - mm) * (h - mh);
    // Never below the model's slope: points that mix runs (peaks stored
    // before ranks reported the attention an "auto" plan kept were filed
    // under the fused kernels) or noise could fit a slope too low to
    // extrapolate past the largest point, and the planner would pick a
    // micro-batch that does not fit. A model that overestimates is only
    // conservative.
    const double fitted = sxy / sxx;  // sxx > 0: two distinct micro-batches
    slope = std::max(fitted, modelled);
    *why = absl::StrFormat(
        " (%s; fitted over micro-batches %s: %s, the line on or above every point, the rest "
        "fixed)",
        source,
        absl::StrJoin(distinct, ", "),
        fitted <= 0 ? absl::StrCat("the peaks do not grow with the micro-batch, so the memory "
                                   "model's ",
                                   Bytes(modelled), " per sample")
                    : absl::StrCat(Bytes(slope), " per sample, the larger of the fitted ",
                                   Bytes(fitted), " and the memory model's ", Bytes(modelled)));
  } else if (!held.empty()) {
    const auto [m1, h1] = held.front();
    const double measured = (h1 - est->total(0)) / m1;
    const bool fits = budget <= 0 || h1 <= budget;
    if (measured > 0) slope = fits ? std::max(modelled, measured) : std::min(modelled, measured);
    *why = absl::StrFormat(
        " (%s; through it at %s per sample, the %s of the measured %s and the memory model's "
        "%s, the rest fixed)",
        source, Bytes(slope), fits ? "larger" : "smaller",
        Bytes(std::max(0.0, measured)), Bytes(modelled));
  }
  if (!held.empty()) {
    // The line of that slope on or above every point (through the highest
    // above it); the rest is fixed.
    double fixed = -std::numeric_limits<double>::infinity();
    for (const auto& [m, h] : held) fixed = std::max(fixed, h - slope * m);
    est->activations_per_sample = slope;
    est->workspace = std::max(0.0, est->workspace + fixed - est->total(0));
  }
  return !held.empty();
}

class Planner {
 public:
  Planner(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
          const PlannerMeasurements& meas, TrialRunner* runner)
      : spec_(spec), nodes_(nodes), meas_(meas), runner_(runner) {}

  absl::StatusOr<v1::Plan> Run();

 private:
  void Warn(const std::string& w) { plan_.add_warnings(w); }
  void Model();
  void Device();
  void Ranks();
  void Backend();
  void Memory();
  void Link(int n, LinkModel* link);
  void ApplyMeasurements(int n, LinkModel* link);
  void BatchAndBuckets();
  // in_.per_sample and in_.fixed from the measurements; step_why_ says how.
  void FitStepTime();
  int LargestMeasuredMicroBatch() const {
    int m = meas_.step_micro_batch;
    for (const auto& [pm, sec] : meas_.step_points) m = std::max(m, pm);
    for (const auto& [pm, bytes] : meas_.memory_points) m = std::max(m, pm);
    return m;
  }
  void Precision();
  void Attention();
  void AttentionTimed();
  // Sets predicted_memory_bytes (+ the CUDA context) and
  // predicted_activation_bytes_per_sample from `est` at micro-batch m, and
  // the decision predicted.memory_bytes that says how.
  void PredictMemory(const MemoryEstimate& est, int m, const std::string& why);
  void Threads();
  void Env();
  void Trials();
  int GpusOn(size_t node) const { return nodes_[node].gpus_size(); }
  int TotalGpus() const {
    int n = 0;
    for (size_t i = 0; i < nodes_.size(); ++i) n += GpusOn(i);
    return n;
  }
  double BucketFor(int n, const Prediction& at, const LinkModel& link,
                   std::string* why) const;

  const v1::JobSpec& spec_;
  const std::vector<v1::Topology>& nodes_;
  const PlannerMeasurements& meas_;
  TrialRunner* runner_;
  v1::Plan plan_;

  ModelConfig cfg_;
  int64_t params_ = 0;
  int seq_len_ = 128;
  bool cuda_ = false;
  int global_ = 128;
  ::dgca::Precision precision_ = ::dgca::Precision::kFp32;
  std::string mode_ = "auto";
  Inputs in_;
  LinkModel link_;
  std::vector<int> ranks_per_node_;
  std::string mem_why_;
  std::string step_why_;
  double device_memory_ = 0;
  double budget_ = 0;  // the memory budget per rank (Memory()); 0 = unknown
  absl::Status error_;  // a spec the plan cannot serve (Ranks())
  // Whether `bytes` is above kMemoryWarnShare of the device's memory (known).
  bool MemoryHigh(double bytes) const { return device_memory_ > 0 && bytes > kMemoryWarnShare * device_memory_; }
  MemoryEstimate est_;
};

void Planner::Model() {
  cfg_ = ModelConfig();
  std::string preset = spec_.model().preset();
  if (preset.empty()) preset = "bert-base";
  if (preset != "custom") {
    auto p = ApplyPreset(preset, cfg_);
    if (p.ok()) {
      cfg_ = *p;
    } else {
      Warn(absl::StrCat("model.preset \"", preset,
                        "\" unknown to the planner; sizing as bert-base"));
    }
  }
  const v1::ModelSpec& ms = spec_.model();
  if (ms.layers() > 0) cfg_.layers = ms.layers();
  if (ms.hidden() > 0) cfg_.hidden = ms.hidden();
  if (ms.heads() > 0) cfg_.heads = ms.heads();
  if (ms.ffn() > 0) cfg_.ffn = ms.ffn();
  if (ms.has_prompt()) {
    cfg_.prompt_length = ms.prompt().length();
    const std::string& e = ms.prompt().encoder();
    cfg_.prompt_encoder = e == "mlp"    ? PromptEncoderKind::kMlp
                          : e == "none" ? PromptEncoderKind::kNone
                                        : PromptEncoderKind::kLstm;
  }
  if (ms.has_heads_spec()) {
    cfg_.detector = ms.heads_spec().detector();
    cfg_.candidate = ms.heads_spec().candidate().enabled();
    if (ms.heads_spec().candidate().top_k() > 0)
      cfg_.candidate_top_k = ms.heads_spec().candidate().top_k();
    cfg_.fusion = ms.heads_spec().fusion() == "none" ? FusionKind::kNone
                                                      : FusionKind::kGated;
  }
  // As the ranks will train (worker/rank/train_config.cc), so a memory
  // model that counts dropout's scratch sees it.
  const SpecDropout dropout = DropoutOf(ms);
  cfg_.hidden_dropout = static_cast<float>(dropout.hidden);
  cfg_.attention_dropout = static_cast<float>(dropout.attention);
  params_ = CountParameters(cfg_);
  seq_len_ = spec_.data().max_seq_len() > 0 ? spec_.data().max_seq_len() : 128;
  in_.grad_bytes = 4.0 * params_;
  global_ = spec_.train().global_batch() > 0 ? spec_.train().global_batch() : 128;
  in_.global = global_;
  mode_ = spec_.tuning().mode().empty() ? "auto" : spec_.tuning().mode();
  plan_.set_tuning_mode(mode_);
}

void Planner::Device() {
  const std::string want = absl::AsciiStrToLower(spec_.resources().device());
  const int gpus = TotalGpus();
  if (want == "cuda" || want == "cpu") {
    cuda_ = want == "cuda";
    Decide(&plan_, "resources.device", want, v1::USER, "set in the spec");
    if (cuda_ && gpus == 0)
      Warn("resources.device is cuda but no node reports an NVIDIA GPU; the ranks "
           "will fail to start (set device: cpu or auto)");
  } else if (gpus > 0) {
    cuda_ = true;
    Decide(&plan_, "resources.device", "cuda", v1::PLANNER,
           absl::StrCat(gpus, " NVIDIA GPU(s) on ", nodes_.size(), " node(s)"));
  } else {
    cuda_ = false;
    Decide(&plan_, "resources.device", "cpu", v1::PLANNER,
           "no node reports an NVIDIA GPU");
  }
  plan_.set_device(cuda_ ? "cuda" : "cpu");
}

void Planner::Link(int n, LinkModel* link) {
  *link = LinkModel();
  // Nodes used by n ranks, ranks filling node 0 first.
  std::vector<int> per_node = ranks_per_node_;
  if (per_node.empty() || std::accumulate(per_node.begin(), per_node.end(), 0) != n) {
    per_node.assign(nodes_.size(), 0);
    int left = n;
    for (size_t i = 0; i < nodes_.size() && left > 0; ++i) {
      // CUDA: one rank per GPU, none on a node without GPUs while others
      // have them (as the placement).
      int cap = cuda_ ? (GpusOn(i) > 0 || TotalGpus() == 0 ? std::max(GpusOn(i), 1) : 0) : left;
      if (i + 1 == nodes_.size()) cap = left;
      per_node[i] = std::min(cap, left);
      left -= per_node[i];
    }
  }
  int used_nodes = 0;
  for (int r : per_node) used_nodes += r > 0;
  // The path: worst GPU pair among the ranks of each node; the network
  // between nodes.
  std::string worst;
  int worst_rank = -1;
  double pcie = 0;
  bool wsl2 = false;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (per_node.size() <= i || per_node[i] == 0) continue;
    wsl2 |= nodes_[i].wsl2();
    if (!cuda_) continue;
    const int r = std::min(per_node[i], GpusOn(i));
    std::map<std::pair<int, int>, std::string> paths;
    for (const auto& l : nodes_[i].links()) paths[{l.a(), l.b()}] = l.path();
    for (int a = 0; a < r; ++a) {
      double bw = PcieBytesPerSecond(nodes_[i].gpus(a));
      if (pcie == 0 || bw < pcie) pcie = bw;
      for (int b = a + 1; b < r; ++b) {
        auto it = paths.find({a, b});
        std::string p = it == paths.end() ? "unknown" : it->second;
        if (PathRank(p) > worst_rank ||
            (PathRank(p) == 0 && worst_rank == 0 &&
             std::atoi(p.c_str() + 2) < std::atoi(worst.c_str() + 2))) {
          worst_rank = PathRank(p);
          worst = p;
        }
      }
    }
  }
  if (used_nodes > 1) {
    worst = "net";
    // Slowest node's network: an ACTIVE IB/RoCE port, else Ethernet sockets.
    double slowest = 0;
    std::string why;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (per_node.size() <= i || per_node[i] == 0) continue;
      double best = 0;
      std::string name;
      for (const auto& d : nodes_[i].net_devices())
        if (d.state() == "ACTIVE" && d.rate_gbps() > best) {
          best = d.rate_gbps();
          name = d.name();
        }
      double bw = best > 0 ? best / 8.0 * 1e9 * 0.8 : 1.25e9 * 0.8;
      if (slowest == 0 || bw < slowest) {
        slowest = bw;
        why = best > 0 ? absl::StrCat(nodes_[i].node(), " ", name, " ", Num(best),
                                      " Gb/s x 0.8")
                       : absl::StrCat(nodes_[i].node(),
                                      " has no active IB/RoCE port: TCP sockets, "
                                      "assumed 10 Gb/s Ethernet x 0.8");
      }
    }
    link->busbw = slowest;
    link->latency = 50e-6;
    link->why = absl::StrCat("model (no measurement): ", why, " = ", Rate(slowest),
                             ", latency 50 us assumed");
    link->path = worst;
    ApplyMeasurements(n, link);
    return;
  }
  link->path = cuda_ ? (worst.empty() ? "none" : worst) : "loopback";
  if (!cuda_) {
    link->busbw = 2e9;
    link->latency = 100e-6;
    link->why = "model (no measurement): Gloo over loopback TCP, assumed 2 GB/s "
                "and 100 us";
    ApplyMeasurements(n, link);
    return;
  }
  if (pcie == 0) pcie = 16e9 * 16 * (128.0 / 130.0) / 8.0;
  if (wsl2) {
    link->busbw = 1e9;
    link->latency = 500e-6;
    link->why = "model (no measurement): WSL2 stages NCCL traffic through host "
                "memory; such machines measure about 1 GB/s; latency 500 us assumed";
  } else if (PathRank(worst) == 0) {
    int links = std::max(1, std::atoi(worst.c_str() + 2));
    link->busbw = links * 25e9 * 0.8;
    link->latency = 10e-6;
    link->why = absl::StrFormat(
        "model (no measurement): %s = %d NVLinks x 25 GB/s x 0.8 = %s, latency "
        "10 us",
        worst, links, Rate(link->busbw));
  } else {
    double eff = worst == "PIX" || worst == "PXB" ? 0.7
                 : worst == "PHB" || worst == "NODE" ? 0.6
                                                     : 0.35;
    link->busbw = pcie * eff;
    link->latency = worst_rank >= 5 ? 30e-6 : 20e-6;
    link->why = absl::StrFormat(
        "model (no measurement): %s over PCIe %s x %.2f (%s) = %s, latency %s",
        worst, Rate(pcie), eff,
        eff == 0.7 ? "through PCIe switches" : eff == 0.6 ? "through the host bridge"
                                                          : "across sockets or unknown",
        Rate(link->busbw), Sec(link->latency));
  }
  ApplyMeasurements(n, link);
}

// Measured figures replace the model's; an unmeasured latency keeps the
// model's value for the path (and says so).
void Planner::ApplyMeasurements(int n, LinkModel* link) {
  const double model_latency = link->latency;
  const std::string model_why = link->why;
  if (meas_.allreduce_bus_bandwidth > 0) {
    link->busbw = meas_.allreduce_bus_bandwidth;
    link->latency = meas_.allreduce_latency_s;
    link->measured = true;
    if (link->latency <= 0) {
      link->latency = model_latency;
      link->why = absl::StrCat("measured busbw ", Rate(link->busbw),
                               "; latency not measured, the model's ",
                               Sec(model_latency), " from: ", model_why);
    } else {
      link->why = absl::StrCat("measured busbw ", Rate(link->busbw), ", latency ",
                               Sec(link->latency));
    }
  } else if (meas_.allreduce_points.size() >= 2 && n > 1) {
    // Least squares t = a + x / B with x = bytes * f.
    const double f = 2.0 * (n - 1) / n;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double cnt = meas_.allreduce_points.size();
    for (const auto& p : meas_.allreduce_points) {
      double x = p.first * f, y = p.second;
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    const double den = cnt * sxx - sx * sx;
    const double slope = den != 0 ? (cnt * sxy - sx * sy) / den : 0;
    if (slope > 0) {
      link->busbw = 1.0 / slope;
      link->latency = std::max(0.0, (sy - slope * sx) / cnt);
      link->measured = true;
      link->why = absl::StrCat("fitted from ", meas_.allreduce_points.size(),
                               " measured all-reduce sizes: busbw ", Rate(link->busbw),
                               ", latency ", Sec(link->latency));
    }
  }
  if (link->measured && n > 1 && meas_.allreduce_points.size() >= 2) {
    link->points.clear();
    for (const auto& p : meas_.allreduce_points)
      if (p.first > 0 && p.second > 0) link->points.push_back(p);
    std::sort(link->points.begin(), link->points.end());
    if (link->points.size() < 2) link->points.clear();
  }
  if (link->measured && !meas_.allreduce_source.empty()) {
    link->why = absl::StrCat(meas_.allreduce_source, ": ", link->why);
  }
}

void Planner::Ranks() {
  const int user = spec_.resources().ranks();
  std::string cpus_why;
  if (user > 0) {
    plan_.set_ranks(user);
    Decide(&plan_, "resources.ranks", absl::StrCat(user), v1::USER, "set in the spec");
    // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
    // detected"), and CUDA ranks all-reduce over NCCL.
    if (cuda_ && user > TotalGpus() && TotalGpus() > 0)
      error_ = absl::InvalidArgumentError(absl::StrCat(
          "resources.ranks = ", user, " but the connected nodes have ", TotalGpus(),
          " GPU(s): CUDA ranks need one GPU each (NCCL refuses two ranks on one GPU); set resources.ranks <= ",
          TotalGpus(), " or leave it auto (one rank per GPU)",
          absl::AsciiStrToLower(spec_.resources().device()) == "cuda" ? "" : ", or resources.device: cpu",
          ", or wait for more nodes' agents to connect"));
    if (error_.ok() && user > global_)
      error_ = absl::InvalidArgumentError(absl::StrCat(
          "resources.ranks = ", user, " but train.global_batch = ", global_,
          ": every rank needs at least one sample per step; set resources.ranks <= ", global_,
          " or train.global_batch >= ", user));
    if (error_.ok() && !cuda_) {
      // CPU ranks: each runs its GEMMs on threads of its own and a Gloo
      // pair per peer. Past kMaxCpuRanksPerCore ranks a core the node only
      // thrashes (a test with 4096 ranks on 2 cores stalled the machine,
      // coordinator included); up to it a warning says what it costs.
      int cpus = 0;
      bool known = true;
      for (const auto& t : nodes_) {
        std::string why;
        known &= t.cpu_count() > 0;
        cpus += EffectiveCpus(t, &why);
      }
      if (known && user > kMaxCpuRanksPerCore * cpus) {
        error_ = absl::InvalidArgumentError(absl::StrCat(
            "resources.ranks = ", user, " CPU ranks but the connected nodes have ", cpus,
            " CPU(s) in all: more than ", kMaxCpuRanksPerCore,
            " ranks per CPU only thrashes; set resources.ranks <= ", kMaxCpuRanksPerCore * cpus,
            " (one per CPU is the most that computes in parallel) or leave it auto"));
      } else if (known && user > cpus) {
        Warn(absl::StrCat("resources.ranks = ", user, " CPU ranks on ", cpus,
                          " CPU(s): ranks share cores, so each step is slower than with ", cpus,
                          " ranks"));
      }
    }
  } else if (cuda_) {
    plan_.set_ranks(std::max(1, TotalGpus()));
    Decide(&plan_, "resources.ranks", absl::StrCat(plan_.ranks()), v1::PLANNER,
           absl::StrCat("one rank per GPU (", TotalGpus(),
                        " GPU(s)); without a step-time measurement it cannot be "
                        "compared with one rank alone"));
  } else {
    int total = 0;
    std::vector<std::string> parts;
    for (const auto& t : nodes_) {
      std::string why;
      int cpus = EffectiveCpus(t, &why);
      int r = t.numa_nodes() > 1 ? std::min(t.numa_nodes(), cpus)
                                 : std::max(1, std::min(2, cpus));
      total += r;
      parts.push_back(absl::StrCat(t.node(), ": ", why, ", ",
                                   std::max(1, t.numa_nodes()), " NUMA node(s) -> ", r));
    }
    plan_.set_ranks(std::max(1, total));
    Decide(&plan_, "resources.ranks", absl::StrCat(plan_.ranks()), v1::PLANNER,
           absl::StrCat("CPU: one rank per NUMA node, or min(2, cpus) on one NUMA "
                        "node (OpenBLAS GEMMs scale sublinearly past a few threads, "
                        "so two half-width ranks lose little and each extra rank "
                        "adds a Gloo all-reduce); ",
                        absl::StrJoin(parts, "; ")));
  }
}

void Planner::Backend() {
  const std::string want = absl::AsciiStrToLower(spec_.comm().backend());
  if (want == "nccl" || want == "gloo") {
    plan_.set_backend(want);
    Decide(&plan_, "comm.backend", want, v1::USER, "set in the spec");
    if ((want == "nccl") != cuda_)
      Warn(absl::StrCat("comm.backend ", want, " with device ", plan_.device(),
                        ": NCCL needs CUDA ranks, Gloo runs on host memory"));
  } else {
    plan_.set_backend(cuda_ ? "nccl" : "gloo");
    Decide(&plan_, "comm.backend", plan_.backend(), v1::PLANNER,
           cuda_ ? "CUDA ranks: NCCL (GPU-direct collectives)"
                 : "CPU ranks: Gloo (host-memory collectives over TCP)");
  }
}

void Planner::Precision() {
  const std::string want = absl::AsciiStrToLower(spec_.train().precision());
  if (want == "fp32" || want == "fp16" || want == "bf16") {
    plan_.set_precision(want);
    Decide(&plan_, "train.precision", want, v1::USER, "set in the spec");
    if (!cuda_ && want != "fp32")
      Warn(absl::StrCat("train.precision ", want,
                        " on CPU ranks: the CPU backend computes in fp32"));
  } else if (!cuda_) {
    plan_.set_precision("fp32");
    Decide(&plan_, "train.precision", "fp32", v1::PLANNER,
           "CPU ranks compute in fp32 (no fast half-precision GEMM on CPU)");
  } else {
    int min_cc = 1000;
    bool unknown = false;
    for (size_t i = 0; i < nodes_.size(); ++i)
      for (const auto& g : nodes_[i].gpus()) {
        if (g.compute_capability_major() <= 0) {
          unknown = true;
        } else {
          min_cc = std::min(min_cc, g.compute_capability_major() * 10 +
                                        g.compute_capability_minor());
        }
      }
    if (unknown && min_cc == 1000) {
      plan_.set_precision("fp16");
      Decide(&plan_, "train.precision", "fp16", v1::PLANNER,
             "compute capability unknown (no NVML or nvidia-smi facts): fp16 with "
             "loss scaling runs on every GPU this build supports (sm_75+); bf16 "
             "needs sm_80");
      Warn("GPU compute capability unknown: precision fp16 chosen conservatively");
    } else if (min_cc >= 80 && !unknown) {
      plan_.set_precision("bf16");
      Decide(&plan_, "train.precision", "bf16", v1::PLANNER,
             absl::StrFormat("compute capability %d.%d >= 8.0: bf16 (fp32 range, "
                             "no loss scaling), fp32 master weights",
                             min_cc / 10, min_cc % 10));
    } else {
      plan_.set_precision("fp16");
      Decide(&plan_, "train.precision", "fp16", v1::PLANNER,
             absl::StrFormat("compute capability %d.%d%s < 8.0 has no fast bf16: "
                             "fp16 with dynamic loss scaling, fp32 master weights",
                             min_cc / 10, min_cc % 10, unknown ? " (some unknown)" : ""));
    }
  }
  const auto precision = ::dgca::ParsePrecision(plan_.precision(), "plan.precision");
  precision_ = precision.ok() ? *precision : ::dgca::Precision::kFp32;
}

// The attention kernels of CUDA ranks (model/cuda/flash_attention.h): the
// fused ones where they apply (16-bit, head size 16/32/64, L <= 512), the
// GEMM + softmax version otherwise or when the spec asks for it.
void Planner::Attention() {
  const std::string want = absl::AsciiStrToLower(spec_.train().attention());
  const bool asked = want == "fused" || want == "gemm";
  if (!cuda_) {
    plan_.set_attention("");
    if (asked)
      Warn(absl::StrCat("train.attention ", want,
                        " on CPU ranks: the CPU backend has one attention (fp32)"));
    return;
  }
  const int d = cfg_.heads > 0 ? cfg_.hidden / cfg_.heads : 0;
  std::string why_not;  // why the fused kernels cannot run, if they cannot
  if (precision_ == ::dgca::Precision::kFp32) {
    why_not = "fp32: the fused kernels are bf16/fp16 only";
  } else if (!FusedAttentionShape(seq_len_, cfg_.hidden, cfg_.heads)) {
    why_not = absl::StrFormat(
        "head size %d (hidden %d / %d heads), seq_len %d: the fused kernels take head "
        "sizes 16, 32 and 64 and seq_len up to 512",
        d, cfg_.hidden, cfg_.heads, seq_len_);
  }
  if (want == "gemm") {
    plan_.set_attention("gemm");
    Decide(&plan_, "train.attention", "gemm", v1::USER, "set in the spec");
  } else if (!why_not.empty()) {
    plan_.set_attention("gemm");
    Decide(&plan_, "train.attention", "gemm", v1::PLANNER,
           absl::StrCat("GEMM + softmax attention: ", why_not));
    if (want == "fused")
      Warn(absl::StrCat("train.attention fused cannot run here (", why_not, "): GEMM attention"));
  } else {
    plan_.set_attention("fused");
    Decide(&plan_, "train.attention", "fused", want == "fused" ? v1::USER : v1::PLANNER,
           want == "fused"
               ? "set in the spec"
               : absl::StrFormat(
                     "%s, head size %d, seq_len %d <= 512: fused flash-style kernels (each "
                     "layer keeps a [heads, L] log-sum-exp per sample, not [heads, L, L] "
                     "probabilities)",
                     plan_.precision(), d, seq_len_));
  }
}

// train.attention auto, where the fused kernels run, once the micro-batch is
// final: when the GEMM version's [heads, L, L] probabilities would also fit
// the memory budget at that micro-batch, the plan says "auto" and each rank
// times both at startup and keeps the faster (model/cuda/attention_tune.h;
// which is faster depends on the card and shape, and is cheaper to measure
// than to predict). Otherwise the plan stays "fused" and says why.
void Planner::AttentionTimed() {
  if (!cuda_ || plan_.attention() != "fused") return;
  const std::string want = absl::AsciiStrToLower(spec_.train().attention());
  if (!want.empty() && want != "auto") return;  // the user's "fused"
  const int m = plan_.micro_batch();
  // The GEMM version's memory: the line through earlier runs of it on these
  // nodes where there are any (an explicit gemm plan, or an "auto" plan whose
  // ranks kept it), else the plan's line (est_, the fused kernels', through
  // any measured points) plus what the memory model says the GEMM version
  // adds (its [heads, L, L] probabilities per sample, workspace).
  MemoryEstimate gemm_est = EstimateMemory(cfg_, seq_len_, precision_, /*fused_attention=*/false);
  std::string gemm_why;
  if (FitMemoryLine(meas_.gemm_memory_points, meas_.gemm_memory_source, kCudaContextBytes, budget_, &gemm_est,
                    &gemm_why)) {
    gemm_why = absl::StrCat("the line through the GEMM version's own peaks", gemm_why);
  } else {
    const MemoryEstimate gemm_model = gemm_est;
    const MemoryEstimate fused_model =
        EstimateMemory(cfg_, seq_len_, precision_, /*fused_attention=*/true);
    gemm_est = est_;
    gemm_est.activations_per_sample +=
        std::max(0.0, gemm_model.activations_per_sample - fused_model.activations_per_sample);
    gemm_est.workspace += std::max(0.0, gemm_model.workspace - fused_model.workspace);
    gemm_why = absl::StrCat("the fused kernels' line plus the memory model's GEMM probabilities, ",
                            Bytes(gemm_est.activations_per_sample - est_.activations_per_sample), " per sample");
  }
  const double gemm = gemm_est.total(m);
  const int d = cfg_.heads > 0 ? cfg_.hidden / cfg_.heads : 0;
  if (budget_ <= 0 || gemm > budget_) {
    std::string reason;
    for (const auto& dec : plan_.decisions())
      if (dec.name() == "train.attention") reason = dec.reason();
    Decide(&plan_, "train.attention", "fused", v1::PLANNER,
           absl::StrCat(reason, "; not timed against the GEMM version: ",
                        budget_ <= 0
                            ? "device memory unknown, so nothing says its probabilities would fit"
                            : absl::StrCat("its probabilities would need ", Bytes(gemm), " at micro-batch ", m,
                                           ", over the ", Bytes(budget_), " budget")));
    return;
  }
  // A rank may keep either version: predict the larger. The GEMM version's
  // is unless its own peaks measured it below the fused kernels' line.
  const bool was_high = MemoryHigh(plan_.predicted_memory_bytes());
  if (gemm >= est_.total(m)) {
    PredictMemory(gemm_est, m,
                  absl::StrCat("the GEMM attention's, which a rank keeps if it times faster (", gemm_why,
                               "), the larger of the two versions'; ", mem_why_));
  } else {
    PredictMemory(est_, m,
                  absl::StrCat("the fused attention's, which a rank keeps unless the GEMM version times faster, "
                               "the larger of the two versions' (the GEMM version's: ", Bytes(gemm + kCudaContextBytes),
                               ", ", gemm_why, "); ", mem_why_));
  }
  if (MemoryHigh(plan_.predicted_memory_bytes()) && !was_high)
    Warn(absl::StrFormat("predicted memory %s (with the attention version a rank may keep) is above "
                         "85%% of %s",
                         Bytes(plan_.predicted_memory_bytes()), Bytes(device_memory_)));
  plan_.set_attention("auto");
  Decide(&plan_, "train.attention", "auto", v1::PLANNER,
         absl::StrFormat(
             "%s, head size %d, seq_len %d <= 512: each rank times the fused flash-style kernels and the "
             "GEMM version (one layer's forward + backward at micro-batch %d) when it starts and keeps the "
             "faster (the fused unless GEMM is 5%% faster; every rank takes rank 0's choice; the fused "
             "untimed in deterministic mode; a run resumed from a checkpoint keeps the checkpoint's, "
             "untimed); the "
             "GEMM version's [heads, L, L] probabilities fit too (%s at micro-batch %d, budget %s; the "
             "predicted memory is the larger version's)",
             plan_.precision(), d, seq_len_, m, Bytes(gemm), m, Bytes(budget_)));
}

void Planner::PredictMemory(const MemoryEstimate& est, int m, const std::string& why) {
  plan_.set_predicted_memory_bytes(est.total(m) + (cuda_ ? kCudaContextBytes : 0));
  plan_.set_predicted_activation_bytes_per_sample(est.activations_per_sample);
  Decide(&plan_, "predicted.memory_bytes", Bytes(plan_.predicted_memory_bytes()), v1::PLANNER,
         absl::StrFormat("%s%s fixed + micro-batch %d x %s activations; %s",
                         cuda_ ? absl::StrCat(Bytes(kCudaContextBytes), " CUDA context + ")
                               : std::string(),
                         Bytes(est.total(0)), m, Bytes(est.activations_per_sample), why));
}

void Planner::Memory() {
  MemoryEstimate est = EstimateMemory(cfg_, seq_len_, precision_, plan_.attention() != "gemm");
  double budget = 0;
  if (cuda_) {
    double mem = 0;
    for (const auto& t : nodes_)
      for (const auto& g : t.gpus())
        if (g.memory_bytes() > 0 && (mem == 0 || g.memory_bytes() < mem))
          mem = static_cast<double>(g.memory_bytes());
    device_memory_ = mem;
    if (mem > 0) {
      budget = kGpuMemoryTarget * mem - kCudaContextBytes;
      mem_why_ = absl::StrFormat(
          "%.0f%% of %s GPU memory - %s CUDA context = %s", kGpuMemoryTarget * 100,
          Bytes(mem), Bytes(kCudaContextBytes), Bytes(budget));
    }
  } else {
    double mem = 0;
    int ranks_here = 1;
    bool limited = false;
    for (const auto& t : nodes_) {
      double h = HostMemory(t);
      if (h > 0 && (mem == 0 || h < mem)) {
        mem = h;
        limited = t.cgroup_memory_limit_bytes() > 0 &&
                  static_cast<double>(t.cgroup_memory_limit_bytes()) == h;
      }
    }
    ranks_here = std::max(1, (plan_.ranks() + static_cast<int>(nodes_.size()) - 1) /
                                 static_cast<int>(nodes_.size()));
    device_memory_ = mem / ranks_here;
    if (mem > 0) {
      budget = kCpuMemoryTarget * mem / ranks_here;
      mem_why_ = absl::StrFormat("%.0f%% of %s %s / %d rank(s) per node = %s",
                                 kCpuMemoryTarget * 100, Bytes(mem),
                                 limited ? "(the cgroup memory limit)" : "host memory",
                                 ranks_here, Bytes(budget));
    }
  }
  std::string measured_why;
  FitMemoryLine(meas_.memory_points, meas_.memory_source, cuda_ ? kCudaContextBytes : 0, budget, &est,
                &measured_why);
  budget_ = budget;
  plan_.set_device_memory_bytes(device_memory_);
  // The target includes the CUDA context, as predicted_memory_bytes does.
  plan_.set_memory_target_bytes(budget > 0 ? budget + (cuda_ ? kCudaContextBytes : 0) : 0);
  if (budget > 0) {
    in_.max_micro = MaxMicroBatch(est, budget);
    mem_why_ += absl::StrFormat(
        "; state %s (weights, fp32 grads, AdamW) + %s workspace%s, %s activations per "
        "sample at seq_len %d%s -> at most %d samples",
        Bytes(est.params + est.grads + est.optimizer), Bytes(est.workspace),
        measured_why.empty() ? "" : " and runtime", Bytes(est.activations_per_sample), seq_len_,
        measured_why, in_.max_micro);
    if (in_.max_micro == 0)
      Warn(absl::StrCat("the model state alone does not fit the memory budget (",
                        mem_why_, "); the job will likely run out of memory"));
  } else {
    if (LargestMeasuredMicroBatch() > 0) {
      in_.max_micro = LargestMeasuredMicroBatch();
      mem_why_ = absl::StrCat("device memory unknown; the measured micro-batch of ",
                              in_.max_micro, " ran, so it fits");
    } else {
      mem_why_ = "device memory unknown and no micro-batch measured: no memory bound";
    }
    Warn(mem_why_);
    mem_why_ += measured_why;  // the prediction still goes through the measured points
  }
  // Keep the estimate for predictions.
  plan_.set_predicted_memory_bytes(0);
  est_ = est;
}

double Planner::BucketFor(int n, const Prediction& at, const LinkModel& link,
                          std::string* why) const {
  const double G = in_.grad_bytes;
  const double f = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  // Latency <= 10% of t(S): latency <= 0.1 (latency + S f / B) <=> S >= 9 latency B / f.
  const double s_lo = link.busbw > 0 ? 9.0 * link.latency * link.busbw / f : 0;
  const double s_cap = G / kMinBuckets;
  const double t_all = link.busbw > 0 ? G * f / link.busbw : 0;
  const double backward = at.known ? kBackwardShare * at.compute : 0;
  double s;
  std::string rule;
  if (backward > 0 && t_all < 0.1 * backward) {
    s = std::min(s_cap, kFastLinkBucketBytes);
    rule = absl::StrFormat(
        "all gradients take %s < 10%% of the %s backward: communication hides "
        "easily, so a %s bucket keeps the tail after backward short",
        Sec(t_all), Sec(backward), Bytes(s));
  } else {
    s = s_cap;
    rule = absl::StrFormat(
        "G/%d = %s / %d = %s: the largest bucket that still gives %d buckets to "
        "overlap with backward; larger buckets amortize the per-call latency%s",
        kMinBuckets, Bytes(G), kMinBuckets, Bytes(s_cap), kMinBuckets,
        backward > 0 ? absl::StrFormat(" and all-reduce of all gradients (%s) is "
                                       "not small next to backward (%s)",
                                       Sec(t_all), Sec(backward))
                     : "");
  }
  if (s < s_lo) {
    rule += absl::StrFormat("; raised to %s so latency stays <= 10%%", Bytes(s_lo));
    s = s_lo;
  }
  s = std::max(s, 1 * kMiB);
  s = std::min(s, std::max(G, 1 * kMiB));
  *why = absl::StrFormat(
      "%s; bandwidth-bound needs S >= 9 x latency x busbw / f = 9 x %s x %s / %.2f = "
      "%s (so t(S) = latency + S x f / busbw has latency <= 10%%); t(%s) = %s + "
      "%s x %.2f / %s = %s",
      rule, Sec(link.latency), Rate(link.busbw), f, Bytes(s_lo), Bytes(s),
      Sec(link.latency), Bytes(s), f, Rate(link.busbw),
      Sec(link.latency + (link.busbw > 0 ? s * f / link.busbw : 0)));
  return s;
}

void Planner::FitStepTime() {
  if (meas_.allreduce_skew_per_compute > 0) {
    in_.skew = meas_.allreduce_skew_per_compute;
    plan_.set_allreduce_skew_per_compute(in_.skew);
  }
  // Distinct micro-batches (the first point of each m wins: callers list the
  // newest first).
  std::vector<std::pair<int, double>> pts;
  std::set<int> seen;
  for (const auto& [m, sec] : meas_.step_points)
    if (m > 0 && sec > 0 && seen.insert(m).second) pts.push_back({m, sec});
  if (pts.empty() && meas_.step_seconds > 0 && meas_.step_micro_batch > 0)
    pts.push_back({meas_.step_micro_batch, meas_.step_seconds});
  if (pts.empty()) return;
  const std::string src = meas_.step_source.empty() ? "measured" : meas_.step_source;
  if (pts.size() == 1) {
    in_.per_sample = pts[0].second / pts[0].first;
    step_why_ = absl::StrFormat("c(m) = %s x m / %d (%s)", Sec(pts[0].second),
                                pts[0].first, src);
    return;
  }
  // Least squares c = a + b m.
  double sm = 0, sc = 0, smm = 0, smc = 0;
  const double n = static_cast<double>(pts.size());
  for (const auto& [m, c] : pts) {
    sm += m;
    sc += c;
    smm += static_cast<double>(m) * m;
    smc += m * c;
  }
  const double den = n * smm - sm * sm;
  double b = den > 0 ? (n * smc - sm * sc) / den : 0;
  double a = (sc - b * sm) / n;
  std::string how;
  if (b <= 0 || a < 0) {
    // Through the origin: b = sum(m c) / sum(m^2).
    a = 0;
    b = smc / smm;
    how = "a line through the origin (a free fit had a < 0 or b <= 0)";
  } else {
    how = "least squares";
  }
  in_.fixed = a;
  in_.per_sample = b;
  std::vector<std::string> shown;
  for (const auto& [m, c] : pts) shown.push_back(absl::StrFormat("c(%d) = %s", m, Sec(c)));
  step_why_ = absl::StrFormat("c(m) = %s + %s x m, %s over %s (%s)", Sec(a), Sec(b), how,
                              absl::StrJoin(shown, ", "), src);
}

void Planner::BatchAndBuckets() {
  FitStepTime();
  if (!cuda_) {
    // Gloo progresses on a thread of its own; with every core computing it
    // only runs between GEMMs (measured here: exposed share == all-reduce
    // share with 2 ranks x 1 thread on 2 cores, bench/gloo/gloo-exposed).
    std::string why;
    const v1::Topology& t = nodes_[0];
    const int cpus = EffectiveCpus(t, &why);
    const int per_node = std::max(1, (plan_.ranks() + static_cast<int>(nodes_.size()) - 1) /
                                         static_cast<int>(nodes_.size()));
    const int tpr = spec_.resources().threads_per_rank() > 0
                        ? spec_.resources().threads_per_rank()
                        : std::max(1, cpus / per_node);
    in_.can_overlap = per_node * tpr < cpus;
  }
  const int user_m = spec_.train().micro_batch();
  const int user_k = spec_.train().accumulation();
  const double user_bucket = spec_.comm().bucket_mb() * kMiB;

  // Candidate rank counts: the planned one, and 1 when the planner chose it.
  std::vector<int> ns = {plan_.ranks()};
  const bool auto_ranks = spec_.resources().ranks() <= 0;
  if (auto_ranks && plan_.ranks() > 1 && cuda_) ns.push_back(1);

  struct Best {
    Prediction p;
    LinkModel link;
    double bucket = 0;
    std::string bucket_why;
    v1::ValueSource source_unused = v1::VALUE_SOURCE_UNSPECIFIED;
    v1::ValueSource bucket_source = v1::VALUE_SOURCE_UNSPECIFIED;
    std::string k_why;
    bool target_met = false;
    int64_t k_needed_global = 0;
  };
  // The (micro-batch, accumulation) search for n ranks with S-byte buckets.
  auto search = [&](int n, const LinkModel& link, double bucket, bool warn) {
    Best b;
    b.link = link;
    b.bucket = bucket;
    if (warn && global_ % n != 0)
      Warn(absl::StrCat("global_batch ", global_, " is not a multiple of ", n,
                        " ranks: each step uses ", (global_ / n) * n, " samples"));
    if (user_m > 0 || user_k > 0) {
      int m = user_m, k = user_k;
      const int per_rank = std::max(1, global_ / n);
      if (m <= 0) m = std::max(1, per_rank / k);
      if (k <= 0) k = std::max(1, per_rank / m);
      if (warn && m * k != per_rank)
        Warn(absl::StrCat("micro_batch ", m, " x accumulation ", k, " x ", n,
                          " ranks = ", m * k * n, " != global_batch ", global_));
      b.p = Predict(n, m, k, bucket, in_, link);
      b.k_why = "";
      b.target_met = b.p.share <= kTargetCommShare;
    } else {
      auto splits = Splits(n, in_);
      if (splits.empty()) {
        // Even one sample per micro-step is over the memory bound.
        splits.push_back({1, std::max(1, global_ / n)});
        if (warn)
          Warn(absl::StrCat("even a micro-batch of 1 exceeds the memory estimate (",
                          mem_why_, "); planning micro_batch 1"));
      }
      std::vector<std::string> tried;
      bool found = false;
      Prediction fastest;
      for (const auto& [m, k] : splits) {
        Prediction p = Predict(n, m, k, bucket, in_, link);
        if (!p.known) {  // No measurement: smallest feasible k.
          b.p = p;
          found = true;
          break;
        }
        if (p.sps > fastest.sps) fastest = p;
        if (p.share <= kTargetCommShare) {
          b.p = p;
          b.target_met = true;
          found = true;
          break;
        }
        if (tried.size() < 3)
          tried.push_back(absl::StrFormat("k=%d (m=%d): %s", k, m, Pct(p.share)));
      }
      if (!found) b.p = fastest;
      if (b.p.known && n > 1) {
        // What it would take: smallest k at this m with share <= target.
        // share <= s <=> exposed <= s/(1-s) k c  <=> k >= exposed (1-s) / (s c).
        const double k_real =
            b.p.compute > 0 ? b.p.exposed * (1 - kTargetCommShare) /
                                  (kTargetCommShare * b.p.compute)
                            : 1e9;
        int k_need = static_cast<int>(std::min(1e9, std::ceil(k_real - 1e-9)));
        b.k_needed_global = static_cast<int64_t>(std::max(1, k_need)) * b.p.m * n;
        b.k_why = absl::StrFormat(
            "%sstep(k) = k x c + exposed with c = %s%s x %d = %s, all-reduce C = %s in "
            "%.0f buckets, %s, exposed = %s: %s",
            step_why_.empty() ? "" : step_why_ + "; ",
            in_.fixed > 0 ? Sec(in_.fixed) + " + " : "", Sec(in_.per_sample), b.p.m,
            Sec(b.p.compute), Sec(b.p.comm), b.p.buckets,
            in_.can_overlap
                ? absl::StrFormat("exposed = max(C/nb, C - 2/3 c (1 - 1/nb)) (only the "
                                  "last micro-step's backward overlaps)")
                : std::string("no overlap (the CPU ranks use every core, so Gloo's "
                              "thread cannot progress during backward)"),
            Sec(b.p.exposed),
            b.target_met
                ? absl::StrFormat("k=%d gives share %s / (%d x %s + %s) = %s <= 10%%",
                                  b.p.k, Sec(b.p.exposed), b.p.k, Sec(b.p.compute),
                                  Sec(b.p.exposed), Pct(b.p.share))
                : absl::StrFormat("no k within global_batch %d reaches 10%% (k=%d: "
                                  "%s); 10%% needs k >= %d at m=%d, i.e. "
                                  "global_batch >= %d",
                                  global_, b.p.k, Pct(b.p.share), std::max(1, k_need),
                                  b.p.m, b.k_needed_global));
        if (!tried.empty() && b.target_met)
          b.k_why += absl::StrCat(" (smaller k: ", absl::StrJoin(tried, ", "), ")");
      }
      if (b.p.k > 1 || in_.max_micro > 0) {
        std::string mem = absl::StrFormat(
            "; k=%d is the smallest with micro-batch %d <= %d that fits memory",
            splits.front().second, splits.front().first, in_.max_micro);
        if (in_.max_micro > 0) b.k_why += mem;
      }
    }
    return b;
  };
  // The bucket for n ranks, given the micro-batch the search found.
  auto choose_bucket = [&](int n, const Prediction& at, const LinkModel& link,
                           std::string* why, v1::ValueSource* src) {
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
    if (mode_ == "off") {
      *why = "tuning.mode off: 25 MiB default (PyTorch DDP's)";
      return 25 * kMiB;
    }
    *src = v1::PLANNER;
    std::string w;
    // Whole MiB, rounded up so G/4 still makes 4 buckets (not 5).
    const double raw = BucketFor(n, at, link, &w);
    double s = std::max(kMiB, std::ceil(raw / kMiB - 1e-9) * kMiB);
    if (s != raw) w += absl::StrFormat("; rounded up to %s MiB", Num(s / kMiB));
    *why = absl::StrCat(w, " [", link.why, "]");
    return s;
  };
  std::map<int, Best> best;
  for (int n : ns) {
    LinkModel link;
    Link(n, &link);
    // First with a provisional bucket (the user's, or G/4), then with the
    // bucket chosen for that micro-batch.
    Best b = search(n, link, user_bucket > 0 ? user_bucket : in_.grad_bytes / kMinBuckets,
                    false);
    b.bucket = choose_bucket(n, b.p, link, &b.bucket_why, &b.bucket_source);
    std::string why = b.bucket_why;
    v1::ValueSource src = b.bucket_source;
    const double bucket = b.bucket;
    b = search(n, link, bucket, n == plan_.ranks());
    b.bucket_why = why;
    b.bucket_source = src;
    best[n] = b;
  }

  // Ranks: compare with one rank when the planner chose the rank count.
  int n = plan_.ranks();
  Best chosen = best[n];
  if (best.count(1) && n > 1 && chosen.p.known) {
    const Best& one = best[1];
    if (one.p.sps > chosen.p.sps) {
      Decide(&plan_, "resources.ranks", "1", v1::PLANNER,
             absl::StrFormat("%d ranks would be slower: %s samples/s (comm share %s "
                             "over %s at %s) vs %s samples/s on one GPU; raise "
                             "train.global_batch (>= %d) or improve the link to "
                             "use all GPUs",
                             n, Num(chosen.p.sps), Pct(chosen.p.share),
                             chosen.link.path, Rate(chosen.link.busbw),
                             Num(one.p.sps), chosen.k_needed_global));
      Warn(absl::StrFormat("planned 1 rank instead of %d: data parallelism over %s "
                           "would be slower at global_batch %d",
                           n, chosen.link.path, global_));
      n = 1;
      chosen = one;
      plan_.set_ranks(1);
    } else {
      const v1::PlanDecision* d = nullptr;
      for (const auto& x : plan_.decisions())
        if (x.name() == "resources.ranks") d = &x;
      Decide(&plan_, "resources.ranks", absl::StrCat(n), v1::PLANNER,
             absl::StrFormat("one rank per GPU: predicted %s samples/s vs %s on one "
                             "GPU alone (%.2fx)",
                             Num(chosen.p.sps), Num(one.p.sps),
                             one.p.sps > 0 ? chosen.p.sps / one.p.sps : 0));
      (void)d;
    }
  }
  link_ = chosen.link;
  plan_.set_allreduce_measured(link_.measured);

  // Placement.
  plan_.clear_rank_nodes();
  plan_.clear_rank_local_devices();
  {
    int left = n;
    for (size_t i = 0; i < nodes_.size() && left > 0; ++i) {
      int cap = cuda_ ? GpusOn(i) : left;
      // A node without GPUs takes no CUDA rank while others have GPUs (it
      // used to take every rank left, all on "GPU 0" it does not have).
      if (cuda_ && cap == 0 && TotalGpus() > 0) continue;
      if (!cuda_) {
        std::string why;
        int cpus = EffectiveCpus(nodes_[i], &why);
        int r = nodes_[i].numa_nodes() > 1 ? std::min(nodes_[i].numa_nodes(), cpus)
                                           : std::max(1, std::min(2, cpus));
        cap = spec_.resources().ranks() > 0
                  ? (left + static_cast<int>(nodes_.size() - i) - 1) /
                        static_cast<int>(nodes_.size() - i)
                  : r;
      }
      if (i + 1 == nodes_.size() || cap <= 0) cap = std::max(cap, left);
      int r = std::min(cap, left);
      for (int j = 0; j < r; ++j) {
        plan_.add_rank_nodes(nodes_[i].node());
        plan_.add_rank_local_devices(cuda_ ? j % std::max(1, GpusOn(i)) : j);
      }
      left -= r;
    }
  }

  // Micro-batch and accumulation decisions.
  Prediction p = chosen.p;
  plan_.set_micro_batch(p.m);
  plan_.set_accumulation(p.k);
  if (user_m > 0) {
    Decide(&plan_, "train.micro_batch", absl::StrCat(p.m), v1::USER,
           in_.max_micro > 0 && p.m > in_.max_micro
               ? absl::StrFormat("set in the spec (the memory model allows %d: %s)",
                                 in_.max_micro, mem_why_)
               : "set in the spec");
    if (in_.max_micro > 0 && p.m > in_.max_micro)
      Warn(absl::StrFormat("micro_batch %d exceeds the %d the memory model fits (%s)",
                           p.m, in_.max_micro, mem_why_));
  } else {
    Decide(&plan_, "train.micro_batch", absl::StrCat(p.m), v1::PLANNER,
           absl::StrFormat("global_batch %d / (%d rank(s) x accumulation %d%s) = %d; "
                           "memory: %s",
                           global_, n, p.k, user_k > 0 ? " from the spec" : "", p.m,
                           mem_why_));
    if (in_.max_micro > 0 && p.m > in_.max_micro)
      Warn(absl::StrFormat("micro_batch %d exceeds the %d the memory model fits (%s)",
                           p.m, in_.max_micro, mem_why_));
  }
  if (user_k > 0) {
    Decide(&plan_, "train.accumulation", absl::StrCat(p.k), v1::USER,
           "set in the spec");
  } else if (user_m > 0) {
    Decide(&plan_, "train.accumulation", absl::StrCat(p.k), v1::PLANNER,
           absl::StrFormat("global_batch %d / (%d rank(s) x micro_batch %d from the "
                           "spec) = %d",
                           global_, n, p.m, p.k));
  } else if (!p.known) {
    Decide(&plan_, "train.accumulation", absl::StrCat(p.k), v1::PLANNER,
           absl::StrFormat("no step-time measurement: the smallest k whose "
                           "micro-batch fits memory (%s)",
                           mem_why_));
    Warn("no step-time measurement: accumulation chosen from memory alone and no "
         "predictions made (give a measurement or use tuning.mode: trial)");
  } else if (n == 1) {
    Decide(&plan_, "train.accumulation", absl::StrCat(p.k), v1::PLANNER,
           absl::StrFormat("one rank: no gradient communication, so the smallest k "
                           "whose micro-batch fits memory (%d x %d = %d)",
                           p.m, p.k, p.m * p.k));
  } else {
    Decide(&plan_, "train.accumulation", absl::StrCat(p.k), v1::PLANNER,
           absl::StrCat("smallest k with exposed comm <= 10% of the step within "
                        "global_batch ", global_, ": ", chosen.k_why));
    if (!chosen.target_met)
      Warn(absl::StrFormat("exposed communication is %s of the step (target 10%%): "
                           "raise train.global_batch to >= %d to reach it",
                           Pct(p.share), chosen.k_needed_global));
  }

  // Bucket.
  const double bucket = chosen.bucket;
  Decide(&plan_, "comm.bucket_mb",
         chosen.bucket_source == v1::USER ? Num(spec_.comm().bucket_mb())
                                          : Num(bucket / kMiB),
         chosen.bucket_source, chosen.bucket_why);
  plan_.set_bucket_mb(bucket / kMiB);

  // Final predictions with the chosen bucket.
  p = Predict(n, p.m, p.k, bucket, in_, link_);
  PredictMemory(est_, p.m, mem_why_);
  if (p.known) {
    plan_.set_predicted_step_seconds(p.step);
    plan_.set_predicted_comm_share(p.share);
    plan_.set_predicted_samples_per_second(p.sps);
    plan_.set_predicted_single_rank_samples_per_second(p.m / p.compute);
  }
  plan_.set_predicted_allreduce_seconds(p.comm);  // known from the link alone
  plan_.set_predicted_allreduce_probe_seconds(p.comm_probe);
  if (p.known) {
    // The prediction's arithmetic in one place (the decisions above may be
    // the user's, whose reasons are just "set in the spec").
    std::string comm_why = "one rank: no gradient all-reduce";
    if (n > 1 && link_.busbw > 0) {
      const double f = 2.0 * (n - 1) / n;
      const double full = std::min(p.bucket > 0 ? p.bucket : in_.grad_bytes, in_.grad_bytes);
      const double rest = in_.grad_bytes - (p.buckets - 1) * full;
      comm_why = absl::StrFormat(
          "all-reduce C = %st(%s)%s = %s (t: %s)%s",
          p.buckets > 1 ? absl::StrFormat("%.0f x t(%s) + ", p.buckets - 1, Bytes(full)) : "",
          Bytes(rest), in_.skew > 0 ? absl::StrFormat(" + %.3f x c", in_.skew) : "",
          Sec(p.comm),
          link_.points.size() >= 2
              ? absl::StrFormat("interpolated between %d measured sizes",
                                static_cast<int>(link_.points.size()))
              : absl::StrFormat("latency %s + bytes x %.2f / %s", Sec(link_.latency), f,
                                Rate(link_.busbw)),
          in_.skew > 0 ? absl::StrCat("; ", absl::StrFormat("%.3f", in_.skew),
                                      " x c = waiting for the slower peer, ",
                                      meas_.allreduce_skew_source)
                       : "");
    }
    Decide(&plan_, "predicted.step_seconds", Sec(p.step), v1::PLANNER,
           absl::StrFormat("%s; c(%d) = %s; %s; exposed = %s (%s); step = %d x %s + %s = %s, "
                           "comm share %s",
                           step_why_, p.m, Sec(p.compute), comm_why, Sec(p.exposed),
                           in_.can_overlap ? "max(C/nb, C - 2/3 c (1 - 1/nb))"
                                           : "= C: CPU ranks use every core, no overlap",
                           p.k, Sec(p.compute), Sec(p.exposed), Sec(p.step), Pct(p.share)));
  }
  if (MemoryHigh(plan_.predicted_memory_bytes()))
    Warn(absl::StrFormat("predicted memory %s is above 85%% of %s",
                         Bytes(plan_.predicted_memory_bytes()), Bytes(device_memory_)));
}

void Planner::Threads() {
  std::string why;
  const v1::Topology& t = nodes_[0];
  int cpus = EffectiveCpus(t, &why);
  int per_node = 0;
  for (const auto& r : plan_.rank_nodes())
    if (r == t.node()) ++per_node;
  per_node = std::max(1, per_node);
  const int user_t = spec_.resources().threads_per_rank();
  int lt;
  const int user_l = spec_.data().loader().threads();
  if (user_l > 0) {
    lt = user_l;
    Decide(&plan_, "data.loader.threads", absl::StrCat(lt), v1::USER, "set in the spec");
  } else if (cuda_) {
    lt = std::max(1, std::min(4, cpus / per_node - 1));
    Decide(&plan_, "data.loader.threads", absl::StrCat(lt), v1::PLANNER,
           absl::StrFormat("GPU ranks: min(4, %s / %d rank(s) per node - 1 for the "
                           "rank's own thread) = %d; the ReLM batch builder is cheap "
                           "next to a GPU step",
                           why, per_node, lt));
  } else {
    lt = 1;
    Decide(&plan_, "data.loader.threads", "1", v1::PLANNER,
           "CPU ranks: one loader thread (every extra thread takes a core from the "
           "GEMMs; building a batch costs far less than a CPU step)");
  }
  plan_.set_loader_threads(lt);
  int tpr;
  if (user_t > 0) {
    tpr = user_t;
    Decide(&plan_, "resources.threads_per_rank", absl::StrCat(tpr), v1::USER,
           "set in the spec");
    if (!cuda_ && tpr * per_node > cpus)
      Warn(absl::StrFormat("threads_per_rank %d x %d rank(s) > %d CPUs: oversubscribed",
                           tpr, per_node, cpus));
  } else if (cuda_) {
    tpr = 1;
    Decide(&plan_, "resources.threads_per_rank", "1", v1::PLANNER,
           "GPU ranks compute on the GPU; host threads go to the data loader");
  } else {
    tpr = std::max(1, cpus / per_node);
    Decide(&plan_, "resources.threads_per_rank", absl::StrCat(tpr), v1::PLANNER,
           absl::StrFormat("max(1, %s / %d rank(s) per node) = %d", why, per_node, tpr));
  }
  plan_.set_threads_per_rank(tpr);
}

void Planner::Env() {
  std::map<std::string, std::pair<std::string, std::string>> want;  // k -> (v, why)
  if (!cuda_) {
    want["OMP_NUM_THREADS"] = {absl::StrCat(plan_.threads_per_rank()),
                               "one OpenMP/OpenBLAS thread pool of threads_per_rank "
                               "per rank, so ranks do not oversubscribe the cores"};
  } else {
    want["CUDA_DEVICE_ORDER"] = {"PCI_BUS_ID",
                                 "rank_local_devices index GPUs in PCI bus order, as "
                                 "nvidia-smi and the probe do (CUDA's default order is "
                                 "fastest-first)"};
    // Ranks per node.
    std::map<std::string, int> local;
    for (const auto& r : plan_.rank_nodes()) local[r]++;
    bool shm_off = false, p2p_off = false;
    std::vector<std::string> shm_why, p2p_why;
    for (const auto& t : nodes_) {
      int r = local.count(t.node()) ? local[t.node()] : 0;
      if (r < 2) continue;
      if (t.wsl2() && r > 2) {
        shm_off = true;
        shm_why.push_back(absl::StrFormat(
            "%s is WSL2 with %d local ranks: NCCL's shared-memory transport is "
            "unreliable there beyond 2 GPUs",
            t.node(), r));
      }
      const double need = kShmSegmentBytes * r * kShmChannels * 2;
      bool shm_unknown = false;
      for (const auto& u : t.unknown()) shm_unknown |= absl::StartsWith(u, "shm:");
      if (!shm_unknown && t.shm_total_bytes() > 0 && t.shm_free_bytes() < need) {
        shm_off = true;
        shm_why.push_back(absl::StrFormat(
            "%s /dev/shm has %s free < %s NCCL needs (%d ranks x %d channels x 2 "
            "directions x %.0f B per segment, the size a failing run reported)",
            t.node(), Bytes(t.shm_free_bytes()), Bytes(need), r, kShmChannels,
            kShmSegmentBytes));
      } else if (shm_unknown || t.shm_total_bytes() == 0) {
        Warn(absl::StrFormat(
            "%s: /dev/shm size unknown; NCCL_SHM_DISABLE not set. If NCCL fails with "
            "\"Error while creating shared memory segment\", set comm.env "
            "NCCL_SHM_DISABLE: \"1\" or enlarge /dev/shm (>= %s)",
            t.node(), Bytes(need)));
      }
      if (t.wsl2()) {
        p2p_off = true;
        p2p_why.push_back(absl::StrFormat(
            "%s is WSL2: GPUs are paravirtualized (dxg), CUDA peer-to-peer between "
            "them is unsupported, and NCCL's P2P transport fails or hangs there "
            "(microsoft/WSL#7852)",
            t.node()));
      }
    }
    if (shm_off)
      want["NCCL_SHM_DISABLE"] = {"1", absl::StrJoin(shm_why, "; ") +
                                           "; NCCL falls back to its network transport"};
    if (p2p_off) want["NCCL_P2P_DISABLE"] = {"1", absl::StrJoin(p2p_why, "; ")};
    // InfiniBand.
    int used_nodes = static_cast<int>(local.size());
    std::vector<std::string> no_ib;
    for (const auto& t : nodes_) {
      if (!local.count(t.node())) continue;
      bool active = false;
      for (const auto& d : t.net_devices()) active |= d.state() == "ACTIVE";
      if (!active) no_ib.push_back(t.node());
    }
    const bool intra_net = shm_off && p2p_off;
    if (!no_ib.empty() && (used_nodes > 1 || intra_net)) {
      want["NCCL_IB_DISABLE"] = {
          "1", absl::StrCat("no active InfiniBand/RoCE port on ", absl::StrJoin(no_ib, ", "),
                            used_nodes > 1 ? ": ranks on different nodes talk over TCP "
                                             "sockets"
                                           : ": with SHM and P2P off NCCL uses its "
                                             "network transport inside the node, and "
                                             "sockets are all there is")};
    }
  }
  // Planner values, then the user's (they win).
  for (const auto& [k, v] : want) {
    if (spec_.comm().env().count(k)) continue;
    (*plan_.mutable_env())[k] = v.first;
    Decide(&plan_, "env." + k, v.first, v1::PLANNER, v.second);
  }
  for (const auto& [k, v] : spec_.comm().env()) {
    (*plan_.mutable_env())[k] = v;
    auto it = want.find(k);
    std::string why = "set in spec comm.env; user values win";
    if (it != want.end() && it->second.first != v)
      why += absl::StrFormat(" (the planner would set %s: %s)", it->second.first,
                             it->second.second);
    else if (it != want.end())
      why += " (the planner agrees: " + it->second.second + ")";
    Decide(&plan_, "env." + k, v, v1::USER, why);
  }
}

void Planner::Trials() {
  const bool asked = mode_ == "trial" || mode_ == "auto";
  if (!asked) return;
  if (runner_ == nullptr) {
    if (mode_ == "trial")
      Warn("tuning.mode trial: this dry run has no trials, so the plan is the model's; a "
           "submitted job times the best candidates on its ranks before it starts");
    return;
  }
  // Candidates around the model's choice, ranked by predicted samples/s.
  const int n = plan_.ranks();
  struct Cand {
    int m, k;
    double bucket;
    Prediction p;
  };
  std::vector<Cand> cands;
  std::set<std::tuple<int, int, long>> seen;
  auto add = [&](int m, int k, double bucket) {
    if (m < 1 || k < 1 || bucket <= 0) return;
    if (spec_.train().micro_batch() > 0 && m != spec_.train().micro_batch()) return;
    if (spec_.train().accumulation() > 0 && k != spec_.train().accumulation()) return;
    if (spec_.comm().bucket_mb() > 0 && bucket != plan_.bucket_mb() * kMiB) return;
    auto key = std::make_tuple(m, k, static_cast<long>(bucket / kMiB));
    if (!seen.insert(key).second) return;
    cands.push_back({m, k, bucket, Predict(n, m, k, bucket, in_, link_)});
  };
  const double b = plan_.bucket_mb() * kMiB;
  add(plan_.micro_batch(), plan_.accumulation(), b);
  if (plan_.micro_batch() % 2 == 0)
    add(plan_.micro_batch() / 2, plan_.accumulation() * 2, b);
  if (plan_.accumulation() % 2 == 0 &&
      (in_.max_micro == 0 || plan_.micro_batch() * 2 <= in_.max_micro))
    add(plan_.micro_batch() * 2, plan_.accumulation() / 2, b);
  if (n > 1) {
    add(plan_.micro_batch(), plan_.accumulation(), std::max(kMiB, std::floor(b / 2 / kMiB) * kMiB));
    add(plan_.micro_batch(), plan_.accumulation(), std::min(in_.grad_bytes, b * 2));
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Cand& x, const Cand& y) { return x.p.sps > y.p.sps; });
  if (cands.size() > static_cast<size_t>(kMaxTrials)) cands.resize(kMaxTrials);
  double budget = spec_.tuning().budget_s() > 0 ? spec_.tuning().budget_s() : 120;
  int best = -1;
  int skipped = 0;
  double best_sps = 0;
  const double samples = static_cast<double>(n) * plan_.micro_batch() * plan_.accumulation();
  for (size_t i = 0; i < cands.size(); ++i) {
    const Cand& c = cands[i];
    v1::Plan cand = plan_;
    cand.clear_decisions();
    cand.clear_trials();
    cand.set_micro_batch(c.m);
    cand.set_accumulation(c.k);
    cand.set_bucket_mb(c.bucket / kMiB);
    v1::Trial* t = plan_.add_trials();
    t->set_ranks(n);
    t->set_micro_batch(c.m);
    t->set_accumulation(c.k);
    t->set_bucket_mb(c.bucket / kMiB);
    t->set_predicted_step_seconds(c.p.step);
    t->set_predicted_samples_per_second(c.p.sps);
    if (budget <= 0) {
      t->set_note("skipped: tuning.budget_s used up");
      ++skipped;
      continue;
    }
    auto r = runner_->TimeStep(cand, budget);
    if (!r.ok() && absl::IsResourceExhausted(r.status())) {  // the runner's own budget
      t->set_note(absl::StrCat("skipped: ", r.status().message()));
      ++skipped;
      continue;
    }
    if (!r.ok() || *r <= 0) {
      t->set_note(absl::StrCat("failed: ", r.ok() ? "non-positive time" : r.status().ToString()));
      continue;
    }
    budget -= *r * 10;  // a trial runs a handful of steps; charge ten
    const double sps = static_cast<double>(n) * c.m * c.k / *r;
    t->set_measured_step_seconds(*r);
    t->set_samples_per_second(sps);
    t->set_note(c.p.known ? absl::StrFormat("model predicted %s samples/s", Num(c.p.sps))
                          : "no prediction");
    if (sps > best_sps) {
      best_sps = sps;
      best = static_cast<int>(i);
    }
  }
  (void)samples;
  if (best < 0) {
    Warn(skipped == static_cast<int>(cands.size())
             ? "no tuning trial fitted in tuning.budget_s; keeping the model's plan"
             : "every tuning trial failed; keeping the model's plan");
    return;
  }
  const Cand& c = cands[best];
  plan_.mutable_trials(best)->set_note(plan_.trials(best).note() + "; kept (fastest)");
  // The trials measured what the model lacked: its warning no longer holds.
  auto* warnings = plan_.mutable_warnings();
  warnings->erase(std::remove_if(warnings->begin(), warnings->end(),
                                 [](const std::string& w) {
                                   return absl::StartsWith(w, "no step-time measurement");
                                 }),
                  warnings->end());
  const std::string why = absl::StrFormat("trial: fastest of %d timed candidates, %s "
                                          "samples/s measured",
                                          static_cast<int>(cands.size()), Num(best_sps));
  if (c.m != plan_.micro_batch()) {
    plan_.set_micro_batch(c.m);
    Decide(&plan_, "train.micro_batch", absl::StrCat(c.m), v1::PLANNER, why);
  }
  if (c.k != plan_.accumulation()) {
    plan_.set_accumulation(c.k);
    Decide(&plan_, "train.accumulation", absl::StrCat(c.k), v1::PLANNER, why);
  }
  if (c.bucket / kMiB != plan_.bucket_mb()) {
    plan_.set_bucket_mb(c.bucket / kMiB);
    Decide(&plan_, "comm.bucket_mb", Num(c.bucket / kMiB), v1::PLANNER, why);
  }
  const v1::Trial& bt = plan_.trials(best);
  plan_.set_predicted_step_seconds(bt.measured_step_seconds());
  plan_.set_predicted_samples_per_second(bt.samples_per_second());
  Prediction p = Predict(n, c.m, c.k, c.bucket, in_, link_);
  if (p.known && bt.measured_step_seconds() > 0)
    plan_.set_predicted_comm_share(
        std::max(0.0, bt.measured_step_seconds() - c.k * p.compute) /
        bt.measured_step_seconds());
  PredictMemory(est_, c.m, mem_why_);
}

absl::StatusOr<v1::Plan> Planner::Run() {
  if (nodes_.empty())
    return absl::FailedPreconditionError(
        "planner: no node topology to plan on (no worker agent has registered)");
  Model();
  for (const auto& t : nodes_)
    if (t.unknown_size() > 0)
      Warn(absl::StrFormat("node %s: %d fact(s) unknown to the probe (see `dgca topo`); "
                           "the plan assumes conservatively where they matter",
                           t.node(), t.unknown_size()));
  Device();
  Ranks();
  if (!error_.ok()) return error_;
  Backend();
  Precision();
  Attention();
  Memory();
  BatchAndBuckets();
  Threads();
  Env();
  Trials();
  AttentionTimed();
  if (in_.per_sample <= 0)
    plan_.set_predicted_single_rank_samples_per_second(0);
  return plan_;
}

}  // namespace

absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements) {
  return MakePlan(spec, nodes, measurements, nullptr);
}

absl::StatusOr<v1::Plan> MakePlan(const v1::JobSpec& spec,
                                  const std::vector<v1::Topology>& nodes,
                                  const PlannerMeasurements& measurements,
                                  TrialRunner* trials) {
  Planner p(spec, nodes, measurements, trials);
  return p.Run();
}

std::string FormatBytes(double b) {
  if (b >= kGiB) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= kMiB) return absl::StrFormat("%.1f MiB", b / kMiB);
  return absl::StrFormat("%.0f KiB", b / 1024);
}

}  // namespace dgca
