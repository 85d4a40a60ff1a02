#include "cli/commands.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/command_util.h"
#include "cli/format.h"
#include "cli/watch_view.h"
#include "planner/plan_format.h"
#include "spec/spec.h"
#include "spec/spec_files.h"
#include "spec/spec_overrides.h"
#include "proto/rpc/rank_phase.h"
#include "proto/rpc/rank_state.h"
#include "proto/rpc/rpc_util.h"
#include "topology/probe.h"
#include "topology/topo_matrix.h"

#if __has_include("model/core/synth.h")
#include "model/core/synth.h"
#define DGCA_HAVE_SYNTH 1
#endif

namespace dgca {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

// Reads a spec file, at most kMaxSpecBytes + 1 bytes of it: a bigger file
// (or /dev/zero) is refused without reading it all into memory.
absl::Status ReadFile(const std::string& path, std::string* out) {
  BoundedRead r = ReadFileAtMost(path, kMaxSpecBytes);
  switch (r.kind) {
    case BoundedRead::kOk:
      *out = std::move(r.data);
      return absl::OkStatus();
    case BoundedRead::kCannotOpen:
    case BoundedRead::kReadError:
      return absl::InvalidArgumentError(absl::StrCat("cannot read spec file ", path, ": ", r.error));
    case BoundedRead::kDirectory:
      return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a job spec file (YAML)"));
    case BoundedRead::kTooBig:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": larger than ", kMaxSpecBytes >> 20, " MiB, the most a job spec may be"));
}

// The absolute directory of `path` (relative paths in the spec resolve
// against it, wherever the coordinator and the ranks run).
std::string AbsDirOf(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) {
    std::string abs(buf);
    size_t p = abs.rfind('/');
    return p == 0 ? "/" : abs.substr(0, p);
  }
  return ".";
}

// Parses the spec locally; prints every problem. Returns 0 or 2.
// The name a spec read from `spec_path` and changed by `sets` goes by (in
// requests, hence in the coordinator's messages and the stored job).
std::string SpecLabel(const std::string& spec_path, const std::vector<std::string>& sets) {
  return sets.empty() ? spec_path : spec_path + " with --set";
}

int ValidateLocally(Io io, const std::string& spec_path, std::string* yaml,
                    v1::JobSpec* spec = nullptr, const std::vector<std::string>& sets = {}) {
  if (auto s = ReadFile(spec_path, yaml); !s.ok()) {
    io.err << "error: " << s.message() << "\n";
    return kExitUsage;
  }
  auto parsed = ParseJobSpec(*yaml, spec_path);
  if (parsed.ok() && parsed->ok() && !sets.empty()) {
    // The file first (its problems at its lines), then each --set.
    SpecOverrideResult o = ApplySpecOverrides(*yaml, spec_path, sets);
    if (!o.problems.empty()) {
      io.err << FormatProblems(o.problems);
      io.err << spec_path << " with --set: " << o.problems.size() << " problem"
             << (o.problems.size() == 1 ? "" : "s") << "\n";
      return kExitUsage;
    }
    *yaml = o.yaml;
    parsed = ParseJobSpec(*yaml, SpecLabel(spec_path, sets));
  }
  if (!parsed.ok()) {
    io.err << "error: " << parsed.status().message() << "\n";
    return kExitUsage;
  }
  if (!parsed->ok()) {
    io.err << FormatProblems(parsed->problems);
    io.err << spec_path << ": " << parsed->problems.size() << " problem"
           << (parsed->problems.size() == 1 ? "" : "s") << "\n";
    return kExitUsage;
  }
  if (spec) *spec = parsed->spec;
  return kExitOk;
}

// The problems the coordinator found (INVALID_ARGUMENT carrying a
// serialized Resp with them in its details, coordinator/server.h: its
// check of the spec's files on its node, or a spec this CLI's parser took
// and the coordinator's did not), printed as local problems are; returns
// kExitUsage then, else kExitOk.
template <typename Resp>
int ServerProblems(Io io, const std::string& spec_path, const grpc::Status& s) {
  if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) return kExitOk;
  Resp details;
  if (!details.ParseFromString(s.error_details()) || details.problems_size() == 0) return kExitOk;
  io.err << FormatProblems(details.problems());
  const int n = details.problems_size();
  io.err << spec_path << ": " << n << " problem" << (n == 1 ? "" : "s")
         << " (reported by the coordinator)\n";
  return kExitUsage;
}

std::string RankRows(const v1::Job& job, const std::map<int, v1::StepMetrics>& live) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "NODE", "PID", "STATE", "STEP", "PHASE", "LOSS", "SAMPLES/S", "STEP_S", "HB_AGE",
       "EXIT", "RESTARTS"}};
  std::map<int, v1::RankProgress> by_rank;
  for (const auto& r : job.ranks()) by_rank[r.rank()] = r;
  for (const auto& [r, m] : live) {
    if (!by_rank.count(r)) by_rank[r].set_rank(r);
  }
  for (auto [r, p] : by_rank) {
    auto it = live.find(r);
    if (it != live.end() && it->second.step() >= p.step()) {
      p.set_step(it->second.step());
      p.set_loss(it->second.loss());
      p.set_samples_per_second(it->second.samples_per_second());
      p.set_step_seconds(it->second.step_seconds());
    }
    bool exited = RankStateEnded(p.state());
    rows.push_back({absl::StrCat(r), p.node().empty() ? "-" : p.node(),
                    p.pid() > 0 ? absl::StrCat(p.pid()) : "-",
                    p.state().empty() ? "-" : p.state(), absl::StrCat(p.step()),
                    exited ? "-" : RankPhaseColumn(p.phase()),
                    p.step() > 0 ? absl::StrFormat("%.4f", p.loss()) : "-",
                    p.samples_per_second() > 0 ? absl::StrFormat("%.1f", p.samples_per_second())
                                               : "-",
                    p.step_seconds() > 0 ? absl::StrFormat("%.3f", p.step_seconds()) : "-",
                    exited ? "-" : absl::StrFormat("%.1fs", p.heartbeat_age_seconds()),
                    !exited          ? "-"
                    : p.signal() != 0 ? SignalAbbrev(p.signal())
                                      : absl::StrCat(p.exit_code()),
                    absl::StrCat(p.restarts())});
  }
  return TextTable(rows);
}

}  // namespace

int PrintProblems(Io io, const std::string& spec_path,
                  const google::protobuf::RepeatedPtrField<v1::SpecProblem>& problems) {
  io.err << FormatProblems(problems);
  io.err << spec_path << ": " << problems.size() << " problem"
         << (problems.size() == 1 ? "" : "s") << "\n";
  return kExitUsage;
}

std::string EventLine(const v1::JobEvent& e) {
  return absl::StrCat("[", ClockTime(e.time_unix_ms()), "] ", StateName(e.state()), "  ",
                      e.kind(), e.message().empty() ? "" : ": ", e.message());
}

std::map<std::string, double> EvalOf(const v1::Job& j) {
  return std::map<std::string, double>(j.eval().begin(), j.eval().end());
}

// ---------------------------------------------------------------- submit
int CmdSubmit(const GlobalOptions& g, Io io, const std::string& spec_path, bool wait,
              const std::vector<std::string>& sets) {
  std::string yaml;
  if (int rc = ValidateLocally(io, spec_path, &yaml, nullptr, sets); rc != kExitOk) return rc;
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_spec_path(SpecLabel(spec_path, sets));
  req.set_base_dir(AbsDirOf(spec_path));
  return SendSubmit(g, io, client->get(), req, spec_path, wait, "");
}

int SendSubmit(const GlobalOptions& g, Io io, Client* client, const v1::SubmitJobRequest& req,
               const std::string& spec_path, bool wait, const std::string& note) {
  v1::SubmitJobResponse resp;
  auto ctx = client->Context(std::chrono::seconds(30));
  grpc::Status s = client->stub()->SubmitJob(ctx.get(), req, &resp);
  if (int rc = ServerProblems<v1::SubmitJobResponse>(io, spec_path, s); rc != kExitOk) return rc;
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (resp.problems_size() > 0) return PrintProblems(io, spec_path, resp.problems());
  io.out << resp.job_id() << "\n";
  io.out.flush();
  io.err << "submitted job " << resp.job_id() << " (" << resp.spec().name() << ")" << note << "\n";
  if (!wait) return kExitOk;
  return FollowJob(g, io, client, resp.job_id(), /*full_view=*/false);
}

// ---------------------------------------------------------------- validate
int CmdValidate(Io io, const std::string& spec_path, const std::vector<std::string>& sets,
                bool check_files) {
  std::string yaml;
  v1::JobSpec spec;
  if (int rc = ValidateLocally(io, spec_path, &yaml, &spec, sets); rc != kExitOk) return rc;
  if (!check_files) {
    io.out << spec_path << ": valid as a spec (job '" << spec.name() << "', preset "
           << spec.model().preset() << ", " << spec.train().steps()
           << " steps); the files it names were not checked (--spec-only)\n";
    return kExitOk;
  }
  // The files the spec names, checked here: validate needs no coordinator,
  // so this machine is the only one it can look on. The base directory is
  // the one `dgca submit` sends, so the paths are the ranks' paths.
  spec.set_base_dir(AbsDirOf(spec_path));
  const std::vector<v1::SpecProblem> missing =
      CheckInputFiles(SpecInputFiles(yaml, spec), "on this machine");
  if (!missing.empty()) {
    io.err << FormatProblems(missing);
    io.err << spec_path << ": " << missing.size() << " problem" << (missing.size() == 1 ? "" : "s")
           << " (files checked on this machine, where dgca validate runs; dgca submit checks "
              "them again on the coordinator's node, and each node agent before it starts a "
              "rank)\n";
    return kExitUsage;
  }
  io.out << spec_path << ": valid (job '" << spec.name() << "', preset " << spec.model().preset()
         << ", " << spec.train().steps() << " steps)\n";
  return kExitOk;
}

// ---------------------------------------------------------------- plan
int CmdPlan(const GlobalOptions& g, Io io, const std::string& spec_path, bool json,
            const std::vector<std::string>& sets) {
  std::string yaml;
  if (int rc = ValidateLocally(io, spec_path, &yaml, nullptr, sets); rc != kExitOk) return rc;
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::PlanJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_spec_path(SpecLabel(spec_path, sets));
  req.set_base_dir(AbsDirOf(spec_path));
  v1::PlanJobResponse resp;
  auto ctx = (*client)->Context(std::chrono::seconds(300));  // trial mode measures
  grpc::Status s = (*client)->stub()->PlanJob(ctx.get(), req, &resp);
  if (int rc = ServerProblems<v1::PlanJobResponse>(io, spec_path, s); rc != kExitOk) return rc;
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (resp.problems_size() > 0) return PrintProblems(io, spec_path, resp.problems());
  const v1::Plan& p = resp.plan();
  if (json) {
    io.out << ToJson(p);
    return kExitOk;
  }
  if (p.ranks() > 0) io.out << FormatPlan(p, resp.spec().name());
  if (!resp.launcher_script().empty()) {
    io.out << (p.ranks() > 0 ? "\n" : "") << "sbatch script (resources.launcher: slurm; JOB is "
           << "the job's id):\n" << resp.launcher_script();
  }
  for (const auto& n : resp.launcher_notes()) io.out << "note: " << n << "\n";
  return kExitOk;
}

// ---------------------------------------------------------------- list
// CmdList: cli/list.cc.

// ---------------------------------------------------------------- status
int CmdStatus(const GlobalOptions& g, Io io, const std::string& job_id, bool json) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  absl::StatusOr<v1::GetJobResponse> got = (*client)->GetJob(job_id);
  if (!got.ok()) return ReportError(io.err, g, got.status());
  const v1::GetJobResponse& resp = *got;
  const v1::Job& j = resp.job();
  if (json) {
    io.out << ToJson(resp);
    return kExitOk;
  }
  Progress p = ComputeProgress(j, {});
  io.out << "job      " << j.id() << " (" << j.name() << ")\n";
  io.out << "state    " << StateName(j.state()) << (j.message().empty() ? "" : "  ") << j.message()
         << "\n";
  io.out << "created  " << Age(j.created_unix_ms()) << ", updated " << Age(j.updated_unix_ms())
         << (j.restarts() > 0 ? absl::StrCat(", ", j.restarts(), " restart(s)") : "") << "\n";
  io.out << "progress " << ProgressLine(p) << "\n";
  io.out << "ran      " << StatusRunLine(j, static_cast<int64_t>(std::time(nullptr)) * 1000) << "\n";
  if (const std::string loss = StatusLossLine(j); !loss.empty()) io.out << "loss     " << loss << "\n";
  const v1::Plan& plan = resp.plan();
  if (plan.ranks() > 0) {
    io.out << absl::StrFormat("plan     %d rank(s) %s/%s, micro_batch %d x accumulation %d, %s\n",
                              plan.ranks(), plan.device(), plan.backend(), plan.micro_batch(),
                              plan.accumulation(), plan.precision());
  }
  if (!j.launcher().kind().empty()) {
    const v1::LauncherStatus& l = j.launcher();
    io.out << "slurm    "
           << (l.job_id().empty() ? std::string("not submitted yet")
                                  : absl::StrCat("job ", l.job_id(), " ",
                                                 l.state().empty() ? "(not seen yet)" : l.state(),
                                                 l.reason().empty() ? "" : " (" + l.reason() + ")",
                                                 l.nodes().empty() ? "" : " on " + l.nodes()))
           << (l.script().empty() ? "" : "; script " + l.script()) << "\n";
  }
  if (plan.trials_size() > 0) io.out << "\ntuning trials:\n" << FormatTrials(plan);
  if (j.ranks_size() > 0) io.out << "\n" << RankRows(j, {});
  if (j.plan_check().samples() > 0) {
    const v1::PlanCheck& c = j.plan_check();
    // A predicted value, or "-" when the plan predicted none.
    auto pred = [](double v, const std::string& text) { return v > 0 ? text : std::string("-"); };
    auto err = [](double p, double m) {
      return p > 0 && m > 0 ? absl::StrFormat("%+.1f%%", 100 * (p - m) / m) : std::string("-");
    };
    std::vector<std::vector<std::string>> t = {{"", "PREDICTED", "MEASURED", "ERROR"}};
    t.push_back({"step seconds",
                 pred(c.predicted_step_seconds(), absl::StrFormat("%.4f", c.predicted_step_seconds())),
                 absl::StrFormat("%.4f", c.measured_step_seconds()),
                 err(c.predicted_step_seconds(), c.measured_step_seconds())});
    t.push_back({"comm share",
                 pred(c.predicted_comm_share(),
                      absl::StrFormat("%.1f%%", 100 * c.predicted_comm_share())),
                 absl::StrFormat("%.1f%%", 100 * c.measured_comm_share()),
                 c.predicted_step_seconds() > 0
                     ? err(c.predicted_comm_share(), c.measured_comm_share())
                     : std::string("-")});
    t.push_back({"all-reduce seconds",
                 pred(c.predicted_allreduce_seconds(),
                      absl::StrFormat("%.4f", c.predicted_allreduce_seconds())),
                 absl::StrFormat("%.4f", c.measured_allreduce_seconds()),
                 err(c.predicted_allreduce_seconds(), c.measured_allreduce_seconds())});
    io.out << absl::StrFormat(
                  "\nplan check (medians of %d rank-steps; compute %.4f s per micro-step "
                  "of %d):\n",
                  c.samples(), c.measured_compute_seconds(), c.micro_batch())
           << TextTable(t);
  }
  if (const std::string plot = LossPlot(j); !plot.empty()) io.out << "\nloss (mean over ranks):\n" << plot;
  if (!j.eval().empty()) io.out << "\nevaluation:\n" << EvalTable(EvalOf(j));
  if (resp.events_size() > 0) {
    io.out << "\nevents:\n";
    int start = std::max(0, resp.events_size() - 10);
    for (int i = start; i < resp.events_size(); ++i) io.out << "  " << EventLine(resp.events(i)) << "\n";
  }
  return kExitOk;
}

// ---------------------------------------------------------------- logs
// CmdLogs: cli/logs.cc.

// ---------------------------------------------------------------- cancel
int CmdCancel(const GlobalOptions& g, Io io, const std::string& job_id) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  auto ctx = (*client)->Context(std::chrono::seconds(30));
  grpc::Status s = (*client)->stub()->CancelJob(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (resp.already_ended()) {
    io.out << "job " << job_id << " had already ended: " << StateName(resp.job().state())
           << " (nothing to cancel)\n";
    return kExitOk;
  }
  io.out << "job " << job_id << " " << StateName(resp.job().state());
  if (!resp.job().message().empty()) io.out << ": " << resp.job().message();
  io.out << "\n";
  return kExitOk;
}

// ---------------------------------------------------------------- topo
int CmdTopo(Io io, const std::string& root, bool json) {
  ProbeOptions o;
  o.root = root.empty() ? "/" : root;
  auto t = ProbeTopology(o);
  if (!t.ok()) {
    io.err << "error: " << t.status().message() << "\n";
    return kExitUsage;
  }
  if (json) {
    io.out << ToJson(*t);
  } else {
    io.out << FormatTopoMatrix(*t);
  }
  return kExitOk;
}

// ---------------------------------------------------------------- nodes
int CmdNodes(const GlobalOptions& g, Io io, bool json) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::ListNodesRequest req;
  v1::ListNodesResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->ListNodes(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (json) {
    io.out << ToJson(resp);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "CONNECTED", "HB_AGE", "CPUS", "MEMORY", "GPUS", "WSL2", "JOBS"}};
  for (const auto& n : resp.nodes()) {
    const auto& t = n.topology();
    std::string gpus = absl::StrCat(t.gpus_size());
    if (t.gpus_size() > 0) absl::StrAppend(&gpus, " x ", t.gpus(0).name());
    rows.push_back({n.name(), n.address().empty() ? "-" : n.address(),
                    // A connected agent that is silent or leaving gets no ranks.
                    !n.connected()                                   ? "no"
                    : n.state() == "silent" || n.state() == "leaving" ? n.state()
                                                                      : "yes",
                    absl::StrFormat("%.1fs", n.heartbeat_age_seconds()),
                    absl::StrCat(t.cpu_count()),
                    t.memory_bytes() > 0
                        ? absl::StrFormat("%.1f GiB", t.memory_bytes() / double(1ull << 30))
                        : "?",
                    gpus, t.wsl2() ? "yes" : "no",
                    n.running_jobs().empty() ? "-" : absl::StrJoin(n.running_jobs(), ",")});
  }
  io.out << TextTable(rows);
  return kExitOk;
}

int CmdForgetNode(const GlobalOptions& g, Io io, const std::string& node) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::ForgetNodeRequest req;
  req.set_node(node);
  v1::ForgetNodeResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->ForgetNode(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  io.out << "node " << node << " forgotten\n";
  return kExitOk;
}

// ---------------------------------------------------------------- data synth
int CmdDataSynth(Io io, const std::string& out_dir) {
  if (out_dir.empty()) {
    io.err << "error: --out DIR is required\n";
    return kExitUsage;
  }
#ifdef DGCA_HAVE_SYNTH
  SynthOptions o;
  o.out_dir = out_dir;
  SynthStats st;
  Status s = SynthesizeCorpus(o, &st);
  if (!s.ok()) {
    io.err << "error: " << s.message() << "\n";
    return kExitFailed;
  }
  io.out << absl::StrFormat(
      "wrote %s/train.txt (%d sentences, %d with errors) and %s/test.txt (%d sentences, %d with "
      "errors)\n%d homophone substitutions; %d candidate sentences from %d source files\n",
      out_dir, st.train, st.train_with_errors, out_dir, st.test, st.test_with_errors,
      st.substitutions, st.candidate_sentences, st.files);
  return kExitOk;
#else
  io.err << "error: dgca data synth is not built into this dgca yet (model/core/synth.h)\n";
  return kExitFailed;
#endif
}

}  // namespace cli
}  // namespace dgca
