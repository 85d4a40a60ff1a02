// ThreadPool: every part runs exactly once per Run, Run returns only when
// all parts are done, and back-to-back runs (the kernels' pattern) work.
#include "model/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace dgca {
namespace cpu {
namespace {

TEST(ThreadPool, EveryPartRunsOncePerRun) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    std::vector<int> hits(threads, 0);
    for (int run = 0; run < 2000; ++run) {
      pool.Run([&](int part) { ++hits[part]; });  // distinct parts: no race
      for (int p = 0; p < threads; ++p) ASSERT_EQ(hits[p], run + 1) << "threads " << threads;
    }
  }
}

TEST(ThreadPool, RunWaitsForSlowParts) {
  ThreadPool pool(2);
  std::atomic<int> done{0};
  pool.Run([&](int part) {
    if (part == 1) {
      volatile double x = 0;
      for (int i = 0; i < 2000000; ++i) x = x + 1;
    }
    done.fetch_add(1);
  });
  EXPECT_EQ(done.load(), 2);
}

TEST(ThreadPool, ZeroOrNegativeMeansOneThread) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.threads(), 1);
  int n = 0;
  pool.Run([&](int) { ++n; });
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace cpu
}  // namespace dgca
