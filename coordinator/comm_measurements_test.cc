// JobStore's comm_measurements table (dgca diagnose comm results): rows are
// keyed by node set, backend and ranks; the newest probe job wins; rows come
// back by size and survive reopening the database.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "coordinator/job_store.h"

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
  char tmpl[] = "/tmp/comm_measurements_test.XXXXXX";
  std::string dir = mkdtemp(tmpl);
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
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dgca
