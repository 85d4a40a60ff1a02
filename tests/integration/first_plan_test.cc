// The first plan on a fresh coordinator (issue: plan right on the first
// job), through the real programs: an agent whose node is the WSL2 fixture
// (two RTX 4090 over SYS, 64 MiB /dev/shm) registers, no job has ever run,
// and `dgca plan configs/wsl2-two-gpus-sys.yaml` predicts from the compute
// and link priors: at global_batch 128 one GPU, with both sides'
// arithmetic; at 2048 both GPUs, predicted above one, NCCL's P2P and SHM
// transports off.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/integration/harness.h"

namespace dgca {
namespace itest {
namespace {

std::string Source() { return Env("DGCA_SOURCE_DIR", "."); }

double Num(const JsonValue* v) {
  if (v == nullptr) return 0;  // proto3 JSON omits zeros
  if (v->is_number()) return v->number;
  if (v->is_string()) return std::atof(v->string.c_str());
  return 0;
}

std::string Reason(const JsonValue& plan, const std::string& name) {
  const JsonValue* ds = plan.Find("decisions");
  if (ds == nullptr) return "";
  for (const auto& d : ds->array)
    if (JsonStr(d.Find("name")) == name) return JsonStr(d.Find("reason"));
  return "";
}

TEST(FirstPlanTest, Wsl2BoxBeforeAnyJob) {
  if (!HavePrograms()) GTEST_SKIP() << "programs not built under " << BuildDir();
  const std::string root = Source() + "/tests/fixtures/wsl2-2x4090/root";
  const std::string config = Source() + "/configs/wsl2-two-gpus-sys.yaml";
  if (!Exists(root) || !Exists(config)) GTEST_SKIP() << "no fixture under " << Source();
  std::string dir = MakeTempDir("first-plan");
  mkdir((dir + "/state").c_str(), 0755);
  CoordinatorProcess coord(dir + "/state");
  ASSERT_TRUE(coord.Start("127.0.0.1:0", {"--no-local-agent"}));
  AgentProcess agent;
  ASSERT_TRUE(agent.Start(coord, "wsl2-box", dir + "/agent", WorkerBin(),
                          {"--topology-root", root}));
  ASSERT_TRUE(WaitForAgent(coord)) << agent.Log();

  const std::string text = ReadFile(config);
  ASSERT_NE(text.find("global_batch: 2048"), std::string::npos) << config;
  auto plan_at = [&](int global) {
    std::string t = text;
    t.replace(t.find("global_batch: 2048"), 18, "global_batch: " + std::to_string(global));
    const std::string spec = dir + "/wsl2-" + std::to_string(global) + ".yaml";
    WriteFile(spec, t);
    Result r = Dgca(coord, {"plan", spec, "--json"}, 60s);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r.out;
  };

  const std::string small = plan_at(128);
  auto s = Json(small);
  ASSERT_TRUE(s.ok()) << small;
  EXPECT_EQ(Num(s->Find("ranks")), 1) << small;
  EXPECT_EQ(JsonStr(s->Find("compute_source")), "prior") << small;
  EXPECT_GT(Num(s->Find("predicted_step_seconds")), 0) << small;
  const std::string why = Reason(*s, "resources.ranks");
  EXPECT_NE(why.find("2 ranks would be slower: 2 ranks: 64 samples in"), std::string::npos) << why;
  EXPECT_NE(why.find("1 rank: 128 samples in"), std::string::npos) << why;

  const std::string big = plan_at(2048);
  auto b = Json(big);
  ASSERT_TRUE(b.ok()) << big;
  EXPECT_EQ(Num(b->Find("ranks")), 2) << big;
  EXPECT_GT(Num(b->Find("predicted_samples_per_second")),
            Num(b->Find("predicted_single_rank_samples_per_second")))
      << big;
  const JsonValue* env = b->Find("env");
  ASSERT_NE(env, nullptr) << big;
  EXPECT_EQ(JsonStr(env->Find("NCCL_P2P_DISABLE")), "1") << big;
  EXPECT_EQ(JsonStr(env->Find("NCCL_SHM_DISABLE")), "1") << big;
  agent.Stop();
  coord.Stop();
}

}  // namespace
}  // namespace itest
}  // namespace dgca
