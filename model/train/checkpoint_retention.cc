#include "model/train/checkpoint_retention.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "model/core/files.h"
#include "model/core/json.h"
#include "model/train/checkpoint.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;

// eval.json is a few hundred bytes; more is not one.
constexpr size_t kMaxEvalBytes = 64 << 10;
constexpr const char* kPruningSuffix = ".pruning";

// The step of a step directory's name ("step-" and at least 8 digits, as
// CheckpointDirName writes it), or -1.
int64_t StepOfName(const std::string& name) {
  if (name.size() < 13 || name.rfind("step-", 0) != 0 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// A directory left by a prune that was cut short: ".step-NNNNNNNN.pruning".
bool IsPruneLeftover(const std::string& name) {
  const size_t suffix = std::strlen(kPruningSuffix);
  return name.size() > 1 + suffix && name[0] == '.' &&
         name.compare(name.size() - suffix, suffix, kPruningSuffix) == 0 &&
         StepOfName(name.substr(1, name.size() - 1 - suffix)) >= 0;
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return InternalError("cannot delete " + path + ": " + ec.message());
  return OkStatus();
}

std::string FormatMetric(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", x);
  return buf;
}

}  // namespace

RetentionPlan PlanRetention(const std::vector<CheckpointEntry>& entries, int64_t latest_step,
                            int keep) {
  RetentionPlan plan;
  std::vector<CheckpointEntry> by_step = entries;
  std::sort(by_step.begin(), by_step.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  double best_metric = 0;
  for (const CheckpointEntry& e : by_step) {
    if (!e.has_metric || !std::isfinite(e.metric)) continue;
    if (plan.best < 0 || e.metric >= best_metric) {
      plan.best = e.step;
      best_metric = e.metric;
    }
  }
  std::set<int64_t> newest;
  if (keep <= 0) {
    for (const CheckpointEntry& e : by_step) newest.insert(e.step);
  } else {
    // The resume point first, so it is one of the N whatever its number: a
    // step directory numbered above it (a save cut short before `latest`
    // moved, whose step a resumed run has not reached again; a run rolled
    // back to an earlier step) must not push it out.
    for (const CheckpointEntry& e : by_step) {
      if (e.step == latest_step) newest.insert(e.step);
    }
    for (auto it = by_step.rbegin(); it != by_step.rend() && static_cast<int>(newest.size()) < keep;
         ++it) {
      newest.insert(it->step);
    }
  }
  plan.newest.assign(newest.begin(), newest.end());
  for (const CheckpointEntry& e : by_step) {
    const bool kept = newest.count(e.step) > 0 || e.step == plan.best;  // the best in addition
    (kept ? plan.keep : plan.prune).push_back(e.step);
  }
  return plan;
}

Status WriteCheckpointEval(const std::string& step_dir, int64_t step,
                           const std::map<std::string, double>& metrics) {
  std::string js = "{\"step\": " + std::to_string(step) + ", \"metrics\": {";
  bool first = true;
  for (const auto& [name, value] : metrics) {
    if (!std::isfinite(value)) continue;  // JSON has no NaN; a missing metric reads as none
    char num[40];
    std::snprintf(num, sizeof(num), "%.17g", value);
    js += first ? "" : ", ";
    first = false;
    AppendJsonString(name, &js);
    js += std::string(": ") + num;
  }
  js += "}}\n";
  return WriteFileAtomically(step_dir + "/" + kCheckpointEvalFile, js);
}

StatusOr<double> ReadCheckpointMetric(const std::string& step_dir, const std::string& metric) {
  const std::string path = step_dir + "/" + kCheckpointEvalFile;
  StatusOr<std::string> read =
      ReadTextFile(path, kMaxEvalBytes, "{\"step\": N, \"metrics\": {...}}");
  if (!read.ok() && read.status().code() == StatusCode::kNotFound) {
    return NotFoundError(path + ": no eval recorded at this checkpoint's step");
  }
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  DGCA_ASSIGN_OR_RETURN(JsonValue js, ParseJson(text, path));
  const JsonValue* metrics = js.Find("metrics");
  if (metrics == nullptr || !metrics->is_object()) {
    return DataLossError(path + ": expected an object field 'metrics'");
  }
  const JsonValue* v = metrics->Find(metric);
  if (v == nullptr) return NotFoundError(path + ": no metric '" + metric + "'");
  if (!v->is_number() || !std::isfinite(v->number)) {
    return DataLossError(path + ": metrics['" + metric + "'] must be a finite number");
  }
  return v->number;
}

std::string PruneReport::Summary() const {
  if (pruned.empty() && leftovers == 0) return "";
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::string s;
  if (!pruned.empty()) {
    s = "pruned " + std::to_string(pruned.size()) +
        (pruned.size() == 1 ? " checkpoint (" : " checkpoints (") + join(pruned) + ")";
  }
  if (leftovers > 0) {
    s += std::string(s.empty() ? "removed " : "; removed ") + std::to_string(leftovers) +
         " left by a prune cut short";
  }
  s += "; kept " + join(kept);
  const bool best_apart =
      !best.empty() && std::find(kept.begin(), kept.end(), best) == kept.end();
  if (best.empty()) {
    s += std::string(" (no checkpoint has an eval at its step to pick a best by ") +
         kRetentionMetric + ")";
  } else if (best_apart) {
    s += ", best " + best + " by " + kRetentionMetric + " (" + FormatMetric(best_metric) + ")";
  } else {
    s += " (" + best + " also the best by " + kRetentionMetric + ", " + FormatMetric(best_metric) +
         ")";
  }
  return s;
}

namespace {

// The step directories of DIR with their recorded metric, and the leftovers
// of cut-short prunes (may be null).
Status ScanCheckpointDir(const std::string& dir, std::vector<CheckpointEntry>* entries,
                         std::vector<std::string>* leftovers) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    if (IsPruneLeftover(name)) {
      if (leftovers != nullptr) leftovers->push_back(name);
      continue;
    }
    const int64_t step = StepOfName(name);
    // vocab.txt, latest, .step-*.tmp.PID of a save, and any name not
    // CheckpointDirName's own (step-000000001): never ours to delete.
    if (step < 0 || name != CheckpointDirName(step)) continue;
    CheckpointEntry e;
    e.step = step;
    // An unreadable eval.json only loses this directory its claim to best.
    auto metric = ReadCheckpointMetric(dir + "/" + name, kRetentionMetric);
    if (metric.ok()) {
      e.has_metric = true;
      e.metric = *metric;
    }
    entries->push_back(e);
  }
  if (ec) return InternalError("cannot list checkpoint directory " + dir + ": " + ec.message());
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointEntry> entries;
  DGCA_RETURN_IF_ERROR(ScanCheckpointDir(dir, &entries, nullptr));
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return entries;
}

StatusOr<PruneReport> PruneCheckpoints(const std::string& dir, int keep,
                                       const RemoveTreeFn& remove_tree) {
  PruneReport report;
  if (keep <= 0) return report;
  const RemoveTreeFn remove = remove_tree ? remove_tree : RemoveTree;
  auto latest = LatestCheckpoint(dir);
  if (!latest.ok()) {
    return FailedPreconditionError("not pruning checkpoint directory " + dir +
                                   ": its resume point is unknown (" + latest.status().message() +
                                   ")");
  }
  const int64_t latest_step = StepOfName(fs::path(*latest).filename().string());

  std::vector<CheckpointEntry> entries;
  std::vector<std::string> leftovers;
  DGCA_RETURN_IF_ERROR(ScanCheckpointDir(dir, &entries, &leftovers));

  const RetentionPlan plan = PlanRetention(entries, latest_step, keep);
  for (int64_t s : plan.newest) report.kept.push_back(CheckpointDirName(s));
  if (plan.best >= 0) {
    report.best = CheckpointDirName(plan.best);
    for (const CheckpointEntry& e : entries) {
      if (e.step == plan.best) report.best_metric = e.metric;
    }
  }
  // Leftovers first: they are older than anything and already invalid.
  std::sort(leftovers.begin(), leftovers.end());
  for (const std::string& name : leftovers) {
    DGCA_RETURN_IF_ERROR(remove(dir + "/" + name));
    ++report.leftovers;
  }
  for (int64_t s : plan.prune) {
    const std::string name = CheckpointDirName(s);
    const std::string from = dir + "/" + name;
    const std::string to = dir + "/." + name + kPruningSuffix;
    // Renamed first: from here on no reader takes it for a checkpoint, however
    // little of it the removal below gets to delete.
    std::error_code ec;
    fs::remove_all(to, ec);
    fs::rename(from, to, ec);
    if (ec) return InternalError("cannot rename " + from + " to " + to + ": " + ec.message());
    DGCA_RETURN_IF_ERROR(remove(to));
    report.pruned.push_back(name);
  }
  return report;
}

}  // namespace dgca
