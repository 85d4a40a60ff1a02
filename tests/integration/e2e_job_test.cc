// End to end on loopback with the real programs: a 2-rank job of the real CPU
// trainer goes from `dgca submit --wait` to SUCCEEDED; status, logs, list,
// validate and authentication behave as docs/cli.md says.
#include <gtest/gtest.h>

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
  Result logs0 = Dgca(*coord_, {"logs", job});
  EXPECT_NE(logs0.out.find("rank 0:"), std::string::npos) << logs0.out;

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

// A job whose rank cannot start training: submit --wait exits 1 and says why.
TEST_F(E2eTest, FailedJobExits1WithTheReason) {
  std::string spec = *dir_ + "/missing-data.yaml";
  WriteFile(spec,
            "name: missing-data\n"
            "model: {preset: tiny}\n"
            "data: {train: no-such-train.txt, max_seq_len: 32}\n"
            "train: {steps: 5, global_batch: 4, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 1, device: cpu, threads_per_rank: 1}\n");
  Result r = Dgca(*coord_, {"submit", spec, "--wait"}, 60s);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("no-such-train.txt"), std::string::npos) << r.out << r.err;
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

TEST_F(E2eTest, UnknownJobIsUsageError) {
  Result r = Dgca(*coord_, {"status", "no-such-job"});
  EXPECT_EQ(r.code, 2) << r.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
