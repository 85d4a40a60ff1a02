// The parsing behind `dgca list --state/--since` and the one-line message.
#include "cli/list.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
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

v1::Job Ended(const std::string& id, v1::JobState state, int64_t start, int64_t end) {
  v1::Job j;
  j.set_id(id);
  j.set_name("two-ranks");
  j.set_state(state);
  j.set_step(40);
  j.set_total_steps(40);
  j.set_loss(4.1913);
  j.set_started_unix_ms(start);
  j.set_ended_unix_ms(end);
  j.mutable_exit()->set_rank(-1);
  j.mutable_exit()->set_failed(state != v1::SUCCEEDED);
  return j;
}

// The columns of an ended, a failed and a running job; the message is cut
// so the table stays within kListWidth columns.
TEST(ListTableTest, EndedFailedAndRunningJobsFillTheirColumns) {
  google::protobuf::RepeatedPtrField<v1::Job> jobs;
  const int64_t t0 = 1'795'876'000'000;  // 2026-11-28T14:26:40Z
  v1::Job ok = Ended("j-000001-aaaa", v1::SUCCEEDED, t0, t0 + 187'000);
  ok.set_final_loss(4.03671);
  ok.set_final_loss_steps(10);
  ok.set_final_loss_ranks(2);
  ok.set_peak_memory_bytes(412.0 * 1024 * 1024);
  ok.set_message("all 2 ranks exited 0");
  *jobs.Add() = ok;
  v1::Job killed = Ended("j-000002-bbbb", v1::FAILED, t0, t0 + 5'000);
  killed.mutable_exit()->set_rank(1);
  killed.mutable_exit()->set_signal(9);
  killed.set_peak_memory_bytes(1.5 * 1024 * 1024 * 1024);
  killed.set_message(std::string(200, 'x'));
  *jobs.Add() = killed;
  v1::Job code = Ended("j-000003-cccc", v1::FAILED, t0, t0 + 1'000);
  code.mutable_exit()->set_rank(0);
  code.mutable_exit()->set_code(3);
  *jobs.Add() = code;
  v1::Job running = Ended("j-000004-dddd", v1::RUNNING, t0, 0);
  running.clear_exit();
  running.set_step(12);
  *jobs.Add() = running;
  v1::Job pending;
  pending.set_id("j-000005-eeee");
  pending.set_state(v1::PENDING);
  *jobs.Add() = pending;

  const std::string t = ListTable(jobs, t0 + 65'000);
  const std::vector<std::string> lines = absl::StrSplit(t, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 7u) << t;  // header, 5 jobs, the legend
  EXPECT_TRUE(absl::StartsWith(lines[0], "JOB")) << t;
  for (const char* col : {"LOSS", "START", "END", "ELAPSED", "EXIT", "PEAK MEM", "MESSAGE"})
    EXPECT_NE(lines[0].find(col), std::string::npos) << col << "\n" << t;
  for (const std::string& line : lines) EXPECT_LE(line.size(), kListWidth) << line;
  // Succeeded: the final loss, its times, exit 0, the peak in MiB.
  for (const char* cell : {"4.0367 ", " 14:26 ", " 14:29 ", "3m07s", " 0 ", "412 MiB",
                           "all 2 ranks"})
    EXPECT_NE(lines[1].find(cell), std::string::npos) << cell << "\n" << t;
  // Killed: the signal and the rank; the long message cut with "...".
  EXPECT_NE(lines[2].find("SIGKILL (rank 1)"), std::string::npos) << t;
  EXPECT_NE(lines[2].find("1.5 GiB"), std::string::npos) << t;
  EXPECT_NE(lines[2].find("xxx..."), std::string::npos) << t;
  EXPECT_NE(lines[3].find("3 (rank 0)"), std::string::npos) << t;
  // No final loss: the last step's, marked, and the legend says so.
  EXPECT_NE(lines[2].find("4.1913*"), std::string::npos) << t;
  EXPECT_NE(lines[4].find("4.1913*"), std::string::npos) << t;
  EXPECT_NE(lines[4].find("1m05s"), std::string::npos) << t;  // running: start to now
  EXPECT_EQ(lines[6], kLastStepMark);
  // Pending: nothing to say but its state.
  EXPECT_NE(lines[5].find("PENDING"), std::string::npos) << t;
  EXPECT_EQ(lines[5].find("14:2"), std::string::npos) << t;
  // Two days on, the times need their dates.
  const std::string later = ListTable(jobs, t0 + 2 * 86'400'000LL);
  EXPECT_NE(later.find(" 11-28 14:26 "), std::string::npos) << later;
  EXPECT_EQ(ShortTime(t0, t0 + 65'000), "14:26");
  EXPECT_EQ(ShortTime(t0, t0 + 2 * 86'400'000LL), "11-28 14:26");
  EXPECT_EQ(ShortTime(0, t0), "-");
}

TEST(ListTableTest, CellFormats) {
  EXPECT_EQ(HumanBytes(0), "-");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(980 * 1024.0), "980 KiB");
  EXPECT_EQ(HumanBytes(412 * 1048576.0), "412 MiB");
  EXPECT_EQ(HumanBytes(1.5 * 1073741824.0), "1.5 GiB");
  EXPECT_EQ(HumanBytes(80 * 1073741824.0), "80 GiB");
  EXPECT_EQ(SignalAbbrev(9), "SIGKILL");
  EXPECT_EQ(SignalAbbrev(11), "SIGSEGV");
  EXPECT_EQ(SignalAbbrev(40), "signal 40");
  v1::Job j;
  EXPECT_EQ(ExitCell(j), "-");  // active
  j.mutable_exit()->set_rank(-1);
  EXPECT_EQ(ExitCell(j), "0");
  j.mutable_exit()->set_failed(true);
  EXPECT_EQ(ExitCell(j), "-");  // cancelled, or failed without a rank failing
  j.mutable_exit()->set_rank(2);
  j.mutable_exit()->set_status_unknown(true);
  EXPECT_EQ(ExitCell(j), "unknown (rank 2)");
  EXPECT_EQ(LossCell(j), "-");
  EXPECT_EQ(StatusLossLine(j), "");
  j.set_step(5);
  j.set_loss(2.5);
  EXPECT_EQ(LossCell(j), "2.5000*");
  EXPECT_NE(StatusLossLine(j).find("2.5000 at step 5: the last step's"), std::string::npos);
  j.set_final_loss(2.25);
  j.set_final_loss_steps(10);
  j.set_final_loss_ranks(2);
  EXPECT_EQ(LossCell(j), "2.2500");
  EXPECT_EQ(StatusLossLine(j), "final 2.2500 (mean of the last 10 steps over 2 ranks)");
}

}  // namespace
}  // namespace cli
}  // namespace dgca
