// End to end on loopback with the real programs: a 2-rank job of the real CPU
// trainer goes from `dgca submit --wait` to SUCCEEDED; status, logs, list,
// validate and authentication behave as docs/cli.md says.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class E2eTest : public CoordinatorSuite<E2eTest, true> {
 public:
  static constexpr const char* kName = "e2e";
};

TEST_F(E2eTest, TwoRankJobSucceedsWithStatusAndLogs) {
  std::string spec = WriteTinySpec(*dir_, "two-ranks", 12);
  auto t0 = Clock::now();
  Result sub = Dgca(*coord_, {"submit", spec, "--wait"}, 120s);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(sub.code, 0) << "stdout:\n" << sub.out << "\nstderr:\n" << sub.err
                         << "\ncoordinator log:\n" << coord_->Log();
  std::string job = sub.out.substr(0, sub.out.find('\n'));
  ASSERT_FALSE(job.empty());
  EXPECT_NE(sub.out.find("SUCCEEDED"), std::string::npos) << sub.out;
  // The evaluation metrics are printed as a table.
  EXPECT_NE(sub.out.find("sentence_correction_f1"), std::string::npos) << sub.out;
  // Progress was shown on stderr (not a TTY: plain lines) with step/total.
  EXPECT_NE(sub.err.find("/12"), std::string::npos) << sub.err;
  std::fprintf(stderr, "2-rank job %s: submit --wait took %.1f s\n", job.c_str(), secs);

  JobView v = Status(*coord_, job);
  ASSERT_TRUE(v.ok) << v.raw;
  EXPECT_EQ(v.state, "SUCCEEDED") << v.raw;
  ASSERT_EQ(v.rank_steps.size(), 2u) << v.raw;
  for (size_t r = 0; r < v.rank_steps.size(); ++r) EXPECT_EQ(v.rank_steps[r], 12) << "rank " << r;
  EXPECT_GT(v.events, 0);
  // Eval metrics are in the job.
  EXPECT_NE(v.raw.find("sentence_correction_f1"), std::string::npos) << v.raw;

  Result logs = Dgca(*coord_, {"logs", job, "--rank", "1"});
  ASSERT_EQ(logs.code, 0) << logs.err;
  EXPECT_NE(logs.out.find("rank 1:"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("step 12/12"), std::string::npos) << logs.out;
  EXPECT_EQ(logs.out.find("rank 0:"), std::string::npos) << "rank 0's lines in rank 1's log";
  // Without --rank: every rank, each line marked with its rank.
  Result all = Dgca(*coord_, {"logs", job});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_NE(all.out.find("[rank 0] "), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("[rank 1] "), std::string::npos) << all.out;
  const std::vector<std::string> all_lines = absl::StrSplit(all.out, '\n', absl::SkipEmpty());
  for (const std::string& line : all_lines) {
    EXPECT_TRUE(absl::StartsWith(line, "[rank 0] ") || absl::StartsWith(line, "[rank 1] ")) << line;
    if (absl::StartsWith(line, "[rank 1] ")) {
      EXPECT_EQ(line.find("rank 0:"), std::string::npos) << "rank 0's line marked rank 1: " << line;
    }
  }
  Result no_such = Dgca(*coord_, {"logs", job, "--rank", "7"});
  EXPECT_EQ(no_such.code, 2);
  EXPECT_NE(no_such.err.find("has 2 ranks (--rank 0..1): there is no rank 7"), std::string::npos)
      << no_such.err;

  Result list = Dgca(*coord_, {"list", "--json"});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find(job), std::string::npos);
  Result table = Dgca(*coord_, {"list"});
  EXPECT_NE(table.out.find(job), std::string::npos);
  EXPECT_NE(table.out.find("SUCCEEDED"), std::string::npos) << table.out;

  Result human = Dgca(*coord_, {"status", job});
  ASSERT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("RANK"), std::string::npos) << human.out;

  // /metrics carries the job's per-rank series.
  std::string metrics = HttpGet(coord_->metrics(), "/metrics");
  EXPECT_NE(metrics.find("dgca_jobs"), std::string::npos) << metrics.substr(0, 2000);
  EXPECT_NE(metrics.find("job=\"" + job + "\""), std::string::npos) << metrics.substr(0, 4000);

  Result nodes = Dgca(*coord_, {"nodes", "--json"});
  ASSERT_EQ(nodes.code, 0) << nodes.err;
  EXPECT_NE(nodes.out.find("\"cpu_count\""), std::string::npos) << nodes.out;

  // The same spec again, as a new job, from what the coordinator stored.
  Result again = Dgca(*coord_, {"resubmit", job, "--wait"}, 120s);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  const std::string job2 = again.out.substr(0, again.out.find('\n'));
  EXPECT_NE(job2, job);
  EXPECT_NE(again.err.find("job " + job + "'s spec again"), std::string::npos) << again.err;
  JobView v2 = Status(*coord_, job2);
  EXPECT_EQ(v2.state, "SUCCEEDED") << v2.raw;
  EXPECT_EQ(v2.total_steps, 12) << v2.raw;
  EXPECT_NE(v2.raw.find("\"name\": \"two-ranks\""), std::string::npos) << v2.raw;
  Result unknown = Dgca(*coord_, {"resubmit", "j-999999-0000"});
  EXPECT_EQ(unknown.code, 2) << unknown.out << unknown.err;

  // dgca delete: the resubmitted job's record and its rank logs go.
  const std::string job2_dir = coord_->state_dir() + "/jobs/" + job2;
  EXPECT_TRUE(Exists(job2_dir + "/rank-0.log")) << job2_dir;
  Result del = Dgca(*coord_, {"delete", job2});
  ASSERT_EQ(del.code, 0) << del.out << del.err;
  EXPECT_NE(del.out.find("deleted job " + job2 + " (SUCCEEDED): its record and events, and " +
                         job2_dir),
            std::string::npos)
      << del.out;
  EXPECT_FALSE(Exists(job2_dir));
  EXPECT_EQ(Dgca(*coord_, {"status", job2}).code, 2);
  EXPECT_EQ(Dgca(*coord_, {"delete", job2}).code, 2);  // not found now
  EXPECT_EQ(Status(*coord_, job).state, "SUCCEEDED");  // the other job stays
}

// `dgca logs --follow` streams a running job's log and returns when it ends.
TEST_F(E2eTest, LogsFollowUntilTheJobEnds) {
  Result sub = Dgca(*coord_, {"submit", WriteTinySpec(*dir_, "follow", 30, 1)});
  ASSERT_EQ(sub.code, 0) << sub.err;
  std::string job = Trim(sub.out);
  Result logs = Dgca(*coord_, {"logs", job, "--rank", "0", "--follow"}, 90s);
  EXPECT_EQ(logs.code, 0) << logs.err;
  EXPECT_NE(logs.out.find("step 30/30"), std::string::npos)
      << logs.out << Status(*coord_, job).raw << coord_->Log();
  EXPECT_NE(logs.out.find("exited with code 0"), std::string::npos) << logs.out;
  EXPECT_EQ(Status(*coord_, job).state, "SUCCEEDED");
}

// A job whose rank cannot start training: submit --wait exits 1 and says
// why. (The data file is there, so the submission's file check passes
// (tests/integration/input_files_test.cc has missing files); its line has
// no TAB, which the rank finds when it reads it.)
TEST_F(E2eTest, FailedJobExits1WithTheReason) {
  std::string spec = *dir_ + "/bad-data.yaml";
  WriteFile(*dir_ + "/bad-train.txt", "甲 乙 without a tab\n");
  WriteFile(spec,
            "name: bad-data\n"
            "model: {preset: tiny}\n"
            "data: {train: bad-train.txt, max_seq_len: 32}\n"
            "train: {steps: 5, global_batch: 4, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 1, device: cpu, threads_per_rank: 1}\n");
  Result r = Dgca(*coord_, {"submit", spec, "--wait"}, 60s);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(*dir_ + "/bad-train.txt:1"), std::string::npos) << r.out << r.err;
  // The rank's output is in its rank_exit event and in the final message;
  // the FAILED event between them gives the headline alone.
  EXPECT_NE(r.err.find("FAILED  state: rank 0 on node "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 1 (the job's message follows in full)"), std::string::npos)
      << r.err;
  // `dgca list` keeps it to one row: the message's first line only, cut.
  Result failed = Dgca(*coord_, {"list", "--state", "failed", "--name", "bad-da"});
  ASSERT_EQ(failed.code, 0) << failed.err;
  EXPECT_NE(failed.out.find("bad-data"), std::string::npos) << failed.out;
  const std::vector<std::string> rows = absl::StrSplit(failed.out, '\n', absl::SkipEmpty());
  for (const std::string& line : rows) {
    EXPECT_LT(line.size(), 300u) << line;
    EXPECT_EQ(line.find("bad-train.txt"), std::string::npos) << line;  // the rank's output stays out
  }
  // Filters: another state, another name, a later time: not listed.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--state", "running,succeeded"},
                                             {"--name", "no-such-name"},
                                             {"--since", "2099-01-01"}}) {
    std::vector<std::string> argv = {"list"};
    argv.insert(argv.end(), args.begin(), args.end());
    Result other = Dgca(*coord_, argv);
    ASSERT_EQ(other.code, 0) << other.err;
    EXPECT_EQ(other.out.find("bad-data"), std::string::npos) << args[0] << "\n" << other.out;
  }
  Result recent = Dgca(*coord_, {"list", "--since", "1h", "--limit", "1", "--state", "ended"});
  ASSERT_EQ(recent.code, 0) << recent.err;
  EXPECT_NE(recent.out.find("bad-data"), std::string::npos) << recent.out;
  Result bad = Dgca(*coord_, {"list", "--state", "done"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--state 'done': not a job state"), std::string::npos) << bad.err;
}

TEST_F(E2eTest, ValidateReportsAllThreeProblems) {
  std::string spec = *dir_ + "/bad.yaml";
  WriteFile(spec,
            "name: bad\n"
            "model:\n"
            "  preset: tiny\n"
            "  flavour: spicy\n"
            "data:\n"
            "  max_seq_len: long\n"
            "train:\n"
            "  steps: -5\n");
  Result r = Exec({CliBin(), "validate", spec});  // no coordinator needed
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(spec + ":4:3: model.flavour"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(spec + ":6:16: data.max_seq_len"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(spec + ":8:10: train.steps"), std::string::npos) << r.err;
  // Submitting it is refused the same way, and nothing is stored.
  Result s = Dgca(*coord_, {"submit", spec});
  EXPECT_EQ(s.code, 2) << s.err;
  EXPECT_NE(s.err.find(":8:10: train.steps"), std::string::npos) << s.err;
}

TEST_F(E2eTest, NoOrWrongTokenExits3) {
  Result none = Exec({CliBin(), "--coordinator", coord_->address(), "--token-file",
                      *dir_ + "/no-such-token", "list"});
  EXPECT_EQ(none.code, 3) << none.err;
  std::string wrong = *dir_ + "/wrong-token";
  WriteFile(wrong, "0123456789abcdef\n");
  Result bad = Exec({CliBin(), "--coordinator", coord_->address(), "--token-file", wrong, "list"});
  EXPECT_EQ(bad.code, 3) << bad.err;
  EXPECT_NE(bad.err.find("token"), std::string::npos) << bad.err;
  // The same through the environment variables.
  Result env = Exec({CliBin(), "list"}, 30s,
                    {"DGCA_COORDINATOR=" + coord_->address(), "DGCA_TOKEN_FILE=" + wrong});
  EXPECT_EQ(env.code, 3) << env.err;
  Result good = Exec({CliBin(), "list"}, 30s,
                     {"DGCA_COORDINATOR=" + coord_->address(),
                      "DGCA_TOKEN_FILE=" + coord_->token_file()});
  EXPECT_EQ(good.code, 0) << good.err;
}

// --set KEY=VALUE over the file: a bad value is named at the flag; a good
// one is what the job runs with, and what is stored.
TEST_F(E2eTest, SetOverridesTheFileAndABadValueIsNamedAtTheFlag) {
  const std::string spec = WriteTinySpec(*dir_, "with-set", 1000, 1);
  Result bad = Dgca(*coord_, {"validate", spec, "--set", "train.steps=abc", "--set",
                              "resources.rankz=2"});
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("--set train.steps=abc: train.steps: "), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("--set resources.rankz=2: "), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("with --set: 2 problems"), std::string::npos) << bad.err;
  Result ok = Dgca(*coord_, {"validate", spec, "--set", "train.steps=6"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("6 steps"), std::string::npos) << ok.out;
  Result sub = Dgca(*coord_, {"submit", spec, "--set", "train.steps=6", "--set", "name=set-six",
                              "--wait"},
                    120s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err;
  const std::string job = sub.out.substr(0, sub.out.find('\n'));
  JobView v = Status(*coord_, job);
  EXPECT_EQ(v.state, "SUCCEEDED") << v.raw;
  EXPECT_EQ(v.total_steps, 6) << v.raw;
  EXPECT_NE(v.raw.find("\"name\": \"set-six\""), std::string::npos) << v.raw;
  EXPECT_NE(v.raw.find("with --set train.steps=6 --set name=set-six"), std::string::npos) << v.raw;
}

TEST_F(E2eTest, UnknownJobIsUsageError) {
  Result r = Dgca(*coord_, {"status", "no-such-job"});
  EXPECT_EQ(r.code, 2) << r.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
