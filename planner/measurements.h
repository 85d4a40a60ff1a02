// What the planner is told beyond the spec and the topology: measurements
// from earlier jobs and probes on the same nodes (the coordinator reads
// them from its job store, coordinator/measured_planning.h). Every field is
// optional: an absent measurement (0, empty) makes the planner use its
// model instead and say so in the reasons.
#ifndef DGCA_PLANNER_MEASUREMENTS_H_
#define DGCA_PLANNER_MEASUREMENTS_H_

#include <string>
#include <utility>
#include <vector>

namespace dgca {

struct PlannerMeasurements {
  // All-reduce bus bandwidth (bytes/s) and latency (s) between the job's ranks.
  double allreduce_bus_bandwidth = 0;
  double allreduce_latency_s = 0;
  // Raw points of the all-reduce probe, (bytes, seconds) for one all-reduce
  // among the job's ranks. When allreduce_bus_bandwidth is 0 and there are
  // at least two sizes, bandwidth and latency are fitted from them
  // (planner/fits.h, FitAllReduceLine); with a measured link, a bucket's
  // time is interpolated between them (planner/link_model.h).
  std::vector<std::pair<double, double>> allreduce_points;
  // Where the all-reduce figures come from, e.g. "measured by dgca diagnose
  // comm at 2026-11-22 04:40:00 UTC (job j-000003-ab12)"; prefixed to the
  // link's reason when a measurement is used.
  std::string allreduce_source;

  // Seconds for one forward+backward of one micro-batch of `step_micro_batch`
  // samples on one rank. CPU ranks: measure with the plan's threads_per_rank
  // and, ideally, while the other ranks run too (a trial): ranks share cores
  // and memory bandwidth, and a rank timed alone on a busy 2-core machine ran
  // twice as fast as the same rank next to its peer (bench/gloo gloo-exposed,
  // tiny preset, micro-batch 16: 11.5 vs 22 ms per sample).
  double step_seconds = 0;
  int step_micro_batch = 0;
  // Step-time points (micro-batch, seconds per micro-step of forward+
  // backward+optimizer, communication excluded), e.g. what earlier jobs of
  // the same model measured, newest first. With two or more distinct
  // micro-batches they replace step_seconds/step_micro_batch: c(m) = a + b m
  // is fitted (planner/fits.h, FitStepTime). One point acts as
  // step_seconds/step_micro_batch.
  std::vector<std::pair<int, double>> step_points;
  // Where the step time comes from, e.g. "measured by job j-000004-ab12 at
  // 2026-11-22 05:10:00 UTC (micro-batch 16, median of 40 steps)"; cited in
  // the accumulation decision's reason.
  std::string step_source;

  // Extra all-reduce time inside a job, per second of compute c(m): the
  // ranks' steps jitter, so each all-reduce also waits for the slower peer,
  // which a probe that only communicates never sees. Learned from earlier
  // jobs on these nodes as (measured all-reduce - the probe's prediction) /
  // measured compute; 0 = none. Added to C as skew * c(m).
  double allreduce_skew_per_compute = 0;
  std::string allreduce_skew_source;

  // Memory points (micro-batch, bytes): the most memory a rank of an earlier
  // job of the same model on these nodes held (GPU memory with the CUDA
  // context, or a CPU rank's peak resident set), newest first, one per
  // micro-batch. The plan's memory line goes through them (planner/fits.h,
  // FitMemoryLine); memory_source is cited.
  std::vector<std::pair<int, double>> memory_points;
  std::string memory_source;
  // The same for the GEMM + softmax attention, where the plan's are the
  // fused kernels' (CUDA): peaks of earlier runs that ran the GEMM version
  // (an explicit gemm plan, or an "auto" plan whose ranks kept it). An
  // "auto" plan predicts its memory, the GEMM version's, through them
  // instead of through the fused line plus the memory model's difference.
  std::vector<std::pair<int, double>> gemm_memory_points;
  std::string gemm_memory_source;

  // The compute prior's efficiency for the plan's device class (planner/
  // compute_prior.h): what earlier jobs of any model on that class reached
  // of the ideal time; 0 = none (the run of record's is used).
  double compute_efficiency = 0;
  std::string compute_efficiency_source;

  // An operator's replacement for the link prior's bus bandwidth (bytes/s),
  // used where nothing was measured (dgca-coordinator --link-prior-busbw:
  // what-if planning, and the tests that give a job a wrong prior to see
  // the re-plan correct it); 0 = the topology's prior.
  double link_prior_busbw = 0;
};

}  // namespace dgca

#endif  // DGCA_PLANNER_MEASUREMENTS_H_
