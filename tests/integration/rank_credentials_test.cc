// Scoped credentials with the real programs (issue 28, "one token does
// everything"): whoever holds the token of one job's rank, here read from
// the file the agent hands that rank, floods another job's rendezvous, the
// way anyone with the shared token once opened 4,095 namespaces until the
// next job's rendezvous failed RESOURCE_EXHAUSTED. Every call is refused,
// the victim job trains to the end, and the attacker's token works for
// nothing else either (the CLI's service).
//
// One agent whose probe reads tests/fixtures/cpu-only (8 CPUs), so that CPU
// admission lets the attacker's 1-rank job and the victim's 2 ranks run at
// once on a 2-core VM too; the ranks themselves are real processes here.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <thread>

#include "dgca/v1/rank.grpc.pb.h"
#include "proto/rpc/rpc_util.h"
#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string Source() { return Env("DGCA_SOURCE_DIR", "."); }

std::string WriteSpec(const std::string& dir, const std::string& name, int ranks, int steps) {
  std::string path = dir + "/" + name + ".yaml";
  WriteFile(path,
            "name: " + name + "\n"
            "model: {preset: tiny, hidden: 64}\n"
            "data:\n"
            "  train: " + SharedData() + "/ecspell/train_law.txt\n"
            "  max_seq_len: 32\n"
            "train: {steps: " + std::to_string(steps) + ", global_batch: 4, eval_every: 0,\n"
            "        checkpoint_every: 0, optimizer: {lr: 1.0e-3}}\n"
            "resources: {ranks: " + std::to_string(ranks) + ", device: cpu, threads_per_rank: 1}\n"
            "tuning: {mode: off}\n");
  return path;
}

// What the flood got back.
struct Tally {
  std::atomic<int> sent{0}, denied{0}, ok{0}, other{0};
  std::atomic<int> last_other_code{0};
};

void Count(Tally* t, const grpc::Status& st) {
  ++t->sent;
  if (st.ok()) {
    ++t->ok;
  } else if (st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    ++t->denied;
  } else {
    ++t->other;
    t->last_other_code = st.error_code();
  }
}

// One flooder: the calls a rank makes, for the victim at made-up attempts
// (each a new namespace under the old shared token) and for the attacker's
// own job at attempts it is not at.
void Flood(const std::string& address, const std::string& token, const std::string& victim,
           const std::string& own, int first_attempt, const std::atomic<bool>* stop, Tally* t) {
  auto stub = v1::RankService::NewStub(MakeChannel(address));
  for (int attempt = first_attempt; !stop->load(); attempt += 2) {
    auto ctx = [&] {
      auto c = std::make_unique<grpc::ClientContext>();
      AddAuth(c.get(), token);
      c->set_deadline(std::chrono::system_clock::now() + 10s);
      return c;
    };
    v1::StoreSetRequest set;
    set.set_job_id(victim);
    set.set_attempt(attempt);
    set.set_key("flood");
    set.set_value(std::string(1024, 'x'));
    v1::StoreSetResponse sr;
    Count(t, stub->StoreSet(ctx().get(), set, &sr));
    set.set_job_id(own);
    set.set_attempt(attempt + 1);  // never 0, the attacker's own attempt
    Count(t, stub->StoreSet(ctx().get(), set, &sr));
    v1::StoreAddRequest add;
    add.set_job_id(victim);
    add.set_attempt(0);
    add.set_key("gloo/counter");
    add.set_delta(1000);
    v1::StoreAddResponse ar;
    Count(t, stub->StoreAdd(ctx().get(), add, &ar));
    v1::GetAssignmentRequest ga;
    ga.set_job_id(victim);
    ga.set_attempt(0);
    v1::GetAssignmentResponse gr;
    Count(t, stub->GetAssignment(ctx().get(), ga, &gr));
  }
}

TEST(RankCredentialsTest, AnotherJobsRankTokenIsRefusedAndTheVictimSucceeds) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  if (!HaveSharedData()) GTEST_SKIP() << "no ECSpell data under " << SharedData();
  const std::string fixture = Source() + "/tests/fixtures/cpu-only/root";
  if (!Exists(fixture)) GTEST_SKIP() << "no fixture " << fixture;
  const std::string dir = MakeTempDir("rank-credentials");
  mkdir((dir + "/state").c_str(), 0700);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(coord, "node-a", dir + "/agent", WorkerBin(),
                          {"--topology-root", fixture}));
  ASSERT_TRUE(WaitForAgent(coord)) << agent.Log() << coord.Log();

  // The attacker: a rank of a long job, and the token file its agent wrote.
  Result a = Dgca(coord, {"submit", WriteSpec(dir, "attacker", 1, 1000000)});
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string attacker = Trim(a.out);
  JobView running = WaitForJob(coord, attacker, [](const JobView& v) {
    return v.state == "RUNNING" && v.step > 0;
  }, 120s);
  const std::string token_file = dir + "/agent/jobs/" + attacker + "/rank-0.0.token";
  struct stat st;
  ASSERT_EQ(stat(token_file.c_str(), &st), 0) << token_file;
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto token = ReadTokenFile(token_file);
  ASSERT_TRUE(token.ok()) << token.status();
  ASSERT_EQ(token->rfind("dgca-rank:" + attacker + ":0:", 0), 0u) << *token;

  // It is no user token: the CLI's service refuses it, saying which it takes.
  Result list = Exec({CliBin(), "--coordinator", coord.address(), "--token-file", token_file,
                      "list"});
  EXPECT_EQ(list.code, 3) << list.out << list.err;
  EXPECT_NE(list.err.find("this call takes the user token"), std::string::npos) << list.err;

  // The victim, flooded from its submission to its end (and at least past
  // the store's 4,096 namespaces).
  Result b = Dgca(coord, {"submit", WriteSpec(dir, "victim", 2, 40)});
  ASSERT_EQ(b.code, 0) << b.err;
  const std::string victim = Trim(b.out);
  std::atomic<bool> stop{false};
  Tally tally;
  std::vector<std::thread> flooders;
  for (int i = 0; i < 2; ++i) {
    flooders.emplace_back(Flood, coord.address(), *token, victim, attacker, i, &stop, &tally);
  }
  JobView done = WaitForJob(coord, victim, [&](const JobView& v) {
    return v.state == "SUCCEEDED" || v.state == "FAILED" || v.state == "CANCELLED";
  }, 300s);
  WaitUntil([&] { return tally.sent.load() >= 5000; }, 120s);
  stop = true;
  for (auto& t : flooders) t.join();

  EXPECT_EQ(done.state, "SUCCEEDED") << done.raw << coord.Log();
  EXPECT_EQ(done.step, 40) << done.raw;
  EXPECT_GE(tally.sent.load(), 5000);
  EXPECT_EQ(tally.ok.load(), 0);
  EXPECT_EQ(tally.other.load(), 0) << "last code " << tally.last_other_code.load();
  EXPECT_EQ(tally.denied.load(), tally.sent.load());
  std::printf("flood with job %s's rank token: %d calls, %d refused PERMISSION_DENIED, %d "
              "accepted; victim %s %s at step %lld\n",
              attacker.c_str(), tally.sent.load(), tally.denied.load(), tally.ok.load(),
              victim.c_str(), done.state.c_str(), static_cast<long long>(done.step));

  // The attacker's own job trained on through it all; once its rank has
  // ended, its token file is gone.
  JobView after = Status(coord, attacker);
  EXPECT_EQ(after.state, "RUNNING") << after.raw;
  EXPECT_GT(after.step, running.step) << after.raw;
  Result cancel = Dgca(coord, {"cancel", attacker});
  EXPECT_EQ(cancel.code, 0) << cancel.out << cancel.err;
  EXPECT_TRUE(WaitUntil([&] { return !Exists(token_file); }, 30s)) << token_file;
  KillJobLeftovers(after.pids, attacker);
}

}  // namespace
}  // namespace itest
}  // namespace dgca
