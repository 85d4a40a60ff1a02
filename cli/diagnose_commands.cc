// `dgca diagnose JOB` and `dgca diagnose comm` (cli/commands.h).
#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/command_util.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace cli {
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
  return kExitOk;
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
    return kExitOk;
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
  return kExitOk;
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
    return kExitUsage;
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    io.err << "error: --device must be cpu, cuda or auto, got '" << o.device << "'\n";
    return kExitUsage;
  }
  std::vector<int64_t> sizes;
  if (!o.sizes.empty()) {
    auto s = ParseProbeSizes(o.sizes);
    if (!s.ok()) {
      io.err << "error: --sizes: " << s.status().message() << "\n";
      return kExitUsage;
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
  if (rc != kExitOk) {
    io.err << follow_out.str();
    io.err << "error: the comm probe job " << resp.job_id()
           << " did not succeed (its reason is above); no measurement stored\n";
    return rc;
  }
  if (job.probe_rows_size() == 0) {
    io.err << "error: the comm probe job " << resp.job_id() << " stored no measurement\n";
    return kExitFailed;
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
    return kExitOk;
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
  return kExitOk;
}

}  // namespace cli
}  // namespace dgca
