// JobStore (coordinator/job_store.h): what finished jobs measured for the
// planner (comm probes, step, memory and efficiency measurements, all-reduce
// skews) and the Slurm launcher's records (allocations, topologies). The
// jobs, events and ranks are in job_store.cc.
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job_store.h"
#include "coordinator/job_store_sqlite.h"

namespace dgca {

using store_internal::Stmt;

absl::Status JobStore::AddCommProbeRow(const std::string& node_set, const std::string& backend,
                                       int32_t ranks, const v1::CommProbeRow& row) {
  absl::MutexLock lock(&mu_);
  Stmt ins(db_, "INSERT OR REPLACE INTO comm_measurements(job_id, node_set, backend, ranks,"
                " time_ms, bytes, row) VALUES(?, ?, ?, ?, ?, ?, ?)");
  ins.BindText(1, row.job_id()).BindText(2, node_set).BindText(3, backend);
  ins.Bind(4, int64_t{ranks}).Bind(5, row.time_unix_ms() > 0 ? row.time_unix_ms() : NowUnixMs());
  ins.Bind(6, row.bytes()).Bind(7, row.SerializeAsString());
  if (ins.Step() != SQLITE_DONE) return Error("storing a comm measurement");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::CommProbeRow>> JobStore::CommProbeRows(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt rows(db_, "SELECT row FROM comm_measurements WHERE job_id=? ORDER BY bytes");
  rows.BindText(1, job_id);
  std::vector<v1::CommProbeRow> out;
  int rc;
  while ((rc = rows.Step()) == SQLITE_ROW) {
    v1::CommProbeRow r;
    if (r.ParseFromString(rows.Str(0))) out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Error("reading comm measurement rows");
  return out;
}

absl::StatusOr<CommMeasurement> JobStore::LatestCommMeasurement(const std::string& node_set,
                                                                const std::string& backend,
                                                                int32_t ranks) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT job_id, MAX(time_ms) FROM comm_measurements"
              " WHERE node_set=? AND backend=? AND ranks=?"
              " GROUP BY job_id ORDER BY MAX(time_ms) DESC LIMIT 1");
  q.BindText(1, node_set).BindText(2, backend).Bind(3, int64_t{ranks});
  int rc = q.Step();
  if (rc == SQLITE_DONE) {
    return absl::NotFoundError(absl::StrCat("no comm measurement for nodes ", node_set, ", ",
                                            backend, ", ", ranks, " ranks"));
  }
  if (rc != SQLITE_ROW) return Error("reading comm measurements");
  CommMeasurement m;
  m.job_id = q.Str(0);
  m.time_unix_ms = q.Int(1);
  m.node_set = node_set;
  m.backend = backend;
  m.ranks = ranks;
  Stmt rows(db_, "SELECT row FROM comm_measurements WHERE job_id=? ORDER BY bytes");
  rows.BindText(1, m.job_id);
  while ((rc = rows.Step()) == SQLITE_ROW) {
    v1::CommProbeRow r;
    if (r.ParseFromString(rows.Str(0))) m.rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Error("reading comm measurement rows");
  return m;
}

absl::Status JobStore::AddStepMeasurement(const StepMeasurement& m) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO step_measurements"
              " (job_id, key, micro_batch, compute_s, samples, time_ms, comm_key,"
              " allreduce_probe_s, allreduce_measured_s) VALUES (?,?,?,?,?,?,?,?,?)");
  q.BindText(1, m.job_id).BindText(2, m.key).Bind(3, int64_t{m.micro_batch});
  q.BindDouble(4, m.compute_seconds).Bind(5, m.samples).Bind(6, m.time_unix_ms > 0 ? m.time_unix_ms : NowUnixMs());
  q.BindText(7, m.comm_key).BindDouble(8, m.allreduce_probe_seconds);
  q.BindDouble(9, m.allreduce_measured_seconds);
  if (q.Step() != SQLITE_DONE) return Error("storing a step measurement");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepMeasurement>> JobStore::StepMeasurements(const std::string& key,
                                                                        int limit,
                                                                        int per_micro_batch) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT job_id, micro_batch, compute_s, samples, time_ms FROM step_measurements"
              " WHERE key=? ORDER BY time_ms DESC, rowid DESC");
  if (!q.ok()) return Error("preparing step measurement query");
  q.BindText(1, key);
  std::vector<StepMeasurement> out;
  std::map<int32_t, size_t> index;  // micro-batch -> row of `out`
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    const int32_t micro = static_cast<int32_t>(q.Int(1));
    auto it = index.find(micro);
    if (it == index.end()) {
      if (static_cast<int>(out.size()) >= limit) continue;  // older micro-batches: not wanted
      StepMeasurement m;
      m.job_id = q.Str(0);
      m.key = key;
      m.micro_batch = micro;
      m.samples = q.Int(3);
      m.time_unix_ms = q.Int(4);
      m.jobs.emplace_back(m.job_id, q.Double(2));
      index[micro] = out.size();
      out.push_back(std::move(m));
    } else if (static_cast<int>(out[it->second].jobs.size()) < std::max(1, per_micro_batch)) {
      out[it->second].jobs.emplace_back(q.Str(0), q.Double(2));
    }
  }
  if (rc != SQLITE_DONE) return Error("reading step measurements");
  for (StepMeasurement& m : out) {
    std::vector<double> c;
    for (const auto& j : m.jobs) c.push_back(j.second);
    std::sort(c.begin(), c.end());
    const size_t n = c.size();
    m.compute_seconds = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  }
  return out;
}

absl::Status JobStore::AddMemoryMeasurement(const MemoryMeasurement& m) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO memory_measurements"
              " (job_id, key, micro_batch, peak_bytes, time_ms) VALUES (?,?,?,?,?)");
  q.BindText(1, m.job_id).BindText(2, m.key).Bind(3, int64_t{m.micro_batch});
  q.BindDouble(4, m.peak_bytes).Bind(5, m.time_unix_ms > 0 ? m.time_unix_ms : NowUnixMs());
  if (q.Step() != SQLITE_DONE) return Error("storing a memory measurement");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MemoryMeasurement>> JobStore::MemoryMeasurements(
    const std::string& key, int limit) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT job_id, micro_batch, peak_bytes, time_ms"
              " FROM memory_measurements WHERE key=? ORDER BY time_ms DESC, rowid DESC");
  if (!q.ok()) return Error("preparing memory measurement query");
  q.BindText(1, key);
  std::vector<MemoryMeasurement> out;
  std::set<int32_t> seen;  // micro-batches already in `out` (their newest row)
  int rc = SQLITE_DONE;
  while (static_cast<int>(out.size()) < limit && (rc = q.Step()) == SQLITE_ROW) {
    MemoryMeasurement m;
    m.job_id = q.Str(0);
    m.key = key;
    m.micro_batch = static_cast<int32_t>(q.Int(1));
    m.peak_bytes = q.Double(2);
    m.time_unix_ms = q.Int(3);
    if (seen.insert(m.micro_batch).second) out.push_back(std::move(m));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("reading memory measurements");
  return out;
}

absl::Status JobStore::AddEfficiencyMeasurement(const EfficiencyMeasurement& m) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO efficiency_measurements"
              " (job_id, device_class, micro_batch, efficiency, time_ms) VALUES (?,?,?,?,?)");
  q.BindText(1, m.job_id).BindText(2, m.device_class).Bind(3, int64_t{m.micro_batch});
  q.BindDouble(4, m.efficiency).Bind(5, m.time_unix_ms > 0 ? m.time_unix_ms : NowUnixMs());
  if (q.Step() != SQLITE_DONE) return Error("storing an efficiency measurement");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EfficiencyMeasurement>> JobStore::EfficiencyMeasurements(
    const std::string& device_class, int limit) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT job_id, micro_batch, efficiency, time_ms FROM efficiency_measurements"
              " WHERE device_class=? ORDER BY time_ms DESC, rowid DESC LIMIT ?");
  if (!q.ok()) return Error("preparing efficiency measurement query");
  q.BindText(1, device_class).Bind(2, int64_t{limit});
  std::vector<EfficiencyMeasurement> out;
  int rc = SQLITE_DONE;
  while ((rc = q.Step()) == SQLITE_ROW) {
    EfficiencyMeasurement m;
    m.job_id = q.Str(0);
    m.device_class = device_class;
    m.micro_batch = static_cast<int32_t>(q.Int(1));
    m.efficiency = q.Double(2);
    m.time_unix_ms = q.Int(3);
    out.push_back(std::move(m));
  }
  if (rc != SQLITE_DONE) return Error("reading efficiency measurements");
  return out;
}

absl::Status JobStore::RecordAllocation(const AllocationRecord& a) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO allocations (job_id, attempt, kind, allocation_id, script,"
              " time_ms) VALUES (?, ?, ?, ?, ?, ?)");
  if (!q.ok()) return Error("preparing allocation insert");
  q.BindText(1, a.job_id).Bind(2, int64_t{a.attempt}).BindText(3, a.kind).BindText(4, a.allocation_id)
      .BindText(5, a.script).Bind(6, a.time_unix_ms);
  if (q.Step() != SQLITE_DONE) return Error("storing an allocation");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AllocationRecord>> JobStore::Allocations(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT attempt, kind, allocation_id, script, time_ms FROM allocations"
              " WHERE job_id=? ORDER BY attempt");
  if (!q.ok()) return Error("preparing allocation query");
  q.BindText(1, job_id);
  std::vector<AllocationRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    AllocationRecord a;
    a.job_id = job_id;
    a.attempt = static_cast<int32_t>(q.Int(0));
    a.kind = q.Str(1);
    a.allocation_id = q.Str(2);
    a.script = q.Str(3);
    a.time_unix_ms = q.Int(4);
    out.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) return Error("reading allocations");
  return out;
}

absl::Status JobStore::SetLauncherTopology(const std::string& key, const v1::Topology& topology) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO launcher_topologies (key, topology, time_ms) VALUES (?, ?, ?)");
  if (!q.ok()) return Error("preparing launcher topology insert");
  q.BindText(1, key).Bind(2, topology.SerializeAsString()).Bind(3, NowUnixMs());
  if (q.Step() != SQLITE_DONE) return Error("storing a launcher topology");
  return absl::OkStatus();
}

absl::StatusOr<v1::Topology> JobStore::LauncherTopology(const std::string& key) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT topology FROM launcher_topologies WHERE key=?");
  if (!q.ok()) return Error("preparing launcher topology query");
  q.BindText(1, key);
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("no topology recorded for ", key));
  if (rc != SQLITE_ROW) return Error("reading a launcher topology");
  v1::Topology t;
  if (!t.ParseFromString(q.Str(0))) {
    return absl::DataLossError(absl::StrCat("the stored topology of ", key, " does not parse"));
  }
  return t;
}

absl::StatusOr<std::vector<AllReduceSkew>> JobStore::AllReduceSkews(const std::string& comm_key,
                                                                    int limit) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT job_id, (allreduce_measured_s - allreduce_probe_s) / compute_s, time_ms"
              " FROM step_measurements WHERE comm_key=? AND allreduce_probe_s > 0"
              " AND allreduce_measured_s > 0 AND compute_s > 0"
              " ORDER BY time_ms DESC, rowid DESC LIMIT ?");
  if (!q.ok()) return Error("preparing all-reduce skew query");
  q.BindText(1, comm_key).Bind(2, int64_t{limit});
  std::vector<AllReduceSkew> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.push_back({q.Str(0), q.Double(1), q.Int(2)});
  if (rc != SQLITE_DONE) return Error("reading all-reduce skews");
  return out;
}

}  // namespace dgca
