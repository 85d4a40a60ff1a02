// Using what a job trained, with the real programs: a short job on ECSpell
// law (2 CPU ranks, max_seq_len 64, checkpoints and evals at steps 10 and 20), then
// `dgca export JOB` and `dgca correct --eval` over the test set the job
// evaluated on. The metrics must be the job's own: the final eval the
// coordinator stored (for --checkpoint latest), and the eval recorded
// beside the best checkpoint (for the default, best). Then two sentences
// corrected, and the errors of an export that cannot be done.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class ExportCorrectTest : public CoordinatorSuite<ExportCorrectTest, true> {
 public:
  static constexpr const char* kName = "export-correct";
};

std::string WriteSpec(const std::string& dir) {
  const std::string path = dir + "/export.yaml";
  WriteFile(path,
            "name: export-correct\n"
            "model: {preset: tiny, dropout: {hidden: 0, attention: 0}}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  eval: " + SharedData() + "/ecspell/test_law.txt\n"
            "  max_seq_len: 64\n"
            "train:\n"
            "  steps: 20\n"
            "  global_batch: 8\n"
            "  micro_batch: 4\n"
            "  accumulation: 1\n"
            "  eval_every: 10\n"
            "  checkpoint_every: 10\n"
            "  optimizer: {lr: 2.0e-3}\n"
            "resources: {ranks: 2, device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: off}\n");
  return path;
}

std::map<std::string, double> Metrics(const JsonValue* obj) {
  std::map<std::string, double> m;
  if (obj == nullptr || !obj->is_object()) return m;
  for (const auto& [k, v] : obj->object) {
    if (v.is_number()) m[k] = v.number;
  }
  return m;
}

// Each of `want`'s metrics in `got`, bit-equal: one decoding path
// (model/train/predict.h) on the same weights, batching and threads, and
// every number passed on round-trip exact (%.17g; the job store's doubles).
// A difference beyond the 4 decimals the eval line prints is said apart.
void ExpectSameMetrics(const std::map<std::string, double>& want,
                       const std::map<std::string, double>& got, const std::string& what) {
  ASSERT_GE(want.size(), 10u) << what << ": too few metrics to compare";
  int exact = 0;
  for (const auto& [k, v] : want) {
    auto it = got.find(k);
    ASSERT_NE(it, got.end()) << what << ": no " << k;
    EXPECT_NEAR(it->second, v, 5e-5) << what << ": " << k << " differs at the printed precision";
    EXPECT_EQ(it->second, v) << what << ": " << k;
    exact += it->second == v;
  }
  printf("%s: %d of %zu metrics bit-equal, char correction F1 %.4f, sentence correction F1 %.4f\n",
         what.c_str(), exact, want.size(), want.at("char_correction_f1"),
         want.at("sentence_correction_f1"));
}

TEST_F(ExportCorrectTest, ExportThenCorrectReproducesTheJobsEval) {
  const std::string spec = WriteSpec(*dir_);
  Result sub = Dgca(*coord_, {"submit", "--wait", spec}, 600s);
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err;
  const std::string job = Trim(sub.out.substr(0, sub.out.find('\n')));
  ASSERT_FALSE(job.empty());

  Result st = Dgca(*coord_, {"status", "--json", job});
  ASSERT_EQ(st.code, 0) << st.err;
  auto sj = Json(st.out);
  ASSERT_TRUE(sj.ok()) << st.out;
  const std::map<std::string, double> job_eval = Metrics(sj->Find("job")->Find("eval"));
  EXPECT_EQ(JsonStr(sj->Find("checkpoint_dir")), coord_->state_dir() + "/jobs/" + job + "/checkpoints")
      << st.out.substr(0, 400);

  const std::string test_set = SharedData() + "/ecspell/test_law.txt";
  // The latest checkpoint is the final step's: the job's stored eval.
  const std::string latest = *dir_ + "/model-latest";
  Result ex = Dgca(*coord_, {"export", job, "--out", latest, "--checkpoint", "latest"});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  EXPECT_NE(ex.out.find("step-00000020, the latest of 2 checkpoints"), std::string::npos) << ex.out;
  Result ev = Exec({CliBin(), "correct", "--model", latest, "--eval", test_set, "--json",
                    "--batch-size", "4"},
                   300s);
  ASSERT_EQ(ev.code, 0) << ev.out << ev.err;
  auto ej = Json(ev.out);
  ASSERT_TRUE(ej.ok()) << ev.out;
  EXPECT_EQ(JsonInt(ej->Find("sentences")), 500);
  ExpectSameMetrics(job_eval, Metrics(ej->Find("metrics")), "latest vs the job's final eval");

  // The default: the best by eval, whose eval.json the job wrote.
  const std::string best = *dir_ + "/model-best";
  ex = Dgca(*coord_, {"export", job, "--out", best});
  ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  EXPECT_NE(ex.out.find("the best by char_correction_f1"), std::string::npos) << ex.out;
  auto cfg = Json(ReadFile(best + "/config.json"));
  ASSERT_TRUE(cfg.ok());
  const JsonValue* d = cfg->Find("dgca");
  ASSERT_NE(d, nullptr);
  const int64_t step = JsonInt(d->Find("step"));
  EXPECT_TRUE(step == 10 || step == 20) << step;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  auto recorded = Json(ReadFile(coord_->state_dir() + "/jobs/" + job + "/checkpoints/" + name + "/eval.json"));
  ASSERT_TRUE(recorded.ok());
  const std::map<std::string, double> best_eval = Metrics(recorded->Find("metrics"));
  ev = Exec({CliBin(), "correct", "--model", best, "--eval", test_set, "--json", "--batch-size", "4"}, 300s);
  ASSERT_EQ(ev.code, 0) << ev.out << ev.err;
  ej = Json(ev.out);
  ASSERT_TRUE(ej.ok()) << ev.out;
  ExpectSameMetrics(best_eval, Metrics(ej->Find("metrics")), std::string("best (") + name + ") vs its eval.json");

  // Two sentences of the test set that have errors.
  std::ifstream in(test_set);
  std::vector<std::string> sentences;
  for (std::string line; std::getline(in, line) && sentences.size() < 2;) {
    const size_t tab = line.find('\t');
    std::string src = line.substr(0, tab), trg = line.substr(tab + 1);
    if (src == trg) continue;
    std::string s;
    int chars = 0;
    for (char c : src) {
      if (c == ' ') continue;
      s += c;
      chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    }
    if (chars > 28) continue;  // (64 - 2 - 6) / 2 = 28 characters fit
    sentences.push_back(s);
  }
  ASSERT_EQ(sentences.size(), 2u);
  Result c = Exec({CliBin(), "correct", "--model", latest, sentences[0], sentences[1]}, 60s);
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  printf("%s", c.out.c_str());
  EXPECT_EQ(c.out.rfind(sentences[0], 0), 0u) << c.out;
  EXPECT_NE(c.out.find("\n" + sentences[1]), std::string::npos) << c.out;

  // What cannot be exported says why.
  Result unknown = Dgca(*coord_, {"export", "no-such-job", "--out", *dir_ + "/x"});
  EXPECT_EQ(unknown.code, 2) << unknown.out << unknown.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
