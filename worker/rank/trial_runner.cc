#include "worker/rank/trial_runner.h"

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include <gloo/rendezvous/file_store.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/comm/communicator.h"
#include "model/comm/gloo_communicator.h"
#include "model/train/trainer.h"
#include "proto/rpc/rpc_util.h"
#include "worker/rank/train_config.h"

namespace dgca {
namespace {

using Clock = std::chrono::steady_clock;

// Collects rank 0's step times; stops every rank when the budget runs out.
class TrialObserver : public TrainObserver {
 public:
  TrialObserver(int warmup, Clock::time_point deadline, std::atomic<bool>* over)
      : warmup_(warmup), deadline_(deadline), over_(over) {}
  void OnStep(const StepReport& r) override {
    absl::MutexLock l(&mu_);
    if (r.step > warmup_) times_.push_back(r.step_seconds);
  }
  bool StopRequested() override {
    if (Clock::now() > deadline_) over_->store(true);
    return over_->load();
  }
  std::vector<double> times() {
    absl::MutexLock l(&mu_);
    return times_;
  }

 private:
  int warmup_;
  Clock::time_point deadline_;
  std::atomic<bool>* over_;
  absl::Mutex mu_;
  std::vector<double> times_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

LocalTrialRunner::LocalTrialRunner(v1::JobSpec spec, LocalTrialOptions options)
    : spec_(std::move(spec)), options_(options) {}

absl::StatusOr<double> LocalTrialRunner::TimeStep(const v1::Plan& candidate, double budget_s) {
  if (budget_s <= 0) return absl::DeadlineExceededError("no tuning budget left for a trial");
  const int world = std::max(1, candidate.ranks());
  if (world > 64) return absl::InvalidArgumentError("trial: more than 64 ranks on one node");
  v1::JobSpec spec = spec_;
  spec.mutable_train()->set_steps(options_.warmup_steps + options_.timed_steps);
  spec.mutable_train()->set_eval_every(0);
  spec.mutable_train()->set_checkpoint_every(0);
  // The candidate fixes the global batch it was planned for.
  spec.mutable_train()->set_global_batch(candidate.micro_batch() *
                                         std::max(1, candidate.accumulation()) * world);
  auto cfg = TrainConfigFromSpec(spec, candidate);
  if (!cfg.ok()) return cfg.status();
  cfg->eval_path.clear();
  cfg->max_eval_samples = 1;
  cfg->checkpoint_dir.clear();
  cfg->resume_from.clear();

  std::string store_dir;
  if (world > 1) {
    char tmpl[] = "/tmp/dgca-trial.XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) return absl::InternalError("trial: cannot make a temporary directory for the store");
    store_dir = d;
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(budget_s));
  std::atomic<bool> over{false};
  std::vector<std::unique_ptr<TrialObserver>> obs;
  std::vector<Status> results(world);
  for (int r = 0; r < world; ++r) {
    obs.push_back(std::make_unique<TrialObserver>(options_.warmup_steps, deadline, &over));
  }
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      if (world == 1) {
        comm = MakeLocalCommunicator();
      } else {
        GlooOptions go;
        go.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.comm_timeout_s * 1e3));
        auto c = MakeGlooCommunicator(std::make_shared<gloo::rendezvous::FileStore>(store_dir), r,
                                      world, go);
        if (!c.ok()) {
          results[r] = c.status();
          over = true;
          return;
        }
        comm = std::move(*c);
      }
      auto res = Train(*cfg, comm.get(), obs[r].get());
      if (!res.ok()) {
        results[r] = res.status();
        over = true;
        AbandonUntilExit(std::move(comm));  // peers may still be in a collective
      }
    });
  }
  for (auto& t : threads) t.join();
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!store_dir.empty()) {
    std::error_code ec;  // best effort: a leftover store directory is harmless
    std::filesystem::remove_all(store_dir, ec);
  }
  std::string what = absl::StrFormat("ranks %d, micro %d x accumulation %d, bucket %.0f MB",
                                     world, candidate.micro_batch(), candidate.accumulation(),
                                     candidate.bucket_mb());
  if (Clock::now() > deadline) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "trial (%s) stopped: it ran past the remaining tuning budget of %.1f s", what, budget_s));
  }
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      return absl::Status(static_cast<absl::StatusCode>(results[r].code()),
                          absl::StrCat("trial (", what, ") rank ", r, ": ",
                                       results[r].message()));
    }
  }
  std::vector<double> times = obs[0]->times();
  if (times.empty()) return absl::InternalError(absl::StrCat("trial (", what, ") timed no step"));
  double sum = 0;
  for (double t : times) sum += t;
  double per_step = sum / times.size();
  if (options_.log) {
    options_.log(absl::StrFormat("trial: %s: %.3f s/step (%d timed steps, %.1f s in all)", what,
                                 per_step, static_cast<int>(times.size()), seconds));
  }
  return per_step;
}

}  // namespace dgca
