#include "model/comm/comm_probe.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "gloo/rendezvous/file_store.h"
#include "gtest/gtest.h"
#include "model/comm/fork_ranks_for_test.h"
#include "model/comm/gloo_communicator.h"

namespace dgca {
namespace {

TEST(CommProbeTest, LocalWorldReportsZeroBusBw) {
  auto comm = MakeLocalCommunicator();
  std::vector<float> buf(1024);
  ProbeOptions o;
  o.sizes_bytes = {64, 4096};
  auto rows = AllReduceSweep(comm.get(), buf.data(), buf.size(), o);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].bytes, 4096u);
  EXPECT_EQ((*rows)[1].busbw, 0.0);  // nothing crosses a link in a world of one
  o.sizes_bytes = {1 << 20};
  EXPECT_FALSE(AllReduceSweep(comm.get(), buf.data(), buf.size(), o).ok());  // too big
}

TEST(CommProbeTest, TwoGlooRanksMeasureBandwidth) {
  const std::string dir = comm_test::MakeTempDir("comm_probe_test");
  ASSERT_FALSE(dir.empty());
  const std::string out = dir + "/rows.txt";
  auto codes = comm_test::RunRanks(2, [&](int r) -> int {
    auto store = std::make_shared<gloo::rendezvous::FileStore>(dir);
    auto comm = MakeGlooCommunicator(store, r, 2);
    if (!comm.ok()) return 1;
    std::vector<float> buf(1 << 18);
    ProbeOptions o;
    o.sizes_bytes = {4096, 1 << 20};
    o.max_iters = 10;
    auto rows = AllReduceSweep(comm->get(), buf.data(), buf.size(), o);
    if (!rows.ok()) return 2;
    if (r == 0) {
      FILE* f = fopen(out.c_str(), "w");
      for (const auto& row : *rows) {
        fprintf(f, "%zu %d %.9f %.3f %.3f\n", row.bytes, row.iters, row.seconds_per_op,
                row.algbw, row.busbw);
      }
      fclose(f);
    }
    return 0;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
  FILE* f = fopen(out.c_str(), "r");
  ASSERT_NE(f, nullptr);
  size_t bytes;
  int iters;
  double s, alg, bus;
  int n = 0;
  while (fscanf(f, "%zu %d %lf %lf %lf", &bytes, &iters, &s, &alg, &bus) == 5) {
    printf("%zu bytes x %d: %.1f us, algbw %.3g B/s, busbw %.3g B/s\n", bytes, iters, s * 1e6, alg,
           bus);
    EXPECT_GT(s, 0);
    EXPECT_NEAR(bus, alg, alg * 1e-9);  // 2(n-1)/n = 1 for n = 2
    EXPECT_EQ(iters, 10);
    ++n;
  }
  fclose(f);
  EXPECT_EQ(n, 2);
}

}  // namespace
}  // namespace dgca
