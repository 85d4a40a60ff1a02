// Helpers for the end-to-end tests: they run the REAL programs
// (DGCA_BUILD_DIR/coordinator/dgca-coordinator, cli/dgca, worker/dgca-worker)
// over loopback, with a temporary state directory.
//
// Thread-safety: none needed; one test thread.
#ifndef DGCA_TESTS_INTEGRATION_HARNESS_H_
#define DGCA_TESTS_INTEGRATION_HARNESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/core/core_test_util.h"
#include "model/core/json.h"

namespace dgca {
namespace itest {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
inline std::string BuildDir() { return Env("DGCA_BUILD_DIR", "build"); }
inline std::string SharedData() { return Env("DGCA_SHARED_DATA", "../shared/data"); }
inline std::string CoordinatorBin() { return BuildDir() + "/coordinator/dgca-coordinator"; }
inline std::string CliBin() { return BuildDir() + "/cli/dgca"; }
inline std::string WorkerBin() { return BuildDir() + "/worker/dgca-worker"; }

inline bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

using testutil::MakeTempDir;  // a fresh /tmp/<prefix>.XXXXXX ("" if it cannot be made)
using testutil::ReadFile;     // the whole file ("" if it cannot be read)
using testutil::WriteFile;

// True while `pid` exists and is not a zombie.
inline bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t p = stat.rfind(')');
  return !(p != std::string::npos && p + 2 < stat.size() && stat[p + 2] == 'Z');
}

// Polls `cond` every 100 ms until true or `timeout`.
inline bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return cond();
}

struct Result {
  int code = -1;  // exit code; 128+signal when killed; -1 = could not run
  std::string out, err;
};

// Runs argv to completion (killed after `timeout`), capturing stdout/stderr.
inline Result Exec(const std::vector<std::string>& argv,
                   std::chrono::milliseconds timeout = 60s,
                   const std::vector<std::string>& extra_env = {}) {
  Result r;
  std::string dir = MakeTempDir("itest-exec");
  std::string out = dir + "/out", err = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    for (const auto& kv : extra_env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  auto end = Clock::now() + timeout;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (Clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "timed out: " << argv[0] << " " << (argv.size() > 1 ? argv[1] : "");
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  std::system(("rm -rf " + dir).c_str());
  return r;
}

inline StatusOr<JsonValue> Json(const std::string& text) { return ParseJson(text, "cli output"); }

// An integer of our CLI's JSON (a number; a string, as proto3 JSON writes
// int64, is read too).
inline int64_t JsonInt(const JsonValue* v) {
  if (v == nullptr) return 0;
  if (v->is_number()) return static_cast<int64_t>(v->number);
  if (v->is_string()) return std::atoll(v->string.c_str());
  return 0;
}
inline std::string JsonStr(const JsonValue* v) { return v && v->is_string() ? v->string : ""; }

// A dgca-coordinator process on loopback with its state in `state_dir`.
// Starts argv[0] with `argv`, stdout and stderr appended to `log`; returns
// the child's pid (-1 if fork failed). The child exits 127 if exec fails.
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

class CoordinatorProcess {
 public:
  explicit CoordinatorProcess(std::string state_dir) : state_dir_(std::move(state_dir)) {}
  ~CoordinatorProcess() { Stop(); }

  // Starts it; `listen` defaults to 127.0.0.1:0. Waits for coordinator.json
  // written by this process. Returns false (with a test failure) otherwise.
  bool Start(const std::string& listen = "127.0.0.1:0",
             const std::vector<std::string>& extra = {}) {
    std::string json_path = state_dir_ + "/coordinator.json";
    unlink(json_path.c_str());
    ++starts_;
    std::string log = state_dir_ + "/coordinator-" + std::to_string(starts_) + ".log";
    std::vector<std::string> argv = {CoordinatorBin(), "--listen", listen, "--metrics-listen",
                                     "127.0.0.1:0", "--state-dir", state_dir_, "--worker-binary",
                                     WorkerBin()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = SpawnLogged(argv, log);
    bool ok = WaitUntil(
        [&] {
          if (!Exists(json_path)) return false;
          auto j = Json(ReadFile(json_path));
          if (!j.ok()) return false;
          if (JsonInt(j->Find("pid")) != pid_) return false;
          address_ = JsonStr(j->Find("listen"));
          metrics_ = JsonStr(j->Find("metrics"));
          return !address_.empty();
        },
        20s);
    if (!ok) {
      ADD_FAILURE() << "coordinator did not start; log:\n" << ReadFile(log);
      return false;
    }
    return true;
  }
  void Kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // SIGTERM, SIGKILL after 15 s; the wait status (-1 when not running).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = -1;
    auto end = Clock::now() + 15s;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    pid_ = -1;
    return status;
  }
  std::string Log() const {
    std::string all;
    for (int i = 1; i <= starts_; ++i) {
      all += ReadFile(state_dir_ + "/coordinator-" + std::to_string(i) + ".log");
    }
    return all;
  }

  const std::string& address() const { return address_; }
  const std::string& metrics() const { return metrics_; }
  const std::string& state_dir() const { return state_dir_; }
  std::string token_file() const { return state_dir_ + "/token"; }              // the user's
  std::string agent_token_file() const { return state_dir_ + "/agent-token"; }  // agents'

  pid_t pid() const { return pid_; }

 private:
  std::string state_dir_;
  std::string address_, metrics_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

// Runs `dgca --coordinator ADDR --token-file STATE/token ARGS...`.
inline Result Dgca(const CoordinatorProcess& c, std::vector<std::string> args,
                   std::chrono::milliseconds timeout = 60s) {
  std::vector<std::string> argv = {CliBin(), "--coordinator", c.address(), "--token-file",
                                   c.token_file()};
  argv.insert(argv.end(), args.begin(), args.end());
  return Exec(argv, timeout);
}

// Waits until the coordinator's embedded agent (or any agent) has
// registered: it probes the node first, the CPU's GEMM rate included
// (topology/probe.h), so `dgca plan` right after a start may find none yet.
inline bool WaitForAgent(const CoordinatorProcess& c) {
  return WaitUntil(
      [&] {
        Result r = Dgca(c, {"nodes", "--json"}, 10s);
        return r.code == 0 && r.out.find("\"connected\": true") != std::string::npos;
      },
      30s);
}

// A `dgca-worker agent` process (`bin`, default WorkerBin()) as node `node`
// of a coordinator, its state and agent.log in `state_dir` (created),
// heartbeat every 0.5 s, plus `extra` flags. Stopped when it goes out of
// scope, so a failed ASSERT leaves no agent (and none of its ranks'
// supervisors) running. Not thread-safe; one test thread owns it.
class AgentProcess {
 public:
  AgentProcess() = default;
  ~AgentProcess() { Stop(); }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  // Starts it (a running one is stopped first); false when it cannot fork.
  bool Start(const CoordinatorProcess& coord, const std::string& node,
             const std::string& state_dir, const std::string& bin = WorkerBin(),
             const std::vector<std::string>& extra = {}) {
    Stop();
    state_dir_ = state_dir;
    mkdir(state_dir.c_str(), 0755);
    argv_ = {bin, "agent", "--coordinator", coord.address(), "--token-file", coord.agent_token_file(),
             "--node-name", node, "--state-dir", state_dir, "--heartbeat-interval", "0.5"};
    argv_.insert(argv_.end(), extra.begin(), extra.end());
    return Restart();
  }
  // Starts it again with the same arguments (after Kill9 or Stop).
  bool Restart() {
    Stop();
    pid_ = SpawnLogged(argv_, state_dir_ + "/agent.log");
    return pid_ > 0;
  }
  // SIGTERM, then SIGKILL if it has not exited within 15 s; reaps it.
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    bool exited = false;
    for (int i = 0; i < 150 && !exited; ++i) {
      exited = waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!exited) std::this_thread::sleep_for(100ms);
    }
    if (!exited) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  // SIGKILL (a crash): its ranks keep running.
  void Kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Sends `sig` (SIGSTOP, SIGCONT: a frozen agent) to the running agent.
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string Log() const { return ReadFile(state_dir_ + "/agent.log"); }

 private:
  std::vector<std::string> argv_;
  std::string state_dir_;
  pid_t pid_ = -1;
};

// What a tiny job spec may set beyond the CPU defaults.
struct TinySpecOptions {
  int ranks = 2;
  std::string device = "cpu";
  std::string backend;    // comm.backend; empty: the planner's choice
  std::string eval_file;  // data.eval; empty: ECSpell test_law.txt
  std::string precision;  // train.precision; empty: the default
  int micro_batch = 0;    // with accumulation 1; 0: the planner's choice
  int checkpoint_every = 0;
  int max_restarts = 0;
  std::string resources_extra;  // more resources fields, e.g. "launcher: slurm"
};

// A tiny job on the shared ECSpell law data: `steps` steps of global batch
// 8, sequences of 32 characters, eval at the end (test_law.txt unless
// o.eval_file). Returns the spec's path (in `dir`).
inline std::string WriteTinySpec(const std::string& dir, const std::string& name, int steps,
                                 const TinySpecOptions& o) {
  std::string path = dir + "/" + name + ".yaml";
  std::string train = "train:\n"
                      "  steps: " + std::to_string(steps) + "\n"
                      "  global_batch: 8\n";
  if (o.micro_batch > 0)
    train += "  micro_batch: " + std::to_string(o.micro_batch) + "\n  accumulation: 1\n";
  if (!o.precision.empty()) train += "  precision: " + o.precision + "\n";
  train += "  eval_every: 0\n"
           "  checkpoint_every: " + std::to_string(o.checkpoint_every) + "\n"
           "  max_restarts: " + std::to_string(o.max_restarts) + "\n"
           "  optimizer: {lr: 1.0e-3}\n";
  WriteFile(path,
            "name: " + name + "\n"
            "model:\n"
            "  preset: tiny\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + (o.eval_file.empty() ? SharedData() + "/ecspell/test_law.txt" : o.eval_file) + "\n"
            "  max_seq_len: 32\n" +
            train +
            "resources: {ranks: " + std::to_string(o.ranks) + ", device: " + o.device +
            ", threads_per_rank: 1" +
            (o.resources_extra.empty() ? std::string() : ", " + o.resources_extra) + "}\n" +
            (o.backend.empty() ? std::string() : "comm: {backend: " + o.backend + "}\n") +
            "tuning: {mode: off}\n");
  return path;
}
// The same on `ranks` CPU ranks.
inline std::string WriteTinySpec(const std::string& dir, const std::string& name, int steps,
                                 int ranks = 2) {
  TinySpecOptions o;
  o.ranks = ranks;
  return WriteTinySpec(dir, name, steps, o);
}

inline bool HaveSharedData() { return Exists(SharedData() + "/ecspell/train_law.txt"); }
inline bool HavePrograms() {
  return Exists(CoordinatorBin()) && Exists(CliBin()) && Exists(WorkerBin());
}

// A fixture whose tests share one real coordinator, started once per suite
// on a temporary state dir (named after `Derived::kName`) and stopped at the
// end; the temp dir is kept when a test failed. Tests skip, saying why, when
// the programs (or, with kNeedsData, the ECSpell data) are missing.
//   class E2eTest : public CoordinatorSuite<E2eTest, true> {
//    public: static constexpr const char* kName = "e2e"; };
template <typename Derived, bool kNeedsData>
class CoordinatorSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HavePrograms() || (kNeedsData && !HaveSharedData())) return;
    dir_ = new std::string(MakeTempDir(Derived::kName));
    coord_ = new CoordinatorProcess(*dir_ + "/state");
    mkdir((*dir_ + "/state").c_str(), 0755);
    if (!coord_->Start() || !WaitForAgent(*coord_)) {
      delete coord_;
      coord_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    if (coord_) {
      coord_->Stop();
      delete coord_;
      coord_ = nullptr;
    }
    delete dir_;  // the directory itself goes at exit (testutil::MakeTempDir)
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
    if (kNeedsData && !HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
    ASSERT_NE(coord_, nullptr) << "coordinator did not start";
  }

  static inline std::string* dir_ = nullptr;
  static inline CoordinatorProcess* coord_ = nullptr;
};

// `dgca status --json JOB` parsed, or an error.
struct JobView {
  bool ok = false;
  std::string state;
  std::string message;
  int64_t step = 0, total_steps = 0;
  std::vector<pid_t> pids;            // of ranks with a pid
  std::vector<int64_t> rank_steps;    // per rank, in order
  std::vector<std::string> rank_states;
  int events = 0;
  std::string raw;
};

inline JobView Status(const CoordinatorProcess& c, const std::string& job) {
  JobView v;
  Result r = Dgca(c, {"status", "--json", job}, 20s);
  v.raw = r.out + r.err;
  if (r.code != 0) return v;
  auto j = Json(r.out);
  if (!j.ok()) return v;
  const JsonValue* jobv = j->Find("job");
  if (!jobv) return v;
  v.ok = true;
  v.state = JsonStr(jobv->Find("state"));
  v.message = JsonStr(jobv->Find("message"));
  v.step = JsonInt(jobv->Find("step"));
  v.total_steps = JsonInt(jobv->Find("total_steps"));
  if (const JsonValue* ranks = jobv->Find("ranks"); ranks && ranks->is_array()) {
    for (const auto& r : ranks->array) {
      pid_t pid = static_cast<pid_t>(JsonInt(r.Find("pid")));
      if (pid > 0) v.pids.push_back(pid);
      v.rank_steps.push_back(JsonInt(r.Find("step")));
      v.rank_states.push_back(JsonStr(r.Find("state")));
    }
  }
  if (const JsonValue* ev = j->Find("events"); ev && ev->is_array()) v.events = ev->array.size();
  return v;
}

// Polls the job's status (Status) until `done` holds or `limit` passes; the
// last view. A timeout is a test failure that shows the view and the
// coordinator's log.
inline JobView WaitForJob(const CoordinatorProcess& coord, const std::string& job,
                          const std::function<bool(const JobView&)>& done,
                          std::chrono::milliseconds limit) {
  JobView v;
  bool ok = WaitUntil(
      [&] {
        v = Status(coord, job);
        return v.ok && done(v);
      },
      limit);
  EXPECT_TRUE(ok) << v.raw << coord.Log();
  return v;
}

// SIGKILL to what is left of a job's rank processes: only pids whose command
// line still names the job (a pid may have been reused since).
inline void KillJobLeftovers(const std::vector<pid_t>& pids, const std::string& job) {
  for (pid_t p : pids) {
    std::string cmdline = ReadFile("/proc/" + std::to_string(p) + "/cmdline");
    if (ProcessAlive(p) && cmdline.find(job) != std::string::npos) kill(p, SIGKILL);
  }
}

// Polls `job` until it is RUNNING with `ranks` rank pids and at step
// `min_step` or later; returns whether it got there, *last = the last view.
inline bool WaitRunning(const CoordinatorProcess& c, const std::string& job, size_t ranks,
                        int64_t min_step, std::chrono::milliseconds timeout, JobView* last) {
  return WaitUntil(
      [&] {
        *last = Status(c, job);
        return last->state == "RUNNING" && last->pids.size() == ranks && last->step >= min_step;
      },
      timeout);
}

// GET http://HOST:PORT/PATH (plain HTTP/1.0); the body, or "" on failure.
inline std::string HttpGet(const std::string& host_port, const std::string& path) {
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string resp;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host_port + "\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, n);
    }
  }
  close(fd);
  size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

inline std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace itest
}  // namespace dgca

#endif  // DGCA_TESTS_INTEGRATION_HARNESS_H_
