// dgca-coordinator: the control plane (docs/cli.md).
//   dgca-coordinator --listen HOST:PORT --metrics-listen HOST:PORT
//                    --state-dir DIR [--no-local-agent] [--tls-cert F --tls-key F]
//                    [--on-shutdown stop-jobs|keep-jobs] [--new-store]
// Writes DIR/token (0600) and DIR/coordinator.json (the bound addresses),
// runs the embedded local agent unless --no-local-agent, and shuts down
// cleanly on SIGTERM/SIGINT: ending active jobs, or with --on-shutdown
// keep-jobs leaving them (and their ranks) for the next coordinator started
// on the same state dir (a restart, an upgrade). Exit codes: 0 clean
// shutdown, 1 start failure (a port in use, a state dir that is not a
// directory or is in use, a damaged job store, or a missing or empty one in
// a state dir used before without --new-store), 2 bad usage (a
// --listen/--metrics-listen that is not HOST:PORT with PORT 0..65535).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/core/exit_codes.h"
#include "coordinator/server.h"
#include "proto/rpc/rpc_util.h"
#include "spdlog/spdlog.h"

// A number of seconds (> 0, or >= 0 with zero_ok), finite. CLI11's own
// PositiveNumber printed its range as 0 to DBL_MAX written out in 300 digits.
CLI::Validator Seconds(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
          return "expected a number of seconds " + std::string(zero_ok ? ">= 0" : "> 0") + ", got '" + s + "'";
        return "";
      },
      zero_ok ? "SECONDS>=0" : "SECONDS>0");
}

int main(int argc, char** argv) {
  dgca::CoordinatorServerOptions opt;
  bool no_local_agent = false;
  CLI::App app{"dgca-coordinator: control plane of dgca-orchestrator"};
  app.add_option("--listen", opt.listen, "gRPC address HOST:PORT (port 0 = any)")
      ->capture_default_str();
  app.add_option("--metrics-listen", opt.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (port 0 = any; empty = off)")
      ->capture_default_str();
  app.add_option("--state-dir", opt.state_dir, "state directory (job database, token, logs)")
      ->capture_default_str();
  app.add_flag("--no-local-agent", no_local_agent, "do not run the embedded node agent");
  app.add_option("--tls-cert", opt.tls_cert, "PEM certificate: serve TLS");
  app.add_option("--tls-key", opt.tls_key, "PEM private key for --tls-cert");
  app.add_option("--heartbeat-timeout", opt.heartbeat_timeout_s,
                 "seconds without a heartbeat or step before a rank counts as stalled")
      ->capture_default_str()
      ->check(Seconds(/*zero_ok=*/false));
  app.add_option("--agent-timeout", opt.agent_timeout_s,
                 "seconds without an agent heartbeat (its stream still open) before its node "
                 "counts as silent: frozen or hung, given no ranks until heard again")
      ->capture_default_str()
      ->check(Seconds(/*zero_ok=*/false));
  app.add_option("--rank-outage-limit", opt.rank_outage_limit_s,
                 "seconds ranks train on while this coordinator is unreachable (a restart, an "
                 "upgrade, a network break) before they stop with exit code 3; a job whose "
                 "ranks stopped so resumes from its checkpoint, not counted as a failure")
      ->capture_default_str()
      ->check(Seconds(/*zero_ok=*/false));
  app.add_option("--restart-node-wait", opt.restart_node_wait_s,
                 "seconds a restart waits for a node of its plan to reconnect before the job "
                 "fails \"cannot restart\" (0 = fail at once)")
      ->capture_default_str()
      ->check(Seconds(/*zero_ok=*/true));
  app.add_option("--link-prior-busbw", opt.link_prior_busbw,
                 "all-reduce bus bandwidth (bytes/s) the planner assumes where nothing was "
                 "measured, instead of the topology's prior (what-if planning; tests)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--worker-binary", opt.worker_binary,
                 "dgca-worker used by the embedded agent (default: next to this program)");
  app.add_option("--node-name", opt.node_name, "node name of the embedded agent (default: hostname)");
  app.add_option("--advertise", opt.advertise,
                 "HOST:PORT that agents started by Slurm call back on (resources.launcher: slurm; "
                 "default: the --listen address, its host this machine's name when it listens "
                 "on every address)");
  app.add_option("--slurm-bin-dir", opt.slurm_bin_dir,
                 "directory of sbatch, squeue, scancel and sinfo (default: PATH)");
  app.add_option("--slurm-tls-ca", opt.slurm_tls_ca,
                 "PEM CA that agents started by Slurm trust when --tls-cert is set");
  app.add_flag("--new-store", opt.new_store,
               "start with an empty job store although this state dir was used before (after "
               "moving a damaged dgca.db aside); without it a missing or empty dgca.db there is "
               "refused");
  std::string on_shutdown = "stop-jobs";
  app.add_option("--on-shutdown", on_shutdown,
                 "on SIGTERM/SIGINT: stop-jobs (stop their ranks, mark them FAILED) or keep-jobs "
                 "(ranks train on; a coordinator restarted on this state dir re-adopts them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"stop-jobs", "keep-jobs"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!opt.advertise.empty()) {
    if (absl::Status st = dgca::CheckHostPort(opt.advertise, 1, /*allow_empty_host=*/false);
        !st.ok()) {
      std::fprintf(stderr, "dgca-coordinator: --advertise %s\n", std::string(st.message()).c_str());
      return dgca::kExitUsage;
    }
  }
  // Bad addresses are usage errors (exit 2), before anything starts: a port
  // out of 1..65535 would otherwise wrap silently to another port.
  if (absl::Status st = dgca::CheckHostPort(opt.listen, 0, /*allow_empty_host=*/true); !st.ok()) {
    std::fprintf(stderr, "dgca-coordinator: --listen %s\n", std::string(st.message()).c_str());
    return dgca::kExitUsage;
  }
  if (!opt.metrics_listen.empty()) {
    if (absl::Status st = dgca::CheckHostPort(opt.metrics_listen, 0, /*allow_empty_host=*/true);
        !st.ok()) {
      std::fprintf(stderr, "dgca-coordinator: --metrics-listen %s (or \"\" for no /metrics)\n",
                   std::string(st.message()).c_str());
      return dgca::kExitUsage;
    }
  }
  opt.local_agent = !no_local_agent;
  opt.keep_jobs_on_shutdown = on_shutdown == "keep-jobs";

  // Block the shutdown signals in every thread; the main thread waits for them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = dgca::CoordinatorServer::Start(opt);
  if (!server.ok()) {
    std::fprintf(stderr, "dgca-coordinator: %s\n", std::string(server.status().message()).c_str());
    return dgca::kExitFailed;
  }
  std::printf("dgca-coordinator listening on %s", (*server)->address().c_str());
  if (!(*server)->metrics_address().empty()) {
    std::printf(", metrics on http://%s/metrics", (*server)->metrics_address().c_str());
  }
  std::printf(" (state %s, token %s/token)\n", (*server)->state_dir().c_str(),
              (*server)->state_dir().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("dgca-coordinator: signal {}, shutting down ({})", sig,
               opt.keep_jobs_on_shutdown ? "keeping active jobs: --on-shutdown keep-jobs"
                                         : "ending active jobs: --on-shutdown stop-jobs");
  (*server)->Shutdown();
  server->reset();
  return dgca::kExitOk;
}
