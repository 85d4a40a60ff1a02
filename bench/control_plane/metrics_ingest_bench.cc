// dgca-bench-metrics-ingest: coordinator CPU time per 1,000 metric samples
// ingested through RankService.StreamMetrics (the API ranks use).
//
// Drives a REAL coordinator with the rank token of the job's rank 0 (the
// file its agent wrote, STATE_DIR/jobs/JOB/rank-0.0.token): streams N StepMetrics
// samples for a RUNNING job (rank 0), the way a rank does, and reads the
// coordinator's utime+stime from /proc/PID/stat before and after. The job's
// own ranks also stream while this runs, so the coordinator's background CPU
// rate is measured first over an idle window of the same length and
// subtracted. bench/control_plane/run.sh sets everything up.
//
// Usage: dgca-bench-metrics-ingest --coordinator HOST:PORT --token-file F
//          --job JOB --pid COORD_PID [--samples 20000] [--rank 0]
// Prints one JSON line.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "dgca/v1/rank.grpc.pb.h"
#include "proto/rpc/rpc_util.h"

namespace {

// utime + stime of `pid` in seconds, or -1.
double CpuSeconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  // Fields after ")": state(3) ... utime is field 14, stime 15 (1-based).
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    in >> field;
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr, token_file, job;
  int pid = 0, rank = 0;
  long long samples = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--coordinator") addr = v;
    else if (k == "--token-file") token_file = v;
    else if (k == "--job") job = v;
    else if (k == "--pid") pid = std::atoi(v.c_str());
    else if (k == "--samples") samples = std::atoll(v.c_str());
    else if (k == "--rank") rank = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (addr.empty() || token_file.empty() || job.empty() || pid <= 0) {
    std::fprintf(stderr, "need --coordinator --token-file --job --pid\n");
    return 2;
  }
  auto token = dgca::ReadTokenFile(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "%s\n", token.status().ToString().c_str());
    return 3;
  }
  auto stub = dgca::v1::RankService::NewStub(dgca::MakeChannel(addr));

  // Stream first (this also warms up the channel); measure the idle rate after.
  grpc::ClientContext ctx;
  dgca::AddAuth(&ctx, *token);
  dgca::v1::StreamMetricsResponse resp;
  const double c0 = CpuSeconds(pid), t0 = Now();
  {
    auto writer = stub->StreamMetrics(&ctx, &resp);
    dgca::v1::MetricSample m;
    dgca::v1::StepMetrics* s = m.mutable_step();
    s->set_job_id(job);
    s->set_rank(rank);
    s->set_total_steps(1000000);
    s->set_samples(8);
    for (long long i = 0; i < samples; ++i) {
      s->set_step(1 + i);
      s->set_loss(7.0 + 1e-4 * static_cast<double>(i % 100));
      (*s->mutable_loss_by_head())["fusion"] = 0.7;
      (*s->mutable_loss_by_head())["mft"] = 6.0;
      s->set_learning_rate(1e-3);
      s->set_grad_norm(1.0);
      s->set_samples_per_second(100);
      s->set_step_seconds(0.08);
      s->set_time_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    grpc::Status st = writer->Finish();
    if (!st.ok()) {
      std::fprintf(stderr, "StreamMetrics: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  const double c1 = CpuSeconds(pid), t1 = Now();
  const double busy_s = t1 - t0;
  // Idle window of the same length: the coordinator's background rate (the
  // job's real ranks, heartbeats, its own loops).
  std::this_thread::sleep_for(std::chrono::duration<double>(busy_s));
  const double c2 = CpuSeconds(pid), t2 = Now();
  const double idle_rate = (c2 - c1) / (t2 - t1);
  const double net = (c1 - c0) - idle_rate * busy_s;
  const long long got = resp.received();
  std::printf(
      "{\"samples_sent\": %lld, \"samples_received\": %lld, \"stream_seconds\": %.3f, "
      "\"coordinator_cpu_seconds\": %.3f, \"background_cpu_rate\": %.4f, "
      "\"net_cpu_seconds\": %.3f, \"cpu_ms_per_1000_samples\": %.3f, "
      "\"samples_per_second\": %.0f}\n",
      samples, got, busy_s, c1 - c0, idle_rate, net,
      got > 0 ? 1000.0 * net / static_cast<double>(got) * 1000.0 : 0.0,
      busy_s > 0 ? samples / busy_s : 0.0);
  return 0;
}
