// Train() on the real ECSpell law data with a tiny model: the loss
// falls, and stop + resume reproduces the uninterrupted
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
#include "model/train/trainer_test_util.h"

namespace dgca {
namespace {

using namespace testutil;  // NOLINT: test helpers

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

// The phases a single rank goes through, as another thread would read them:
// data before each micro-batch (OnBatch runs inside it), forward and
// backward for each (the CPU model's first gradient callback starts
// backward), the optimizer before the step's report, the checkpoint while
// rank 0 writes it, eval batch by batch.
class PhaseRecorder : public Recorder {
 public:
  PhaseTracker* phases() override { return &tracker; }
  void OnBatch(const Batch&, int64_t step, int micro) override {
    at_batch.push_back(tracker.Read());
    EXPECT_EQ(at_batch.back().step, step) << micro;
  }
  void OnStep(const StepReport& r) override {
    Recorder::OnStep(r);
    at_step.push_back(tracker.Read());
  }
  void OnEval(const EvalReport& r) override {
    Recorder::OnEval(r);
    at_eval.push_back(tracker.Read());
  }
  void OnCheckpoint(const std::string&, int64_t) override { at_checkpoint.push_back(tracker.Read()); }
  PhaseTracker tracker;
  std::vector<PhaseSnapshot> at_batch, at_step, at_eval, at_checkpoint;
};

TEST(TrainerTest, PhasesFollowTheStep) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  TrainConfig c = TinyConfig();
  c.steps = 4;
  c.micro_batch = 8;
  c.accumulation = 2;
  c.eval_path = DataDir() + "/ecspell/test_law.txt";
  c.max_eval_samples = 20;  // 3 batches of 8
  c.checkpoint_dir = TempDir();
  c.checkpoint_every = 2;
  PhaseRecorder rec;
  auto r = Train(c, nullptr, &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(rec.at_batch.size(), 8u);
  for (const PhaseSnapshot& s : rec.at_batch) EXPECT_EQ(s.phase, TrainPhase::kData);
  ASSERT_EQ(rec.at_step.size(), 4u);
  for (size_t i = 0; i < rec.at_step.size(); ++i) {
    EXPECT_EQ(rec.at_step[i].phase, TrainPhase::kOptimizer);
    EXPECT_EQ(rec.at_step[i].step, static_cast<int64_t>(i + 1));
  }
  // Per micro-batch data, forward, backward; then the optimizer: 7 for
  // accumulation 2 (steps 2 -> 3: the checkpoint of step 2 and its
  // barrier come in between).
  EXPECT_EQ(rec.at_step[1].progress - rec.at_step[0].progress, 7);
  EXPECT_EQ(rec.at_step[2].progress - rec.at_step[1].progress, 7 + 2);
  ASSERT_EQ(rec.at_checkpoint.size(), 2u);
  EXPECT_EQ(rec.at_checkpoint[0].phase, TrainPhase::kCheckpoint);
  EXPECT_EQ(rec.at_checkpoint[0].step, 2);
  ASSERT_EQ(rec.at_eval.size(), 1u);
  EXPECT_EQ(rec.at_eval[0].phase, TrainPhase::kEval);
  EXPECT_EQ(rec.at_eval[0].step, 4);
  EXPECT_EQ(rec.at_eval[0].index, 3);  // its last batch
  EXPECT_EQ(rec.at_eval[0].count, 3);
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

// A vocabulary without the special tokens the batches are built from was
// accepted and failed at step 1 ("batch.input_ids[0] ... = 101 outside [0,
// vocab_size=2)"): refused before training, naming the file and the tokens.
TEST(TrainerTest, VocabWithoutSpecialTokensIsRefused) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const std::string dir = TempDir();
  TrainConfig c = TinyConfig();
  c.steps = 1;
  c.vocab_path = dir + "/vocab.txt";
  WriteFile(c.vocab_path, "[PAD]\n[UNK]\n");
  auto r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find(c.vocab_path + ": the vocabulary (2 tokens) lacks the "
                                      "special tokens [CLS], [SEP], [MASK]"),
            std::string::npos) << r.status().ToString();
  WriteFile(c.vocab_path, "[CLS]\n[SEP]\n[MASK]\n[UNK]\n法\n");
  r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lacks the special token [PAD] that"), std::string::npos)
      << r.status().ToString();
  // The vocabulary saved next to the checkpoints is held to the same.
  c.vocab_path.clear();
  c.checkpoint_dir = dir + "/ck";
  std::filesystem::create_directories(c.checkpoint_dir);
  WriteFile(c.checkpoint_dir + "/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
  r = Train(c, nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(c.checkpoint_dir + "/vocab.txt: the vocabulary (4 tokens) "
                                      "lacks the special token [MASK]"),
            std::string::npos) << r.status().ToString();
}

// `latest` deleted while the step directories stay was a silent fresh start
// (random init, then `latest` rewritten): now an error naming both.
TEST(TrainerTest, MissingLatestWithStepDirectoriesIsNotAFreshStart) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  TrainConfig c = TinyConfig();
  c.steps = 1;
  c.checkpoint_dir = TempDir();
  c.checkpoint_every = 1;
  ASSERT_TRUE(Train(c, nullptr, nullptr).ok());
  ASSERT_TRUE(std::filesystem::remove(c.checkpoint_dir + "/latest"));
  c.steps = 2;
  Recorder rec;
  auto r = Train(c, nullptr, &rec);
  ASSERT_FALSE(r.ok()) << "trained " << rec.losses.size() << " steps";
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(c.checkpoint_dir + " has no 'latest' file but holds step "
                                      "directories (step-00000001)"),
            std::string::npos) << r.status().ToString();
  EXPECT_TRUE(rec.losses.empty());
  EXPECT_FALSE(std::filesystem::exists(c.checkpoint_dir + "/latest"));
}

}  // namespace
}  // namespace dgca
