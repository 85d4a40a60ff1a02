#include "model/core/confusion.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "model/core/core_test_util.h"
#include "model/core/tokenizer.h"

namespace dgca {
namespace {

using namespace testutil;  // NOLINT: test helpers

Vocab CharVocab(const std::vector<std::string>& chars) {
  std::vector<std::string> t = {"[PAD]"};
  for (int i = 1; i <= 99; ++i) t.push_back("[unused" + std::to_string(i) + "]");
  for (const char* s : {"[UNK]", "[CLS]", "[SEP]", "[MASK]"}) t.push_back(s);
  for (const auto& c : chars) t.push_back(c);
  return Vocab::FromTokens(t);
}

TEST(ConfusionTest, FromListsEnforcesInvariants) {
  ConfusionSet cs = ConfusionSet::FromLists(10, {{3, {5, 3, 5, 7, 99, -1, 2}}, {12, {1}}});
  EXPECT_EQ(cs.CandidatesOf(3), (std::vector<int32_t>{5, 7, 2}));
  EXPECT_TRUE(cs.CandidatesOf(4).empty());
  EXPECT_TRUE(cs.CandidatesOf(12).empty());
  EXPECT_TRUE(cs.CandidatesOf(-5).empty());
  EXPECT_EQ(cs.num_keys(), 1);
}

TEST(ConfusionTest, LoadJsonDedupesAndDrops) {
  Vocab v = CharVocab({"一", "艺", "谊", "移", "二"});  // ids 104..108
  const std::string path = TempPath("c.json");
  WriteFile(path, "{\"一\": [\"艺\", \"谊\", \"艺\", \"一\", \"外\", \"移\"],\n"
                  " \"外\": [\"一\"], \"二\": []}");
  auto r = ConfusionSet::LoadJson(path, v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->CandidatesOf(104), (std::vector<int32_t>{105, 106, 107}));
  EXPECT_TRUE(r->CandidatesOf(108).empty());
  EXPECT_EQ(r->num_keys(), 1);
  std::remove(path.c_str());
}

TEST(ConfusionTest, LoadJsonErrorsNamePlace) {
  Vocab v = CharVocab({"一"});
  const std::string path = TempPath("bad.json");
  WriteFile(path, "{\"一\": [\"艺\",\n  \"谊\" \"x\"]}");
  auto r = ConfusionSet::LoadJson(path, v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":2:"), std::string::npos) << r.status().message();
  WriteFile(path, "{\"一\": [\"艺\",\n  3]}");
  r = ConfusionSet::LoadJson(path, v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":2:3"), std::string::npos) << r.status().message();
  WriteFile(path, "{\"一\": \"艺\"}");
  r = ConfusionSet::LoadJson(path, v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("array"), std::string::npos);
  r = ConfusionSet::LoadJson("/nonexistent/c.json", v);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(ConfusionTest, SharedPinyinSet) {
  const std::string vpath = SharedData() + "/vocab/vocab.txt";
  const std::string cpath = SharedData() + "/confusion/pinyin_sam.json";
  if (access(vpath.c_str(), R_OK) != 0 || access(cpath.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "shared data not present under " << SharedData();
  }
  auto v = Vocab::Load(vpath);
  ASSERT_TRUE(v.ok());
  auto r = ConfusionSet::LoadJson(cpath, *v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->num_keys(), 1000);
  const int32_t yi = v->Lookup("一");
  auto c = r->CandidatesOf(yi);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], v->Lookup("艺"));  // the file's first entry
  std::vector<int32_t> sorted = c;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "duplicates kept";
  EXPECT_EQ(std::find(c.begin(), c.end(), yi), c.end());
}

TEST(ConfusionTest, StripTones) {
  EXPECT_EQ(StripPinyinTones("zhōng"), "zhong");
  EXPECT_EQ(StripPinyinTones("lǘ"), "lü");
  EXPECT_EQ(StripPinyinTones("ǹg"), "ng");
  EXPECT_EQ(StripPinyinTones("zhong1"), "zhong");
  EXPECT_EQ(StripPinyinTones("hm\xcc\x80"), "hm");
}

TEST(ConfusionTest, UnihanSmallFile) {
  // A plain-text Unihan excerpt: 中 zhōng/zhòng, 钟 zhōng, 种 zhǒng/zhòng, 众 zhòng, 大 dà.
  const std::string path = TempPath("Unihan_Readings.txt");
  WriteFile(path,
            "# comment\nU+4E2D\tkMandarin\tzhōng zhòng\nU+4E2D\tkDefinition\tmiddle\n"
            "U+949F\tkMandarin\tzhōng\nU+79CD\tkMandarin\tzhǒng zhòng\n"
            "U+4F17\tkMandarin\tzhòng\nU+5927\tkMandarin\tdà\n");
  Vocab v = CharVocab({"大", "种", "众", "钟", "中"});  // 104..108
  auto r = ConfusionSet::BuildFromUnihan(v, path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // 中: same toned readings {钟(107), 种(105), 众(106)} by id -> 105, 106, 107.
  EXPECT_EQ(r->CandidatesOf(108), (std::vector<int32_t>{105, 106, 107}));
  // 钟 zhōng: same tone 中(108); toneless zhong: 种(105), 众(106).
  EXPECT_EQ(r->CandidatesOf(107), (std::vector<int32_t>{108, 105, 106}));
  EXPECT_TRUE(r->CandidatesOf(104).empty());
  auto capped = ConfusionSet::BuildFromUnihan(v, path, 1);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->CandidatesOf(107), (std::vector<int32_t>{108}));
  std::remove(path.c_str());
  auto missing = ConfusionSet::BuildFromUnihan(v, "/nonexistent/Unihan_Readings.txt.bz2");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("unicode-data"), std::string::npos);
}

TEST(ConfusionTest, UnihanFromDebian) {
  if (access(kDefaultUnihanReadingsPath, R_OK) != 0) {
    GTEST_SKIP() << kDefaultUnihanReadingsPath << " absent (package unicode-data)";
  }
  const std::string vpath = SharedData() + "/vocab/vocab.txt";
  if (access(vpath.c_str(), R_OK) != 0) GTEST_SKIP() << vpath << " not present";
  auto v = Vocab::Load(vpath);
  ASSERT_TRUE(v.ok());
  auto r = ConfusionSet::BuildFromUnihan(*v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->num_keys(), 5000);
  auto c = r->CandidatesOf(v->Lookup("中"));
  EXPECT_NE(std::find(c.begin(), c.end(), v->Lookup("钟")), c.end());
  EXPECT_NE(std::find(c.begin(), c.end(), v->Lookup("终")), c.end());
  EXPECT_EQ(std::find(c.begin(), c.end(), v->Lookup("大")), c.end());
}

}  // namespace
}  // namespace dgca
