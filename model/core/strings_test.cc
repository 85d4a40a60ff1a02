#include "model/core/strings.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace dgca {
namespace {

TEST(Strings, EndsWith) {
  EXPECT_TRUE(EndsWith("Unihan_Readings.txt.bz2", ".bz2"));
  EXPECT_TRUE(EndsWith("x", ""));
  EXPECT_FALSE(EndsWith("bz2", ".bz2"));
  EXPECT_FALSE(EndsWith("a.bz2.txt", ".bz2"));
}

TEST(Strings, ShellQuoteSurvivesTheShell) {
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  // What the shell makes of it is the original word, quotes and $ included.
  const std::string word = "it's $HOME `x` \"q\"";
  FILE* f = popen(("printf %s " + ShellQuote(word)).c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  pclose(f);
  EXPECT_EQ(std::string(buf, n), word);
}

TEST(Strings, TextTableAlignsColumns) {
  EXPECT_EQ(TextTable({{"A", "BB"}, {"ccc", "d"}}), "A    BB\nccc  d\n");
  // A multi-line cell (a failed job's message in `dgca list`) stays on its row.
  EXPECT_EQ(TextTable({{"JOB", "MESSAGE"}, {"j-1", "rank 0 failed:\r\nno TAB\n"}, {"j-2", "ok"}}),
            "JOB  MESSAGE\nj-1  rank 0 failed: / no TAB\nj-2  ok\n");
}

}  // namespace
}  // namespace dgca
