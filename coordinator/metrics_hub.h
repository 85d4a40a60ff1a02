// Prometheus metrics of the coordinator (docs/metrics.md): a
// prometheus-cpp registry, optionally served on /metrics by one Exposer.
//
// Series (prefix dgca_, base units, _total on counters; labels job, rank,
// node, gpu, head, state, level, kind):
//   dgca_jobs{state}                               gauge, jobs by state
//   dgca_job_state{job,state}                      gauge, 1 for the job's current state
//       (one series per job; alerts join on it to watch only RUNNING jobs)
//   dgca_job_progress_ratio{job}, dgca_job_eta_seconds{job},
//   dgca_job_samples_per_second{job}               gauges, job level
//   dgca_train_step{job,rank,node}                 gauge, last optimizer step
//   dgca_train_target_steps{job}                   gauge, train.steps
//   dgca_train_loss{job,rank,node,head}            gauge; head="total" + per head
//   dgca_train_samples_per_second{job,rank,node}   gauge
//   dgca_train_step_seconds{job,rank,node}         histogram
//   dgca_train_learning_rate, dgca_train_grad_norm{job,rank,node}  gauges
//   dgca_train_samples_total{job,rank,node}        counter
//   dgca_data_wait_seconds_total{job,rank,node}    counter
//   dgca_comm_allreduce_seconds_total{job,rank,node}, dgca_comm_exposed_seconds_total
//   dgca_comm_exposed_ratio{job,rank,node}         gauge, exposed comm / step time
//   dgca_comm_bus_bandwidth_bytes_per_second{job,rank,node}
//   dgca_gpu_utilization_ratio, dgca_gpu_memory_used_bytes, dgca_gpu_power_watts
//       {job,rank,node,gpu}: only once a rank reports a value >= 0 (absent on CPU)
//   dgca_rank_memory_peak_bytes{job,rank,node}   the rank process's peak
//       resident set, once it reports one (every rank: host memory)
//   dgca_eval_f1{job,level,kind}  from eval keys "<level>_<kind>_f1"
//       (e.g. sentence_correction_f1 -> level=sentence, kind=correction)
//   dgca_eval_metric{job,name}    every eval value
//   dgca_worker_heartbeat_age_seconds{node}, dgca_worker_connected{node}
//   dgca_rank_restarts_total{job}               counter, 0 from the first SetJobProgress
//   dgca_job_final_loss{job}                    gauge, an ended job's final loss (Job.final_loss)
//   dgca_job_peak_memory_bytes{job}             gauge, an ended job's Job.peak_memory_bytes
//
// Ended jobs (EndJob): the live series go, every {job,rank,node} series
// (dgca_train_*, dgca_data_*, dgca_comm_*, dgca_gpu_*, dgca_rank_memory_*)
// and dgca_job_samples_per_second and dgca_job_eta_seconds; what is a fact
// about the ended job stays (dgca_job_state, dgca_job_progress_ratio,
// dgca_train_target_steps, dgca_eval_*, dgca_rank_restarts_total) and
// dgca_job_final_loss and dgca_job_peak_memory_bytes appear, until
// RemoveJob.
//
// Thread-safety: all methods are thread-safe.
#ifndef DGCA_COORDINATOR_METRICS_HUB_H_
#define DGCA_COORDINATOR_METRICS_HUB_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/metrics.pb.h"

namespace prometheus {
class Registry;
class Exposer;
class Gauge;
class Counter;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace dgca {

class MetricsHub {
 public:
  MetricsHub();
  ~MetricsHub();
  MetricsHub(const MetricsHub&) = delete;
  MetricsHub& operator=(const MetricsHub&) = delete;

  // Serves /metrics on `listen` ("host:port"; port 0 picks one). Returns the
  // bound "host:port". At most once per hub (and one Exposer per process is
  // advised: its destructor takes ~2 s).
  absl::StatusOr<std::string> StartExposer(const std::string& listen);
  // The text exposition format of everything registered (what /metrics serves).
  std::string Serialize() const;

  void SetJobCounts(const std::map<v1::JobState, int>& counts);
  // dgca_job_state{job,state=<state>} = 1, the series of its previous state removed.
  void SetJobState(const std::string& job, v1::JobState state);
  // `node` and `gpu` (local device index, -1 = none) label the rank's series.
  void IngestStep(const v1::StepMetrics& m, const std::string& node, int gpu);
  void IngestEval(const v1::EvalMetrics& m);
  void SetJobProgress(const std::string& job, double ratio, double eta_seconds,
                      double samples_per_second, int64_t target_steps);
  void SetHeartbeatAge(const std::string& node, double age_seconds, bool connected);
  // Drops the node's dgca_worker_* series (a node the scheduler forgot).
  void RemoveNode(const std::string& node);
  void IncRankRestarts(const std::string& job);
  // The job has ended: drops its live series (see the header comment) and
  // sets dgca_job_final_loss (when it has one) and dgca_job_peak_memory_bytes
  // (when > 0).
  void EndJob(const std::string& job, std::optional<double> final_loss, double peak_memory_bytes);
  // Drops every series labelled with `job` (the scheduler calls it for
  // finished jobs it no longer remembers, so series stay bounded).
  void RemoveJob(const std::string& job);

 private:
  struct Families;
  struct RankSeries;
  struct JobSeries;
  RankSeries* Rank(const std::string& job, int rank, const std::string& node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every series of `r` from the registry.
  void RemoveRankSeries(RankSeries* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every rank series of `job`.
  void RemoveRanksOf(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int>, std::unique_ptr<RankSeries>> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<JobSeries>> job_series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgca

#endif  // DGCA_COORDINATOR_METRICS_HUB_H_
