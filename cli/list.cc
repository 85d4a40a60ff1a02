// `dgca list [--state S] [--name TEXT] [--since WHEN] [--limit N] [--json]`:
// the jobs, newest first, one row each (the message cut to its first line;
// `dgca status` has it whole).
#include "cli/list.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {

absl::StatusOr<std::vector<v1::JobState>> ParseStates(const std::vector<std::string>& values) {
  static const char kValid[] =
      "pending, planning, running, succeeded, failed, cancelled, active (the first three) or "
      "ended (the last three)";
  std::vector<v1::JobState> out;
  for (const std::string& value : values) {
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      const std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(part));
      v1::JobState st;
      if (name == "ACTIVE") {
        out.insert(out.end(), {v1::PENDING, v1::PLANNING, v1::RUNNING});
      } else if (name == "ENDED") {
        out.insert(out.end(), {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED});
      } else if (v1::JobState_Parse(name, &st) && st != v1::JOB_STATE_UNSPECIFIED) {
        out.push_back(st);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--state '", part, "': not a job state; valid: ", kValid));
      }
    }
  }
  return out;
}

absl::StatusOr<int64_t> ParseSince(const std::string& value, int64_t now_unix_ms) {
  const std::string v(absl::StripAsciiWhitespace(value));
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--since '", value,
        "': expected a span back from now (90s, 30m, 2h, 7d, 1w) or a UTC date or time "
        "(2026-11-28, 2026-11-28T14:05, 2026-11-28T14:05:09)"));
  };
  if (v.empty()) return invalid();
  // A span: digits, then one unit.
  const char unit = v.back();
  int64_t n = 0;
  if (std::string("smhdw").find(unit) != std::string::npos &&
      absl::SimpleAtoi(absl::string_view(v).substr(0, v.size() - 1), &n) && n >= 0) {
    const int64_t unit_s = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600
                           : unit == 'd' ? 86400 : 7 * 86400;
    if (n > (int64_t{1} << 40) / unit_s) return invalid();
    return now_unix_ms - n * unit_s * 1000;
  }
  for (const char* fmt : {"%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"}) {
    absl::Time t;
    std::string err;
    if (absl::ParseTime(fmt, v, absl::UTCTimeZone(), &t, &err)) return absl::ToUnixMillis(t);
  }
  return invalid();
}

int CmdList(const GlobalOptions& g, Io io, const ListOptions& o) {
  v1::ListJobsRequest req;
  auto states = ParseStates(o.states);
  if (!states.ok()) return ReportError(io.err, g, states.status());
  for (v1::JobState st : *states) req.add_states(st);
  if (!o.since.empty()) {
    auto since = ParseSince(o.since, static_cast<int64_t>(std::time(nullptr)) * 1000);
    if (!since.ok()) return ReportError(io.err, g, since.status());
    req.set_since_unix_ms(*since);
  }
  if (o.limit < 0) {
    return ReportError(io.err, g,
                       absl::InvalidArgumentError(absl::StrCat(
                           "--limit ", o.limit, ": expected 0 (all) or a positive count")));
  }
  req.set_limit(o.limit);
  req.set_name_contains(o.name);
  auto client = Client::Connect(g);
  if (!client.ok()) return ReportError(io.err, g, client.status());
  v1::ListJobsResponse resp;
  auto ctx = (*client)->Context();
  grpc::Status s = (*client)->stub()->ListJobs(ctx.get(), req, &resp);
  if (!s.ok()) return ReportError(io.err, g, FromGrpc(s));
  if (o.json) {
    io.out << ToJson(resp);
    return kExitOk;
  }
  io.out << ListTable(resp.jobs(), static_cast<int64_t>(std::time(nullptr)) * 1000);
  return kExitOk;
}

std::string ListTable(const google::protobuf::RepeatedPtrField<v1::Job>& jobs,
                      int64_t now_unix_ms) {
  std::vector<std::vector<std::string>> rows = {{"JOB", "NAME", "STATE", "STEP", "LOSS", "START",
                                                 "END", "ELAPSED", "EXIT", "PEAK MEM", "MESSAGE"}};
  bool marked = false;
  for (const auto& j : jobs) {
    Progress p = ComputeProgress(j, {});
    const std::string loss = LossCell(j);
    marked = marked || (!loss.empty() && loss.back() == '*');
    rows.push_back({j.id(), j.name(), StateName(j.state()),
                    p.total_steps > 0 ? absl::StrCat(p.step, "/", p.total_steps)
                                      : absl::StrCat(p.step),
                    loss, ShortTime(j.started_unix_ms(), now_unix_ms),
                    ShortTime(j.ended_unix_ms(), now_unix_ms),
                    ElapsedCell(j, now_unix_ms), ExitCell(j), HumanBytes(j.peak_memory_bytes()),
                    j.message()});
  }
  // The message gets what is left of kListWidth columns (at least
  // kMinMessage characters, "..." included), cut to one line: the table
  // stays one row per job, `dgca status` has the message whole.
  size_t used = 0;
  for (size_t c = 0; c + 1 < rows[0].size(); ++c) {
    size_t widest = 0;
    for (const auto& row : rows) widest = std::max(widest, row[c].size());  // as TextTable pads
    used += widest + 2;
  }
  const size_t width = used + kMinMessage < kListWidth ? kListWidth - used : kMinMessage;
  for (size_t r = 1; r < rows.size(); ++r) {
    std::string& m = rows[r].back();
    // OneLine adds "..." to what it cuts: cut 3 short of the width.
    if (OneLine(m, width) != m) m = OneLine(m, width - 3);
  }
  std::string out = TextTable(rows);
  if (marked) absl::StrAppend(&out, kLastStepMark, "\n");
  return out;
}

}  // namespace cli
}  // namespace dgca
