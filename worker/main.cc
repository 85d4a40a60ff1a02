// dgca-worker: the node agent, the rank runtime and the one-process trainer.
//   dgca-worker agent --coordinator HOST:PORT --token-file F [--node-name N] [--state-dir D]
//                     [--tls-ca F]
//   dgca-worker rank --coordinator HOST:PORT --token-file F --job J --rank R --attempt A
//   dgca-worker train SPEC [--json]
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/core/exit_codes.h"
#include "model/cpu/gemm_rate.h"
#include "proto/rpc/rpc_util.h"
#include "worker/agent/agent.h"
#include "worker/agent/rank_process.h"
#include "worker/rank/local_train.h"
#include "worker/rank/rank_main.h"

namespace {

// --coordinator: HOST:PORT with a port in 1..65535 (or a unix: target), as
// `dgca --coordinator` checks it (dgca::CheckHostPort): 99999 used to wrap.
CLI::Validator CoordinatorAddress() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const absl::Status st = dgca::CheckHostPort(s, 1, /*allow_empty_host=*/false, /*allow_unix=*/true);
        return st.ok() ? "" : std::string(st.message());
      },
      "HOST:PORT");
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = getenv(name);
  return v && *v ? v : fallback;
}

int RunAgent(dgca::AgentOptions opt, const std::string& token_file) {
  // An unreadable CA is bad usage, said before connecting: the connect loop
  // would otherwise retry a TLS handshake that cannot succeed, for ever.
  if (!opt.tls_ca_file.empty()) {
    if (auto ca = dgca::ReadTlsCaFile(opt.tls_ca_file); !ca.ok()) {
      std::fprintf(stderr, "error: %s (--tls-ca / DGCA_TLS_CA)\n",
                   std::string(ca.status().message()).c_str());
      return dgca::kExitUsage;
    }
  }
  auto token = dgca::ReadTokenFile(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "error: %s\n", token.status().ToString().c_str());
    return dgca::kExitUnreachable;
  }
  opt.token = *token;
  // Block the stop signals in every thread; this one waits for them. A
  // bound agent also takes SIGUSR1 (Slurm's warning before the time limit,
  // docs/slurm.md) and asks for a checkpoint; released, it stops as on
  // SIGTERM.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (!opt.bound_job.empty()) {
    opt.on_release = [](const std::string&) { kill(getpid(), SIGTERM); };
  }
  dgca::Agent agent(opt);
  if (auto s = agent.Start(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return dgca::kExitUsage;
  }
  int sig = 0;
  while (true) {
    sigwait(&set, &sig);
    if (sig != SIGUSR1) break;
    spdlog::info("agent: signal {} (a time limit near); asking for a checkpoint", sig);
    agent.RequestCheckpoint(sig);
  }
  spdlog::info("agent: signal {}; stopping ranks", sig);
  agent.Stop();
  return dgca::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dgca-worker: node agent, rank runtime and one-process trainer"};
  app.require_subcommand(1);

  dgca::AgentOptions agent_opt;
  // The agent's own credential (the coordinator's STATE_DIR/agent-token);
  // DGCA_TOKEN_FILE names the user's, which agents are refused with.
  std::string agent_token_file = EnvOr("DGCA_AGENT_TOKEN_FILE", ".dgca/agent-token");
  agent_opt.coordinator_address = EnvOr("DGCA_COORDINATOR", "127.0.0.1:7600");
  agent_opt.state_dir = ".dgca";
  auto* agent = app.add_subcommand("agent", "run the node agent (one per node)");
  agent->add_option("--coordinator", agent_opt.coordinator_address, "coordinator HOST:PORT")
      ->capture_default_str()
      ->check(CoordinatorAddress());
  agent->add_option("--token-file", agent_token_file,
                    "a copy of the coordinator's STATE_DIR/agent-token (env DGCA_AGENT_TOKEN_FILE)")
      ->capture_default_str();
  agent->add_option("--node-name", agent_opt.node_name, "name to register as (default: hostname)");
  agent->add_option("--state-dir", agent_opt.state_dir, "where rank logs go")->capture_default_str();
  agent->add_option("--worker-binary", agent_opt.worker_binary,
                    "dgca-worker to launch ranks with (default: this program)");
  agent->add_option("--topology-root", agent_opt.topology_root, "root of the topology probe")
      ->capture_default_str();
  agent->add_option("--heartbeat-interval", agent_opt.heartbeat_interval_s, "seconds")
      ->capture_default_str();
  agent->add_option("--bound-job", agent_opt.bound_job,
                    "serve only this job and exit when it releases the agent (started by a "
                    "cluster scheduler: docs/slurm.md); the allocation is SLURM_JOB_ID");
  agent_opt.allocation_id = EnvOr("SLURM_JOB_ID", "");
  agent_opt.tls_ca_file = EnvOr("DGCA_TLS_CA", "");
  agent->add_option("--tls-ca", agent_opt.tls_ca_file,
                    "PEM root CA: TLS to the coordinator (env DGCA_TLS_CA)");

  dgca::RankArgs rank_args;
  auto* rank = app.add_subcommand("rank", "run one training rank (started by an agent)");
  rank->add_option("--coordinator", rank_args.coordinator, "coordinator HOST:PORT")
      ->required()
      ->check(CoordinatorAddress());
  rank->add_option("--token-file", rank_args.token_file,
                   "file holding the rank token (the agent writes it for each attempt)")
      ->required();
  rank->add_option("--job", rank_args.job_id, "job id")->required();
  rank->add_option("--rank", rank_args.rank, "rank")->required();
  rank->add_option("--attempt", rank_args.attempt, "attempt")->capture_default_str();
  rank->add_option("--tls-ca", rank_args.tls_ca_file, "PEM root CA: TLS to the coordinator");
  rank->add_option("--heartbeat-timeout", rank_args.heartbeat_timeout_s,
                   "give up on an unreachable coordinator after this long (s): waiting for the "
                   "assignment, and while training when the coordinator sends no outage limit "
                   "(dgca-coordinator --rank-outage-limit)")
      ->capture_default_str();

  dgca::LocalTrainArgs train_args;
  auto* train = app.add_subcommand("train", "train one job spec in this process, no coordinator");
  train->add_option("SPEC", train_args.spec_path, "job spec (YAML)")->required();
  train->add_flag("--json", train_args.json, "print one JSON document with the results");
  train->add_option("--steps", train_args.steps, "override train.steps");
  train->add_option("--checkpoint-dir", train_args.checkpoint_dir, "write checkpoints here");
  train->add_option("--topology-root", train_args.topology_root, "root of the topology probe");

  int gemm_threads = 0;
  double gemm_seconds = 0.15;
  auto* gemm = app.add_subcommand(
      "gemm-rate", "time the CPU GEMM the trainer uses (model/cpu/gemm_rate.h): one line per "
                   "thread count, 'threads=N flops=F'");
  gemm->add_option("--threads", gemm_threads, "the larger thread count (default: every CPU)");
  gemm->add_option("--seconds", gemm_seconds, "time per thread count (the best repetition counts)")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (*agent) {
    if (agent_opt.node_name.empty()) agent_opt.node_name = "";
    if (agent_opt.worker_binary.empty()) {
      char buf[4096];
      ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
      if (n > 0) agent_opt.worker_binary.assign(buf, n);
    }
    return RunAgent(agent_opt, agent_token_file);
  }
  if (*rank) {
    dgca::InstallRankSignalHandlers();
    int rc = dgca::RunRank(rank_args);
    // The exit record (worker/agent/rank_process.h): what an agent that
    // adopted this rank, and so gets no wait status, reports.
    if (const char* f = getenv("DGCA_EXIT_FILE"); f && *f) {
      if (auto s = dgca::WriteExitRecord(f, rank_args.attempt, rc); !s.ok()) {
        std::fprintf(stderr, "warning: %s\n", std::string(s.message()).c_str());
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
    // A stopped or failed rank may leave a communicator with a live thread
    // behind (see RunRank); skip static destructors rather than race it.
    if (rc != 0) std::_Exit(rc);
    return rc;
  }
  if (*train) return dgca::RunLocalTrain(train_args);
  if (*gemm) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int most = gemm_threads > 0 ? gemm_threads : static_cast<int>(std::max(1L, cpus));
    for (int t : {1, most}) {
      std::printf("threads=%d flops=%.6g\n", t, dgca::cpu::MeasureGemmFlops(t, gemm_seconds));
      if (most == 1) break;
    }
    return 0;
  }
  return dgca::kExitUsage;
}
