// JobStore's comm_measurements table (dgca diagnose comm results): rows are
// keyed by node set, backend and ranks; the newest probe job wins; rows come
// back by size and survive reopening the database.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "coordinator/job_store.h"
#include "model/core/core_test_util.h"

namespace dgca {
namespace {

v1::CommProbeRow Row(const std::string& job, int64_t bytes, double secs, int64_t t) {
  v1::CommProbeRow r;
  r.set_job_id(job);
  r.set_bytes(bytes);
  r.set_seconds_per_op(secs);
  r.set_busbw_bytes_per_second(bytes / secs);
  r.set_backend("gloo");
  r.set_world_size(2);
  r.set_time_unix_ms(t);
  return r;
}

TEST(CommMeasurementsTest, LatestPerKeyByJobAndSize) {
  const std::string dir = testutil::MakeTempDir("comm_measurements_test");
  ASSERT_FALSE(dir.empty());
  std::string db = dir + "/dgca.db";
  {
    auto s = JobStore::Open(db);
    ASSERT_TRUE(s.ok()) << s.status();
    JobStore& st = **s;
    EXPECT_EQ(st.LatestCommMeasurement("a", "gloo", 2).status().code(),
              absl::StatusCode::kNotFound);
    ASSERT_TRUE(st.AddCommProbeRow("a", "gloo", 2, Row("j-1", 65536, 2e-3, 1000)).ok());
    ASSERT_TRUE(st.AddCommProbeRow("a", "gloo", 2, Row("j-1", 4096, 1e-3, 1001)).ok());
    ASSERT_TRUE(st.AddCommProbeRow("a", "gloo", 2, Row("j-2", 4096, 5e-4, 2000)).ok());
    ASSERT_TRUE(st.AddCommProbeRow("a", "nccl", 2, Row("j-3", 4096, 1e-5, 3000)).ok());
    ASSERT_TRUE(st.AddCommProbeRow("a,b", "gloo", 2, Row("j-4", 4096, 1e-2, 4000)).ok());
  }
  auto s = JobStore::Open(db);  // reopened: the rows are durable
  ASSERT_TRUE(s.ok());
  auto m = (*s)->LatestCommMeasurement("a", "gloo", 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job_id, "j-2");
  EXPECT_EQ(m->time_unix_ms, 2000);
  ASSERT_EQ(m->rows.size(), 1u);
  EXPECT_DOUBLE_EQ(m->rows[0].seconds_per_op(), 5e-4);
  auto rows = (*s)->CommProbeRows("j-1");
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].bytes(), 4096);  // by size
  EXPECT_EQ((*rows)[1].bytes(), 65536);
  EXPECT_EQ((*s)->LatestCommMeasurement("a", "gloo", 4).status().code(),
            absl::StatusCode::kNotFound);
}

// Step measurements (finished jobs' compute per micro-step): the newest of
// each micro-batch per key; skews = (measured - probe all-reduce) / compute,
// newest first, only for jobs with a probe prediction.
TEST(CommMeasurementsTest, StepMeasurementsNewestPerMicroBatchAndSkews) {
  const std::string dir = testutil::MakeTempDir("step_measurements_test");
  ASSERT_FALSE(dir.empty());
  std::string db = dir + "/dgca.db";
  auto add = [](JobStore& st, const std::string& job, const std::string& key, int m, double c,
                int64_t t, double probe, double measured) {
    StepMeasurement x;
    x.job_id = job;
    x.key = key;
    x.micro_batch = m;
    x.compute_seconds = c;
    x.samples = 20;
    x.time_unix_ms = t;
    x.comm_key = "vm|gloo|2";
    x.allreduce_probe_seconds = probe;
    x.allreduce_measured_seconds = measured;
    return st.AddStepMeasurement(x);
  };
  {
    auto s = JobStore::Open(db);
    ASSERT_TRUE(s.ok()) << s.status();
    JobStore& st = **s;
    auto none = st.StepMeasurements("k", 6);
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
    ASSERT_TRUE(add(st, "j-1", "k", 4, 0.05, 1000, 0.010, 0.012).ok());
    ASSERT_TRUE(add(st, "j-2", "k", 12, 0.12, 2000, 0.010, 0.016).ok());
    ASSERT_TRUE(add(st, "j-3", "k", 4, 0.06, 3000, 0, 0.02).ok());  // no probe prediction
    ASSERT_TRUE(add(st, "j-4", "other", 8, 1.0, 4000, 0.010, 0.011).ok());
  }
  auto s = JobStore::Open(db);  // durable
  ASSERT_TRUE(s.ok());
  auto m = (*s)->StepMeasurements("k", 6);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].job_id, "j-3");  // the newest job's micro-batch first
  EXPECT_EQ((*m)[0].micro_batch, 4);
  // Two jobs of m=4: their median (the mean of the middle pair).
  EXPECT_DOUBLE_EQ((*m)[0].compute_seconds, 0.055);
  ASSERT_EQ((*m)[0].jobs.size(), 2u);
  EXPECT_EQ((*m)[0].jobs[0].first, "j-3");
  EXPECT_EQ((*m)[0].jobs[1].first, "j-1");
  EXPECT_EQ((*m)[1].job_id, "j-2");
  EXPECT_EQ((*m)[1].micro_batch, 12);
  EXPECT_DOUBLE_EQ((*m)[1].compute_seconds, 0.12);
  auto one = (*s)->StepMeasurements("k", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
  // Only the newest of each micro-batch when asked so.
  auto newest = (*s)->StepMeasurements("k", 6, 1);
  ASSERT_TRUE(newest.ok());
  EXPECT_DOUBLE_EQ((*newest)[0].compute_seconds, 0.06);
  {
    JobStore& st = **s;
    ASSERT_TRUE(add(st, "j-5", "k", 4, 0.30, 5000, 0, 0).ok());  // disturbed: 5x
    auto d = st.StepMeasurements("k", 6);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ((*d)[0].job_id, "j-5");
    EXPECT_DOUBLE_EQ((*d)[0].compute_seconds, 0.06);  // median of 0.30, 0.06, 0.05
    ASSERT_TRUE(add(st, "j-6", "k", 4, 0.07, 6000, 0, 0).ok());
    d = st.StepMeasurements("k", 6);
    ASSERT_TRUE(d.ok());
    ASSERT_EQ((*d)[0].jobs.size(), 3u);  // j-1 has aged out
    EXPECT_DOUBLE_EQ((*d)[0].compute_seconds, 0.07);  // median of 0.07, 0.30, 0.06
  }
  auto sk = (*s)->AllReduceSkews("vm|gloo|2", 5);
  ASSERT_TRUE(sk.ok()) << sk.status();
  ASSERT_EQ(sk->size(), 3u);  // j-3, j-5, j-6 have no probe prediction
  EXPECT_EQ((*sk)[0].job_id, "j-4");
  EXPECT_NEAR((*sk)[0].skew, 0.001 / 1.0, 1e-12);
  EXPECT_EQ((*sk)[1].job_id, "j-2");
  EXPECT_NEAR((*sk)[1].skew, 0.006 / 0.12, 1e-12);
  EXPECT_NEAR((*sk)[2].skew, 0.002 / 0.05, 1e-12);
}

absl::Status AddMemory(JobStore& st, const std::string& job, const std::string& key, int m,
                       double peak, int64_t t) {
  MemoryMeasurement x;
  x.job_id = job;
  x.key = key;
  x.micro_batch = m;
  x.peak_bytes = peak;
  x.time_unix_ms = t;
  return st.AddMemoryMeasurement(x);
}

// memory_measurements: per key, the newest row of each micro-batch (newest
// first, at most `limit` micro-batches), a job's second row replaces its
// first, and the rows survive reopening the database.
TEST(CommMeasurementsTest, MemoryMeasurementsNewestPerKey) {
  const std::string dir = testutil::MakeTempDir("memory_measurements_test");
  ASSERT_FALSE(dir.empty());
  const std::string db = dir + "/dgca.db";
  {
    auto s = JobStore::Open(db);
    ASSERT_TRUE(s.ok()) << s.status();
    JobStore& st = **s;
    auto none = st.MemoryMeasurements("k", 4);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_TRUE(none->empty());
    ASSERT_TRUE(AddMemory(st, "j-1", "k", 16, 2e8, 1000).ok());
    ASSERT_TRUE(AddMemory(st, "j-2", "k", 32, 3e8, 2000).ok());
    ASSERT_TRUE(AddMemory(st, "j-3", "other", 8, 9e8, 3000).ok());
    ASSERT_TRUE(AddMemory(st, "j-1", "k", 16, 2.5e8, 1500).ok());  // replaces j-1's row
    ASSERT_TRUE(AddMemory(st, "j-4", "k", 32, 3.5e8, 2500).ok());  // newer at 32: hides j-2
    ASSERT_TRUE(AddMemory(st, "j-5", "k", 8, 1e8, 500).ok());      // the oldest micro-batch
  }
  auto s = JobStore::Open(db);
  ASSERT_TRUE(s.ok()) << s.status();
  auto m = (*s)->MemoryMeasurements("k", 4);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].job_id, "j-4");
  EXPECT_EQ((*m)[0].micro_batch, 32);
  EXPECT_DOUBLE_EQ((*m)[0].peak_bytes, 3.5e8);
  EXPECT_EQ((*m)[0].time_unix_ms, 2500);
  EXPECT_EQ((*m)[1].job_id, "j-1");
  EXPECT_DOUBLE_EQ((*m)[1].peak_bytes, 2.5e8);
  EXPECT_EQ((*m)[2].job_id, "j-5");
  auto two = (*s)->MemoryMeasurements("k", 2);  // the newest two micro-batches
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].micro_batch, 16);
  auto other = (*s)->MemoryMeasurements("other", 4);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->size(), 1u);
  EXPECT_EQ((*other)[0].job_id, "j-3");
}

// A failed job's peak (stored by coordinators before 2026-11-26) is dropped
// when the database is opened: one that ran out of memory understates what
// its micro-batch needs. Other jobs' peaks stay.
TEST(CommMeasurementsTest, AFailedJobsStoredPeakIsForgottenOnOpen) {
  const std::string dir = testutil::MakeTempDir("memory_failed_test");
  ASSERT_FALSE(dir.empty());
  const std::string db = dir + "/dgca.db";
  std::string failed, done;
  {
    auto s = JobStore::Open(db);
    ASSERT_TRUE(s.ok()) << s.status();
    v1::JobSpec spec;
    spec.set_name("m");
    auto f = (*s)->CreateJob(spec, "name: m\n");
    auto d = (*s)->CreateJob(spec, "name: m\n");
    ASSERT_TRUE(f.ok() && d.ok());
    failed = f->id();
    done = d->id();
    ASSERT_TRUE((*s)->SetState(failed, v1::FAILED, "rank 0 ran out of memory").ok());
    ASSERT_TRUE((*s)->SetState(done, v1::SUCCEEDED, "done").ok());
    ASSERT_TRUE(AddMemory(**s, failed, "k", 64, 1e9, 1000).ok());
    ASSERT_TRUE(AddMemory(**s, done, "k", 16, 1e9, 1000).ok());
    ASSERT_EQ((*s)->MemoryMeasurements("k", 4)->size(), 2u);  // until the next open
  }
  auto s = JobStore::Open(db);
  ASSERT_TRUE(s.ok()) << s.status();
  auto m = (*s)->MemoryMeasurements("k", 4);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].job_id, done);
}

}  // namespace
}  // namespace dgca
