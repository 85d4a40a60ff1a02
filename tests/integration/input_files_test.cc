// A spec whose files are missing, with the real programs: `dgca validate`,
// `dgca plan` and `dgca submit` name every missing file at once with its
// spec line:column (spec/spec_files.h), instead of a job whose ranks fail
// with NOT_FOUND after their rendezvous. Ranks on a node other than the
// coordinator's are checked by that node's agent before they start: the job
// fails with the same located lines, said once, and `dgca diagnose` of it
// says why it failed.
#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Line 4: data.train, relative to the spec's directory and not there;
// line 5: data.eval, absolute and not there; line 6: model.vocab, there.
std::string WriteSpecWithMissingFiles(const std::string& dir) {
  const std::string spec = dir + "/missing.yaml";
  WriteFile(spec,
            "name: missing\n"
            "model: {preset: tiny, vocab: " + SharedData() + "/vocab/vocab.txt}\n"
            "data:\n"
            "  train: no-such-train.txt\n"
            "  eval: /no/such/eval.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 5, global_batch: 4, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: off}\n");
  return spec;
}

class InputFilesTest : public CoordinatorSuite<InputFilesTest, true> {
 public:
  static constexpr const char* kName = "input-files";
};

TEST_F(InputFilesTest, ValidatePlanAndSubmitNameEveryMissingFile) {
  const std::string spec = WriteSpecWithMissingFiles(*dir_);
  const std::string train = spec + ":4:10: data.train: " + *dir_ + "/no-such-train.txt: does not exist";
  const std::string eval = spec + ":5:9: data.eval: /no/such/eval.txt: does not exist";

  // validate needs no coordinator: it looks on this machine and says so.
  Result v = Exec({CliBin(), "validate", spec});
  EXPECT_EQ(v.code, 2) << v.out << v.err;
  EXPECT_NE(v.err.find(train), std::string::npos) << v.err;
  EXPECT_NE(v.err.find(eval), std::string::npos) << v.err;
  EXPECT_NE(v.err.find("checked on this machine; 'no-such-train.txt' is relative, so it is taken "
                       "from the spec file's directory " + *dir_),
            std::string::npos)
      << v.err;
  EXPECT_NE(v.err.find("expected a readable regular file of lines 'src<TAB>trg'"), std::string::npos)
      << v.err;
  EXPECT_NE(v.err.find(spec + ": 2 problems"), std::string::npos) << v.err;
  EXPECT_EQ(v.err.find("vocab"), std::string::npos) << "the vocabulary is there:\n" << v.err;

  // plan and submit: the coordinator looks on its node, which runs ranks.
  for (const char* cmd : {"plan", "submit"}) {
    SCOPED_TRACE(cmd);
    Result r = Dgca(*coord_, {cmd, spec});
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(train), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(eval), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(", the coordinator's"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(spec + ": 2 problems (reported by the coordinator)"), std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // Nothing was stored.
  Result list = Dgca(*coord_, {"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(list.out.find("missing"), std::string::npos) << list.out;
}

// No embedded agent: the coordinator's node runs no ranks, so only the
// agent that would start them can tell whether the files are there.
TEST(InputFilesRemoteTest, AnAgentRefusesTheLaunchAndTheJobSaysWhyOnce) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  const std::string dir = MakeTempDir("input-files-remote");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(coord, "far-node", dir + "/agent"));
  ASSERT_TRUE(WaitForAgent(coord)) << agent.Log();
  const std::string spec = WriteSpecWithMissingFiles(dir);

  Result plan = Dgca(coord, {"plan", spec});
  EXPECT_EQ(plan.code, 0) << "not checked on the coordinator's node:\n" << plan.out << plan.err;

  Result sub = Dgca(coord, {"submit", spec, "--wait"}, 60s);
  EXPECT_EQ(sub.code, 1) << sub.out << sub.err << coord.Log();
  const std::string job = sub.out.substr(0, sub.out.find('\n'));
  const std::string train = spec + ":4:10: data.train: " + dir + "/no-such-train.txt: does not exist";
  const std::string eval = spec + ":5:9: data.eval: /no/such/eval.txt: does not exist";
  EXPECT_NE(sub.out.find("job " + job + " FAILED: cannot start the ranks: 2 input files of the job "
                         "cannot be read on node far-node by its agent:\n" + train),
            std::string::npos)
      << sub.out;
  // Once each, in the final message; the event log names the failure in
  // one line and no rank's NOT_FOUND shows anywhere.
  const std::string all = sub.out + sub.err;
  EXPECT_EQ(Count(all, train), 1u) << all;
  EXPECT_EQ(Count(all, eval), 1u) << all;
  EXPECT_NE(sub.err.find("FAILED  state: cannot start the ranks: 2 input files of the job cannot be "
                         "read on node far-node by its agent (the job's message follows in full)"),
            std::string::npos)
      << sub.err;
  EXPECT_EQ(all.find("NOT_FOUND"), std::string::npos) << all;
  EXPECT_EQ(all.find("rank_exit"), std::string::npos) << all;

  Result diag = Dgca(coord, {"diagnose", job});
  EXPECT_EQ(diag.code, 2) << diag.out << diag.err;
  EXPECT_NE(diag.err.find("job " + job + " failed before its first training step, so it has no "
                          "steps to diagnose; it failed: cannot start the ranks: 2 input files"),
            std::string::npos)
      << diag.err;
  EXPECT_NE(diag.err.find(train), std::string::npos) << diag.err;
  EXPECT_EQ(diag.err.find("steady-state"), std::string::npos) << diag.err;
  agent.Stop();
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
