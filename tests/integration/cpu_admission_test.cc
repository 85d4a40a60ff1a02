// CPU admission with the real programs (issue 28: 8 CPU jobs once ran 16
// ranks at once on 2 cores): a CPU job whose threads would oversubscribe the
// node beside a running CPU job waits in PLANNING, its message naming the
// node, the job holding it and what it needs, and runs once that job ends.
// Each job is one rank with as many threads as the node has CPUs, so the
// test means the same on a 2-core VM and a 64-core host.
#include <gtest/gtest.h>

#include <regex>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string WriteSpec(const std::string& dir, const std::string& name, int threads) {
  std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny, hidden: 64}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: 1000000, global_batch: 4, eval_every: 0, checkpoint_every: 0,\n"
            "        optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: 1, device: cpu, threads_per_rank: " + std::to_string(threads) + "}\n"
            "tuning: {mode: off}\n");
  return path;
}

TEST(CpuAdmissionTest, ASecondJobWaitsForTheCpusTheFirstHolds) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string dir = MakeTempDir("cpu-admission");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start());
  ASSERT_TRUE(WaitForAgent(coord)) << coord.Log();
  // The node's CPUs as its agent probed them.
  Result nodes = Dgca(coord, {"nodes", "--json"}, 20s);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(nodes.out, m, std::regex(R"re("cpu_?[cC]ount"\s*:\s*"?(\d+))re")))
      << nodes.out;
  const int cpus = std::stoi(m[1]);
  ASSERT_GT(cpus, 0) << nodes.out;

  Result a = Dgca(coord, {"submit", WriteSpec(dir, "first", cpus)});
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string first = Trim(a.out);
  WaitForJob(coord, first, [](const JobView& v) { return v.state == "RUNNING"; }, 90s);

  Result b = Dgca(coord, {"submit", WriteSpec(dir, "second", cpus)});
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string second = Trim(b.out);
  const std::string why = "job " + first + " holds " + std::to_string(cpus) + " thread";
  JobView waiting = WaitForJob(coord, second, [&](const JobView& v) {
    return v.message.find(why) != std::string::npos;
  }, 90s);
  EXPECT_EQ(waiting.state, "PLANNING") << waiting.raw;
  EXPECT_NE(waiting.message.find("waiting for capacity: node "), std::string::npos)
      << waiting.message;
  EXPECT_NE(waiting.message.find(" has " + std::to_string(cpus) + " CPUs"), std::string::npos)
      << waiting.message;
  EXPECT_NE(waiting.message.find("this job's 1 rank there need " + std::to_string(cpus) +
                                 " more"),
            std::string::npos)
      << waiting.message;
  // `dgca status` shows the reason too.
  Result st = Dgca(coord, {"status", second}, 20s);
  EXPECT_NE(st.out.find(why), std::string::npos) << st.out;
  // Still waiting a few scheduler ticks later: no launch beside the first.
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(Status(coord, second).state, "PLANNING");

  ASSERT_EQ(Dgca(coord, {"cancel", first}).code, 0);
  WaitForJob(coord, second, [](const JobView& v) { return v.state == "RUNNING"; }, 90s);
  ASSERT_EQ(Dgca(coord, {"cancel", second}).code, 0);
  WaitForJob(coord, second, [](const JobView& v) { return v.state == "CANCELLED"; }, 90s);
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
