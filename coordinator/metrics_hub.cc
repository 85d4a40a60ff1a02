#include "coordinator/metrics_hub.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dgca {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

struct MetricsHub::Families {
  explicit Families(prometheus::Registry& r)
      : jobs(prometheus::BuildGauge().Name("dgca_jobs").Help("Jobs by state.").Register(r)),
        job_state(prometheus::BuildGauge().Name("dgca_job_state")
                      .Help("1, labelled with the job's current state (one series per job).").Register(r)),
        job_progress(prometheus::BuildGauge().Name("dgca_job_progress_ratio")
                         .Help("Job progress: completed optimizer steps / train.steps (0..1).").Register(r)),
        job_eta(prometheus::BuildGauge().Name("dgca_job_eta_seconds")
                    .Help("Estimated seconds until the job's last step.").Register(r)),
        job_sps(prometheus::BuildGauge().Name("dgca_job_samples_per_second")
                    .Help("Training throughput of the whole job (sum over ranks), samples per second.").Register(r)),
        step(prometheus::BuildGauge().Name("dgca_train_step")
                 .Help("Last completed optimizer step of a rank.").Register(r)),
        target_steps(prometheus::BuildGauge().Name("dgca_train_target_steps")
                         .Help("Optimizer steps the job trains for (train.steps).").Register(r)),
        loss(prometheus::BuildGauge().Name("dgca_train_loss")
                 .Help("Training loss of the last step, by head (head=\"total\" is the full loss).").Register(r)),
        sps(prometheus::BuildGauge().Name("dgca_train_samples_per_second")
                .Help("Training samples per second of a rank.").Register(r)),
        step_seconds(prometheus::BuildHistogram().Name("dgca_train_step_seconds")
                         .Help("Wall time of one optimizer step of a rank, seconds.").Register(r)),
        lr(prometheus::BuildGauge().Name("dgca_train_learning_rate")
               .Help("Learning rate of the last step.").Register(r)),
        grad_norm(prometheus::BuildGauge().Name("dgca_train_grad_norm")
                      .Help("Global gradient L2 norm of the last step (before clipping).").Register(r)),
        samples(prometheus::BuildCounter().Name("dgca_train_samples_total")
                    .Help("Training samples processed by a rank.").Register(r)),
        data_wait(prometheus::BuildCounter().Name("dgca_data_wait_seconds_total")
                      .Help("Seconds a rank waited for its input pipeline.").Register(r)),
        allreduce(prometheus::BuildCounter().Name("dgca_comm_allreduce_seconds_total")
                      .Help("Seconds a rank spent in gradient all-reduce.").Register(r)),
        exposed(prometheus::BuildCounter().Name("dgca_comm_exposed_seconds_total")
                    .Help("Seconds of communication not overlapped with compute.").Register(r)),
        exposed_ratio(prometheus::BuildGauge().Name("dgca_comm_exposed_ratio")
                          .Help("Exposed (non-overlapped) communication time / step time, last step.").Register(r)),
        bus_bw(prometheus::BuildGauge().Name("dgca_comm_bus_bandwidth_bytes_per_second")
                   .Help("All-reduce bus bandwidth measured on the last step, bytes per second.").Register(r)),
        gpu_util(prometheus::BuildGauge().Name("dgca_gpu_utilization_ratio")
                     .Help("GPU utilization (0..1) reported by NVML.").Register(r)),
        gpu_mem(prometheus::BuildGauge().Name("dgca_gpu_memory_used_bytes")
                    .Help("GPU memory in use, bytes.").Register(r)),
        host_mem(prometheus::BuildGauge().Name("dgca_rank_memory_peak_bytes")
                     .Help("The rank process's peak resident set (host memory), bytes.").Register(r)),
        gpu_power(prometheus::BuildGauge().Name("dgca_gpu_power_watts")
                      .Help("GPU power draw, watts.").Register(r)),
        eval_f1(prometheus::BuildGauge().Name("dgca_eval_f1")
                    .Help("Evaluation F1 by level (sentence|char) and kind (detection|correction).").Register(r)),
        eval_metric(prometheus::BuildGauge().Name("dgca_eval_metric")
                        .Help("Every evaluation metric by name, last evaluation.").Register(r)),
        hb_age(prometheus::BuildGauge().Name("dgca_worker_heartbeat_age_seconds")
                   .Help("Seconds since the node agent's last heartbeat.").Register(r)),
        connected(prometheus::BuildGauge().Name("dgca_worker_connected")
                      .Help("1 while the node agent's stream is connected.").Register(r)),
        restarts(prometheus::BuildCounter().Name("dgca_rank_restarts_total")
                     .Help("Job restarts after a rank failure or stall.").Register(r)),
        final_loss(prometheus::BuildGauge().Name("dgca_job_final_loss")
                       .Help("An ended job's final loss: the mean over its last 10 steps (fewer "
                             "when it trained fewer) of the global batch's loss.").Register(r)),
        peak_mem(prometheus::BuildGauge().Name("dgca_job_peak_memory_bytes")
                     .Help("The most memory any rank of an ended job held (GPU memory on CUDA "
                           "ranks, peak resident set on CPU ranks), bytes.").Register(r)) {}
  Family<Gauge>& jobs;
  Family<Gauge>& job_state;
  Family<Gauge>& job_progress;
  Family<Gauge>& job_eta;
  Family<Gauge>& job_sps;
  Family<Gauge>& step;
  Family<Gauge>& target_steps;
  Family<Gauge>& loss;
  Family<Gauge>& sps;
  Family<Histogram>& step_seconds;
  Family<Gauge>& lr;
  Family<Gauge>& grad_norm;
  Family<Counter>& samples;
  Family<Counter>& data_wait;
  Family<Counter>& allreduce;
  Family<Counter>& exposed;
  Family<Gauge>& exposed_ratio;
  Family<Gauge>& bus_bw;
  Family<Gauge>& gpu_util;
  Family<Gauge>& gpu_mem;
  Family<Gauge>& host_mem;
  Family<Gauge>& gpu_power;
  Family<Gauge>& eval_f1;
  Family<Gauge>& eval_metric;
  Family<Gauge>& hb_age;
  Family<Gauge>& connected;
  Family<Counter>& restarts;
  Family<Gauge>& final_loss;
  Family<Gauge>& peak_mem;
};

struct MetricsHub::RankSeries {
  prometheus::Labels labels;
  Gauge* step;
  Gauge* sps;
  Histogram* step_seconds;
  Gauge* lr;
  Gauge* grad_norm;
  Counter* samples;
  Counter* data_wait;
  Counter* allreduce;
  Counter* exposed;
  Gauge* exposed_ratio;
  Gauge* bus_bw;
  std::map<std::string, Gauge*> loss;  // by head
  std::set<Gauge*> gpu_util, gpu_mem, gpu_power;
  Gauge* host_mem = nullptr;  // from the first reading
};

struct MetricsHub::JobSeries {
  std::set<Gauge*> state, progress, eta, sps, target, eval_f1, eval_metric, final_loss, peak_mem;
  std::set<Counter*> restarts;
};

namespace {
template <typename T>
void RemoveAll(Family<T>& f, std::set<T*>& s) {
  for (T* m : s) f.Remove(m);
  s.clear();
}
}  // namespace

MetricsHub::MetricsHub()
    : registry_(std::make_shared<prometheus::Registry>()),
      f_(std::make_unique<Families>(*registry_)) {
  for (int s = v1::PENDING; s <= v1::CANCELLED; ++s) {
    f_->jobs.Add({{"state", v1::JobState_Name(static_cast<v1::JobState>(s))}}).Set(0);
  }
}

MetricsHub::~MetricsHub() = default;

absl::StatusOr<std::string> MetricsHub::StartExposer(const std::string& listen) {
  absl::MutexLock lock(&mu_);
  if (exposer_) return absl::FailedPreconditionError("metrics exposer already started");
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", listen, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  std::vector<int> ports = exposer_->GetListeningPorts();
  std::string host = listen.substr(0, listen.rfind(':'));
  if (ports.empty()) return absl::UnavailableError("metrics exposer bound no port");
  return absl::StrCat(host, ":", ports[0]);
}

std::string MetricsHub::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

void MetricsHub::SetJobCounts(const std::map<v1::JobState, int>& counts) {
  for (int s = v1::PENDING; s <= v1::CANCELLED; ++s) {
    auto it = counts.find(static_cast<v1::JobState>(s));
    f_->jobs.Add({{"state", v1::JobState_Name(static_cast<v1::JobState>(s))}})
        .Set(it == counts.end() ? 0 : it->second);
  }
}

MetricsHub::RankSeries* MetricsHub::Rank(const std::string& job, int rank,
                                         const std::string& node) {
  auto& slot = ranks_[{job, rank}];
  if (slot && slot->labels.at("node") == node) return slot.get();
  // The rank runs on another node now (a restart placed it elsewhere): its
  // old series would stay frozen and read as a stalled step or a rank with
  // no compute to the alerts.
  if (slot) RemoveRankSeries(slot.get());
  auto r = std::make_unique<RankSeries>();
  r->labels = {{"job", job}, {"rank", std::to_string(rank)}, {"node", node}};
  r->step = &f_->step.Add(r->labels);
  r->sps = &f_->sps.Add(r->labels);
  r->step_seconds = &f_->step_seconds.Add(
      r->labels, Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                             10, 30, 60});
  r->lr = &f_->lr.Add(r->labels);
  r->grad_norm = &f_->grad_norm.Add(r->labels);
  r->samples = &f_->samples.Add(r->labels);
  r->data_wait = &f_->data_wait.Add(r->labels);
  r->allreduce = &f_->allreduce.Add(r->labels);
  r->exposed = &f_->exposed.Add(r->labels);
  r->exposed_ratio = &f_->exposed_ratio.Add(r->labels);
  r->bus_bw = &f_->bus_bw.Add(r->labels);
  slot = std::move(r);
  return slot.get();
}

void MetricsHub::IngestStep(const v1::StepMetrics& m, const std::string& node, int gpu) {
  absl::MutexLock lock(&mu_);
  RankSeries* r = Rank(m.job_id(), m.rank(), node);
  r->step->Set(static_cast<double>(m.step()));
  r->sps->Set(m.samples_per_second());
  if (m.step_seconds() > 0) r->step_seconds->Observe(m.step_seconds());
  r->lr->Set(m.learning_rate());
  r->grad_norm->Set(m.grad_norm());
  if (m.samples() > 0) r->samples->Increment(static_cast<double>(m.samples()));
  if (m.data_wait_seconds() > 0) r->data_wait->Increment(m.data_wait_seconds());
  if (m.allreduce_seconds() > 0) r->allreduce->Increment(m.allreduce_seconds());
  if (m.exposed_comm_seconds() > 0) r->exposed->Increment(m.exposed_comm_seconds());
  r->exposed_ratio->Set(m.step_seconds() > 0 ? m.exposed_comm_seconds() / m.step_seconds() : 0);
  if (m.bus_bandwidth_bytes_per_second() > 0) r->bus_bw->Set(m.bus_bandwidth_bytes_per_second());
  auto loss = [&](const std::string& head, double v) {
    Gauge*& g = r->loss[head];
    if (g == nullptr) {
      prometheus::Labels l = r->labels;
      l["head"] = head;
      g = &f_->loss.Add(l);
    }
    g->Set(v);
  };
  loss("total", m.loss());
  for (const auto& [head, v] : m.loss_by_head()) {
    if (head.size() <= 64) loss(head, v);
  }
  // Absent (-1, or 0 from a rank that predates the field): no series.
  if (m.host_memory_peak_bytes() > 0) {
    if (r->host_mem == nullptr) r->host_mem = &f_->host_mem.Add(r->labels);
    r->host_mem->Set(m.host_memory_peak_bytes());
  }
  if (gpu >= 0 || m.gpu_utilization_ratio() >= 0 || m.gpu_memory_used_bytes() >= 0 ||
      m.gpu_power_watts() >= 0) {
    prometheus::Labels l = r->labels;
    l["gpu"] = std::to_string(gpu);
    // Proto3 default 0 would look like a reading; ranks send -1 when absent,
    // and CPU ranks (gpu < 0) never get GPU series.
    auto set = [&](Family<Gauge>& f, std::set<Gauge*>& track, double v) {
      Gauge* g = &f.Add(l);
      track.insert(g);
      g->Set(v);
    };
    if (gpu >= 0 && m.gpu_utilization_ratio() >= 0) set(f_->gpu_util, r->gpu_util, m.gpu_utilization_ratio());
    if (gpu >= 0 && m.gpu_memory_used_bytes() >= 0) set(f_->gpu_mem, r->gpu_mem, m.gpu_memory_used_bytes());
    if (gpu >= 0 && m.gpu_power_watts() >= 0) set(f_->gpu_power, r->gpu_power, m.gpu_power_watts());
  }
}

void MetricsHub::IngestEval(const v1::EvalMetrics& m) {
  absl::MutexLock lock(&mu_);
  auto& js = job_series_[m.job_id()];
  if (!js) js = std::make_unique<JobSeries>();
  int n = 0;
  for (const auto& [name, v] : m.metrics()) {
    if (name.size() > 128 || ++n > 64) continue;
    Gauge* g = &f_->eval_metric.Add({{"job", m.job_id()}, {"name", name}});
    js->eval_metric.insert(g);
    g->Set(v);
    // "<level>_<kind>_f1", e.g. sentence_correction_f1, char_detection_f1.
    std::vector<std::string> parts = absl::StrSplit(name, '_');
    if (parts.size() == 3 && parts[2] == "f1") {
      Gauge* f1 = &f_->eval_f1.Add({{"job", m.job_id()}, {"level", parts[0]}, {"kind", parts[1]}});
      js->eval_f1.insert(f1);
      f1->Set(v);
    }
  }
}

void MetricsHub::SetJobState(const std::string& job, v1::JobState state) {
  absl::MutexLock lock(&mu_);
  auto& js = job_series_[job];
  if (!js) js = std::make_unique<JobSeries>();
  RemoveAll(f_->job_state, js->state);  // the series of the state it leaves
  Gauge* g = &f_->job_state.Add({{"job", job}, {"state", v1::JobState_Name(state)}});
  js->state.insert(g);
  g->Set(1);
}

void MetricsHub::SetJobProgress(const std::string& job, double ratio, double eta_seconds,
                                double samples_per_second, int64_t target_steps) {
  absl::MutexLock lock(&mu_);
  auto& js = job_series_[job];
  if (!js) js = std::make_unique<JobSeries>();
  auto set = [&](Family<Gauge>& f, std::set<Gauge*>& track, double v) {
    Gauge* g = &f.Add({{"job", job}});
    track.insert(g);
    g->Set(v);
  };
  set(f_->job_progress, js->progress, ratio);
  set(f_->job_eta, js->eta, eta_seconds);
  set(f_->job_sps, js->sps, samples_per_second);
  set(f_->target_steps, js->target, static_cast<double>(target_steps));
  // The restart counter exists from the job's first progress on, at 0: a
  // counter that appears only on the first restart cannot be graphed or
  // rate()d before it (and the dashboard's "Rank restarts" panel would be
  // empty for every healthy job).
  js->restarts.insert(&f_->restarts.Add({{"job", job}}));
}

void MetricsHub::RemoveRankSeries(RankSeries* r) {
  f_->step.Remove(r->step);
  f_->sps.Remove(r->sps);
  f_->step_seconds.Remove(r->step_seconds);
  f_->lr.Remove(r->lr);
  f_->grad_norm.Remove(r->grad_norm);
  f_->samples.Remove(r->samples);
  f_->data_wait.Remove(r->data_wait);
  f_->allreduce.Remove(r->allreduce);
  f_->exposed.Remove(r->exposed);
  f_->exposed_ratio.Remove(r->exposed_ratio);
  f_->bus_bw.Remove(r->bus_bw);
  for (auto& [head, g] : r->loss) f_->loss.Remove(g);
  RemoveAll(f_->gpu_util, r->gpu_util);
  RemoveAll(f_->gpu_mem, r->gpu_mem);
  RemoveAll(f_->gpu_power, r->gpu_power);
  if (r->host_mem != nullptr) f_->host_mem.Remove(r->host_mem);
}

void MetricsHub::RemoveRanksOf(const std::string& job) {
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    if (it->first.first != job) {
      ++it;
      continue;
    }
    RemoveRankSeries(it->second.get());
    it = ranks_.erase(it);
  }
}

void MetricsHub::EndJob(const std::string& job, std::optional<double> final_loss,
                        double peak_memory_bytes) {
  absl::MutexLock lock(&mu_);
  // A finished job's last samples/s, step time or ETA would read as live
  // (a dashboard summing throughput, an alert on a rank's step): they go.
  RemoveRanksOf(job);
  auto& js = job_series_[job];
  if (!js) js = std::make_unique<JobSeries>();
  RemoveAll(f_->job_sps, js->sps);
  RemoveAll(f_->job_eta, js->eta);
  if (final_loss.has_value()) {
    Gauge* g = &f_->final_loss.Add({{"job", job}});
    js->final_loss.insert(g);
    g->Set(*final_loss);
  }
  if (peak_memory_bytes > 0) {
    Gauge* g = &f_->peak_mem.Add({{"job", job}});
    js->peak_mem.insert(g);
    g->Set(peak_memory_bytes);
  }
}

void MetricsHub::RemoveJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  RemoveRanksOf(job);
  auto js = job_series_.find(job);
  if (js == job_series_.end()) return;
  RemoveAll(f_->job_state, js->second->state);
  RemoveAll(f_->job_progress, js->second->progress);
  RemoveAll(f_->job_eta, js->second->eta);
  RemoveAll(f_->job_sps, js->second->sps);
  RemoveAll(f_->target_steps, js->second->target);
  RemoveAll(f_->eval_f1, js->second->eval_f1);
  RemoveAll(f_->eval_metric, js->second->eval_metric);
  RemoveAll(f_->restarts, js->second->restarts);
  RemoveAll(f_->final_loss, js->second->final_loss);
  RemoveAll(f_->peak_mem, js->second->peak_mem);
  job_series_.erase(js);
}

void MetricsHub::SetHeartbeatAge(const std::string& node, double age_seconds, bool connected) {
  f_->hb_age.Add({{"node", node}}).Set(age_seconds);
  f_->connected.Add({{"node", node}}).Set(connected ? 1 : 0);
}

void MetricsHub::RemoveNode(const std::string& node) {
  // Family::Add returns the existing series for these labels (creating one
  // only to remove it when the node never had any).
  f_->hb_age.Remove(&f_->hb_age.Add({{"node", node}}));
  f_->connected.Remove(&f_->connected.Add({{"node", node}}));
}

void MetricsHub::IncRankRestarts(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto& js = job_series_[job];
  if (!js) js = std::make_unique<JobSeries>();
  Counter* c = &f_->restarts.Add({{"job", job}});
  js->restarts.insert(c);
  c->Increment();
}

}  // namespace dgca
