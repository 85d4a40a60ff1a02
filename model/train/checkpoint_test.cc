#include "model/train/checkpoint.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "gtest/gtest.h"
#include "model/core/core_test_util.h"
#include "model/core/safetensors.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;

std::string TempDir() { return testutil::MakeTempDir("checkpoint_test"); }

void Declare(ParamStore* ps) {
  ps->Declare("bert.embeddings.word_embeddings.weight", {10, 4}, true);
  ps->Declare("bert.encoder.layer.0.output.LayerNorm.weight", {4}, false);
  ps->Declare("cls.predictions.bias", {10}, false);
  ps->Declare("detector.weight", {4}, true);
  ps->Finalize();
}

ModelConfig Cfg() {
  ModelConfig c;
  c.vocab_size = 10;
  c.hidden = 4;
  return c;
}

bool Contains(const Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    Declare(&ps_);
    // Every tensor's elements (the alignment gaps between them stay zero).
    for (int t = 0; t < ps_.size(); ++t)
      for (int64_t i = ps_.info(t).offset; i < ps_.info(t).offset + ps_.info(t).numel; ++i) {
        ps_.values()[i] = 0.5f * i - 3.0f;
        ps_.grads()[i] = 0.01f * i;
      }
    adam_ = std::make_unique<AdamW>(&ps_, AdamWOptions{});
    adam_->Step(0.1f);
    adam_->Step(0.1f);
    state_.step = 2;
    state_.loader_step = 2;
    state_.seed = 18446744073709551557ull;  // > int64: stored as a string
    state_.rng_state = 7;
    auto d = SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    step_dir_ = *d;
  }
  Status LoadFresh() {
    ParamStore ps;
    Declare(&ps);
    AdamW adam(&ps, AdamWOptions{});
    CheckpointState st;
    return LoadCheckpoint(step_dir_, Cfg(), &ps, &adam, &st);
  }
  std::string dir_, step_dir_;
  ParamStore ps_;
  std::unique_ptr<AdamW> adam_;
  CheckpointState state_;
};

TEST_F(CheckpointTest, RoundTripRestoresEverything) {
  EXPECT_EQ(fs::path(step_dir_).filename(), "step-00000002");
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, step_dir_);
  ParamStore ps;
  Declare(&ps);
  AdamW adam(&ps, AdamWOptions{});
  CheckpointState st;
  ASSERT_TRUE(LoadCheckpoint(*latest, Cfg(), &ps, &adam, &st).ok());
  for (int64_t i = 0; i < ps.total_numel(); ++i) {
    EXPECT_EQ(ps.values()[i], ps_.values()[i]);
    EXPECT_EQ(adam.m()[i], adam_->m()[i]);
    EXPECT_EQ(adam.v()[i], adam_->v()[i]);
  }
  EXPECT_EQ(adam.step(), 2);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.loader_step, 2);
  EXPECT_EQ(st.seed, 18446744073709551557ull);
  EXPECT_EQ(st.rng_state, 7u);
  // No temp dirs left behind.
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2);  // step-00000002, latest
}

TEST_F(CheckpointTest, LatestMovesForward) {
  state_.step = 10;
  ASSERT_TRUE(SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_).ok());
  auto latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(fs::path(*latest).filename(), "step-00000010");
}

TEST_F(CheckpointTest, MissingLatestAndBadLatest) {
  auto none = LatestCheckpoint(TempDir());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  std::ofstream(dir_ + "/latest") << "step-99999999\n";
  auto bad = LatestCheckpoint(dir_);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(bad.status(), "step-99999999")) << bad.status().ToString();
}

TEST_F(CheckpointTest, MissingFiles) {
  fs::remove(step_dir_ + "/optimizer.safetensors");
  Status s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s, "optimizer.safetensors")) << s.ToString();
  fs::remove(step_dir_ + "/model.safetensors");
  s = LoadFresh();
  EXPECT_TRUE(Contains(s, "model.safetensors")) << s.ToString();
  EXPECT_FALSE(LoadCheckpoint(dir_ + "/nope", Cfg(), &ps_, nullptr, nullptr).ok());
}

TEST_F(CheckpointTest, TruncatedSafetensorsNamesFile) {
  const std::string p = step_dir_ + "/model.safetensors";
  fs::resize_file(p, fs::file_size(p) - 9);
  Status s = LoadFresh();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, p)) << s.ToString();
}

TEST_F(CheckpointTest, GarbageSafetensorsNamesFile) {
  const std::string p = step_dir_ + "/optimizer.safetensors";
  std::ofstream(p, std::ios::trunc) << "this is not a safetensors file at all";
  Status s = LoadFresh();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, p)) << s.ToString();
}

TEST_F(CheckpointTest, UnknownTensorNamed) {
  std::vector<TensorView> views;
  float extra[2] = {1, 2};
  for (int i = 0; i < ps_.size(); ++i) views.push_back({ps_.info(i).name, ps_.info(i).shape, ps_.value(i)});
  views.push_back({"bogus.weight", {2}, extra});
  ASSERT_TRUE(WriteSafetensors(step_dir_ + "/model.safetensors", views).ok());
  Status s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "unknown tensor 'bogus.weight'")) << s.ToString();
  EXPECT_TRUE(Contains(s, "model.safetensors")) << s.ToString();
}

TEST_F(CheckpointTest, WrongShapeNamesExpectedAndGot) {
  std::vector<TensorView> views;
  for (int i = 0; i < ps_.size(); ++i) {
    std::vector<int64_t> shape = ps_.info(i).shape;
    if (ps_.info(i).name == "detector.weight") shape = {2, 2};
    views.push_back({ps_.info(i).name, shape, ps_.value(i)});
  }
  ASSERT_TRUE(WriteSafetensors(step_dir_ + "/model.safetensors", views).ok());
  Status s = LoadFresh();
  EXPECT_TRUE(Contains(s, "'detector.weight'")) << s.ToString();
  EXPECT_TRUE(Contains(s, "expected [4], got [2, 2]")) << s.ToString();
}

TEST_F(CheckpointTest, MissingTensorNamed) {
  std::vector<TensorView> views;
  for (int i = 0; i < ps_.size() - 1; ++i) {
    views.push_back({ps_.info(i).name, ps_.info(i).shape, ps_.value(i)});
  }
  ASSERT_TRUE(WriteSafetensors(step_dir_ + "/model.safetensors", views).ok());
  Status s = LoadFresh();
  EXPECT_TRUE(Contains(s, "missing tensor 'detector.weight'")) << s.ToString();
}

TEST_F(CheckpointTest, ConfigMismatchNamesField) {
  ParamStore ps;
  Declare(&ps);
  ModelConfig other = Cfg();
  other.layers = 3;
  Status s = LoadCheckpoint(step_dir_, other, &ps, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "layers=12")) << s.ToString();
  EXPECT_TRUE(Contains(s, "layers=3")) << s.ToString();
  EXPECT_TRUE(Contains(s, "state.json")) << s.ToString();
}

TEST_F(CheckpointTest, BadStateJson) {
  std::ofstream(step_dir_ + "/state.json", std::ios::trunc) << "{\"step\": 1,";
  Status s = LoadFresh();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "state.json")) << s.ToString();
  std::ofstream(step_dir_ + "/state.json", std::ios::trunc) << "{\"step\": \"x\"}";
  s = LoadFresh();
  EXPECT_TRUE(Contains(s, "'step'")) << s.ToString();
}

TEST_F(CheckpointTest, UnwritableDirIsAnError) {
  // A path below a regular file can never be created.
  const std::string file = dir_ + "/plainfile";
  std::ofstream(file) << "x";
  auto r = SaveCheckpoint(file + "/ckpt", ps_, adam_.get(), Cfg(), state_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), file + "/ckpt")) << r.status().ToString();
}

// Each file of a checkpoint mutated at random (testutil::MutateBytes):
// loading gives either a state that keeps its invariants or an error naming
// the file, and after an error the parameters are untouched (everything is
// validated before anything is copied). Run under tools/sanitize.sh too.
TEST_F(CheckpointTest, MutatedFilesAreRefusedBeforeAnythingIsCopied) {
  std::mt19937_64 rng(7);
  for (const std::string file : {"state.json", "model.safetensors", "optimizer.safetensors"}) {
    const std::string path = step_dir_ + "/" + file;
    const std::string original = testutil::ReadFile(path);
    ASSERT_FALSE(original.empty()) << path;
    int accepted = 0;
    constexpr int kMutations = 400;
    for (int i = 0; i < kMutations; ++i) {
      testutil::WriteFile(path, testutil::MutateBytes(original, &rng));
      ParamStore ps;
      Declare(&ps);
      for (int64_t k = 0; k < ps.total_numel(); ++k) ps.values()[k] = 42.0f;
      AdamW adam(&ps, AdamWOptions{});
      CheckpointState st;
      const Status s = LoadCheckpoint(step_dir_, Cfg(), &ps, &adam, &st);
      SCOPED_TRACE(file + " mutation " + std::to_string(i));
      if (s.ok()) {
        ++accepted;
        EXPECT_GE(st.step, 0);
        EXPECT_GE(st.loader_step, 0);
        EXPECT_TRUE(st.loss_scale == 0 || (std::isfinite(st.loss_scale) && st.loss_scale > 0));
        continue;
      }
      EXPECT_TRUE(Contains(s, file)) << s.ToString();
      for (int64_t k = 0; k < ps.total_numel(); ++k) ASSERT_EQ(ps.values()[k], 42.0f) << k;
      for (float m : adam.m()) ASSERT_EQ(m, 0.0f);  // fresh moments, untouched
      for (float v : adam.v()) ASSERT_EQ(v, 0.0f);
      EXPECT_EQ(adam.step(), 0);
      if (HasFailure()) break;
    }
    testutil::WriteFile(path, original);
    EXPECT_GT(accepted, 0) << file;  // a flipped weight bit still loads
    EXPECT_LT(accepted, kMutations) << file;
  }
  EXPECT_TRUE(LoadFresh().ok());
}

// fp16 runs keep their dynamic loss scale; other runs write none.
TEST_F(CheckpointTest, LossScaleRoundTripsAndIsValidated) {
  {
    ParamStore ps;
    Declare(&ps);
    CheckpointState st;
    ASSERT_TRUE(LoadCheckpoint(step_dir_, Cfg(), &ps, nullptr, &st).ok());
    EXPECT_EQ(st.loss_scale, 0.0);  // written without one
  }
  state_.step = 3;
  state_.loss_scale = 3.0517578125e-05;  // 2^-15: not a round decimal
  state_.loss_scale_tracker = 1999;
  auto d = SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ParamStore ps;
  Declare(&ps);
  CheckpointState st;
  ASSERT_TRUE(LoadCheckpoint(*d, Cfg(), &ps, nullptr, &st).ok());
  EXPECT_EQ(st.loss_scale, 3.0517578125e-05);
  EXPECT_EQ(st.loss_scale_tracker, 1999);

  std::ofstream(*d + "/state.json", std::ios::trunc)
      << "{\"step\": 3, \"loader_step\": 3, \"seed\": \"1\", \"rng_state\": \"0\", \"adam_step\": 2, "
         "\"loss_scale\": -4, \"loss_scale_tracker\": 0, \"config\": {}}";
  Status s = LoadCheckpoint(*d, Cfg(), &ps, nullptr, &st);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, "'loss_scale'")) << s.ToString();
}

// CUDA runs write the attention kernels they ran; ReadCheckpointState reads
// the state alone (before a resumed run builds its device), validated.
TEST_F(CheckpointTest, AttentionKernelsRoundTripAndAreValidated) {
  auto none = ReadCheckpointState(step_dir_);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->attention_kernels, "");  // written without them (a CPU run)
  EXPECT_EQ(none->step, state_.step);
  state_.step = 4;
  state_.attention_kernels = "gemm";
  auto d = SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto read = ReadCheckpointState(*d);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->attention_kernels, "gemm");
  EXPECT_EQ(read->step, 4);
  ParamStore ps;
  Declare(&ps);
  CheckpointState st;
  ASSERT_TRUE(LoadCheckpoint(*d, Cfg(), &ps, nullptr, &st).ok());
  EXPECT_EQ(st.attention_kernels, "gemm");

  std::ofstream(*d + "/state.json", std::ios::trunc)
      << "{\"step\": 4, \"loader_step\": 4, \"seed\": \"1\", \"rng_state\": \"0\", \"adam_step\": 4, "
         "\"attention\": \"flash\", \"config\": {}}";
  for (const Status& s : {ReadCheckpointState(*d).status(), LoadCheckpoint(*d, Cfg(), &ps, nullptr, &st)}) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_TRUE(Contains(s, "state.json: field 'attention' must be \"fused\" or \"gemm\"")) << s.ToString();
  }
  const Status missing = ReadCheckpointState(dir_ + "/step-99999999").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_TRUE(Contains(missing, "step-99999999: not a directory")) << missing.ToString();
}

TEST(HfInitTest, LoadsMatchingIgnoresExtrasReportsRest) {
  const std::string dir = TempDir();
  ParamStore ps;
  Declare(&ps);
  std::vector<float> emb(40, 1.5f), ln(4, 2.0f), bias(10, 3.0f), pos(512, 0), pool(16, 0),
      dec(40, 9.0f), extra(3, 0);
  std::vector<TensorView> views = {
      {"bert.embeddings.word_embeddings.weight", {10, 4}, emb.data()},
      {"bert.encoder.layer.0.output.LayerNorm.weight", {4}, ln.data()},
      {"cls.predictions.bias", {10}, bias.data()},
      {"cls.predictions.decoder.weight", {10, 4}, dec.data()},
      {"cls.predictions.decoder.bias", {10}, bias.data()},
      {"bert.embeddings.position_ids", {1, 512}, pos.data()},
      {"bert.pooler.dense.weight", {4, 4}, pool.data()},
      {"something.else", {3}, extra.data()},
  };
  const std::string path = dir + "/hf.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, views).ok());
  auto r = LoadHfInit(path, &ps);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->loaded, 3);
  EXPECT_EQ(r->missing, std::vector<std::string>{"detector.weight"});
  EXPECT_EQ(r->unexpected, std::vector<std::string>{"something.else"});
  EXPECT_EQ(r->ignored.size(), 4u);
  EXPECT_EQ(ps.value(0)[5], 1.5f);
  EXPECT_EQ(ps.value(1)[0], 2.0f);
  EXPECT_EQ(ps.value(2)[9], 3.0f);
  EXPECT_NE(r->Summary().find("loaded 3"), std::string::npos);
}

TEST(HfInitTest, ShapeMismatchIsAnErrorAndCopiesNothing) {
  const std::string dir = TempDir();
  ParamStore ps;
  Declare(&ps);
  std::vector<float> emb(21128 * 4, 1.0f), ln(4, 2.0f);
  std::vector<TensorView> views = {
      {"bert.encoder.layer.0.output.LayerNorm.weight", {4}, ln.data()},
      {"bert.embeddings.word_embeddings.weight", {21128, 4}, emb.data()},
  };
  const std::string path = dir + "/hf.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, views).ok());
  auto r = LoadHfInit(path, &ps);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "[21128, 4]")) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "[10, 4]")) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "vocabulary")) << r.status().ToString();
  EXPECT_EQ(ps.value(1)[0], 0.0f);  // nothing copied
}

TEST(HfInitTest, MissingFileNamed) {
  ParamStore ps;
  Declare(&ps);
  auto r = LoadHfInit("/nonexistent/x.safetensors", &ps);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "/nonexistent/x.safetensors"));
}

}  // namespace
}  // namespace dgca
