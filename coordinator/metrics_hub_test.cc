#include "coordinator/metrics_hub.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace dgca {
namespace {

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

v1::StepMetrics Step(int rank, int64_t step) {
  v1::StepMetrics m;
  m.set_job_id("j-1");
  m.set_rank(rank);
  m.set_step(step);
  m.set_total_steps(100);
  m.set_loss(2.5);
  (*m.mutable_loss_by_head())["detector"] = 0.25;
  m.set_learning_rate(1e-4);
  m.set_grad_norm(1.5);
  m.set_samples_per_second(64);
  m.set_step_seconds(0.5);
  m.set_data_wait_seconds(0.1);
  m.set_allreduce_seconds(0.2);
  m.set_exposed_comm_seconds(0.05);
  m.set_bus_bandwidth_bytes_per_second(1e9);
  m.set_gpu_utilization_ratio(-1);
  m.set_gpu_memory_used_bytes(-1);
  m.set_gpu_power_watts(-1);
  m.set_samples(32);
  return m;
}

TEST(MetricsHub, IngestsStepsAndEvals) {
  MetricsHub hub;
  hub.IngestStep(Step(0, 1), "n1", -1);
  hub.IngestStep(Step(0, 2), "n1", -1);
  hub.IngestStep(Step(1, 2), "n1", -1);
  v1::EvalMetrics e;
  e.set_job_id("j-1");
  (*e.mutable_metrics())["sentence_correction_f1"] = 0.75;
  (*e.mutable_metrics())["char_detection_f1"] = 0.5;
  hub.IngestEval(e);
  hub.SetJobCounts({{v1::RUNNING, 1}, {v1::SUCCEEDED, 3}});
  hub.SetHeartbeatAge("n1", 1.5, true);
  hub.IncRankRestarts("j-1");
  hub.SetJobProgress("j-1", 0.02, 100, 128, 100);
  std::string t = hub.Serialize();
  EXPECT_TRUE(Has(t, "# HELP dgca_train_loss ")) << t;
  EXPECT_TRUE(Has(t, "dgca_jobs{state=\"SUCCEEDED\"} 3"));
  EXPECT_TRUE(Has(t, "dgca_jobs{state=\"FAILED\"} 0"));
  EXPECT_TRUE(Has(t, "dgca_train_step{job=\"j-1\",node=\"n1\",rank=\"0\"} 2"));
  EXPECT_TRUE(Has(t, "dgca_train_loss{head=\"detector\",job=\"j-1\",node=\"n1\",rank=\"1\"} 0.25"));
  EXPECT_TRUE(Has(t, "dgca_train_loss{head=\"total\",job=\"j-1\",node=\"n1\",rank=\"0\"} 2.5"));
  EXPECT_TRUE(Has(t, "dgca_train_step_seconds_count{job=\"j-1\",node=\"n1\",rank=\"0\"} 2"));
  EXPECT_TRUE(Has(t, "dgca_train_samples_total{job=\"j-1\",node=\"n1\",rank=\"0\"} 64"));
  EXPECT_TRUE(Has(t, "dgca_comm_exposed_ratio{job=\"j-1\",node=\"n1\",rank=\"0\"} 0.1"));
  EXPECT_TRUE(Has(t, "dgca_eval_f1{job=\"j-1\",kind=\"correction\",level=\"sentence\"} 0.75"));
  EXPECT_TRUE(Has(t, "dgca_worker_heartbeat_age_seconds{node=\"n1\"} 1.5"));
  EXPECT_TRUE(Has(t, "dgca_rank_restarts_total{job=\"j-1\"} 1"));
  EXPECT_TRUE(Has(t, "# TYPE dgca_data_wait_seconds_total counter"));
  // CPU ranks report -1: no GPU series; no memory reading, no memory series.
  EXPECT_FALSE(Has(t, "dgca_gpu_utilization_ratio{"));
  EXPECT_FALSE(Has(t, "dgca_rank_memory_peak_bytes{")) << t;
  v1::StepMetrics withmem = Step(1, 3);
  withmem.set_host_memory_peak_bytes(2.5e8);
  hub.IngestStep(withmem, "n1", -1);
  EXPECT_TRUE(Has(hub.Serialize(),
                  "dgca_rank_memory_peak_bytes{job=\"j-1\",node=\"n1\",rank=\"1\"} 250000000"))
      << hub.Serialize();
  v1::StepMetrics g = Step(2, 1);
  g.set_gpu_utilization_ratio(0.9);
  g.set_gpu_memory_used_bytes(1e9);
  g.set_gpu_power_watts(300);
  hub.IngestStep(g, "n2", 3);
  t = hub.Serialize();
  EXPECT_TRUE(Has(t, "dgca_gpu_utilization_ratio{gpu=\"3\",job=\"j-1\",node=\"n2\",rank=\"2\"} 0.9")) << t;
  EXPECT_TRUE(Has(t, "dgca_gpu_power_watts{gpu=\"3\""));
  hub.RemoveJob("j-1");
  t = hub.Serialize();
  EXPECT_FALSE(Has(t, "job=\"j-1\"")) << t;
  EXPECT_TRUE(Has(t, "dgca_jobs{state=\"SUCCEEDED\"} 3"));
  hub.IngestStep(Step(0, 7), "n1", -1);  // series come back after removal
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_train_step{job=\"j-1\",node=\"n1\",rank=\"0\"} 7"));
}

// dgca_job_state: one series per job, labelled with its current state.
// A rank restarted on another node: its series move with it, and the old
// node's are dropped (frozen, they would read as a stalled step).
TEST(MetricsHub, ARankOnAnotherNodeLeavesNoSeriesBehind) {
  MetricsHub hub;
  v1::StepMetrics m = Step(1, 5);
  m.set_gpu_utilization_ratio(0.5);
  m.set_host_memory_peak_bytes(1e8);
  hub.IngestStep(m, "n1", 0);
  hub.IngestStep(Step(0, 5), "n1", -1);
  EXPECT_TRUE(Has(hub.Serialize(), "node=\"n1\",rank=\"1\""));
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_gpu_utilization_ratio{"));
  hub.IngestStep(Step(1, 6), "n2", -1);
  const std::string t = hub.Serialize();
  EXPECT_FALSE(Has(t, "node=\"n1\",rank=\"1\"")) << t;
  EXPECT_FALSE(Has(t, "dgca_gpu_utilization_ratio{")) << t;
  EXPECT_FALSE(Has(t, "dgca_rank_memory_peak_bytes{")) << t;
  EXPECT_TRUE(Has(t, "dgca_train_step{job=\"j-1\",node=\"n2\",rank=\"1\"} 6")) << t;
  EXPECT_TRUE(Has(t, "dgca_train_step{job=\"j-1\",node=\"n1\",rank=\"0\"} 5")) << t;
}

TEST(MetricsHub, JobStateHasOneSeriesPerJob) {
  MetricsHub hub;
  hub.SetJobState("j-1", v1::PENDING);
  hub.SetJobState("j-2", v1::RUNNING);
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_job_state{job=\"j-1\",state=\"PENDING\"} 1"));
  hub.SetJobState("j-1", v1::RUNNING);
  hub.SetJobState("j-1", v1::FAILED);
  const std::string text = hub.Serialize();
  EXPECT_TRUE(Has(text, "dgca_job_state{job=\"j-1\",state=\"FAILED\"} 1")) << text;
  EXPECT_FALSE(Has(text, "dgca_job_state{job=\"j-1\",state=\"PENDING\"}")) << text;
  EXPECT_FALSE(Has(text, "dgca_job_state{job=\"j-1\",state=\"RUNNING\"}")) << text;
  EXPECT_TRUE(Has(text, "dgca_job_state{job=\"j-2\",state=\"RUNNING\"} 1")) << text;
  hub.RemoveJob("j-1");
  EXPECT_FALSE(Has(hub.Serialize(), "dgca_job_state{job=\"j-1\""));
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_job_state{job=\"j-2\""));
}

// A job's restart counter is exported at 0 before any restart, so the
// dashboard's restarts panel and rate() work for healthy jobs too.
TEST(MetricsHub, RestartCounterStartsAtZero) {
  MetricsHub hub;
  hub.IngestStep(Step(0, 1), "n1", -1);
  EXPECT_FALSE(Has(hub.Serialize(), "dgca_rank_restarts_total{"));
  hub.SetJobProgress("j-1", 0.01, 10, 64, 100);
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_rank_restarts_total{job=\"j-1\"} 0"));
  hub.IncRankRestarts("j-1");
  hub.SetJobProgress("j-1", 0.02, 10, 64, 100);  // does not reset it
  EXPECT_TRUE(Has(hub.Serialize(), "dgca_rank_restarts_total{job=\"j-1\"} 1"));
  hub.RemoveJob("j-1");
  EXPECT_FALSE(Has(hub.Serialize(), "dgca_rank_restarts_total{"));
}

// An ended job keeps no live series (its last samples/s would read as
// throughput still running), only what is a fact about it, plus its final
// loss and peak memory; another job's series are untouched.
TEST(MetricsHub, AnEndedJobLosesItsLiveSeriesAndGainsItsFinalLoss) {
  MetricsHub hub;
  v1::StepMetrics m = Step(0, 100);
  m.set_host_memory_peak_bytes(3e8);
  hub.IngestStep(m, "n1", -1);
  hub.IngestStep(Step(1, 100), "n1", -1);
  v1::StepMetrics other = Step(0, 4);
  other.set_job_id("j-2");
  hub.IngestStep(other, "n1", -1);
  hub.SetJobProgress("j-1", 1.0, 0, 128, 100);
  hub.SetJobProgress("j-2", 0.04, 60, 64, 100);
  hub.SetJobState("j-1", v1::SUCCEEDED);
  v1::EvalMetrics e;
  e.set_job_id("j-1");
  (*e.mutable_metrics())["sentence_correction_f1"] = 0.75;
  hub.IngestEval(e);
  std::string t = hub.Serialize();
  ASSERT_TRUE(Has(t, "dgca_job_samples_per_second{job=\"j-1\"} 128")) << t;
  ASSERT_TRUE(Has(t, "dgca_train_samples_per_second{job=\"j-1\",node=\"n1\",rank=\"0\"} 64")) << t;
  EXPECT_FALSE(Has(t, "dgca_job_final_loss{")) << t;

  hub.EndJob("j-1", 2.25, 3e8);
  t = hub.Serialize();
  for (const char* gone :
       {"dgca_job_samples_per_second{job=\"j-1\"}", "dgca_job_eta_seconds{job=\"j-1\"}",
        "dgca_train_samples_per_second{job=\"j-1\"", "dgca_train_step_seconds_count{job=\"j-1\"",
        "dgca_train_loss{head=\"total\",job=\"j-1\"", "dgca_train_step{job=\"j-1\"",
        "dgca_rank_memory_peak_bytes{job=\"j-1\""}) {
    EXPECT_FALSE(Has(t, gone)) << gone << "\n" << t;
  }
  for (const char* kept :
       {"dgca_job_state{job=\"j-1\",state=\"SUCCEEDED\"} 1", "dgca_job_progress_ratio{job=\"j-1\"} 1",
        "dgca_train_target_steps{job=\"j-1\"} 100",
        "dgca_eval_f1{job=\"j-1\",kind=\"correction\",level=\"sentence\"} 0.75",
        "dgca_rank_restarts_total{job=\"j-1\"} 0", "dgca_job_final_loss{job=\"j-1\"} 2.25",
        "dgca_job_peak_memory_bytes{job=\"j-1\"} 300000000",
        // the other job runs on
        "dgca_job_samples_per_second{job=\"j-2\"} 64",
        "dgca_train_samples_per_second{job=\"j-2\",node=\"n1\",rank=\"0\"} 64"}) {
    EXPECT_TRUE(Has(t, kept)) << kept << "\n" << t;
  }
  // A job that ended with no final loss (failed before its last step) and
  // no memory reading gets neither gauge.
  hub.EndJob("j-2", std::nullopt, 0);
  t = hub.Serialize();
  EXPECT_FALSE(Has(t, "dgca_job_final_loss{job=\"j-2\"}")) << t;
  EXPECT_FALSE(Has(t, "dgca_job_peak_memory_bytes{job=\"j-2\"}")) << t;
  EXPECT_FALSE(Has(t, "dgca_train_step{job=\"j-2\"")) << t;
  hub.RemoveJob("j-1");
  EXPECT_FALSE(Has(hub.Serialize(), "job=\"j-1\"")) << hub.Serialize();
}

TEST(MetricsHub, ExposerServesMetrics) {
  MetricsHub hub;
  auto addr = hub.StartExposer("127.0.0.1:0");
  ASSERT_TRUE(addr.ok()) << addr.status();
  int port = std::stoi(addr->substr(addr->rfind(':') + 1));
  ASSERT_GT(port, 0);
  EXPECT_FALSE(hub.StartExposer("127.0.0.1:0").ok());
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, n);
  close(fd);
  EXPECT_TRUE(Has(resp, "200 OK")) << resp.substr(0, 200);
  EXPECT_TRUE(Has(resp, "dgca_jobs{state=\"PENDING\"} 0"));
}

}  // namespace
}  // namespace dgca
