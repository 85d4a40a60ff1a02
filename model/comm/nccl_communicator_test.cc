// NCCL communicator. On a machine without a GPU (this project's CI) the only
// thing that can run is the clean failure; with a GPU a world of one
// all-reduces, broadcasts and barriers for real.
#include "model/comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/comm/kv_store.h"

namespace dgca {
namespace {

bool HaveDevice() { return NcclVisibleDevices().ok(); }

TEST(NcclCommunicatorTest, NoDeviceGivesFailedPrecondition) {
  auto n = NcclVisibleDevices();
  if (n.ok()) GTEST_SKIP() << n.value() << " CUDA device(s) visible: the no-device path cannot run";
  if (n.status().code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << "built without NCCL: " << n.status().message();
  }
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto c = MakeNcclCommunicator(store, 0, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("no CUDA device visible (cudaGetDeviceCount: "),
            std::string::npos)
      << c.status().ToString();
  // No key was published: the failure comes before the bootstrap.
  auto v = store->Wait("dgca/nccl/unique_id", std::chrono::milliseconds(1));
  EXPECT_FALSE(v.ok());
}

TEST(NcclCommunicatorTest, BadRankIsInvalidArgument) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto c = MakeNcclCommunicator(store, 2, 2);
  ASSERT_FALSE(c.ok());
  if (c.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << c.status().message();
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
}

TEST(NcclCommunicatorTest, OneRankAllReduceBroadcastBarrier) {
  if (!HaveDevice()) {
    GTEST_SKIP() << "no CUDA device visible (" << NcclVisibleDevices().status().ToString()
                 << "): the 1-rank NCCL run needs a GPU machine";
  }
  auto store = std::make_shared<MemoryKeyValueStore>();
  auto c = MakeNcclCommunicator(store, 0, 1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Communicator* comm = c->get();
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  const size_t n = 1000;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i) - 7;
  auto buf = AllocateDeviceFloats(n);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  ASSERT_TRUE(CopyToDevice(buf->get(), host.data(), n).ok());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    auto h = comm->StartAllReduce(buf->get(), n, op);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->Wait().ok());
    EXPECT_LE((*h)->start_time(), (*h)->end_time());
  }
  ASSERT_TRUE(comm->Broadcast(buf->get(), n, 0).ok());
  ASSERT_TRUE(comm->Barrier().ok());
  std::vector<float> back(n, -1);
  ASSERT_TRUE(CopyToHost(back.data(), buf->get(), n).ok());
  // World of one: sum and average are the identity.
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], host[i]) << i;
  // Unique id published under the documented key.
  EXPECT_TRUE(store->Wait("dgca/nccl/unique_id", std::chrono::milliseconds(1)).ok());
}

}  // namespace
}  // namespace dgca
