#include "model/train/buckets.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "gloo/rendezvous/file_store.h"
#include "gtest/gtest.h"
#include "model/comm/fork_ranks_for_test.h"
#include "model/comm/gloo_communicator.h"

namespace dgca {
namespace {

ParamStore MakeStore(const std::vector<int64_t>& sizes) {
  ParamStore ps;
  for (size_t i = 0; i < sizes.size(); ++i) ps.Declare("p" + std::to_string(i), {sizes[i]}, true);
  ps.Finalize();
  return ps;
}

TEST(PlanBucketsTest, ReverseOrderContiguousAndCapped) {
  // 1 MB = 262144 floats. Sizes in floats.
  ParamStore ps = MakeStore({100000, 100000, 300000, 50000, 50000, 50000});
  auto b = PlanBuckets(ps, 1.0);
  ASSERT_EQ(b.size(), 3u);
  // Last three (150000) fit together; the 300000 one is alone (larger than cap).
  EXPECT_EQ(b[0].first_param, 3);
  EXPECT_EQ(b[0].end_param, 6);
  EXPECT_EQ(b[0].numel, 150000);
  EXPECT_EQ(b[1].first_param, 2);
  EXPECT_EQ(b[1].numel, 300000);
  EXPECT_EQ(b[2].first_param, 0);  // 100000 + 100000 fit one bucket
  EXPECT_EQ(b[2].end_param, 2);
  EXPECT_EQ(b[2].numel, 200000);
  // Contiguous and covering the buffer exactly once.
  int64_t end = ps.total_numel();
  for (const Bucket& bk : b) {
    EXPECT_EQ(bk.offset + bk.numel, end);
    end = bk.offset;
  }
  EXPECT_EQ(end, 0);
  // One big bucket.
  EXPECT_EQ(PlanBuckets(ps, 100.0).size(), 1u);
}

// Tensors whose sizes leave alignment gaps (ParamStore): each bucket's
// slice runs from its first tensor to the end of its last, so it holds every
// tensor it names; slices do not overlap.
TEST(PlanBucketsTest, SlicesSpanTheirTensorsAcrossAlignmentGaps) {
  ParamStore ps;
  for (int64_t n : {3, 5, 7, 9, 11}) ps.Declare("p" + std::to_string(n), {n}, true);
  ps.Finalize();
  ASSERT_GT(ps.total_numel(), ps.parameter_count());  // there are gaps
  const int64_t cap_floats = 12;
  auto b = PlanBuckets(ps, cap_floats * sizeof(float) / (1024.0 * 1024.0));
  int64_t below = ps.total_numel();
  for (const Bucket& bk : b) {
    for (int i = bk.first_param; i < bk.end_param; ++i) {
      EXPECT_GE(ps.info(i).offset, bk.offset) << i;
      EXPECT_LE(ps.info(i).offset + ps.info(i).numel, bk.offset + bk.numel) << i;
    }
    EXPECT_EQ(bk.offset + bk.numel, ps.info(bk.end_param - 1).offset + ps.info(bk.end_param - 1).numel);
    EXPECT_LE(bk.offset + bk.numel, below);  // reverse order, no overlap
    below = bk.offset;
  }
  EXPECT_EQ(b.back().first_param, 0);
  EXPECT_GT(b.size(), 1u);
}

// A fake communicator that records the order of starts and doubles the data.
class RecordingComm : public Communicator {
 public:
  struct H : CollectiveHandle {
    Status Wait() override { return OkStatus(); }
    double start_time() const override { return 1; }
    double end_time() const override { return 2; }
  };
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float* d, size_t n,
                                                             ReduceOp) override {
    starts.push_back({d, n});
    return std::unique_ptr<CollectiveHandle>(new H);
  }
  Status Broadcast(float*, size_t, int) override { return OkStatus(); }
  Status Barrier() override { return OkStatus(); }
  double Now() const override { return 0; }
  std::vector<std::pair<float*, size_t>> starts;
};

TEST(GradientBucketsTest, StartsOnlyCompleteBucketsAndOnlyWhenEnabled) {
  ParamStore ps = MakeStore({16, 16, 16, 16});  // multiples of 8 floats: no alignment gaps
  RecordingComm comm;
  GradientBuckets gb(&comm, &ps, 32 * 4 / (1024.0 * 1024.0));  // 32 floats per bucket
  ASSERT_EQ(gb.buckets().size(), 2u);
  gb.BeginStep(false);  // accumulation micro-step: nothing communicated
  gb.OnGradReady(0);
  auto s0 = gb.WaitAll();
  ASSERT_TRUE(s0.ok());
  EXPECT_TRUE(comm.starts.empty());

  gb.BeginStep(true);
  gb.OnGradReady(3);  // only p3 complete: bucket 0 (p2,p3) not yet
  EXPECT_TRUE(comm.starts.empty());
  gb.OnGradReady(2);
  ASSERT_EQ(comm.starts.size(), 1u);
  EXPECT_EQ(comm.starts[0].first, ps.grads() + 32);
  EXPECT_EQ(comm.starts[0].second, 32u);
  gb.OnGradReady(2);  // repeated: no duplicate
  EXPECT_EQ(comm.starts.size(), 1u);
  auto s = gb.WaitAll();  // starts the rest
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(comm.starts.size(), 2u);
  EXPECT_EQ(comm.starts[1].first, ps.grads());
  EXPECT_EQ(s->bytes, 64 * 4);
  EXPECT_EQ(s->events.size(), 2u);
  EXPECT_DOUBLE_EQ(s->allreduce_seconds, 2.0);
  // busbw = bytes / seconds * 2(n-1)/n with n = 2.
  EXPECT_DOUBLE_EQ(s->bus_bandwidth, 256.0 / 2.0);
}

// While WaitAll waits for bucket b, the phase says all-reduce b+1/K of the
// step, with that bucket's bytes (what a hang message names).
class PhaseSeeingComm : public RecordingComm {
 public:
  explicit PhaseSeeingComm(const PhaseTracker* t) : tracker(t) {}
  struct SeeingH : CollectiveHandle {
    PhaseSeeingComm* comm;
    Status Wait() override {
      comm->seen.push_back(comm->tracker->Read());
      return OkStatus();
    }
    double start_time() const override { return 1; }
    double end_time() const override { return 2; }
  };
  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float*, size_t, ReduceOp) override {
    auto h = std::make_unique<SeeingH>();
    h->comm = this;
    return std::unique_ptr<CollectiveHandle>(std::move(h));
  }
  const PhaseTracker* tracker;
  std::vector<PhaseSnapshot> seen;
};

TEST(GradientBucketsTest, WaitAllRecordsWhichAllReduceItWaitsFor) {
  ParamStore ps = MakeStore({16, 16, 16, 16, 16, 16});
  PhaseTracker phases;
  PhaseSeeingComm comm(&phases);
  GradientBuckets gb(&comm, &ps, 32 * 4 / (1024.0 * 1024.0));  // 32 floats per bucket
  ASSERT_EQ(gb.buckets().size(), 3u);
  gb.BeginStep(true);
  auto s = gb.WaitAll(&phases, 17);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(comm.seen.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(comm.seen[k].phase, TrainPhase::kAllReduce);
    EXPECT_EQ(comm.seen[k].step, 17);
    EXPECT_EQ(comm.seen[k].index, k + 1);
    EXPECT_EQ(comm.seen[k].count, 3);
    EXPECT_EQ(comm.seen[k].bytes, 32 * 4);
  }
  EXPECT_EQ(phases.Read().progress, 3);
  // Without a tracker (or with nothing to communicate) nothing is recorded.
  gb.BeginStep(false);
  ASSERT_TRUE(gb.WaitAll(&phases, 18).ok());
  EXPECT_EQ(phases.Read().progress, 3);
}

// A communicator whose collectives fail (as after a lost peer).
class FailingComm : public RecordingComm {
 public:
  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float* d, size_t n,
                                                             ReduceOp op) override {
    if (++calls == 2) return UnavailableError("gloo allreduce failed (lost peer rank 1)");
    return RecordingComm::StartAllReduce(d, n, op);
  }
  int calls = 0;
};

TEST(GradientBucketsTest, ErrorsSurfaceInWaitAll) {
  ParamStore ps = MakeStore({10, 10, 10, 10});
  FailingComm comm;
  GradientBuckets gb(&comm, &ps, 20 * 4 / (1024.0 * 1024.0));
  gb.BeginStep(true);
  gb.OnGradReady(2);  // first bucket starts fine
  auto s = gb.WaitAll();  // second fails to start
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("lost peer rank 1"), std::string::npos);
  // The next step starts clean.
  gb.BeginStep(true);
  EXPECT_TRUE(gb.WaitAll().ok());
}

TEST(GradientBucketsTest, WorldOfOneCommunicatesNothing) {
  ParamStore ps = MakeStore({10, 10});
  auto local = MakeLocalCommunicator();
  GradientBuckets gb(local.get(), &ps, 1.0);
  gb.BeginStep(true);
  gb.OnGradReady(0);
  auto s = gb.WaitAll();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->bytes, 0);
  EXPECT_TRUE(s->events.empty());
}

// Two processes over Gloo: a synthetic "backward" that produces gradients in
// reverse order with compute between tensors. With small buckets the
// all-reduces start before backward ends, exposed < total, and the result is
// the average.
TEST(GradientBucketsTest, GlooOverlapWithSyntheticBackward) {
  const std::string dir = comm_test::MakeTempDir("buckets_test");
  ASSERT_FALSE(dir.empty());
  const std::string out = dir + "/rank0.txt";
  auto codes = comm_test::RunRanks(2, [&](int rank) -> int {
    auto store = std::make_shared<gloo::rendezvous::FileStore>(dir);
    auto c = MakeGlooCommunicator(store, rank, 2);
    if (!c.ok()) return 1;
    auto comm = std::move(c).value();
    const int kTensors = 8;
    ParamStore ps = MakeStore(std::vector<int64_t>(kTensors, 1 << 18));  // 1 MB each
    GradientBuckets gb(comm.get(), &ps, 2.0);  // 4 buckets
    gb.BeginStep(true);
    for (int i = kTensors - 1; i >= 0; --i) {
      float* g = ps.grad(i);
      for (int64_t j = 0; j < ps.info(i).numel; ++j) g[j] = static_cast<float>(rank * 2 + i);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // "compute"
      gb.OnGradReady(i);
    }
    gb.MarkBackwardEnd();
    auto s = gb.WaitAll();
    if (!s.ok()) return 2;
    for (int i = 0; i < kTensors; ++i) {
      if (ps.grad(i)[7] != static_cast<float>(1 + i)) return 3;  // avg of i and 2+i
    }
    if (rank == 0) {
      FILE* f = fopen(out.c_str(), "w");
      double first_start = 1e30;
      for (auto& e : s->events) first_start = std::min(first_start, e.start);
      fprintf(f, "%zu %.6f %.6f %.6f %.6f %.1f\n", s->events.size(), first_start,
              s->backward_end, s->allreduce_seconds, s->exposed_seconds, s->bus_bandwidth);
      fclose(f);
    }
    return 0;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
  FILE* f = fopen(out.c_str(), "r");
  ASSERT_NE(f, nullptr);
  size_t n = 0;
  double first_start, bwd_end, total, exposed, busbw;
  ASSERT_EQ(fscanf(f, "%zu %lf %lf %lf %lf %lf", &n, &first_start, &bwd_end, &total, &exposed,
                   &busbw),
            6);
  fclose(f);
  printf("buckets %zu first_start %.4f backward_end %.4f allreduce %.4f s exposed %.4f s "
         "busbw %.0f B/s\n",
         n, first_start, bwd_end, total, exposed, busbw);
  EXPECT_EQ(n, 4u);
  EXPECT_LT(first_start, bwd_end);
  EXPECT_LT(exposed, total);
  EXPECT_GT(busbw, 0);
}

}  // namespace
}  // namespace dgca
