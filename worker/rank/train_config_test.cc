#include "worker/rank/train_config.h"

#include <gtest/gtest.h>

#include "spec/spec.h"

namespace dgca {
namespace {

v1::JobSpec Parse(const std::string& yaml) {
  auto r = ParseJobSpec(yaml, "t.yaml");
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r->ok()) << FormatProblems(r->problems);
  return r->spec;
}

TEST(TrainConfigTest, SpecAndPlanMapToTrainConfig) {
  v1::JobSpec spec = Parse(R"(
name: t
model:
  preset: tiny
  vocab: vocab.txt
  prompt: {length: 2, encoder: mlp}
  heads: {detector: false, candidate: {top_k: 4, confusion: conf/c.json}, fusion: none}
data:
  train: data/train.txt
  eval: /abs/test.txt
  max_seq_len: 48
  mft: {mode: none, rate: 0.1}
train:
  steps: 30
  global_batch: 16
  optimizer: {lr: 1.0e-3, weight_decay: 0.01, warmup_steps: 3, clip_norm: 1.0, schedule: constant}
  eval_every: 10
  checkpoint_every: 15
  seed: 7
comm: {overlap: false, timeout_s: 12}
)");
  spec.set_base_dir("/base");
  v1::Plan plan;
  plan.set_ranks(2);
  plan.set_micro_batch(4);
  plan.set_accumulation(2);
  plan.set_precision("fp32");
  plan.set_bucket_mb(5);
  plan.set_threads_per_rank(3);
  plan.set_loader_threads(2);
  auto c = TrainConfigFromSpec(spec, plan);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.layers, 2);
  EXPECT_EQ(c->model.hidden, 128);
  EXPECT_EQ(c->model.prompt_length, 2);
  EXPECT_EQ(c->model.prompt_encoder, PromptEncoderKind::kMlp);
  EXPECT_FALSE(c->model.detector);
  EXPECT_EQ(c->model.candidate_top_k, 4);
  EXPECT_EQ(c->model.fusion, FusionKind::kNone);
  EXPECT_EQ(c->train_path, "/base/data/train.txt");
  EXPECT_EQ(c->eval_path, "/abs/test.txt");
  EXPECT_EQ(c->vocab_path, "/base/vocab.txt");
  EXPECT_EQ(c->confusion_path, "/base/conf/c.json");
  EXPECT_EQ(c->init_from, "");
  EXPECT_EQ(c->max_seq_len, 48);
  EXPECT_EQ(c->mft_mode, MftMode::kNone);
  EXPECT_FLOAT_EQ(c->mft_rate, 0.1f);
  EXPECT_EQ(c->steps, 30);
  EXPECT_EQ(c->micro_batch, 4);
  EXPECT_EQ(c->accumulation, 2);
  EXPECT_EQ(c->precision, Precision::kFp32);
  EXPECT_FLOAT_EQ(c->lr, 1e-3f);
  EXPECT_FLOAT_EQ(c->weight_decay, 0.01f);
  EXPECT_EQ(c->warmup_steps, 3);
  EXPECT_FLOAT_EQ(c->clip_norm, 1.0f);
  EXPECT_EQ(c->schedule, LrSchedule::kConstant);
  EXPECT_EQ(c->eval_every, 10);
  EXPECT_EQ(c->checkpoint_every, 15);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->threads, 3);
  EXPECT_EQ(c->loader_threads, 2);
  EXPECT_DOUBLE_EQ(c->bucket_mb, 5);
  EXPECT_FALSE(c->overlap);
  EXPECT_DOUBLE_EQ(c->comm_timeout_s, 12);
}

TEST(TrainConfigTest, ExplicitSizesOverridePreset) {
  v1::JobSpec spec = Parse("model: {preset: tiny, layers: 3, hidden: 64, heads: 4, ffn: 96}\n"
                           "data: {train: x.txt}\n");
  auto c = TrainConfigFromSpec(spec, SimplePlan(spec, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.layers, 3);
  EXPECT_EQ(c->model.hidden, 64);
  EXPECT_EQ(c->model.heads, 4);
  EXPECT_EQ(c->model.ffn, 96);
  EXPECT_EQ(c->train_path, "x.txt");  // no base_dir: as written
}

TEST(TrainConfigTest, SimplePlanSplitsGlobalBatch) {
  v1::JobSpec spec = Parse("data: {train: x.txt}\ntrain: {global_batch: 32}\n");
  v1::Plan p = SimplePlan(spec, 2);
  EXPECT_EQ(p.ranks(), 2);
  EXPECT_EQ(p.accumulation(), 1);
  EXPECT_EQ(p.micro_batch(), 16);
  EXPECT_EQ(p.precision(), "fp32");
  EXPECT_EQ(p.backend(), "gloo");
  EXPECT_FALSE(p.decisions().empty());
  for (const auto& d : p.decisions()) EXPECT_FALSE(d.reason().empty()) << d.name();
  auto c = TrainConfigFromSpec(spec, p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->micro_batch * c->accumulation * 2, 32);
}

TEST(TrainConfigTest, ErrorsNameTheField) {
  v1::JobSpec spec = Parse("data: {train: x.txt}\n");
  spec.mutable_model()->set_preset("huge");
  auto c = TrainConfigFromSpec(spec, SimplePlan(spec, 1));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("model.preset"), std::string::npos);

  v1::JobSpec no_data = Parse("name: x\n");
  auto d = TrainConfigFromSpec(no_data, SimplePlan(no_data, 1));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("data.train"), std::string::npos);

  v1::JobSpec prec = Parse("data: {train: x.txt}\n");
  v1::Plan p = SimplePlan(prec, 1);
  p.set_precision("fp8");
  auto e = TrainConfigFromSpec(prec, p);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("precision"), std::string::npos);
}

TEST(TrainConfigTest, AttentionFromPlanThenSpec) {
  v1::JobSpec spec = Parse("data: {train: x.txt}\n");
  v1::Plan p = SimplePlan(spec, 1);
  auto c = TrainConfigFromSpec(spec, p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->attention, dgca::AttentionKernels::kAuto);  // the spec's default
  p.set_attention("gemm");           // the planner's choice for CUDA ranks
  c = TrainConfigFromSpec(spec, p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->attention, dgca::AttentionKernels::kGemm);
  p.set_attention("fused");  // the planner's: the GEMM version would not fit
  c = TrainConfigFromSpec(spec, p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->attention, dgca::AttentionKernels::kFused);
  v1::JobSpec asked = Parse("data: {train: x.txt}\ntrain: {attention: gemm}\n");
  c = TrainConfigFromSpec(asked, SimplePlan(asked, 1));  // no planner: the spec's
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->attention, dgca::AttentionKernels::kGemm);
  p.set_attention("flash");
  auto e = TrainConfigFromSpec(spec, p);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("train.attention"), std::string::npos);
}

TEST(TrainConfigTest, Dropout) {
  const std::string data = "data:\n  train: t.txt\ntrain: {steps: 1}\n";
  // No model.dropout: HF's 0.1 each.
  auto d = TrainConfigFromSpec(Parse("model: {preset: tiny}\n" + data), v1::Plan());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->model.hidden_dropout, 0.1f);
  EXPECT_FLOAT_EQ(d->model.attention_dropout, 0.1f);
  // Explicit 0 turns it off (not "unset").
  auto z = TrainConfigFromSpec(
      Parse("model: {preset: tiny, dropout: {hidden: 0, attention: 0}}\n" + data), v1::Plan());
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->model.hidden_dropout, 0.0f);
  EXPECT_EQ(z->model.attention_dropout, 0.0f);
  auto e = TrainConfigFromSpec(
      Parse("model: {preset: tiny, dropout: {hidden: 0.25, attention: 0}}\n" + data), v1::Plan());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FLOAT_EQ(e->model.hidden_dropout, 0.25f);
  EXPECT_EQ(e->model.attention_dropout, 0.0f);

  // A JobSpec built in code (or stored before model.dropout existed): unset
  // fields are 0.1 too, each on its own.
  v1::JobSpec spec;
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_train("t.txt");
  spec.mutable_train()->set_steps(1);
  auto u = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FLOAT_EQ(u->model.hidden_dropout, 0.1f);
  EXPECT_FLOAT_EQ(u->model.attention_dropout, 0.1f);
  spec.mutable_model()->mutable_dropout()->set_attention(0);
  auto a = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FLOAT_EQ(a->model.hidden_dropout, 0.1f);
  EXPECT_EQ(a->model.attention_dropout, 0.0f);

  // Out of [0, 1) (a spec that skipped ParseJobSpec): the field is named.
  spec.mutable_model()->mutable_dropout()->set_hidden(1.0);
  auto bad = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "model.dropout.hidden: 1 is not in [0, 1)");
  spec.mutable_model()->mutable_dropout()->set_hidden(0.1);
  spec.mutable_model()->mutable_dropout()->set_attention(-0.5);
  bad = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "model.dropout.attention: -0.5 is not in [0, 1)");
}

TEST(TrainConfigTest, KeepCheckpoints) {
  const std::string data = "data:\n  train: t.txt\n";
  auto d = TrainConfigFromSpec(Parse(data + "train: {steps: 1}\n"), v1::Plan());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->keep_checkpoints, 3);
  auto all = TrainConfigFromSpec(Parse(data + "train: {steps: 1, keep_checkpoints: 0}\n"), v1::Plan());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->keep_checkpoints, 0);
  // Built in code: unset is the default; a negative count (no parser to
  // catch it) is named.
  v1::JobSpec spec;
  spec.mutable_data()->set_train("t.txt");
  spec.mutable_train()->set_steps(1);
  auto u = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->keep_checkpoints, 3);
  spec.mutable_train()->set_keep_checkpoints(-2);
  auto bad = TrainConfigFromSpec(spec, v1::Plan());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "train.keep_checkpoints: -2 is not >= 0 (0 keeps every checkpoint; N keeps the newest N "
            "and the best by eval)");
}

}  // namespace
}  // namespace dgca
