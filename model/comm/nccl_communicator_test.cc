// NCCL communicator. On a machine without a GPU (this project's CI) the only
// thing that can run is the clean failure; with a GPU a world of one
// all-reduces, broadcasts and barriers for real. Built against the CUDA
// emulator (nccl_communicator_test_emu: model/cuda_emu, whose NCCL connects
// rank processes of one machine) the world of one runs, and so do worlds
// of several processes: all-reduce, broadcast and barrier across ranks, a
// killed peer, ranks that issue different collectives, a peer that never
// joins. (A lent GPU machine has one GPU; NCCL refuses two ranks on it.)
#include "model/comm/nccl_communicator.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "model/comm/fork_ranks_for_test.h"
#include "model/comm/kv_store.h"

#ifdef DGCA_CUDA_EMULATOR  // the raw API of the emulated runtime and NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "model/cuda_emu/emulator.h"
#endif

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

#ifdef DGCA_CUDA_EMULATOR
// A store of files in one directory: the rendezvous of forked ranks.
class DirKeyValueStore : public KeyValueStore {
 public:
  explicit DirKeyValueStore(std::string dir) : dir_(std::move(dir)) {}
  Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key), tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary) << value;
    return std::rename(tmp.c_str(), path.c_str()) == 0 ? OkStatus() : InternalError("rename " + tmp);
  }
  StatusOr<std::string> Wait(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(Path(key), std::ios::binary);
      if (f) {
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return DeadlineExceededError("key '" + key + "' did not appear");
  }

 private:
  std::string Path(std::string key) const {
    for (char& c : key)
      if (c == '/') c = '_';
    return dir_ + "/" + key;
  }
  std::string dir_;
};

using comm_test::RunRanks;
std::string TempDir() { return comm_test::MakeTempDir("nccl_emu_test"); }

std::unique_ptr<Communicator> Connect(const std::string& dir, int rank, int world, int timeout_ms) {
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto c = MakeNcclCommunicator(std::make_shared<DirKeyValueStore>(dir), rank, world, o);
  if (!c.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(c).value();
}

// The emulated NCCL's transport directory for the communicator whose id
// the ranks exchanged through the store in `dir`.
std::string EmulatorDir(const std::string& dir) {
  auto id = DirKeyValueStore(dir).Wait("dgca/nccl/unique_id", std::chrono::seconds(1));
  return id.ok() ? cuda::emu::NcclTransportDir(id->data()) : "";
}

// After the ranks are gone, nothing of the communicator stays in /dev/shm:
// not after a clean finish, nor after a peer died or a collective failed.
void ExpectTransportRemoved(const std::string& store_dir) {
  const std::string shm = EmulatorDir(store_dir);
  ASSERT_FALSE(shm.empty()) << "no NCCL id in " << store_dir;
  struct stat st;
  EXPECT_NE(stat(shm.c_str(), &st), 0) << shm << " was left behind";
}

// Rank r's buffer holds r * 100 + i; checks a sum and an average over three
// ranks, a broadcast from rank 1 and a barrier, all on device memory.
TEST(NcclEmulatedTest, ThreeRanksAllReduceBroadcastBarrier) {
  const std::string dir = TempDir();
  const int world = 3;
  const size_t n = 1000;
  auto codes = RunRanks(world, [&](int rank) {
    auto comm = Connect(dir, rank, world, 20000);
    if (!comm) return 10;
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = float(rank * 100 + int(i % 50));
    auto buf = AllocateDeviceFloats(n);
    if (!buf.ok() || !CopyToDevice(buf->get(), h.data(), n).ok()) return 11;
    auto sum = comm->StartAllReduce(buf->get(), n, ReduceOp::kSum);
    if (!sum.ok() || !(*sum)->Wait().ok()) return 12;
    std::vector<float> back(n);
    if (!CopyToHost(back.data(), buf->get(), n).ok()) return 13;
    for (size_t i = 0; i < n; ++i)
      if (back[i] != float(300 + 3 * int(i % 50))) return 14;  // (0 + 100 + 200) + 3 x (i % 50)
    auto avg = comm->StartAllReduce(buf->get(), n, ReduceOp::kAverage);
    if (!avg.ok() || !(*avg)->Wait().ok()) return 15;
    if (!CopyToHost(back.data(), buf->get(), n).ok() || back[7] != float(300 + 3 * 7)) return 16;
    for (size_t i = 0; i < n; ++i) h[i] = float(rank == 1 ? 42 + int(i) : -1);
    if (!CopyToDevice(buf->get(), h.data(), n).ok()) return 17;
    if (!comm->Broadcast(buf->get(), n, 1).ok()) return 18;
    if (!CopyToHost(back.data(), buf->get(), n).ok() || back[0] != 42.0f || back[n - 1] != float(42 + n - 1)) return 19;
    if (!comm->Barrier().ok()) return 20;
    return 0;
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  ExpectTransportRemoved(dir);
}

TEST(NcclEmulatedTest, KilledPeerFailsTheSurvivorNamingIt) {
  const std::string dir = TempDir();
  auto codes = RunRanks(2, [&](int rank) {
    auto comm = Connect(dir, rank, 2, 20000);
    if (!comm) return 10;
    if (rank == 1) _exit(0);  // dies before its all-reduce
    auto buf = AllocateDeviceFloats(16);
    if (!buf.ok()) return 11;
    auto h = comm->StartAllReduce(buf->get(), 16, ReduceOp::kSum);
    if (!h.ok()) return 12;
    Status s = (*h)->Wait();
    std::fprintf(stderr, "survivor: %s\n", s.ToString().c_str());
    if (s.ok()) return 13;
    if (s.code() != StatusCode::kUnavailable) return 14;
    if (s.message().find("lost peer rank 1") == std::string::npos) return 15;
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
  ExpectTransportRemoved(dir);  // by the survivor: rank 1 never left
}

TEST(NcclEmulatedTest, RanksIssuingDifferentCollectivesAreReported) {
  const std::string dir = TempDir();
  auto codes = RunRanks(2, [&](int rank) {
    auto comm = Connect(dir, rank, 2, 20000);
    if (!comm) return 10;
    auto buf = AllocateDeviceFloats(100);
    if (!buf.ok()) return 11;
    auto h = comm->StartAllReduce(buf->get(), rank == 0 ? 100 : 99, ReduceOp::kSum);
    if (!h.ok()) return 12;
    Status s = (*h)->Wait();
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return !s.ok() && s.message().find("ranks disagree on collective #0") != std::string::npos ? 0 : 13;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  ExpectTransportRemoved(dir);  // with both failed deposits in it
}

// A broadcast is checked like an all-reduce: every rank deposits its
// header, so two ranks naming different roots both fail.
TEST(NcclEmulatedTest, BroadcastFromDifferentRootsIsReported) {
  const std::string dir = TempDir();
  auto codes = RunRanks(2, [&](int rank) {
    auto comm = Connect(dir, rank, 2, 20000);
    if (!comm) return 10;
    auto buf = AllocateDeviceFloats(8);
    if (!buf.ok()) return 11;
    Status s = comm->Broadcast(buf->get(), 8, /*root=*/rank);
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    if (s.ok()) return 12;
    return s.message().find("ranks disagree on collective #0") != std::string::npos &&
                   s.message().find("a broadcast of 8 floats from rank") != std::string::npos
               ? 0
               : 13;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  ExpectTransportRemoved(dir);
}

// A peer that destroyed its communicator but is still running never
// deposits: the survivor fails at once naming it, not after its timeout.
TEST(NcclEmulatedTest, PeerThatLeftTheCommunicatorIsReported) {
  const std::string dir = TempDir();
  auto codes = RunRanks(2, [&](int rank) {
    auto comm = Connect(dir, rank, 2, 60000);
    if (!comm) return 10;
    if (rank == 1) {
      comm.reset();  // ncclCommDestroy
      std::this_thread::sleep_for(std::chrono::seconds(2));  // alive while rank 0 waits
      return 0;
    }
    auto buf = AllocateDeviceFloats(16);
    if (!buf.ok()) return 11;
    const auto t0 = std::chrono::steady_clock::now();
    auto h = comm->StartAllReduce(buf->get(), 16, ReduceOp::kSum);
    if (!h.ok()) return 12;
    Status s = (*h)->Wait();
    std::fprintf(stderr, "survivor: %s\n", s.ToString().c_str());
    if (s.ok()) return 13;
    if (s.message().find("lost peer rank 1") == std::string::npos ||
        s.message().find("destroyed or aborted its communicator") == std::string::npos)
      return 14;
    return std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10) ? 0 : 15;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  ExpectTransportRemoved(dir);
}

// The raw API: a blocking cudaStreamSynchronize on a collective that can
// never complete (its peer died) would hang on a GPU; the emulator makes it
// a device fault at once instead of waiting out DGCA_EMU_COLLECTIVE_TIMEOUT_S.
TEST(NcclEmulatedTest, BlockingSyncOnAFailedCollectiveIsADeviceFault) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  auto codes = RunRanks(2, [&](int rank) {
    if (cudaSetDevice(0) != cudaSuccess) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRankConfig(&comm, 2, id, rank, nullptr) != ncclSuccess) return 11;
    if (rank == 1) _exit(0);  // dies without issuing the all-reduce
    float* d = nullptr;
    if (cudaMalloc(&d, 16 * sizeof(float)) != cudaSuccess) return 12;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 13;
    if (ncclAllReduce(d, d, 16, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 14;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let rank 1 exit
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t e = cudaStreamSynchronize(s);
    std::fprintf(stderr, "cudaStreamSynchronize: %s\n", cudaGetErrorName(e));
    if (e != cudaErrorLaunchFailure) return 15;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) return 16;
    ncclCommAbort(comm);
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
}

TEST(NcclEmulatedTest, InitTimesOutWhenAPeerNeverJoins) {
  const std::string dir = TempDir();
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(500);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = MakeNcclCommunicator(std::make_shared<DirKeyValueStore>(dir), 0, 2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status().ToString();
  EXPECT_NE(c.status().message().find("ranks joined within 500 ms"), std::string::npos) << c.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ExpectTransportRemoved(dir);  // rank 1 never joined
}

// An ncclCommAbort that does not return (real NCCL's has hung joining its
// proxy thread): the init's timeout error still comes back, within the
// abort limit, saying the abort was left running.
TEST(NcclEmulatedTest, AHungAbortIsBoundedByTheAbortLimit) {
  ASSERT_EQ(setenv("DGCA_EMU_NCCL_ABORT_HANG_MS", "1500", 1), 0);
  const std::string dir = TempDir();
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(300);
  o.abort_limit = std::chrono::milliseconds(200);
  std::string hung;  // what on_abort_hung was given
  o.on_abort_hung = [&hung](const Status& s) { hung = s.ToString(); };
  const auto t0 = std::chrono::steady_clock::now();
  auto c = MakeNcclCommunicator(std::make_shared<DirKeyValueStore>(dir), 0, 2, o);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status().ToString();
  EXPECT_NE(c.status().message().find("ncclCommAbort did not return within 200 ms"), std::string::npos)
      << c.status().ToString();
  EXPECT_EQ(hung, c.status().ToString());
  EXPECT_LT(took, std::chrono::milliseconds(1200));  // not the abort's 1.5 s
  // The abort, left running, finishes later and removes the transport (so
  // nothing is left in /dev/shm, and no later test forks while it holds
  // the emulator's lock).
  const std::string shm = EmulatorDir(dir);
  struct stat st;
  for (int i = 0; i < 400 && stat(shm.c_str(), &st) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  unsetenv("DGCA_EMU_NCCL_ABORT_HANG_MS");
  ExpectTransportRemoved(dir);
}

// NCCL_COMM_BLOCKING=1 would override the non-blocking init (and its
// timeout): refused first (before the unique id is published), naming the
// variable.
TEST(NcclEmulatedTest, NcclCommBlockingInTheEnvironmentIsRefused) {
  ASSERT_EQ(setenv("NCCL_COMM_BLOCKING", "1", 1), 0);
  auto c = MakeNcclCommunicator(std::make_shared<DirKeyValueStore>(TempDir()), 0, 1);
  unsetenv("NCCL_COMM_BLOCKING");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_NE(c.status().message().find("NCCL_COMM_BLOCKING=1 is set"), std::string::npos) << c.status().ToString();
  ASSERT_EQ(setenv("NCCL_COMM_BLOCKING", "0", 1), 0);  // the default: fine
  auto ok = MakeNcclCommunicator(std::make_shared<DirKeyValueStore>(TempDir()), 0, 1);
  unsetenv("NCCL_COMM_BLOCKING");
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}
#endif  // DGCA_CUDA_EMULATOR

}  // namespace
}  // namespace dgca
