// Shared pieces of the trainer tests (trainer_test.cc, trainer_f1_test.cc):
// where the shared data is, a tiny model on train_law, and an observer that
// records losses, logs and evaluations and can stop training after a step.
#ifndef DGCA_MODEL_TRAIN_TRAINER_TEST_UTIL_H_
#define DGCA_MODEL_TRAIN_TRAINER_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "model/core/core_test_util.h"
#include "model/train/trainer.h"

namespace dgca {
namespace testutil {

inline std::string DataDir() {
  const char* d = getenv("DGCA_SHARED_DATA");
  return d ? d : "/work/shared/data";
}

inline std::string TempDir() { return MakeTempDir("trainer_test"); }

inline bool HaveData() {
  return std::filesystem::exists(DataDir() + "/ecspell/train_law.txt");
}

// A small model on train_law: vocabulary built from the data (about 2.3k
// ids), sentences truncated to 29 characters (max_seq_len 64).
inline TrainConfig TinyConfig() {
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

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_TRAINER_TEST_UTIL_H_
