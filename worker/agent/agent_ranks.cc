// The node agent's rank processes (worker/agent/agent_impl.h): launch
// (fork/exec of `dgca-worker rank` with the allowed environment), adoption
// of ranks an earlier agent started, stops, and the reaper that reports
// their exits.
#include "worker/agent/agent_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "model/core/exit_codes.h"
#include "proto/rpc/rpc_util.h"
#include "spec/rank_env.h"
#include "spec/spec_files.h"
#include "worker/agent/rank_process.h"

extern char** environ;

namespace dgca {
namespace {

using Clock = std::chrono::steady_clock;

// A job id becomes a directory name: only [A-Za-z0-9._-], not "." or "..".
bool SafeName(const std::string& s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  for (char c : s) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

// Appends `line` to the rank log at `path`, created if missing (as the
// launch creates rank logs): an adopted rank whose log is gone, or not yet
// opened, still gets the agent's lines.
void AppendToLog(const std::string& path, const std::string& line) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!write(fd, line.data(), line.size());
  close(fd);
}


}  // namespace

bool IsAllowedRankEnv(const std::string& name) {
  static const char* kPrefixes[] = {"NCCL_", "CUDA_", "OMP_", "DGCA_"};
  bool prefix_ok = false;
  for (const char* p : kPrefixes) {
    if (absl::StartsWith(name, p) && name.size() > strlen(p)) prefix_ok = true;
  }
  if (!prefix_ok) return false;
  for (char c : name) {
    if (!(isupper(static_cast<unsigned char>(c)) || isdigit(static_cast<unsigned char>(c)) || c == '_')) {
      return false;
    }
  }
  // Defence in depth: a coordinator that skipped the spec's check (an older
  // one, or anyone holding the token) still cannot have a rank load code or
  // write files here.
  return RankEnvRefusal(name).empty();
}

void Agent::Impl::Launch(const v1::LaunchRank& l) {
  auto fail = [&](const std::string& why) {
    spdlog::error("agent {}: cannot launch job {} rank {}: {}", node_, l.job_id(), l.rank(), why);
    v1::RankExited e;
    e.set_job_id(l.job_id());
    e.set_rank(l.rank());
    e.set_attempt(l.attempt());
    e.set_exit_code(127);
    e.set_message(absl::StrCat("agent ", node_, " could not launch the rank: ", why));
    ReportExit(e);
  };
  if (!SafeName(l.job_id())) return fail("job id must be [A-Za-z0-9._-], 1-128 characters");
  if (!opt_.bound_job.empty() && l.job_id() != opt_.bound_job) {
    return fail(absl::StrCat("this agent is bound to job ", opt_.bound_job,
                             " (started for its allocation); it runs no other job's ranks"));
  }
  if (l.rank() < 0) return fail("rank must be >= 0");
  std::string refusal;  // reported after mu_ is released (ReportExit takes stream_mu_)
  {
    absl::MutexLock g(&mu_);
    // Refused from the start of Stop(): a rank launched while the others
    // drain would be SIGKILLed at its end with no exit reported.
    if (stopping_ || stop_called_) refusal = "agent is stopping";
    auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Child* {
      for (auto& [pid, c] : children_) {
        if (c.job_id == l.job_id() && c.rank == l.rank()) return &c;
      }
      return nullptr;
    };
    Child* old = refusal.empty() ? find() : nullptr;
    if (old != nullptr && old->attempt == l.attempt()) {
      spdlog::warn("agent {}: job {} rank {} attempt {} already running (pid {}); launch ignored",
                   node_, l.job_id(), l.rank(), l.attempt(), old->pid);
      return;
    }
    if (old != nullptr) {
      // A new attempt replaces an old one that is still around: the old one
      // goes now (its exit is reported), then the new one starts.
      spdlog::warn("agent {}: job {} rank {}: attempt {} still running (pid {}); killing it "
                   "before attempt {}", node_, l.job_id(), l.rank(), old->attempt, old->pid,
                   l.attempt());
      old->stopping = true;
      old->kill_at = Clock::now();
      if (!old->adopted || AdoptedAlive(*old)) kill(-old->pid, SIGKILL);
      auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return find() == nullptr; };
      mu_.AwaitWithTimeout(absl::Condition(&gone), absl::Seconds(5));
      if (find() != nullptr) refusal = "the previous attempt of this rank did not exit";
    }
  }
  if (!refusal.empty()) return fail(refusal);
  std::string log_dir = !l.log_dir().empty() ? l.log_dir()
                                             : opt_.state_dir + "/jobs/" + l.job_id();
  // The files the rank will read, checked on this node before it starts
  // (a few stat() and open() calls): a file the coordinator's node has and
  // this one lacks fails the launch naming every such file where the spec
  // gives it, not the rank after its rendezvous with the first NOT_FOUND.
  if (l.inputs_size() > 0) {
    const std::string where = absl::StrCat("on node ", node_, " by its agent");
    const std::vector<v1::SpecProblem> missing =
        CheckInputFiles(std::vector<v1::InputFile>(l.inputs().begin(), l.inputs().end()), where);
    if (!missing.empty()) {
      const std::string why = InputProblemsMessage(missing, where);
      spdlog::error("agent {}: not starting job {} rank {}: {}", node_, l.job_id(), l.rank(), why);
      // Also in the rank's log, where `dgca logs` looks.
      if (MakeDirs(log_dir).ok()) {
        AppendToLog(absl::StrCat(log_dir, "/rank-", l.rank(), ".log"),
                    absl::StrCat("[agent ", node_, "] not starting job ", l.job_id(), " rank ",
                                 l.rank(), " attempt ", l.attempt(), ": ", why, "\n"));
      }
      v1::RankExited e;
      e.set_job_id(l.job_id());
      e.set_rank(l.rank());
      e.set_attempt(l.attempt());
      e.set_exit_code(kExitUsage);  // a bad assignment, to a coordinator that predates the flag
      e.set_inputs_missing(true);
      e.set_message(why);
      ReportExit(e);
      return;
    }
  }
  if (l.rank_token().empty()) {
    return fail("the coordinator sent no rank token (LaunchRank.rank_token), which the rank needs "
                "to reach it; is the coordinator older than this agent?");
  }
  if (auto s = MakeDirs(log_dir); !s.ok()) return fail(std::string(s.message()));
  // The rank's own credential, good for this job and attempt only
  // (coordinator/credentials.h); removed when the rank has exited.
  const std::string token_file = RankTokenPath(log_dir, l.rank(), l.attempt());
  if (auto s = WriteRankToken(token_file, l.rank_token()); !s.ok()) {
    return fail(std::string(s.message()));
  }
  std::string log_path = absl::StrCat(log_dir, "/rank-", l.rank(), ".log");
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    unlink(token_file.c_str());
    return fail(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  }

  // Environment: ours plus the allow-listed entries of the command.
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  // Not the agent's own credentials: where its token is (systemd's
  // LoadCredential directory, the token file variables). A rank has its
  // own token, good for its job and attempt only.
  for (const char* name : {"CREDENTIALS_DIRECTORY", "DGCA_AGENT_TOKEN_FILE", "DGCA_TOKEN_FILE"}) {
    env.erase(name);
  }
  // The GPU this rank uses on the node (-1 = CPU), for the rank runtime.
  env["DGCA_LOCAL_DEVICE"] = absl::StrCat(l.local_device());
  env["DGCA_WORLD_SIZE"] = absl::StrCat(l.world_size());
  env["DGCA_NODE"] = node_;
  const std::string exit_file = ExitRecordPath(log_dir, l.rank());
  unlink(exit_file.c_str());  // a record of an earlier attempt
  std::string refused;
  std::vector<std::string> harmful;  // "NAME (it loads ...)": refused for what they do
  for (const auto& [k, v] : l.env()) {
    if (IsAllowedRankEnv(k)) {
      env[k] = v;
    } else if (const std::string why = RankEnvRefusal(k); !why.empty()) {
      harmful.push_back(absl::StrCat(k, " (it ", why, ")"));
    } else {
      absl::StrAppend(&refused, refused.empty() ? "" : ", ", k);
    }
  }
  // What a later agent adopts the rank by (rank_process.h); set after the
  // command's entries so a LaunchRank cannot forge them.
  env["DGCA_RANK_ID"] = RankId(l.job_id(), l.rank(), l.attempt());
  env["DGCA_EXIT_FILE"] = exit_file;
  std::string header = absl::StrCat("[agent ", node_, "] launching job ", l.job_id(), " rank ",
                                    l.rank(), " attempt ", l.attempt(), "\n");
  if (!refused.empty()) {
    spdlog::warn("agent {}: job {} rank {}: refused environment variables outside the "
                 "allow-list (NCCL_*, CUDA_*, OMP_*, DGCA_*): {}",
                 node_, l.job_id(), l.rank(), refused);
    absl::StrAppend(&header, "[agent ", node_, "] refused environment variables outside the "
                    "allow-list (NCCL_*, CUDA_*, OMP_*, DGCA_*): ", refused, "\n");
  }
  for (const std::string& h : harmful) {
    spdlog::warn("agent {}: job {} rank {}: refused environment variable {}", node_, l.job_id(),
                 l.rank(), h);
    absl::StrAppend(&header, "[agent ", node_, "] refused environment variable ", h,
                    "; set it in this agent's own environment if the node should have it\n");
  }
  (void)!write(log_fd, header.data(), header.size());

  const std::string coordinator =
      l.coordinator().empty() ? opt_.coordinator_address : l.coordinator();
  std::vector<std::string> argv_s;
  if (!opt_.rank_argv_override.empty()) {
    for (const auto& a : opt_.rank_argv_override) {
      argv_s.push_back(absl::StrReplaceAll(
          a, {{"{job}", l.job_id()}, {"{rank}", absl::StrCat(l.rank())},
              {"{attempt}", absl::StrCat(l.attempt())}, {"{coordinator}", coordinator},
              {"{token_file}", token_file}}));
    }
  } else {
    argv_s = {worker_binary_, "rank", "--coordinator", coordinator, "--token-file",
              token_file, "--job", l.job_id(), "--rank", absl::StrCat(l.rank()),
              "--attempt", absl::StrCat(l.attempt())};
    if (!opt_.tls_ca_file.empty()) {
      argv_s.push_back("--tls-ca");
      argv_s.push_back(opt_.tls_ca_file);
    }
  }
  std::vector<std::string> env_s;
  for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
  // Everything the child needs is built before fork: after fork in a threaded
  // process only async-signal-safe calls are allowed.
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* exec_err = "[agent] exec failed\n";

  pid_t pid;
  int fork_errno = 0;
  {
    absl::MutexLock g(&mu_);  // the reaper must not see the pid first
    const pid_t agent_pid = getpid();
    const bool bound = !opt_.bound_job.empty();
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      // A bound agent's ranks belong to its allocation: they end with the
      // agent (SIGTERM), as the rest of a Slurm step does, rather than train
      // on unsupervised once Slurm has taken the allocation back.
      if (bound) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != agent_pid) _exit(127);  // the agent died before prctl
      }
      // Default signal handling and an empty mask in the rank.
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      signal(SIGPIPE, SIG_DFL);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
#ifdef SYS_close_range
      if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
#endif
      {
        for (int fd = 3; fd < 4096; ++fd) close(fd);
      }
      if (argv_s[0].find('/') == std::string::npos) {
        execvpe(argv[0], argv.data(), envp.data());  // PATH search
      } else {
        execve(argv[0], argv.data(), envp.data());
      }
      (void)!write(2, exec_err, strlen(exec_err));
      _exit(127);
    }
    if (pid > 0) {
      setpgid(pid, pid);  // also in the parent, so a stop right now finds the group
      Child c;
      c.job_id = l.job_id();
      c.rank = l.rank();
      c.attempt = l.attempt();
      c.pid = pid;
      c.log_path = log_path;
      children_[pid] = c;
    } else {
      fork_errno = errno;
    }
  }
  close(log_fd);
  if (pid < 0) {
    unlink(token_file.c_str());
    return fail(absl::StrCat("fork: ", strerror(fork_errno)));
  }
  spdlog::info("agent {}: job {} rank {} attempt {} started, pid {}, log {}", node_, l.job_id(),
               l.rank(), l.attempt(), pid, log_path);
}

void Agent::Impl::StopJob(const std::string& job_id, double grace_s,
                          const std::set<int>& attempts) {
  if (grace_s < 0) grace_s = 0;
  absl::MutexLock g(&mu_);
  for (auto& [pid, c] : children_) {
    if (c.job_id != job_id || c.stopping) continue;
    if (!attempts.empty() && !attempts.count(c.attempt)) continue;
    c.stopping = true;
    // An adopted rank's pid is not held by us: signal it only while it is
    // still the process adopted (the reaper reports it otherwise).
    if (c.adopted && !AdoptedAlive(c)) continue;
    c.kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(grace_s));
    kill(-pid, grace_s > 0 ? SIGTERM : SIGKILL);
    spdlog::info("agent {}: stopping job {} rank {} (pid {}, grace {:.1f} s)", node_, job_id,
                 c.rank, pid, grace_s);
  }
}

bool Agent::Impl::AdoptedAlive(const Child& c) {
  std::optional<uint64_t> t = ProcessStartTime(c.pid);
  return t.has_value() && *t == c.start_time;
}

void Agent::Impl::Adopt(const v1::RunningRank& r) {
  Child c;
  c.job_id = r.job_id();
  c.rank = r.rank();
  c.attempt = r.attempt();
  c.pid = r.pid();
  c.adopted = true;
  if (!SafeName(c.job_id) || c.rank < 0) {
    spdlog::warn("agent {}: not adopting job '{}' rank {}: bad job id or rank", node_, c.job_id,
                 c.rank);
    return;
  }
  c.log_path = absl::StrCat(opt_.state_dir, "/jobs/", c.job_id, "/rank-", c.rank, ".log");
  const std::string id = RankIdEntry(c.job_id, c.rank, c.attempt);
  // Never recorded (the coordinator died right after the launch): looked up.
  if (c.pid <= 1) c.pid = FindProcessWithEnviron(id);
  std::optional<uint64_t> start = ProcessStartTime(c.pid);
  const bool ours = c.pid > 1 && start.has_value() && ProcessEnvironHas(c.pid, id);
  if (ours && children_.count(c.pid) == 0) {
    c.start_time = *start;
    children_[c.pid] = c;
    AppendToLog(c.log_path, absl::StrCat("[agent ", node_, "] adopted rank ", c.rank, " (pid ",
                                         c.pid, ", attempt ", c.attempt,
                                         ") after a restart of its agent or the coordinator\n"));
    spdlog::info("agent {}: adopted job {} rank {} attempt {} (pid {})", node_, c.job_id, c.rank,
                 c.attempt, c.pid);
    return;
  }
  // Gone (or its pid now belongs to another process): it ended while no
  // agent watched. Queued; sent once the stream is up.
  v1::RankExited e = ExitReport(c, std::nullopt, leaving_announced_);
  spdlog::info("agent {}: job {} rank {} attempt {} (pid {}) ended before it could be adopted",
               node_, c.job_id, c.rank, c.attempt, c.pid);
  RememberExit(e);
}

v1::RankExited Agent::Impl::ExitReport(const Child& c, std::optional<int> wait_status,
                                       bool leaving) {
  // The rank's credential is of no use to anyone once it has ended.
  unlink(RankTokenPath(c.log_path.substr(0, c.log_path.rfind('/')), c.rank, c.attempt).c_str());
  v1::RankExited e;
  e.set_job_id(c.job_id);
  e.set_rank(c.rank);
  e.set_attempt(c.attempt);
  std::string how;
  if (wait_status.has_value()) {
    const int status = *wait_status;
    if (WIFSIGNALED(status)) {
      e.set_exit_code(-1);
      e.set_signal(WTERMSIG(status));
      how = absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                         ")");
    } else {
      e.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      how = absl::StrCat("exited with code ", e.exit_code());
    }
  } else {
    const std::string dir = c.log_path.substr(0, c.log_path.rfind('/'));
    std::optional<int> code = ReadExitRecord(ExitRecordPath(dir, c.rank), c.attempt);
    if (code.has_value()) {
      e.set_exit_code(*code);
      how = absl::StrCat("exited with code ", *code, " (adopted; from its exit record)");
    } else {
      e.set_exit_code(-1);
      e.set_status_unknown(true);
      how = "ended without an exit record (adopted, so no wait status: killed by a signal or "
            "crashed)";
    }
  }
  e.set_agent_leaving(leaving);
  AppendToLog(c.log_path, absl::StrCat("[agent ", node_, "] rank ", c.rank, " (pid ", c.pid,
                                       ") ", how,
                                       leaving      ? " while its agent was stopping"
                                       : c.stopping ? " after a stop request"
                                                    : "",
                                       "\n"));
  if (e.exit_code() != 0 || e.signal() != 0) e.set_message(LogTail(c.log_path, 20));
  spdlog::info("agent {}: job {} rank {} {}", node_, c.job_id, c.rank, how);
  return e;
}

void Agent::Impl::ReaperLoop() {
  while (true) {
    std::vector<Child> exited;
    std::vector<std::optional<int>> statuses;
    bool stop_now;
    {
      absl::MutexLock g(&mu_);
      for (auto it = children_.begin(); it != children_.end();) {
        Child& c = it->second;
        if (c.adopted) {
          // Not our child: no waitpid. Its process group is not touched
          // either once it is gone (the id may be reused).
          if (!AdoptedAlive(c)) {
            exited.push_back(c);
            statuses.push_back(std::nullopt);
            ++reporting_;
            it = children_.erase(it);
            continue;
          }
          if (c.stopping && Clock::now() >= c.kill_at) kill(-c.pid, SIGKILL);
          ++it;
          continue;
        }
        int status = 0;
        pid_t r = waitpid(it->first, &status, WNOHANG);
        if (r == it->first || (r < 0 && errno == ECHILD)) {
          if (r < 0) status = 0;
          // Leftover members of its process group go with it.
          kill(-it->first, SIGKILL);
          exited.push_back(c);
          statuses.push_back(status);
          ++reporting_;
          it = children_.erase(it);
          continue;
        }
        if (c.stopping && Clock::now() >= c.kill_at) {
          kill(-it->first, SIGKILL);
        }
        ++it;
      }
      stop_now = stopping_;
    }
    // A rank that ended on a stop signal this agent did not send may have
    // got it along with the agent: Slurm ending the step and systemd
    // stopping the service signal every process at once. Its report waits
    // (1 s at most, one deadline for the whole batch) for this agent's own
    // stop to announce itself (AgentLeaving), so that the coordinator does
    // not take it for a rank failure to restart here. A rank that catches
    // SIGTERM exits kExitStopped (dgca-worker rank), one that does not dies
    // of the signal. Crashes (SIGSEGV, SIGABRT, ...) are reported at once.
    const auto hold_until = absl::Now() + absl::Seconds(1);
    for (size_t i = 0; i < exited.size(); ++i) {
      const std::optional<int>& st = statuses[i];
      const bool stop_signal =
          st.has_value() &&
          ((WIFSIGNALED(*st) && (WTERMSIG(*st) == SIGTERM || WTERMSIG(*st) == SIGKILL ||
                                 WTERMSIG(*st) == SIGINT || WTERMSIG(*st) == SIGHUP)) ||
           (WIFEXITED(*st) && WEXITSTATUS(*st) == kExitStopped));
      bool leaving;
      {
        absl::MutexLock g(&mu_);
        if (!exited[i].stopping && stop_signal) {
          mu_.AwaitWithDeadline(absl::Condition(&leaving_announced_), hold_until);
        }
        leaving = leaving_announced_;
      }
      ReportExit(ExitReport(exited[i], statuses[i], leaving));
      absl::MutexLock g(&mu_);
      --reporting_;
    }
    absl::MutexLock l(&mu_);
    if (!exited.empty()) cv_.SignalAll();
    if (stop_now) return;
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    if (stopping_) return;
  }
}

}  // namespace dgca
