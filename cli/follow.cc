// Following a job live: `dgca watch JOB`, `dgca submit --wait` (FollowJob in
// cli/commands.h). A poller and a WatchJob stream feed one LiveState; this
// thread renders it.
#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/command_util.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "cli/watch_view.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

// An event as FollowJob prints it as it comes. The terminal state event
// carries the job's final message, which FollowJob prints in full at the
// end (stdout): here only its headline, so that a long failure (every
// missing input file, a rank's last output) is not said twice in a row.
std::string FollowEventLine(const v1::JobEvent& e) {
  if (e.kind() != "state" || !IsTerminal(e.state())) return EventLine(e);
  const std::string& m = e.message();
  const size_t cut = std::min(m.find('\n'), m.find("; last output:"));
  if (cut == std::string::npos) return EventLine(e);
  v1::JobEvent head = e;
  head.set_message(absl::StrCat(absl::StripSuffix(m.substr(0, cut), ":"),
                                " (the job's message follows in full)"));
  return EventLine(head);
}

}  // namespace

// ---------------------------------------------------------------- watch / follow
namespace {

// What the poller and watcher threads learn, for the renderer.
struct LiveState {
  absl::Mutex mu;
  absl::CondVar cv;  // something new to render, or stop
  v1::Job job ABSL_GUARDED_BY(mu);
  bool have_job ABSL_GUARDED_BY(mu) = false;
  std::map<int, v1::StepMetrics> ranks ABSL_GUARDED_BY(mu);
  LossHistory losses ABSL_GUARDED_BY(mu);  // for the watch view's sparkline
  std::vector<v1::JobEvent> new_events ABSL_GUARDED_BY(mu);  // not yet printed
  int64_t last_seq ABSL_GUARDED_BY(mu) = 0;
  bool terminal ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Status fatal ABSL_GUARDED_BY(mu);  // set when following must give up
  Clock::time_point last_contact ABSL_GUARDED_BY(mu) = Clock::now();
  std::shared_ptr<grpc::ClientContext> watch_ctx ABSL_GUARDED_BY(mu);
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
      absl::MutexLock l(&st.mu);
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
      st.cv.SignalAll();
      if (st.terminal || !st.fatal.ok()) {
        if (st.watch_ctx) st.watch_ctx->TryCancel();
        return;
      }
      st.mu.AwaitWithTimeout(absl::Condition(&st.stop), absl::Seconds(1));
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
        absl::MutexLock l(&st.mu);
        if (st.stop || st.terminal || !st.fatal.ok()) return;
        st.watch_ctx = ctx;
        req.set_after_event_seq(st.last_seq);
      }
      auto reader = client->stub()->WatchJob(ctx.get(), req);
      v1::WatchJobResponse u;
      while (reader->Read(&u)) {
        absl::MutexLock l(&st.mu);
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
        st.cv.SignalAll();
        backoff = 0.5;
      }
      reader->Finish();
      absl::MutexLock l(&st.mu);
      st.watch_ctx.reset();
      if (st.stop || st.terminal || !st.fatal.ok()) return;
      st.mu.AwaitWithTimeout(absl::Condition(&st.stop), absl::Seconds(backoff));
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
      absl::MutexLock l(&st.mu);
      st.cv.WaitWithTimeout(&st.mu, absl::Milliseconds(io.err_is_tty ? 250 : 1000));
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
      for (const auto& e : events) io.err << FollowEventLine(e) << "\n";
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
    absl::MutexLock l(&st.mu);
    st.stop = true;
    if (st.watch_ctx) st.watch_ctx->TryCancel();
  }
  st.cv.SignalAll();
  poller.join();
  watcher.join();
  if (!fatal.ok()) return ReportError(io.err, g, fatal);

  // The final snapshot (eval metrics may arrive with the last update).
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::GetJobResponse resp;
  auto ctx = client->Context();
  grpc::Status s = client->stub()->GetJob(ctx.get(), req, &resp);
  v1::Job job;
  {
    absl::MutexLock l(&st.mu);  // the threads are done; for the annotations
    job = s.ok() ? resp.job() : st.job;
  }
  if (full_view) {
    // The final screen, once (kept on a TTY: it is not erased).
    absl::MutexLock l(&st.mu);
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
  return job.state() == v1::SUCCEEDED ? kExitOk : kExitFailed;
}

int CmdWatch(const GlobalOptions& g, Io io, const std::string& job_id) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  return FollowJob(g, io, client->get(), job_id, /*full_view=*/true);
}

}  // namespace cli
}  // namespace dgca
