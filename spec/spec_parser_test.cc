#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "spec/spec.h"

namespace dgca {
namespace {

// A spec that sets every field (docs/job-spec.md).
const char kFullSpec[] = R"(name: relm-law
model:
  preset: bert-base
  vocab: path/to/vocab.txt
  init_from: null
  prompt: {length: 3, encoder: lstm}
  heads: {detector: true, candidate: {top_k: 8, confusion: path}, fusion: gated}
  dropout: {hidden: 0.1, attention: 0.05}
data:
  train: path/train.txt
  eval: path/test.txt
  max_seq_len: 128
  mft: {mode: noerror, rate: 0.3}
  loader: {threads: auto, prefetch: 2}
train:
  steps: 5000
  global_batch: 128
  micro_batch: auto
  accumulation: auto
  precision: auto
  optimizer: {lr: 5.0e-5, weight_decay: 0.0, warmup_steps: 0, clip_norm: 0}
  eval_every: 500
  checkpoint_every: 500
  seed: 42
  max_restarts: 2
resources: {ranks: auto, device: auto}
comm:
  backend: auto
  bucket_mb: auto
  overlap: true
  env: {NCCL_DEBUG: WARN}
  timeout_s: 30
tuning: {mode: auto, budget_s: 120}
)";

SpecParseResult Parse(const std::string& text) {
  auto r = ParseJobSpec(text, "job.yaml");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SpecParseResult{};
}

const v1::SpecProblem* Find(const SpecParseResult& r, const std::string& field) {
  for (const auto& p : r.problems) {
    if (p.field() == field) return &p;
  }
  return nullptr;
}

TEST(SpecParser, FullExampleParses) {
  SpecParseResult r = Parse(kFullSpec);
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  EXPECT_EQ(r.spec.name(), "relm-law");
  EXPECT_EQ(r.spec.model().preset(), "bert-base");
  EXPECT_EQ(r.spec.model().vocab(), "path/to/vocab.txt");
  EXPECT_EQ(r.spec.model().init_from(), "");
  EXPECT_EQ(r.spec.model().heads_spec().candidate().top_k(), 8);
  EXPECT_EQ(r.spec.model().heads_spec().candidate().confusion(), "path");
  EXPECT_TRUE(r.spec.model().heads_spec().candidate().enabled());
  EXPECT_DOUBLE_EQ(r.spec.model().dropout().hidden(), 0.1);
  EXPECT_DOUBLE_EQ(r.spec.model().dropout().attention(), 0.05);
  EXPECT_EQ(r.spec.data().loader().threads(), 0);
  EXPECT_DOUBLE_EQ(r.spec.data().mft().rate(), 0.3);
  EXPECT_DOUBLE_EQ(r.spec.train().optimizer().lr(), 5.0e-5);
  EXPECT_EQ(r.spec.train().max_restarts(), 2);
  EXPECT_EQ(r.spec.comm().env().at("NCCL_DEBUG"), "WARN");
  EXPECT_DOUBLE_EQ(r.spec.comm().timeout_s(), 30);
  EXPECT_EQ(r.spec.source_path(), "job.yaml");
  EXPECT_EQ(r.spec.base_dir(), "");
}

TEST(SpecParser, MinimalSpecGetsEveryDefault) {
  SpecParseResult r = Parse("name: x\n");
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  v1::JobSpec want = DefaultJobSpec();
  want.set_name("x");
  want.set_source_path("job.yaml");
  EXPECT_EQ(r.spec.SerializeAsString(), want.SerializeAsString());
  EXPECT_EQ(r.spec.train().steps(), 5000);
  EXPECT_EQ(r.spec.train().global_batch(), 128);
  EXPECT_EQ(r.spec.train().precision(), "auto");
  EXPECT_EQ(r.spec.train().seed(), 42u);
  EXPECT_EQ(r.spec.data().max_seq_len(), 128);
  EXPECT_EQ(r.spec.data().loader().prefetch(), 2);
  EXPECT_EQ(r.spec.model().prompt().length(), 3);
  EXPECT_EQ(r.spec.model().prompt().encoder(), "lstm");
  EXPECT_EQ(r.spec.model().heads_spec().fusion(), "gated");
  EXPECT_TRUE(r.spec.model().dropout().has_hidden());
  EXPECT_DOUBLE_EQ(r.spec.model().dropout().hidden(), 0.1);
  EXPECT_TRUE(r.spec.model().dropout().has_attention());
  EXPECT_DOUBLE_EQ(r.spec.model().dropout().attention(), 0.1);
  EXPECT_TRUE(r.spec.comm().overlap());
  EXPECT_EQ(r.spec.comm().backend(), "auto");
  EXPECT_EQ(r.spec.tuning().mode(), "auto");
  EXPECT_DOUBLE_EQ(r.spec.tuning().budget_s(), 120);
  EXPECT_DOUBLE_EQ(r.spec.comm().timeout_s(), 60);
}

TEST(SpecParser, NameDefaultsToFileBaseName) {
  auto r = ParseJobSpec("train: {steps: 3}\n", "/some/dir/relm-law.yaml");
  ASSERT_TRUE(r.ok() && r->ok());
  EXPECT_EQ(r->spec.name(), "relm-law");
  auto r2 = ParseJobSpec("train: {steps: 3}\n", "");
  ASSERT_TRUE(r2.ok() && r2->ok());
  EXPECT_EQ(r2->spec.name(), "job");
}

TEST(SpecParser, UnknownFieldWithSuggestion) {
  SpecParseResult r = Parse("name: x\ntrain:\n  stpes: 10\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  const auto& p = r.problems[0];
  EXPECT_EQ(p.file(), "job.yaml");
  EXPECT_EQ(p.line(), 3);
  EXPECT_EQ(p.column(), 3);
  EXPECT_EQ(p.field(), "train.stpes");
  EXPECT_NE(p.message().find("did you mean 'steps'"), std::string::npos) << p.message();
}

TEST(SpecParser, WrongType) {
  SpecParseResult r = Parse("train:\n  steps: abc\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 10);
  EXPECT_EQ(r.problems[0].field(), "train.steps");
  EXPECT_EQ(r.problems[0].message(), "expected an integer, got 'abc'");
  EXPECT_EQ(FormatProblem(r.problems[0]),
            "job.yaml:2:10: train.steps: expected an integer, got 'abc'\n");
}

TEST(SpecParser, OutOfRange) {
  SpecParseResult r = Parse("train:\n  steps: -5\n  optimizer: {lr: -1}\n");
  ASSERT_EQ(r.problems.size(), 2u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "train.steps");
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 10);
  EXPECT_NE(r.problems[0].message().find("must be >= 1"), std::string::npos);
  EXPECT_EQ(r.problems[1].field(), "train.optimizer.lr");
  EXPECT_EQ(r.problems[1].line(), 3);
  EXPECT_EQ(r.problems[1].column(), 19);
}

TEST(SpecParser, HugeNumber) {
  SpecParseResult r = Parse("train:\n  steps: 99999999999999999999999\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].field(), "train.steps");
}

TEST(SpecParser, BadEnumListsValidValues) {
  SpecParseResult r = Parse("resources:\n  device: tpu\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 11);
  EXPECT_EQ(r.problems[0].message(), "expected one of auto | cuda | cpu, got 'tpu'");
}

TEST(SpecParser, TrainAttention) {
  EXPECT_EQ(Parse("name: x\n").spec.train().attention(), "auto");
  SpecParseResult r = Parse("train:\n  attention: gemm\n");
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  EXPECT_EQ(r.spec.train().attention(), "gemm");
  SpecParseResult bad = Parse("train:\n  attention: flash\n");
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(FormatProblem(bad.problems[0]),
            "job.yaml:2:14: train.attention: expected one of auto | fused | gemm, got 'flash'\n");
}

TEST(SpecParser, TrainProgressTimeout) {
  // Default 300 s (spec/spec.h kDefaultProgressTimeoutSeconds), set
  // explicitly so a stored spec says what it ran with.
  SpecParseResult d = Parse("name: x\n");
  EXPECT_TRUE(d.spec.train().has_progress_timeout_s());
  EXPECT_DOUBLE_EQ(ProgressTimeoutOf(d.spec.train()), 300);
  EXPECT_DOUBLE_EQ(ProgressTimeoutOf(v1::TrainSpec()), 300);  // unset: stored before the field
  SpecParseResult off = Parse("train: {progress_timeout_s: 0}\n");
  ASSERT_TRUE(off.ok()) << FormatProblems(off.problems);
  EXPECT_DOUBLE_EQ(ProgressTimeoutOf(off.spec.train()), 0);
  SpecParseResult short_one = Parse("train:\n  progress_timeout_s: 7.5\n");
  ASSERT_TRUE(short_one.ok()) << FormatProblems(short_one.problems);
  EXPECT_DOUBLE_EQ(ProgressTimeoutOf(short_one.spec.train()), 7.5);
  SpecParseResult tiny = Parse("train:\n  progress_timeout_s: 0.5\n");
  ASSERT_EQ(tiny.problems.size(), 1u) << FormatProblems(tiny.problems);
  EXPECT_EQ(FormatProblem(tiny.problems[0]),
            "job.yaml:2:23: train.progress_timeout_s: must be 0 (no progress timeout) or at least "
            "1 (seconds; ranks report their phase every 2 s), got '0.5'\n");
  SpecParseResult neg = Parse("train:\n  progress_timeout_s: -3\n");
  ASSERT_EQ(neg.problems.size(), 1u) << FormatProblems(neg.problems);
  EXPECT_EQ(FormatProblem(neg.problems[0]),
            "job.yaml:2:23: train.progress_timeout_s: must be between 0 and 86400, got '-3'\n");
  SpecParseResult word = Parse("train:\n  progress_timeout_s: soon\n");
  ASSERT_EQ(word.problems.size(), 1u) << FormatProblems(word.problems);
  EXPECT_EQ(FormatProblem(word.problems[0]),
            "job.yaml:2:23: train.progress_timeout_s: expected a number, got 'soon'\n");
}

TEST(SpecParser, TrainKeepCheckpoints) {
  // Default 3 (spec/spec.h kDefaultKeepCheckpoints), set explicitly so a
  // stored spec says what it ran with.
  SpecParseResult d = Parse("name: x\n");
  EXPECT_TRUE(d.spec.train().has_keep_checkpoints());
  EXPECT_EQ(d.spec.train().keep_checkpoints(), 3);
  EXPECT_EQ(KeepCheckpointsOf(d.spec.train()), 3);
  // 0 is a value (keep all), not "unset".
  SpecParseResult all = Parse("train: {keep_checkpoints: 0}\n");
  ASSERT_TRUE(all.ok()) << FormatProblems(all.problems);
  EXPECT_TRUE(all.spec.train().has_keep_checkpoints());
  EXPECT_EQ(KeepCheckpointsOf(all.spec.train()), 0);
  SpecParseResult five = Parse("train:\n  keep_checkpoints: 5\n");
  ASSERT_TRUE(five.ok()) << FormatProblems(five.problems);
  EXPECT_EQ(five.spec.train().keep_checkpoints(), 5);
  // A JobSpec built in code, or stored before the field: the default.
  EXPECT_EQ(KeepCheckpointsOf(v1::TrainSpec()), 3);
  // Negative: located, and it says what 0 and N mean.
  SpecParseResult neg = Parse("train:\n  steps: 10\n  keep_checkpoints: -1\n");
  ASSERT_EQ(neg.problems.size(), 1u) << FormatProblems(neg.problems);
  EXPECT_EQ(FormatProblem(neg.problems[0]),
            "job.yaml:3:21: train.keep_checkpoints: must be >= 0 (0 keeps every checkpoint; N "
            "keeps the newest N and the best by eval), got '-1'\n");
  // 1: a stopped attempt's late save would delete the restart's checkpoint.
  SpecParseResult one = Parse("train:\n  keep_checkpoints: 1\n");
  ASSERT_EQ(one.problems.size(), 1u) << FormatProblems(one.problems);
  EXPECT_NE(FormatProblem(one.problems[0]).find("job.yaml:2:21: train.keep_checkpoints: must be 0 "
                                                "or at least 2"),
            std::string::npos)
      << FormatProblem(one.problems[0]);
  SpecParseResult word = Parse("train:\n  keep_checkpoints: all\n");
  ASSERT_EQ(word.problems.size(), 1u) << FormatProblems(word.problems);
  EXPECT_EQ(FormatProblem(word.problems[0]),
            "job.yaml:2:21: train.keep_checkpoints: expected an integer, got 'all'\n");
}

TEST(SpecParser, ModelDropout) {
  // Absent: HF BertConfig's 0.1 each; one key alone keeps the other's default.
  SpecParseResult none = Parse("model:\n  preset: tiny\n");
  ASSERT_TRUE(none.ok()) << FormatProblems(none.problems);
  EXPECT_DOUBLE_EQ(none.spec.model().dropout().hidden(), kDefaultDropout);
  EXPECT_DOUBLE_EQ(none.spec.model().dropout().attention(), kDefaultDropout);
  SpecParseResult one = Parse("model:\n  dropout:\n    attention: 0.2\n");
  ASSERT_TRUE(one.ok()) << FormatProblems(one.problems);
  EXPECT_DOUBLE_EQ(one.spec.model().dropout().hidden(), 0.1);
  EXPECT_DOUBLE_EQ(one.spec.model().dropout().attention(), 0.2);
  SpecParseResult null_map = Parse("model:\n  dropout: ~\n");
  ASSERT_TRUE(null_map.ok()) << FormatProblems(null_map.problems);
  EXPECT_DOUBLE_EQ(null_map.spec.model().dropout().hidden(), 0.1);
  // 0 is a value (no dropout), kept apart from "unset".
  SpecParseResult zero = Parse("model:\n  dropout: {hidden: 0, attention: 0.0}\n");
  ASSERT_TRUE(zero.ok()) << FormatProblems(zero.problems);
  EXPECT_TRUE(zero.spec.model().dropout().has_hidden());
  EXPECT_EQ(zero.spec.model().dropout().hidden(), 0.0);
  EXPECT_TRUE(zero.spec.model().dropout().has_attention());
  EXPECT_EQ(zero.spec.model().dropout().attention(), 0.0);
  // DropoutOf: what a spec that skipped the parser (fields unset) trains with.
  v1::ModelSpec bare;
  EXPECT_EQ(DropoutOf(bare).hidden, 0.1);
  EXPECT_EQ(DropoutOf(bare).attention, 0.1);
  bare.mutable_dropout()->set_attention(0);
  EXPECT_EQ(DropoutOf(bare).hidden, 0.1);
  EXPECT_EQ(DropoutOf(bare).attention, 0.0);
  EXPECT_EQ(DropoutOf(zero.spec.model()).hidden, 0.0);
  SpecParseResult high = Parse("model:\n  dropout: {hidden: 0.999, attention: 0.5}\n");
  ASSERT_TRUE(high.ok()) << FormatProblems(high.problems);
  EXPECT_DOUBLE_EQ(high.spec.model().dropout().hidden(), 0.999);

  // Out of [0, 1): 1 itself, above, below; a non-number; 'auto' is not a spelling.
  SpecParseResult bad = Parse(
      "model:\n"
      "  dropout:\n"
      "    hidden: 1.5\n"
      "    attention: 1\n");
  ASSERT_EQ(bad.problems.size(), 2u) << FormatProblems(bad.problems);
  EXPECT_EQ(FormatProblem(bad.problems[0]),
            "job.yaml:3:13: model.dropout.hidden: must be >= 0 and < 1, got '1.5'\n");
  EXPECT_EQ(FormatProblem(bad.problems[1]),
            "job.yaml:4:16: model.dropout.attention: must be >= 0 and < 1, got '1'\n");
  // The one problem a spec has (an empty one, and a failure, otherwise).
  auto only = [](const std::string& yaml) -> v1::SpecProblem {
    SpecParseResult r = Parse(yaml);
    EXPECT_EQ(r.problems.size(), 1u) << yaml << FormatProblems(r.problems);
    return r.problems.size() == 1 ? r.problems[0] : v1::SpecProblem();
  };
  EXPECT_EQ(FormatProblem(only("model: {dropout: {hidden: -0.1}}\n")),
            "job.yaml:1:27: model.dropout.hidden: must be >= 0 and < 1, got '-0.1'\n");
  EXPECT_EQ(FormatProblem(only("model:\n  dropout: {attention: lots}\n")),
            "job.yaml:2:24: model.dropout.attention: expected a number, got 'lots'\n");
  EXPECT_EQ(only("model:\n  dropout: {hidden: auto}\n").field(), "model.dropout.hidden");

  // Unknown keys (with a suggestion) and a scalar where the mapping goes.
  const v1::SpecProblem typo = only("model:\n  dropout:\n    hiden: 0.2\n");
  EXPECT_EQ(typo.field(), "model.dropout.hiden");
  EXPECT_EQ(typo.line(), 3);
  EXPECT_EQ(typo.column(), 5);
  EXPECT_EQ(typo.message(),
            "unknown field 'hiden'; did you mean 'hidden'?; valid fields here: hidden, attention");
  EXPECT_EQ(FormatProblem(only("model: {dropout: {attention: 0.99999999}}\n")),
            "job.yaml:1:30: model.dropout.attention: must be < 1 in single precision (the trainer's), "
            "got '0.99999999'\n");
  EXPECT_EQ(FormatProblem(only("model:\n  dropout: 0.1\n")),
            "job.yaml:2:12: model.dropout: expected a mapping, got '0.1'\n");
  EXPECT_EQ(only("train:\n  dropout: {hidden: 0.1}\n").field(), "train.dropout");
}

TEST(SpecParser, SyntaxErrorHasLineColumn) {
  SpecParseResult r = Parse("name: x\ntrain: {steps: 5\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].field(), "(syntax)");
  EXPECT_GT(r.problems[0].line(), 0);
  EXPECT_GT(r.problems[0].column(), 0);
  EXPECT_NE(r.problems[0].message().find("YAML syntax error"), std::string::npos);

  SpecParseResult r2 = Parse("name: x\n  bad: indent: here\n");
  ASSERT_EQ(r2.problems.size(), 1u);
  EXPECT_EQ(r2.problems[0].line(), 2);
}

// Found by tools/fuzz.sh: a line indented under a comment line leaves
// yaml-cpp 0.7's parser returning the same empty document forever; read
// with YAML::LoadAll it allocated until the coordinator ran out of memory.
// Now a syntax error at that line, at once.
TEST(SpecParser, ALineThatStopsTheYamlParserIsASyntaxError) {
  const std::string stuck =
      "# One GPU: every rank    accumulation: auto\n"
      "  , n$o and w\n"
      "  accumulation: auto\n"
      "tuning: {mode: model}\n";
  const auto start = std::chrono::steady_clock::now();
  SpecParseResult r = Parse(stuck);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].field(), "(syntax)");
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 3);
  EXPECT_NE(r.problems[0].message().find("the parser cannot read on from here"),
            std::string::npos)
      << r.problems[0].message();
}

TEST(SpecParser, MoreThanOneDocumentIsNamedWhereTheSecondStarts) {
  SpecParseResult r = Parse("name: x\n---\nname: y\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 1);
  EXPECT_NE(r.problems[0].message().find("more than one YAML document"), std::string::npos)
      << r.problems[0].message();
  EXPECT_EQ(r.spec.name(), "x");  // the first document is still read
  // A trailing marker opens an (empty) second document: still named.
  SpecParseResult trailing = Parse("name: x\n---\n");
  ASSERT_EQ(trailing.problems.size(), 1u);
  EXPECT_EQ(trailing.problems[0].line(), 2);
  EXPECT_NE(trailing.problems[0].message().find("more than one YAML document"), std::string::npos);
}

// yaml-cpp 0.7 can also get stuck after a first document it read; without a
// '---' or '...' line that is a syntax error where it stopped, not "more
// than one document".
TEST(SpecParser, AStuckParserAfterTheFirstDocumentIsASyntaxError) {
  // The same with the first document's own "---" (after a comment) first:
  // that marker does not make it a second document.
  for (const std::string text : {"{name: x}\n, b\n", "# a job\n---\n{name: x}\n, b\n"}) {
    SCOPED_TRACE(text);
    SpecParseResult r = Parse(text);
    ASSERT_EQ(r.problems.size(), 1u);
    EXPECT_EQ(r.problems[0].field(), "(syntax)");
    EXPECT_EQ(r.problems[0].line(), text[0] == '#' ? 4 : 2);
    EXPECT_EQ(r.problems[0].column(), 1);
    EXPECT_NE(r.problems[0].message().find("the parser cannot read on from here"),
              std::string::npos)
        << r.problems[0].message();
  }
  // A leading "---" and a real second one: still two documents.
  SpecParseResult two = Parse("---\nname: x\n---\nname: y\n");
  ASSERT_EQ(two.problems.size(), 1u);
  EXPECT_EQ(two.problems[0].line(), 3);
  EXPECT_NE(two.problems[0].message().find("more than one YAML document"), std::string::npos);
}

TEST(SpecParser, NotAMapping) {
  SpecParseResult r = Parse("- a\n- b\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 1);
  EXPECT_EQ(r.problems[0].column(), 1);
  EXPECT_NE(r.problems[0].message().find("must be a mapping"), std::string::npos);
  EXPECT_FALSE(Parse("").ok());
  EXPECT_FALSE(Parse("just a string").ok());
  SpecParseResult r3 = Parse("train: 5\n");
  ASSERT_EQ(r3.problems.size(), 1u);
  EXPECT_EQ(r3.problems[0].field(), "train");
  EXPECT_EQ(r3.problems[0].column(), 8);
}

TEST(SpecParser, ThreeProblemsAllReported) {
  const char* text =
      "name: bad\n"
      "modle:\n"
      "  preset: tiny\n"
      "train:\n"
      "  steps: -5\n"
      "  global_batch: lots\n";
  SpecParseResult r = Parse(text);
  ASSERT_EQ(r.problems.size(), 3u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "modle");
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 1);
  EXPECT_NE(r.problems[0].message().find("did you mean 'model'"), std::string::npos);
  EXPECT_EQ(r.problems[1].field(), "train.steps");
  EXPECT_EQ(r.problems[1].line(), 5);
  EXPECT_EQ(r.problems[2].field(), "train.global_batch");
  EXPECT_EQ(r.problems[2].line(), 6);
  EXPECT_EQ(r.problems[2].column(), 17);
  std::string all = FormatProblems(r.problems);
  EXPECT_NE(all.find("job.yaml:5:10: train.steps: must be >= 1"), std::string::npos) << all;
}

// A quote that does not close on its line would fold every following
// field into one string (YAML allows multi-line quoted strings, yaml-cpp
// even an unclosed one at the end): refused where the quote opens.
TEST(SpecParser, AnUnclosedQuoteIsNamedWhereItOpens) {
  SpecParseResult r = Parse("name: q\ndata:\n  train: '/data/train.txt\n  max_seq_len: 64\ntrain:\n  steps: 5\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].line(), 3);
  EXPECT_EQ(r.problems[0].column(), 10);
  EXPECT_NE(r.problems[0].message().find("the single quote opened here is not closed on this line"),
            std::string::npos)
      << FormatProblems(r.problems);
  r = Parse("name: q\ntuning:\n  mode: \"model\n");  // at the very end: yaml-cpp takes it
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].line(), 3);
  EXPECT_NE(r.problems[0].message().find("the double quote opened here"), std::string::npos);
  // Closed quotes, escapes and '' inside single quotes are fine; so is a
  // quote inside a plain scalar.
  r = Parse("name: q\ndata: {train: \"/a \\\" b.txt\"}\nmodel:\n  vocab: 'it''s/v.txt'\n  init_from: it's\n");
  EXPECT_TRUE(r.problems.empty()) << FormatProblems(r.problems);
  EXPECT_EQ(r.spec.data().train(), "/a \" b.txt");
  EXPECT_EQ(r.spec.model().vocab(), "it's/v.txt");
}

// A custom model's invalid size has one problem, at that size's line (not
// the model's), and is not also reported missing.
TEST(SpecParser, CustomModelSizesAreReportedWhereTheyAre) {
  SpecParseResult r = Parse("model:\n  preset: custom\n  layers: 2\n  hidden: 33\n  heads: 2\n  ffn: 64\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "model.hidden");
  EXPECT_EQ(r.problems[0].line(), 4);
  r = Parse("model:\n  preset: custom\n  layers: 500\n  hidden: 64\n  heads: 2\n  ffn: 64\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "model.layers");
  r = Parse("model:\n  preset: custom\n  hidden: 64\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_NE(r.problems[0].message().find("missing: model.layers, model.attention_heads (or an integer model.heads), "
                                         "model.ffn"),
            std::string::npos)
      << FormatProblems(r.problems);
}

TEST(SpecParser, CandidateFalseAndHeadsFalse) {
  SpecParseResult r = Parse("model:\n  heads: {candidate: false}\n");
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  EXPECT_FALSE(r.spec.model().heads_spec().candidate().enabled());
  EXPECT_TRUE(r.spec.model().heads_spec().detector());
  SpecParseResult r2 = Parse("model:\n  heads: false\n");
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2.spec.model().heads_spec().fusion(), "none");
  EXPECT_FALSE(r2.spec.model().heads_spec().detector());
  SpecParseResult r3 = Parse("model:\n  heads: {candidate: [1]}\n");
  ASSERT_EQ(r3.problems.size(), 1u);
  EXPECT_EQ(r3.problems[0].field(), "model.heads.candidate");
  SpecParseResult r4 = Parse("model: {preset: custom, layers: 2, hidden: 64, heads: 4, ffn: 128}\n");
  ASSERT_TRUE(r4.ok()) << FormatProblems(r4.problems);
  EXPECT_EQ(r4.spec.model().heads(), 4);
}

TEST(SpecParser, AttentionHeadsBesideHeadsMapping) {
  SpecParseResult r = Parse(
      "model:\n  preset: custom\n  layers: 2\n  hidden: 64\n  ffn: 128\n  attention_heads: 2\n"
      "  heads: {detector: false, candidate: {top_k: 4}}\n");
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  EXPECT_EQ(r.spec.model().heads(), 2);
  EXPECT_FALSE(r.spec.model().heads_spec().detector());
  EXPECT_EQ(r.spec.model().heads_spec().candidate().top_k(), 4);
  SpecParseResult bad = Parse("model:\n  attention_heads: 0\n");
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0].field(), "model.attention_heads");
}

TEST(SpecParser, EnvAllowList) {
  SpecParseResult r = Parse("comm:\n  env:\n    NCCL_IB_DISABLE: 1\n    LD_PRELOAD: evil.so\n    OMP_NUM_THREADS: 4\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "comm.env.LD_PRELOAD");
  EXPECT_EQ(r.problems[0].line(), 4);
  EXPECT_EQ(r.problems[0].column(), 5);
  EXPECT_EQ(r.spec.comm().env().at("NCCL_IB_DISABLE"), "1");
  EXPECT_EQ(r.spec.comm().env().at("OMP_NUM_THREADS"), "4");
}

// Allowed prefixes, refused names: variables that load a library into the
// rank or write a file on the node (spec/rank_env.h), each a problem at its
// line that says why; their neighbours that only tune or read stay.
TEST(SpecParser, EnvThatLoadsCodeOrWritesFilesIsRefused) {
  SpecParseResult r = Parse(
      "comm:\n"
      "  env:\n"
      "    NCCL_DEBUG: INFO\n"
      "    NCCL_NET_PLUGIN: /tmp/evil.so\n"
      "    NCCL_TUNER_PLUGIN: mine\n"
      "    CUDA_INJECTION64_PATH: /tmp/evil.so\n"
      "    OMP_TOOL_LIBRARIES: /tmp/evil.so\n"
      "    NCCL_DEBUG_FILE: /etc/cron.d/x\n"
      "    NCCL_TOPO_FILE: /etc/nccl-topo.xml\n"
      "    OMP_TOOL: disabled\n");
  ASSERT_EQ(r.problems.size(), 5u) << FormatProblems(r.problems);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"NCCL_NET_PLUGIN", "loads a library into the rank"},
      {"NCCL_TUNER_PLUGIN", "loads a library into the rank"},
      {"CUDA_INJECTION64_PATH", "loads a library into the rank"},
      {"OMP_TOOL_LIBRARIES", "loads a library into the rank"},
      {"NCCL_DEBUG_FILE", "writes a file on the node"}};
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& p = r.problems[i];
    EXPECT_EQ(p.field(), "comm.env." + want[i].first);
    EXPECT_EQ(p.line(), static_cast<int>(i) + 4);
    EXPECT_EQ(p.column(), 5);
    EXPECT_NE(p.message().find(want[i].first + " is not allowed: it " + want[i].second),
              std::string::npos) << p.message();
    EXPECT_NE(p.message().find("may set NCCL_*, CUDA_* and OMP_* variables"), std::string::npos)
        << p.message();
    EXPECT_EQ(r.spec.comm().env().count(want[i].first), 0u);
  }
  EXPECT_EQ(r.spec.comm().env().at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(r.spec.comm().env().at("NCCL_TOPO_FILE"), "/etc/nccl-topo.xml");
  EXPECT_EQ(r.spec.comm().env().at("OMP_TOOL"), "disabled");
}

// NCCL_COMM_BLOCKING would override the ranks' non-blocking communicators
// (and their init timeout): refused, saying why, at its line.
TEST(SpecParser, NcclCommBlockingIsRefused) {
  SpecParseResult r = Parse("comm:\n  env:\n    NCCL_DEBUG: WARN\n    NCCL_COMM_BLOCKING: 1\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "comm.env.NCCL_COMM_BLOCKING");
  EXPECT_EQ(r.problems[0].line(), 4);
  EXPECT_NE(r.problems[0].message().find("would override that"), std::string::npos) << r.problems[0].message();
  EXPECT_EQ(r.spec.comm().env().count("NCCL_COMM_BLOCKING"), 0u);
}

TEST(SpecParser, DuplicateKeyAndCrossField) {
  SpecParseResult r = Parse("name: a\nname: b\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 2);
  SpecParseResult r2 = Parse("train: {global_batch: 8, micro_batch: 16}\n");
  ASSERT_EQ(r2.problems.size(), 1u);
  EXPECT_EQ(r2.problems[0].field(), "train.micro_batch");
  SpecParseResult r3 = Parse("resources: {device: cpu}\ncomm: {backend: nccl}\n");
  ASSERT_EQ(r3.problems.size(), 1u);
  SpecParseResult r4 = Parse("train: {global_batch: 8, micro_batch: 2, accumulation: 2}\nresources: {ranks: 2}\n");
  EXPECT_TRUE(r4.ok()) << FormatProblems(r4.problems);
}

// resources.launcher: slurm with every slurm field set parses to the proto;
// the default launcher is local and a spec without it has no slurm section.
TEST(SpecParser, SlurmSectionParses) {
  SpecParseResult r = Parse(
      "resources:\n"
      "  launcher: slurm\n"
      "  slurm:\n"
      "    partition: gpu-a100\n"
      "    account: lab.nlp\n"
      "    qos: normal\n"
      "    nodes: 2\n"
      "    gpus_per_node: 4\n"
      "    time: 1-12:00\n"
      "    extra_args: ['--exclusive', '--constraint=a100']\n");
  ASSERT_TRUE(r.ok()) << FormatProblems(r.problems);
  const auto& res = r.spec.resources();
  EXPECT_EQ(res.launcher(), "slurm");
  EXPECT_EQ(res.slurm().partition(), "gpu-a100");
  EXPECT_EQ(res.slurm().account(), "lab.nlp");
  EXPECT_EQ(res.slurm().qos(), "normal");
  EXPECT_EQ(res.slurm().nodes(), 2);
  EXPECT_EQ(res.slurm().gpus_per_node(), 4);
  EXPECT_EQ(res.slurm().time(), "1-12:00");
  ASSERT_EQ(res.slurm().extra_args_size(), 2);
  EXPECT_EQ(res.slurm().extra_args(1), "--constraint=a100");

  SpecParseResult a = Parse("resources: {launcher: slurm, slurm: {time: AUTO}}\n");
  ASSERT_TRUE(a.ok()) << FormatProblems(a.problems);
  EXPECT_EQ(a.spec.resources().slurm().time(), "auto");

  SpecParseResult d = Parse("name: x\n");
  ASSERT_TRUE(d.ok()) << FormatProblems(d.problems);
  EXPECT_EQ(d.spec.resources().launcher(), "local");
  EXPECT_FALSE(d.spec.resources().has_slurm());
}

// Every bad Slurm value is named at its line and column with what is valid,
// and all of them are reported in one pass.
TEST(SpecParser, SlurmProblemsAreNamedWhereTheyAre) {
  SpecParseResult r = Parse(
      "resources:\n"
      "  launcher: slurm\n"
      "  slurm:\n"
      "    partition: 'gpu; rm -rf /'\n"
      "    nodes: 0\n"
      "    time: soon\n"
      "    extra_args: ['--output=/tmp/x', 'exclusive', '--partition=gpu', '--comment=$(id)']\n");
  ASSERT_EQ(r.problems.size(), 7u) << FormatProblems(r.problems);
  const v1::SpecProblem* partition = Find(r, "resources.slurm.partition");
  ASSERT_NE(partition, nullptr);
  EXPECT_EQ(partition->line(), 4);
  EXPECT_EQ(partition->column(), 16);
  EXPECT_NE(partition->message().find("expected 1-64 of A-Z a-z 0-9 . _ -"), std::string::npos);
  const v1::SpecProblem* nodes = Find(r, "resources.slurm.nodes");
  ASSERT_NE(nodes, nullptr);
  EXPECT_EQ(nodes->line(), 5);
  const v1::SpecProblem* time = Find(r, "resources.slurm.time");
  ASSERT_NE(time, nullptr);
  EXPECT_EQ(time->line(), 6);
  EXPECT_NE(time->message().find("D-HH:MM:SS"), std::string::npos) << time->message();
  const v1::SpecProblem* own = Find(r, "resources.slurm.extra_args[0]");
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(own->line(), 7);
  EXPECT_NE(own->message().find("--output is set by the coordinator"), std::string::npos)
      << own->message();
  const v1::SpecProblem* bare = Find(r, "resources.slurm.extra_args[1]");
  ASSERT_NE(bare, nullptr);
  EXPECT_NE(bare->message().find("expected a long option"), std::string::npos);
  const v1::SpecProblem* field = Find(r, "resources.slurm.extra_args[2]");
  ASSERT_NE(field, nullptr);
  EXPECT_NE(field->message().find("use resources.slurm.partition instead"), std::string::npos);
  const v1::SpecProblem* shell = Find(r, "resources.slurm.extra_args[3]");
  ASSERT_NE(shell, nullptr);
  EXPECT_NE(shell->message().find("without quotes, $"), std::string::npos) << shell->message();
  EXPECT_EQ(r.spec.resources().slurm().extra_args_size(), 0);
}

// A slurm section under the local launcher is a mistake, not ignored.
TEST(SpecParser, SlurmSectionNeedsTheSlurmLauncher) {
  SpecParseResult r = Parse("resources:\n  slurm: {partition: gpu}\n");
  ASSERT_EQ(r.problems.size(), 1u) << FormatProblems(r.problems);
  EXPECT_EQ(r.problems[0].field(), "resources.slurm");
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_NE(r.problems[0].message().find("only with resources.launcher: slurm"), std::string::npos)
      << r.problems[0].message();
  SpecParseResult l = Parse("resources: {launcher: pbs}\n");
  ASSERT_EQ(l.problems.size(), 1u);
  EXPECT_EQ(l.problems[0].message(), "expected one of local | slurm, got 'pbs'");
}

// Seeded random mutations of the full spec: the parser never crashes or
// throws, and returns either a valid spec or at least one problem.
TEST(SpecParser, MutationFuzz) {
  std::mt19937 rng(20261122);
  const std::string base = kFullSpec;
  const std::vector<std::string> scalars = {
      "abc", "-1", "0", "1e400", "99999999999999999999999999", "~", "null", "[]", "{}",
      "[1, [2, [3]]]", "\"quoted\"", "'x'", "true", "no", ".nan", "-.inf", "0x1F", "auto",
      "&a x", "*a", "!!binary AAAA", "|\n  block", "? complex", "\xff\xfe\x80", "\xe4\xb8\xad"};
  auto rand = [&](size_t n) { return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int valid = 0, invalid = 0;
  for (int i = 0; i < 400; ++i) {
    std::string s = base;
    int n_mut = 1 + static_cast<int>(rand(4));
    for (int m = 0; m < n_mut; ++m) {
      switch (rand(10)) {
        case 0: if (!s.empty()) s.erase(rand(s.size()), 1); break;
        case 1: if (!s.empty()) { size_t p = rand(s.size()); s.insert(p, 1, s[p]); } break;
        case 2: if (s.size() > 1) { size_t a = rand(s.size()), b = rand(s.size()); std::swap(s[a], s[b]); } break;
        case 3: {  // delete a line
          size_t p = s.find('\n', rand(s.size()));
          size_t q = p == std::string::npos ? std::string::npos : s.find('\n', p + 1);
          if (q != std::string::npos) s.erase(p, q - p);
          break;
        }
        case 4: {  // duplicate or swap lines
          std::vector<std::string> lines;
          size_t start = 0;
          for (size_t k = 0; k <= s.size(); ++k) {
            if (k == s.size() || s[k] == '\n') { lines.push_back(s.substr(start, k - start)); start = k + 1; }
          }
          size_t a = rand(lines.size()), b = rand(lines.size());
          if (rand(2)) std::swap(lines[a], lines[b]); else lines.insert(lines.begin() + a, lines[b]);
          s.clear();
          for (auto& l : lines) s += l + "\n";
          break;
        }
        case 5: {  // replace a scalar after ": "
          size_t p = s.find(": ", rand(s.size()));
          if (p != std::string::npos) {
            size_t e = s.find_first_of(",}\n", p + 2);
            if (e == std::string::npos) e = s.size();
            s.replace(p + 2, e - p - 2, scalars[rand(scalars.size())]);
          }
          break;
        }
        case 6: {  // insert a random key
          std::string key = "k" + std::to_string(rand(1000)) + ": " + scalars[rand(scalars.size())] + "\n";
          size_t p = s.find('\n', rand(s.size()));
          s.insert(p == std::string::npos ? s.size() : p + 1, (rand(2) ? "  " : "") + key);
          break;
        }
        case 7: {  // deep nesting
          size_t depth = 1 + rand(3000);
          std::string nest(depth, '[');
          nest += "1";
          nest += std::string(rand(2) ? depth : depth / 2, ']');
          s += "deep: " + nest + "\n";
          break;
        }
        case 8: {  // deep block nesting
          std::string block = "x:\n";
          for (size_t d = 1; d < 1 + rand(200); ++d) block += std::string(d, ' ') + "y:\n";
          s += block;
          break;
        }
        default: {  // non-UTF-8 / control bytes
          size_t p = rand(s.size() + 1);
          std::string junk;
          for (size_t k = 0; k < 1 + rand(4); ++k) junk += static_cast<char>(rand(256));
          s.insert(p, junk);
          break;
        }
      }
    }
    absl::StatusOr<SpecParseResult> r;
    ASSERT_NO_THROW(r = ParseJobSpec(s, "fuzz.yaml")) << "mutation " << i;
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->ok()) {
      ++valid;
    } else {
      ++invalid;
      for (const auto& p : r->problems) {
        EXPECT_FALSE(p.message().empty());
        EXPECT_FALSE(p.field().empty());
        EXPECT_GE(p.line(), 0);
        EXPECT_FALSE(FormatProblem(p).empty());
      }
    }
  }
  EXPECT_GT(invalid, 100);  // most mutations must be rejected...
  EXPECT_EQ(valid + invalid, 400);
}

TEST(SpecParser, InvalidUtf8HasLineColumn) {
  SpecParseResult r = Parse("name: x\ntrain: {steps: 1\xff}\n");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].line(), 2);
  EXPECT_EQ(r.problems[0].column(), 17);
  EXPECT_NE(r.problems[0].message().find("UTF-8"), std::string::npos);
  EXPECT_TRUE(Parse("name: \xe4\xb8\xad\xe6\x96\x87\n").ok());  // Chinese is fine
}

TEST(SpecParser, OversizedInput) {
  std::string big(kMaxSpecBytes + 1, '#');
  SpecParseResult r = Parse(big);
  ASSERT_EQ(r.problems.size(), 1u);
}

}  // namespace
}  // namespace dgca
