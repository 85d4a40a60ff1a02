#include "coordinator/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/credentials.h"
#include "coordinator/job_store.h"
#include "dgca/v1/agent.grpc.pb.h"
#include "dgca/v1/coordinator.grpc.pb.h"
#include "dgca/v1/rank.grpc.pb.h"
#include "spec/spec.h"
#include "model/core/files.h"
#include "proto/rpc/rpc_util.h"
#include "spdlog/spdlog.h"
#include "worker/agent/agent.h"

namespace dgca {
namespace {

using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxTrailerBytes = 3000;

// The call's bearer token must be of `role` (credentials.h): otherwise
// UNAUTHENTICATED (none of ours) or PERMISSION_DENIED (another role's).
#define DGCA_AUTH(ctx, role)                                                          \
  do {                                                                                \
    if (absl::Status st_ = RequireRole(creds_->Identify(BearerToken(*(ctx))), role);  \
        !st_.ok()) {                                                                  \
      return ToGrpc(st_);                                                             \
    }                                                                                 \
  } while (0)

// A RankService call: the bearer must be the rank token of this job and
// attempt.
#define DGCA_RANK_AUTH(ctx, job, attempt)                                             \
  do {                                                                                \
    if (absl::Status st_ =                                                            \
            RequireRankOf(creds_->Identify(BearerToken(*(ctx))), job, attempt);       \
        !st_.ok()) {                                                                  \
      return ToGrpc(st_);                                                             \
    }                                                                                 \
  } while (0)

// A job id that cannot name a job (CheckJobId): INVALID_ARGUMENT without
// echoing it (an overlong id in the status message would overflow the
// client's metadata limit and read as a transport failure).
#define DGCA_JOB_ID(id)                                                   \
  do {                                                                    \
    if (absl::Status st_ = CheckJobId(id); !st_.ok()) return ToGrpc(st_); \
  } while (0)

bool IsTerminalState(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

// Milliseconds until the call's deadline, capped at `cap`.
std::chrono::milliseconds UntilDeadline(const ServerContext* ctx, std::chrono::milliseconds cap) {
  auto d = ctx->deadline();
  auto now = std::chrono::system_clock::now();
  if (d <= now) return std::chrono::milliseconds(0);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - now);
  return std::min(left, cap);
}

bool DeadlinePassed(const ServerContext* ctx) {
  return ctx->deadline() <= std::chrono::system_clock::now();
}

// INVALID_ARGUMENT carrying the problems in the message and, serialized,
// in the error details; both bounded (gRPC trailers are limited).
template <typename Resp>
Status ProblemsStatus(const Resp& full) {
  std::string msg = absl::StrCat("invalid job spec (", full.problems_size(), " problem",
                                 full.problems_size() == 1 ? "" : "s", "):\n");
  int shown = 0;
  for (const auto& p : full.problems()) {
    std::string line = FormatProblem(p);
    if (msg.size() + line.size() > kMaxTrailerBytes) break;
    msg += line;
    ++shown;
  }
  if (shown < full.problems_size()) {
    absl::StrAppend(&msg, "... and ", full.problems_size() - shown, " more\n");
  }
  Resp details;
  for (const auto& p : full.problems()) {
    if (details.ByteSizeLong() + p.ByteSizeLong() + 8 > kMaxTrailerBytes) break;
    *details.add_problems() = p;
  }
  return Status(StatusCode::INVALID_ARGUMENT, msg, details.SerializeAsString());
}

class CoordinatorServiceImpl final : public v1::Coordinator::Service {
 public:
  CoordinatorServiceImpl(Scheduler* s, const Credentials* creds) : s_(s), creds_(creds) {}

  Status SubmitJob(ServerContext* ctx, const v1::SubmitJobRequest* req,
                   v1::SubmitJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    auto r = s_->Submit(*req);
    if (!r.ok()) return ToGrpc(r.status());
    if (r->problems_size() > 0) return ProblemsStatus(*r);
    *resp = std::move(*r);
    return Status::OK;
  }

  Status GetJob(ServerContext* ctx, const v1::GetJobRequest* req,
                v1::GetJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    DGCA_JOB_ID(req->job_id());
    auto r = s_->GetJob(req->job_id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return Status::OK;
  }

  Status ListJobs(ServerContext* ctx, const v1::ListJobsRequest* req,
                  v1::ListJobsResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    auto r = s_->ListJobs(*req);
    if (!r.ok()) return ToGrpc(r.status());
    for (auto& j : *r) {
      // Keep the response under the message limit.
      if (resp->ByteSizeLong() + j.ByteSizeLong() > static_cast<size_t>(kMaxMessageBytes) - 4096) break;
      *resp->add_jobs() = std::move(j);
    }
    return Status::OK;
  }

  Status CancelJob(ServerContext* ctx, const v1::CancelJobRequest* req,
                   v1::CancelJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    DGCA_JOB_ID(req->job_id());
    bool already_ended = false;
    auto r = s_->Cancel(req->job_id(), UntilDeadline(ctx, std::chrono::milliseconds(8000)),
                        &already_ended);
    if (!r.ok()) return ToGrpc(r.status());
    *resp->mutable_job() = std::move(*r);
    resp->set_already_ended(already_ended);
    return Status::OK;
  }

  Status WatchJob(ServerContext* ctx, const v1::WatchJobRequest* req,
                  grpc::ServerWriter<v1::WatchJobResponse>* writer) override {
    DGCA_AUTH(ctx, Role::kUser);
    DGCA_JOB_ID(req->job_id());
    auto sub = s_->Watch(req->job_id(), req->after_event_seq());
    if (!sub.ok()) return ToGrpc(sub.status());
    int64_t last_seq = req->after_event_seq();
    while (!ctx->IsCancelled() && !DeadlinePassed(ctx) && !s_->shutting_down()) {
      v1::WatchJobResponse u;
      if (!(*sub)->Next(&u, std::chrono::milliseconds(200))) continue;
      if (u.has_event()) {
        if (u.event().seq() <= last_seq) continue;  // replay overlap
        last_seq = u.event().seq();
      }
      if (!writer->Write(u)) break;
      if (u.has_snapshot() && IsTerminalState(u.snapshot().state())) break;
    }
    s_->Unwatch(req->job_id(), *sub);
    return Status::OK;
  }

  Status GetLogs(ServerContext* ctx, const v1::GetLogsRequest* req,
                 grpc::ServerWriter<v1::GetLogsResponse>* writer) override {
    DGCA_AUTH(ctx, Role::kUser);
    DGCA_JOB_ID(req->job_id());
    auto path = s_->LogPath(req->job_id(), req->rank());
    if (!path.ok()) return ToGrpc(path.status());
    if (req->offset() < 0) return Status(StatusCode::INVALID_ARGUMENT, "offset must be >= 0");
    const int64_t max = req->max_bytes() <= 0 || req->max_bytes() > (1 << 20) ? (1 << 20)
                                                                              : req->max_bytes();
    int64_t offset = req->offset();
    std::string buf;
    while (true) {
      bool terminal = s_->IsTerminal(req->job_id());
      int fd = open(path->c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (!req->follow() || terminal) {
          return Status(StatusCode::NOT_FOUND,
                        absl::StrCat("no log for job ", req->job_id(), " rank ", req->rank(), " at ",
                                     *path, " (the rank never started here, or it ran on a remote "
                                     "node whose logs stay in that node's state dir)"));
        }
      } else {
        bool sent_eof = false;
        while (true) {
          buf.resize(max);
          ssize_t n = pread(fd, buf.data(), max, offset);
          if (n < 0) {
            close(fd);
            return Status(StatusCode::INTERNAL, absl::StrCat("reading ", *path, ": ", strerror(errno)));
          }
          buf.resize(n);
          v1::GetLogsResponse chunk;
          offset += n;
          bool at_end = n < max;
          bool eof = at_end && (!req->follow() || terminal);
          if (n == 0 && !eof) break;  // following: nothing new yet
          chunk.set_data(buf);
          chunk.set_next_offset(offset);
          chunk.set_eof(eof);
          if (!writer->Write(chunk)) {
            close(fd);
            return Status::OK;
          }
          if (eof) { sent_eof = true; break; }
          if (at_end) break;
        }
        close(fd);
        if (sent_eof) return Status::OK;
      }
      if (ctx->IsCancelled() || DeadlinePassed(ctx) || s_->shutting_down()) return Status::OK;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  Status ListNodes(ServerContext* ctx, const v1::ListNodesRequest*,
                   v1::ListNodesResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    for (auto& n : s_->ListNodes()) *resp->add_nodes() = std::move(n);
    return Status::OK;
  }

  Status ForgetNode(ServerContext* ctx, const v1::ForgetNodeRequest* req,
                    v1::ForgetNodeResponse*) override {
    DGCA_AUTH(ctx, Role::kUser);
    if (req->node().empty()) {
      return Status(StatusCode::INVALID_ARGUMENT, "ForgetNode: node is empty (a name from dgca nodes)");
    }
    return ToGrpc(s_->ForgetNode(req->node()));
  }

  Status DeleteJob(ServerContext* ctx, const v1::DeleteJobRequest* req,
                   v1::DeleteJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    if (req->job_id().empty()) {
      return Status(StatusCode::INVALID_ARGUMENT, "DeleteJob: job_id is empty (a job from dgca list)");
    }
    DGCA_JOB_ID(req->job_id());
    auto r = s_->DeleteJob(req->job_id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(r).value();
    return Status::OK;
  }

  Status DiagnoseJob(ServerContext* ctx, const v1::DiagnoseJobRequest* req,
                     v1::DiagnoseJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    if (req->job_id().empty()) {
      return Status(StatusCode::INVALID_ARGUMENT, "DiagnoseJob: job_id is empty (a job from dgca list)");
    }
    DGCA_JOB_ID(req->job_id());
    auto r = s_->DiagnoseJob(req->job_id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(r).value();
    return Status::OK;
  }

  Status PlanJob(ServerContext* ctx, const v1::PlanJobRequest* req,
                 v1::PlanJobResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    auto r = s_->PlanJob(*req);
    if (!r.ok()) return ToGrpc(r.status());
    if (r->problems_size() > 0) return ProblemsStatus(*r);
    *resp = std::move(*r);
    return Status::OK;
  }

  Status GetTopology(ServerContext* ctx, const v1::GetTopologyRequest* req,
                     v1::GetTopologyResponse* resp) override {
    DGCA_AUTH(ctx, Role::kUser);
    bool found = false;
    for (auto& n : s_->ListNodes()) {
      if (!req->node().empty() && n.name() != req->node()) continue;
      found = true;
      v1::Topology t = n.topology();
      if (t.node().empty()) t.set_node(n.name());
      *resp->add_nodes() = std::move(t);
    }
    if (!req->node().empty() && !found) {
      return Status(StatusCode::NOT_FOUND, absl::StrCat("no node named ", req->node(),
                                                        " has registered (see dgca nodes)"));
    }
    return Status::OK;
  }

 private:
  Scheduler* s_;
  const Credentials* creds_;
};

class AgentServiceImpl final : public v1::AgentService::Service {
 public:
  AgentServiceImpl(Scheduler* s, const Credentials* creds) : s_(s), creds_(creds) {}

  Status Connect(ServerContext* ctx,
                 grpc::ServerReaderWriter<v1::CoordinatorCommand, v1::AgentMessage>* stream) override {
    DGCA_AUTH(ctx, Role::kAgent);
    v1::AgentMessage first;
    if (!stream->Read(&first)) {
      return Status(StatusCode::INVALID_ARGUMENT, "the agent stream closed before RegisterAgent");
    }
    if (!first.has_register_()) {
      return Status(StatusCode::INVALID_ARGUMENT, "the first agent message must be RegisterAgent");
    }
    const std::string node = first.register_().node();
    auto conn = std::make_shared<AgentConnection>(
        [stream](const v1::CoordinatorCommand& c) { return stream->Write(c); });
    absl::Status st = s_->AgentRegistered(first.register_(), ctx->peer(), conn);
    if (!st.ok()) return ToGrpc(st);
    v1::AgentMessage m;
    while (stream->Read(&m)) {
      switch (m.msg_case()) {
        case v1::AgentMessage::kHeartbeat:
          s_->AgentHeartbeat(node, m.heartbeat());
          break;
        case v1::AgentMessage::kRankExited:
          s_->RankExited(node, m.rank_exited());
          break;
        case v1::AgentMessage::kCheckpoint:
          s_->CheckpointRequested(node, m.checkpoint());
          break;
        case v1::AgentMessage::kLeaving:
          s_->AgentLeaving(node, conn, m.leaving());
          break;
        case v1::AgentMessage::kRegister:
          if (m.register_().node() == node) {
            (void)s_->AgentRegistered(m.register_(), ctx->peer(), conn);
          }
          break;
        default:
          break;
      }
    }
    s_->AgentDisconnected(node, conn);  // no Write on `stream` after this
    return Status::OK;
  }

 private:
  Scheduler* s_;
  const Credentials* creds_;
};

class RankServiceImpl final : public v1::RankService::Service {
 public:
  RankServiceImpl(Scheduler* s, const Credentials* creds) : s_(s), creds_(creds) {}

  Status GetAssignment(ServerContext* ctx, const v1::GetAssignmentRequest* req,
                       v1::GetAssignmentResponse* resp) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    auto r = s_->GetAssignment(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return Status::OK;
  }

  Status StoreSet(ServerContext* ctx, const v1::StoreSetRequest* req, v1::StoreSetResponse*) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    if (absl::Status st = s_->CheckCurrentAttempt(req->job_id(), req->attempt()); !st.ok()) {
      return ToGrpc(st);
    }
    return ToGrpc(s_->rendezvous().Set(req->job_id(), req->attempt(), req->key(), req->value()));
  }

  Status StoreGet(ServerContext* ctx, const v1::StoreGetRequest* req,
                  v1::StoreGetResponse* resp) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    if (absl::Status st = s_->CheckCurrentAttempt(req->job_id(), req->attempt()); !st.ok()) {
      return ToGrpc(st);
    }
    auto r = s_->rendezvous().Get(req->job_id(), req->attempt(), req->key());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_found(r->has_value());
    if (r->has_value()) resp->set_value(**r);
    return Status::OK;
  }

  Status StoreWait(ServerContext* ctx, const v1::StoreWaitRequest* req,
                   v1::StoreWaitResponse*) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    if (absl::Status st = s_->CheckCurrentAttempt(req->job_id(), req->attempt()); !st.ok()) {
      return ToGrpc(st);
    }
    double t = req->timeout_seconds() > 0 ? std::min(req->timeout_seconds(), 3600.0) : 300.0;
    auto timeout = UntilDeadline(ctx, std::chrono::milliseconds(static_cast<int64_t>(t * 1000)));
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    if (keys.size() > 4096) return Status(StatusCode::INVALID_ARGUMENT, "at most 4096 keys");
    return ToGrpc(s_->rendezvous().Wait(req->job_id(), req->attempt(), keys, timeout,
                                        [ctx] { return ctx->IsCancelled(); }));
  }

  Status StoreAdd(ServerContext* ctx, const v1::StoreAddRequest* req,
                  v1::StoreAddResponse* resp) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    if (absl::Status st = s_->CheckCurrentAttempt(req->job_id(), req->attempt()); !st.ok()) {
      return ToGrpc(st);
    }
    auto r = s_->rendezvous().Add(req->job_id(), req->attempt(), req->key(), req->delta());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_value(*r);
    return Status::OK;
  }

  Status Heartbeat(ServerContext* ctx, const v1::RankHeartbeatRequest* req,
                   v1::RankHeartbeatResponse* resp) override {
    DGCA_RANK_AUTH(ctx, req->job_id(), req->attempt());
    *resp = s_->RankHeartbeat(*req);
    return Status::OK;
  }

  Status StreamMetrics(ServerContext* ctx, grpc::ServerReader<v1::MetricSample>* reader,
                       v1::StreamMetricsResponse* resp) override {
    const Caller caller = creds_->Identify(BearerToken(*ctx));
    if (absl::Status st = RequireRole(caller, Role::kRank); !st.ok()) return ToGrpc(st);
    v1::MetricSample m;
    int64_t n = 0;
    while (reader->Read(&m)) {
      // Every sample must be of the caller's own job and attempt: a rank
      // token cannot feed another job's numbers.
      if (absl::Status st = CheckSampleOf(caller, m); !st.ok()) return ToGrpc(st);
      ++n;
      // Evals, comm rows and log lines carry no attempt: those of an
      // attempt the job is no longer at (a rank being stopped, a leftover
      // token) are dropped. Steps and final losses carry theirs, and the
      // scheduler sets stale ones aside itself.
      if (!m.has_step() && !m.has_finished() &&
          !s_->CheckCurrentAttempt(caller.job_id, caller.attempt).ok()) {
        continue;
      }
      s_->IngestSample(m, caller.job_id);
    }
    resp->set_received(n);
    return Status::OK;
  }

 private:
  // The job (and, where the sample carries one, the attempt) a metric
  // sample speaks for must be the caller's.
  static absl::Status CheckSampleOf(const Caller& caller, const v1::MetricSample& m) {
    switch (m.kind_case()) {
      case v1::MetricSample::kStep:
        return RequireRankOf(caller, m.step().job_id(), m.step().attempt());
      case v1::MetricSample::kFinished:
        return RequireRankOf(caller, m.finished().job_id(), m.finished().attempt());
      case v1::MetricSample::kEval:
        return RequireRankOf(caller, m.eval().job_id(), caller.attempt);
      case v1::MetricSample::kProbeRow:
        return RequireRankOf(caller, m.probe_row().job_id(), caller.attempt);
      default:
        return absl::OkStatus();  // a log line: the caller's job
    }
  }
  Scheduler* s_;
  const Credentials* creds_;
};

std::string DefaultWorkerBinary() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "dgca-worker";
  std::string exe(buf, n);
  std::string dir = exe.substr(0, exe.rfind('/'));
  for (const std::string& c : {dir + "/dgca-worker", dir + "/../worker/dgca-worker"}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "dgca-worker";  // PATH
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --listen and --metrics-listen as HOST:PORT.
absl::Status CheckListenAddresses(const CoordinatorServerOptions& options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state-dir must not be empty");
  if (absl::Status st = CheckHostPort(options.listen, 0, /*allow_empty_host=*/true); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", st.message()));
  }
  if (!options.metrics_listen.empty()) {
    if (absl::Status st = CheckHostPort(options.metrics_listen, 0, /*allow_empty_host=*/true);
        !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", st.message()));
    }
  }
  return absl::OkStatus();
}

// Creates the state dir when missing and returns its real path, locked for
// this process (*lock_fd holds the flock on STATE_DIR/coordinator.lock).
absl::StatusOr<std::string> OpenStateDir(const std::string& dir, int* lock_fd) {
  if (dgca::Status st = MakeDirectories(dir, 0700); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("state dir: ", st.message()));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot use state dir ", dir, ": ", strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-dir ", dir, " is not a directory; give a directory (it is created when "
        "missing)"));
  }
  char real[PATH_MAX];
  if (realpath(dir.c_str(), real) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot resolve state dir ", dir));
  }
  const std::string lock_path = std::string(real) + "/coordinator.lock";
  *lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (*lock_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", lock_path, ": ", strerror(errno)));
  }
  if (flock(*lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another dgca-coordinator is using state dir ", real,
        " (see its coordinator.json); stop it or use another --state-dir"));
  }
  return std::string(real);
}

// How `dir` shows that a coordinator used it before this start: what a
// missing or empty job store there would otherwise hide. "" when it looks
// new. coordinator.json is written by every start that got as far as
// opening the store; jobs/ holds the embedded agent's rank logs.
std::string EarlierUse(const std::string& dir) {
  if (access((dir + "/coordinator.json").c_str(), F_OK) == 0) {
    return dir + "/coordinator.json exists, written by every coordinator started here";
  }
  DIR* jobs = opendir((dir + "/jobs").c_str());
  if (jobs == nullptr) return "";
  std::string first;
  while (dirent* e = readdir(jobs)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      first = e->d_name;
      break;
    }
  }
  closedir(jobs);
  if (first.empty()) return "";
  return absl::StrCat(dir, "/jobs holds job folders (", first, ", ...)");
}

// Group or other access to the state dir (job store, rank logs) or to a
// secret in it is said at every start, loudly, and left as it is: a state
// dir on a shared filesystem may be opened to a group on purpose, and
// tightening it behind the operator's back would lock out agents reading
// their token. `grants` says what a reader of the file can do.
void WarnIfOpenToOthers(const std::string& path, const char* grants) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  const std::string mode = absl::StrFormat("%04o", st.st_mode & 07777);
  if (grants != nullptr) {
    spdlog::warn("WARNING: token file {} has mode {}: other users on this machine can read it and "
                 "{}; `chmod 600 {}` fixes it",
                 path, mode, grants, path);
  } else {
    spdlog::warn("WARNING: state dir {} has mode {}: other users on this machine can reach its job "
                 "store, rank logs and tokens; `chmod 700 {}` fixes it",
                 path, mode, path);
  }
}

// Plaintext, or TLS from --tls-cert and --tls-key.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsOf(
    const CoordinatorServerOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  auto cert = ReadAll(options.tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadAll(options.tls_key);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

// HOST:PORT for agents on other machines: the listen host, or this
// machine's hostname when it listens on every address.
std::string AdvertisedAddress(const std::string& host, int port) {
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "[::]" || h == "::") {
    char buf[256] = {0};
    h = gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] ? buf : "127.0.0.1";
  }
  return absl::StrCat(h, ":", port);
}

// STATE_DIR/coordinator.json, written atomically.
absl::Status WriteCoordinatorJson(const std::string& state_dir, const std::string& address,
                                  const std::string& metrics_address) {
  const std::string tmp = state_dir + "/coordinator.json.tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << "{\"listen\": \"" << address << "\", \"metrics\": \"" << metrics_address
      << "\", \"pid\": " << getpid() << "}\n";
  out.close();
  if (!out || rename(tmp.c_str(), (state_dir + "/coordinator.json").c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot write ", state_dir, "/coordinator.json: ", std::strerror(err),
        err == ENOSPC ? " (the state dir's file system is full: free space there and start "
                        "again; nothing stored was changed)"
                      : ""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->opt_ = options;
  if (absl::Status st = CheckListenAddresses(options); !st.ok()) return st;
  auto dir = OpenStateDir(options.state_dir, &s->lock_fd_);
  if (!dir.ok()) return dir.status();
  s->state_dir_ = *dir;
  // A used state dir without its store has lost its job history: refused
  // unless the operator starts an empty store on purpose (--new-store).
  if (const std::string used = EarlierUse(s->state_dir_); !used.empty()) {
    absl::Status st = JobStore::RequireExisting(s->state_dir_ + "/dgca.db", used);
    if (!st.ok() && !options.new_store) return st;
    if (!st.ok()) {
      spdlog::warn("starting an empty job store in {} (--new-store), although {}", s->state_dir_,
                   used);
    }
  }
  WarnIfOpenToOthers(s->state_dir_, /*grants=*/nullptr);
  auto credentials = Credentials::Load(s->state_dir_);
  if (!credentials.ok()) return credentials.status();
  s->creds_ = std::make_unique<Credentials>(std::move(*credentials));
  WarnIfOpenToOthers(absl::StrCat(s->state_dir_, "/", kUserTokenFile),
                     "act as the CLI (submit, cancel and delete jobs)");
  WarnIfOpenToOthers(absl::StrCat(s->state_dir_, "/", kAgentTokenFile),
                     "act as a node agent (take ranks, report their exits)");
  WarnIfOpenToOthers(absl::StrCat(s->state_dir_, "/", kRankKeyFile),
                     "mint any job's rank tokens (join and disturb its rendezvous)");

  s->hub_ = std::make_unique<MetricsHub>();
  SchedulerOptions so;
  so.state_dir = s->state_dir_;
  so.heartbeat_timeout_s = options.heartbeat_timeout_s;
  so.agent_timeout_s = options.agent_timeout_s;
  so.rank_outage_limit_s = options.rank_outage_limit_s;
  so.stop_grace_s = options.stop_grace_s;
  so.restart_node_wait_s = options.restart_node_wait_s;
  so.link_prior_busbw = options.link_prior_busbw;
  so.slurm.bin_dir = options.slurm_bin_dir;
  so.rank_token = [c = s->creds_.get()](const std::string& job, int32_t attempt) {
    return c->RankToken(job, attempt);
  };
  if (options.local_agent) {
    // Ranks run on this node: submissions are checked for their files here
    // (the embedded agent registers under this name, StartLocalAgent).
    char host[256] = {0};
    so.input_check_node = !options.node_name.empty()                       ? options.node_name
                          : gethostname(host, sizeof(host) - 1) == 0 && host[0] ? std::string(host)
                                                                           : std::string("localhost");
  }
  auto sched = Scheduler::Create(so, s->hub_.get());
  if (!sched.ok()) return sched.status();
  s->scheduler_ = std::move(*sched);

  if (!options.metrics_listen.empty()) {
    auto m = s->hub_->StartExposer(options.metrics_listen);
    if (!m.ok()) return m.status();
    s->metrics_address_ = *m;
  }
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  auto creds = ServerCredentialsOf(options);
  if (!creds.ok()) return creds.status();
  const std::string sock = s->state_dir_ + "/coordinator.sock";
  auto port = s->Serve(*creds, tls ? sock : "");
  if (!port.ok()) return port.status();
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  s->address_ = absl::StrCat(host, ":", *port);
  {
    // What a cluster scheduler's agents need to call back (docs/slurm.md).
    LauncherOptions lo;
    lo.advertise_address = options.advertise.empty() ? AdvertisedAddress(host, *port)
                                                     : options.advertise;
    lo.token_file = absl::StrCat(s->state_dir_, "/", kAgentTokenFile);
    lo.tls_ca_file = options.slurm_tls_ca;
    lo.worker_binary =
        options.worker_binary.empty() ? DefaultWorkerBinary() : options.worker_binary;
    lo.state_dir = s->state_dir_;
    s->scheduler_->ConfigureLaunchers(lo);
  }
  s->scheduler_->Start();
  if (absl::Status st = WriteCoordinatorJson(s->state_dir_, s->address_, s->metrics_address_);
      !st.ok()) {
    return st;
  }
  if (options.local_agent) {
    // The embedded agent reaches this server over the unix socket with TLS
    // (it has no client certificate to show), else over the TCP port.
    std::string local_host = host;
    if (local_host.empty() || local_host == "0.0.0.0" || local_host == "[::]" || local_host == "::") {
      local_host = "127.0.0.1";
    }
    absl::Status st = s->StartLocalAgent(tls ? "unix:" + sock : absl::StrCat(local_host, ":", *port));
    if (!st.ok()) return st;
  }
  spdlog::info("dgca-coordinator state in {}", s->state_dir_);
  s->started_ = true;
  return s;
}

absl::StatusOr<int> CoordinatorServer::Serve(std::shared_ptr<grpc::ServerCredentials> creds,
                                             const std::string& unix_socket) {
  services_.push_back(std::make_unique<CoordinatorServiceImpl>(scheduler_.get(), creds_.get()));
  services_.push_back(std::make_unique<AgentServiceImpl>(scheduler_.get(), creds_.get()));
  services_.push_back(std::make_unique<RankServiceImpl>(scheduler_.get(), creds_.get()));
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same
  // port would start and take half the connections. One owner per port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(opt_.listen, std::move(creds), &port);
  if (!unix_socket.empty()) {
    unlink(unix_socket.c_str());
    builder.AddListeningPort("unix:" + unix_socket, grpc::InsecureServerCredentials());
  }
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (auto& svc : services_) builder.RegisterService(svc.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", opt_.listen,
        ": the address is in use (another dgca-coordinator or program on that port?) or not an "
        "address of this machine; use another --listen"));
  }
  return port;
}

absl::Status CoordinatorServer::StartLocalAgent(const std::string& coordinator_address) {
  AgentOptions ao;
  ao.coordinator_address = coordinator_address;
  ao.token = creds_->agent_token();
  ao.node_name = opt_.node_name;
  ao.state_dir = state_dir_;
  ao.worker_binary = opt_.worker_binary.empty() ? DefaultWorkerBinary() : opt_.worker_binary;
  ao.rank_argv_override = opt_.rank_argv_override;
  // Ranks the previous coordinator's embedded agent launched on this node
  // (it died with that process): supervised again.
  for (const StoredRank& r : scheduler_->RecoveredRanks()) {
    AgentOptions::AdoptRank a;
    a.node = r.node;
    a.rank.set_job_id(r.job_id);
    a.rank.set_rank(r.rank);
    a.rank.set_attempt(r.attempt);
    a.rank.set_pid(r.pid);
    ao.adopt.push_back(std::move(a));
  }
  agent_ = std::make_unique<Agent>(ao);
  if (absl::Status st = agent_->Start(); !st.ok()) return st;
  // The embedded agent's ranks' pids, as a remote agent's heartbeats carry them.
  Agent* agent = agent_.get();
  Scheduler* sch = scheduler_.get();
  poller_ = std::thread([this, agent, sch] {
    while (!stopping_.load()) {
      sch->RecordRunning(agent->node_name(), agent->Running());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  return absl::OkStatus();
}

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_ = true;
  if (poller_.joinable()) poller_.join();
  if (!started_) {
    // A failed start: no job is ended, no event written, no rank stopped;
    // the scheduler's destructor only stops its threads.
  } else if (opt_.keep_jobs_on_shutdown) {
    if (scheduler_) scheduler_->Detach();
    if (agent_) agent_->Detach();
  } else {
    if (scheduler_) scheduler_->Shutdown();
    if (agent_) agent_->Stop();
  }
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  agent_.reset();
  server_.reset();
  scheduler_.reset();
  if (lock_fd_ >= 0) close(lock_fd_);
}

}  // namespace dgca
