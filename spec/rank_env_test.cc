#include "spec/rank_env.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace dgca {
namespace {

// The names the issue found let through, and their kind of harm.
TEST(RankEnv, RefusesWhatLoadsCodeOrWritesFiles) {
  for (const char* n : {"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
                        "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN", "NCCL_RMA_PLUGIN",
                        "CUDA_INJECTION64_PATH", "OMP_TOOL_LIBRARIES"}) {
    EXPECT_EQ(RankEnvRefusal(n).rfind("loads a library into the rank", 0), 0u) << n;
  }
  for (const char* n : {"NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE",
                        "CUDA_COREDUMP_FILE", "CUDA_LOG_FILE", "OMP_TOOL_VERBOSE_INIT"}) {
    EXPECT_EQ(RankEnvRefusal(n).rfind("writes a file on the node", 0), 0u) << n;
  }
  EXPECT_FALSE(RankEnvRefusal("NCCL_CONF_FILE").empty());
  EXPECT_FALSE(RankEnvRefusal("CUDA_CACHE_PATH").empty());
}

// Plugins and dumps a later NCCL adds follow NCCL's naming: refused too.
TEST(RankEnv, RefusesNcclPluginsAndDumpsByTheirNaming) {
  EXPECT_EQ(RankEnvRefusal("NCCL_FUTURE_PLUGIN").rfind("loads a library into the rank", 0), 0u);
  EXPECT_EQ(RankEnvRefusal("NCCL_FUTURE_DUMP_FILE").rfind("writes a file on the node", 0), 0u);
  EXPECT_EQ(RankEnvRefusal("NCCL_FUTURE_DUMP_DIR").rfind("writes a file on the node", 0), 0u);
  EXPECT_TRUE(RankEnvRefusal("CUDA_SOME_PLUGIN").empty());     // not NCCL's naming
}

// Tuning and read-only variables stay allowed; names are exact.
TEST(RankEnv, LeavesTheRestAlone) {
  for (const char* n : {"NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "NCCL_TOPO_FILE",
                        "NCCL_GRAPH_FILE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "OMP_TOOL",
                        "nccl_net_plugin", "NCCL_NET_PLUGIN_X", ""}) {
    EXPECT_TRUE(RankEnvRefusal(n).empty()) << n;
  }
}

// Every entry is reachable (a prefix comm.env allows), listed once, and
// says its kind of harm first.
TEST(RankEnv, ListIsWellFormed) {
  std::set<std::string> seen;
  for (const RefusedRankEnv& r : RefusedRankEnvs()) {
    const std::string name(r.name), why(r.why);
    EXPECT_TRUE(seen.insert(name).second) << name << " listed twice";
    EXPECT_TRUE(name.rfind("NCCL_", 0) == 0 || name.rfind("CUDA_", 0) == 0 ||
                name.rfind("OMP_", 0) == 0)
        << name;
    EXPECT_TRUE(why.rfind("loads ", 0) == 0 || why.rfind("writes ", 0) == 0 ||
                why.rfind("reads ", 0) == 0)
        << name << ": " << why;
  }
  EXPECT_GE(seen.size(), 20u);
}

}  // namespace
}  // namespace dgca
