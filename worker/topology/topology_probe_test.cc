#include "worker/topology/probe.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace dgca {
namespace {

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("DGCA_SOURCE_DIR");
  std::string base = src ? src : ".";
  return base + "/tests/fixtures/" + name + "/root";
}

TEST(TopologyProbe, CpuOnlyNode) {
  ProbeOptions opt;
  opt.root = Fixture("cpu-only");
  opt.use_nvml = false;
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->cpu_count(), 8);
  EXPECT_EQ(t->memory_bytes(), 32768000ull * 1024);
  EXPECT_EQ(t->numa_nodes(), 1);
  EXPECT_FALSE(t->wsl2());
  EXPECT_EQ(t->shm_total_bytes(), 16777216000ull);
  EXPECT_EQ(t->hostname(), "cpu-node");
  EXPECT_EQ(t->gpus_size(), 0);
  EXPECT_EQ(t->cgroup_cpu_limit(), 0);
}

TEST(TopologyProbe, MissingRootIsAnError) {
  ProbeOptions opt;
  opt.root = "/nonexistent/dgca/root";
  auto t = ProbeTopology(opt);
  EXPECT_FALSE(t.ok());
}

TEST(TopologyProbe, RealMachineDoesNotCrash) {
  ProbeOptions opt;
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->cpu_count(), 0);
  EXPECT_GT(t->memory_bytes(), 0u);
}

}  // namespace
}  // namespace dgca
