#include "model/core/synth.h"

#include <cstdlib>

#include <gtest/gtest.h>
#include <glob.h>
#include <unistd.h>

#include "model/core/confusion.h"
#include "model/core/core_test_util.h"
#include "model/core/data.h"
#include "model/core/tokenizer.h"

namespace dgca {
namespace {

bool AnySource(const SynthOptions& o) {
  for (const auto& p : o.sources) {
    glob_t g{};
    const bool found = glob(p.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    if (found) return true;
  }
  return false;
}

using testutil::ReadFile;

std::string TempDir(const std::string& name) {
  return "/tmp/dgca_synth_" + std::to_string(getpid()) + "/" + name;
}

TEST(SynthTest, ProducesEcspellCorpus) {
  SynthOptions o;
  if (!AnySource(o)) GTEST_SKIP() << "debian-reference-zh-cn / manpages-zh not installed";
  if (access(o.unihan_path.c_str(), R_OK) != 0) GTEST_SKIP() << o.unihan_path << " absent (unicode-data)";
  o.out_dir = TempDir("a");
  o.train_sentences = 3000;
  o.test_sentences = 300;
  o.error_rate = 0.5;
  SynthStats st;
  Status s = SynthesizeCorpus(o, &st);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(st.files, 1);
  EXPECT_GE(st.candidate_sentences, 3300);
  EXPECT_EQ(st.train, 3000);
  EXPECT_EQ(st.test, 300);

  ReadStats rs;
  const Vocab vocab = Vocab::BuildFromExamples({o.out_dir + "/train.txt", o.out_dir + "/test.txt"}).value();
  auto train = ReadEcspell(o.out_dir + "/train.txt", vocab, &rs);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(rs.kept, 3000);
  EXPECT_EQ(rs.skipped_unequal, 0);
  auto test = ReadEcspell(o.out_dir + "/test.txt", vocab, &rs);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(rs.kept, 300);

  // Error share, substitution counts and lengths, checked from the files.
  int64_t with_err = 0, changed = 0;
  auto cs = ConfusionSet::BuildFromUnihan(vocab, o.unihan_path);
  ASSERT_TRUE(cs.ok());
  for (const Example& e : *train) {
    EXPECT_GE(e.src.size(), 8u);
    EXPECT_LE(e.src.size(), 60u);
    int diff = 0;
    for (size_t i = 0; i < e.src.size(); ++i) {
      if (e.src[i] != e.trg[i]) {
        ++diff;
        // The substitute is a homophone of the original.
        auto c = cs->CandidatesOf(e.trg[i]);
        EXPECT_NE(std::find(c.begin(), c.end(), e.src[i]), c.end())
            << e.src_chars[i] << " for " << e.trg_chars[i];
      }
    }
    EXPECT_LE(diff, 2);
    with_err += diff > 0;
    changed += diff;
  }
  EXPECT_EQ(with_err, st.train_with_errors);
  EXPECT_NEAR(static_cast<double>(with_err) / 3000, 0.5, 0.02);
  EXPECT_GT(changed, with_err);  // some sentences got two
  // Sentences are unique across both splits.
  std::set<std::vector<int32_t>> uniq;
  for (const Example& e : *train) uniq.insert(e.trg);
  for (const Example& e : *test) uniq.insert(e.trg);
  EXPECT_EQ(uniq.size(), 3300u);
  const std::string readme = ReadFile(o.out_dir + "/README.txt");
  EXPECT_NE(readme.find("debian-reference-zh-cn"), std::string::npos);
  EXPECT_NE(readme.find("Unihan"), std::string::npos);

  // Deterministic for a seed; another seed differs.
  SynthOptions o2 = o;
  o2.out_dir = TempDir("b");
  ASSERT_TRUE(SynthesizeCorpus(o2, nullptr).ok());
  EXPECT_EQ(ReadFile(o.out_dir + "/train.txt"), ReadFile(o2.out_dir + "/train.txt"));
  EXPECT_EQ(ReadFile(o.out_dir + "/test.txt"), ReadFile(o2.out_dir + "/test.txt"));
  o2.seed = 43;
  o2.train_sentences = 100;
  o2.test_sentences = 10;
  ASSERT_TRUE(SynthesizeCorpus(o2, nullptr).ok());
  EXPECT_NE(ReadFile(o.out_dir + "/test.txt"), ReadFile(o2.out_dir + "/test.txt"));
  std::system(("rm -rf /tmp/dgca_synth_" + std::to_string(getpid())).c_str());
}

TEST(SynthTest, ClearErrors) {
  SynthOptions o;
  o.out_dir = TempDir("x");
  o.sources = {"/nonexistent/*.gz"};
  Status s = SynthesizeCorpus(o, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("manpages-zh"), std::string::npos);
  o = SynthOptions();
  o.error_rate = 2;
  EXPECT_FALSE(SynthesizeCorpus(o, nullptr).ok());
  o = SynthOptions();
  if (!AnySource(o)) GTEST_SKIP() << "Debian Chinese text not installed";
  o.out_dir = TempDir("y");
  o.unihan_path = "/nonexistent/Unihan_Readings.txt.bz2";
  s = SynthesizeCorpus(o, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unicode-data"), std::string::npos);
}

}  // namespace
}  // namespace dgca
