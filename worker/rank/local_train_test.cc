// `dgca-worker train SPEC --json`: one process, the real trainer, one JSON
// document on stdout.
#include "worker/rank/local_train.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "model/core/json.h"

namespace dgca {
namespace {

std::string Data() {
  const char* d = std::getenv("DGCA_SHARED_DATA");
  return d ? d : "../shared/data";
}

std::string WriteSpec(const std::string& text) {
  char tmpl[] = "/tmp/local_train_test.XXXXXX";
  int fd = mkstemp(tmpl);
  close(fd);
  std::ofstream(tmpl) << text;
  return tmpl;
}

TEST(LocalTrainTest, JsonDocumentHasResultsAndEveryEvalMetric) {
  std::string json = TrainResultJson(1.5, 7, 12.25, 3.0, {{"a_f1", 0.5}, {"b", 2}});
  auto v = ParseJson(json, "json");
  ASSERT_TRUE(v.ok()) << v.status().ToString() << json;
  EXPECT_DOUBLE_EQ(v->Find("final_loss")->number, 1.5);
  EXPECT_EQ(v->Find("steps")->integer, 7);
  EXPECT_DOUBLE_EQ(v->Find("samples_per_second")->number, 12.25);
  EXPECT_DOUBLE_EQ(v->Find("eval")->Find("a_f1")->number, 0.5);
  EXPECT_DOUBLE_EQ(v->Find("eval")->Find("b")->number, 2);
  // Non-finite numbers become null (JSON has no NaN).
  auto nan = ParseJson(TrainResultJson(0.0 / 0.0, 1, 1, 1, {}), "json");
  ASSERT_TRUE(nan.ok());
  EXPECT_EQ(nan->Find("final_loss")->type, JsonValue::Type::kNull);
}

TEST(LocalTrainTest, TrainsTinySpecAndPrintsOneJsonDocument) {
  if (access((Data() + "/ecspell/train_law.txt").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "no ECSpell data under " << Data();
  }
  std::string spec = WriteSpec("name: local\nmodel: {preset: tiny}\n"
                               "data: {train: " + Data() + "/ecspell/train_law.txt, eval: " +
                               Data() + "/ecspell/test_law.txt, max_seq_len: 24}\n"
                               "train: {steps: 3, global_batch: 4, eval_every: 0}\n"
                               "resources: {threads_per_rank: 1}\n");
  LocalTrainArgs a;
  a.spec_path = spec;
  a.json = true;
  testing::internal::CaptureStdout();
  int rc = RunLocalTrain(a);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  auto v = ParseJson(out, "stdout");
  ASSERT_TRUE(v.ok()) << v.status().ToString() << "\n" << out;
  EXPECT_EQ(v->Find("steps")->integer, 3);
  EXPECT_GT(v->Find("final_loss")->number, 0);
  EXPECT_GT(v->Find("samples_per_second")->number, 0);
  const JsonValue* eval = v->Find("eval");
  ASSERT_NE(eval, nullptr);
  EXPECT_NE(eval->Find("sentence_correction_f1"), nullptr) << out;
  EXPECT_NE(eval->Find("char_detection_f1"), nullptr) << out;
  std::remove(spec.c_str());
}

TEST(LocalTrainTest, InvalidSpecExits2) {
  std::string spec = WriteSpec("train: {steps: -5}\nmodel: {colour: red}\n");
  LocalTrainArgs a;
  a.spec_path = spec;
  testing::internal::CaptureStderr();
  int rc = RunLocalTrain(a);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find(spec + ":1:16: train.steps"), std::string::npos) << err;
  EXPECT_NE(err.find(spec + ":2:9: model.colour"), std::string::npos) << err;
  std::remove(spec.c_str());
  a.spec_path = "/nonexistent.yaml";
  EXPECT_EQ(RunLocalTrain(a), 2);
}

TEST(LocalTrainTest, MissingDataFails1) {
  std::string spec = WriteSpec("model: {preset: tiny}\ndata: {train: /nonexistent/train.txt}\n"
                               "train: {steps: 2, global_batch: 2}\n");
  LocalTrainArgs a;
  a.spec_path = spec;
  testing::internal::CaptureStderr();
  int rc = RunLocalTrain(a);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("/nonexistent/train.txt"), std::string::npos) << err;
  std::remove(spec.c_str());
}

}  // namespace
}  // namespace dgca
