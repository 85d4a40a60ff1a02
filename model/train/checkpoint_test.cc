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

// `n` bytes of `path` from `offset` overwritten with `byte`.
void Overwrite(const std::string& path, int64_t offset, int n, char byte) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(offset);
  f << std::string(n, byte);
}

// state.json as written before the file checksums: its "files" line removed.
void StripFileDigests(const std::string& step_dir) {
  const std::string path = step_dir + "/state.json";
  std::string text = testutil::ReadFile(path);
  const size_t at = text.find("  \"files\": ");
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, text.find('\n', at) + 1 - at);
  testutil::WriteFile(path, text);
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

// A checkpoint directory whose `latest` is gone but whose step directories
// are there is not a fresh start (that trained from random weights and then
// replaced `latest`): an error naming the directory, the steps and the way on.
TEST_F(CheckpointTest, MissingLatestWithStepDirectoriesIsAnError) {
  state_.step = 10;
  ASSERT_TRUE(SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_).ok());
  fs::remove(dir_ + "/latest");
  fs::create_directories(dir_ + "/.step-00000011.tmp.123");  // an unfinished save: not listed
  fs::create_directories(dir_ + "/step-notastep");
  auto r = LatestCheckpoint(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "checkpoint directory " + dir_ + " has no 'latest' file"))
      << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "(step-00000002, step-00000010)")) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "echo step-00000010 > " + dir_ + "/latest"))
      << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "empty checkpoint directory")) << r.status().ToString();
  // Only things that are not step directories: still a fresh start.
  const std::string other = TempDir();
  fs::create_directories(other + "/step-notastep");
  testutil::WriteFile(other + "/vocab.txt", "[PAD]\n");
  testutil::WriteFile(other + "/step-00000003", "a file, not a directory");
  EXPECT_EQ(LatestCheckpoint(other).status().code(), StatusCode::kNotFound);
}

// `latest` and state.json are read up to a limit, never to the end of
// whatever they are (a symlink to /dev/zero ended in std::bad_alloc).
TEST_F(CheckpointTest, OversizeLatestAndStateAreErrors) {
  testutil::WriteFile(dir_ + "/latest", std::string(5000, 's'));
  auto r = LatestCheckpoint(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), dir_ + "/latest: longer than the limit of 4096 bytes"))
      << r.status().ToString();
  testutil::WriteFile(step_dir_ + "/state.json", "{" + std::string(2 << 20, ' ') + "}");
  Status s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, step_dir_ + "/state.json: longer than the limit of 1048576 bytes"))
      << s.ToString();
}

// 64 bytes of the weights overwritten with 0xff (NaN floats), as a disk or
// copy error would: refused by the CRC-32 that state.json records.
TEST_F(CheckpointTest, CorruptedWeightsAreRefusedByTheirChecksum) {
  const std::string p = step_dir_ + "/model.safetensors";
  const std::string state = testutil::ReadFile(step_dir_ + "/state.json");
  EXPECT_NE(state.find("\"model.safetensors\": {\"bytes\": " + std::to_string(fs::file_size(p)) +
                       ", \"crc32\": \""),
            std::string::npos) << state;
  Overwrite(p, static_cast<int64_t>(fs::file_size(p)) / 2, 64, '\xff');
  ParamStore ps;
  Declare(&ps);
  AdamW adam(&ps, AdamWOptions{});
  CheckpointState st;
  Status s = LoadCheckpoint(step_dir_, Cfg(), &ps, &adam, &st);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, p + ": corrupted")) << s.ToString();
  EXPECT_TRUE(Contains(s, "CRC-32")) << s.ToString();
  EXPECT_TRUE(Contains(s, step_dir_ + "/state.json records")) << s.ToString();
  for (int64_t k = 0; k < ps.total_numel(); ++k) ASSERT_EQ(ps.values()[k], 0.0f) << k;
  // The optimizer file too: one flipped bit of a moment.
  ASSERT_TRUE(SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_).ok());
  ASSERT_TRUE(LoadFresh().ok());
  const std::string o = step_dir_ + "/optimizer.safetensors";
  std::string bytes = testutil::ReadFile(o);
  bytes[bytes.size() - 5] ^= 0x01;
  testutil::WriteFile(o, bytes);
  s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, o + ": corrupted")) << s.ToString();
}

// The CRC-32 is zlib's (IEEE): the recorded value can be checked with any
// tool (python3 -c 'import zlib; print(hex(zlib.crc32(open(F,"rb").read())))').
TEST_F(CheckpointTest, RecordedChecksumIsZlibCrc32) {
  // Known value: CRC-32 of "123456789" is cbf43926.
  const std::string dir = TempDir();
  ParamStore ps;
  Declare(&ps);
  auto d = SaveCheckpoint(dir, ps, nullptr, Cfg(), state_);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  // Replace the weights file by "123456789" and record it by hand: loading
  // then fails in the safetensors reader, not in the checksum.
  testutil::WriteFile(*d + "/model.safetensors", "123456789");
  std::string js = testutil::ReadFile(*d + "/state.json");
  const size_t at = js.find("  \"files\": ");
  ASSERT_NE(at, std::string::npos);
  js.replace(at, js.find('\n', at) - at,
             "  \"files\": {\"model.safetensors\": {\"bytes\": 9, \"crc32\": \"cbf43926\"}},");
  testutil::WriteFile(*d + "/state.json", js);
  Status s = LoadCheckpoint(*d, Cfg(), &ps, nullptr, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(Contains(s, "CRC-32")) << s.ToString();
  EXPECT_TRUE(Contains(s, *d + "/model.safetensors")) << s.ToString();
}

// Without recorded checksums (a checkpoint from before them), weights and
// moments that are not finite are still refused, naming the file, the tensor
// and the first bad element; such a checkpoint otherwise loads.
TEST_F(CheckpointTest, NonFiniteValuesAreRefusedWithoutChecksums) {
  StripFileDigests(step_dir_);
  ASSERT_TRUE(LoadFresh().ok()) << LoadFresh().ToString();  // backward compatible
  const std::string p = step_dir_ + "/model.safetensors";
  // The data section ends the file; its last tensor (names sorted) is
  // detector.weight [4]: elements 1 and 2 become 0xffffffff (NaN).
  Overwrite(p, static_cast<int64_t>(fs::file_size(p)) - 12, 8, '\xff');
  Status s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, p + ": tensor 'detector.weight' (shape [4]) element 1 (flat index) is NaN"))
      << s.ToString();
  EXPECT_TRUE(Contains(s, "not finite")) << s.ToString();
  // Infinite first moment, negative second moment.
  std::vector<TensorView> views;
  std::vector<std::vector<float>> keep;
  keep.reserve(2 * ps_.size());  // the views point into it
  for (int i = 0; i < ps_.size(); ++i) {
    const ParamInfo& info = ps_.info(i);
    keep.emplace_back(adam_->m().data() + info.offset, adam_->m().data() + info.offset + info.numel);
    if (info.name == "cls.predictions.bias") keep.back()[3] = INFINITY;
    views.push_back({"m." + info.name, info.shape, keep.back().data()});
    keep.emplace_back(adam_->v().data() + info.offset, adam_->v().data() + info.offset + info.numel);
    views.push_back({"v." + info.name, info.shape, keep.back().data()});
  }
  ASSERT_TRUE(SaveCheckpoint(dir_, ps_, adam_.get(), Cfg(), state_).ok());  // good weights again
  StripFileDigests(step_dir_);
  const std::string o = step_dir_ + "/optimizer.safetensors";
  ASSERT_TRUE(WriteSafetensors(o, views).ok());
  s = LoadFresh();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(Contains(s, o + ": tensor 'm.cls.predictions.bias' (shape [10]) element 3 (flat index) is +inf"))
      << s.ToString();
  for (int i = 0; i < ps_.size(); ++i) {  // keep[2i] is m, keep[2i+1] v of parameter i
    if (ps_.info(i).name == "cls.predictions.bias") keep[2 * i][3] = 0.5f;
    if (ps_.info(i).name == "detector.weight") keep[2 * i + 1][2] = -1.0f;
  }
  ASSERT_TRUE(WriteSafetensors(o, views).ok());
  s = LoadFresh();
  EXPECT_TRUE(Contains(s, o + ": tensor 'v.detector.weight' (shape [4]) element 2 (flat index) is -1 "
                          "(an Adam second moment must be >= 0)"))
      << s.ToString();
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
  StripFileDigests(step_dir_);  // the tensor checks, not the file's checksum
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
  StripFileDigests(step_dir_);  // the tensor checks, not the file's checksum
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
  StripFileDigests(step_dir_);  // the tensor checks, not the file's checksum
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
// With the files' checksums in state.json (as written now), every changed
// byte of a data file is refused; without them (older checkpoints) the
// readers' and the finiteness checks alone stand, and a flipped weight bit
// that stays finite loads.
class MutatedCheckpointTest : public CheckpointTest, public ::testing::WithParamInterface<bool> {};

TEST_P(MutatedCheckpointTest, MutatedFilesAreRefusedBeforeAnythingIsCopied) {
  const bool digests = GetParam();
  if (!digests) StripFileDigests(step_dir_);
  std::mt19937_64 rng(7);
  for (const std::string file : {"state.json", "model.safetensors", "optimizer.safetensors"}) {
    const std::string path = step_dir_ + "/" + file;
    const std::string original = testutil::ReadFile(path);
    ASSERT_FALSE(original.empty()) << path;
    int accepted = 0;
    constexpr int kMutations = 400;
    for (int i = 0; i < kMutations; ++i) {
      const std::string mutated = testutil::MutateBytes(original, &rng);
      testutil::WriteFile(path, mutated);
      ParamStore ps;
      Declare(&ps);
      for (int64_t k = 0; k < ps.total_numel(); ++k) ps.values()[k] = 42.0f;
      AdamW adam(&ps, AdamWOptions{});
      CheckpointState st;
      const Status s = LoadCheckpoint(step_dir_, Cfg(), &ps, &adam, &st);
      SCOPED_TRACE(file + " mutation " + std::to_string(i));
      if (s.ok()) {
        ++accepted;
        if (digests && file != "state.json") EXPECT_EQ(mutated, original) << "a changed " << file << " loaded";
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
    if (!digests || file == "state.json") EXPECT_GT(accepted, 0) << file;  // a flipped weight bit still loads
    EXPECT_LT(accepted, kMutations) << file;
  }
  EXPECT_TRUE(LoadFresh().ok());
}

INSTANTIATE_TEST_SUITE_P(Digests, MutatedCheckpointTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "WithChecksums" : "WithoutChecksums");
                         });

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
