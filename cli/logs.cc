// `dgca logs JOB [--rank N] [-f]`: one rank's output as it was written, or,
// without --rank, every rank's, each line prefixed "[rank N] " (with -f the
// ranks' new lines interleave as they come, whole lines only).
#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

// Writes whole lines of a byte stream, each behind `prefix`, under `mu`:
// the ranks' lines interleave but never split.
class PrefixedLines {
 public:
  PrefixedLines(std::ostream* out, absl::Mutex* mu, std::string prefix)
      : out_(out), mu_(mu), prefix_(std::move(prefix)) {}
  void Add(absl::string_view data) {
    partial_.append(data.data(), data.size());
    size_t start = 0, nl;
    std::string lines;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      absl::StrAppend(&lines, prefix_, absl::string_view(partial_).substr(start, nl + 1 - start));
      start = nl + 1;
    }
    partial_.erase(0, start);
    Write(lines);
  }
  // The last line, when it did not end in a newline.
  void Finish() {
    if (partial_.empty()) return;
    Write(absl::StrCat(prefix_, partial_, "\n"));
    partial_.clear();
  }

 private:
  void Write(const std::string& s) {
    if (s.empty()) return;
    absl::MutexLock l(mu_);
    *out_ << s;
    out_->flush();
  }
  std::ostream* out_;
  absl::Mutex* mu_;
  std::string prefix_;
  std::string partial_;
};

// Streams rank `rank`'s log of `job` from its start into `sink`: one pass,
// or with `follow` until the job ends (reconnecting for up to 60 s while the
// coordinator is unavailable).
absl::Status StreamRankLog(Client& client, const std::string& job, int rank, bool follow,
                           const std::function<void(absl::string_view)>& sink) {
  int64_t offset = 0;
  double backoff = 0.5;
  auto last_ok = Clock::now();
  while (true) {
    v1::GetLogsRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_offset(offset);
    req.set_follow(follow);
    auto ctx = client.Context(follow ? std::chrono::milliseconds(0) : std::chrono::seconds(30));
    auto reader = client.stub()->GetLogs(ctx.get(), req);
    v1::GetLogsResponse chunk;
    bool eof = false;
    while (reader->Read(&chunk)) {
      sink(chunk.data());
      if (chunk.next_offset() > 0) offset = chunk.next_offset();
      else offset += static_cast<int64_t>(chunk.data().size());
      eof = chunk.eof();
      last_ok = Clock::now();
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) {
      const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE;
      if (follow && transient && Clock::now() - last_ok < std::chrono::seconds(60)) {
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
        backoff = std::min(backoff * 2, 5.0);
        continue;
      }
      return FromGrpc(s);
    }
    // Without --follow one pass is all; with it, the server streams until
    // the job ends (eof), or we ask again from where we are.
    if (!follow || eof) return absl::OkStatus();
    last_ok = Clock::now();
  }
}

}  // namespace

int CmdLogs(const GlobalOptions& g, Io io, const std::string& job_id, int rank, bool follow) {
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  absl::StatusOr<v1::GetJobResponse> got = (*client)->GetJob(job_id);
  if (!got.ok()) return ReportError(io.err, g, got.status());
  const v1::GetJobResponse& job = *got;
  const int ranks = job.job().ranks_size() > 0 ? job.job().ranks_size() : job.plan().ranks();
  if (rank >= 0 && ranks > 0 && rank >= ranks) {
    io.err << "error: job " << job_id << " has " << ranks << " rank" << (ranks == 1 ? "" : "s")
           << " (--rank 0" << (ranks > 1 ? absl::StrCat("..", ranks - 1) : "") << "): there is no rank "
           << rank << "\n";
    return kExitUsage;
  }
  if (rank >= 0) {
    absl::Status s = StreamRankLog(**client, job_id, rank, follow, [&](absl::string_view d) {
      io.out.write(d.data(), d.size());
      io.out.flush();
    });
    return s.ok() ? kExitOk : ReportError(io.err, g, s);
  }
  if (ranks <= 0) {
    io.err << "job " << job_id << " has no ranks yet (" << StateName(job.job().state())
           << "): nothing is logged until it runs\n";
    return kExitOk;
  }
  // Every rank. Without -f one after the other; with -f side by side, one
  // stream each, until the job ends.
  absl::Mutex mu;
  std::vector<absl::Status> status(ranks);
  auto one = [&](int r) {
    PrefixedLines lines(&io.out, &mu, absl::StrCat("[rank ", r, "] "));
    status[r] = StreamRankLog(**client, job_id, r, follow, [&](absl::string_view d) { lines.Add(d); });
    lines.Finish();
  };
  if (follow) {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) threads.emplace_back(one, r);
    for (auto& t : threads) t.join();
  } else {
    for (int r = 0; r < ranks; ++r) one(r);
  }
  // A rank whose log cannot be had (it ran on another node's agent, or
  // never started) is said, and the others' are still shown.
  int failed = 0;
  absl::Status first;
  for (int r = 0; r < ranks; ++r) {
    if (status[r].ok()) continue;
    if (failed++ == 0) first = status[r];
    io.err << "[rank " << r << "] no log: " << status[r].message() << "\n";
  }
  return failed == ranks ? ReportError(io.err, g, first) : kExitOk;
}

}  // namespace cli
}  // namespace dgca
