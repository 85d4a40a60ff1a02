// The planner's resource decisions (planner/decisions.h): the model's
// sizes, device, ranks, backend, precision, attention kernels, threads and
// environment.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/decisions.h"
#include "planner/units.h"
#include "spec/spec.h"

namespace dgca {
namespace {

using planner_text::Num;

// One NCCL shared-memory segment, as a failing NCCL run reported it
// ("Error while creating shared memory segment /dev/shm/nccl-... (size
// 9637888)", microsoft/WSL#12467): NCCL_BUFFSIZE 4 MiB for the Simple
// protocol plus the LL and LL128 buffers of one connection.
constexpr double kShmSegmentBytes = 9637888;
constexpr int kShmChannels = 2;  // NCCL opens at least 2 channels on PCIe

int TotalGpus(const std::vector<v1::Topology>& nodes) {
  int n = 0;
  for (const auto& t : nodes) n += t.gpus_size();
  return n;
}

}  // namespace

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
    *why = absl::StrCat(cpus, " CPUs, cgroup limit ", Num(t.cgroup_cpu_limit()), " -> ", lim);
    cpus = lim;
  }
  return cpus;
}

ModelFacts DescribeModel(const v1::JobSpec& spec, PlanBuilder* b) {
  ModelFacts f;
  std::string preset = spec.model().preset();
  if (preset.empty()) preset = "bert-base";
  if (preset != "custom") {
    auto p = ApplyPreset(preset, f.cfg);
    if (p.ok()) {
      f.cfg = *p;
    } else {
      b->Warn(absl::StrCat("model.preset \"", preset,
                           "\" unknown to the planner; sizing as bert-base"));
    }
  }
  const v1::ModelSpec& ms = spec.model();
  if (ms.layers() > 0) f.cfg.layers = ms.layers();
  if (ms.hidden() > 0) f.cfg.hidden = ms.hidden();
  if (ms.heads() > 0) f.cfg.heads = ms.heads();
  if (ms.ffn() > 0) f.cfg.ffn = ms.ffn();
  if (ms.has_prompt()) {
    f.cfg.prompt_length = ms.prompt().length();
    const std::string& e = ms.prompt().encoder();
    f.cfg.prompt_encoder = e == "mlp"    ? PromptEncoderKind::kMlp
                           : e == "none" ? PromptEncoderKind::kNone
                                         : PromptEncoderKind::kLstm;
  }
  if (ms.has_heads_spec()) {
    f.cfg.detector = ms.heads_spec().detector();
    f.cfg.candidate = ms.heads_spec().candidate().enabled();
    if (ms.heads_spec().candidate().top_k() > 0)
      f.cfg.candidate_top_k = ms.heads_spec().candidate().top_k();
    f.cfg.fusion = ms.heads_spec().fusion() == "none" ? FusionKind::kNone : FusionKind::kGated;
  }
  // As the ranks will train (worker/rank/train_config.cc), so a memory
  // model that counts dropout's scratch sees it.
  const SpecDropout dropout = DropoutOf(ms);
  f.cfg.hidden_dropout = static_cast<float>(dropout.hidden);
  f.cfg.attention_dropout = static_cast<float>(dropout.attention);
  f.params = CountParameters(f.cfg);
  f.seq_len = spec.data().max_seq_len() > 0 ? spec.data().max_seq_len() : 128;
  f.global = spec.train().global_batch() > 0 ? spec.train().global_batch() : 128;
  f.mode = spec.tuning().mode().empty() ? "auto" : spec.tuning().mode();
  b->plan().set_tuning_mode(f.mode);
  return f;
}

void WarnUnknownFacts(const std::vector<v1::Topology>& nodes, PlanBuilder* b) {
  for (const auto& t : nodes)
    if (t.unknown_size() > 0)
      b->Warn(absl::StrFormat("node %s: %d fact(s) unknown to the probe (see `dgca topo`); "
                              "the plan assumes conservatively where they matter",
                              t.node(), t.unknown_size()));
}

bool DecideDevice(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                  PlanBuilder* b) {
  const std::string want = absl::AsciiStrToLower(spec.resources().device());
  const int gpus = TotalGpus(nodes);
  bool cuda;
  if (want == "cuda" || want == "cpu") {
    cuda = want == "cuda";
    b->Decide("resources.device", want, v1::USER, "set in the spec");
    if (cuda && gpus == 0)
      b->Warn("cannot run here: resources.device is cuda but no connected node reports an "
              "NVIDIA GPU, so the ranks would fail to start (set device: cpu or auto, or connect "
              "a GPU node's agent); the plan below assumes one GPU of unknown model and memory: "
              "no memory bound, no step-time prediction");
  } else if (gpus > 0) {
    cuda = true;
    b->Decide("resources.device", "cuda", v1::PLANNER,
              absl::StrCat(gpus, " NVIDIA GPU(s) on ", nodes.size(), " node(s)"));
  } else {
    cuda = false;
    b->Decide("resources.device", "cpu", v1::PLANNER, "no node reports an NVIDIA GPU");
  }
  b->plan().set_device(cuda ? "cuda" : "cpu");
  return cuda;
}

absl::Status DecideRanks(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                         bool cuda, int global, PlanBuilder* b) {
  const int user = spec.resources().ranks();
  const int gpus = TotalGpus(nodes);
  if (user > 0) {
    b->plan().set_ranks(user);
    b->Decide("resources.ranks", absl::StrCat(user), v1::USER, "set in the spec");
    // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
    // detected"), and CUDA ranks all-reduce over NCCL.
    if (cuda && user > gpus && gpus > 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "resources.ranks = ", user, " but the connected nodes have ", gpus,
          " GPU(s): CUDA ranks need one GPU each (NCCL refuses two ranks on one GPU); set "
          "resources.ranks <= ",
          gpus, " or leave it auto (one rank per GPU)",
          absl::AsciiStrToLower(spec.resources().device()) == "cuda" ? ""
                                                                      : ", or resources.device: cpu",
          ", or wait for more nodes' agents to connect"));
    if (user > global)
      return absl::InvalidArgumentError(absl::StrCat(
          "resources.ranks = ", user, " but train.global_batch = ", global,
          ": every rank needs at least one sample per step; set resources.ranks <= ", global,
          " or train.global_batch >= ", user));
    if (!cuda) {
      // CPU ranks: each runs its GEMMs on threads of its own and a Gloo
      // pair per peer. Past kMaxCpuRanksPerCore ranks a core the node only
      // thrashes (a test with 4096 ranks on 2 cores stalled the machine,
      // coordinator included); up to it a warning says what it costs.
      int cpus = 0;
      bool known = true;
      for (const auto& t : nodes) {
        std::string why;
        known &= t.cpu_count() > 0;
        cpus += EffectiveCpus(t, &why);
      }
      if (known && user > kMaxCpuRanksPerCore * cpus) {
        return absl::InvalidArgumentError(absl::StrCat(
            "resources.ranks = ", user, " CPU ranks but the connected nodes have ", cpus,
            " CPU(s) in all: more than ", kMaxCpuRanksPerCore,
            " ranks per CPU only thrashes; set resources.ranks <= ", kMaxCpuRanksPerCore * cpus,
            " (one per CPU is the most that computes in parallel) or leave it auto"));
      } else if (known && user > cpus) {
        b->Warn(absl::StrCat("resources.ranks = ", user, " CPU ranks on ", cpus,
                             " CPU(s): ranks share cores, so each step is slower than with ",
                             cpus, " ranks"));
      }
    }
  } else if (cuda) {
    b->plan().set_ranks(std::max(1, gpus));
    b->Decide("resources.ranks", absl::StrCat(b->plan().ranks()), v1::PLANNER,
              absl::StrCat("one rank per GPU (", gpus,
                           " GPU(s)); without a step-time measurement it cannot be "
                           "compared with one rank alone"));
  } else {
    int total = 0;
    std::vector<std::string> parts;
    for (const auto& t : nodes) {
      std::string why;
      int cpus = EffectiveCpus(t, &why);
      int r = t.numa_nodes() > 1 ? std::min(t.numa_nodes(), cpus) : std::max(1, std::min(2, cpus));
      total += r;
      parts.push_back(absl::StrCat(t.node(), ": ", why, ", ", std::max(1, t.numa_nodes()),
                                   " NUMA node(s) -> ", r));
    }
    b->plan().set_ranks(std::max(1, total));
    b->Decide("resources.ranks", absl::StrCat(b->plan().ranks()), v1::PLANNER,
              absl::StrCat("CPU: one rank per NUMA node, or min(2, cpus) on one NUMA "
                           "node (OpenBLAS GEMMs scale sublinearly past a few threads, "
                           "so two half-width ranks lose little and each extra rank "
                           "adds a Gloo all-reduce); ",
                           absl::StrJoin(parts, "; ")));
  }
  return absl::OkStatus();
}

void DecideBackend(const v1::JobSpec& spec, bool cuda, PlanBuilder* b) {
  const std::string want = absl::AsciiStrToLower(spec.comm().backend());
  if (want == "nccl" || want == "gloo") {
    b->plan().set_backend(want);
    b->Decide("comm.backend", want, v1::USER, "set in the spec");
    if ((want == "nccl") != cuda)
      b->Warn(absl::StrCat("comm.backend ", want, " with device ", b->plan().device(),
                           ": NCCL needs CUDA ranks, Gloo runs on host memory"));
  } else {
    b->plan().set_backend(cuda ? "nccl" : "gloo");
    b->Decide("comm.backend", b->plan().backend(), v1::PLANNER,
              cuda ? "CUDA ranks: NCCL (GPU-direct collectives)"
                   : "CPU ranks: Gloo (host-memory collectives over TCP)");
  }
}

Precision DecidePrecision(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                          bool cuda, PlanBuilder* b) {
  const std::string want = absl::AsciiStrToLower(spec.train().precision());
  if (want == "fp32" || want == "fp16" || want == "bf16") {
    b->plan().set_precision(want);
    b->Decide("train.precision", want, v1::USER, "set in the spec");
    if (!cuda && want != "fp32")
      b->Warn(absl::StrCat("train.precision ", want,
                           " on CPU ranks: the CPU backend computes in fp32"));
  } else if (!cuda) {
    b->plan().set_precision("fp32");
    b->Decide("train.precision", "fp32", v1::PLANNER,
              "CPU ranks compute in fp32 (no fast half-precision GEMM on CPU)");
  } else {
    int min_cc = 1000;
    bool unknown = false;
    for (const auto& t : nodes)
      for (const auto& g : t.gpus()) {
        if (g.compute_capability_major() <= 0) {
          unknown = true;
        } else {
          min_cc = std::min(min_cc,
                            g.compute_capability_major() * 10 + g.compute_capability_minor());
        }
      }
    if (min_cc == 1000 && !unknown) {
      // No GPU at all (DecideDevice warned that the ranks cannot start):
      // no compute capability to read, none to invent.
      b->plan().set_precision("bf16");
      b->Decide("train.precision", "bf16", v1::PLANNER,
                "no connected node reports a GPU, so no compute capability: the plan assumes "
                "bf16 (sm_80 or newer); on an older GPU it would be fp16");
    } else if (unknown && min_cc == 1000) {
      b->plan().set_precision("fp16");
      b->Decide("train.precision", "fp16", v1::PLANNER,
                "compute capability unknown (no NVML or nvidia-smi facts): fp16 with "
                "loss scaling runs on every GPU this build supports (sm_75+); bf16 "
                "needs sm_80");
      b->Warn("GPU compute capability unknown: precision fp16 chosen conservatively");
    } else if (min_cc >= 80 && !unknown) {
      b->plan().set_precision("bf16");
      b->Decide("train.precision", "bf16", v1::PLANNER,
                absl::StrFormat("compute capability %d.%d >= 8.0: bf16 (fp32 range, "
                                "no loss scaling), fp32 master weights",
                                min_cc / 10, min_cc % 10));
    } else {
      b->plan().set_precision("fp16");
      b->Decide("train.precision", "fp16", v1::PLANNER,
                absl::StrFormat("compute capability %d.%d%s < 8.0 has no fast bf16: "
                                "fp16 with dynamic loss scaling, fp32 master weights",
                                min_cc / 10, min_cc % 10, unknown ? " (some unknown)" : ""));
    }
  }
  const auto precision = ::dgca::ParsePrecision(b->plan().precision(), "plan.precision");
  return precision.ok() ? *precision : Precision::kFp32;
}

// The attention kernels of CUDA ranks (model/cuda/flash_attention.h): the
// fused ones where they apply (16-bit, head size 16/32/64, L <= 512), the
// GEMM + softmax version otherwise or when the spec asks for it.
void DecideAttention(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                     Precision precision, PlanBuilder* b) {
  const std::string want = absl::AsciiStrToLower(spec.train().attention());
  const bool asked = want == "fused" || want == "gemm";
  if (!cuda) {
    b->plan().set_attention("");
    if (asked)
      b->Warn(absl::StrCat("train.attention ", want,
                           " on CPU ranks: the CPU backend has one attention (fp32)"));
    return;
  }
  const ModelConfig& cfg = model.cfg;
  const int d = cfg.heads > 0 ? cfg.hidden / cfg.heads : 0;
  std::string why_not;  // why the fused kernels cannot run, if they cannot
  if (precision == Precision::kFp32) {
    why_not = "fp32: the fused kernels are bf16/fp16 only";
  } else if (!FusedAttentionShape(model.seq_len, cfg.hidden, cfg.heads)) {
    why_not = absl::StrFormat(
        "head size %d (hidden %d / %d heads), seq_len %d: the fused kernels take head "
        "sizes 16, 32 and 64 and seq_len up to 512",
        d, cfg.hidden, cfg.heads, model.seq_len);
  }
  if (want == "gemm") {
    b->plan().set_attention("gemm");
    b->Decide("train.attention", "gemm", v1::USER, "set in the spec");
  } else if (!why_not.empty()) {
    b->plan().set_attention("gemm");
    b->Decide("train.attention", "gemm", v1::PLANNER,
              absl::StrCat("GEMM + softmax attention: ", why_not));
    if (want == "fused")
      b->Warn(absl::StrCat("train.attention fused cannot run here (", why_not,
                           "): GEMM attention"));
  } else {
    b->plan().set_attention("fused");
    b->Decide("train.attention", "fused", want == "fused" ? v1::USER : v1::PLANNER,
              want == "fused"
                  ? "set in the spec"
                  : absl::StrFormat(
                        "%s, head size %d, seq_len %d <= 512: fused flash-style kernels (each "
                        "layer keeps a [heads, L] log-sum-exp per sample, not [heads, L, L] "
                        "probabilities)",
                        b->plan().precision(), d, model.seq_len));
  }
}

void DecideThreads(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes, bool cuda,
                   PlanBuilder* b) {
  std::string why;
  const v1::Topology& t = nodes[0];
  int cpus = EffectiveCpus(t, &why);
  int per_node = 0;
  for (const auto& r : b->plan().rank_nodes())
    if (r == t.node()) ++per_node;
  per_node = std::max(1, per_node);
  const int user_t = spec.resources().threads_per_rank();
  int lt;
  const int user_l = spec.data().loader().threads();
  if (user_l > 0) {
    lt = user_l;
    b->Decide("data.loader.threads", absl::StrCat(lt), v1::USER, "set in the spec");
  } else if (cuda) {
    lt = std::max(1, std::min(4, cpus / per_node - 1));
    b->Decide("data.loader.threads", absl::StrCat(lt), v1::PLANNER,
              absl::StrFormat("GPU ranks: min(4, %s / %d rank(s) per node - 1 for the "
                              "rank's own thread) = %d; the ReLM batch builder is cheap "
                              "next to a GPU step",
                              why, per_node, lt));
  } else {
    lt = 1;
    b->Decide("data.loader.threads", "1", v1::PLANNER,
              "CPU ranks: one loader thread (every extra thread takes a core from the "
              "GEMMs; building a batch costs far less than a CPU step)");
  }
  b->plan().set_loader_threads(lt);
  int tpr;
  if (user_t > 0) {
    tpr = user_t;
    b->Decide("resources.threads_per_rank", absl::StrCat(tpr), v1::USER, "set in the spec");
    if (!cuda && tpr * per_node > cpus)
      b->Warn(absl::StrFormat("threads_per_rank %d x %d rank(s) > %d CPUs: oversubscribed", tpr,
                              per_node, cpus));
  } else if (cuda) {
    tpr = 1;
    b->Decide("resources.threads_per_rank", "1", v1::PLANNER,
              "GPU ranks compute on the GPU; host threads go to the data loader");
  } else {
    tpr = std::max(1, cpus / per_node);
    b->Decide("resources.threads_per_rank", absl::StrCat(tpr), v1::PLANNER,
              absl::StrFormat("max(1, %s / %d rank(s) per node) = %d", why, per_node, tpr));
  }
  b->plan().set_threads_per_rank(tpr);
}

void DecideEnv(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes, bool cuda,
               PlanBuilder* b) {
  std::map<std::string, std::pair<std::string, std::string>> want;  // k -> (v, why)
  if (!cuda) {
    want["OMP_NUM_THREADS"] = {absl::StrCat(b->plan().threads_per_rank()),
                               "one OpenMP/OpenBLAS thread pool of threads_per_rank "
                               "per rank, so ranks do not oversubscribe the cores"};
  } else {
    want["CUDA_DEVICE_ORDER"] = {"PCI_BUS_ID",
                                 "rank_local_devices index GPUs in PCI bus order, as "
                                 "nvidia-smi and the probe do (CUDA's default order is "
                                 "fastest-first)"};
    // Ranks per node.
    std::map<std::string, int> local;
    for (const auto& r : b->plan().rank_nodes()) local[r]++;
    bool shm_off = false, p2p_off = false;
    std::vector<std::string> shm_why, p2p_why;
    for (const auto& t : nodes) {
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
            t.node(), FormatBytes(t.shm_free_bytes()), FormatBytes(need), r, kShmChannels,
            kShmSegmentBytes));
      } else if (shm_unknown || t.shm_total_bytes() == 0) {
        b->Warn(absl::StrFormat(
            "%s: /dev/shm size unknown; NCCL_SHM_DISABLE not set. If NCCL fails with "
            "\"Error while creating shared memory segment\", set comm.env "
            "NCCL_SHM_DISABLE: \"1\" or enlarge /dev/shm (>= %s)",
            t.node(), FormatBytes(need)));
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
      want["NCCL_SHM_DISABLE"] = {
          "1", absl::StrJoin(shm_why, "; ") + "; NCCL falls back to its network transport"};
    if (p2p_off) want["NCCL_P2P_DISABLE"] = {"1", absl::StrJoin(p2p_why, "; ")};
    // InfiniBand.
    int used_nodes = static_cast<int>(local.size());
    std::vector<std::string> no_ib;
    for (const auto& t : nodes) {
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
    if (spec.comm().env().count(k)) continue;
    (*b->plan().mutable_env())[k] = v.first;
    b->Decide("env." + k, v.first, v1::PLANNER, v.second);
  }
  for (const auto& [k, v] : spec.comm().env()) {
    (*b->plan().mutable_env())[k] = v;
    auto it = want.find(k);
    std::string why = "set in spec comm.env; user values win";
    if (it != want.end() && it->second.first != v)
      why += absl::StrFormat(" (the planner would set %s: %s)", it->second.first,
                             it->second.second);
    else if (it != want.end())
      why += " (the planner agrees: " + it->second.second + ")";
    b->Decide("env." + k, v, v1::USER, why);
  }
}

}  // namespace dgca
