// Train() on the real ECSpell law data with a tiny model (issue 3, Must
// show 3): the loss falls, and stop + resume reproduces the uninterrupted
// losses bit for bit (same thread count). The F1 check is the longer
// trainer_f1_test.cc.
#include "model/train/trainer.h"

#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/core/data.h"
#include "model/core/eval_metrics.h"
#include "model/core/tokenizer.h"

namespace dgca {
namespace {

std::string DataDir() {
  const char* d = getenv("DGCA_SHARED_DATA");
  return d ? d : "/work/shared/data";
}

std::string TempDir() {
  char tmpl[] = "/tmp/trainer_test_XXXXXX";
  return mkdtemp(tmpl);
}

bool HaveData() {
  return std::filesystem::exists(DataDir() + "/ecspell/train_law.txt");
}

// A small model on train_law: vocabulary built from the data (about 2.3k
// ids), sentences truncated to 29 characters (max_seq_len 64).
TrainConfig TinyConfig() {
  TrainConfig c;
  c.model.hidden = 64;
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.ffn = 128;
  c.model.max_position = 64;
  c.model.prompt_length = 3;
  c.model.candidate_top_k = 8;
  c.train_path = DataDir() + "/ecspell/train_law.txt";
  c.confusion_path = DataDir() + "/confusion/pinyin_sam.json";
  c.max_seq_len = 64;
  c.micro_batch = 16;
  c.lr = 2e-3f;
  c.warmup_steps = 5;
  c.schedule = LrSchedule::kConstant;
  c.clip_norm = 1.0f;
  c.threads = 1;
  c.loader_threads = 1;
  c.seed = 7;
  return c;
}

class Recorder : public TrainObserver {
 public:
  explicit Recorder(int64_t stop_after = -1, bool verbose = false)
      : stop_after_(stop_after), verbose_(verbose) {}
  void OnStep(const StepReport& r) override {
    losses.push_back(r.loss);
    last = r;
  }
  void OnLog(const std::string& line) override {
    logs.push_back(line);
    if (verbose_) printf("  | %s\n", line.c_str());
  }
  void OnEval(const EvalReport& r) override { evals.push_back(r); }
  bool StopRequested() override { return stop_after_ > 0 && last.step >= stop_after_; }
  std::vector<double> losses;
  std::vector<std::string> logs;
  std::vector<EvalReport> evals;
  StepReport last;

 private:
  int64_t stop_after_;
  bool verbose_;
};

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(TrainerTest, LossFallsOnTrainLaw) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  TrainConfig c = TinyConfig();
  c.steps = 60;
  Recorder rec(-1, true);
  auto r = Train(c, nullptr, &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->losses.size(), 60u);
  const double first = Mean(r->losses, 0, 10), last = Mean(r->losses, 50, 60);
  printf("mean loss steps 1-10: %.4f, steps 51-60: %.4f, %.1f samples/s\n", first, last,
         r->samples_per_second);
  EXPECT_LT(last, 0.7 * first);
  for (double l : r->losses) EXPECT_TRUE(std::isfinite(l));
  // Reports are filled in.
  EXPECT_EQ(rec.last.step, 60);
  EXPECT_EQ(rec.last.total_steps, 60);
  EXPECT_EQ(rec.last.samples, 16);
  EXPECT_GT(rec.last.samples_per_second, 0);
  EXPECT_GT(rec.last.grad_norm, 0);
  EXPECT_EQ(rec.last.loss_by_head.size(), 4u);
  EXPECT_FLOAT_EQ(rec.last.learning_rate, c.lr);
  // Log lines: data counts and progress.
  bool data_line = false, step_line = false;
  for (const auto& l : rec.logs) {
    data_line |= l.find("1960 lines, 1960 kept, 0 skipped") != std::string::npos;
    step_line |= l.find("step 60/60 loss") != std::string::npos;
  }
  EXPECT_TRUE(data_line);
  EXPECT_TRUE(step_line);
}

class ResumeTest : public ::testing::TestWithParam<int> {};

TEST_P(ResumeTest, StopAndResumeIsBitExact) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  TrainConfig c = TinyConfig();
  c.threads = GetParam();  // same thread count in all three runs
  c.steps = 8;
  c.schedule = LrSchedule::kLinear;  // the schedule must resume too
  c.mft_rate = 0.3f;
  // Uninterrupted.
  auto full = Train(c, nullptr, nullptr);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  // Stopped after step 4 (checkpoint every 4), then resumed from checkpoint_dir.
  const std::string dir = TempDir();
  c.checkpoint_dir = dir;
  c.checkpoint_every = 4;
  Recorder stopper(4);
  auto stopped = Train(c, nullptr, &stopper);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kCancelled);
  ASSERT_EQ(stopper.losses.size(), 4u);
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000004/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/vocab.txt"));
  Recorder resumed_rec;
  auto resumed = Train(c, nullptr, &resumed_rec);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  ASSERT_EQ(resumed->losses.size(), 4u);
  bool said = false;
  for (const auto& l : resumed_rec.logs) said |= l.find("resumed from") != std::string::npos;
  EXPECT_TRUE(said);
  std::vector<double> joined = stopper.losses;
  joined.insert(joined.end(), resumed->losses.begin(), resumed->losses.end());
  ASSERT_EQ(joined.size(), full->losses.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    printf("step %zu: uninterrupted %.9f resumed %.9f\n", i + 1, full->losses[i], joined[i]);
    EXPECT_EQ(joined[i], full->losses[i]) << "step " << i + 1;  // bit-exact
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ResumeTest, ::testing::Values(1, 2));

TEST(TrainerTest, BadInputsAreClearErrors) {
  TrainConfig c = TinyConfig();
  c.steps = 1;
  c.train_path = "/nonexistent/train.txt";
  auto r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/train.txt"), std::string::npos)
      << r.status().ToString();
  c = TinyConfig();
  c.micro_batch = 0;
  r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("micro_batch"), std::string::npos);
  if (!HaveData()) return;
  // A checkpoint of another model size is refused, naming the field.
  const std::string dir = TempDir();
  c = TinyConfig();
  c.steps = 1;
  c.checkpoint_dir = dir;
  c.checkpoint_every = 1;
  ASSERT_TRUE(Train(c, nullptr, nullptr).ok());
  c.steps = 2;
  c.model.ffn = 96;
  r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ffn"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace dgca
