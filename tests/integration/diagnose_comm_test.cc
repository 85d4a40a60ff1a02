// `dgca diagnose comm` end to end with the real programs: the all-reduce
// sweep runs AS A JOB (kind: comm_probe) on 2 CPU ranks over Gloo, prints the
// nccl-tests-like table, the coordinator stores the rows, and a following
// `dgca plan --json` of a 2-rank CPU spec cites the measurement in its
// reasons. Also: a probe job with backend nccl on a machine without a GPU
// fails cleanly, naming the missing device.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class DiagnoseCommTest : public CoordinatorSuite<DiagnoseCommTest, false> {
 public:
  static constexpr const char* kName = "diagcomm";
};

// The table's data rows: size, count, iters, time(us), algbw, busbw.
struct Row {
  long long bytes = 0, count = 0;
  int iters = 0;
  double us = 0, algbw = 0, busbw = 0;
};
std::vector<Row> TableRows(const std::string& out) {
  std::vector<Row> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream l(line);
    Row r;
    if (l >> r.bytes >> r.count >> r.iters >> r.us >> r.algbw >> r.busbw) rows.push_back(r);
  }
  return rows;
}

TEST_F(DiagnoseCommTest, TwoCpuRanksTableStoredAndCitedByPlan) {
  // Before any measurement the plan says it uses the model.
  std::string spec = *dir_ + "/cpu2.yaml";
  WriteFile(spec,
            "name: cpu2\nmodel: {preset: tiny}\ntrain: {steps: 10, global_batch: 16}\n"
            "resources: {ranks: 2, device: cpu}\ncomm: {backend: gloo}\n");
  Result before = Dgca(*coord_, {"plan", spec, "--json"}, 60s);
  ASSERT_EQ(before.code, 0) << before.out << before.err;
  EXPECT_NE(before.out.find("model (no measurement)"), std::string::npos) << before.out;
  EXPECT_EQ(before.out.find("measured by dgca diagnose comm"), std::string::npos) << before.out;

  Result r = Dgca(*coord_,
                  {"diagnose", "comm", "--ranks", "2", "--device", "cpu", "--sizes", "4K..1M:16"},
                  60s);
  ASSERT_EQ(r.code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err << "\ncoordinator:\n"
                       << coord_->Log();
  std::fprintf(stderr, "dgca diagnose comm output:\n%s", r.out.c_str());
  EXPECT_NE(r.out.find("busbw(GB/s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gloo"), std::string::npos) << r.out;
  std::vector<Row> rows = TableRows(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;  // 4K, 64K, 1M
  const long long want[] = {4096, 65536, 1048576};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].bytes, want[i]);
    EXPECT_EQ(rows[i].count, want[i] / 4);
    EXPECT_GT(rows[i].iters, 0);
    EXPECT_GT(rows[i].us, 0);
    EXPECT_GT(rows[i].busbw, 0) << "row " << i;
    // 2 ranks: busbw = algbw * 2(n-1)/n = algbw.
    EXPECT_NEAR(rows[i].busbw, rows[i].algbw, 1e-3 + 1e-3 * rows[i].algbw);
  }
  // Each size streamed as the job ran (an event per row on stderr).
  EXPECT_NE(r.err.find("1048576 bytes:"), std::string::npos) << r.err;

  // The measurement is stored and the planner cites it.
  Result after = Dgca(*coord_, {"plan", spec, "--json"}, 60s);
  ASSERT_EQ(after.code, 0) << after.out << after.err;
  EXPECT_NE(after.out.find("measured by dgca diagnose comm at "), std::string::npos) << after.out;
  std::string job = r.err.substr(r.err.find("job j-") + 4);
  job = job.substr(0, job.find_first_of(" \n"));
  EXPECT_NE(after.out.find("(job " + job + ";"), std::string::npos) << job << "\n" << after.out;

  // --json has the same rows.
  Result js = Dgca(*coord_, {"diagnose", "comm", "--ranks", "2", "--device", "cpu", "--sizes",
                             "8K", "--json"},
                   60s);
  ASSERT_EQ(js.code, 0) << js.out << js.err;
  auto j = Json(js.out);
  ASSERT_TRUE(j.ok()) << js.out;
  EXPECT_EQ(JsonStr(j->Find("backend")), "gloo");
  const JsonValue* jr = j->Find("rows");
  ASSERT_TRUE(jr && jr->is_array()) << js.out;
}

TEST_F(DiagnoseCommTest, BadSizesAreUsageErrors) {
  Result r = Dgca(*coord_, {"diagnose", "comm", "--sizes", "3"}, 10s);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("multiple of 4"), std::string::npos) << r.err;
  Result r2 = Dgca(*coord_, {"diagnose", "comm", "--sizes", "1M..1K"}, 10s);
  EXPECT_EQ(r2.code, 2) << r2.err;
}

TEST_F(DiagnoseCommTest, NcclWithoutGpuFailsCleanly) {
  Result r = Dgca(*coord_, {"diagnose", "comm", "--ranks", "1", "--device", "cuda", "--sizes",
                            "4K"},
                  60s);
  if (r.code == 0) GTEST_SKIP() << "a CUDA device is visible here: the NCCL probe ran\n" << r.out;
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("no CUDA device visible (cudaGetDeviceCount: "), std::string::npos)
      << r.err;
}

// A training job planned onto CUDA + NCCL: the rank creates its CUDA context
// and the NCCL communicator (unique id through the coordinator's store)
// before training; without a GPU that fails at once and the job's message
// carries the reason.
TEST_F(DiagnoseCommTest, NcclTrainJobWithoutGpuFailsWithTheReason) {
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  std::string path = *dir_ + "/nccl1.yaml";
  WriteFile(path,
            "name: nccl1\nmodel: {preset: tiny}\n"
            "data: {train: " + SharedData() + "/ecspell/train_law.txt, eval: " + SharedData() +
            "/ecspell/test_law.txt, max_seq_len: 32}\n"
            "train: {steps: 2, global_batch: 8, eval_every: 0, checkpoint_every: 0}\n"
            "resources: {ranks: 1, device: cuda}\ncomm: {backend: nccl}\ntuning: {mode: off}\n");
  Result r = Dgca(*coord_, {"submit", path, "--wait"}, 60s);
  if (r.code == 0) GTEST_SKIP() << "a CUDA device is visible and the job ran";
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  std::string job = r.out.substr(0, r.out.find('\n'));
  JobView v = Status(*coord_, job);
  ASSERT_TRUE(v.ok) << v.raw;
  EXPECT_EQ(v.state, "FAILED") << v.raw;
  // With the CUDA trainer built in, the rank's CUDA context fails first;
  // without it, the NCCL communicator does. Either names the cause.
  EXPECT_TRUE(v.raw.find("error: device cuda: FAILED_PRECONDITION") != std::string::npos ||
              v.raw.find("cannot build the NCCL communicator") != std::string::npos)
      << v.raw;
  EXPECT_NE(v.raw.find("no CUDA device visible (cudaGetDeviceCount: "), std::string::npos)
      << v.raw;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
