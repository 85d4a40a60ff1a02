// Durable job store: SQLite file STATE_DIR/dgca.db.
//
// Tables: meta (schema_version), jobs (id, name, state, spec proto bytes,
// spec yaml, plan proto bytes, message, created/updated, restarts, last eval,
// last step), events (append-only history: job_id, seq, time, state, kind,
// message), comm_measurements (dgca diagnose comm results) and ranks (the rank processes launched for a job: node, pid,
// pgid, attempt — so a restarted coordinator can find and kill orphans).
//
// Durability: journal_mode=WAL with synchronous=FULL. Writes happen only on
// job transitions and launches (a handful per job, never per step), so the
// extra fsync per commit costs nothing measurable, and FULL makes every
// committed transition survive power loss as well as `kill -9` (NORMAL in WAL
// mode only guarantees the latter). Every write is one transaction; a state
// change and its event are committed together.
//
// Job ids: "j-NNNNNN-xxxx": a zero-padded per-database counter (so ids sort
// by creation) and 4 random hex digits (so ids from two state dirs differ).
//
// Damage: Open runs PRAGMA quick_check and refuses damaged pages. Bytes
// flipped inside a row's text or blobs pass that check (SQLite keeps no
// checksums); GetJob, ListJobs and ListEvents check what they read (UTF-8
// text, parseable protos) and give DATA_LOSS naming the store, the job and
// how to recover, so a reply never carries bytes its client cannot parse.
// SQLite's own SQLITE_CORRUPT is DATA_LOSS too; other SQLite errors are
// INTERNAL.
//
// Thread-safety: all methods are thread-safe (one connection behind a mutex).
#ifndef DGCA_COORDINATOR_JOB_STORE_H_
#define DGCA_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dgca/v1/job.pb.h"
#include "dgca/v1/topology.pb.h"
#include "dgca/v1/metrics.pb.h"
#include "dgca/v1/plan.pb.h"

struct sqlite3;

namespace dgca {

struct StoredJob {
  v1::Job job;      // id, name, state, spec, spec_yaml, times, message, eval, restarts, step, progress
  v1::Plan plan;    // Empty until planned.
  bool has_plan = false;
};

struct StoredRank {
  std::string job_id;
  int32_t rank = 0;
  int32_t attempt = 0;
  std::string node;
  int32_t pid = 0;
  int32_t pgid = 0;
};

// The all-reduce sweep of one `dgca diagnose comm` job, keyed by
// the node set (sorted node names joined by ","), backend and rank count.
// A job's measured compute time per micro-step (table step_measurements),
// the planner's c(m). `key` names everything the timing depends on besides
// the micro-batch (StepKey in coordinator/measured_planning.h: nodes, device, ranks, threads,
// precision, sequence length, model).
struct StepMeasurement {
  std::string job_id;
  std::string key;
  int32_t micro_batch = 0;
  double compute_seconds = 0;  // per micro-step, exposed communication excluded
  int64_t samples = 0;         // (rank, step) pairs behind the median
  int64_t time_unix_ms = 0;
  // The job's all-reduce per step: what the probe predicted (without any
  // in-job factor; 0 = no measured link) and what the ranks measured.
  // comm_key = "node_set|backend|ranks".
  std::string comm_key;
  double allreduce_probe_seconds = 0;
  double allreduce_measured_seconds = 0;
  // Filled by StepMeasurements: the jobs behind compute_seconds, newest
  // first, with their own compute per micro-step.
  std::vector<std::pair<std::string, double>> jobs;
};

// The most memory a finished job's ranks held (table memory_measurements):
// what the planner's memory model is corrected with for the next job of the
// same key (StepKey plus the attention kernels).
struct MemoryMeasurement {
  std::string job_id;
  std::string key;
  int32_t micro_batch = 0;
  double peak_bytes = 0;  // the rank that held the most
  int64_t time_unix_ms = 0;
};

// What a finished job's compute reached of the compute prior's ideal time
// on its device class (table efficiency_measurements; planner/
// compute_prior.h): the efficiency the next plan on that class, of any
// model, predicts with.
struct EfficiencyMeasurement {
  std::string job_id;
  std::string device_class;  // Plan.compute_device_class
  int32_t micro_batch = 0;
  double efficiency = 0;     // ideal c(m) / measured c(m)
  int64_t time_unix_ms = 0;
};

// A job's allocation in a cluster scheduler (table allocations): the
// attempt it serves and the scheduler's id of it, so that a restarted
// coordinator finds it again instead of asking for another.
struct AllocationRecord {
  std::string job_id;
  int32_t attempt = 0;
  std::string kind;           // "slurm"
  std::string allocation_id;  // Slurm's job id
  std::string script;         // the sbatch script's path
  int64_t time_unix_ms = 0;
};

// (measured - probe-predicted all-reduce time) / measured compute, of one job.
struct AllReduceSkew {
  std::string job_id;
  double skew = 0;
  int64_t time_unix_ms = 0;
};

struct CommMeasurement {
  std::string job_id;
  std::string node_set;
  std::string backend;
  int32_t ranks = 0;
  int64_t time_unix_ms = 0;            // newest row's time
  std::vector<v1::CommProbeRow> rows;  // by size
};

class JobStore {
 public:
  // 2: specs stored by version 1 (before model.dropout existed, when
  // training had no dropout) get dropout {hidden: 0, attention: 0} when the
  // store is opened, so a job resumed or restarted after the upgrade trains
  // as it began; an unset field would now mean the default 0.1.
  static constexpr int kSchemaVersion = 2;

  // Opens (creating if needed) the database at `path`. A file that is not a
  // SQLite database, or has a newer schema, gives FAILED_PRECONDITION naming
  // the file and what to do; one whose pages are damaged (PRAGMA
  // quick_check) gives DATA_LOSS naming it and how to recover, and is left
  // as it is. A missing or empty file is a fresh store: see RequireExisting.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);

  // FAILED_PRECONDITION when the store at `path` is missing or empty (0
  // bytes) although one must be there: its state dir shows earlier use,
  // which `evidence` names ("STATE/coordinator.json exists"). The message
  // says how to restore it, or to start with --new-store on purpose. OK
  // otherwise (a file with contents is Open's to judge).
  static absl::Status RequireExisting(const std::string& path, const std::string& evidence);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new job in PENDING with a first event ("state", "submitted").
  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec, const std::string& spec_yaml);

  // Sets state and message, and appends an event (kind, event_message; the
  // event message defaults to `message` when empty). NOT_FOUND for unknown ids.
  absl::StatusOr<v1::JobEvent> SetState(const std::string& id, v1::JobState state,
                                        const std::string& message,
                                        const std::string& kind = "state",
                                        const std::string& event_message = "");
  // Appends an event with the job's current state.
  absl::StatusOr<v1::JobEvent> AppendEvent(const std::string& id, const std::string& kind,
                                           const std::string& message);
  absl::Status SetPlan(const std::string& id, const v1::Plan& plan);
  absl::Status SetRestarts(const std::string& id, int32_t restarts);
  // Sets restarts and appends a "restart" event with `message` in one
  // transaction (a restarted coordinator must never see one without the
  // other: it would count the restart twice).
  absl::StatusOr<v1::JobEvent> RecordRestart(const std::string& id, int32_t restarts,
                                             const std::string& message);
  // Persists progress: step, eval, ranks, loss, samples_per_second,
  // eta_seconds, plan_check, loss_curve, launcher, final_loss (with its
  // steps and ranks), exit and peak_memory_bytes of `progress` (other
  // fields ignored). GetJob and ListJobs read them back, with
  // started_unix_ms and ended_unix_ms from the job's events.
  absl::Status SetProgress(const std::string& id, const v1::Job& progress);

  absl::StatusOr<StoredJob> GetJob(const std::string& id);
  // Newest first. Empty `states` = all; limit 0 = all.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const std::vector<v1::JobState>& states,
                                                int limit);
  // Number of jobs in each state (states with none are absent).
  absl::StatusOr<std::map<v1::JobState, int>> CountByState();
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(const std::string& id,
                                                       int64_t after_seq);

  // Rank processes: recorded at launch (replacing the same rank's row).
  absl::Status RecordRank(const StoredRank& r);
  absl::StatusOr<std::vector<StoredRank>> ListRanks(const std::string& job_id);
  absl::Status ClearRanks(const std::string& job_id);
  // Removes the job's row, events, ranks and allocations in one
  // transaction; NOT_FOUND when there is no such job. The measurements it
  // left for the planner (step, memory, efficiency, comm) stay.
  absl::Status DeleteJob(const std::string& job_id);

  // Comm probe results (table comm_measurements). One row per
  // (job, size); a second row for the same size replaces the first.
  absl::Status AddCommProbeRow(const std::string& node_set, const std::string& backend,
                               int32_t ranks, const v1::CommProbeRow& row);
  // One probe job's rows, by size (empty when it stored none).
  absl::StatusOr<std::vector<v1::CommProbeRow>> CommProbeRows(const std::string& job_id);
  // The newest probe job's rows for this key; NOT_FOUND when there is none.
  absl::StatusOr<CommMeasurement> LatestCommMeasurement(const std::string& node_set,
                                                        const std::string& backend,
                                                        int32_t ranks);

  // Step-time measurements (table step_measurements). One row per job; a
  // second row for the same job replaces the first.
  absl::Status AddStepMeasurement(const StepMeasurement& m);
  // One row per micro-batch for `key` (the micro-batch of the newest job
  // first), at most `limit` rows (empty when there is none). Each row is the
  // newest job's, except compute_seconds: the median over that micro-batch's
  // newest `per_micro_batch` jobs, listed in `jobs` (so one disturbed job
  // does not move the prediction once there are three).
  absl::StatusOr<std::vector<StepMeasurement>> StepMeasurements(const std::string& key,
                                                                int limit,
                                                                int per_micro_batch = 3);
  // Memory measurements: one row per job (a second replaces the first).
  // MemoryMeasurements gives, for `key`, the newest row of each micro-batch,
  // newest first, at most `limit` micro-batches (empty when there is none).
  absl::Status AddMemoryMeasurement(const MemoryMeasurement& m);
  absl::StatusOr<std::vector<MemoryMeasurement>> MemoryMeasurements(const std::string& key,
                                                                    int limit);
  // Efficiency measurements: one row per job (a second replaces the first);
  // EfficiencyMeasurements gives the newest `limit` of `device_class`,
  // newest first (empty when there is none).
  absl::Status AddEfficiencyMeasurement(const EfficiencyMeasurement& m);
  absl::StatusOr<std::vector<EfficiencyMeasurement>> EfficiencyMeasurements(
      const std::string& device_class, int limit);
  // The newest jobs' all-reduce skews for comm_key, newest first.
  // Allocations (a launcher: slurm job's, one per attempt; a second record
  // of the same attempt replaces the first).
  absl::Status RecordAllocation(const AllocationRecord& a);
  // Every allocation of `job_id`, by attempt.
  absl::StatusOr<std::vector<AllocationRecord>> Allocations(const std::string& job_id);
  // The topology a launcher's nodes last reported under `key` (e.g.
  // "slurm:gpu": what the next plan of a job on that partition assumes
  // before Slurm allocates its nodes). NOT_FOUND when none.
  absl::Status SetLauncherTopology(const std::string& key, const v1::Topology& topology);
  absl::StatusOr<v1::Topology> LauncherTopology(const std::string& key);

  absl::StatusOr<std::vector<AllReduceSkew>> AllReduceSkews(const std::string& comm_key,
                                                            int limit);

 private:
  explicit JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  absl::Status Init();
  // Version 1 -> 2 (see kSchemaVersion), in one transaction.
  absl::Status MigrateToV2();
  absl::StatusOr<v1::JobEvent> AppendEventLocked(const std::string& id, v1::JobState state,
                                                 const std::string& kind,
                                                 const std::string& message, int64_t now);
  absl::Status Error(const char* what);

  absl::Mutex mu_;
  sqlite3* db_;  // used only with mu_ held (one connection, not shared)
  std::string path_;
};

int64_t NowUnixMs();

}  // namespace dgca

#endif  // DGCA_COORDINATOR_JOB_STORE_H_
