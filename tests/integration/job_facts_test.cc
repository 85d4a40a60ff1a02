// Issue 29 end to end, with the real coordinator, agent and rank processes:
// a job's final loss is one number, the same in each rank's log, `dgca
// list`, `dgca status` (text and --json) and /metrics; --json prints 64-bit
// integers as numbers; `dgca list` fills START, END, ELAPSED, EXIT and PEAK
// MEM; a failed job shows its rank's exit code or signal; an ended job's
// live /metrics series are gone; and all of it survives a coordinator
// restart.
#include <signal.h>

#include <gtest/gtest.h>

#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class JobFactsTest : public CoordinatorSuite<JobFactsTest, true> {
 public:
  static constexpr const char* kName = "job-facts";
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  return lines;
}

// The row of `job` in `dgca list`'s table ("" when absent).
std::string ListRow(const std::string& table, const std::string& job) {
  for (const std::string& line : Lines(table)) {
    if (absl::StartsWith(line, job)) return line;
  }
  return "";
}

// `dgca list --json`'s entry for `job`, as a copy (null type when absent).
JsonValue ListEntry(const JsonValue& list, const std::string& job) {
  if (const JsonValue* jobs = list.Find("jobs"); jobs && jobs->is_array()) {
    for (const JsonValue& j : jobs->array) {
      if (JsonStr(j.Find("id")) == job) return j;
    }
  }
  return JsonValue();
}

// A proto int64 field of our CLI's JSON: must be a JSON number.
void ExpectNumber(const JsonValue* v, const char* what, const std::string& raw) {
  ASSERT_NE(v, nullptr) << what << " missing\n" << raw;
  EXPECT_TRUE(v->is_number()) << what << " is not a JSON number\n" << raw;
}

std::string Fixed4(double v) { return absl::StrFormat("%.4f", v); }

// The value of the series `name{job="JOB"}` in a /metrics text ("" when
// absent).
std::string SeriesValue(const std::string& metrics, const std::string& name,
                        const std::string& job) {
  const std::string head = name + "{job=\"" + job + "\"} ";
  const size_t at = metrics.find(head);
  if (at == std::string::npos) return "";
  const size_t end = metrics.find('\n', at);
  return metrics.substr(at + head.size(), end - at - head.size());
}

// A job whose rank fails: EXIT names its exit code (bad data: the rank
// exits 1) or the signal that killed it (kill -9 of a running rank).
TEST_F(JobFactsTest, AFailedJobShowsItsRanksExitCodeOrSignal) {
  WriteFile(*dir_ + "/bad-train.txt", "甲 乙 without a tab\n");
  const std::string bad = *dir_ + "/bad.yaml";
  WriteFile(bad,
            "name: bad-data\n"
            "model: {preset: tiny}\n"
            "data: {train: bad-train.txt, max_seq_len: 32}\n"
            "train: {steps: 5, global_batch: 4, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 1, device: cpu, threads_per_rank: 1}\n");
  Result r = Dgca(*coord_, {"submit", bad, "--wait"}, 60s);
  ASSERT_EQ(r.code, 1) << r.out << r.err;
  const std::string bad_job = r.out.substr(0, r.out.find('\n'));

  // One rank training long enough to be killed while it runs.
  TinySpecOptions o;
  o.ranks = 1;
  Result sub = Dgca(*coord_, {"submit", WriteTinySpec(*dir_, "killed", 5000, o)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  const std::string killed = Trim(sub.out);
  JobView v;
  ASSERT_TRUE(WaitRunning(*coord_, killed, 1, 3, 120s, &v)) << v.raw << coord_->Log();
  // While it runs: the last step's loss, marked; no END, no EXIT.
  Result running = Dgca(*coord_, {"list"});
  const std::string run_row = ListRow(running.out, killed);
  EXPECT_TRUE(std::regex_search(run_row, std::regex(R"( [0-9]+\.[0-9]{4}\* )"))) << running.out;
  EXPECT_NE(running.out.find("* the last step's loss"), std::string::npos) << running.out;
  Result st = Dgca(*coord_, {"status", killed});
  EXPECT_NE(st.out.find("the last step's (mean over ranks)"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("running for "), std::string::npos) << st.out;
  ASSERT_EQ(kill(v.pids[0], SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return Status(*coord_, killed).state == "FAILED"; }, 60s))
      << Status(*coord_, killed).raw;

  Result list = Dgca(*coord_, {"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  const std::string bad_row = ListRow(list.out, bad_job), killed_row = ListRow(list.out, killed);
  EXPECT_NE(bad_row.find("  1 (rank 0)  "), std::string::npos) << list.out;
  EXPECT_NE(killed_row.find("  SIGKILL (rank 0)  "), std::string::npos) << list.out;
  // It never reached its last step: no final loss, its last step's marked.
  EXPECT_TRUE(std::regex_search(killed_row, std::regex(R"( [0-9]+\.[0-9]{4}\* )"))) << list.out;

  Result js = Dgca(*coord_, {"status", "--json", killed});
  ASSERT_EQ(js.code, 0) << js.err;
  auto j = Json(js.out);
  ASSERT_TRUE(j.ok()) << js.out;
  const JsonValue* job = j->Find("job");
  ASSERT_NE(job, nullptr);
  const JsonValue* exit = job->Find("exit");
  ASSERT_NE(exit, nullptr) << js.out;
  EXPECT_EQ(exit->Find("signal")->integer, SIGKILL) << js.out;
  EXPECT_EQ(exit->Find("rank")->integer, 0) << js.out;
  EXPECT_TRUE(exit->Find("failed")->boolean) << js.out;
  EXPECT_EQ(job->Find("final_loss"), nullptr) << "a job killed mid-run has no final loss\n" << js.out;
  ExpectNumber(job->Find("started_unix_ms"), "started_unix_ms", js.out);
  ExpectNumber(job->Find("ended_unix_ms"), "ended_unix_ms", js.out);
  EXPECT_GT(job->Find("ended_unix_ms")->integer, 0) << js.out;
}

// One final loss everywhere; the list's columns filled; int64 as numbers;
// the ended job's live series gone from /metrics; and after a coordinator
// restart the same facts.
TEST_F(JobFactsTest, OneFinalLossEverywhereAndTheFactsSurviveARestart) {
  const int steps = 14;  // more than the 10 the final loss averages
  Result sub = Dgca(*coord_, {"submit", WriteTinySpec(*dir_, "final-loss", steps), "--wait"}, 180s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err << coord_->Log();
  const std::string job = sub.out.substr(0, sub.out.find('\n'));

  // Each rank's log says the same final loss, and what it is.
  static const std::regex kRankLine(
      R"(finished: 14 steps in [0-9.]+ s, final loss ([0-9]+\.[0-9]{4}) \(mean of the last 10 steps over 2 ranks\))");
  std::string loss;
  for (int r = 0; r < 2; ++r) {
    const std::string log = ReadFile(coord_->state_dir() + "/jobs/" + job + "/rank-" +
                                     std::to_string(r) + ".log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, kRankLine)) << "rank " << r << ":\n" << log;
    if (r == 0) loss = m[1];
    EXPECT_EQ(m[1], loss) << "rank " << r << "'s final loss differs from rank 0's";
    EXPECT_NE(log.find("final loss " + loss + " (mean of the last 10 steps over 2 ranks)"),
              std::string::npos);
  }
  std::fprintf(stderr, "job %s: final loss %s\n", job.c_str(), loss.c_str());

  // `dgca list`: the LOSS column, unmarked, and the other columns filled.
  Result table = Dgca(*coord_, {"list"});
  ASSERT_EQ(table.code, 0) << table.err;
  const std::string row = ListRow(table.out, job);
  ASSERT_FALSE(row.empty()) << table.out;
  EXPECT_NE(row.find("  " + loss + "  "), std::string::npos) << table.out;
  EXPECT_TRUE(std::regex_search(
      row, std::regex(R"(SUCCEEDED +14/14 +[0-9.]+ +(\d\d-\d\d )?\d\d:\d\d +(\d\d-\d\d )?\d\d:\d\d +[0-9]+(s|m[0-9]{2}s) +0 +[0-9.]+ (KiB|MiB|GiB) +all 2 ranks)")))
      << table.out;

  // `dgca list --json` and `dgca status --json`: the same loss at 4
  // decimals, int64 fields as numbers.
  Result lj = Dgca(*coord_, {"list", "--json"});
  ASSERT_EQ(lj.code, 0) << lj.err;
  auto list = Json(lj.out);
  ASSERT_TRUE(list.ok()) << lj.out;
  const JsonValue entry = ListEntry(*list, job);
  ASSERT_TRUE(entry.is_object()) << lj.out;
  ASSERT_NE(entry.Find("final_loss"), nullptr) << lj.out;
  EXPECT_EQ(Fixed4(entry.Find("final_loss")->number), loss);
  for (const char* f : {"step", "total_steps", "created_unix_ms", "updated_unix_ms",
                        "started_unix_ms", "ended_unix_ms"}) {
    ExpectNumber(entry.Find(f), f, lj.out);
  }

  Result sj = Dgca(*coord_, {"status", "--json", job});
  ASSERT_EQ(sj.code, 0) << sj.err;
  auto status = Json(sj.out);
  ASSERT_TRUE(status.ok()) << sj.out;
  const JsonValue* jv = status->Find("job");
  ASSERT_NE(jv, nullptr);
  ASSERT_NE(jv->Find("final_loss"), nullptr) << sj.out;
  const double final_loss = jv->Find("final_loss")->number;
  EXPECT_EQ(Fixed4(final_loss), loss);
  EXPECT_EQ(jv->Find("final_loss_steps")->integer, 10);
  EXPECT_EQ(jv->Find("final_loss_ranks")->integer, 2);
  for (const char* f : {"step", "total_steps", "created_unix_ms", "started_unix_ms", "ended_unix_ms"}) {
    ExpectNumber(jv->Find(f), f, sj.out);
  }
  EXPECT_EQ(jv->Find("step")->integer, steps);
  EXPECT_EQ(jv->Find("total_steps")->integer, steps);
  EXPECT_TRUE(jv->Find("restarts")->is_number());
  const int64_t started = jv->Find("started_unix_ms")->integer, ended = jv->Find("ended_unix_ms")->integer;
  EXPECT_GT(started, 0);
  EXPECT_GE(ended, started);
  EXPECT_GE(started, jv->Find("created_unix_ms")->integer);
  EXPECT_FALSE(jv->Find("exit")->Find("failed")->boolean) << sj.out;
  EXPECT_EQ(jv->Find("exit")->Find("rank")->integer, -1) << sj.out;
  const double peak = jv->Find("peak_memory_bytes")->number;
  EXPECT_GT(peak, 10e6) << "a CPU rank's peak resident set\n" << sj.out;
  const JsonValue* events = status->Find("events");
  ASSERT_TRUE(events && events->is_array() && !events->array.empty());
  ExpectNumber(events->array[0].Find("seq"), "events[0].seq", sj.out);
  ExpectNumber(events->array[0].Find("time_unix_ms"), "events[0].time_unix_ms", sj.out);

  // `dgca status`: the same figure, said as the final loss.
  Result text = Dgca(*coord_, {"status", job});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("loss     final " + loss + " (mean of the last 10 steps over 2 ranks)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("final loss " + loss + " (last 10 steps)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(", exit 0, peak memory "), std::string::npos) << text.out;

  // /metrics: the final loss gauge; the live series of the ended job gone.
  const std::string metrics = HttpGet(coord_->metrics(), "/metrics");
  const std::string gauge = SeriesValue(metrics, "dgca_job_final_loss", job);
  ASSERT_FALSE(gauge.empty()) << metrics.substr(0, 4000);
  EXPECT_EQ(Fixed4(std::stod(gauge)), loss) << gauge;
  EXPECT_FALSE(SeriesValue(metrics, "dgca_job_peak_memory_bytes", job).empty());
  EXPECT_TRUE(SeriesValue(metrics, "dgca_job_samples_per_second", job).empty()) << metrics.substr(0, 4000);
  EXPECT_EQ(metrics.find("dgca_train_samples_per_second{job=\"" + job + "\""), std::string::npos);
  EXPECT_EQ(metrics.find("dgca_train_step_seconds_count{job=\"" + job + "\""), std::string::npos);
  EXPECT_NE(metrics.find("dgca_job_state{job=\"" + job + "\",state=\"SUCCEEDED\"} 1"),
            std::string::npos);

  // A coordinator restart: the same facts from the store.
  coord_->Stop();
  ASSERT_TRUE(coord_->Start());
  ASSERT_TRUE(WaitForAgent(*coord_));
  Result again = Dgca(*coord_, {"status", "--json", job});
  ASSERT_EQ(again.code, 0) << again.err;
  auto after = Json(again.out);
  ASSERT_TRUE(after.ok()) << again.out;
  const JsonValue* ja = after->Find("job");
  ASSERT_NE(ja->Find("final_loss"), nullptr) << again.out;
  EXPECT_EQ(ja->Find("final_loss")->number, final_loss);
  EXPECT_EQ(ja->Find("started_unix_ms")->integer, started);
  EXPECT_EQ(ja->Find("ended_unix_ms")->integer, ended);
  EXPECT_EQ(ja->Find("peak_memory_bytes")->number, peak);
  EXPECT_FALSE(ja->Find("exit")->Find("failed")->boolean);
  Result table2 = Dgca(*coord_, {"list"});
  EXPECT_EQ(ListRow(table2.out, job), row) << table.out << "\nafter the restart:\n" << table2.out;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
