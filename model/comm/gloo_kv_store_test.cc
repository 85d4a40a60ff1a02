// The KeyValueStore adapter over a gloo::rendezvous::Store (FileStore here;
// the worker uses its gRPC store): values round-trip byte for byte, a missing
// key times out with DEADLINE_EXCEEDED instead of throwing.
#include "model/comm/gloo_kv_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <gloo/rendezvous/file_store.h>

#include <string>
#include <thread>

#include "model/core/core_test_util.h"

namespace dgca {
namespace {

std::string TempDir() {
  const std::string d = testutil::MakeTempDir("gloo_kv_store_test");
  return d.empty() ? "/tmp" : d;
}

TEST(GlooKeyValueStoreTest, SetThenWaitRoundTripsBinary) {
  std::string dir = TempDir();
  auto kv = MakeGlooKeyValueStore(std::make_shared<gloo::rendezvous::FileStore>(dir));
  std::string value("a\0b\xff", 4);
  ASSERT_TRUE(kv->Set("dgca/nccl/unique_id", value).ok());
  auto got = kv->Wait("dgca/nccl/unique_id", std::chrono::milliseconds(1000));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
}

TEST(GlooKeyValueStoreTest, WaitSeesALaterSetFromAnotherStore) {
  std::string dir = TempDir();
  auto writer = MakeGlooKeyValueStore(std::make_shared<gloo::rendezvous::FileStore>(dir));
  auto reader = MakeGlooKeyValueStore(std::make_shared<gloo::rendezvous::FileStore>(dir));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)writer->Set("k", "late");
  });
  auto got = reader->Wait("k", std::chrono::milliseconds(5000));
  t.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "late");
}

TEST(GlooKeyValueStoreTest, MissingKeyIsDeadlineExceeded) {
  std::string dir = TempDir();
  auto kv = MakeGlooKeyValueStore(std::make_shared<gloo::rendezvous::FileStore>(dir));
  auto got = kv->Wait("never", std::chrono::milliseconds(100));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("never"), std::string::npos);
}

}  // namespace
}  // namespace dgca
