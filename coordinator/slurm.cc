#include "coordinator/slurm.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "topology/command.h"

namespace dgca {
namespace {

// Slurm's message: its stderr (or stdout), trimmed to one paragraph.
std::string Said(const CommandResult& r) {
  std::string text(absl::StripAsciiWhitespace(r.err.empty() ? r.out : r.err));
  if (text.size() > 2000) text = text.substr(0, 2000) + " ...";
  if (text.empty()) text = "(it printed nothing)";
  return text;
}

absl::Status Failed(const std::vector<std::string>& argv, const CommandResult& r) {
  const std::string how = r.signal != 0 ? absl::StrCat("was killed by signal ", r.signal)
                                        : absl::StrCat("exited ", r.exit_code);
  return absl::UnavailableError(absl::StrCat(CommandLine(argv), " ", how, ": ", Said(r)));
}

// Runs a Slurm tool; NOT_FOUND (not installed) and timeouts name it.
absl::StatusOr<CommandResult> RunTool(const std::vector<std::string>& argv, double timeout_s) {
  auto r = RunCommand(argv, timeout_s);
  if (!r.ok() && absl::IsNotFound(r.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        r.status().message(), ": Slurm's command-line tools are needed on the coordinator's "
        "machine for resources.launcher: slurm (Debian: apt-get install slurm-client)"));
  }
  return r;
}

}  // namespace

bool SlurmJobActive(const std::string& state) {
  static const char* kActive[] = {"PENDING",   "CONFIGURING", "RUNNING",  "COMPLETING",
                                  "SUSPENDED", "REQUEUED",    "RESIZING", "SIGNALING",
                                  "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                                  "STOPPED"};
  return std::any_of(std::begin(kActive), std::end(kActive),
                     [&](const char* s) { return state == s; });
}

std::map<std::string, SlurmJobInfo> ParseSqueue(const std::string& out) {
  std::map<std::string, SlurmJobInfo> jobs;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits('|', 3));
    if (f.size() < 2 || f[0].empty()) continue;
    SlurmJobInfo j;
    j.id = f[0];
    j.state = f[1];
    if (f.size() > 2) j.reason = f[2];
    if (f.size() > 3) j.nodes = f[3];
    if (j.reason == "None" || j.reason == "(null)") j.reason.clear();
    if (j.nodes == "(null)") j.nodes.clear();
    jobs[j.id] = j;
  }
  return jobs;
}

std::string Slurm::Tool(const std::string& name) const {
  return opt_.bin_dir.empty() ? name : absl::StrCat(opt_.bin_dir, "/", name);
}

absl::StatusOr<std::string> Slurm::Submit(const std::string& script_path) const {
  const std::vector<std::string> argv = {Tool("sbatch"), "--parsable", script_path};
  auto r = RunTool(argv, opt_.timeout_s);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return Failed(argv, *r);
  // --parsable: "ID" or "ID;CLUSTER".
  std::string id(absl::StripAsciiWhitespace(r->out));
  id = id.substr(0, id.find(';'));
  int64_t n = 0;
  if (!absl::SimpleAtoi(id, &n) || n <= 0) {
    return absl::UnavailableError(absl::StrCat(CommandLine(argv), " printed no job id: ", Said(*r)));
  }
  return id;
}

absl::StatusOr<std::map<std::string, SlurmJobInfo>> Slurm::Query(
    const std::vector<std::string>& ids) const {
  std::map<std::string, SlurmJobInfo> out;
  if (ids.empty()) return out;
  auto query = [&](const std::vector<std::string>& some) -> absl::StatusOr<CommandResult> {
    const std::vector<std::string> argv = {Tool("squeue"), "-h", "-t", "all", "-o", "%i|%T|%r|%N",
                                           "-j", absl::StrJoin(some, ",")};
    return RunTool(argv, opt_.timeout_s);
  };
  auto r = query(ids);
  if (!r.ok()) return r.status();
  if (r->exit_code == 0) return ParseSqueue(r->out);
  // One id Slurm no longer knows fails the whole call ("Invalid job id
  // specified"): ask one by one, and an unknown one is simply gone.
  if (!absl::StrContains(r->err, "Invalid job id")) {
    return Failed({Tool("squeue"), "-h", "-t", "all", "-o", "%i|%T|%r|%N", "-j",
                   absl::StrJoin(ids, ",")},
                  *r);
  }
  for (const std::string& id : ids) {
    auto one = query({id});
    if (!one.ok()) return one.status();
    if (one->exit_code != 0) continue;
    for (auto& [k, v] : ParseSqueue(one->out)) out[k] = v;
  }
  return out;
}

absl::Status Slurm::Cancel(const std::string& id) const {
  const std::vector<std::string> argv = {Tool("scancel"), id};
  auto r = RunTool(argv, opt_.timeout_s);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0 && !absl::StrContains(r->err, "already completing or completed") &&
      !absl::StrContains(r->err, "Invalid job id")) {
    return Failed(argv, *r);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Slurm::PartitionNodes(const std::string& partition) const {
  // One line per partition: "NAME|NODES" (the default marked with '*').
  const std::vector<std::string> argv = {Tool("sinfo"), "-h", "-o", "%P|%D"};
  auto r = RunTool(argv, opt_.timeout_s);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return Failed(argv, *r);
  std::map<std::string, int> nodes;
  std::string default_partition;
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
    const std::vector<std::string> f = absl::StrSplit(absl::StripAsciiWhitespace(line), '|');
    if (f.size() != 2) continue;
    std::string name = f[0];
    if (!name.empty() && name.back() == '*') {
      name.pop_back();
      default_partition = name;
    }
    int n = 0;
    if (!absl::SimpleAtoi(f[1], &n)) continue;
    if (!nodes.count(name)) names.push_back(name);
    nodes[name] += n;  // sinfo prints one line per node state
  }
  const std::string want = partition.empty() ? default_partition : partition;
  auto it = nodes.find(want);
  if (it == nodes.end()) {
    return absl::NotFoundError(
        partition.empty()
            ? "the cluster has no default partition; set resources.slurm.partition"
            : absl::StrCat("Slurm has no partition '", partition, "' (sinfo lists: ",
                           names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  return it->second;
}

}  // namespace dgca
