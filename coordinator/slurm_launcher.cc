#include "coordinator/slurm_launcher.h"

#include <chrono>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "model/core/files.h"
#include "spdlog/spdlog.h"

namespace dgca {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status WriteScript(const std::string& path, const std::string& text) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (Status st = MakeDirectories(dir, 0700); !st.ok()) {
    return absl::FailedPreconditionError(std::string(st.message()));
  }
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

SlurmLauncher::SlurmLauncher(Slurm slurm, JobStore* store, std::function<void()> changed,
                             double poll_s)
    : slurm_(std::move(slurm)), store_(store), changed_(std::move(changed)), poll_s_(poll_s) {}

SlurmLauncher::~SlurmLauncher() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SlurmLauncher::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void SlurmLauncher::Request(const std::string& job, int attempt, const std::string& script_path,
                            const std::string& script) {
  absl::MutexLock l(&mu_);
  const Key key{job, attempt};
  if (entries_.count(key)) return;
  Entry& e = entries_[key];
  e.a.script = script_path;
  e.text = script;
  releases_.erase(job);
  wake_ = true;
}

void SlurmLauncher::Track(const std::string& job, int attempt, const std::string& allocation_id,
                          const std::string& script_path) {
  absl::MutexLock l(&mu_);
  Entry& e = entries_[{job, attempt}];
  e.a.id = allocation_id;
  e.a.script = script_path;
  e.a.submitted = true;
  wake_ = true;
}

void SlurmLauncher::Cancel(const std::string& job, int attempt) {
  absl::MutexLock l(&mu_);
  auto it = entries_.find({job, attempt});
  if (it == entries_.end() || it->second.cancel) return;
  it->second.cancel = true;
  wake_ = true;
}

void SlurmLauncher::Release(const std::string& job, double delay_s) {
  absl::MutexLock l(&mu_);
  releases_[job] = NowSeconds() + delay_s;
  wake_ = true;
}

std::optional<SlurmLauncher::Allocation> SlurmLauncher::Get(const std::string& job,
                                                            int attempt) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find({job, attempt});
  if (it == entries_.end()) return std::nullopt;
  return it->second.a;
}

void SlurmLauncher::CancelAll() {
  std::vector<std::string> ids;
  {
    absl::MutexLock l(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (!releases_.count(it->first.first)) {
        ++it;
        continue;
      }
      if (it->second.a.submitted && !it->second.a.gone) ids.push_back(it->second.a.id);
      it = entries_.erase(it);
    }
    releases_.clear();
  }
  for (const std::string& id : ids) {
    if (absl::Status st = slurm_.Cancel(id); !st.ok()) spdlog::warn("{}", st.ToString());
  }
}

void SlurmLauncher::Loop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
    }
    const bool changed = Pass();
    if (changed && changed_) changed_();
    absl::MutexLock l(&mu_);
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Seconds(poll_s_));
    wake_ = false;
  }
}

bool SlurmLauncher::Pass() {
  bool changed = false;
  std::vector<std::pair<Key, std::pair<std::string, std::string>>> submit;  // path, text
  std::vector<std::pair<Key, std::string>> cancel;                          // id
  std::map<std::string, Key> active;                                        // id -> key
  std::vector<std::string> due;
  {
    absl::MutexLock l(&mu_);
    const double now = NowSeconds();
    for (auto& [key, e] : entries_) {
      if (e.cancel && !e.a.submitted && e.a.error.empty()) {
        e.a.error = "cancelled before it was submitted";
        e.a.gone = true;
        changed = true;
        continue;
      }
      if (!e.a.submitted && e.a.error.empty()) submit.push_back({key, {e.a.script, e.text}});
      if (e.a.submitted && e.cancel && !e.cancelled && !e.a.gone) cancel.push_back({key, e.a.id});
      if (e.a.submitted && !e.a.gone) active[e.a.id] = key;
    }
    for (const auto& [job, at] : releases_) {
      if (now >= at) due.push_back(job);
    }
  }
  for (const auto& [key, script] : submit) {
    absl::StatusOr<std::string> id = absl::UnknownError("");
    if (absl::Status st = WriteScript(script.first, script.second); !st.ok()) {
      id = st;
    } else {
      id = slurm_.Submit(script.first);
    }
    if (id.ok()) {
      AllocationRecord rec;
      rec.job_id = key.first;
      rec.attempt = key.second;
      rec.kind = "slurm";
      rec.allocation_id = *id;
      rec.script = script.first;
      rec.time_unix_ms = NowUnixMs();
      if (absl::Status st = store_->RecordAllocation(rec); !st.ok()) {
        spdlog::warn("job {}: cannot record Slurm job {}: {}", key.first, *id, st.ToString());
      }
      spdlog::info("job {}: attempt {} submitted to Slurm as job {}", key.first, key.second, *id);
    }
    absl::MutexLock l(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    if (id.ok()) {
      it->second.a.id = *id;
      it->second.a.submitted = true;
      it->second.text.clear();
      active[*id] = key;
    } else {
      it->second.a.error = std::string(id.status().message());
      it->second.a.gone = true;
    }
    changed = true;
  }
  for (const auto& [key, id] : cancel) {
    absl::Status st = slurm_.Cancel(id);
    if (!st.ok()) spdlog::warn("job {}: {}", key.first, st.ToString());
    absl::MutexLock l(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) it->second.cancelled = true;
  }
  if (!active.empty()) {
    std::vector<std::string> ids;
    for (const auto& [id, key] : active) ids.push_back(id);
    auto jobs = slurm_.Query(ids);
    if (!jobs.ok()) {
      spdlog::warn("Slurm: {}", jobs.status().ToString());
    } else {
      absl::MutexLock l(&mu_);
      for (const auto& [id, key] : active) {
        auto it = entries_.find(key);
        if (it == entries_.end()) continue;
        Allocation& a = it->second.a;
        auto j = jobs->find(id);
        const Allocation before = a;
        if (j == jobs->end()) {
          a.gone = true;  // purged from squeue: it ended a while ago
        } else {
          a.state = j->second.state;
          a.reason = j->second.reason;
          if (!j->second.nodes.empty()) a.nodes = j->second.nodes;
          a.gone = !SlurmJobActive(a.state);
        }
        changed |= before.state != a.state || before.reason != a.reason ||
                   before.nodes != a.nodes || before.gone != a.gone;
      }
    }
  }
  for (const std::string& job : due) {
    std::vector<std::string> still;
    {
      absl::MutexLock l(&mu_);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->first.first != job) {
          ++it;
          continue;
        }
        if (it->second.a.submitted && !it->second.a.gone) still.push_back(it->second.a.id);
        it = entries_.erase(it);
      }
      releases_.erase(job);
    }
    for (const std::string& id : still) {
      if (absl::Status st = slurm_.Cancel(id); !st.ok()) spdlog::warn("job {}: {}", job, st.ToString());
    }
  }
  return changed;
}

}  // namespace dgca
