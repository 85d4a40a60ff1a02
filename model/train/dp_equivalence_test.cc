// Data-parallel equivalence and overlap with the real model (docs/model.md,
// "Trainer"). Every training run happens in a fork()ed child (the parent
// never starts compute threads, so forking is safe); results come back via
// checkpoint files and small text files.
//
// Exactness: the loss is a mean over a batch's target slots, and a rank's
// gradient is averaged over ranks, so "2 ranks x b == 1 rank x 2b" holds
// mathematically only when every row has the same number of slots. The data
// are therefore truncated to 12 characters (max_seq_len 32 with P = 3; every
// train_law sentence has at least 12), and the loss terms whose denominators
// vary per batch are off (MFT: mode none; candidate head: off). The detector
// and the LSTM prompt encoder stay on.
#include <stdlib.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gloo/rendezvous/file_store.h"
#include "gtest/gtest.h"
#include "model/comm/fork_ranks_for_test.h"
#include "model/comm/gloo_communicator.h"
#include "model/core/safetensors.h"
#include "model/train/checkpoint.h"
#include "model/train/trainer.h"

namespace dgca {
namespace {

std::string DataDir() {
  const char* d = getenv("DGCA_SHARED_DATA");
  return d ? d : "/work/shared/data";
}
bool HaveData() { return std::filesystem::exists(DataDir() + "/ecspell/train_law.txt"); }
std::string TempDir() { return comm_test::MakeTempDir("dp_equivalence_test"); }

using comm_test::RunChildren;

TrainConfig EqConfig(const std::string& ckpt_dir, int steps) {
  TrainConfig c;
  c.model.hidden = 32;
  c.model.layers = 1;
  c.model.heads = 2;
  c.model.ffn = 64;
  c.model.max_position = 32;
  c.model.detector = true;
  c.model.candidate = false;
  c.model.fusion = FusionKind::kNone;
  c.train_path = DataDir() + "/ecspell/train_law.txt";
  c.max_seq_len = 32;
  c.mft_mode = MftMode::kNone;
  c.lr = 1e-3f;
  c.weight_decay = 0.01f;
  c.schedule = LrSchedule::kConstant;
  c.steps = steps;
  c.threads = 1;
  c.seed = 11;
  c.checkpoint_dir = ckpt_dir;
  c.checkpoint_every = steps;
  return c;
}

class OverlapRecorder : public TrainObserver {
 public:
  void OnStep(const StepReport& r) override { reports.push_back(r); }
  // DGCA_TEST_VERBOSE=1 prints the trainer's log lines with a timestamp.
  void OnLog(const std::string& line) override {
    if (getenv("DGCA_TEST_VERBOSE")) {
      fprintf(stderr, "[%.3f] %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                  .count(),
              line.c_str());
    }
  }
  std::vector<StepReport> reports;
};

// Gradient norms (after the all-reduce, before clipping) per step, one per
// line: unlike the weights after AdamW (whose update m/sqrt(v) does not see
// a constant gradient scale), they expose a wrong average or accumulation scale.
void WriteGradNorms(const std::vector<StepReport>& reports, const std::string& path) {
  FILE* f = fopen(path.c_str(), "w");
  for (const StepReport& s : reports) fprintf(f, "%.9g\n", s.grad_norm);
  fclose(f);
}

std::vector<double> ReadGradNorms(const std::string& path) {
  std::vector<double> out;
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return out;
  double x;
  while (fscanf(f, "%lf", &x) == 1) out.push_back(x);
  fclose(f);
  return out;
}

int TrainLocal(TrainConfig c) {
  OverlapRecorder rec;
  auto r = Train(c, nullptr, &rec);
  if (!r.ok()) {
    fprintf(stderr, "train: %s\n", r.status().ToString().c_str());
    return 1;
  }
  WriteGradNorms(rec.reports, c.checkpoint_dir + "/grad_norms.txt");
  return 0;
}

void CompareGradNorms(const std::string& a_dir, const std::string& b_dir, int steps) {
  auto a = ReadGradNorms(a_dir + "/grad_norms.txt");
  auto b = ReadGradNorms(b_dir + "/grad_norms.txt");
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  ASSERT_EQ(b.size(), static_cast<size_t>(steps));
  double worst = 0;
  for (int i = 0; i < steps; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / a[i]);
  printf("grad norms step 1: %.6f vs %.6f; max relative difference over %d steps %.3g\n", a[0],
         b[0], steps, worst);
  EXPECT_LT(worst, 1e-4);
}

// Rank `rank` of 2 over Gloo (FileStore in store_dir); rank 0 writes its step
// reports to report_path.
int TrainRank(TrainConfig c, const std::string& store_dir, int rank,
              const std::string& report_path) {
  auto store = std::make_shared<gloo::rendezvous::FileStore>(store_dir);
  GlooOptions o;
  o.timeout = std::chrono::milliseconds(30000);
  auto comm = MakeGlooCommunicator(store, rank, 2, o);
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 2;
  }
  OverlapRecorder rec;
  auto r = Train(c, comm->get(), &rec);
  if (!r.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, r.status().ToString().c_str());
    return 3;
  }
  if (rank == 0 && !c.checkpoint_dir.empty()) {
    WriteGradNorms(rec.reports, c.checkpoint_dir + "/grad_norms.txt");
  }
  if (rank == 0 && !report_path.empty()) {
    FILE* f = fopen(report_path.c_str(), "w");
    for (const StepReport& s : rec.reports) {
      fprintf(f, "%d %.6f %.6f %.6f %.6f %.6f\n", s.buckets, s.first_allreduce_start,
              s.backward_end, s.allreduce_seconds, s.exposed_comm_seconds, s.step_seconds);
    }
    fclose(f);
  }
  return 0;
}

struct WeightDiff {
  double max_abs = 0;  // max |a - b| over every weight
  double max_rel = 0;  // max |a - b| / max(|a|, 1e-3)
};

// The weights two runs checkpointed after `steps` (DIR/step-NNNNNNNN/),
// compared tensor by tensor; fails on a name or shape mismatch.
void CompareWeights(const std::string& a_dir, const std::string& b_dir, int steps, WeightDiff* d) {
  const std::string file = "/" + CheckpointDirName(steps) + "/model.safetensors";
  auto a = ReadSafetensors(a_dir + file);
  auto b = ReadSafetensors(b_dir + file);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  *d = WeightDiff();
  for (const auto& kv : a->tensors) {
    auto it = b->tensors.find(kv.first);
    ASSERT_NE(it, b->tensors.end()) << kv.first;
    ASSERT_EQ(kv.second.shape, it->second.shape) << kv.first;
    for (size_t i = 0; i < kv.second.data.size(); ++i) {
      const double x = kv.second.data[i], y = it->second.data[i];
      d->max_abs = std::max(d->max_abs, std::fabs(x - y));
      d->max_rel = std::max(d->max_rel, std::fabs(x - y) / std::max(1e-3, std::fabs(x)));
    }
  }
}

// 1 step of lr 1e-3 with Adam moves a weight by up to ~1e-3, so a max
// difference of 2e-5 is below 2% of one update: reduction-order noise, not a
// different algorithm (a wrong average or a missed bucket moves weights by
// ~1e-3).
constexpr double kTolAbs = 2e-5;

// What every equivalence below checks of two runs of `steps` steps: the
// same weights within kTolAbs and the same gradient norm at every step.
void ExpectSameTraining(const std::string& a_dir, const std::string& b_dir, int steps,
                        const char* what) {
  WeightDiff d;
  CompareWeights(a_dir, b_dir, steps, &d);
  printf("%s, %d steps: max |dw| = %.3g (max rel %.3g)\n", what, steps, d.max_abs, d.max_rel);
  EXPECT_LT(d.max_abs, kTolAbs);
  CompareGradNorms(a_dir, b_dir, steps);
}

TEST(DpEquivalenceTest, TwoRanksOfBEqualOneRankOf2B) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string one = TempDir(), two = TempDir(), store = TempDir();
  const int steps = 4;
  TrainConfig c1 = EqConfig(one, steps);
  c1.micro_batch = 8;
  TrainConfig c2 = EqConfig(two, steps);
  c2.micro_batch = 4;
  c2.bucket_mb = 0.02;  // several buckets
  auto codes = RunChildren({[&] { return TrainLocal(c1); },
                            [&] { return TrainRank(c2, store, 0, ""); },
                            [&] { return TrainRank(c2, store, 1, ""); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0, 0}));
  ExpectSameTraining(one, two, steps, "2 ranks x micro-batch 4 vs 1 rank x 8");
}

// Dropout masks are a function of each sample's key (model/core/dropout.h),
// not of the batch it lands in: with dropout 0.1 two ranks of B still
// train the weights of one rank of 2B, and those weights are not the ones
// training without dropout gives (the masks are really applied).
TEST(DpEquivalenceTest, TwoRanksOfBEqualOneRankOf2BWithDropout) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string one = TempDir(), two = TempDir(), none = TempDir(), store = TempDir();
  const int steps = 4;
  TrainConfig c1 = EqConfig(one, steps);
  c1.model.hidden_dropout = c1.model.attention_dropout = 0.1f;
  c1.micro_batch = 8;
  TrainConfig c2 = c1;
  c2.checkpoint_dir = two;
  c2.micro_batch = 4;
  c2.bucket_mb = 0.02;
  TrainConfig c0 = EqConfig(none, steps);
  c0.micro_batch = 8;
  auto codes = RunChildren({[&] { return TrainLocal(c1); },
                            [&] { return TrainRank(c2, store, 0, ""); },
                            [&] { return TrainRank(c2, store, 1, ""); },
                            [&] { return TrainLocal(c0); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0, 0, 0}));
  ExpectSameTraining(one, two, steps, "dropout 0.1: 2 ranks x micro-batch 4 vs 1 rank x 8");
  WeightDiff off;
  CompareWeights(one, none, steps, &off);
  printf("dropout 0.1 vs none, 1 rank x 8: max |dw| = %.3g\n", off.max_abs);
  EXPECT_GT(off.max_abs, 10 * kTolAbs) << "dropout 0.1 trained the weights of no dropout";
}

TEST(DpEquivalenceTest, AccumulationOfBEqualsOneStepOfKB) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string big = TempDir(), acc = TempDir();
  const int steps = 4;
  TrainConfig cb = EqConfig(big, steps);
  cb.micro_batch = 12;
  TrainConfig ca = EqConfig(acc, steps);
  ca.micro_batch = 4;
  ca.accumulation = 3;
  auto codes = RunChildren({[&] { return TrainLocal(cb); }, [&] { return TrainLocal(ca); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0}));
  ExpectSameTraining(big, acc, steps, "accumulation 3 x micro-batch 4 vs 1 x 12");
}

TEST(DpEquivalenceTest, TwoRanksWithAccumulationEqualOneRank) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string one = TempDir(), two = TempDir(), store = TempDir();
  const int steps = 3;
  TrainConfig c1 = EqConfig(one, steps);
  c1.micro_batch = 8;
  TrainConfig c2 = EqConfig(two, steps);
  c2.micro_batch = 2;
  c2.accumulation = 2;
  c2.bucket_mb = 0.05;
  auto codes = RunChildren({[&] { return TrainLocal(c1); },
                            [&] { return TrainRank(c2, store, 0, ""); },
                            [&] { return TrainRank(c2, store, 1, ""); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0, 0}));
  ExpectSameTraining(one, two, steps, "2 ranks x accumulation 2 x micro-batch 2 vs 1 rank x 8");
}

// Overlapping the all-reduce with backward changes when buckets run, never
// what they compute: the same buckets reduced after backward give the same
// bits.
TEST(DpEquivalenceTest, OverlapOnAndOffGiveIdenticalWeights) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string on = TempDir(), off = TempDir(), s_on = TempDir(), s_off = TempDir();
  const int steps = 3;
  TrainConfig c_on = EqConfig(on, steps);
  c_on.micro_batch = 4;
  c_on.bucket_mb = 0.02;
  c_on.overlap = true;
  TrainConfig c_off = c_on;
  c_off.checkpoint_dir = off;
  c_off.overlap = false;
  auto codes = RunChildren({[&] { return TrainRank(c_on, s_on, 0, ""); },
                            [&] { return TrainRank(c_on, s_on, 1, ""); },
                            [&] { return TrainRank(c_off, s_off, 0, ""); },
                            [&] { return TrainRank(c_off, s_off, 1, ""); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0, 0, 0}));
  WeightDiff d;
  CompareWeights(on, off, steps, &d);
  printf("overlap on vs off, 2 ranks, %d steps: max |dw| = %.3g\n", steps, d.max_abs);
  EXPECT_EQ(d.max_abs, 0.0);
}

// The final loss is one figure for the job: each rank's mean over its last
// kFinalLossSteps steps, averaged over the ranks, the same on every rank.
TEST(DpFinalLossTest, EveryRankHoldsTheMeanOverRanksOfItsLastTenSteps) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string dir = TempDir(), store = TempDir();
  const int steps = 13;  // more than the window: the first 3 steps stay out
  auto rank = [&](int r) {
    TrainConfig c = EqConfig("", steps);
    c.micro_batch = 2;
    c.checkpoint_every = 0;
    auto st = std::make_shared<gloo::rendezvous::FileStore>(store);
    GlooOptions o;
    o.timeout = std::chrono::milliseconds(30000);
    auto comm = MakeGlooCommunicator(st, r, 2, o);
    if (!comm.ok()) return 2;
    auto res = Train(c, comm->get(), nullptr);
    if (!res.ok()) {
      fprintf(stderr, "rank %d: %s\n", r, res.status().ToString().c_str());
      return 3;
    }
    FILE* f = fopen((dir + "/rank" + std::to_string(r) + ".txt").c_str(), "w");
    fprintf(f, "%.9g %d %d\n", res->final_loss, res->final_loss_steps, res->final_loss_ranks);
    for (double l : res->losses) fprintf(f, "%.9g\n", l);
    fclose(f);
    return 0;
  };
  ASSERT_EQ(RunChildren({[&] { return rank(0); }, [&] { return rank(1); }}),
            (std::vector<int>{0, 0}));
  double final_loss[2];
  double mean_of_means = 0;
  for (int r = 0; r < 2; ++r) {
    FILE* f = fopen((dir + "/rank" + std::to_string(r) + ".txt").c_str(), "r");
    ASSERT_NE(f, nullptr);
    int n = 0, ranks = 0;
    ASSERT_EQ(fscanf(f, "%lf %d %d", &final_loss[r], &n, &ranks), 3);
    EXPECT_EQ(n, kFinalLossSteps);
    EXPECT_EQ(ranks, 2);
    std::vector<double> losses;
    double x;
    while (fscanf(f, "%lf", &x) == 1) losses.push_back(x);
    fclose(f);
    ASSERT_EQ(losses.size(), static_cast<size_t>(steps));
    double sum = 0;
    for (int i = steps - kFinalLossSteps; i < steps; ++i) sum += losses[i];
    mean_of_means += sum / kFinalLossSteps / 2;
  }
  // The same value on both ranks (one all-reduce), and the mean over ranks
  // of their 10-step means to float precision.
  EXPECT_EQ(final_loss[0], final_loss[1]);
  EXPECT_NEAR(final_loss[0], mean_of_means, 1e-5 * mean_of_means);
  printf("final loss %.6f, mean over ranks of the 10-step means %.6f\n", final_loss[0],
         mean_of_means);
}

// With buckets smaller than the model, bucket all-reduces start
// running before backward ends, and the exposed (blocking) communication is
// smaller than the total all-reduce time.
TEST(DpOverlapTest, BucketsStartBeforeBackwardEndsAndExposedBelowTotal) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string ckpt = TempDir(), store = TempDir();
  const std::string report = store + "/report.txt";
  TrainConfig c = EqConfig(ckpt, 4);
  c.model.hidden = 128;   // the tiny preset's width
  c.model.layers = 2;
  c.model.ffn = 512;
  c.model.max_position = 64;
  c.max_seq_len = 64;
  c.micro_batch = 8;
  c.checkpoint_every = 0;
  c.checkpoint_dir = "";
  c.bucket_mb = 0.25;
  c.overlap = true;
  auto codes = RunChildren({[&] { return TrainRank(c, store, 0, report); },
                            [&] { return TrainRank(c, store, 1, ""); }});
  ASSERT_EQ(codes, (std::vector<int>{0, 0}));
  FILE* f = fopen(report.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int buckets;
  double first, bend, total, exposed, step;
  double sum_total = 0, sum_exposed = 0, sum_step = 0;
  int early = 0, n = 0;
  while (fscanf(f, "%d %lf %lf %lf %lf %lf", &buckets, &first, &bend, &total, &exposed, &step) == 6) {
    printf("step %d: %d buckets, first all-reduce started %.2f ms before backward end, "
           "all-reduce %.2f ms, exposed %.2f ms, step %.2f ms\n",
           n + 1, buckets, (bend - first) * 1e3, total * 1e3, exposed * 1e3, step * 1e3);
    EXPECT_GT(buckets, 1);
    early += first < bend;
    sum_total += total;
    sum_exposed += exposed;
    sum_step += step;
    ++n;
  }
  fclose(f);
  ASSERT_EQ(n, 4);
  printf("total share %.3f, exposed share %.3f\n", sum_total / sum_step, sum_exposed / sum_step);
  // Every step in quiet runs; one straggler step is tolerated (on a loaded
  // 2-core machine the comm thread may not get a CPU until backward ends).
  EXPECT_GE(early, n - 1);
  EXPECT_LT(sum_exposed / sum_step, sum_total / sum_step);
}

// A dead peer at the trainer level: rank 1 is SIGKILLed in the
// middle of training; rank 0's Train() returns an error naming the lost
// rank, within the communicator timeout, instead of hanging.
class KillAtStep : public TrainObserver {
 public:
  explicit KillAtStep(int64_t step) : step_(step) {}
  void OnStep(const StepReport& r) override {
    if (r.step == step_) raise(SIGKILL);
  }

 private:
  int64_t step_;
};

TEST(DpFailureTest, KilledRankFailsSurvivorNamingIt) {
  if (!HaveData()) GTEST_SKIP() << "no train_law.txt under " << DataDir();
  const std::string store = TempDir();
  const std::string result = store + "/result.txt";
  TrainConfig c = EqConfig("", 50);
  c.checkpoint_every = 0;
  c.micro_batch = 4;
  c.bucket_mb = 0.02;
  const int timeout_ms = 5000;
  auto run = [&](int rank) -> int {
    auto st = std::make_shared<gloo::rendezvous::FileStore>(store);
    GlooOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    auto comm = MakeGlooCommunicator(st, rank, 2, o);
    if (!comm.ok()) return 2;
    KillAtStep killer(rank == 1 ? 3 : -1);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = Train(c, comm->get(), &killer);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    FILE* f = fopen(result.c_str(), "w");
    fprintf(f, "%.3f\n%s\n", secs, r.ok() ? "OK" : r.status().ToString().c_str());
    fclose(f);
    return r.ok() ? 3 : 0;
  };
  auto codes = RunChildren({[&] { return run(0); }, [&] { return run(1); }});
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  FILE* f = fopen(result.c_str(), "r");
  ASSERT_NE(f, nullptr);
  double secs = 0;
  char line[4096] = {0};
  ASSERT_EQ(fscanf(f, "%lf\n", &secs), 1);
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  fclose(f);
  printf("survivor's Train() returned after %.2f s: %s", secs, line);
  const std::string msg = line;
  EXPECT_NE(msg.find("lost peer rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at step 4"), std::string::npos) << msg;
  EXPECT_LT(secs, timeout_ms / 1000.0 + 10.0);
}

}  // namespace
}  // namespace dgca
