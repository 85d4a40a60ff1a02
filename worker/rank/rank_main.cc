#include "worker/rank/rank_main.h"

#include <signal.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dgca/v1/rank.grpc.pb.h"
#include "model/comm/comm_probe.h"
#include "model/comm/communicator.h"
#include "model/comm/gloo_communicator.h"
#include "model/comm/gloo_kv_store.h"
#include "model/comm/nccl_communicator.h"
#ifdef DGCA_HAVE_CUDA_TRAINER
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_train_device.h"
#endif
#include "model/core/strings.h"
#include "model/train/trainer.h"
#include "proto/rpc/rpc_util.h"
#include "worker/rank/gpu_metrics.h"
#include "worker/rank/process_memory.h"
#include "worker/rank/grpc_store.h"
#include "worker/rank/rank_phase_report.h"
#include "worker/rank/train_config.h"

namespace dgca {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signalled = 0;
// SIGUSR1: the cluster scheduler's warning that the time limit is near
// (Slurm sends it to every process of the step, docs/slurm.md). The agent
// asks the coordinator for a checkpoint step all ranks agree on; a rank on
// its own only notes it (its default action would end the rank).
volatile sig_atomic_t g_time_limit_warned = 0;

void OnTimeLimitWarning(int) { g_time_limit_warned = 1; }

void OnSignal(int sig) {
  if (g_signalled) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_signalled = sig;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// printf to stderr with a timestamp and the rank, flushed (it goes to a file).
template <typename... Args>
void Log(int rank, const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  std::string line = absl::StrFormat(fmt, args...);
  time_t t = time(nullptr);
  struct tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
  std::fprintf(stderr, "%s rank %d: %s\n", ts, rank, line.c_str());
  std::fflush(stderr);
}

bool IsAuthOrNetwork(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED ||
         c == grpc::StatusCode::UNAUTHENTICATED || c == grpc::StatusCode::PERMISSION_DENIED;
}

// Streams MetricSamples to the coordinator from its own thread. Push never
// blocks: with the queue full the oldest droppable sample goes.
class MetricsSender {
 public:
  MetricsSender(std::shared_ptr<grpc::Channel> channel, std::string token, int rank)
      : stub_(v1::RankService::NewStub(channel)), token_(std::move(token)), rank_(rank) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~MetricsSender() { Close(std::chrono::seconds(0)); }
  // True when Close left its thread running (see Close): the object must
  // then outlive it, i.e. never be destroyed.
  bool stuck() const { return stuck_; }

  void Push(v1::MetricSample s, bool droppable) {
    absl::MutexLock l(&mu_);
    if (queue_.size() >= kMaxQueue) {
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->droppable) {
          queue_.erase(it);
          ++dropped_;
          break;
        }
      }
    }
    if (queue_.size() >= kMaxQueue) {  // nothing droppable left: drop this one
      ++dropped_;
      return;
    }
    queue_.push_back({std::move(s), droppable});
  }

  // Sends what is queued (at most `timeout`), then closes the stream.
  void Close(std::chrono::milliseconds timeout) {
    int dropped = 0;
    {
      absl::MutexLock l(&mu_);
      if (closed_) return;
      closing_ = true;
      auto sent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !sending_; };
      const bool drained = mu_.AwaitWithTimeout(absl::Condition(&sent), absl::FromChrono(timeout));
      closed_ = true;
      // Drained: let the sender thread end the stream itself (WritesDone +
      // Finish returns once the coordinator has read, and so ingested, every
      // sample; cancelling here could drop the last ones, e.g. a probe's
      // rows). Bounded: cancelled after 2 s more.
      if (drained && ctx_) mu_.AwaitWithTimeout(absl::Condition(&finished_), absl::Seconds(2));
      if (ctx_ && !finished_) ctx_->TryCancel();
      dropped = dropped_;
      // A cancelled call ends at once, but a stream still being set up with
      // a coordinator that accepts connections and never answers (its
      // process stopped) may not: the rank must still exit, so the thread
      // is then left to the process's end (RunRank keeps this object alive).
      stuck_ = !mu_.AwaitWithTimeout(absl::Condition(&finished_), absl::Seconds(3));
    }
    if (stuck_) {
      thread_.detach();
      Log(rank_, "metrics: the stream to the coordinator did not close (it does not answer); "
                 "left to the process's exit");
    } else {
      thread_.join();
    }
    if (dropped > 0) Log(rank_, "metrics: %d samples dropped (queue full or coordinator away)",
                         dropped);
  }

 private:
  struct Item {
    v1::MetricSample sample;
    bool droppable;
  };
  static constexpr size_t kMaxQueue = 4096;

  void Loop() {
    std::unique_ptr<grpc::ClientWriter<v1::MetricSample>> writer;
    v1::StreamMetricsResponse resp;
    double backoff = 0.2;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || !queue_.empty() || closing_;
    };
    while (true) {
      Item item;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(&ready));
        if (closed_ || (closing_ && queue_.empty())) break;
        if (queue_.empty()) continue;
        item = queue_.front();
        queue_.pop_front();
        sending_ = true;
      }
      if (!writer) {
        auto ctx = std::make_shared<grpc::ClientContext>();
        AddAuth(ctx.get(), token_);
        {
          absl::MutexLock l(&mu_);
          ctx_ = ctx;
        }
        writer = stub_->StreamMetrics(ctx.get(), &resp);
      }
      if (!writer->Write(item.sample)) {
        grpc::Status s = writer->Finish();
        writer.reset();
        absl::MutexLock l(&mu_);
        ctx_.reset();
        queue_.push_front(item);
        sending_ = false;
        if (!warned_) {
          Log(rank_, "metrics stream closed (%s); retrying", s.error_message());
          warned_ = true;
        }
        mu_.AwaitWithTimeout(absl::Condition(&closed_), absl::Seconds(backoff));
        backoff = std::min(backoff * 2, 5.0);
        continue;
      }
      backoff = 0.2;
      absl::MutexLock l(&mu_);
      sending_ = false;
    }
    if (writer) {
      writer->WritesDone();
      writer->Finish();
    }
    absl::MutexLock l(&mu_);
    finished_ = true;
    ctx_.reset();
  }

  std::unique_ptr<v1::RankService::Stub> stub_;
  std::string token_;
  int rank_;
  // Waits are absl::Condition awaits: the mutex re-checks them on every
  // release, so no condition variable is signalled.
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_ = false;  // the sender thread's own
  bool stuck_ = false;   // Close's own
  int dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

class RankObserver : public TrainObserver {
 public:
  RankObserver(const RankArgs& a, MetricsSender* sender, std::atomic<bool>* stop,
               std::atomic<int64_t>* step, std::atomic<int64_t>* checkpoint_at, GpuMetrics* gpu,
               PhaseTracker* phases, DataStallHook stall)
      : a_(a), sender_(sender), stop_(stop), step_(step), checkpoint_at_(checkpoint_at), gpu_(gpu),
        phases_(phases), stall_(stall) {}

  PhaseTracker* phases() override { return phases_; }
  // DGCA_TEST_DATA_STALL (worker/rank/rank_phase_report.h): the trainer
  // calls OnBatch before it leaves its data phase, so waiting here is a
  // loader that has not delivered yet.
  void OnBatch(const Batch&, int64_t step, int micro) override {
    if (stall_.rank != a_.rank || stall_.step != step || micro != 0) return;
    Log(a_.rank, "DGCA_TEST_DATA_STALL: holding the data of step %d for %.1f s (test only)", step,
        stall_.seconds);
    const auto end = Clock::now() + std::chrono::duration<double>(stall_.seconds);
    while (Clock::now() < end && !StopRequested()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  void OnStep(const StepReport& r) override {
    step_->store(r.step);
    v1::MetricSample s;
    auto* m = s.mutable_step();
    m->set_job_id(a_.job_id);
    m->set_rank(a_.rank);
    m->set_step(r.step);
    m->set_total_steps(r.total_steps);
    m->set_loss(r.loss);
    for (const auto& [k, v] : r.loss_by_head) (*m->mutable_loss_by_head())[k] = v;
    m->set_learning_rate(r.learning_rate);
    m->set_grad_norm(r.grad_norm);
    m->set_samples_per_second(r.samples_per_second);
    m->set_step_seconds(r.step_seconds);
    m->set_data_wait_seconds(r.data_wait_seconds);
    m->set_allreduce_seconds(r.allreduce_seconds);
    m->set_exposed_comm_seconds(r.exposed_comm_seconds);
    m->set_bus_bandwidth_bytes_per_second(r.bus_bandwidth_bytes_per_second);
    // -1 = absent (CPU rank, no NVML): the coordinator exports no GPU series.
    GpuReading g = gpu_->Sample();  // NVML queried at most once per second
    const auto now = std::chrono::steady_clock::now();
    if (g.memory_used_bytes < 0 && device_memory_) {
      // No NVML (a container without the driver's library, the CUDA
      // emulator): the CUDA runtime's device memory in use instead, as
      // often.
      g.memory_used_bytes = device_used_.Get(now, device_memory_);
    }
    m->set_gpu_utilization_ratio(g.utilization_ratio);
    m->set_gpu_memory_used_bytes(g.memory_used_bytes);
    m->set_gpu_power_watts(g.power_watts);
    // /proc/self/status at most once per second, as NVML above (-1 where
    // /proc cannot say).
    m->set_host_memory_peak_bytes(host_peak_.Get(now, ProcessPeakResidentBytes));
    m->set_attention_kernels(r.attention_kernels);
    m->set_time_unix_ms(NowUnixMs());
    m->set_samples(r.samples);
    m->set_attempt(a_.attempt);
    sender_->Push(std::move(s), true);
    // The trainer's own step lines arrive through OnLog; nothing printed here.
  }
  void OnEval(const EvalReport& r) override {
    v1::MetricSample s;
    auto* e = s.mutable_eval();
    e->set_job_id(a_.job_id);
    e->set_rank(a_.rank);
    e->set_step(r.step);
    std::string line;
    for (const auto& [k, v] : r.metrics) {
      (*e->mutable_metrics())[k] = v;
      if (v >= 2 && v == static_cast<double>(static_cast<int64_t>(v))) {
        absl::StrAppendFormat(&line, " %s=%d", k, static_cast<int64_t>(v));  // a count
      } else {
        absl::StrAppendFormat(&line, " %s=%.4f", k, v);
      }
    }
    sender_->Push(std::move(s), false);
    Log(a_.rank, "eval at step %d (%d samples):%s", r.step, r.samples, line);
  }
  void OnLog(const std::string& line) override {
    v1::MetricSample s;
    s.set_log_line(line);
    sender_->Push(std::move(s), true);
    Log(a_.rank, "%s", line);
  }
  void OnCheckpoint(const std::string& dir, int64_t step) override {
    Log(a_.rank, "checkpoint at step %d: %s", step, dir);
  }
  bool StopRequested() override { return stop_->load() || g_signalled != 0; }
  int64_t CheckpointAtStep() override { return checkpoint_at_->load(); }
  // Device memory in use (bytes, -1 = unknown) for when NVML has no reading.
  void set_device_memory_reader(std::function<double()> f) { device_memory_ = std::move(f); }

 private:
  const RankArgs& a_;
  MetricsSender* sender_;
  std::atomic<bool>* stop_;
  std::atomic<int64_t>* step_;
  std::atomic<int64_t>* checkpoint_at_;  // from the heartbeats (0 = none)
  GpuMetrics* gpu_;
  PhaseTracker* phases_;
  DataStallHook stall_;
  // A value read at most once per second (the first call always reads; a
  // reading of -1, unknown, is kept as any other).
  class OncePerSecond {
   public:
    double Get(std::chrono::steady_clock::time_point now, const std::function<double()>& read) {
      if (!read_ || now - at_ >= std::chrono::seconds(1)) {
        value_ = read();
        at_ = now;
        read_ = true;
      }
      return value_;
    }

   private:
    double value_ = -1;
    std::chrono::steady_clock::time_point at_;
    bool read_ = false;
  };
  OncePerSecond host_peak_;                // /proc/self/status's VmHWM
  std::function<double()> device_memory_;  // null: no CUDA context
  OncePerSecond device_used_;              // device_memory_'s
};

// The comm probe job: one AllReduceSweep per size (so each row streams as soon
// as it is measured), every row sent to the coordinator and logged like a
// line of nccl-tests. Returns the exit code.
int RunProbe(const RankArgs& a, const v1::JobSpec& spec, Communicator* comm,
             MetricsSender* sender, RankObserver* observer, PhaseTracker* phases) {
  std::vector<size_t> sizes;
  for (int64_t b : spec.probe().sizes_bytes()) sizes.push_back(static_cast<size_t>(b));
  if (sizes.empty()) sizes = DefaultProbeSizes();
  size_t max_bytes = 0;
  for (size_t b : sizes) max_bytes = std::max(max_bytes, b);
  const size_t cap = std::max<size_t>(max_bytes / sizeof(float), 1);
  std::vector<float> host;
  DeviceBuffer device;
  float* buf = nullptr;
  if (comm->backend() == "nccl") {
    auto d = AllocateDeviceFloats(cap);
    if (!d.ok()) {
      Log(a.rank, "error: comm probe: %s", d.status().ToString());
      return kExitFailed;
    }
    device = std::move(*d);
    buf = device.get();
  } else {
    host.assign(cap, 1.0f);
    buf = host.data();
  }
  Log(a.rank, "%12s %12s %8s %12s %10s %10s", "size(B)", "count", "iters", "time(us)",
      "algbw GB/s", "busbw GB/s");
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t bytes = sizes[i];
    // Each size is progress: a long sweep is not a hang.
    phases->Enter(TrainPhase::kAllReduce, 0, static_cast<int32_t>(i + 1),
                  static_cast<int32_t>(sizes.size()), static_cast<int64_t>(bytes));
    if (observer->StopRequested()) {
      Log(a.rank, "comm probe stopped before %d bytes", bytes);
      return kExitStopped;
    }
    ProbeOptions po;
    po.sizes_bytes = {bytes};
    auto rows = AllReduceSweep(comm, buf, cap, po);
    if (!rows.ok()) {
      Log(a.rank, "error: comm probe at %d bytes: %s", bytes, rows.status().ToString());
      return kExitFailed;
    }
    for (const BusBwRow& r : *rows) {
      v1::MetricSample s;
      auto* p = s.mutable_probe_row();
      p->set_job_id(a.job_id);
      p->set_rank(a.rank);
      p->set_world_size(comm->world_size());
      p->set_backend(comm->backend());
      p->set_bytes(static_cast<int64_t>(r.bytes));
      p->set_count(static_cast<int64_t>(r.bytes / sizeof(float)));
      p->set_iters(r.iters);
      p->set_seconds_per_op(r.seconds_per_op);
      p->set_algbw_bytes_per_second(r.algbw);
      p->set_busbw_bytes_per_second(r.busbw);
      p->set_time_unix_ms(NowUnixMs());
      sender->Push(std::move(s), false);
      Log(a.rank, "%12d %12d %8d %12.1f %10.3f %10.3f", r.bytes, r.bytes / sizeof(float),
          r.iters, r.seconds_per_op * 1e6, r.algbw / 1e9, r.busbw / 1e9);
    }
  }
  Log(a.rank, "comm probe finished: %d sizes", sizes.size());
  return kExitOk;
}

}  // namespace

void InstallRankSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction usr1 {};
  usr1.sa_handler = OnTimeLimitWarning;
  sigemptyset(&usr1.sa_mask);
  usr1.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &usr1, nullptr);
}

int RunRank(const RankArgs& a) {
  Log(a.rank, "job %s attempt %d, coordinator %s, pid %d", a.job_id, a.attempt, a.coordinator,
      static_cast<int>(getpid()));
  auto token = ReadTokenFile(a.token_file);
  if (!token.ok()) {
    Log(a.rank, "error: %s", token.status().ToString());
    return kExitUnreachable;
  }
  auto channel = MakeChannel(a.coordinator, a.tls_ca_file);
  auto stub = v1::RankService::NewStub(channel);

  // Assignment, retried while the coordinator is away (it may be restarting).
  v1::GetAssignmentResponse asg;
  {
    auto deadline = Clock::now() + std::chrono::duration<double>(a.heartbeat_timeout_s);
    double backoff = 0.2;
    while (true) {
      grpc::ClientContext ctx;
      AddAuth(&ctx, *token);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::GetAssignmentRequest req;
      req.set_job_id(a.job_id);
      req.set_rank(a.rank);
      req.set_attempt(a.attempt);
      grpc::Status s = stub->GetAssignment(&ctx, req, &asg);
      if (s.ok()) break;
      bool retry = (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
                   Clock::now() < deadline;
      if (!retry) {
        Log(a.rank, "error: GetAssignment failed: %s (code %d)", s.error_message(),
            static_cast<int>(s.error_code()));
        return IsAuthOrNetwork(s.error_code()) ? kExitUnreachable : kExitUsage;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 2.0);
    }
  }
  const int world = asg.world_size() > 0 ? asg.world_size() : 1;
  // kind: comm_probe (dgca diagnose comm): the all-reduce sweep instead of
  // training; no model, no data.
  const bool probe = asg.spec().kind() == "comm_probe";
  const bool nccl = asg.plan().backend() == "nccl";
  absl::StatusOr<TrainConfig> cfg = probe ? absl::StatusOr<TrainConfig>(TrainConfig())
                                    : TrainConfigFromSpec(asg.spec(), asg.plan());
  if (!cfg.ok()) {
    Log(a.rank, "error: bad job configuration: %s", cfg.status().message());
    return kExitUsage;
  }
  cfg->checkpoint_dir = asg.checkpoint_dir();
  cfg->resume_from = asg.resume_from();
  if (probe) {
    cfg->comm_timeout_s = asg.spec().comm().timeout_s() > 0 ? asg.spec().comm().timeout_s() : 60.0;
    Log(a.rank, "world %d, %s backend, comm probe (all-reduce sweep of %d sizes)", world,
        nccl ? "nccl" : world > 1 ? "gloo" : "local",
        asg.spec().probe().sizes_bytes_size() > 0 ? asg.spec().probe().sizes_bytes_size()
                                                  : static_cast<int>(DefaultProbeSizes().size()));
  } else Log(a.rank, "world %d, %s backend, %d layers H=%d, dropout %g/%g (hidden/attention), "
      "micro_batch %d x accumulation %d, %d steps, %d threads%s",
      world, nccl ? "nccl" : world > 1 ? "gloo" : "local", cfg->model.layers, cfg->model.hidden,
      cfg->model.hidden_dropout, cfg->model.attention_dropout, cfg->micro_batch,
      cfg->accumulation, cfg->steps, cfg->threads,
      cfg->resume_from.empty() ? "" : absl::StrCat(", resuming from ", cfg->resume_from));

  // The training thread's phase, sent with every heartbeat (hang diagnosis,
  // docs/operations.md "Hangs").
  PhaseTracker phases;
  phases.Enter(TrainPhase::kStarting, 0);
  DataStallHook stall;
  if (const char* v = getenv("DGCA_TEST_DATA_STALL"); v != nullptr && *v) {
    auto h = ParseDataStallHook(v);
    if (!h.ok()) {
      Log(a.rank, "error: %s", h.status().message());
      return kExitUsage;
    }
    stall = *h;
  }

  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  std::atomic<bool> unreachable{false};
  std::atomic<bool> rejected{false};
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> checkpoint_at{0};  // RankHeartbeatResponse.checkpoint_at_step
  struct StopReason {
    absl::Mutex mu;
    std::string text ABSL_GUARDED_BY(mu);
  } stop_reason;

  // Heartbeats. While the coordinator is unreachable (restarting, upgraded,
  // the network broken) training goes on for up to the coordinator's
  // outage limit: steps are the rank's, the coordinator only watches them.
  const double outage_limit_s = asg.coordinator_outage_limit_seconds() > 0
                                    ? asg.coordinator_outage_limit_seconds()
                                    : a.heartbeat_timeout_s;
  absl::Mutex hb_mu;  // for its waits only: `done` is atomic
  std::thread heartbeat([&] {
    auto last_ok = Clock::now();
    bool away = false;  // the last heartbeat failed
    auto finished = [&] { return done.load(); };
    while (true) {
      {
        absl::MutexLock l(&hb_mu);
        hb_mu.AwaitWithTimeout(absl::Condition(&finished), absl::Seconds(a.heartbeat_interval_s));
        if (done.load()) return;
      }
      if (g_time_limit_warned) {
        g_time_limit_warned = 0;
        Log(a.rank, "SIGUSR1: the time limit is near; checkpointing at the step the coordinator "
                    "picks for all ranks");
      }
      grpc::ClientContext ctx;
      AddAuth(&ctx, *token);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::RankHeartbeatRequest req;
      req.set_job_id(a.job_id);
      req.set_rank(a.rank);
      req.set_attempt(a.attempt);
      req.set_step(step.load());
      *req.mutable_phase() = RankPhaseOf(phases.Read());
      req.set_heartbeat_interval_seconds(a.heartbeat_interval_s);
      v1::RankHeartbeatResponse resp;
      grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
      if (s.ok()) {
        if (away) {
          Log(a.rank, "coordinator back after %.0f s; at step %d",
              std::chrono::duration<double>(Clock::now() - last_ok).count(), step.load());
          away = false;
        }
        last_ok = Clock::now();
        if (resp.checkpoint_at_step() > 0 && resp.checkpoint_at_step() != checkpoint_at.load()) {
          Log(a.rank, "checkpoint asked for after step %d", resp.checkpoint_at_step());
          checkpoint_at = resp.checkpoint_at_step();
        }
        if (resp.stop() && !stop.load()) {
          absl::MutexLock l(&stop_reason.mu);
          stop_reason.text = resp.reason().empty() ? "the coordinator asked this rank to stop"
                                              : resp.reason();
          Log(a.rank, "stop requested by the coordinator: %s", stop_reason.text);
          stop = true;
        }
      } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                 s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                 s.error_code() == grpc::StatusCode::NOT_FOUND) {
        absl::MutexLock l(&stop_reason.mu);
        stop_reason.text = absl::StrCat("heartbeat rejected: ", s.error_message());
        Log(a.rank, "%s", stop_reason.text);
        rejected = true;  // not a stop request: exit 1
        stop = true;
      } else if (Clock::now() - last_ok > std::chrono::duration<double>(outage_limit_s)) {
        if (!unreachable.load()) {
          absl::MutexLock l(&stop_reason.mu);
          stop_reason.text = absl::StrFormat(
              "coordinator %s unreachable for more than %.0f s, its outage limit (%s)",
              a.coordinator, outage_limit_s, s.error_message());
          Log(a.rank, "%s; stopping", stop_reason.text);
          unreachable = true;
          stop = true;
        }
      } else if (!away) {
        away = true;
        Log(a.rank, "coordinator unreachable (%s); training on, for up to %.0f s",
            s.error_message(), outage_limit_s);
      }
    }
  });
  auto finish_heartbeat = [&] {
    {
      absl::MutexLock l(&hb_mu);
      done = true;
    }
    if (heartbeat.joinable()) heartbeat.join();
  };

  // Destroyed at the end unless Close left its thread stuck in a call (then
  // deliberately leaked: the thread still uses it until the process exits).
  std::unique_ptr<MetricsSender, void (*)(MetricsSender*)> sender_holder(
      new MetricsSender(channel, *token, a.rank), [](MetricsSender* s) {
        if (!s->stuck()) delete s;
      });
  MetricsSender& sender = *sender_holder;
  // Ends the rank before training: stops heartbeats, sends what is queued.
  auto give_up = [&](int code) {
    finish_heartbeat();
    sender.Close(std::chrono::seconds(5));
    return code;
  };
  std::unique_ptr<GpuMetrics> gpu = GpuMetrics::Open(LocalDeviceFromEnv());
  if (gpu->device() >= 0 && !gpu->available()) {
    Log(a.rank, "GPU %d metrics unavailable: %s", gpu->device(), gpu->error());
  }
  RankObserver observer(a, &sender, &stop, &step, &checkpoint_at, gpu.get(), &phases, stall);

  // The CUDA trainer's context comes first: NCCL orders its collectives
  // after the model's stream (NcclOptions::compute_stream).
  const bool cuda = !probe && asg.plan().device() == "cuda";
  int cuda_device = -1;  // the CUDA ordinal (-1: no GPU)
  if (cuda || nccl) {
    const int planned = a.rank < asg.plan().rank_local_devices_size()
                            ? asg.plan().rank_local_devices(a.rank)
                            : -1;
    // Nothing planned means GPU 0, which is right for one rank alone; two
    // ranks of one job on one GPU is what NCCL refuses ("Duplicate GPU").
    if (planned < 0 && world > 1) {
      Log(a.rank, "error: rank %d of %d has no GPU planned (plan.rank_local_devices); the ranks of a GPU job "
                  "need one GPU each: run the job through the coordinator's planner",
          a.rank, world);
      return give_up(2);
    }
    auto ordinal = CudaOrdinalFor(planned, getenv("CUDA_VISIBLE_DEVICES"));
    if (!ordinal.ok()) {
      Log(a.rank, "error: %s", ordinal.status().message());
      return give_up(2);
    }
    cuda_device = *ordinal;
  }
#ifdef DGCA_HAVE_CUDA_TRAINER
  std::shared_ptr<const cuda::CudaContext> cuda_ctx;
  if (cuda) {
    auto ctx = cuda::CudaContext::Create(cuda_device);
    if (!ctx.ok()) {
      Log(a.rank, "error: device cuda: %s", ctx.status().ToString());
      return give_up(1);
    }
    cuda_ctx = std::shared_ptr<const cuda::CudaContext>(std::move(*ctx));
    Log(a.rank, "CUDA trainer on %s", cuda_ctx->description());
    observer.set_device_memory_reader([] {
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
        (void)cudaGetLastError();  // not this rank's launch error
        return -1.0;
      }
      return static_cast<double>(total - free);
    });
  }
#endif
  if (cuda && !nccl && world > 1) {
    Log(a.rank, "error: device cuda with %d ranks needs backend nccl (got %s): the gradients "
                "live in GPU memory", world, asg.plan().backend());
    return give_up(1);
  }

  // Communicator.
  std::unique_ptr<Communicator> comm;
  if (nccl) {
    // NCCL (any world, one included): the unique id goes through the
    // coordinator's store, adapted to model/'s KeyValueStore.
    auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg->comm_timeout_s * 1000));
    auto store = std::make_shared<GrpcStore>(channel, *token, a.job_id, a.attempt, timeout);
    NcclOptions no;
    no.timeout = timeout;
    no.device = cuda_device;
    // An abort that hangs leaves NCCL kernels spinning: freeing the
    // trainer's buffers on the way out would wait for them forever. The
    // rank ends here instead; its agent reports the exit, the log says why.
    const int rank = a.rank;
    no.on_abort_hung = [rank](const Status& s) {
      Log(rank, "error: %s; exiting without freeing device memory", s.ToString());
      std::fflush(nullptr);
      _exit(1);
    };
#ifdef DGCA_HAVE_CUDA_TRAINER
    if (cuda_ctx) {
      no.device = cuda_ctx->device();
      no.compute_stream = cuda_ctx->stream();
    }
#endif
    Log(a.rank, "joining the NCCL rendezvous (%d ranks, timeout %.0f s)", world,
        cfg->comm_timeout_s);
    phases.Enter(TrainPhase::kRendezvous, 0);
    auto c = MakeNcclCommunicator(MakeGlooKeyValueStore(store), a.rank, world, no);
    if (!c.ok()) {
      Log(a.rank, "error: cannot build the NCCL communicator: %s", c.status().ToString());
      return give_up(1);
    }
    comm = std::move(*c);
    Log(a.rank, "rendezvous done");
  } else if (world == 1) {
    comm = MakeLocalCommunicator();
  } else {
    auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg->comm_timeout_s * 1000));
    auto store = std::make_shared<GrpcStore>(channel, *token, a.job_id, a.attempt, timeout);
    GlooOptions go;
    go.timeout = timeout;
    if (const char* iface = getenv("DGCA_GLOO_IFACE"); iface && *iface) {
      go.iface = iface;
    } else if (const char* h = getenv("DGCA_GLOO_HOSTNAME"); h && *h) {
      go.hostname = h;
    } else {
      // Ranks of a coordinator reached over loopback or a unix socket are on
      // its machine: Gloo stays on 127.0.0.1. Otherwise advertise our name.
      std::string host = a.coordinator.substr(0, a.coordinator.rfind(':'));
      bool local = host == "127.0.0.1" || host == "localhost" || host == "[::1]" ||
                   a.coordinator.rfind("unix:", 0) == 0;
      if (!local) {
        char buf[256] = {0};
        if (gethostname(buf, sizeof(buf) - 1) == 0) go.hostname = buf;
      }
    }
    Log(a.rank, "joining the Gloo rendezvous (%d ranks, %s, timeout %.0f s)", world,
        go.iface.empty() ? go.hostname : "iface " + go.iface, cfg->comm_timeout_s);
    phases.Enter(TrainPhase::kRendezvous, 0);
    auto c = MakeGlooCommunicator(store, a.rank, world, go);
    if (!c.ok()) {
      Log(a.rank, "error: cannot build the Gloo communicator: %s", c.status().ToString());
      return give_up(1);
    }
    comm = std::move(*c);
    Log(a.rank, "rendezvous done");
  }

  if (probe) {
    int code = RunProbe(a, asg.spec(), comm.get(), &sender, &observer, &phases);
    finish_heartbeat();
    if (code == 0) {
      comm.reset();
      sender.Close(std::chrono::seconds(10));
    } else {
      AbandonUntilExit(std::move(comm));  // peers may be inside a collective
      sender.Close(std::chrono::seconds(2));
    }
    return code;
  }
  TrainDeviceFactory make_device = MakeCpuTrainDevice;
#ifdef DGCA_HAVE_CUDA_TRAINER
  if (cuda_ctx) make_device = cuda::CudaTrainDeviceFactory(cuda_ctx);
#endif
#ifndef DGCA_HAVE_CUDA_TRAINER
  if (nccl || cuda) {
    // The trainer here is the CPU one: its gradients live in host memory,
    // which NCCL cannot reduce.
    Log(a.rank, "error: device cuda / backend nccl need the CUDA trainer, which this build of "
                "dgca-worker does not include (built without DGCA_WITH_CUDA); use device cpu "
                "with backend gloo");
    finish_heartbeat();
    AbandonUntilExit(std::move(comm));
    sender.Close(std::chrono::seconds(5));
    return kExitFailed;
  }
#else
  if (nccl && !cuda) {
    Log(a.rank, "error: backend nccl needs device cuda (the CPU trainer's gradients live in "
                "host memory); plan says device %s", asg.plan().device());
    finish_heartbeat();
    AbandonUntilExit(std::move(comm));
    sender.Close(std::chrono::seconds(5));
    return kExitFailed;
  }
#endif

  auto t0 = Clock::now();
  StatusOr<TrainResult> result = Train(*cfg, comm.get(), &observer, make_device);
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  int code = 0;
  if (result.ok()) {
    const std::string final_loss = FinalLossText(result->final_loss, result->final_loss_steps,
                                                 result->final_loss_ranks);
    Log(a.rank, "finished: %d steps in %.1f s, final loss %s, %.1f samples/s", result->steps,
        seconds, final_loss, result->samples_per_second);
    v1::MetricSample s;
    s.set_log_line(absl::StrFormat("rank %d finished: %d steps, final loss %s", a.rank,
                                   result->steps, final_loss));
    sender.Push(std::move(s), false);
    // The job's final loss for the coordinator (Job.final_loss): the same
    // all-reduced figure on every rank, sent before the exit so it is
    // stored before the job ends (Close below waits for it to be read).
    v1::MetricSample f;
    v1::TrainFinished* tf = f.mutable_finished();
    tf->set_job_id(a.job_id);
    tf->set_rank(a.rank);
    tf->set_attempt(a.attempt);
    tf->set_steps(result->steps);
    tf->set_final_loss(result->final_loss);
    tf->set_final_loss_steps(result->final_loss_steps);
    tf->set_final_loss_ranks(result->final_loss_ranks);
    sender.Push(std::move(f), false);
  } else {
    std::string reason;
    {
      absl::MutexLock l(&stop_reason.mu);
      reason = stop_reason.text;
    }
    if (g_signalled && reason.empty()) reason = absl::StrCat("signal ", int(g_signalled));
    if (!reason.empty()) {
      Log(a.rank, "stopped after step %d: %s", step.load(), reason);
    } else {
      Log(a.rank, "error: training failed: %s", result.status().ToString());
    }
    // Stopped on request (the coordinator's stop, SIGTERM) is not a
    // failure of this rank: exit kExitStopped, so the coordinator does not
    // list it among the ranks that failed.
    code = unreachable.load() ? kExitUnreachable : !reason.empty() && !rejected.load() ? kExitStopped : kExitFailed;
  }
  if (code == 0) {
    // Heartbeats go on through the teardown barrier: a peer that never
    // arrives shows this rank "finishing", not silent.
    phases.Enter(TrainPhase::kFinishing, step.load());
    // The communicator barriers with its peers before closing its sockets.
    comm.reset();
    finish_heartbeat();
    sender.Close(std::chrono::seconds(10));
  } else {
    finish_heartbeat();
    // Stopped or failed: the peers may be inside a collective this rank will
    // never join, so the teardown barrier would only wait out the timeout.
    AbandonUntilExit(std::move(comm));
    sender.Close(std::chrono::seconds(2));
  }
  return code;
}

}  // namespace dgca
