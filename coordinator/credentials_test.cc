#include "coordinator/credentials.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dgca {
namespace {

std::string TempDir() {
  std::string t = absl::StrCat(testing::TempDir(), "/credentials-XXXXXX");
  return mkdtemp(t.data());
}

Credentials Sample() { return Credentials("user-secret", "agent-secret", "rank-key"); }

TEST(CredentialsTest, EachTokenIsItsRole) {
  const Credentials c = Sample();
  EXPECT_EQ(c.Identify("user-secret").role, Role::kUser);
  EXPECT_EQ(c.Identify("agent-secret").role, Role::kAgent);
  const Caller r = c.Identify(c.RankToken("j-000001-ab12", 3));
  EXPECT_EQ(r.role, Role::kRank);
  EXPECT_EQ(r.job_id, "j-000001-ab12");
  EXPECT_EQ(r.attempt, 3);
  EXPECT_EQ(r.Describe(), "the rank token of job j-000001-ab12 attempt 3");
  for (const char* t : {"", "user", "user-secret ", "agent-secre", "dgca-rank:"}) {
    EXPECT_EQ(c.Identify(t).role, Role::kNone) << t;
  }
}

TEST(CredentialsTest, ARankTokenCannotBeReworded) {
  const Credentials c = Sample();
  const std::string good = c.RankToken("job-a", 2);
  ASSERT_EQ(good.rfind("dgca-rank:job-a:2:", 0), 0u) << good;
  const std::string mac = good.substr(std::string("dgca-rank:job-a:2:").size());
  EXPECT_EQ(mac.size(), 64u);  // hex SHA-256
  // Another job or attempt under the same MAC; the same attempt spelt
  // differently; a MAC altered or cut; a key of another state dir.
  for (const std::string& t :
       {"dgca-rank:job-b:2:" + mac, "dgca-rank:job-a:3:" + mac, "dgca-rank:job-a:02:" + mac,
        "dgca-rank:job-a:+2:" + mac, "dgca-rank:job-a:-2:" + mac, "dgca-rank:job-a:2:" + mac + "0",
        "dgca-rank:job-a:2:" + mac.substr(1), "dgca-rank:job/a:2:" + mac,
        "dgca-rank:job-a:2:" + std::string(64, '0'),
        Credentials("user-secret", "agent-secret", "other key").RankToken("job-a", 2)}) {
    EXPECT_EQ(c.Identify(t).role, Role::kNone) << t;
  }
  // Attempts are distinct tokens, jobs too.
  EXPECT_NE(c.RankToken("job-a", 2), c.RankToken("job-a", 3));
  EXPECT_NE(c.RankToken("job-a", 2), c.RankToken("job-b", 2));
}

TEST(CredentialsTest, RefusalsNameWhatTheCallTakes) {
  const Credentials c = Sample();
  EXPECT_TRUE(RequireRole(c.Identify("user-secret"), Role::kUser).ok());
  absl::Status none = RequireRole(c.Identify("nope"), Role::kUser);
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  absl::Status agent_as_user = RequireRole(c.Identify("agent-secret"), Role::kUser);
  EXPECT_EQ(agent_as_user.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(agent_as_user.message().find("STATE_DIR/token"), std::string::npos) << agent_as_user;
  EXPECT_NE(agent_as_user.message().find("it was given an agent token"), std::string::npos);
  absl::Status user_as_agent = RequireRole(c.Identify("user-secret"), Role::kAgent);
  EXPECT_EQ(user_as_agent.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(user_as_agent.message().find("STATE_DIR/agent-token"), std::string::npos);

  const Caller rank = c.Identify(c.RankToken("job-a", 1));
  EXPECT_TRUE(RequireRankOf(rank, "job-a", 1).ok());
  absl::Status other = RequireRankOf(rank, "job-b", 1);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find("not for job job-b attempt 1"), std::string::npos) << other;
  EXPECT_EQ(RequireRankOf(rank, "job-a", 0).code(), absl::StatusCode::kPermissionDenied);
  // A request's id that cannot name a job is not echoed.
  absl::Status odd = RequireRankOf(rank, std::string(300, 'x'), 1);
  EXPECT_LT(odd.message().size(), 200u) << odd;
  EXPECT_EQ(RequireRankOf(c.Identify("user-secret"), "job-a", 1).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(CredentialsTest, LoadMakesEachFileOnceAndKeepsIt) {
  const std::string dir = TempDir();
  auto first = Credentials::Load(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const char* f : {kUserTokenFile, kAgentTokenFile, kRankKeyFile}) {
    struct stat st;
    ASSERT_EQ(stat(absl::StrCat(dir, "/", f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600) << f;
  }
  EXPECT_NE(first->user_token(), first->agent_token());
  auto again = Credentials::Load(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->user_token(), first->user_token());
  EXPECT_EQ(again->agent_token(), first->agent_token());
  // The same key: a restarted coordinator accepts its ranks' tokens.
  EXPECT_EQ(again->Identify(first->RankToken("job-a", 0)).role, Role::kRank);
}

TEST(CredentialsTest, ACopiedOverAgentTokenIsRefused) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/token") << "the-same-long-token\n";
  std::ofstream(dir + "/agent-token") << "the-same-long-token\n";
  auto c = Credentials::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find(dir + "/agent-token"), std::string::npos) << c.status();
}

TEST(CredentialsTest, ATokenFileCutShortIsRefused) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/agent-token") << "0123456\n";  // 7 characters
  auto c = Credentials::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find(dir + "/agent-token holds 7 characters; a token needs at "
                                      "least 16"),
            std::string::npos)
      << c.status();
  // Nothing half-made beside it.
  EXPECT_FALSE(std::ifstream(dir + "/token.tmp." + std::to_string(getpid())).good());
}

TEST(CredentialsTest, AnEmptyKeyVerifiesNoRankToken) {
  const Credentials c("user-secret", "agent-secret", "");
  EXPECT_EQ(c.Identify(c.RankToken("job-a", 0)).role, Role::kNone);
}

TEST(CredentialsTest, AnUnreadableFileIsNamed) {
  const std::string dir = TempDir();
  ASSERT_EQ(mkdir((dir + "/rank-key").c_str(), 0700), 0);  // a directory in its place
  auto c = Credentials::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(dir + "/rank-key"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace dgca
