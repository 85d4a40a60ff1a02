#include "model/core/config.h"

#include <set>

#include <gtest/gtest.h>

namespace dgca {
namespace {

TEST(ConfigTest, Presets) {
  ModelConfig base;
  base.vocab_size = 5000;
  base.prompt_length = 2;
  auto tiny = ApplyPreset("tiny", base);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->layers, 2);
  EXPECT_EQ(tiny->hidden, 128);
  EXPECT_EQ(tiny->heads, 2);
  EXPECT_EQ(tiny->ffn, 512);
  EXPECT_EQ(tiny->vocab_size, 5000);
  EXPECT_EQ(tiny->prompt_length, 2);
  auto small = ApplyPreset("small", base);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->layers, 4);
  EXPECT_EQ(small->hidden, 256);
  EXPECT_EQ(small->heads, 4);
  EXPECT_EQ(small->ffn, 1024);
  auto bb = ApplyPreset("bert-base", base);
  ASSERT_TRUE(bb.ok());
  EXPECT_EQ(bb->layers, 12);
  EXPECT_EQ(bb->hidden, 768);
  EXPECT_EQ(bb->heads, 12);
  EXPECT_EQ(bb->ffn, 3072);
  auto bad = ApplyPreset("huge", base);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("huge"), std::string::npos);
  EXPECT_NE(bad.status().message().find("tiny, small, bert-base"), std::string::npos);
}

TEST(ConfigTest, BertBaseCountMatchesHuggingFace) {
  ModelConfig cfg;  // defaults are bert-base-chinese
  cfg.detector = false;
  cfg.candidate = false;
  cfg.fusion = FusionKind::kNone;
  cfg.prompt_length = 0;
  // BertForMaskedLM(bert-base-chinese) has 102,290,312 parameters.
  EXPECT_EQ(CountParameters(cfg), 102290312);
}

TEST(ConfigTest, FullModelCount) {
  ModelConfig cfg;
  // Hand-computed in config.cc's comment.
  EXPECT_EQ(CountParameters(cfg), 128277131);
  cfg.prompt_encoder = PromptEncoderKind::kMlp;
  const int64_t H = 768;
  EXPECT_EQ(CountParameters(cfg), 102290312 + 6 * H + 2 * (H * H + H) + 769 + 592128 + 770);
  cfg.prompt_encoder = PromptEncoderKind::kNone;
  EXPECT_EQ(CountParameters(cfg), 102290312 + 769 + 592128 + 770);  // none: no prompt parameters
}

TEST(ConfigTest, TinyLstmCountByFormula) {
  ModelConfig cfg = ApplyPreset("tiny", ModelConfig()).value();
  cfg.vocab_size = 1000;
  const int64_t H = 128, F = 512, V = 1000, M = 512, P = 3;
  const int64_t bert = V * H + M * H + 2 * H + 2 * H +
                       2 * (4 * (H * H + H) + 2 * H + (F * H + F) + (H * F + H) + 2 * H) +
                       (H * H + H) + 2 * H + V;
  const int64_t lstm = 2 * (2 * 4 * H * H + 8 * H) + 2 * (4 * H * 2 * H + 4 * H * H + 8 * H);
  const int64_t prompt = 2 * P * H + lstm + (2 * H * H + H) + (H * H + H);
  const int64_t heads = (H + 1) + (H * H + H + 2 * H) + (H + 2);
  EXPECT_EQ(CountParameters(cfg), bert + prompt + heads);
}

TEST(ConfigTest, AttentionKernelsRoundTripAndBadNamesSayWhatIsValid) {
  for (AttentionKernels a : {AttentionKernels::kAuto, AttentionKernels::kFused, AttentionKernels::kGemm}) {
    auto back = ParseAttentionKernels(AttentionKernelsName(a), "--attention");
    ASSERT_TRUE(back.ok()) << AttentionKernelsName(a);
    EXPECT_EQ(*back, a);
  }
  auto bad = ParseAttentionKernels("flash", "train.attention");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "train.attention: 'flash' is not one of auto, fused, gemm");
  EXPECT_FALSE(ParseAttentionKernels("Fused", "x").ok());  // exact names; callers lower-case specs
}

TEST(ConfigTest, PrecisionRoundTripAliasesAndBadNamesSayWhatIsValid) {
  for (Precision p : {Precision::kFp32, Precision::kFp16, Precision::kBf16}) {
    auto back = ParsePrecision(PrecisionName(p), "--precision");
    ASSERT_TRUE(back.ok()) << PrecisionName(p);
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(ParsePrecision("bfloat16", "x").value(), Precision::kBf16);
  EXPECT_EQ(ParsePrecision("half", "x").value(), Precision::kFp16);
  EXPECT_EQ(ParsePrecision("float", "x").value(), Precision::kFp32);
  auto bad = ParsePrecision("fp8", "train.precision");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "train.precision: 'fp8' is not one of fp32, bf16, fp16");
}

TEST(ConfigTest, ListHasUniqueNamesAndSums) {
  ModelConfig cfg = ApplyPreset("small", ModelConfig()).value();
  auto list = ListParameters(cfg);
  std::set<std::string> names;
  int64_t sum = 0;
  for (const auto& p : list) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    sum += p.numel();
  }
  EXPECT_EQ(sum, CountParameters(cfg));
  EXPECT_TRUE(names.count("bert.encoder.layer.3.output.LayerNorm.bias"));
  EXPECT_FALSE(names.count("bert.encoder.layer.4.output.LayerNorm.bias"));
  EXPECT_TRUE(names.count("prompt.lstm.weight_ih_l1_reverse"));
  EXPECT_FALSE(names.count("cls.predictions.decoder.weight"));
}

}  // namespace
}  // namespace dgca
