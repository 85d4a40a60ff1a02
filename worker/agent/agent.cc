#include "worker/agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "proto/rpc/rpc_util.h"
#include "worker/agent/rank_process.h"
#include "topology/probe.h"

extern char** environ;

namespace dgca {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::string cur;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    cur = path.substr(0, j);
    if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory ", cur, ": ", strerror(errno)));
    }
    i = j + 1;
  }
  return absl::OkStatus();
}

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

// Last `n` lines of the file (reads at most the last 64 KiB).
std::string TailLines(const std::string& path, int n) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string data;
  if (fstat(fd, &st) == 0) {
    off_t start = st.st_size > 65536 ? st.st_size - 65536 : 0;
    data.resize(st.st_size - start);
    ssize_t got = pread(fd, data.data(), data.size(), start);
    data.resize(got > 0 ? got : 0);
  }
  close(fd);
  while (!data.empty() && data.back() == '\n') data.pop_back();
  size_t pos = data.size();
  for (int i = 0; i < n && pos != std::string::npos && pos > 0; ++i) {
    pos = data.rfind('\n', pos - 1);
  }
  if (pos == std::string::npos) return data;
  return data.substr(pos + 1);
}

std::string ResolveWorkerBinary(const std::string& given) {
  if (!given.empty()) return given;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    buf[n] = 0;
    std::string self(buf);
    std::string dir = self.substr(0, self.rfind('/'));
    if (absl::EndsWith(self, "/dgca-worker")) return self;
    for (const std::string& cand :
         {dir + "/dgca-worker", dir + "/../worker/dgca-worker"}) {
      if (access(cand.c_str(), X_OK) == 0) return cand;
    }
  }
  return "dgca-worker";  // found through PATH by execvp
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
  return true;
}

class Agent::Impl {
 public:
  explicit Impl(AgentOptions o) : opt_(std::move(o)) {}
  ~Impl() { Stop(); }

  absl::Status Start();
  // stop_ranks = false: Detach (agent.h).
  void Stop(bool stop_ranks = true);
  void Execute(const v1::CoordinatorCommand& cmd);
  std::vector<v1::RunningRank> Running() const;
  bool connected() const { return connected_.load(); }
  std::string node_name() const { return node_; }

 private:
  struct Child {
    std::string job_id;
    int rank = 0;
    int attempt = 0;
    pid_t pid = 0;
    std::string log_path;
    bool stopping = false;
    Clock::time_point kill_at;  // SIGKILL deadline once stopping
    // Adopted from an earlier agent (not our child): watched through /proc,
    // its exit code read from its exit record.
    bool adopted = false;
    uint64_t start_time = 0;    // /proc/PID/stat start time when adopted
  };

  void ConnectLoop();
  void HeartbeatLoop();
  void ReaperLoop();
  void Launch(const v1::LaunchRank& l);
  // Takes over a rank an earlier agent launched, or reports it gone. mu_ held.
  void Adopt(const v1::RunningRank& r);
  // True while an adopted child's process is still the one adopted.
  static bool AdoptedAlive(const Child& c);
  // The report of a child's end: `wait_status` from waitpid for our own
  // children, nullopt for adopted ones (the exit record, if any, says).
  // Appends the agent's line to the rank's log.
  v1::RankExited ExitReport(const Child& c, std::optional<int> wait_status);
  // SIGTERM (SIGKILL after grace_s) to the job's ranks; only those of
  // `attempts` when it is not empty.
  void StopJob(const std::string& job_id, double grace_s, const std::set<int>& attempts = {});
  // Sends on the open stream; false when there is none or it broke.
  bool Send(const v1::AgentMessage& m);
  // Writes an exit report on the stream when it is up (no RememberExit).
  // Takes stream_mu_; mu_ not held.
  void SendExit(const v1::RankExited& e);
  // Adds an exit report to recent_exits_ (bounded). mu_ held.
  void RememberExit(const v1::RankExited& e) {
    recent_exits_.push_back(e);
    while (recent_exits_.size() > kRecentExits) recent_exits_.pop_front();
  }
  void ReportExit(const v1::RankExited& e);
  bool SleepFor(double seconds);  // false when stopping

  AgentOptions opt_;
  std::string node_;
  std::string worker_binary_;
  std::string rank_token_file_;
  v1::Topology topology_;

  std::mutex mu_;  // guards started_, stopping_, children_, recent_exits_
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  bool stop_called_ = false;
  int reporting_ = 0;  // exits taken out of children_ but not yet reported
  std::map<pid_t, Child> children_;
  // The last kRecentExits exit reports, oldest first. All of them are sent
  // again after every registration: those the coordinator has seen it
  // ignores (other attempts, ranks it saw exit, finished jobs), and one that
  // restarted after our Write but before handling it learns them again.
  static constexpr size_t kRecentExits = 256;
  std::deque<v1::RankExited> recent_exits_;

  std::mutex stream_mu_;  // guards stream_ and ctx_; held while writing
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorCommand>* stream_ = nullptr;
  std::shared_ptr<grpc::ClientContext> ctx_;
  std::atomic<bool> connected_{false};

  std::thread connect_thread_, heartbeat_thread_, reaper_thread_;
};

absl::Status Agent::Impl::Start() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (started_) return absl::FailedPreconditionError("agent already started");
    if (stopping_) return absl::FailedPreconditionError("agent was stopped; make a new one");
  }
  if (opt_.coordinator_address.empty())
    return absl::InvalidArgumentError("agent: coordinator address is empty (want HOST:PORT)");
  if (opt_.state_dir.empty()) return absl::InvalidArgumentError("agent: state_dir is empty");
  if (opt_.heartbeat_interval_s <= 0) opt_.heartbeat_interval_s = 2;
  if (auto s = MakeDirs(opt_.state_dir); !s.ok()) return s;

  node_ = opt_.node_name.empty() ? Hostname() : opt_.node_name;
  worker_binary_ = ResolveWorkerBinary(opt_.worker_binary);
  rank_token_file_ = opt_.token_file;
  if (rank_token_file_.empty()) {
    rank_token_file_ = opt_.state_dir + "/agent-token";
    std::string tmp = rank_token_file_ + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
      return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
    std::string line = opt_.token + "\n";
    bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    fchmod(fd, 0600);
    close(fd);
    if (!ok || rename(tmp.c_str(), rank_token_file_.c_str()) != 0)
      return absl::InternalError(absl::StrCat("cannot write ", rank_token_file_));
  }

  ProbeOptions po;
  po.root = opt_.topology_root;
  po.node_name = node_;
  auto topo = ProbeTopology(po);
  if (topo.ok()) {
    topology_ = *topo;
  } else {
    topology_.Clear();
    topology_.set_hostname(Hostname());
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    topology_.set_cpu_count(n > 0 ? static_cast<int>(n) : 0);
    topology_.add_unknown(absl::StrCat("topology probe failed: ", topo.status().ToString()));
    spdlog::warn("agent: topology probe failed ({}); registering with what is known",
                 topo.status().ToString());
  }
  topology_.set_node(node_);

  std::lock_guard<std::mutex> l(mu_);
  // Before the first registration, so it lists the adopted ranks.
  for (const AgentOptions::AdoptRank& a : opt_.adopt) {
    if (a.node == node_) Adopt(a.rank);
  }
  started_ = true;
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
  connect_thread_ = std::thread([this] { ConnectLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  spdlog::info("agent {}: started (coordinator {}, worker {}, state {})", node_,
               opt_.coordinator_address, worker_binary_, opt_.state_dir);
  return absl::OkStatus();
}

void Agent::Impl::Stop(bool stop_ranks) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_called_) return;
    stop_called_ = true;  // from here on launches are refused (Launch)
    if (!started_) {
      stopping_ = true;
      return;
    }
  }
  if (stop_ranks) {
    // Stop every rank first, while the stream can still carry their exits.
    std::vector<std::string> jobs;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [pid, c] : children_) jobs.push_back(c.job_id);
    }
    for (const auto& j : jobs) StopJob(j, 5.0);
  }
  {
    std::unique_lock<std::mutex> l(mu_);
    if (stop_ranks) {
      cv_.wait_for(l, std::chrono::seconds(7),
                   [this] { return children_.empty() && reporting_ == 0; });
    }
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(stream_mu_);
    if (ctx_) ctx_->TryCancel();
  }
  if (connect_thread_.joinable()) connect_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (reaper_thread_.joinable()) reaper_thread_.join();
  std::lock_guard<std::mutex> l(mu_);
  if (!stop_ranks) {
    // Left running, unwaited: once this process exits they are init's
    // children, and an adopting agent watches them through /proc.
    spdlog::info("agent {}: detached from {} rank(s), which keep running", node_,
                 children_.size());
    children_.clear();
    return;
  }
  // Anything the wait above did not see exit is killed now.
  for (auto& [pid, c] : children_) {
    if (c.adopted) {
      if (AdoptedAlive(c)) kill(-pid, SIGKILL);
      continue;
    }
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  children_.clear();
  spdlog::info("agent {}: stopped", node_);
}

bool Agent::Impl::SleepFor(double seconds) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::duration<double>(seconds), [this] { return stopping_; });
  return !stopping_;
}

bool Agent::Impl::Send(const v1::AgentMessage& m) {
  std::lock_guard<std::mutex> l(stream_mu_);
  if (stream_ == nullptr || !connected_.load()) return false;
  return stream_->Write(m);
}

void Agent::Impl::SendExit(const v1::RankExited& e) {
  v1::AgentMessage m;
  *m.mutable_rank_exited() = e;
  std::lock_guard<std::mutex> l(stream_mu_);
  if (stream_ != nullptr && connected_.load()) stream_->Write(m);
}

void Agent::Impl::ReportExit(const v1::RankExited& e) {
  v1::AgentMessage m;
  *m.mutable_rank_exited() = e;
  // Under stream_mu_, which ConnectLoop holds while it sends the recent
  // exits and marks the stream connected: an exit is either among those or
  // written after them, in order either way.
  std::lock_guard<std::mutex> l(stream_mu_);
  {
    std::lock_guard<std::mutex> l2(mu_);
    RememberExit(e);
  }
  // A failed write is not retried here: the next registration sends it.
  if (stream_ != nullptr && connected_.load()) stream_->Write(m);
}

void Agent::Impl::ConnectLoop() {
  double backoff = 0.2;
  while (true) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);  // a dead host (no RST) is noticed in ~30 s
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!opt_.tls_ca_file.empty()) {
      std::ifstream in(opt_.tls_ca_file);
      std::stringstream pem;
      pem << in.rdbuf();
      grpc::SslCredentialsOptions so;
      so.pem_root_certs = pem.str();
      creds = grpc::SslCredentials(so);
    }
    auto channel = grpc::CreateCustomChannel(opt_.coordinator_address, creds, args);
    auto stub = v1::AgentService::NewStub(channel);
    auto ctx = std::make_shared<grpc::ClientContext>();
    AddAuth(ctx.get(), opt_.token);
    std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorCommand>> stream;
    {
      std::lock_guard<std::mutex> l(stream_mu_);
      {
        std::lock_guard<std::mutex> l2(mu_);
        if (stopping_) return;
      }
      ctx_ = ctx;  // from here Stop() can cancel the call
    }
    stream = stub->Connect(ctx.get());
    {
      std::lock_guard<std::mutex> l(stream_mu_);
      stream_ = stream.get();
    }
    v1::AgentMessage reg;
    reg.mutable_register_()->set_node(node_);
    *reg.mutable_register_()->mutable_topology() = topology_;
    for (const auto& r : Running()) *reg.mutable_register_()->add_running() = r;
    bool ok;
    {
      std::lock_guard<std::mutex> l(stream_mu_);
      ok = stream->Write(reg);
      // The recent exits (those that happened while disconnected among
      // them) go first, in order, before the reaper can send a later one
      // (connected_ is still false).
      std::deque<v1::RankExited> recent;
      {
        std::lock_guard<std::mutex> l2(mu_);
        recent = recent_exits_;
      }
      for (size_t i = 0; ok && i < recent.size(); ++i) {
        v1::AgentMessage m;
        *m.mutable_rank_exited() = recent[i];
        ok = stream->Write(m);
      }
      if (ok) connected_ = true;
    }
    auto connected_at = Clock::now();
    if (ok) {
      spdlog::info("agent {}: connected to {}", node_, opt_.coordinator_address);
      v1::CoordinatorCommand cmd;
      while (stream->Read(&cmd)) Execute(cmd);
    }
    connected_ = false;
    grpc::Status st;
    {
      std::lock_guard<std::mutex> l(stream_mu_);
      stream_ = nullptr;
      ctx_->TryCancel();
      st = stream->Finish();
      ctx_.reset();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
    }
    if (Clock::now() - connected_at > std::chrono::seconds(10)) backoff = 0.2;
    spdlog::warn("agent {}: stream to {} closed ({}: {}); reconnecting in {:.1f} s", node_,
                 opt_.coordinator_address, static_cast<int>(st.error_code()),
                 st.error_message(), backoff);
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      spdlog::error("agent {}: the coordinator rejected the token; check --token-file", node_);
    }
    if (!SleepFor(backoff)) return;
    backoff = std::min(backoff * 2, 5.0);
  }
}

void Agent::Impl::HeartbeatLoop() {
  while (SleepFor(opt_.heartbeat_interval_s)) {
    if (!connected_.load()) continue;
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_time_unix_ms(NowUnixMs());
    for (const auto& r : Running()) *m.mutable_heartbeat()->add_running() = r;
    Send(m);
  }
}

std::vector<v1::RunningRank> Agent::Impl::Running() const {
  std::lock_guard<std::mutex> l(const_cast<std::mutex&>(mu_));
  std::vector<v1::RunningRank> out;
  for (const auto& [pid, c] : children_) {
    v1::RunningRank r;
    r.set_job_id(c.job_id);
    r.set_rank(c.rank);
    r.set_pid(pid);
    r.set_attempt(c.attempt);
    out.push_back(r);
  }
  return out;
}

void Agent::Impl::Execute(const v1::CoordinatorCommand& cmd) {
  switch (cmd.cmd_case()) {
    case v1::CoordinatorCommand::kLaunch:
      Launch(cmd.launch());
      break;
    case v1::CoordinatorCommand::kAdopt: {
      std::vector<v1::RankExited> gone;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (stopping_ || stop_called_) break;
        auto supervised = [&](const v1::RunningRank& r) {
          return std::any_of(children_.begin(), children_.end(), [&](const auto& pc) {
            const Child& c = pc.second;
            return c.job_id == r.job_id() && c.rank == r.rank() && c.attempt == r.attempt();
          });
        };
        for (const v1::RunningRank& r : cmd.adopt().ranks()) {
          if (supervised(r)) continue;
          Adopt(r);
          // Gone already: Adopt queued its report for the next
          // registration; this stream is up, so it goes now as well.
          if (!supervised(r) && !recent_exits_.empty()) gone.push_back(recent_exits_.back());
        }
      }
      for (const v1::RankExited& e : gone) SendExit(e);
      break;
    }
    case v1::CoordinatorCommand::kStop:
      StopJob(cmd.stop().job_id(), cmd.stop().grace_seconds(),
              std::set<int>(cmd.stop().attempts().begin(), cmd.stop().attempts().end()));
      break;
    default:
      spdlog::warn("agent {}: ignoring an empty or unknown command", node_);
  }
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
  if (l.rank() < 0) return fail("rank must be >= 0");
  std::string refusal;  // reported after mu_ is released (ReportExit takes stream_mu_)
  {
    std::unique_lock<std::mutex> g(mu_);
    // Refused from the start of Stop(): a rank launched while the others
    // drain would be SIGKILLed at its end with no exit reported.
    if (stopping_ || stop_called_) refusal = "agent is stopping";
    auto find = [&]() -> Child* {
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
      cv_.wait_for(g, std::chrono::seconds(5), [&] { return find() == nullptr; });
      if (find() != nullptr) refusal = "the previous attempt of this rank did not exit";
    }
  }
  if (!refusal.empty()) return fail(refusal);
  std::string log_dir = !l.log_dir().empty() ? l.log_dir()
                                             : opt_.state_dir + "/jobs/" + l.job_id();
  if (auto s = MakeDirs(log_dir); !s.ok()) return fail(std::string(s.message()));
  std::string log_path = absl::StrCat(log_dir, "/rank-", l.rank(), ".log");
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return fail(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));

  // Environment: ours plus the allow-listed entries of the command.
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  // The GPU this rank uses on the node (-1 = CPU), for the rank runtime.
  env["DGCA_LOCAL_DEVICE"] = absl::StrCat(l.local_device());
  env["DGCA_WORLD_SIZE"] = absl::StrCat(l.world_size());
  env["DGCA_NODE"] = node_;
  const std::string exit_file = ExitRecordPath(log_dir, l.rank());
  unlink(exit_file.c_str());  // a record of an earlier attempt
  std::string refused;
  for (const auto& [k, v] : l.env()) {
    if (IsAllowedRankEnv(k)) {
      env[k] = v;
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
  (void)!write(log_fd, header.data(), header.size());

  const std::string coordinator =
      l.coordinator().empty() ? opt_.coordinator_address : l.coordinator();
  std::vector<std::string> argv_s;
  if (!opt_.rank_argv_override.empty()) {
    for (const auto& a : opt_.rank_argv_override) {
      argv_s.push_back(absl::StrReplaceAll(
          a, {{"{job}", l.job_id()}, {"{rank}", absl::StrCat(l.rank())},
              {"{attempt}", absl::StrCat(l.attempt())}, {"{coordinator}", coordinator},
              {"{token_file}", rank_token_file_}}));
    }
  } else {
    argv_s = {worker_binary_, "rank", "--coordinator", coordinator, "--token-file",
              rank_token_file_, "--job", l.job_id(), "--rank", absl::StrCat(l.rank()),
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
    std::lock_guard<std::mutex> g(mu_);  // the reaper must not see the pid first
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
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
  if (pid < 0) return fail(absl::StrCat("fork: ", strerror(fork_errno)));
  spdlog::info("agent {}: job {} rank {} attempt {} started, pid {}, log {}", node_, l.job_id(),
               l.rank(), l.attempt(), pid, log_path);
}

void Agent::Impl::StopJob(const std::string& job_id, double grace_s,
                          const std::set<int>& attempts) {
  if (grace_s < 0) grace_s = 0;
  std::lock_guard<std::mutex> g(mu_);
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
  v1::RankExited e = ExitReport(c, std::nullopt);
  spdlog::info("agent {}: job {} rank {} attempt {} (pid {}) ended before it could be adopted",
               node_, c.job_id, c.rank, c.attempt, c.pid);
  RememberExit(e);
}

v1::RankExited Agent::Impl::ExitReport(const Child& c, std::optional<int> wait_status) {
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
  AppendToLog(c.log_path, absl::StrCat("[agent ", node_, "] rank ", c.rank, " (pid ", c.pid,
                                       ") ", how, c.stopping ? " after a stop request" : "", "\n"));
  if (e.exit_code() != 0 || e.signal() != 0) e.set_message(TailLines(c.log_path, 20));
  spdlog::info("agent {}: job {} rank {} {}", node_, c.job_id, c.rank, how);
  return e;
}

void Agent::Impl::ReaperLoop() {
  while (true) {
    std::vector<Child> exited;
    std::vector<std::optional<int>> statuses;
    bool stop_now;
    {
      std::lock_guard<std::mutex> g(mu_);
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
    for (size_t i = 0; i < exited.size(); ++i) {
      ReportExit(ExitReport(exited[i], statuses[i]));
      std::lock_guard<std::mutex> g(mu_);
      --reporting_;
    }
    if (!exited.empty()) cv_.notify_all();
    if (stop_now) return;
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::milliseconds(50));
    if (stopping_) return;
  }
}

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() { Stop(); }
absl::Status Agent::Start() { return impl_->Start(); }
void Agent::Stop() { impl_->Stop(); }
void Agent::Detach() { impl_->Stop(/*stop_ranks=*/false); }
std::string Agent::node_name() const { return impl_->node_name(); }
bool Agent::connected() const { return impl_->connected(); }
std::vector<v1::RunningRank> Agent::Running() const { return impl_->Running(); }
void Agent::Execute(const v1::CoordinatorCommand& cmd) { impl_->Execute(cmd); }

}  // namespace dgca
