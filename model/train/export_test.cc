// ExportModel / LoadExportedModel / ChooseCheckpoint on checkpoints this test
// writes (no shared data needed): Hugging Face names and shapes, config.json,
// the round trip to identical parameters, the checkpoint choice, and the
// loader's errors naming the file at fault.
#include "model/train/export.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "gtest/gtest.h"
#include "model/core/core_test_util.h"
#include "model/core/json.h"
#include "model/core/safetensors.h"
#include "model/train/checkpoint.h"
#include "model/train/checkpoint_retention.h"

namespace dgca {
namespace {

namespace fs = std::filesystem;
using testutil::MakeTempDir;
using testutil::ReadFile;
using testutil::WriteFile;

// A small vocabulary in BERT's layout (reserved ids 0..103) and a confusion
// set over it as JSON.
Vocab SmallVocab() {
  return Vocab::BuildFromLines({"今天天气很好\t今天天气很好", "我们去公园玩\t我们去公园玩",
                                "天田填甜添"});
}

ModelConfig SmallConfig(const Vocab& v) {
  ModelConfig c;
  c.vocab_size = v.size();
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 32;
  c.max_position = 40;
  c.prompt_length = 2;
  c.candidate_top_k = 4;
  return c;
}

// DIR with step-00000002 (eval f1 0.5) and step-00000004 (eval f1 0.25,
// latest), vocab.txt and confusion.json; returns DIR. `params_out` gets
// the step-2 weights.
struct Fixture {
  std::string dir;
  std::string vocab_path;
  std::string confusion_path;
  ModelConfig cfg;
  std::vector<float> step2_values, step4_values;
  std::vector<ParamInfo> infos;
};

Fixture MakeCheckpoints(const ModelConfig* override_cfg = nullptr) {
  Fixture f;
  f.dir = MakeTempDir("export_test");
  EXPECT_FALSE(f.dir.empty());
  const Vocab v = SmallVocab();
  f.cfg = override_cfg ? *override_cfg : SmallConfig(v);
  f.cfg.vocab_size = v.size();
  f.vocab_path = f.dir + "/vocab.txt";
  EXPECT_TRUE(v.Save(f.vocab_path).ok());
  f.confusion_path = f.dir + "/confusion-src.json";
  WriteFile(f.confusion_path, "{\"天\": [\"田\", \"填\", \"甜\", \"添\"], \"很\": [\"天\"]}");
  for (int64_t step : {2, 4}) {
    auto m = DgcaModel::Create(f.cfg, 1, 16, /*seed=*/step, 1);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    ParamStore& ps = (*m)->params();
    CheckpointState st;
    st.step = step;
    auto saved = SaveCheckpoint(f.dir, ps, nullptr, f.cfg, st);
    EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_TRUE(WriteCheckpointEval(*saved, step,
                                    {{"char_correction_f1", step == 2 ? 0.5 : 0.25},
                                     {"sentence_correction_f1", 0.125}})
                    .ok());
    std::vector<float> values(ps.values(), ps.values() + ps.total_numel());
    (step == 2 ? f.step2_values : f.step4_values) = values;
    f.infos.clear();
    for (int i = 0; i < ps.size(); ++i) f.infos.push_back(ps.info(i));
  }
  return f;
}

ExportSource SourceOf(const Fixture& f, const std::string& step_dir) {
  ExportSource s;
  s.step_dir = step_dir;
  s.vocab_path = f.vocab_path;
  s.confusion_path = f.confusion_path;
  s.max_seq_len = 24;
  s.description = "test";
  return s;
}

TEST(ExportTest, TensorsUnderHfNamesWithShapesAndDgcaPartsApart) {
  Fixture f = MakeCheckpoints();
  const std::string out = f.dir + "/out";
  auto r = ExportModel(SourceOf(f, f.dir + "/step-00000002"), out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 2);
  auto bert = ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(bert.ok()) << bert.status().ToString();
  auto heads = ReadSafetensors(out + "/dgca_heads.safetensors");
  ASSERT_TRUE(heads.ok()) << heads.status().ToString();
  // transformers refuses a file without it.
  EXPECT_EQ(bert->metadata["format"], "pt");
  EXPECT_EQ(static_cast<int>(bert->tensors.size()), r->bert_tensors);
  EXPECT_EQ(static_cast<int>(heads->tensors.size()), r->dgca_tensors);
  // Every parameter in exactly one file, with its shape; BERT's by HF name.
  for (const ParamInfo& p : f.infos) {
    const bool in_bert = bert->tensors.count(p.name) > 0;
    const bool in_heads = heads->tensors.count(p.name) > 0;
    EXPECT_NE(in_bert, in_heads) << p.name;
    EXPECT_EQ(in_bert, IsHfBertParameter(p.name)) << p.name;
    const Tensor& t = in_bert ? bert->tensors.at(p.name) : heads->tensors.at(p.name);
    EXPECT_EQ(t.shape, p.shape) << p.name;
  }
  EXPECT_EQ(bert->tensors.size() + heads->tensors.size(), f.infos.size());
  // The names BertForMaskedLM has (layer 1 of 2, the MLM head) are there.
  for (const char* n : {"bert.embeddings.word_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                        "bert.encoder.layer.1.attention.self.query.weight",
                        "bert.encoder.layer.1.output.LayerNorm.bias",
                        "cls.predictions.transform.dense.weight", "cls.predictions.bias"}) {
    EXPECT_TRUE(bert->tensors.count(n)) << n;
  }
  EXPECT_EQ(bert->tensors.at("bert.embeddings.word_embeddings.weight").shape,
            (std::vector<int64_t>{f.cfg.vocab_size, f.cfg.hidden}));
  for (const auto& kv : heads->tensors) {
    const std::string& n = kv.first;
    EXPECT_TRUE(n.rfind("prompt.", 0) == 0 || n.rfind("detector.", 0) == 0 ||
                n.rfind("candidate.", 0) == 0 || n.rfind("fusion.", 0) == 0)
        << n;
  }
  // What LoadHfInit (HF files into our model) takes: every BERT tensor, nothing unexpected.
  auto m = DgcaModel::Create(f.cfg, 1, 16, 99, 1);
  ASSERT_TRUE(m.ok());
  auto hf = LoadHfInit(out + "/model.safetensors", &(*m)->params());
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(hf->loaded, r->bert_tensors);
  EXPECT_TRUE(hf->unexpected.empty());
  EXPECT_EQ(static_cast<int>(hf->missing.size()), r->dgca_tensors);
}

TEST(ExportTest, ConfigJsonHasHfBertFieldsAndDgcaSection) {
  Fixture f = MakeCheckpoints();
  const std::string out = f.dir + "/out";
  ASSERT_TRUE(ExportModel(SourceOf(f, f.dir + "/step-00000002"), out).ok());
  auto js = ParseJson(ReadFile(out + "/config.json"), "config.json");
  ASSERT_TRUE(js.ok()) << js.status().ToString();
  auto integer = [&](const JsonValue* o, const char* k) {
    const JsonValue* v = o->Find(k);
    return v && v->is_integer ? v->integer : -1;
  };
  EXPECT_EQ(js->Find("model_type")->string, "bert");
  EXPECT_EQ(js->Find("architectures")->array.at(0).string, "BertForMaskedLM");
  EXPECT_EQ(js->Find("hidden_act")->string, "gelu");
  EXPECT_EQ(integer(&*js, "vocab_size"), f.cfg.vocab_size);
  EXPECT_EQ(integer(&*js, "hidden_size"), f.cfg.hidden);
  EXPECT_EQ(integer(&*js, "num_hidden_layers"), f.cfg.layers);
  EXPECT_EQ(integer(&*js, "num_attention_heads"), f.cfg.heads);
  EXPECT_EQ(integer(&*js, "intermediate_size"), f.cfg.ffn);
  EXPECT_EQ(integer(&*js, "max_position_embeddings"), f.cfg.max_position);
  EXPECT_EQ(integer(&*js, "type_vocab_size"), f.cfg.type_vocab);
  EXPECT_EQ(integer(&*js, "pad_token_id"), 0);
  EXPECT_FLOAT_EQ(static_cast<float>(js->Find("layer_norm_eps")->number), f.cfg.layer_norm_eps);
  const JsonValue* d = js->Find("dgca");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(integer(d, "format"), kExportFormat);
  EXPECT_EQ(integer(d, "prompt_length"), 2);
  EXPECT_EQ(d->Find("prompt_encoder")->string, "lstm");
  EXPECT_EQ(d->Find("fusion")->string, "gated");
  EXPECT_TRUE(d->Find("detector")->boolean);
  EXPECT_TRUE(d->Find("candidate")->boolean);
  EXPECT_EQ(integer(d, "candidate_top_k"), 4);
  EXPECT_EQ(integer(d, "max_seq_len"), 24);
  EXPECT_EQ(integer(d, "step"), 2);
  EXPECT_EQ(d->Find("eval")->Find("char_correction_f1")->number, 0.5);
  EXPECT_EQ(d->Find("source")->string, "test");
  // The vocabulary as the job's, line for line.
  EXPECT_EQ(ReadFile(out + "/vocab.txt"), ReadFile(f.vocab_path));
}

TEST(ExportTest, LoadBackGivesIdenticalParamsVocabAndConfusion) {
  Fixture f = MakeCheckpoints();
  const std::string out = f.dir + "/out";
  ASSERT_TRUE(ExportModel(SourceOf(f, f.dir + "/step-00000004"), out).ok());
  auto m = LoadExportedModel(out, 2, 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->max_seq_len, 24);
  EXPECT_EQ(m->step, 4);
  EXPECT_EQ(ConfigFingerprint(m->config), ConfigFingerprint(f.cfg));
  const ParamStore& ps = m->model->params();
  ASSERT_EQ(ps.size(), static_cast<int>(f.infos.size()));
  for (const ParamInfo& p : f.infos) {
    const int i = ps.Find(p.name);
    ASSERT_GE(i, 0) << p.name;
    for (int64_t k = 0; k < p.numel; ++k) {
      ASSERT_EQ(ps.value(i)[k], f.step4_values[p.offset + k]) << p.name << "[" << k << "]";
    }
  }
  const Vocab v = SmallVocab();
  EXPECT_EQ(m->vocab.tokens(), v.tokens());
  ASSERT_NE(m->confusion, nullptr);
  auto want = ConfusionSet::LoadJson(f.confusion_path, v);
  ASSERT_TRUE(want.ok());
  for (int32_t id = 0; id < v.size(); ++id) {
    EXPECT_EQ(m->confusion->CandidatesOf(id), want->CandidatesOf(id)) << v.Token(id);
  }
  EXPECT_EQ(m->confusion->CandidatesOf(v.Lookup("天")).size(), 4u);
}

TEST(ExportTest, ModelsWithoutHeadsOrPromptsExportAndLoad) {
  const Vocab v = SmallVocab();
  ModelConfig c = SmallConfig(v);
  c.detector = false;
  c.candidate = false;
  c.fusion = FusionKind::kNone;
  c.prompt_encoder = PromptEncoderKind::kNone;
  Fixture f = MakeCheckpoints(&c);
  const std::string out = f.dir + "/out";
  auto r = ExportModel(SourceOf(f, f.dir + "/step-00000002"), out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dgca_tensors, 0);
  EXPECT_FALSE(fs::exists(out + "/dgca_heads.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/confusion.json"));
  auto m = LoadExportedModel(out, 1, 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->confusion, nullptr);
  EXPECT_EQ(ConfigFingerprint(m->config), ConfigFingerprint(f.cfg));
}

TEST(ExportTest, ReadCheckpointConfigIsTheFingerprintsInverse) {
  Fixture f = MakeCheckpoints();
  auto c = ReadCheckpointConfig(f.dir + "/step-00000002");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(ConfigFingerprint(*c), ConfigFingerprint(f.cfg));
  auto missing = ReadCheckpointConfig(f.dir + "/step-00000009");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ExportTest, ChooseCheckpointBestByEvalOrLatest) {
  Fixture f = MakeCheckpoints();
  auto best = ChooseCheckpoint(f.dir, "best");
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  EXPECT_EQ(best->step, 2);
  EXPECT_EQ(best->kind, "best");
  EXPECT_EQ(best->step_dir, f.dir + "/step-00000002");
  EXPECT_NE(best->reason.find("step-00000002, the best by char_correction_f1 (0.5000) of 2 checkpoints"),
            std::string::npos)
      << best->reason;
  auto latest = ChooseCheckpoint(f.dir, "latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 4);
  EXPECT_EQ(latest->kind, "latest");
  EXPECT_NE(latest->reason.find("step-00000004, the latest of 2 checkpoints"), std::string::npos)
      << latest->reason;
  // Without evals, best falls back to the latest and says so.
  fs::remove(f.dir + "/step-00000002/eval.json");
  fs::remove(f.dir + "/step-00000004/eval.json");
  auto none = ChooseCheckpoint(f.dir, "best");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->step, 4);
  EXPECT_EQ(none->kind, "latest");
  EXPECT_NE(none->reason.find("none has an eval recorded"), std::string::npos) << none->reason;

  EXPECT_EQ(ChooseCheckpoint(f.dir, "newest").status().code(), StatusCode::kInvalidArgument);
  auto gone = ChooseCheckpoint(f.dir + "/nope", "best");
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find(f.dir + "/nope"), std::string::npos);
  const std::string empty = MakeTempDir("export_test_empty");
  auto nothing = ChooseCheckpoint(empty, "best");
  EXPECT_EQ(nothing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nothing.status().message().find("holds no step-NNNNNNNN checkpoint"), std::string::npos)
      << nothing.status().message();
}

TEST(ExportTest, ExportRefusesAWrongVocabularyOrSeqLen) {
  Fixture f = MakeCheckpoints();
  ExportSource s = SourceOf(f, f.dir + "/step-00000002");
  const std::string other = f.dir + "/other-vocab.txt";
  ASSERT_TRUE(Vocab::BuildFromLines({"一二三"}).Save(other).ok());
  s.vocab_path = other;
  auto r = ExportModel(s, f.dir + "/out");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(other + ": the vocabulary has"), std::string::npos)
      << r.status().message();
  s = SourceOf(f, f.dir + "/step-00000002");
  s.max_seq_len = 41;  // max_position is 40
  r = ExportModel(s, f.dir + "/out");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_seq_len 41 is outside 8..40"), std::string::npos)
      << r.status().message();
}

TEST(ExportTest, LoadErrorsNameTheDirectoryOrFile) {
  Fixture f = MakeCheckpoints();
  const std::string out = f.dir + "/out";
  ASSERT_TRUE(ExportModel(SourceOf(f, f.dir + "/step-00000002"), out).ok());

  auto gone = LoadExportedModel(f.dir + "/no-such", 1, 1);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find(f.dir + "/no-such does not exist"), std::string::npos);

  // A checkpoint directory is not an export.
  auto ckpt = LoadExportedModel(f.dir, 1, 1);
  EXPECT_EQ(ckpt.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ckpt.status().message().find(f.dir + "/config.json: missing; is " + f.dir +
                                         " a dgca export directory"),
            std::string::npos)
      << ckpt.status().message();

  auto copy = [&](const std::string& name) {
    const std::string d = f.dir + "/" + name;
    fs::copy(out, d, fs::copy_options::recursive);
    return d;
  };
  {  // The heads file gone.
    const std::string d = copy("no-heads");
    fs::remove(d + "/dgca_heads.safetensors");
    auto r = LoadExportedModel(d, 1, 1);
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find(d + "/dgca_heads.safetensors: missing"), std::string::npos)
        << r.status().message();
  }
  {  // A vocabulary of another size.
    const std::string d = copy("other-vocab");
    ASSERT_TRUE(Vocab::BuildFromLines({"一二三"}).Save(d + "/vocab.txt").ok());
    auto r = LoadExportedModel(d, 1, 1);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(d + "/vocab.txt: the vocabulary has"), std::string::npos)
        << r.status().message();
  }
  {  // config.json without the dgca section: a plain HF directory.
    const std::string d = copy("hf-only");
    std::string cfg = ReadFile(d + "/config.json");
    cfg.replace(cfg.find("\"dgca\""), 6, "\"other\"");
    WriteFile(d + "/config.json", cfg);
    auto r = LoadExportedModel(d, 1, 1);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("no object field 'dgca'"), std::string::npos)
        << r.status().message();
  }
  {  // A field out of range names the field.
    const std::string d = copy("bad-field");
    std::string cfg = ReadFile(d + "/config.json");
    cfg.replace(cfg.find("\"fusion\": \"gated\""), 17, "\"fusion\": \"sum\"");
    WriteFile(d + "/config.json", cfg);
    auto r = LoadExportedModel(d, 1, 1);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("field 'fusion': 'sum' is not one of gated, none"),
              std::string::npos)
        << r.status().message();
  }
  {  // A tensor of the wrong shape names the file and the tensor.
    const std::string d = copy("bad-shape");
    auto heads = ReadSafetensors(d + "/dgca_heads.safetensors");
    ASSERT_TRUE(heads.ok());
    std::vector<TensorView> views;
    std::vector<float> wrong(3, 0.0f);
    for (const auto& kv : heads->tensors) {
      if (kv.first == "detector.weight") {
        views.push_back({kv.first, {3}, wrong.data()});
      } else {
        views.push_back({kv.first, kv.second.shape, kv.second.data.data()});
      }
    }
    ASSERT_TRUE(heads->tensors.count("detector.weight")) << "the detector's weight is named otherwise";
    ASSERT_TRUE(WriteSafetensors(d + "/dgca_heads.safetensors", views).ok());
    auto r = LoadExportedModel(d, 1, 1);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(d + "/dgca_heads.safetensors: tensor 'detector.weight' has shape [3]"),
              std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace dgca
