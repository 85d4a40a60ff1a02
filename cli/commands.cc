#include "cli/commands.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "cli/format.h"
#include "cli/watch_view.h"
#include "planner/plan_format.h"
#include "spec/spec.h"
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
int ValidateLocally(Io io, const std::string& spec_path, std::string* yaml,
                    v1::JobSpec* spec = nullptr) {
  if (auto s = ReadFile(spec_path, yaml); !s.ok()) {
    io.err << "error: " << s.message() << "\n";
    return kUsage;
  }
  auto parsed = ParseJobSpec(*yaml, spec_path);
  if (!parsed.ok()) {
    io.err << "error: " << parsed.status().message() << "\n";
    return kUsage;
  }
  if (!parsed->ok()) {
    io.err << FormatProblems(parsed->problems);
    io.err << spec_path << ": " << parsed->problems.size() << " problem"
           << (parsed->problems.size() == 1 ? "" : "s") << "\n";
    return kUsage;
  }
  if (spec) *spec = parsed->spec;
  return kOk;
}

int PrintProblems(Io io, const std::string& spec_path,
                  const google::protobuf::RepeatedPtrField<v1::SpecProblem>& problems) {
  io.err << FormatProblems(problems);
  io.err << spec_path << ": " << problems.size() << " problem"
         << (problems.size() == 1 ? "" : "s") << "\n";
  return kUsage;
}

std::string Age(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  double s = (static_cast<double>(std::time(nullptr)) * 1000 - unix_ms) / 1000.0;
  return FormatDuration(std::max(0.0, s)) + " ago";
}

std::string RankRows(const v1::Job& job, const std::map<int, v1::StepMetrics>& live) {
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "NODE", "PID", "STATE", "STEP", "LOSS", "SAMPLES/S", "STEP_S", "HB_AGE", "EXIT",
       "RESTARTS"}};
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
    bool exited = p.state() == "exited" || p.state() == "failed";
    rows.push_back({absl::StrCat(r), p.node().empty() ? "-" : p.node(),
                    p.pid() > 0 ? absl::StrCat(p.pid()) : "-",
                    p.state().empty() ? "-" : p.state(), absl::StrCat(p.step()),
                    p.step() > 0 ? absl::StrFormat("%.4f", p.loss()) : "-",
                    p.samples_per_second() > 0 ? absl::StrFormat("%.1f", p.samples_per_second())
                                               : "-",
                    p.step_seconds() > 0 ? absl::StrFormat("%.3f", p.step_seconds()) : "-",
                    exited ? "-" : absl::StrFormat("%.1fs", p.heartbeat_age_seconds()),
                    exited ? absl::StrCat(p.exit_code()) : "-", absl::StrCat(p.restarts())});
  }
  return TextTable(rows);
}

std::string EventLine(const v1::JobEvent& e) {
  return absl::StrCat("[", ClockTime(e.time_unix_ms()), "] ", StateName(e.state()), "  ",
                      e.kind(), e.message().empty() ? "" : ": ", e.message());
}

std::map<std::string, double> EvalOf(const v1::Job& j) {
  return std::map<std::string, double>(j.eval().begin(), j.eval().end());
}

}  // namespace

// ---------------------------------------------------------------- submit
int CmdSubmit(const GlobalOptions& g, Io io, const std::string& spec_path, bool wait) {
  std::string yaml;
  if (int rc = ValidateLocally(io, spec_path, &yaml); rc != kOk) return rc;
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_spec_path(spec_path);
  req.set_base_dir(AbsDirOf(spec_path));
  v1::SubmitJobResponse resp;
  auto ctx = (*client)->Context(std::chrono::seconds(30));
  grpc::Status s = (*client)->stub()->SubmitJob(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (resp.problems_size() > 0) return PrintProblems(io, spec_path, resp.problems());
  io.out << resp.job_id() << "\n";
  io.out.flush();
  io.err << "submitted job " << resp.job_id() << " (" << resp.spec().name() << ")\n";
  if (!wait) return kOk;
  return FollowJob(g, io, client->get(), resp.job_id(), /*full_view=*/false);
}

// ---------------------------------------------------------------- validate
int CmdValidate(Io io, const std::string& spec_path) {
  std::string yaml;
  v1::JobSpec spec;
  if (int rc = ValidateLocally(io, spec_path, &yaml, &spec); rc != kOk) return rc;
  io.out << spec_path << ": valid (job '" << spec.name() << "', preset " << spec.model().preset()
         << ", " << spec.train().steps() << " steps)\n";
  return kOk;
}

// ---------------------------------------------------------------- plan
int CmdPlan(const GlobalOptions& g, Io io, const std::string& spec_path, bool json) {
  std::string yaml;
  if (int rc = ValidateLocally(io, spec_path, &yaml); rc != kOk) return rc;
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::PlanJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_spec_path(spec_path);
  req.set_base_dir(AbsDirOf(spec_path));
  v1::PlanJobResponse resp;
  auto ctx = (*client)->Context(std::chrono::seconds(300));  // trial mode measures
  grpc::Status s = (*client)->stub()->PlanJob(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (resp.problems_size() > 0) return PrintProblems(io, spec_path, resp.problems());
  const v1::Plan& p = resp.plan();
  if (json) {
    io.out << ToJson(p);
    return kOk;
  }
  io.out << FormatPlan(p, resp.spec().name());
  return kOk;
}

// ---------------------------------------------------------------- list
int CmdList(const GlobalOptions& g, Io io, bool json) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->ListJobs(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (json) {
    io.out << ToJson(resp);
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "STEP", "LOSS", "SAMPLES/S", "CREATED", "MESSAGE"}};
  for (const auto& j : resp.jobs()) {
    Progress p = ComputeProgress(j, {});
    rows.push_back({j.id(), j.name(), StateName(j.state()),
                    p.total_steps > 0 ? absl::StrCat(p.step, "/", p.total_steps)
                                      : absl::StrCat(p.step),
                    j.step() > 0 ? absl::StrFormat("%.4f", j.loss()) : "-",
                    j.samples_per_second() > 0 ? absl::StrFormat("%.1f", j.samples_per_second())
                                               : "-",
                    Age(j.created_unix_ms()), j.message()});
  }
  io.out << TextTable(rows);
  return kOk;
}

// ---------------------------------------------------------------- status
int CmdStatus(const GlobalOptions& g, Io io, const std::string& job_id, bool json) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->GetJob(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  const v1::Job& j = resp.job();
  if (json) {
    io.out << ToJson(resp);
    return kOk;
  }
  Progress p = ComputeProgress(j, {});
  io.out << "job      " << j.id() << " (" << j.name() << ")\n";
  io.out << "state    " << StateName(j.state()) << (j.message().empty() ? "" : "  ") << j.message()
         << "\n";
  io.out << "created  " << Age(j.created_unix_ms()) << ", updated " << Age(j.updated_unix_ms())
         << (j.restarts() > 0 ? absl::StrCat(", ", j.restarts(), " restart(s)") : "") << "\n";
  io.out << "progress " << ProgressLine(p) << "\n";
  const v1::Plan& plan = resp.plan();
  if (plan.ranks() > 0) {
    io.out << absl::StrFormat("plan     %d rank(s) %s/%s, micro_batch %d x accumulation %d, %s\n",
                              plan.ranks(), plan.device(), plan.backend(), plan.micro_batch(),
                              plan.accumulation(), plan.precision());
  }
  if (plan.trials_size() > 0) io.out << "\ntuning trials:\n" << FormatTrials(plan);
  if (j.ranks_size() > 0) io.out << "\n" << RankRows(j, {});
  if (j.plan_check().samples() > 0) {
    const v1::PlanCheck& c = j.plan_check();
    auto pred = [](double v, const char* fmt) {
      return v > 0 ? absl::StrFormat(fmt, v) : std::string("-");
    };
    auto err = [](double p, double m) {
      return p > 0 && m > 0 ? absl::StrFormat("%+.1f%%", 100 * (p - m) / m) : std::string("-");
    };
    std::vector<std::vector<std::string>> t = {{"", "PREDICTED", "MEASURED", "ERROR"}};
    t.push_back({"step seconds", pred(c.predicted_step_seconds(), "%.4f"),
                 absl::StrFormat("%.4f", c.measured_step_seconds()),
                 err(c.predicted_step_seconds(), c.measured_step_seconds())});
    t.push_back({"comm share", pred(100 * c.predicted_comm_share(), "%.1f%%"),
                 absl::StrFormat("%.1f%%", 100 * c.measured_comm_share()),
                 c.predicted_step_seconds() > 0
                     ? err(c.predicted_comm_share(), c.measured_comm_share())
                     : std::string("-")});
    t.push_back({"all-reduce seconds", pred(c.predicted_allreduce_seconds(), "%.4f"),
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
  return kOk;
}

// ---------------------------------------------------------------- watch / follow
namespace {

struct LiveState {
  std::mutex mu;
  std::condition_variable cv;
  v1::Job job;
  bool have_job = false;
  std::map<int, v1::StepMetrics> ranks;
  LossHistory losses;                    // for the watch view's sparkline
  std::vector<v1::JobEvent> new_events;  // not yet printed
  int64_t last_seq = 0;
  bool terminal = false;
  bool stop = false;
  absl::Status fatal;                    // set when following must give up
  Clock::time_point last_contact = Clock::now();
  std::shared_ptr<grpc::ClientContext> watch_ctx;
};

}  // namespace

int FollowJob(const GlobalOptions& g, Io io, Client* client, const std::string& job_id,
              bool full_view) {
  LiveState st;
  constexpr auto kGiveUpAfter = std::chrono::seconds(60);

  // Poller: the job snapshot every second (ranks, heartbeat ages, terminal
  // state). It also bounds how long the coordinator may be away.
  std::thread poller([&] {
    while (true) {
      v1::GetJobRequest req;
      req.set_job_id(job_id);
      v1::GetJobResponse resp;
      auto ctx = client->Context(std::chrono::seconds(5));
      grpc::Status s = client->stub()->GetJob(ctx.get(), req, &resp);
      std::unique_lock<std::mutex> l(st.mu);
      if (st.stop) return;
      if (s.ok()) {
        st.last_contact = Clock::now();
        st.job = resp.job();
        st.have_job = true;
        for (const auto& e : resp.events()) {
          if (e.seq() > st.last_seq) {
            st.new_events.push_back(e);
            st.last_seq = e.seq();
          }
        }
        if (IsTerminal(resp.job().state())) st.terminal = true;
      } else if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
                 s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        st.fatal = FromGrpc(s);
      } else if (Clock::now() - st.last_contact > kGiveUpAfter) {
        st.fatal = absl::UnavailableError(absl::StrCat(
            "lost the coordinator for more than 60 s: ", s.error_message()));
      }
      st.cv.notify_all();
      if (st.terminal || !st.fatal.ok()) {
        if (st.watch_ctx) st.watch_ctx->TryCancel();
        return;
      }
      st.cv.wait_for(l, std::chrono::seconds(1), [&] { return st.stop; });
      if (st.stop) return;
    }
  });

  // Watcher: live step samples and events as they happen.
  std::thread watcher([&] {
    double backoff = 0.5;
    while (true) {
      auto ctx = std::shared_ptr<grpc::ClientContext>(client->Context(std::chrono::milliseconds(0)));
      v1::WatchJobRequest req;
      req.set_job_id(job_id);
      {
        std::lock_guard<std::mutex> l(st.mu);
        if (st.stop || st.terminal || !st.fatal.ok()) return;
        st.watch_ctx = ctx;
        req.set_after_event_seq(st.last_seq);
      }
      auto reader = client->stub()->WatchJob(ctx.get(), req);
      v1::WatchJobResponse u;
      while (reader->Read(&u)) {
        std::lock_guard<std::mutex> l(st.mu);
        st.last_contact = Clock::now();
        if (u.has_event()) {
          if (u.event().seq() > st.last_seq) {
            st.new_events.push_back(u.event());
            st.last_seq = u.event().seq();
          }
          if (IsTerminal(u.event().state())) st.terminal = true;
        } else if (u.has_sample() && u.sample().has_step()) {
          st.ranks[u.sample().step().rank()] = u.sample().step();
          st.losses.Add(u.sample().step());
        } else if (u.has_snapshot()) {
          st.job = u.snapshot();
          st.have_job = true;
          if (IsTerminal(u.snapshot().state())) st.terminal = true;
        }
        st.cv.notify_all();
        backoff = 0.5;
      }
      reader->Finish();
      std::unique_lock<std::mutex> l(st.mu);
      st.watch_ctx.reset();
      if (st.stop || st.terminal || !st.fatal.ok()) return;
      st.cv.wait_for(l, std::chrono::duration<double>(backoff), [&] { return st.stop; });
      backoff = std::min(backoff * 2, 5.0);
    }
  });

  // Renderer (this thread).
  int drawn_lines = 0;  // full view on a TTY: lines to erase before redrawing
  bool line_shown = false;
  auto last_plain = Clock::now() - std::chrono::seconds(60);
  std::string last_plain_line;
  std::string last_tty_text;
  auto clear_live = [&] {
    if (!io.err_is_tty) return;
    if (full_view && drawn_lines > 0) {
      io.err << "\x1b[" << drawn_lines << "F\x1b[J";
      drawn_lines = 0;
    } else if (!full_view && line_shown) {
      io.err << "\r\x1b[K";
      line_shown = false;
    }
  };
  absl::Status fatal;
  while (true) {
    std::vector<v1::JobEvent> events;
    v1::Job job;
    std::map<int, v1::StepMetrics> ranks;
    std::vector<double> losses;
    bool terminal, have_job;
    {
      std::unique_lock<std::mutex> l(st.mu);
      st.cv.wait_for(l, std::chrono::milliseconds(io.err_is_tty ? 250 : 1000));
      events.swap(st.new_events);
      job = st.job;
      ranks = st.ranks;
      if (full_view) losses = st.losses.Last(30);
      terminal = st.terminal;
      have_job = st.have_job;
      fatal = st.fatal;
    }
    if (!events.empty()) {
      clear_live();
      for (const auto& e : events) io.err << EventLine(e) << "\n";
    }
    if (!fatal.ok() || terminal) break;
    if (!have_job) continue;
    Progress p = ComputeProgress(job, ranks);
    if (io.err_is_tty) {
      std::string text = full_view ? RenderWatch({job, ranks, losses}) : ProgressLine(p, 20);
      bool shown = full_view ? drawn_lines > 0 : line_shown;
      if (shown && text == last_tty_text) continue;  // nothing new: no redraw
      clear_live();
      io.err << text;
      if (full_view) {
        drawn_lines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      } else {
        line_shown = true;
      }
      last_tty_text = text;
      io.err.flush();
    } else {
      // Plain lines: every 5 s at most, and only when something changed.
      std::string line = ProgressLine(p, 0);
      if (Clock::now() - last_plain >= std::chrono::seconds(5) &&
          line.substr(0, line.find("  elapsed")) !=
              last_plain_line.substr(0, last_plain_line.find("  elapsed"))) {
        if (full_view) {
          io.err << RenderWatch({job, ranks, losses}) << "\n";
        } else {
          io.err << line << "\n";
        }
        io.err.flush();
        last_plain = Clock::now();
        last_plain_line = line;
      }
    }
  }
  clear_live();
  {
    std::lock_guard<std::mutex> l(st.mu);
    st.stop = true;
    if (st.watch_ctx) st.watch_ctx->TryCancel();
  }
  st.cv.notify_all();
  poller.join();
  watcher.join();
  if (!fatal.ok()) return ReportError(io.err, g, fatal);

  // The final snapshot (eval metrics may arrive with the last update).
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = client->Context();
  grpc::Status s = client->stub()->GetJob(ctx.get(), req, &resp);
  v1::Job job = s.ok() ? resp.job() : st.job;
  if (full_view) {
    // The final screen, once (kept on a TTY: it is not erased).
    std::lock_guard<std::mutex> l(st.mu);
    io.err << RenderWatch({job, st.ranks, st.losses.Last(30)});
  } else {
    io.err << ProgressLine(ComputeProgress(job, {}), 0) << "\n";
  }
  io.out << "job " << job.id() << " " << StateName(job.state());
  if (!job.message().empty()) io.out << ": " << job.message();
  io.out << "\n";
  if (const std::string plot = LossPlot(job); !plot.empty()) io.out << "\nloss (mean over ranks):\n" << plot;
  if (!job.eval().empty()) io.out << "\nevaluation (step " << job.step() << "):\n" << EvalTable(EvalOf(job));
  io.out.flush();
  return job.state() == v1::SUCCEEDED ? kOk : kJobFailed;
}

int CmdWatch(const GlobalOptions& g, Io io, const std::string& job_id) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  return FollowJob(g, io, client->get(), job_id, /*full_view=*/true);
}

// ---------------------------------------------------------------- logs
int CmdLogs(const GlobalOptions& g, Io io, const std::string& job_id, int rank, bool follow) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  int64_t offset = 0;
  double backoff = 0.5;
  auto last_ok = Clock::now();
  while (true) {
    v1::GetLogsRequest req;
    req.set_job_id(job_id);
    req.set_rank(rank);
    req.set_offset(offset);
    req.set_follow(follow);
    auto ctx = (*client)->Context(follow ? std::chrono::milliseconds(0) : std::chrono::seconds(30));
    auto reader = (*client)->stub()->GetLogs(ctx.get(), req);
    v1::GetLogsResponse chunk;
    bool eof = false;
    while (reader->Read(&chunk)) {
      io.out << chunk.data();
      io.out.flush();
      if (chunk.next_offset() > 0) offset = chunk.next_offset();
      else offset += static_cast<int64_t>(chunk.data().size());
      eof = chunk.eof();
      last_ok = Clock::now();
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) {
      bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE;
      if (follow && transient && Clock::now() - last_ok < std::chrono::seconds(60)) {
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
        backoff = std::min(backoff * 2, 5.0);
        continue;
      }
      return ReportError(io.err, g, FromGrpc(s));
    }
    // Without --follow one pass is all; with it, the server streams until the
    // job ends (eof), or we ask again from where we are.
    if (!follow || eof) return kOk;
    last_ok = Clock::now();
  }
}

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
  io.out << "job " << job_id << " " << StateName(resp.job().state());
  if (!resp.job().message().empty()) io.out << ": " << resp.job().message();
  io.out << "\n";
  return kOk;
}

// ---------------------------------------------------------------- topo
int CmdTopo(Io io, const std::string& root, bool json) {
  ProbeOptions o;
  o.root = root.empty() ? "/" : root;
  auto t = ProbeTopology(o);
  if (!t.ok()) {
    io.err << "error: " << t.status().message() << "\n";
    return kUsage;
  }
  if (json) {
    io.out << ToJson(*t);
  } else {
    io.out << FormatTopoMatrix(*t);
  }
  return kOk;
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
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "CONNECTED", "HB_AGE", "CPUS", "MEMORY", "GPUS", "WSL2", "JOBS"}};
  for (const auto& n : resp.nodes()) {
    const auto& t = n.topology();
    std::string gpus = absl::StrCat(t.gpus_size());
    if (t.gpus_size() > 0) absl::StrAppend(&gpus, " x ", t.gpus(0).name());
    rows.push_back({n.name(), n.address().empty() ? "-" : n.address(),
                    n.connected() ? "yes" : "no",
                    absl::StrFormat("%.1fs", n.heartbeat_age_seconds()),
                    absl::StrCat(t.cpu_count()),
                    t.memory_bytes() > 0
                        ? absl::StrFormat("%.1f GiB", t.memory_bytes() / double(1ull << 30))
                        : "?",
                    gpus, t.wsl2() ? "yes" : "no",
                    n.running_jobs().empty() ? "-" : absl::StrJoin(n.running_jobs(), ",")});
  }
  io.out << TextTable(rows);
  return kOk;
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
  return kOk;
}

// ---------------------------------------------------------------- diagnose
int CmdDiagnose(Io io) {
  io.out << "dgca diagnose finds the stage that limits a job's throughput:\n"
            "  dgca diagnose JOB [--json]   where a job's step time goes (data wait, compute,\n"
            "                               exposed communication, a straggling rank), from\n"
            "                               its measured steps (running or finished), the\n"
            "                               limiting stage and its fix\n"
            "  dgca diagnose comm [--ranks N] [--device cpu|cuda] [--sizes 1K..256M] [--json]\n"
            "                               all-reduce bus bandwidth and latency at several\n"
            "                               sizes on the nodes (stored for the planner)\n";
  return kOk;
}

namespace {
std::string Pct(double part, double whole) {
  return absl::StrFormat("%.1f%%", whole > 0 ? 100 * part / whole : 0.0);
}
}  // namespace

int CmdDiagnoseJob(const GlobalOptions& g, Io io, const std::string& job_id, bool json) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::DiagnoseJobRequest req;
  req.set_job_id(job_id);
  v1::DiagnoseJobResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->DiagnoseJob(ctx.get(), req, &resp);
  // Unknown job or too few steps: exit 2 (ExitCodeFor).
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (json) {
    io.out << ToJson(resp);
    return kOk;
  }
  const v1::Plan& plan = resp.plan();
  const v1::StepBreakdown& b = resp.breakdown();
  const double step = b.step_seconds();
  io.out << absl::StrFormat(
      "# dgca diagnose %s (%s): %s, %d rank(s) %s/%s, micro-batch %d x %d accumulation; medians "
      "of %d %s rank-steps\n",
      resp.job_id(), resp.name(), StateName(resp.state()), plan.ranks(), plan.device(),
      plan.backend(), plan.micro_batch(), plan.accumulation(), b.samples(),
      resp.live() ? "steady-state (so far)" : "steady-state");
  if (b.ranks_size() > 1) {
    std::string node;
    for (const auto& r : b.ranks()) {
      if (r.rank() == b.critical_rank() && !r.node().empty()) node = " (node " + r.node() + ")";
    }
    io.out << absl::StrFormat(
        "# the step of rank %d%s, the critical rank: longest before the all-reduce, which the "
        "others wait for\n",
        b.critical_rank(), node);
  }
  std::vector<std::vector<std::string>> rows = {{"STAGE", "SECONDS", "SHARE", ""}};
  const double hidden = b.allreduce_seconds() - b.exposed_comm_seconds();
  rows.push_back({"data wait", absl::StrFormat("%.4f", b.data_wait_seconds()),
                  Pct(b.data_wait_seconds(), step), ""});
  rows.push_back({"compute", absl::StrFormat("%.4f", b.compute_seconds()),
                  Pct(b.compute_seconds(), step),
                  hidden > 0 ? absl::StrFormat("(%.4f s of all-reduce hidden in it)", hidden) : ""});
  rows.push_back({"exposed comm", absl::StrFormat("%.4f", b.exposed_comm_seconds()),
                  Pct(b.exposed_comm_seconds(), step),
                  b.allreduce_seconds() > 0
                      ? absl::StrFormat("(all-reduce %.4f s in total)", b.allreduce_seconds())
                      : ""});
  rows.push_back({"step", absl::StrFormat("%.4f", step), "100.0%", ""});
  io.out << TextTable(rows);
  if (b.ranks_size() > 1) {
    std::vector<std::vector<std::string>> rr = {
        {"RANK", "NODE", "STEPS", "STEP(s)", "DATA", "COMPUTE", "EXPOSED"}};
    for (const auto& r : b.ranks()) {
      rr.push_back({absl::StrCat(r.rank()), r.node().empty() ? "-" : r.node(),
                    absl::StrCat(r.samples()), absl::StrFormat("%.4f", r.step_seconds()),
                    Pct(r.data_wait_seconds(), r.step_seconds()),
                    Pct(r.compute_seconds(), r.step_seconds()),
                    Pct(r.exposed_comm_seconds(), r.step_seconds())});
    }
    io.out << "\n" << TextTable(rr);
  }
  io.out << "\n";
  for (const auto& f : resp.findings()) {
    const char* mark = f.limiting()      ? "LIMITS"
                       : f.near_limit()  ? "near"
                       : f.above_limit() ? "high"
                                         : "ok";
    io.out << absl::StrFormat("%-9s %-6s %s\n", f.stage(), mark, f.finding());
    if (!f.fix().empty()) io.out << absl::StrFormat("%-9s %-6s fix: %s\n", "", "", f.fix());
  }
  const v1::MemoryFinding& mem = resp.memory();
  if (!mem.finding().empty()) {
    const char* mark = !mem.known() ? "-" : mem.above_target() ? "high" : "ok";
    io.out << absl::StrFormat("%-9s %-6s %s\n", "memory", mark, mem.finding());
    if (!mem.fix().empty()) io.out << absl::StrFormat("%-9s %-6s fix: %s\n", "", "", mem.fix());
  }
  io.out << "\nlimiting stage: " << resp.limiting_stage() << "\n";
  return kOk;
}

// ---------------------------------------------------------------- diagnose comm
namespace {

absl::StatusOr<int64_t> ParseByteSize(const std::string& t) {
  std::string x(absl::StripAsciiWhitespace(t));
  if (x.empty()) return absl::InvalidArgumentError("empty size");
  int64_t mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(x.back())));
  if (last == 'B') {
    x.pop_back();
    if (!x.empty()) last = static_cast<char>(std::toupper(static_cast<unsigned char>(x.back())));
  }
  if (last == 'K' || last == 'M' || last == 'G') {
    mult = last == 'K' ? 1024 : last == 'M' ? 1024 * 1024 : int64_t{1} << 30;
    x.pop_back();
  }
  int64_t v = 0;
  if (x.empty() || !absl::SimpleAtoi(x, &v) || v <= 0 || v > (int64_t{1} << 31) / mult) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad size '", t, "': expected a positive integer with an optional K, M or G suffix, "
        "at most 2G"));
  }
  return v * mult;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseProbeSizes(const std::string& text) {
  std::vector<int64_t> out;
  size_t dots = text.find("..");
  if (dots != std::string::npos) {
    std::string lo_s = text.substr(0, dots), hi_s = text.substr(dots + 2);
    int64_t factor = 4;
    if (size_t c = hi_s.find(':'); c != std::string::npos) {
      if (!absl::SimpleAtoi(hi_s.substr(c + 1), &factor) || factor < 2 || factor > 1024) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bad step in '", text, "': LO..HI:F needs an integer factor F between 2 and 1024"));
      }
      hi_s = hi_s.substr(0, c);
    }
    auto lo = ParseByteSize(lo_s);
    if (!lo.ok()) return lo.status();
    auto hi = ParseByteSize(hi_s);
    if (!hi.ok()) return hi.status();
    if (*hi < *lo) {
      return absl::InvalidArgumentError(absl::StrCat("bad range '", text, "': HI is below LO"));
    }
    for (int64_t b = *lo; b <= *hi; b *= factor) out.push_back(b);
  } else {
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      auto b = ParseByteSize(std::string(part));
      if (!b.ok()) return b.status();
      out.push_back(*b);
    }
  }
  if (out.empty() || out.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sizes '", text, "' gives ", out.size(), " sizes; 1 to 64 are allowed"));
  }
  for (int64_t b : out) {
    if (b % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "size ", b, " bytes is not a multiple of 4 (the probe all-reduces whole floats)"));
    }
  }
  return out;
}

int CmdDiagnoseComm(const GlobalOptions& g, Io io, const DiagnoseCommOptions& o) {
  if (o.ranks < 1 || o.ranks > 1024) {
    io.err << "error: --ranks must be between 1 and 1024, got " << o.ranks << "\n";
    return kUsage;
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    io.err << "error: --device must be cpu, cuda or auto, got '" << o.device << "'\n";
    return kUsage;
  }
  std::vector<int64_t> sizes;
  if (!o.sizes.empty()) {
    auto s = ParseProbeSizes(o.sizes);
    if (!s.ok()) {
      io.err << "error: --sizes: " << s.status().message() << "\n";
      return kUsage;
    }
    sizes = *s;
  }
  // The spec of the probe job (JobSpec.kind = comm_probe).
  std::string yaml = absl::StrCat("name: diagnose-comm\nkind: comm_probe\n",
                                  "resources: {ranks: ", o.ranks, ", device: ", o.device, "}\n",
                                  "comm: {backend: ",
                                  o.device == "cpu" ? "gloo" : o.device == "cuda" ? "nccl" : "auto",
                                  "}\ntuning: {mode: off}\n");
  if (!sizes.empty()) absl::StrAppend(&yaml, "probe: {sizes: [", absl::StrJoin(sizes, ", "), "]}\n");
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  req.set_spec_path("(dgca diagnose comm)");
  v1::SubmitJobResponse resp;
  {
    auto ctx = (*client)->Context(std::chrono::seconds(30));
    grpc::Status s = (*client)->stub()->SubmitJob(ctx.get(), req, &resp);
    if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  }
  if (resp.problems_size() > 0) return PrintProblems(io, "(dgca diagnose comm)", resp.problems());
  io.err << "submitted comm probe job " << resp.job_id() << "\n";
  std::ostringstream follow_out;  // the job's final state line: only on failure
  Io follow_io{follow_out, io.err, io.err_is_tty};
  int rc = FollowJob(g, follow_io, client->get(), resp.job_id(), /*full_view=*/false);
  v1::GetJobRequest greq;
  greq.set_job_id(resp.job_id());
  v1::GetJobResponse job;
  auto ctx = (*client)->Context(std::chrono::seconds(10));
  grpc::Status s = (*client)->stub()->GetJob(ctx.get(), greq, &job);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (rc != kOk) {
    io.err << follow_out.str();
    io.err << "error: the comm probe job " << resp.job_id()
           << " did not succeed (its reason is above); no measurement stored\n";
    return rc;
  }
  if (job.probe_rows_size() == 0) {
    io.err << "error: the comm probe job " << resp.job_id() << " stored no measurement\n";
    return kJobFailed;
  }
  std::vector<std::string> nodes(job.plan().rank_nodes().begin(), job.plan().rank_nodes().end());
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  const v1::CommProbeRow& first = job.probe_rows(0);
  if (o.json) {
    std::string out = absl::StrFormat(
        "{\n  \"job_id\": \"%s\",\n  \"backend\": \"%s\",\n  \"ranks\": %d,\n"
        "  \"nodes\": [%s],\n  \"rows\": [",
        resp.job_id(), first.backend(), first.world_size(),
        nodes.empty() ? "" : absl::StrCat("\"", absl::StrJoin(nodes, "\", \""), "\""));
    for (int i = 0; i < job.probe_rows_size(); ++i) {
      const auto& r = job.probe_rows(i);
      absl::StrAppendFormat(&out,
                            "%s\n    {\"bytes\": %d, \"count\": %d, \"iters\": %d, "
                            "\"time_us\": %.3f, \"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f}",
                            i ? "," : "", r.bytes(), r.count(), r.iters(), r.seconds_per_op() * 1e6,
                            r.algbw_bytes_per_second() / 1e9, r.busbw_bytes_per_second() / 1e9);
    }
    out += "\n  ]\n}\n";
    io.out << out;
    return kOk;
  }
  io.out << absl::StrFormat("# dgca diagnose comm: job %s, %d ranks, %s, nodes %s\n",
                            resp.job_id(), first.world_size(), first.backend(),
                            absl::StrJoin(nodes, ","));
  io.out << "# busbw = algbw * 2(n-1)/n; rank 0's timing; stored for the planner\n";
  io.out << absl::StrFormat("%12s %12s %8s %12s %12s %12s\n", "size(B)", "count", "iters",
                            "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  for (const auto& r : job.probe_rows()) {
    io.out << absl::StrFormat("%12d %12d %8d %12.1f %12.4f %12.4f\n", r.bytes(), r.count(),
                              r.iters(), r.seconds_per_op() * 1e6,
                              r.algbw_bytes_per_second() / 1e9, r.busbw_bytes_per_second() / 1e9);
  }
  return kOk;
}

// ---------------------------------------------------------------- data synth
int CmdDataSynth(Io io, const std::string& out_dir) {
  if (out_dir.empty()) {
    io.err << "error: --out DIR is required\n";
    return kUsage;
  }
#ifdef DGCA_HAVE_SYNTH
  SynthOptions o;
  o.out_dir = out_dir;
  SynthStats st;
  Status s = SynthesizeCorpus(o, &st);
  if (!s.ok()) {
    io.err << "error: " << s.message() << "\n";
    return kJobFailed;
  }
  io.out << absl::StrFormat(
      "wrote %s/train.txt (%d sentences, %d with errors) and %s/test.txt (%d sentences, %d with "
      "errors)\n%d homophone substitutions; %d candidate sentences from %d source files\n",
      out_dir, st.train, st.train_with_errors, out_dir, st.test, st.test_with_errors,
      st.substitutions, st.candidate_sentences, st.files);
  return kOk;
#else
  io.err << "error: dgca data synth is not built into this dgca yet (model/core/synth.h)\n";
  return kJobFailed;
#endif
}

}  // namespace cli
}  // namespace dgca
