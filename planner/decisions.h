// The planner's decisions, in the order MakePlan (planner/planner.cc) takes
// them. Each is a function of the spec, the nodes, the measurements and the
// results of the decisions before it, passed explicitly; each records its
// value and reason in the PlanBuilder (a user's value wins, with source
// USER) and returns what later decisions need.
//
//   DescribeModel     sizes of the model the spec asks for (ModelFacts)
//   DecideDevice      resources.device: cuda when a node reports a GPU
//   DecideRanks       resources.ranks: one per GPU; CPU one per NUMA node or
//                     min(2, cpus); refuses counts that cannot work
//   DecideBackend     comm.backend: NCCL for CUDA ranks, Gloo for CPU
//   DecidePrecision   train.precision: bf16 on cc >= 8.0, fp16 below or
//                     unknown, fp32 on CPU
//   DecideAttention   train.attention: fused kernels where they apply
//   DecideMemory      the memory budget per rank and the largest micro-batch
//   DecideBatch       micro-batch, accumulation, bucket, the rank count
//                     against one rank alone, placement, predictions
//   DecideThreads     data.loader.threads, resources.threads_per_rank
//   DecideEnv         env.*: only what the topology calls for
//   (trials)          planner/trials.h
//   DecideAttentionTimed  "auto" when the GEMM attention would fit too
//
// Pure functions; safe from any thread.
#ifndef DGCA_PLANNER_DECISIONS_H_
#define DGCA_PLANNER_DECISIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/topology.pb.h"
#include "model/core/config.h"
#include "model/core/memory_model.h"
#include "planner/cost_model.h"
#include "planner/link_model.h"
#include "planner/measurements.h"
#include "planner/plan_builder.h"
#include "planner/trials.h"

namespace dgca {

// GPU memory a CUDA rank may use for itself: this share of the device's
// (docs/planner.md: 70-85%), less the CUDA context.
inline constexpr double kGpuMemoryTarget = 0.80;
// A predicted peak above this share of the device warns.
inline constexpr double kMemoryWarnShare = 0.85;
// Host memory is shared with the OS and the other ranks of the node.
inline constexpr double kCpuMemoryTarget = 0.70;
inline constexpr double kCudaContextBytes = 512.0 * 1024 * 1024;
// CPU ranks per CPU past which a spec is refused (DecideRanks).
inline constexpr int kMaxCpuRanksPerCore = 4;

// The model as the ranks will build it.
struct ModelFacts {
  ModelConfig cfg;
  int64_t params = 0;
  int seq_len = 128;
  int global = 128;            // train.global_batch
  std::string mode = "auto";   // tuning.mode
  double grad_bytes() const { return 4.0 * static_cast<double>(params); }
};
ModelFacts DescribeModel(const v1::JobSpec& spec, PlanBuilder* b);

// A warning per node whose probe left facts unknown.
void WarnUnknownFacts(const std::vector<v1::Topology>& nodes, PlanBuilder* b);

// Returns whether the ranks are CUDA ranks; sets plan.device.
bool DecideDevice(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                  PlanBuilder* b);

// Sets plan.ranks. INVALID_ARGUMENT for a rank count that cannot work: more
// CUDA ranks than GPUs, more ranks than samples per step, more than
// kMaxCpuRanksPerCore CPU ranks per CPU.
absl::Status DecideRanks(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                         bool cuda, int global, PlanBuilder* b);

// Sets plan.backend.
void DecideBackend(const v1::JobSpec& spec, bool cuda, PlanBuilder* b);

// Sets plan.precision and returns it.
Precision DecidePrecision(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                          bool cuda, PlanBuilder* b);

// Sets plan.attention ("" on CPU, "fused" or "gemm"; DecideAttentionTimed
// may make "fused" "auto" once the micro-batch is known).
void DecideAttention(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                     Precision precision, PlanBuilder* b);

// The memory a rank may use and the line its peak follows.
struct MemoryPlan {
  MemoryEstimate est;        // the model's, through measured peaks where there are any
  double budget = 0;         // per rank, without the CUDA context; 0 = unknown
  double device_memory = 0;  // one GPU's, or the host's share per rank
  int max_micro = 0;         // the largest micro-batch that fits (0 = no bound known)
  std::string why;           // the budget's arithmetic, cited by the batch decisions
  // Whether `bytes` is above kMemoryWarnShare of the device (when known).
  bool High(double bytes) const {
    return device_memory > 0 && bytes > kMemoryWarnShare * device_memory;
  }
};
// For plan.ranks() ranks with plan.attention()'s kernels (decided before).
// Sets device_memory_bytes and memory_target_bytes.
MemoryPlan DecideMemory(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                        const ModelFacts& model, bool cuda, Precision precision,
                        const PlannerMeasurements& meas, PlanBuilder* b);

// Sets predicted_memory_bytes (+ the CUDA context) and
// predicted_activation_bytes_per_sample from `est` at micro-batch m, and the
// decision predicted.memory_bytes that says how.
void PredictMemory(const MemoryEstimate& est, int m, const std::string& why, bool cuda,
                   PlanBuilder* b);

// What DecideBatch settled, for the trials.
struct BatchPlan {
  CostInputs in;   // c(m), G, overlap, the memory bound
  LinkModel link;  // of the chosen rank count
};
// train.micro_batch, train.accumulation, comm.bucket_mb; resources.ranks
// again when one rank would be faster than the planned ranks (c(m) from the
// measurements, else from the compute prior, planner/compute_prior.h); the
// placement (rank_nodes, rank_local_devices); the predictions.
BatchPlan DecideBatch(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes,
                      const ModelFacts& model, bool cuda, Precision precision,
                      const MemoryPlan& memory,
                      const PlannerMeasurements& meas, PlanBuilder* b);

// data.loader.threads and resources.threads_per_rank for the placement.
void DecideThreads(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes, bool cuda,
                   PlanBuilder* b);

// env.*: OMP_NUM_THREADS on CPU; CUDA_DEVICE_ORDER, and NCCL_SHM_DISABLE /
// NCCL_P2P_DISABLE / NCCL_IB_DISABLE only where the topology calls for
// them; the spec's comm.env wins.
void DecideEnv(const v1::JobSpec& spec, const std::vector<v1::Topology>& nodes, bool cuda,
               PlanBuilder* b);

// tuning.mode trial (or auto) with a runner: candidates around the batch
// decision (micro-batch halved or doubled with the accumulation, bucket
// halved or doubled), ranked by predicted samples/s, the best kMaxTrials
// timed within tuning.budget_s; the fastest measured one is kept and its
// measured step becomes the prediction. Without a runner, trial mode only
// warns that a dry run has no trials. planner/trials.cc.
void DecideByTrials(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                    const MemoryPlan& memory, const BatchPlan& batch, TrialRunner* runner,
                    PlanBuilder* b);

// train.attention auto, where the fused kernels run, once the micro-batch is
// final: when the GEMM version's [heads, L, L] probabilities would also fit
// the memory budget, the plan says "auto" and each rank times both at
// startup and keeps the faster (model/cuda/attention_tune.h); otherwise it
// stays "fused" and says why.
void DecideAttentionTimed(const v1::JobSpec& spec, const ModelFacts& model, bool cuda,
                          Precision precision, const MemoryPlan& memory,
                          const PlannerMeasurements& meas, PlanBuilder* b);

// Usable CPUs of a node (its count, or its cgroup limit when lower); *why
// says which.
int EffectiveCpus(const v1::Topology& t, std::string* why);

}  // namespace dgca

#endif  // DGCA_PLANNER_DECISIONS_H_
