// Train() drives a TrainDevice (model/train/train_device.h) through the
// contract the GPU device relies on, checked here with a recording wrapper
// around the CPU device: per step ZeroGrads -> micro-steps -> ClipGradNorm
// -> OptimizerStep -> FinishStep; PullToHost before every checkpoint;
// PushFromHost after init_from; gradient buckets over grad_buffer(). And the
// batch stream OnBatch reports (what dgca-train --dump-batches writes) is
// the one the model trained on: replaying it through a fresh model with the
// same weights gives the same losses.
#include "model/train/train_device.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/core/batch_io.h"
#include "model/core/tokenizer.h"
#include "model/train/checkpoint.h"
#include "model/train/trainer.h"
#include "model/train/trainer_test_util.h"

namespace dgca {
namespace {

using testutil::DataDir;
using testutil::HaveData;
using testutil::TinyConfig;

// Forwards to the CPU device and records the calls in order.
class RecordingDevice : public TrainDevice {
 public:
  RecordingDevice(std::unique_ptr<TrainDevice> inner, std::vector<std::string>* calls,
                  bool pretend_gpu = false)
      : inner_(std::move(inner)), calls_(calls), pretend_gpu_(pretend_gpu) {}
  std::string Describe() const override { return "recording " + inner_->Describe(); }
  DgcaModel* model() override { return inner_->model(); }
  ParamStore& params() override { return inner_->params(); }
  AdamW& adam() override { return inner_->adam(); }
  bool device_memory() const override { return pretend_gpu_ || inner_->device_memory(); }
  float* grad_buffer() override {
    calls_->push_back("grad_buffer");
    return inner_->grad_buffer();
  }
  float* value_buffer() override { return inner_->value_buffer(); }
  float* moment1_buffer() override { return inner_->moment1_buffer(); }
  float* moment2_buffer() override { return inner_->moment2_buffer(); }
  Status BuffersChanged(int64_t s) override {
    calls_->push_back("changed");
    return inner_->BuffersChanged(s);
  }
  Status ZeroGrads() override {
    calls_->push_back("zero");
    return inner_->ZeroGrads();
  }
  StatusOr<double> ClipGradNorm(double m) override {
    calls_->push_back("clip");
    return inner_->ClipGradNorm(m);
  }
  Status OptimizerStep(float lr) override {
    calls_->push_back("step");
    return inner_->OptimizerStep(lr);
  }
  Status FinishStep() override {
    calls_->push_back("finish");
    return inner_->FinishStep();
  }
  Status PullToHost() override {
    calls_->push_back("pull");
    return inner_->PullToHost();
  }
  Status PushFromHost() override {
    calls_->push_back("push");
    return inner_->PushFromHost();
  }

 private:
  std::unique_ptr<TrainDevice> inner_;
  std::vector<std::string>* calls_;
  bool pretend_gpu_;
};

// A world of two whose collectives all fail: Train() must refuse a GPU
// device with it before any collective runs.
class GlooLikeWorld : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "gloo"; }
  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float*, size_t, ReduceOp) override {
    return InternalError("no collectives in this test");
  }
  Status Broadcast(float*, size_t, int) override { return InternalError("no collectives in this test"); }
  Status Barrier() override { return InternalError("no collectives in this test"); }
  double Now() const override { return 0; }
};

class BatchLog : public testutil::Recorder {
 public:
  void OnBatch(const Batch& b, int64_t step, int micro) override {
    calls->push_back("batch " + std::to_string(step) + "." + std::to_string(micro));
    batches.push_back(b);
  }
  std::vector<std::string>* calls = nullptr;
  std::vector<Batch> batches;
};

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

TEST(TrainDeviceTest, TrainerDrivesTheDeviceInContractOrder) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << DataDir();
  const std::string dir = testutil::TempDir();
  TrainConfig c = TinyConfig();
  c.steps = 3;
  c.accumulation = 2;
  c.micro_batch = 4;
  c.checkpoint_dir = dir + "/ckpt";
  c.checkpoint_every = 2;
  std::vector<std::string> calls;
  TrainDeviceFactory factory = [&](const TrainDeviceSpec& spec) -> StatusOr<std::unique_ptr<TrainDevice>> {
    EXPECT_EQ(spec.micro_batch, 4);
    EXPECT_EQ(spec.seq_len, 64);
    EXPECT_EQ(spec.seed, 7u);
    DGCA_ASSIGN_OR_RETURN(std::unique_ptr<TrainDevice> cpu, MakeCpuTrainDevice(spec));
    return std::unique_ptr<TrainDevice>(new RecordingDevice(std::move(cpu), &calls));
  };
  BatchLog obs;
  obs.calls = &calls;
  auto r = Train(c, nullptr, &obs, factory);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string step = "zero,batch S.0,batch S.1,clip,step,finish";
  auto s = [&](int k) {
    std::string x = step;
    for (size_t p; (p = x.find('S')) != std::string::npos;) x.replace(p, 1, std::to_string(k));
    return x;
  };
  // Checkpoints at step 2 and at the end (3): both pulled to the host first.
  EXPECT_EQ(Join(calls), "grad_buffer," + s(1) + "," + s(2) + ",pull," + s(3) + ",pull") << Join(calls);
  bool logged = false;
  for (const auto& l : obs.logs) logged |= l == "device: recording cpu (1 thread)";
  EXPECT_TRUE(logged);
}

TEST(TrainDeviceTest, GpuDevicesWaitForTheBackwardAndNeedNccl) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << DataDir();
  TrainConfig c = TinyConfig();
  c.steps = 1;
  c.accumulation = 2;
  c.micro_batch = 4;
  std::vector<std::string> calls;
  TrainDeviceFactory gpu_like = [&](const TrainDeviceSpec& spec) -> StatusOr<std::unique_ptr<TrainDevice>> {
    DGCA_ASSIGN_OR_RETURN(std::unique_ptr<TrainDevice> cpu, MakeCpuTrainDevice(spec));
    return std::unique_ptr<TrainDevice>(new RecordingDevice(std::move(cpu), &calls, /*pretend_gpu=*/true));
  };
  // World of one: the last micro-step's backward is waited for (finish)
  // before the communication is timed, then the step ends as usual.
  BatchLog obs;
  obs.calls = &calls;
  auto r = Train(c, nullptr, &obs, gpu_like);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Join(calls), "grad_buffer,zero,batch 1.0,batch 1.1,finish,clip,step,finish") << Join(calls);
  // Gradients in GPU memory cannot go through Gloo.
  GlooLikeWorld gloo;
  calls.clear();
  auto bad = Train(c, &gloo, nullptr, gpu_like);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("needs the nccl backend, got gloo"), std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(calls.size(), 0u) << Join(calls);
}

TEST(TrainDeviceTest, InitFromIsPushedToTheDevice) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << DataDir();
  const std::string dir = testutil::TempDir();
  // A checkpoint's model.safetensors has our parameter names: init_from
  // accepts it (HF names for BERT, ours for the rest).
  TrainConfig c = TinyConfig();
  c.steps = 1;
  c.checkpoint_dir = dir + "/a";
  c.checkpoint_every = 1;
  ASSERT_TRUE(Train(c, nullptr, nullptr).ok());
  auto latest = LatestCheckpoint(c.checkpoint_dir);
  ASSERT_TRUE(latest.ok());
  TrainConfig d = TinyConfig();
  d.steps = 1;
  d.vocab_path = c.checkpoint_dir + "/vocab.txt";
  d.init_from = *latest + "/model.safetensors";
  std::vector<std::string> calls;
  TrainDeviceFactory factory = [&](const TrainDeviceSpec& spec) -> StatusOr<std::unique_ptr<TrainDevice>> {
    DGCA_ASSIGN_OR_RETURN(std::unique_ptr<TrainDevice> cpu, MakeCpuTrainDevice(spec));
    return std::unique_ptr<TrainDevice>(new RecordingDevice(std::move(cpu), &calls));
  };
  testutil::Recorder rec;
  ASSERT_TRUE(Train(d, nullptr, &rec, factory).ok());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls[0], "push") << Join(calls);
  bool all = false;
  for (const auto& l : rec.logs) all |= l.find("init_from") == 0 && l.find("missing 0") != std::string::npos;
  EXPECT_TRUE(all) << "init_from should load every parameter";
}

TEST(TrainDeviceTest, RecordedBatchesReplayToTheSameLosses) {
  if (!HaveData()) GTEST_SKIP() << "no ECSpell data under " << DataDir();
  const std::string dir = testutil::TempDir();
  TrainConfig c = TinyConfig();
  c.steps = 3;
  c.accumulation = 2;
  c.micro_batch = 4;
  c.clip_norm = 0;
  c.warmup_steps = 0;
  std::vector<std::string> calls;
  BatchLog obs;
  obs.calls = &calls;
  auto r = Train(c, nullptr, &obs, MakeCpuTrainDevice);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(obs.batches.size(), 6u);

  // Through the file, as dgca-train --dump-batches writes it.
  const std::string path = dir + "/batches.bin";
  {
    auto w = BatchRecordWriter::Open(path);
    ASSERT_TRUE(w.ok());
    for (size_t i = 0; i < obs.batches.size(); ++i) {
      ASSERT_TRUE((*w)->Append(1 + i / 2, i % 2, obs.batches[i]).ok());
    }
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto records = ReadBatchRecords(path);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 6u);

  // Replay: the same init (seed), the same optimizer, the recorded batches.
  TrainDeviceSpec spec;
  spec.model = c.model;
  // The vocabulary Train() built from the training data.
  auto vocab = Vocab::BuildFromExamples({c.train_path});
  ASSERT_TRUE(vocab.ok());
  spec.model.vocab_size = vocab->size();
  spec.micro_batch = c.micro_batch;
  spec.seq_len = c.max_seq_len;
  spec.seed = c.seed;
  spec.threads = 1;
  spec.adam.weight_decay = c.weight_decay;
  auto dev = MakeCpuTrainDevice(spec);
  ASSERT_TRUE(dev.ok());
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*dev)->ZeroGrads().ok());
    double sum = 0;
    for (int a = 0; a < 2; ++a) {
      const BatchRecord& rec = (*records)[step * 2 + a];
      EXPECT_EQ(rec.step, step + 1);
      EXPECT_EQ(rec.micro, a);
      auto lb = (*dev)->model()->ForwardBackward(rec.batch, 0.5f, {});
      ASSERT_TRUE(lb.ok());
      sum += lb->total;
    }
    losses.push_back(sum / 2);
    ASSERT_TRUE((*dev)->ClipGradNorm(0).ok());
    ASSERT_TRUE((*dev)->OptimizerStep(c.lr).ok());
  }
  ASSERT_EQ(r->losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(losses[i], r->losses[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace dgca
