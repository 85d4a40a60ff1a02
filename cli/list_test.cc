// The parsing behind `dgca list --state/--since` and the one-line message.
#include "cli/list.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "cli/format.h"

namespace dgca {
namespace cli {
namespace {

TEST(ListOptionsTest, StatesInAnyCaseGroupedOrCommaSeparated) {
  auto s = ParseStates({"Running", "failed,CANCELLED"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, std::vector<v1::JobState>({v1::RUNNING, v1::FAILED, v1::CANCELLED}));
  auto active = ParseStates({"active"});
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(*active, std::vector<v1::JobState>({v1::PENDING, v1::PLANNING, v1::RUNNING}));
  auto ended = ParseStates({"ended"});
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->size(), 3u);
  EXPECT_TRUE(ParseStates({})->empty());
}

TEST(ListOptionsTest, ABadStateIsNamedWithTheValidOnes) {
  auto s = ParseStates({"running,done"});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "--state 'done': not a job state; valid: "
                                                      "pending, planning"))
      << s.status();
  EXPECT_FALSE(ParseStates({"job_state_unspecified"}).ok());
}

TEST(ListOptionsTest, SinceASpanOrAUtcTime) {
  const int64_t now = 1'800'000'000'000;
  EXPECT_EQ(*ParseSince("90s", now), now - 90'000);
  EXPECT_EQ(*ParseSince("30m", now), now - 1'800'000);
  EXPECT_EQ(*ParseSince("2h", now), now - 7'200'000);
  EXPECT_EQ(*ParseSince("7d", now), now - 7 * 86'400'000LL);
  EXPECT_EQ(*ParseSince("1w", now), now - 7 * 86'400'000LL);
  EXPECT_EQ(*ParseSince("2026-11-28", now), 1'795'824'000'000);  // 2026-11-28T00:00:00Z
  EXPECT_EQ(*ParseSince("2026-11-28T14:05", now), 1'795'824'000'000 + (14 * 60 + 5) * 60'000LL);
  EXPECT_EQ(*ParseSince("2026-11-28T14:05:09", now),
            1'795'824'000'000 + ((14 * 60 + 5) * 60 + 9) * 1000LL);
  for (const char* bad : {"", "yesterday", "5y", "-3h", "2026-13-01", "h", "99999999999999999d"}) {
    auto s = ParseSince(bad, now);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "expected a span back from now")) << bad;
  }
}

TEST(ListOptionsTest, OneLineCutsAtTheFirstNewlineOrTheWidthInCharacters) {
  EXPECT_EQ(OneLine("all 2 ranks exited 0"), "all 2 ranks exited 0");
  EXPECT_EQ(OneLine("rank 1 failed; last output:\nline a\nline b"), "rank 1 failed; last output:...");
  EXPECT_EQ(OneLine(std::string(100, 'x'), 10), std::string(10, 'x') + "...");
  // Three-byte characters are counted once and never split.
  EXPECT_EQ(OneLine("错误错误错误", 4), "错误错误...");
  EXPECT_EQ(OneLine("错误", 4), "错误");
}

}  // namespace
}  // namespace cli
}  // namespace dgca
