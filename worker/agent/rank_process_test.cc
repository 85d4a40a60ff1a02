#include "worker/agent/rank_process.h"

#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include "model/core/core_test_util.h"

namespace dgca {
namespace {

using namespace std::chrono_literals;

// A failed rank's log tail: its last lines, and nothing (not a crash) for
// an empty log or a directory in its place; both once took the coordinator
// down (std::out_of_range from substr).
TEST(LogTail, LastLinesAndNothingForEmptyOrNonFiles) {
  const std::string dir = testutil::MakeTempDir("log-tail");
  const std::string log = dir + "/rank-1.log";
  { std::ofstream(log) << "one\ntwo\nthree\n\n"; }
  EXPECT_EQ(LogTail(log, 2), "two\nthree");
  EXPECT_EQ(LogTail(log, 1), "three");
  EXPECT_EQ(LogTail(log, 10), "one\ntwo\nthree");
  { std::ofstream(log) << "no newline"; }
  EXPECT_EQ(LogTail(log, 3), "no newline");
  { std::ofstream(log) << "\nafter a blank first line"; }
  EXPECT_EQ(LogTail(log, 1), "after a blank first line");
  { std::ofstream(log, std::ios::trunc); }
  EXPECT_EQ(LogTail(log, 20), "");
  { std::ofstream(log) << "\n\n\n"; }
  EXPECT_EQ(LogTail(log, 20), "");
  const std::string as_dir = dir + "/rank-2.log";
  ASSERT_EQ(mkdir(as_dir.c_str(), 0755), 0);
  EXPECT_EQ(LogTail(as_dir, 20), "");
  EXPECT_EQ(LogTail(dir + "/missing.log", 20), "");
}

TEST(ExitRecord, RoundTripsForItsAttemptOnly) {
  const std::string dir = testutil::MakeTempDir("rank_process_test");
  ASSERT_FALSE(dir.empty());
  const std::string path = ExitRecordPath(dir, 3);
  EXPECT_EQ(path, dir + "/rank-3.exit");
  EXPECT_FALSE(ReadExitRecord(path, 0).has_value());  // missing
  ASSERT_TRUE(WriteExitRecord(path, 2, 5).ok());
  EXPECT_EQ(ReadExitRecord(path, 2), std::optional<int>(5));
  EXPECT_FALSE(ReadExitRecord(path, 1).has_value());  // another attempt's record
  ASSERT_TRUE(WriteExitRecord(path, 4, 0).ok());      // replaced whole
  EXPECT_EQ(ReadExitRecord(path, 4), std::optional<int>(0));
  for (const char* bad : {"", "attempt 4", "attempt 4 code", "attempt x code 1",
                          "attempt 4 code 1 extra", "code 1 attempt 4"}) {
    std::ofstream(path, std::ios::trunc) << bad << "\n";
    EXPECT_FALSE(ReadExitRecord(path, 4).has_value()) << bad;
  }
  absl::Status s = WriteExitRecord(dir + "/no/such/dir/rank-0.exit", 0, 1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir + "/no/such/dir/rank-0.exit"), std::string::npos) << s;
}

// Token files a minute old go; fresh ones (a rank about to read its own)
// and other files stay.
TEST(SweepRankTokens, RemovesOnlyTokenFilesPastTheirAge) {
  const std::string dir = testutil::MakeTempDir("token-sweep");
  ASSERT_EQ(mkdir((dir + "/jobs").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir + "/jobs/j-1").c_str(), 0755), 0);
  auto make = [&](const std::string& name, int age_s) {
    const std::string path = dir + "/jobs/j-1/" + name;
    std::ofstream(path) << "x\n";
    const time_t t = time(nullptr) - age_s;
    struct timespec times[2] = {{t, 0}, {t, 0}};
    EXPECT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
    return path;
  };
  const std::string old_token = make("rank-0.0.token", 120);
  const std::string old_tmp = make("rank-1.2.token.tmp", 120);
  const std::string fresh = make("rank-1.3.token", 5);
  const std::string log = make("rank-0.log", 120);
  const std::string exit_record = make("rank-0.exit", 120);
  EXPECT_EQ(SweepRankTokens(dir, kRankTokenMaxAgeSeconds), 2);
  EXPECT_FALSE(std::ifstream(old_token).good());
  EXPECT_FALSE(std::ifstream(old_tmp).good());
  EXPECT_TRUE(std::ifstream(fresh).good());
  EXPECT_TRUE(std::ifstream(log).good());
  EXPECT_TRUE(std::ifstream(exit_record).good());
  EXPECT_EQ(SweepRankTokens(dir + "/none", 60), 0);  // no jobs folder: nothing
}

TEST(RankIdEntry, NamesJobRankAndAttempt) {
  EXPECT_EQ(RankId("j-000001-abcd", 2, 7), "j-000001-abcd/2/7");
  EXPECT_EQ(RankIdEntry("j-000001-abcd", 2, 7), "DGCA_RANK_ID=j-000001-abcd/2/7");
}

TEST(ProcessStartTime, LiveProcessesOnlyAndStable) {
  auto self = ProcessStartTime(getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(ProcessStartTime(getpid()), self);
  EXPECT_FALSE(ProcessStartTime(0).has_value());
  EXPECT_FALSE(ProcessStartTime(-5).has_value());
  // A zombie (exited, not yet reaped) counts as gone.
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  bool gone = false;
  for (int i = 0; i < 250 && !gone; ++i) {
    gone = !ProcessStartTime(child).has_value();
    if (!gone) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(kill(child, 0), 0);  // still there as a zombie
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(ProcessStartTime(child).has_value());
}

TEST(ProcessEnvironHas, ExactEntriesOfThatProcess) {
  pid_t child = fork();
  if (child == 0) {
    char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
    char* const envp[] = {const_cast<char*>("DGCA_RANK_ID=j/0/1"),
                          const_cast<char*>("OTHER=x"), nullptr};
    execve("/bin/sleep", argv, envp);
    _exit(127);
  }
  ASSERT_GT(child, 0);
  bool seen = false;
  for (int i = 0; i < 250 && !seen; ++i) {
    seen = ProcessEnvironHas(child, "DGCA_RANK_ID=j/0/1");  // after the exec
    if (!seen) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(ProcessEnvironHas(child, "OTHER=x"));
  EXPECT_FALSE(ProcessEnvironHas(child, "DGCA_RANK_ID=j/0/10"));
  EXPECT_FALSE(ProcessEnvironHas(child, "DGCA_RANK_ID=j/0/"));
  EXPECT_FALSE(ProcessEnvironHas(child, "OTHER"));
  EXPECT_FALSE(ProcessEnvironHas(0, "OTHER=x"));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(ProcessEnvironHas(child, "OTHER=x"));
}

// A rank whose pid was never recorded is found by its DGCA_RANK_ID.
TEST(FindProcessWithEnviron, FindsTheProcessCarryingTheEntry) {
  const std::string entry = "DGCA_RANK_ID=find-" + std::to_string(getpid()) + "/0/0";
  EXPECT_EQ(FindProcessWithEnviron(entry), 0);
  pid_t child = fork();
  if (child == 0) {
    char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("30"), nullptr};
    char* const envp[] = {const_cast<char*>(entry.c_str()), nullptr};
    execve("/bin/sleep", argv, envp);
    _exit(127);
  }
  ASSERT_GT(child, 0);
  pid_t found = 0;
  for (int i = 0; i < 250 && found == 0; ++i) {
    found = FindProcessWithEnviron(entry);
    if (found == 0) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(found, child);
  EXPECT_EQ(FindProcessWithEnviron(entry + "1"), 0);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(FindProcessWithEnviron(entry), 0);
}

}  // namespace
}  // namespace dgca
