#include "coordinator/rendezvous_store.h"

#include <gtest/gtest.h>

#include <thread>

namespace dgca {
namespace {

using std::chrono::milliseconds;

TEST(RendezvousStore, SetGetNamespaced) {
  RendezvousStore s;
  ASSERT_TRUE(s.Set("j1", 0, "nccl_id", "abc").ok());
  EXPECT_EQ(**s.Get("j1", 0, "nccl_id"), "abc");
  EXPECT_FALSE(s.Get("j1", 1, "nccl_id")->has_value());  // other attempt
  EXPECT_FALSE(s.Get("j2", 0, "nccl_id")->has_value());  // other job
  ASSERT_TRUE(s.Set("j1", 0, "nccl_id", "def").ok());
  EXPECT_EQ(**s.Get("j1", 0, "nccl_id"), "def");
  EXPECT_FALSE(s.Set("j1", 0, "", "x").ok());
}

TEST(RendezvousStore, Add) {
  RendezvousStore s;
  EXPECT_EQ(*s.Add("j", 0, "n", 1), 1);
  EXPECT_EQ(*s.Add("j", 0, "n", 5), 6);
  EXPECT_EQ(*s.Add("j", 0, "n", -2), 4);
  EXPECT_EQ(**s.Get("j", 0, "n"), "4");
  ASSERT_TRUE(s.Set("j", 0, "str", "hello").ok());
  EXPECT_EQ(s.Add("j", 0, "str", 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStore, WaitWakesAndTimesOut) {
  RendezvousStore s;
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(s.Set("j", 0, "a", "1").ok());
    ASSERT_TRUE(s.Set("j", 0, "b", "2").ok());
  });
  EXPECT_TRUE(s.Wait("j", 0, {"a", "b"}, milliseconds(5000)).ok());
  t.join();
  absl::Status st = s.Wait("j", 0, {"a", "zzz"}, milliseconds(50));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("zzz"), std::string::npos);
  EXPECT_EQ(s.Wait("j", 0, {"q"}, milliseconds(5000), [] { return true; }).code(),
            absl::StatusCode::kCancelled);
}

TEST(RendezvousStore, ClearJobAbortsWaitersAndDropsKeys) {
  RendezvousStore s;
  ASSERT_TRUE(s.Set("j", 0, "a", "1").ok());
  ASSERT_TRUE(s.Set("j", 1, "a", "1").ok());
  ASSERT_TRUE(s.Set("k", 0, "a", "1").ok());
  s.ClearAttemptsBefore("j", 1);
  EXPECT_EQ(s.NamespaceCount(), 2u);
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    s.ClearJob("j");
  });
  EXPECT_EQ(s.Wait("j", 1, {"never"}, milliseconds(5000)).code(), absl::StatusCode::kAborted);
  t.join();
  EXPECT_EQ(s.NamespaceCount(), 1u);
  EXPECT_FALSE(s.Get("j", 1, "a")->has_value());
}

TEST(RendezvousStore, Bounds) {
  RendezvousStore::Limits lim;
  lim.max_keys_per_namespace = 2;
  lim.max_value_bytes = 10;
  lim.max_namespaces = 2;
  RendezvousStore s(lim);
  EXPECT_EQ(s.Set("j", 0, "a", std::string(11, 'x')).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Set("j", 0, "a", "1").ok());
  ASSERT_TRUE(s.Set("j", 0, "b", "1").ok());
  EXPECT_EQ(s.Set("j", 0, "c", "1").code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.Set("j", 1, "a", "1").ok());
  EXPECT_EQ(s.Set("j", 2, "a", "1").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(s.Set("j", 0, std::string(600, 'k'), "1").ok());
}

}  // namespace
}  // namespace dgca
