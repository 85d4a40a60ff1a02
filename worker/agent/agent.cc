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
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "model/core/files.h"
#include "proto/rpc/rpc_util.h"
#include "worker/agent/rank_process.h"
#include "topology/probe.h"
#include "worker/agent/agent_impl.h"

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

absl::Status MakeDirs(const std::string& path) {
  return ToAbsl(MakeDirectories(path, 0755));
}

absl::Status Agent::Impl::Start() {
  {
    absl::MutexLock l(&mu_);
    if (started_) return absl::FailedPreconditionError("agent already started");
    if (stopping_) return absl::FailedPreconditionError("agent was stopped; make a new one");
  }
  if (opt_.coordinator_address.empty())
    return absl::InvalidArgumentError("agent: coordinator address is empty (want HOST:PORT)");
  if (opt_.state_dir.empty()) return absl::InvalidArgumentError("agent: state_dir is empty");
  if (opt_.heartbeat_interval_s <= 0) opt_.heartbeat_interval_s = 2;
  if (auto s = MakeDirs(opt_.state_dir); !s.ok()) return s;

  node_ = !opt_.node_name.empty() ? opt_.node_name
          : opt_.bound_job.empty() ? Hostname()
                                   : absl::StrCat(Hostname(), "-slurm",
                                                  opt_.allocation_id.empty() ? opt_.bound_job
                                                                             : opt_.allocation_id);
  worker_binary_ = ResolveWorkerBinary(opt_.worker_binary);
  ProbeOptions po;
  po.root = opt_.topology_root;
  po.node_name = node_;
  po.gemm_rate_command = {worker_binary_, "gemm-rate"};
  // Token files left by ranks that ended while no agent watched.
  SweepRankTokens(opt_.state_dir, kRankTokenMaxAgeSeconds);
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

  absl::MutexLock l(&mu_);
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
    absl::MutexLock l(&mu_);
    if (stop_called_) return;
    stop_called_ = true;  // from here on launches are refused (Launch)
    if (!started_) {
      stopping_ = true;
      return;
    }
  }
  if (stop_ranks) {
    // The coordinator hears that this agent is leaving before it hears of
    // its ranks' ends: a restart those ends cause must not be launched back
    // here (the stream closes moments later and the launch would be lost).
    v1::AgentMessage leaving;
    leaving.mutable_leaving()->set_reason(
        opt_.bound_job.empty() ? "the agent is stopping"
                               : "the agent is stopping (its Slurm allocation is ending)");
    if (!Send(leaving)) spdlog::info("agent {}: stopping while not connected", node_);
    {
      absl::MutexLock l(&mu_);
      leaving_announced_ = true;
      cv_.SignalAll();
    }
    // Stop every rank next, while the stream can still carry their exits.
    std::vector<std::string> jobs;
    {
      absl::MutexLock l(&mu_);
      for (auto& [pid, c] : children_) jobs.push_back(c.job_id);
    }
    for (const auto& j : jobs) StopJob(j, 5.0);
  }
  {
    absl::MutexLock l(&mu_);
    if (stop_ranks) {
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return children_.empty() && reporting_ == 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&drained), absl::Seconds(7));
    }
    stopping_ = true;
    cv_.SignalAll();
  }
  // Half-close first and give the coordinator a moment to end the call: a
  // cancel right after the last Write (an exit report written as the stop
  // began) could drop what gRPC had not sent yet.
  // All of it within 2 s: a watchdog cancels the call should the
  // half-close itself block (a coordinator that stopped reading).
  std::shared_ptr<grpc::ClientContext> call;
  {
    absl::MutexLock l(&stream_mu_);
    call = ctx_;
  }
  absl::Notification closed;
  std::thread watchdog([call, &closed] {
    if (!closed.WaitForNotificationWithTimeout(absl::Seconds(2)) && call) call->TryCancel();
  });
  bool half_closed = false;
  {
    absl::MutexLock l(&stream_mu_);
    if (stream_ != nullptr && connected_.load()) half_closed = stream_->WritesDone();
  }
  if (half_closed) {
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream_mu_) { return stream_ == nullptr; };
    absl::MutexLock l(&stream_mu_);
    stream_mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(2));
  }
  closed.Notify();
  watchdog.join();
  {
    absl::MutexLock l(&stream_mu_);
    if (ctx_) ctx_->TryCancel();
  }
  if (connect_thread_.joinable()) connect_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (reaper_thread_.joinable()) reaper_thread_.join();
  absl::MutexLock l(&mu_);
  if (!stop_ranks) {
    // Left running, unwaited: once this process exits they are init's
    // children, and an adopting agent watches them through /proc.
    spdlog::info("agent {}: detached from {} rank(s), which keep running", node_,
                 children_.size());
    children_.clear();
    return;
  }
  // Anything the wait above did not see exit is killed now, and its token
  // goes with it (no exit report will remove it).
  for (auto& [pid, c] : children_) {
    unlink(RankTokenPath(c.log_path.substr(0, c.log_path.rfind('/')), c.rank, c.attempt).c_str());
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
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(seconds));
  return !stopping_;
}

bool Agent::Impl::Send(const v1::AgentMessage& m) {
  absl::MutexLock l(&stream_mu_);
  if (stream_ == nullptr || !connected_.load()) return false;
  return stream_->Write(m);
}

void Agent::Impl::SendExit(const v1::RankExited& e) {
  v1::AgentMessage m;
  *m.mutable_rank_exited() = e;
  absl::MutexLock l(&stream_mu_);
  if (stream_ != nullptr && connected_.load()) stream_->Write(m);
}

void Agent::Impl::ReportExit(const v1::RankExited& e) {
  v1::AgentMessage m;
  *m.mutable_rank_exited() = e;
  // Under stream_mu_, which ConnectLoop holds while it sends the recent
  // exits and marks the stream connected: an exit is either among those or
  // written after them, in order either way.
  absl::MutexLock l(&stream_mu_);
  {
    absl::MutexLock l2(&mu_);
    RememberExit(e);
  }
  // A failed write is not retried here: the next registration sends it.
  if (stream_ != nullptr && connected_.load()) stream_->Write(m);
}

void Agent::Impl::ConnectLoop() {
  double backoff = 0.2;
  while (true) {
    {
      absl::MutexLock l(&mu_);
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
      absl::MutexLock l(&stream_mu_);
      {
        absl::MutexLock l2(&mu_);
        if (stopping_) return;
      }
      ctx_ = ctx;  // from here Stop() can cancel the call
    }
    stream = stub->Connect(ctx.get());
    {
      absl::MutexLock l(&stream_mu_);
      stream_ = stream.get();
    }
    v1::AgentMessage reg;
    reg.mutable_register_()->set_node(node_);
    reg.mutable_register_()->set_bound_job(opt_.bound_job);
    reg.mutable_register_()->set_allocation_id(opt_.allocation_id);
    *reg.mutable_register_()->mutable_topology() = topology_;
    for (const auto& r : Running()) *reg.mutable_register_()->add_running() = r;
    bool ok;
    {
      absl::MutexLock l(&stream_mu_);
      ok = stream->Write(reg);
      // The recent exits (those that happened while disconnected among
      // them) go first, in order, before the reaper can send a later one
      // (connected_ is still false).
      std::deque<v1::RankExited> recent;
      {
        absl::MutexLock l2(&mu_);
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
    v1::CoordinatorCommand cmd;
    if (ok) {
      spdlog::info("agent {}: connected to {}", node_, opt_.coordinator_address);
      while (stream->Read(&cmd)) Execute(cmd);
    } else {
      // A failed write: the call is over (a refused token, the coordinator
      // gone); read to its end so that Finish gives the coordinator's
      // status, not a cancellation of ours.
      while (stream->Read(&cmd)) {
      }
    }
    connected_ = false;
    grpc::Status st;
    {
      absl::MutexLock l(&stream_mu_);
      stream_ = nullptr;
      st = stream->Finish();  // the call has ended: Read returned false
      ctx_.reset();
    }
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    if (Clock::now() - connected_at > std::chrono::seconds(10)) backoff = 0.2;
    spdlog::warn("agent {}: stream to {} closed ({}: {}); reconnecting in {:.1f} s", node_,
                 opt_.coordinator_address, static_cast<int>(st.error_code()),
                 st.error_message(), backoff);
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      spdlog::error("agent {}: the coordinator rejected the token; --token-file must be a copy of "
                    "the coordinator's STATE_DIR/agent-token (not STATE_DIR/token, the user's)",
                    node_);
    }
    if (!SleepFor(backoff)) return;
    backoff = std::min(backoff * 2, 5.0);
  }
}

void Agent::Impl::HeartbeatLoop() {
  auto last_sweep = Clock::now();
  while (SleepFor(opt_.heartbeat_interval_s)) {
    // Rank token files no rank needs any more (rank_process.h), every 30 s.
    if (Clock::now() - last_sweep > std::chrono::seconds(30)) {
      last_sweep = Clock::now();
      if (int n = SweepRankTokens(opt_.state_dir, kRankTokenMaxAgeSeconds); n > 0) {
        spdlog::info("agent {}: removed {} rank token file(s) past their use", node_, n);
      }
    }
    if (!connected_.load()) continue;
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_time_unix_ms(NowUnixMs());
    for (const auto& r : Running()) *m.mutable_heartbeat()->add_running() = r;
    Send(m);
  }
}

void Agent::Impl::RequestCheckpoint(int sig) {
  // The ranks got the signal too (Slurm signals every process of the step)
  // and only note it: one rank saving on its own would not make a whole
  // checkpoint. The coordinator picks one step for all of them.
  if (opt_.bound_job.empty()) return;
  v1::AgentMessage m;
  m.mutable_checkpoint()->set_job_id(opt_.bound_job);
  m.mutable_checkpoint()->set_reason(absl::StrCat("signal ", sig, " from the cluster scheduler to ",
                                                  node_, " (its time limit is near)"));
  if (!Send(m)) spdlog::warn("agent {}: could not ask for a checkpoint (not connected)", node_);
}

std::vector<v1::RunningRank> Agent::Impl::Running() const {
  absl::MutexLock l(&mu_);
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
        absl::MutexLock g(&mu_);
        if (stopping_ || stop_called_) break;
        auto supervised = [&](const v1::RunningRank& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    case v1::CoordinatorCommand::kRelease: {
      // A bound agent's job is done with this allocation: its ranks go, then
      // the program exits, which ends the Slurm step.
      spdlog::info("agent {}: released by the coordinator: {}", node_, cmd.release().reason());
      if (!opt_.bound_job.empty()) StopJob(opt_.bound_job, 3.0);
      if (opt_.on_release) opt_.on_release(cmd.release().reason());
      break;
    }
    default:
      spdlog::warn("agent {}: ignoring an empty or unknown command", node_);
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
void Agent::RequestCheckpoint(int sig) { impl_->RequestCheckpoint(sig); }

}  // namespace dgca
