// Corrector against the trainer: a short real training run on ECSpell law
// (the shared data), exported, then corrected with. Its Evaluate() over the
// eval file must give the run's final eval metrics exactly (one prediction
// path, model/train/predict.h), and the corrected TEXT of every test
// sentence, read back as ids, must score the same. Plus the errors a user
// meets.
#include "model/train/corrector.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "model/core/eval_metrics.h"
#include "model/core/utf8.h"
#include "model/train/trainer.h"
#include "model/train/trainer_test_util.h"

namespace dgca {
namespace {

using testutil::DataDir;
using testutil::HaveData;

struct Trained {
  std::string export_dir;
  std::map<std::string, double> eval;
  int micro_batch = 0;
};

// Trains TinyConfig for a few steps once per process, exports the final
// checkpoint. Empty export_dir: failed (the test says why).
const Trained& TrainOnce() {
  static Trained* t = [] {
    auto* t = new Trained;
    TrainConfig c = testutil::TinyConfig();
    c.steps = 400;
    c.eval_path = DataDir() + "/ecspell/test_law.txt";
    c.checkpoint_dir = testutil::MakeTempDir("corrector_test") + "/ckpt";
    c.checkpoint_every = 400;
    c.micro_batch = 16;
    auto r = Train(c, nullptr, nullptr);
    if (!r.ok()) {
      ADD_FAILURE() << r.status().ToString();
      return t;
    }
    t->eval = r->eval;
    t->micro_batch = c.micro_batch;
    ExportSource s;
    s.step_dir = c.checkpoint_dir + "/step-00000400";
    s.vocab_path = c.checkpoint_dir + "/vocab.txt";
    s.confusion_path = c.confusion_path;
    s.max_seq_len = c.max_seq_len;
    const std::string out = c.checkpoint_dir + "/../export";
    auto e = ExportModel(s, out);
    if (!e.ok()) {
      ADD_FAILURE() << e.status().ToString();
      return t;
    }
    t->export_dir = out;
    return t;
  }();
  return *t;
}

TEST(CorrectorTest, EvaluateReproducesTheTrainersEval) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const Trained& t = TrainOnce();
  ASSERT_FALSE(t.export_dir.empty());
  CorrectorOptions o;
  o.batch_size = t.micro_batch;
  auto c = Corrector::Load(t.export_dir, o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto e = (*c)->Evaluate(DataDir() + "/ecspell/test_law.txt");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->sentences, 500);
  ASSERT_FALSE(t.eval.empty());
  for (const auto& [k, v] : t.eval) {
    ASSERT_TRUE(e->metrics.count(k)) << k;
    EXPECT_EQ(e->metrics.at(k), v) << k;
  }
  // The export carries the eval of its step: the same numbers.
  for (const auto& [k, v] : t.eval) {
    if (k == "sentences") continue;
    EXPECT_DOUBLE_EQ((*c)->model().eval.at(k), v) << k;
  }
  printf("eval: char correction F1 %.4f, sentence correction F1 %.4f, FPR %.4f\n",
         e->metrics["char_correction_f1"], e->metrics["sentence_correction_f1"],
         e->metrics["false_positive_rate"]);
}

TEST(CorrectorTest, CorrectedTextScoresAsTheEval) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const Trained& t = TrainOnce();
  ASSERT_FALSE(t.export_dir.empty());
  CorrectorOptions o;
  o.batch_size = 5;  // another batching than the trainer's: the same predictions
  auto c = Corrector::Load(t.export_dir, o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Vocab& vocab = (*c)->model().vocab;
  auto examples = ReadEcspell(DataDir() + "/ecspell/test_law.txt", vocab, (*c)->max_chars(), nullptr);
  ASSERT_TRUE(examples.ok());
  // The sources as a user types them: no spaces, cut as the eval cuts them.
  std::vector<std::string> sentences;
  for (const Example& ex : *examples) {
    std::string s;
    for (const std::string& ch : ex.src_chars) s += ch;
    sentences.push_back(s);
  }
  auto out = (*c)->Correct(sentences);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), examples->size());
  CorrectionMetrics m;
  int changed = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    const Correction& r = (*out)[i];
    const std::vector<uint32_t> a = Utf8ToCodepoints(r.original), b = Utf8ToCodepoints(r.corrected);
    ASSERT_EQ(a.size(), b.size()) << r.original << " -> " << r.corrected;
    std::vector<int32_t> pred;
    std::string ch;
    for (uint32_t cp : b) {
      ch.clear();
      AppendUtf8(cp, &ch);
      pred.push_back(vocab.Lookup(ch));
    }
    // Source characters outside the vocabulary stay as typed; as ids they are [UNK].
    for (size_t k = 0; k < pred.size(); ++k) {
      if (b[k] == a[k]) pred[k] = (*examples)[i].src[k];
    }
    for (const CharChange& x : r.changes) {
      ch.clear();
      AppendUtf8(a[x.position], &ch);
      EXPECT_EQ(x.from, ch);
      EXPECT_NE(x.from, x.to);
    }
    changed += !r.changes.empty();
    m.Add((*examples)[i].src, (*examples)[i].trg, pred);
  }
  const auto got = m.Compute();
  for (const auto& [k, v] : t.eval) EXPECT_EQ(got.at(k), v) << k;
  printf("%d of %zu sentences changed\n", changed, out->size());
  EXPECT_GT(changed, 0) << "a model that changes nothing tests nothing here";
}

TEST(CorrectorTest, WhitespaceStaysAndChangesPointIntoTheOriginal) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const Trained& t = TrainOnce();
  ASSERT_FALSE(t.export_dir.empty());
  auto c = Corrector::Load(t.export_dir, CorrectorOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto plain = (*c)->Correct({"行政机关应当依法保护当事人的合法权益"});
  auto spaced = (*c)->Correct({" 行政机关 应当依法保护当事人的合法权益 ", "", "   "});
  ASSERT_TRUE(plain.ok() && spaced.ok());
  const Correction& p = (*plain)[0];
  const Correction& s = (*spaced)[0];
  // The same characters reach the model; the spaces are kept where they were.
  ASSERT_EQ(p.changes.size(), s.changes.size());
  for (size_t k = 0; k < p.changes.size(); ++k) {
    EXPECT_EQ(p.changes[k].to, s.changes[k].to);
    EXPECT_EQ(p.changes[k].position + (p.changes[k].position >= 4 ? 2 : 1), s.changes[k].position);
  }
  EXPECT_EQ(s.corrected.front(), ' ');
  EXPECT_EQ(s.corrected.back(), ' ');
  EXPECT_EQ((*spaced)[1].corrected, "");
  EXPECT_EQ((*spaced)[2].corrected, "   ");
  EXPECT_TRUE((*spaced)[2].changes.empty());
}

TEST(CorrectorTest, ErrorsNameTheSentenceAndTheLimit) {
  if (!HaveData()) GTEST_SKIP() << "no " << DataDir() << "/ecspell/train_law.txt";
  const Trained& t = TrainOnce();
  ASSERT_FALSE(t.export_dir.empty());
  auto c = Corrector::Load(t.export_dir, CorrectorOptions{});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->max_chars(), 28);  // (64 - 2 - 2 x 3) / 2
  std::string long_one;
  for (int i = 0; i < 29; ++i) long_one += "法";
  auto r = (*c)->Correct({"好", long_one}, {"in.txt:1", "in.txt:2"});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("in.txt:2: 29 characters; this model takes at most 28 (its "
                                      "max_seq_len 64"),
            std::string::npos)
      << r.status().message();
  r = (*c)->Correct({"ok", std::string("\xe6\xb3", 2)});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sentence 2: invalid UTF-8 at byte 0"), std::string::npos)
      << r.status().message();
  CorrectorOptions bad;
  bad.batch_size = 0;
  auto z = Corrector::Load(t.export_dir, bad);
  EXPECT_EQ(z.status().code(), StatusCode::kInvalidArgument);
  auto e = (*c)->Evaluate(t.export_dir + "/no-such.txt");
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dgca
