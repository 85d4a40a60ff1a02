#include "model/train/checkpoint_retention.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/core/core_test_util.h"
#include "model/train/checkpoint.h"
#include "model/train/optimizer.h"
#include "model/train/trainer.h"
#include "model/train/trainer_test_util.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;

// ---- The rule, as a pure function -----------------------------------------

std::vector<CheckpointEntry> Steps(std::initializer_list<int64_t> steps) {
  std::vector<CheckpointEntry> v;
  for (int64_t s : steps) v.push_back({s, false, 0});
  return v;
}

void SetMetric(std::vector<CheckpointEntry>* v, int64_t step, double metric) {
  for (CheckpointEntry& e : *v) {
    if (e.step == step) {
      e.has_metric = true;
      e.metric = metric;
    }
  }
}

using Ints = std::vector<int64_t>;

TEST(PlanRetentionTest, KeepsTheNewestNWithoutEvals) {
  RetentionPlan p = PlanRetention(Steps({30, 10, 60, 20, 50, 40}), 60, 3);
  EXPECT_EQ(p.newest, (Ints{40, 50, 60}));
  EXPECT_EQ(p.keep, (Ints{40, 50, 60}));
  EXPECT_EQ(p.prune, (Ints{10, 20, 30}));  // oldest first
  EXPECT_EQ(p.best, -1);
}

TEST(PlanRetentionTest, TheBestByEvalIsKeptInAdditionToTheNewest) {
  auto e = Steps({10, 20, 30, 40, 50, 60});
  SetMetric(&e, 10, 0.20);
  SetMetric(&e, 20, 0.45);  // the best, older than the newest 3
  SetMetric(&e, 40, 0.30);
  RetentionPlan p = PlanRetention(e, 60, 3);
  EXPECT_EQ(p.best, 20);
  EXPECT_EQ(p.newest, (Ints{40, 50, 60}));
  EXPECT_EQ(p.keep, (Ints{20, 40, 50, 60}));  // 3 + the best
  EXPECT_EQ(p.prune, (Ints{10, 30}));
}

TEST(PlanRetentionTest, ABestAmongTheNewestCostsNothingExtra) {
  auto e = Steps({10, 20, 30, 40});
  SetMetric(&e, 20, 0.1);
  SetMetric(&e, 40, 0.5);
  RetentionPlan p = PlanRetention(e, 40, 2);
  EXPECT_EQ(p.best, 40);
  EXPECT_EQ(p.keep, (Ints{30, 40}));
  EXPECT_EQ(p.prune, (Ints{10, 20}));
}

TEST(PlanRetentionTest, ATieGoesToTheNewerAndNonFiniteMetricsDoNotCount) {
  auto e = Steps({10, 20, 30, 40});
  SetMetric(&e, 10, 0.5);
  SetMetric(&e, 20, 0.5);
  SetMetric(&e, 30, std::numeric_limits<double>::quiet_NaN());
  RetentionPlan p = PlanRetention(e, 40, 1);
  EXPECT_EQ(p.best, 20);
  EXPECT_EQ(p.keep, (Ints{20, 40}));
  EXPECT_EQ(p.prune, (Ints{10, 30}));
}

// `latest` is the resume point: kept whatever its number, and counted in N.
TEST(PlanRetentionTest, TheResumePointIsKeptEvenBelowNewerStepDirectories) {
  RetentionPlan p = PlanRetention(Steps({10, 20, 30, 40, 50}), 30, 2);
  EXPECT_EQ(p.newest, (Ints{30, 50}));
  EXPECT_EQ(p.prune, (Ints{10, 20, 40}));
  RetentionPlan one = PlanRetention(Steps({10, 20, 30, 40, 50}), 30, 1);
  EXPECT_EQ(one.keep, (Ints{30}));
}

TEST(PlanRetentionTest, ZeroKeepsEverything) {
  auto e = Steps({10, 20, 30});
  SetMetric(&e, 10, 0.9);
  RetentionPlan p = PlanRetention(e, 30, 0);
  EXPECT_EQ(p.keep, (Ints{10, 20, 30}));
  EXPECT_TRUE(p.prune.empty());
  EXPECT_TRUE(PlanRetention({}, -1, 3).keep.empty());
}

// ---- On a directory of real checkpoints -----------------------------------

class PruneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("retention_test");
    ps_.Declare("bert.embeddings.word_embeddings.weight", {10, 4}, true);
    ps_.Declare("cls.predictions.bias", {10}, false);
    ps_.Finalize();
    for (int64_t i = 0; i < ps_.total_numel(); ++i) ps_.values()[i] = 0.25f * i;
    adam_ = std::make_unique<AdamW>(&ps_, AdamWOptions{});
    cfg_.vocab_size = 10;
    cfg_.hidden = 4;
  }
  // Saves step-NNNNNNNN for each step, in order (so `latest` names the last).
  void Save(std::initializer_list<int64_t> steps) {
    for (int64_t s : steps) {
      CheckpointState st;
      st.step = s;
      st.loader_step = s;
      ASSERT_TRUE(SaveCheckpoint(dir_, ps_, adam_.get(), cfg_, st).ok());
    }
  }
  void Eval(int64_t step, double f1) {
    ASSERT_TRUE(WriteCheckpointEval(dir_ + "/" + CheckpointDirName(step), step,
                                    {{kRetentionMetric, f1}, {"sentence_correction_f1", 0.1}})
                    .ok());
  }
  // Every entry of the directory, sorted.
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  Status Load(const std::string& step_dir) {
    ParamStore ps;
    ps.Declare("bert.embeddings.word_embeddings.weight", {10, 4}, true);
    ps.Declare("cls.predictions.bias", {10}, false);
    ps.Finalize();
    AdamW adam(&ps, AdamWOptions{});
    CheckpointState st;
    return LoadCheckpoint(step_dir, cfg_, &ps, &adam, &st);
  }
  std::string dir_;
  ParamStore ps_;
  std::unique_ptr<AdamW> adam_;
  ModelConfig cfg_;
};

TEST_F(PruneTest, PrunesToTheNewestAndTheBestAndSaysSoInOneLine) {
  Save({10, 20, 30, 40, 50});
  Eval(20, 0.45);
  Eval(40, 0.30);
  testutil::WriteFile(dir_ + "/vocab.txt", "[PAD]\n");
  fs::create_directories(dir_ + "/.step-00000060.tmp.123");  // a save under way: not ours
  fs::create_directories(dir_ + "/step-000000007");           // not a name SaveCheckpoint writes
  auto r = PruneCheckpoints(dir_, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pruned, (std::vector<std::string>{"step-00000010", "step-00000030"}));
  EXPECT_EQ(r->kept, (std::vector<std::string>{"step-00000040", "step-00000050"}));
  EXPECT_EQ(r->best, "step-00000020");
  EXPECT_EQ(r->Summary(),
            "pruned 2 checkpoints (step-00000010, step-00000030); kept step-00000040, "
            "step-00000050, best step-00000020 by char_correction_f1 (0.4500)");
  EXPECT_EQ(Listing(), (std::vector<std::string>{".step-00000060.tmp.123", "latest",
                                                 "step-000000007", "step-00000020",
                                                 "step-00000040", "step-00000050", "vocab.txt"}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/step-00000050");
  EXPECT_TRUE(Load(*latest).ok());
  // Nothing more to do: no line.
  auto again = PruneCheckpoints(dir_, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->pruned.empty());
  EXPECT_EQ(again->Summary(), "");
}

TEST_F(PruneTest, TheSummaryWhenTheBestIsAmongTheNewestOrThereIsNone) {
  Save({1, 2, 3});
  auto none = PruneCheckpoints(dir_, 2);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->Summary(),
            "pruned 1 checkpoint (step-00000001); kept step-00000002, step-00000003 (no "
            "checkpoint has an eval at its step to pick a best by char_correction_f1)");
  Save({4});
  Eval(4, 0.5);
  auto among = PruneCheckpoints(dir_, 2);
  ASSERT_TRUE(among.ok());
  EXPECT_EQ(among->Summary(),
            "pruned 1 checkpoint (step-00000002); kept step-00000003, step-00000004 "
            "(step-00000004 also the best by char_correction_f1, 0.5000)");
}

TEST_F(PruneTest, ZeroKeepsEverything) {
  Save({1, 2, 3, 4});
  auto r = PruneCheckpoints(dir_, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->pruned.empty());
  EXPECT_EQ(Listing().size(), 5u);  // 4 step directories and latest
}

// Without `latest` the resume point is unknown: nothing is deleted.
TEST_F(PruneTest, NoLatestNoPrune) {
  Save({1, 2, 3});
  ASSERT_TRUE(fs::remove(dir_ + "/latest"));
  auto r = PruneCheckpoints(dir_, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("not pruning checkpoint directory " + dir_), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(Listing(), (std::vector<std::string>{"step-00000001", "step-00000002", "step-00000003"}));
}

// A rank killed part-way through deleting a step directory leaves a
// directory no reader takes for a checkpoint: LatestCheckpoint still names
// the newest, its listing (for a lost `latest`) shows only whole ones, and
// the next prune finishes the job.
TEST_F(PruneTest, APruneCutShortLeavesNothingThatLooksLikeACheckpoint) {
  Save({1, 2, 3, 4});
  // The "kill": the first deletion removes one file, then fails.
  int calls = 0;
  auto r = PruneCheckpoints(dir_, 1, [&](const std::string& path) -> Status {
    ++calls;
    fs::remove(path + "/model.safetensors");
    return InternalError("killed");
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(calls, 1);
  // step-00000001, half deleted, is no step directory any more; the others
  // were not touched.
  EXPECT_EQ(Listing(), (std::vector<std::string>{".step-00000001.pruning", "latest", "step-00000002",
                                                 "step-00000003", "step-00000004"}));
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, dir_ + "/step-00000004");
  // With `latest` lost, the step directories offered to resume from are all
  // whole.
  const std::string pointer = testutil::ReadFile(dir_ + "/latest");
  ASSERT_TRUE(fs::remove(dir_ + "/latest"));
  auto listed = LatestCheckpoint(dir_);
  ASSERT_EQ(listed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(listed.status().message().find("(step-00000002, step-00000003, step-00000004)"),
            std::string::npos)
      << listed.status().ToString();
  for (const std::string& name : Listing()) {
    if (name.rfind("step-", 0) == 0) EXPECT_TRUE(Load(dir_ + "/" + name).ok()) << name;
  }
  testutil::WriteFile(dir_ + "/latest", pointer);
  // The next prune removes what the cut-short one left, and goes on.
  auto next = PruneCheckpoints(dir_, 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->leftovers, 1);
  EXPECT_EQ(next->pruned, (std::vector<std::string>{"step-00000002", "step-00000003"}));
  EXPECT_EQ(next->Summary(),
            "pruned 2 checkpoints (step-00000002, step-00000003); removed 1 left by a prune cut "
            "short; kept step-00000004 (no checkpoint has an eval at its step to pick a best by "
            "char_correction_f1)");
  EXPECT_EQ(Listing(), (std::vector<std::string>{"latest", "step-00000004"}));
}

TEST_F(PruneTest, EvalRecordsRoundTripAndBadOnesAreNamed) {
  Save({1});
  const std::string step_dir = dir_ + "/step-00000001";
  EXPECT_EQ(ReadCheckpointMetric(step_dir, kRetentionMetric).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteCheckpointEval(step_dir, 1,
                                  {{kRetentionMetric, 0.123456789012345},
                                   {"nan", std::numeric_limits<double>::quiet_NaN()}})
                  .ok());
  auto m = ReadCheckpointMetric(step_dir, kRetentionMetric);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(*m, 0.123456789012345);  // %.17g: exact
  EXPECT_EQ(ReadCheckpointMetric(step_dir, "nan").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Load(step_dir).ok());  // eval.json is no part of what loads
  testutil::WriteFile(step_dir + "/eval.json", "{\"metrics\": {\"char_correction_f1\": \"x\"}}");
  auto bad = ReadCheckpointMetric(step_dir, kRetentionMetric);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find(step_dir + "/eval.json"), std::string::npos);
}

// ---- In the trainer --------------------------------------------------------

std::set<std::string> StepDirs(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0) names.insert(n);
  }
  return names;
}

// A run stopped and resumed, checkpointing every 2 steps with keep 2: the
// directory never holds more than 2 + the best, the resumed run starts from
// the step it stopped at, and the log says what was pruned.
TEST(TrainerRetentionTest, ARunKeepsTheNewestAndTheBestAndResumes) {
  using testutil::DataDir;
  using testutil::Recorder;
  if (!testutil::HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  TrainConfig c = testutil::TinyConfig();
  c.steps = 12;
  c.eval_path = DataDir() + "/ecspell/test_law.txt";
  c.max_eval_samples = 16;
  c.eval_every = 4;
  c.checkpoint_dir = testutil::TempDir();
  c.checkpoint_every = 2;
  c.keep_checkpoints = 2;
  Recorder first(8);  // stops after step 8 (checkpointed and evaluated)
  auto stopped = Train(c, nullptr, &first);
  ASSERT_EQ(stopped.status().code(), StatusCode::kCancelled) << stopped.status().ToString();
  EXPECT_LE(StepDirs(c.checkpoint_dir).size(), 3u);
  EXPECT_TRUE(StepDirs(c.checkpoint_dir).count("step-00000008"));
  bool pruned = false;
  for (const auto& l : first.logs) pruned |= l.rfind("pruned ", 0) == 0;
  EXPECT_TRUE(pruned);

  Recorder second;
  auto resumed = Train(c, nullptr, &second);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  bool from8 = false;
  for (const auto& l : second.logs) {
    from8 |= l.find("resumed from " + c.checkpoint_dir + "/step-00000008 at step 8") !=
             std::string::npos;
  }
  EXPECT_TRUE(from8);
  const std::set<std::string> left = StepDirs(c.checkpoint_dir);
  EXPECT_TRUE(left.count("step-00000010") && left.count("step-00000012"));
  ASSERT_LE(left.size(), 3u);
  // A third directory is there only as the best: better than the final eval.
  auto final_f1 = ReadCheckpointMetric(c.checkpoint_dir + "/step-00000012", kRetentionMetric);
  ASSERT_TRUE(final_f1.ok()) << final_f1.status().ToString();
  for (const std::string& n : left) {
    if (n == "step-00000010" || n == "step-00000012") continue;
    auto f1 = ReadCheckpointMetric(c.checkpoint_dir + "/" + n, kRetentionMetric);
    ASSERT_TRUE(f1.ok()) << n << ": " << f1.status().ToString();
    EXPECT_GT(*f1, *final_f1) << n;
  }
}

}  // namespace
}  // namespace dgca
