// GraphCache (graph_cache.h): eager on first sight, captured on the second,
// replayed after; an evicted key is captured again on its next sight.
// Needs a CUDA device; runs on the CUDA emulator in ctest
// (graph_cache_test_emu), whose graphs follow CUDA's capture rules.
#include "model/cuda/graph_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/cuda_check/check_test_util.h"
#include "model/cuda/cuda_context.h"

namespace dgca {
namespace cuda {
namespace {

// Each test: a non-blocking stream (as CudaContext's) and a 64-byte buffer.
class GraphCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!check_test::HaveDevice(&why)) GTEST_SKIP() << "needs a CUDA device: " << why;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(buf.Allocate(64).ok());
  }
  void TearDown() override {
    if (stream != nullptr) EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
  cudaStream_t stream = nullptr;
  DeviceArray<uint8_t> buf;
};

TEST_F(GraphCacheTest, CapturesOnSecondSightReplaysAndRecapturesAfterEviction) {
  int enqueued = 0;  // how often the work itself was called (eager or captured)
  // Key {v}: fill the buffer with byte v.
  auto run = [&](GraphCache* cache, int v) {
    return cache->Run({v}, [&] {
      ++enqueued;
      return CudaStatus(cudaMemsetAsync(buf.get(), v, 64, stream), "cudaMemsetAsync");
    });
  };
  auto contents = [&]() -> int {
    std::vector<uint8_t> h;
    if (cudaStreamSynchronize(stream) != cudaSuccess || !buf.Download(&h).ok()) return -1;
    for (uint8_t b : h)
      if (b != h[0]) return -2;
    return h[0];
  };
  {
    GraphCache cache(stream, /*capacity=*/1);
    ASSERT_TRUE(run(&cache, 1).ok());  // eager
    EXPECT_EQ(contents(), 1);
    ASSERT_TRUE(run(&cache, 2).ok());  // eager
    EXPECT_EQ(contents(), 2);
    ASSERT_TRUE(run(&cache, 1).ok());  // captured (and launched)
    EXPECT_EQ(contents(), 1);
    ASSERT_TRUE(run(&cache, 2).ok());  // captured: evicts key 1's graph
    EXPECT_EQ(contents(), 2);
    ASSERT_TRUE(run(&cache, 2).ok());  // replayed
    EXPECT_EQ(contents(), 2);
    ASSERT_TRUE(run(&cache, 1).ok());  // seen before: captured again, not eager
    EXPECT_EQ(contents(), 1);
    EXPECT_EQ(enqueued, 5);
    const GraphCache::Stats& s = cache.stats();
    EXPECT_EQ(s.eager, 2);
    EXPECT_EQ(s.captured, 3);
    EXPECT_EQ(s.replayed, 1);
    EXPECT_EQ(s.capture_failures, 0);
  }
}

// Work that CUDA cannot capture (here a stream synchronize, as a library
// might do inside) invalidates the capture, and the launches after it fail
// with cudaErrorStreamCaptureInvalidated: the cache reruns the work eagerly
// and never tries that key again, instead of returning the error.
TEST_F(GraphCacheTest, AnInvalidatedCaptureRunsEagerlyInstead) {
  int enqueued = 0;
  auto run = [&](GraphCache* cache, int v) {
    return cache->Run({v}, [&] {
      ++enqueued;
      (void)cudaStreamSynchronize(stream);  // illegal while capturing: invalidates it
      return CudaStatus(cudaMemsetAsync(buf.get(), v, 64, stream), "cudaMemsetAsync");
    });
  };
  // Zero() is a legacy-stream cudaMemset, which the non-blocking stream
  // does not wait for: synchronize before the next run.
  auto zero = [&] { return buf.Zero().ok() && cudaDeviceSynchronize() == cudaSuccess; };
  auto first_byte = [&]() -> int {
    std::vector<uint8_t> h;
    if (cudaStreamSynchronize(stream) != cudaSuccess || !buf.Download(&h).ok()) return -1;
    return h[0];
  };
  {
    GraphCache cache(stream, /*capacity=*/4);
    ASSERT_TRUE(run(&cache, 3).ok());  // eager
    EXPECT_EQ(first_byte(), 3);
    ASSERT_TRUE(zero());
    Status s = run(&cache, 3);  // the capture fails; run eagerly
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(first_byte(), 3);
    ASSERT_TRUE(zero());
    ASSERT_TRUE(run(&cache, 3).ok());  // never captured again: eager
    EXPECT_EQ(first_byte(), 3);
    EXPECT_EQ(enqueued, 4);  // eager, the failed capture, its eager rerun, eager
    EXPECT_EQ(cache.stats().capture_failures, 1);
    EXPECT_EQ(cache.stats().captured, 0);
    EXPECT_EQ(cache.stats().eager, 3);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // no error left behind for the next launch check
}

}  // namespace
}  // namespace cuda
}  // namespace dgca
