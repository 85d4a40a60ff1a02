#include "model/core/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "model/core/core_test_util.h"
#include "model/core/utf8.h"

namespace dgca {
namespace {

using namespace testutil;  // NOLINT: test helpers

Vocab SmallVocab() {
  std::vector<std::string> t = {"[PAD]"};
  for (int i = 1; i <= 99; ++i) t.push_back("[unused" + std::to_string(i) + "]");
  for (const char* s : {"[UNK]", "[CLS]", "[SEP]", "[MASK]", "中", "国", "un", "##aff",
                        "##able", "hello", ",", "!", "a", "##b", "Hello"}) {
    t.push_back(s);
  }
  return Vocab::FromTokens(t);
}

TEST(Utf8Test, Validation) {
  EXPECT_EQ(FindInvalidUtf8("abc\xe4\xb8\xad"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xe4\xb8"), 2u);        // truncated
  EXPECT_EQ(FindInvalidUtf8("\xc0\x80"), 0u);          // overlong
  EXPECT_EQ(FindInvalidUtf8("x\xed\xa0\x80"), 1u);     // surrogate
  EXPECT_EQ(FindInvalidUtf8("\xff"), 0u);
  std::string s;
  AppendUtf8(0x1F600, &s);
  EXPECT_EQ(Utf8ToCodepoints(s), std::vector<uint32_t>{0x1F600});
}

TEST(VocabTest, SpecialIdsAndLookup) {
  Vocab v = SmallVocab();
  EXPECT_EQ(v.pad_id(), kPadId);
  EXPECT_EQ(v.unk_id(), kUnkId);
  EXPECT_EQ(v.cls_id(), kClsId);
  EXPECT_EQ(v.sep_id(), kSepId);
  EXPECT_EQ(v.mask_id(), kMaskId);
  EXPECT_EQ(v.Lookup("中"), 104);
  EXPECT_EQ(v.Lookup("国"), 105);
  EXPECT_EQ(v.Lookup("不在"), kUnkId);
  EXPECT_TRUE(v.IsSpecial(5));
  EXPECT_TRUE(v.IsSpecial(kMaskId));
  EXPECT_FALSE(v.IsSpecial(104));
  EXPECT_EQ(v.Token(104), "中");
  EXPECT_EQ(v.Token(-1), "");
  // A vocabulary whose specials sit elsewhere: ids come from the file.
  Vocab w = Vocab::FromTokens({"a", "[MASK]", "[UNK]", "[SEP]", "[CLS]", "[PAD]"});
  EXPECT_EQ(w.mask_id(), 1);
  EXPECT_EQ(w.unk_id(), 2);
  EXPECT_EQ(w.pad_id(), 5);
  EXPECT_EQ(w.Lookup("zz"), 2);
}

TEST(VocabTest, LoadSaveRoundTripAndErrors) {
  const std::string path = TempPath("vocab.txt");
  Vocab v = SmallVocab();
  ASSERT_TRUE(v.Save(path).ok());
  auto r = Vocab::Load(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens(), v.tokens());
  // CRLF line ends are tolerated.
  WriteFile(path, "[PAD]\r\nx\r\n");
  r = Vocab::Load(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Lookup("x"), 1);
  WriteFile(path, "");
  r = Vocab::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("empty"), std::string::npos);
  WriteFile(path, "a\nb\xff\n");
  r = Vocab::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":2:2"), std::string::npos) << r.status().message();
  r = Vocab::Load("/nonexistent/vocab.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

// The wrong file given as a vocabulary (no line breaks, or huge) is an
// error naming the file (and line) and the limit, found while reading: before
// the limits it was read whole, and a symlink to /dev/zero ended in
// std::bad_alloc.
TEST(VocabTest, OverlongLineAndOversizeFileAreErrors) {
  const std::string path = TempPath("vocab_limits.txt");
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove_at_end{path};
  WriteFile(path, std::string(2000, 'x'));  // one line, no line break
  auto r = Vocab::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(path + ":1: vocabulary line longer than the limit of 1024 bytes"),
            std::string::npos) << r.status().message();
  WriteFile(path, "[PAD]\n[UNK]\n" + std::string(1025, 'y') + "\nz\n");
  r = Vocab::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":3:"), std::string::npos) << r.status().message();
  // Exactly at the line limit is fine.
  WriteFile(path, "[PAD]\n" + std::string(1024, 'y') + "\n");
  r = Vocab::Load(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 2);
  // Over the file limit with short lines.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string line = std::string(1000, 'a') + "\n";
    for (int64_t n = 0; n <= Vocab::kMaxFileBytes; n += static_cast<int64_t>(line.size())) out << line;
  }
  r = Vocab::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ": vocabulary file larger than the limit of " +
                                      std::to_string(Vocab::kMaxFileBytes) + " bytes"),
            std::string::npos) << r.status().message();
}

TEST(VocabTest, BertChineseVocab) {
  const std::string path = SharedData() + "/vocab/vocab.txt";
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << path << " not present";
  auto r = Vocab::Load(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 21128);
  EXPECT_EQ(r->mask_id(), 103);
  EXPECT_EQ(r->cls_id(), 101);
  EXPECT_NE(r->Lookup("法"), kUnkId);
  EXPECT_EQ(r->Token(r->Lookup("法")), "法");
  // Upper-case Latin letters are absent (ReLM's data maps them to [UNK]).
  EXPECT_EQ(r->Lookup("“"), kUnkId);
  BertTokenizer tok(&r.value());
  auto ids = tok.Encode("法律规则，hello");
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids[0], r->Lookup("法"));
  EXPECT_EQ(ids[4], r->Lookup("，"));
}

TEST(VocabTest, BuildFromExamplesIsDeterministic) {
  const std::string path = TempPath("train.txt");
  // Counts: 法 4, 律 3, 国 2, 中 2 (tie: 中 U+4E2D before 国 U+56FD), ， 1.
  WriteFile(path, "法 律 法\t法 律 法\n中 国 ，\t中 国 律\n");
  auto r = Vocab::BuildFromExamples({path});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Vocab& v = *r;
  ASSERT_EQ(v.size(), kNumReservedIds + 5);
  EXPECT_EQ(v.Token(0), "[PAD]");
  EXPECT_EQ(v.Token(1), "[unused1]");
  EXPECT_EQ(v.Token(99), "[unused99]");
  EXPECT_EQ(v.Token(100), "[UNK]");
  EXPECT_EQ(v.Token(101), "[CLS]");
  EXPECT_EQ(v.Token(102), "[SEP]");
  EXPECT_EQ(v.Token(103), "[MASK]");
  EXPECT_EQ(v.Token(104), "法");
  EXPECT_EQ(v.Token(105), "律");
  EXPECT_EQ(v.Token(106), "中");
  EXPECT_EQ(v.Token(107), "国");
  EXPECT_EQ(v.Token(108), "，");
  auto r2 = Vocab::BuildFromExamples({path}, /*min_count=*/2);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->size(), kNumReservedIds + 4);
  WriteFile(path, "a\tb\n\xe4\xb8\tx\n");
  auto bad = Vocab::BuildFromExamples({path});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path + ":2:1"), std::string::npos) << bad.status().message();
  std::remove(path.c_str());
}

TEST(TokenizerTest, BasicTokenizer) {
  Vocab v = SmallVocab();
  BertTokenizer tok(&v);
  EXPECT_EQ(tok.BasicTokenize("  Hello,world!中国 \t x\x01y"),
            (std::vector<std::string>{"Hello", ",", "world", "!", "中", "国", "xy"}));
  BertTokenizer lower(&v, /*lower_case=*/true);
  EXPECT_EQ(lower.BasicTokenize("HeLLo"), (std::vector<std::string>{"hello"}));
  // Full-width punctuation and ideographic space split too.
  EXPECT_EQ(tok.BasicTokenize("中，国\u3000a"),
            (std::vector<std::string>{"中", "，", "国", "a"}));
}

TEST(TokenizerTest, WordPiece) {
  Vocab v = SmallVocab();
  BertTokenizer tok(&v);
  EXPECT_EQ(tok.Tokenize("unaffable"), (std::vector<std::string>{"un", "##aff", "##able"}));
  EXPECT_EQ(tok.Tokenize("unaffablex"), (std::vector<std::string>{"[UNK]"}));
  EXPECT_EQ(tok.Tokenize("ab Hello"), (std::vector<std::string>{"a", "##b", "Hello"}));
  EXPECT_EQ(tok.Encode("中国 hello!"), (std::vector<int32_t>{104, 105, 109, 111}));
  std::string longword(101, 'a');
  EXPECT_EQ(tok.Tokenize(longword), (std::vector<std::string>{"[UNK]"}));
}

}  // namespace
}  // namespace dgca
