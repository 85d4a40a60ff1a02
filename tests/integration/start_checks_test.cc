// What the real programs say at start about a state dir, a job store or a
// CA file that would otherwise break them later or silently:
//  - a job store with damaged pages: dgca-coordinator exits 1 naming the
//    file and how to recover (it used to start, then fail `dgca list`);
//  - an empty dgca.db in a state dir used before: exit 1 unless --new-store
//    (it used to start an empty store, the job history gone without a word);
//  - a damaged row found after start: `dgca list` and `dgca status` fail
//    with the store's message (they failed with "No message returned for
//    unary request");
//  - a state dir or token open to other users: a warning with the chmod;
//  - `dgca-worker agent --tls-ca` naming no readable file: exit 2 at once
//    (it retried a TLS handshake for ever).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

class StartChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
    dir_ = MakeTempDir("start-checks");
    ASSERT_FALSE(dir_.empty());
    state_ = dir_ + "/state";
    ASSERT_EQ(mkdir(state_.c_str(), 0700), 0);
  }

  // dgca-coordinator on state_ until it exits (it should, at once).
  Result StartExpectingExit(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {CoordinatorBin(), "--listen", "127.0.0.1:0",
                                     "--metrics-listen", "", "--state-dir", state_,
                                     "--no-local-agent"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Exec(argv, 20s);
  }

  // Starts and stops a coordinator once, so that state_ holds a real store
  // (closed, its WAL checkpointed into dgca.db) and coordinator.json.
  void UseStateDirOnce(CoordinatorProcess* c) {
    ASSERT_TRUE(c->Start("127.0.0.1:0", {"--no-local-agent"}));
    c->Stop();
    struct stat st;
    ASSERT_EQ(stat((state_ + "/dgca.db").c_str(), &st), 0);
    ASSERT_GT(st.st_size, 0);
  }

  std::string dir_, state_;
};

TEST_F(StartChecksTest, DamagedStoreIsRefusedAtStartAndLeftAsItIs) {
  CoordinatorProcess c(state_);
  UseStateDirOnce(&c);
  const std::string db = state_ + "/dgca.db";
  std::string bytes = ReadFile(db);
  ASSERT_GT(bytes.size(), 3u * 4096);
  // Every b-tree page header after the first, XORed: 200 bytes at most.
  int flipped = 0;
  for (size_t p = 4096; p + 8 <= bytes.size() && flipped < 200; p += 4096) {
    for (size_t i = 0; i < 8 && flipped < 200; ++i, ++flipped) bytes[p + i] ^= 0x5a;
  }
  WriteFile(db, bytes);
  Result r = StartExpectingExit();
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("job database " + db + " is damaged (PRAGMA quick_check"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("sqlite3 " + db + " .dump"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--new-store"), std::string::npos) << r.err;
  EXPECT_EQ(ReadFile(db), bytes) << "the damaged store was written to";
}

TEST_F(StartChecksTest, EmptyStoreInAUsedStateDirNeedsNewStore) {
  CoordinatorProcess c(state_);
  UseStateDirOnce(&c);
  const std::string db = state_ + "/dgca.db";
  WriteFile(db, "");
  unlink((db + "-wal").c_str());
  unlink((db + "-shm").c_str());
  Result r = StartExpectingExit();
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("job database " + db + " is empty (0 bytes), but its state dir has been used "
                       "before (" + state_ + "/coordinator.json exists"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("start with --new-store"), std::string::npos) << r.err;
  struct stat st;
  ASSERT_EQ(stat(db.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "a refused start wrote a store";
  // The embedded agent's job folders (rank logs) show the use as well.
  unlink((state_ + "/coordinator.json").c_str());
  ASSERT_EQ(mkdir((state_ + "/jobs").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((state_ + "/jobs/j-000001-abcd").c_str(), 0700), 0);
  Result by_jobs = StartExpectingExit();
  EXPECT_EQ(by_jobs.code, 1) << by_jobs.out << by_jobs.err;
  EXPECT_NE(by_jobs.err.find(state_ + "/jobs holds job folders (j-000001-abcd, ...)"),
            std::string::npos)
      << by_jobs.err;
  // On purpose: an empty store, said in the log.
  ASSERT_TRUE(c.Start("127.0.0.1:0", {"--no-local-agent", "--new-store"}));
  EXPECT_NE(c.Log().find("starting an empty job store in " + state_ + " (--new-store)"),
            std::string::npos)
      << c.Log();
  Result list = Dgca(c, {"list"});
  EXPECT_EQ(list.code, 0) << list.err;
}

// Bytes flipped inside a job's text pass quick_check; the coordinator
// starts (the job is not active), and the calls that read the row fail with
// the store's DATA_LOSS message instead of a reply the CLI cannot parse.
TEST_F(StartChecksTest, DamagedJobRowFailsListAndStatusWithTheStoresMessage) {
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  CoordinatorProcess c(state_);
  ASSERT_TRUE(c.Start("127.0.0.1:0", {"--no-local-agent"}));
  const std::string marker = "damagedrowname";
  Result sub = Dgca(c, {"submit", WriteTinySpec(dir_, marker, 3)});
  ASSERT_EQ(sub.code, 0) << sub.out << sub.err;
  Result ids = Dgca(c, {"list", "--json"});
  ASSERT_EQ(ids.code, 0) << ids.err;
  const size_t at = ids.out.find("\"j-");
  ASSERT_NE(at, std::string::npos) << ids.out;
  const std::string job = ids.out.substr(at + 1, ids.out.find('"', at + 1) - at - 1);
  c.Stop();  // stop-jobs: the PENDING job ends FAILED, so recovery does not read it
  const std::string db = state_ + "/dgca.db";
  std::string bytes = ReadFile(db);
  int hits = 0;
  for (size_t p = bytes.find(marker); p != std::string::npos; p = bytes.find(marker, p + 1)) {
    bytes[p] = '\xff';
    ++hits;
  }
  ASSERT_GT(hits, 0) << "the job's name is not in " << db;
  WriteFile(db, bytes);
  ASSERT_TRUE(c.Start("127.0.0.1:0", {"--no-local-agent"}));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"list"}, std::vector<std::string>{"status", job}}) {
    Result r = Dgca(c, args);
    EXPECT_EQ(r.code, 1) << args[0] << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("job database " + db + " is damaged: job " + job), std::string::npos)
        << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("DELETE FROM jobs WHERE id='"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("No message returned"), std::string::npos) << r.err;
  }
}

TEST_F(StartChecksTest, StateDirAndTokenOpenToOthersAreWarnedAbout) {
  ASSERT_EQ(chmod(state_.c_str(), 0755), 0);
  WriteFile(state_ + "/token", "0123456789abcdef\n");
  ASSERT_EQ(chmod((state_ + "/token").c_str(), 0644), 0);
  CoordinatorProcess c(state_);
  ASSERT_TRUE(c.Start("127.0.0.1:0", {"--no-local-agent"}));
  c.Stop();
  const std::string log = c.Log();
  EXPECT_NE(log.find("WARNING: state dir " + state_ + " has mode 0755"), std::string::npos) << log;
  EXPECT_NE(log.find("`chmod 700 " + state_ + "` fixes it"), std::string::npos) << log;
  EXPECT_NE(log.find("WARNING: token file " + state_ + "/token has mode 0644"), std::string::npos)
      << log;
  EXPECT_NE(log.find("`chmod 600 " + state_ + "/token` fixes it"), std::string::npos) << log;
  // Left as they were (a group may have been let in on purpose) ...
  struct stat st;
  ASSERT_EQ(stat(state_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  // ... and quiet once fixed.
  ASSERT_EQ(chmod(state_.c_str(), 0700), 0);
  ASSERT_EQ(chmod((state_ + "/token").c_str(), 0600), 0);
  ASSERT_TRUE(c.Start("127.0.0.1:0", {"--no-local-agent"}));
  c.Stop();
  const std::string second = ReadFile(state_ + "/coordinator-2.log");
  EXPECT_EQ(second.find("WARNING"), std::string::npos) << second;
}

TEST_F(StartChecksTest, AgentNamesAnUnreadableTlsCaAndExits2) {
  WriteFile(dir_ + "/token", "0123456789abcdef\n");
  Result r = Exec({WorkerBin(), "agent", "--coordinator", "127.0.0.1:1", "--token-file",
                   dir_ + "/token", "--state-dir", dir_ + "/agent", "--tls-ca",
                   "/nonexistent-dgca/ca.pem"},
                  15s);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("cannot read --tls-ca /nonexistent-dgca/ca.pem: No such file or directory"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace itest
}  // namespace dgca
