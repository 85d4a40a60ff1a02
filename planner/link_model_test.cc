// The link model's prior per topology and its measurements
// (planner/link_model.h).
#include "planner/link_model.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dgca {
namespace {

// A node with `gpus` GPUs whose every pair is on `path`.
v1::Topology Node(const std::string& name, int gpus, const std::string& path) {
  v1::Topology t;
  t.set_node(name);
  t.set_cpu_count(16);
  for (int i = 0; i < gpus; ++i) {
    v1::Gpu* g = t.add_gpus();
    g->set_index(i);
    g->set_link_speed("16.0 GT/s PCIe");
    g->set_link_width(16);
  }
  for (int a = 0; a < gpus; ++a)
    for (int b = a + 1; b < gpus; ++b) {
      v1::GpuLink* l = t.add_links();
      l->set_a(a);
      l->set_b(b);
      l->set_path(path);
    }
  return t;
}

constexpr double kPcie4x16 = 16e9 * 16 * (128.0 / 130.0) / 8.0;

TEST(LinkModel, PathRankOrdersNvlinkBestAndSysWorst) {
  EXPECT_EQ(PathRank("NV12"), 0);
  EXPECT_LT(PathRank("PIX"), PathRank("PXB"));
  EXPECT_LT(PathRank("PXB"), PathRank("PHB"));
  EXPECT_LT(PathRank("PHB"), PathRank("NODE"));
  EXPECT_LT(PathRank("NODE"), PathRank("SYS"));
  EXPECT_LT(PathRank("SYS"), PathRank("X?"));
}

TEST(LinkModel, PcieBandwidthFromSpeedAndWidth) {
  v1::Gpu g;
  EXPECT_DOUBLE_EQ(PcieBytesPerSecond(g), kPcie4x16);  // unknown: 16 GT/s x16
  g.set_link_speed("8.0 GT/s PCIe");
  g.set_link_width(8);
  EXPECT_DOUBLE_EQ(PcieBytesPerSecond(g), 8e9 * 8 * (128.0 / 130.0) / 8.0);
}

TEST(LinkModel, RanksPerNodeOnePerGpuSkippingGpulessNodes) {
  std::vector<v1::Topology> nodes = {Node("cpu-only", 0, ""), Node("a", 2, "PIX"),
                                     Node("b", 2, "PIX")};
  EXPECT_EQ(RanksPerNode(nodes, 3, /*cuda=*/true), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(RanksPerNode(nodes, 3, /*cuda=*/false), (std::vector<int>{3, 0, 0}));
}

TEST(LinkModel, NvlinkPriorCountsLinks) {
  LinkModel l = LinkPrior({Node("n", 8, "NV18")}, {8}, true);
  EXPECT_EQ(l.path, "NV18");
  EXPECT_DOUBLE_EQ(l.busbw, 18 * 25e9 * 0.8);
  EXPECT_DOUBLE_EQ(l.latency, 10e-6);
  EXPECT_FALSE(l.measured);
}

TEST(LinkModel, PciePriorByWorstPath) {
  LinkModel pix = LinkPrior({Node("n", 2, "PIX")}, {2}, true);
  EXPECT_DOUBLE_EQ(pix.busbw, kPcie4x16 * 0.7);
  EXPECT_DOUBLE_EQ(pix.latency, 20e-6);
  LinkModel sys = LinkPrior({Node("n", 2, "SYS")}, {2}, true);
  EXPECT_EQ(sys.path, "SYS");
  EXPECT_DOUBLE_EQ(sys.busbw, kPcie4x16 * 0.35);
  EXPECT_DOUBLE_EQ(sys.latency, 30e-6);
}

TEST(LinkModel, Wsl2PriorIsOneGigabyte) {
  v1::Topology t = Node("w", 2, "SYS");
  t.set_wsl2(true);
  LinkModel l = LinkPrior({t}, {2}, true);
  EXPECT_DOUBLE_EQ(l.busbw, 1e9);
  EXPECT_DOUBLE_EQ(l.latency, 500e-6);
  EXPECT_TRUE(absl::StrContains(l.why, "WSL2")) << l.why;
}

TEST(LinkModel, BetweenNodesTheSlowestNetwork) {
  v1::Topology a = Node("a", 1, ""), b = Node("b", 1, "");
  v1::NetDevice* ib = a.add_net_devices();
  ib->set_name("mlx5_0");
  ib->set_state("ACTIVE");
  ib->set_rate_gbps(200);
  LinkModel l = LinkPrior({a, b}, {1, 1}, true);
  EXPECT_EQ(l.path, "net");
  EXPECT_DOUBLE_EQ(l.busbw, 1.25e9 * 0.8);  // b has no IB: 10 Gb/s Ethernet
  EXPECT_TRUE(absl::StrContains(l.why, "b has no active IB/RoCE port")) << l.why;
}

TEST(LinkModel, CpuRanksOnOneNodeUseLoopback) {
  LinkModel l = LinkPrior({Node("n", 0, "")}, {2}, false);
  EXPECT_EQ(l.path, "loopback");
  EXPECT_DOUBLE_EQ(l.busbw, 2e9);
}

TEST(LinkModel, MeasuredBandwidthReplacesThePrior) {
  LinkModel l = LinkPrior({Node("n", 2, "SYS")}, {2}, true);
  PlannerMeasurements m;
  m.allreduce_bus_bandwidth = 3e9;
  m.allreduce_source = "measured by dgca diagnose comm";
  ApplyLinkMeasurements(m, 2, &l);
  EXPECT_TRUE(l.measured);
  EXPECT_DOUBLE_EQ(l.busbw, 3e9);
  EXPECT_DOUBLE_EQ(l.latency, 30e-6);  // not measured: the prior's, said so
  EXPECT_TRUE(absl::StartsWith(l.why, "measured by dgca diagnose comm: ")) << l.why;
  EXPECT_TRUE(absl::StrContains(l.why, "latency not measured")) << l.why;
}

TEST(LinkModel, MeasuredPointsAreFittedAndInterpolated) {
  LinkModel l = LinkPrior({Node("n", 0, "")}, {2}, false);
  PlannerMeasurements m;
  // t = 1 ms + bytes / 1 GB/s (2 ranks, f = 1), and one slow small size.
  m.allreduce_points = {{1e6, 0.002}, {1e8, 0.101}, {1e3, 0.004}};
  ApplyLinkMeasurements(m, 2, &l);
  ASSERT_TRUE(l.measured);
  ASSERT_EQ(l.points.size(), 3u);
  EXPECT_EQ(l.points.front().first, 1e3);  // sorted by size
  // Between measured sizes: interpolated, not the fitted line.
  EXPECT_NEAR(AllReduceSeconds(l, 5.05e7, 2), (0.002 + 0.101) / 2, 1e-12);
  // Below the smallest: the smallest's time.
  EXPECT_NEAR(AllReduceSeconds(l, 10, 2), 0.004, 1e-12);
  // Past the largest: on at the fitted bandwidth.
  EXPECT_NEAR(AllReduceSeconds(l, 2e8, 2), 0.101 + 1e8 / l.busbw, 1e-12);
}

TEST(LinkModel, AllReduceTimeOnTheLine) {
  LinkModel l;
  l.busbw = 1e9;
  l.latency = 1e-3;
  // 4 ranks: f = 1.5.
  EXPECT_NEAR(AllReduceSeconds(l, 1e8, 4), 1e-3 + 1e8 * 1.5 / 1e9, 1e-12);
}

}  // namespace
}  // namespace dgca
