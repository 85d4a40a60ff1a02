#include "coordinator/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "coordinator/job_store_sqlite.h"
#include "model/core/utf8.h"

namespace dgca {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using store_internal::Stmt;
using store_internal::Txn;

namespace {

// started_ms and ended_ms (Job.started_unix_ms, ended_unix_ms) come from
// the job's events: its first RUNNING one, its first in a final state. The
// events are durable and written with each state change, so the two need
// no column of their own and survive a coordinator restart as they are.
constexpr char kJobColumns[] =
    "id, name, state, spec, spec_yaml, message, created_ms, updated_ms, restarts, eval, "
    "last_step, plan, "
    "(SELECT MIN(e.time_ms) FROM events e WHERE e.job_id=jobs.id AND e.state=3), "
    "(SELECT MIN(e.time_ms) FROM events e WHERE e.job_id=jobs.id AND e.state IN (4,5,6))";

// "" unless the file system holding `path` is (nearly) full, then what that
// means for the store: SQLite needs room for its journal and WAL index even
// to read, so a full disk looks like an I/O error, not like a damaged file.
std::string DiskFull(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  struct statvfs st;
  if (statvfs(dir.empty() ? "." : dir.c_str(), &st) != 0) return "";
  const double free_bytes = static_cast<double>(st.f_bavail) * st.f_frsize;
  if (free_bytes >= 1024.0 * 1024) return "";
  return absl::StrFormat(
      "the file system holding %s has %.0f KiB free: free space there and start again (%s "
      "itself was not changed; do not move it aside or start with --new-store, which would "
      "lose the job history)",
      dir.empty() ? "." : dir, free_bytes / 1024, path);
}

// What to do with a damaged store: its file named, nothing overwritten.
std::string RecoveryHint(const std::string& path) {
  // .dump, not .recover: Debian 12's sqlite3 lacks the page access .recover
  // needs. .dump stops at a damaged page and ends "ROLLBACK; -- due to
  // errors"; the sed commits what it read up to there instead.
  return absl::StrCat(
      "keep the file. Salvage the rows SQLite can still read with `sqlite3 ", path,
      " .dump | sed 's/^ROLLBACK; -- due to errors$/COMMIT;/' | sqlite3 ", path,
      ".recovered` (Debian package sqlite3), then move ", path, " and its -wal and -shm files "
      "aside and ", path, ".recovered to ", path,
      "; or move them aside and start with --new-store (an empty store: the job history is lost)");
}

// A text column a proto3 string field will carry: the client refuses a
// reply holding invalid UTF-8 ("No message returned for unary request"),
// so damaged text is reported here instead of being sent.
bool ValidText(const std::string& s) { return FindInvalidUtf8(s) == std::string_view::npos; }

// The job's id as it can be printed (a damaged id is hex-escaped).
std::string Printable(const std::string& id) {
  return ValidText(id) ? id : absl::StrCat("'", absl::CHexEscape(id), "'");
}

// The id as an SQL literal for the sqlite3 shell: quoted, or (damaged) as
// its bytes.
std::string SqlLiteral(const std::string& id) {
  if (ValidText(id) && id.find('\'') == std::string::npos) return absl::StrCat("'", id, "'");
  return absl::StrCat("CAST(X'", absl::BytesToHexString(id), "' AS TEXT)");
}

// DATA_LOSS for a row that SQLite reads but whose contents are not what
// this store wrote (bytes flipped inside it: no page check sees that, and a
// copy of the store keeps them). `drop` is the SQL that removes the row.
absl::Status DamagedRow(const std::string& path, const std::string& what, const std::string& drop) {
  return absl::DataLossError(absl::StrCat(
      "job database ", path, " is damaged: ", what, ". Stop the coordinator and keep a copy of ",
      path, "; then drop what is damaged with `sqlite3 ", path, " \"", drop,
      "\"` (that history is lost), or move the store aside and start with --new-store (an empty "
      "store: all history is lost)"));
}

// The SQL that drops a job and everything stored under it.
std::string DropJob(const std::string& id) {
  const std::string lit = SqlLiteral(id);
  return absl::StrCat("DELETE FROM events WHERE job_id=", lit, "; DELETE FROM ranks WHERE job_id=",
                      lit, "; DELETE FROM jobs WHERE id=", lit);
}

absl::Status ReadJobRow(Stmt& s, const std::string& path, StoredJob* out) {
  v1::Job& j = out->job;
  const std::string id = s.Str(0);
  auto damaged = [&](const char* field, const char* how) {
    return DamagedRow(path, absl::StrCat("job ", Printable(id), "'s ", field, " ", how),
                      DropJob(id));
  };
  if (!ValidText(id)) return damaged("id", "is not valid UTF-8");
  j.set_id(id);
  for (const auto& [column, field] : {std::pair<int, const char*>{1, "name"}, {4, "spec_yaml"},
                                      {5, "message"}}) {
    if (!ValidText(s.Str(column))) return damaged(field, "is not valid UTF-8");
  }
  j.set_name(s.Str(1));
  j.set_state(static_cast<v1::JobState>(s.Int(2)));
  if (!j.mutable_spec()->ParseFromString(s.Str(3))) return damaged("spec", "does not parse");
  j.set_spec_yaml(s.Str(4));
  j.set_message(s.Str(5));
  j.set_created_unix_ms(s.Int(6));
  j.set_updated_unix_ms(s.Int(7));
  j.set_restarts(static_cast<int32_t>(s.Int(8)));
  v1::Job eval_holder;
  if (!eval_holder.ParseFromString(s.Str(9))) return damaged("progress", "does not parse");
  *j.mutable_eval() = eval_holder.eval();
  *j.mutable_ranks() = eval_holder.ranks();
  j.set_loss(eval_holder.loss());
  j.set_samples_per_second(eval_holder.samples_per_second());
  j.set_eta_seconds(eval_holder.eta_seconds());
  if (eval_holder.has_plan_check()) *j.mutable_plan_check() = eval_holder.plan_check();
  *j.mutable_loss_curve() = eval_holder.loss_curve();
  if (eval_holder.has_launcher()) *j.mutable_launcher() = eval_holder.launcher();
  if (eval_holder.has_final_loss()) {
    j.set_final_loss(eval_holder.final_loss());
    j.set_final_loss_steps(eval_holder.final_loss_steps());
    j.set_final_loss_ranks(eval_holder.final_loss_ranks());
  }
  if (eval_holder.has_exit()) *j.mutable_exit() = eval_holder.exit();
  j.set_peak_memory_bytes(eval_holder.peak_memory_bytes());
  j.set_started_unix_ms(s.Int(12));  // NULL (no such event) reads 0
  j.set_ended_unix_ms(s.Int(13));
  j.set_step(s.Int(10));
  j.set_total_steps(j.spec().train().steps());
  std::string plan = s.Str(11);
  out->has_plan = !plan.empty();
  if (out->has_plan && !out->plan.ParseFromString(plan)) return damaged("plan", "does not parse");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open job database ", path, ": ", msg));
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  absl::Status s = store->Init();
  if (!s.ok()) return s;
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Error(const char* what) {
  const int code = sqlite3_errcode(db_);
  if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
    return absl::DataLossError(absl::StrCat("job database ", path_, ": ", what, ": ",
                                            sqlite3_errmsg(db_), "; the file is damaged: ",
                                            RecoveryHint(path_)));
  }
  return absl::InternalError(absl::StrCat("job database ", path_, ": ", what, ": ",
                                          sqlite3_errmsg(db_)));
}

absl::Status JobStore::RequireExisting(const std::string& path, const std::string& evidence) {
  struct stat st;
  std::string what;
  if (stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot use job database ", path, ": ", strerror(errno)));
    }
    what = "is missing";
  } else if (S_ISREG(st.st_mode) && st.st_size == 0) {
    what = "is empty (0 bytes)";
  } else {
    return absl::OkStatus();  // anything else is Open's to judge
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job database ", path, " ", what, ", but its state dir has been used before (", evidence,
      "): starting would begin an empty store and lose the job history without a word. Restore ",
      path, " (with its -wal file) from a backup, or, to begin an empty store on purpose, start "
      "with --new-store"));
}

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    if (const std::string full = DiskFull(path_); !full.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("job database ", path_, ": ", msg, ": ", full));
    }
    return absl::FailedPreconditionError(absl::StrCat("job database ", path_, ": ", msg));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Init() {
  sqlite3_busy_timeout(db_, 5000);
  // Read-only first: the tables already there. A file that is not a
  // database fails here; one that is somebody else's SQLite database (tables,
  // but no dgca schema version) is refused before anything is written to it
  // (it used to get dgca's tables and WAL mode, then fail on its own `jobs`).
  {
    Stmt tables(db_, "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name");
    if (!tables.ok()) {
      if (sqlite3_errcode(db_) == SQLITE_CORRUPT) {
        return absl::DataLossError(absl::StrCat("job database ", path_, " is damaged (",
                                                sqlite3_errmsg(db_), "): ", RecoveryHint(path_)));
      }
      if (const std::string full = DiskFull(path_); !full.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("job database ", path_, ": ", sqlite3_errmsg(db_), ": ", full));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "job database ", path_, ": ", sqlite3_errmsg(db_), " (", path_,
          " is not a usable dgca job database; move it aside and start with --new-store to "
          "begin an empty store)"));
    }
    std::vector<std::string> names;
    int rc;
    while ((rc = tables.Step()) == SQLITE_ROW) names.push_back(tables.Str(0));
    if (rc != SQLITE_DONE) {
      return absl::DataLossError(absl::StrCat("job database ", path_, " is damaged (",
                                              sqlite3_errmsg(db_), "): ", RecoveryHint(path_)));
    }
    // Damaged pages are refused here, before anything is written: opened
    // as they were, they passed start-up and failed later reads one by one.
    // quick_check walks every page (integrity_check would also cross-check
    // the indexes, at more cost than a start should take on a big store);
    // it cannot see flipped bytes inside a row's text, which the reads
    // check (ReadJobRow).
    if (!names.empty()) {
      Stmt check(db_, "PRAGMA quick_check(20)");
      std::vector<std::string> rows;
      rc = SQLITE_ERROR;
      while (check.ok() && (rc = check.Step()) == SQLITE_ROW) rows.push_back(check.Str(0));
      // Only damage is damage: a store another process holds locked (an
      // operator's sqlite3 shell, a backup), an I/O error or no memory is
      // said as it is, not with advice to dump and replace the store.
      const int primary = rc & 0xff;
      if (rc != SQLITE_DONE && rc != SQLITE_ROW && primary != SQLITE_CORRUPT &&
          primary != SQLITE_NOTADB) {
        return absl::UnavailableError(absl::StrCat(
            "cannot check job database ", path_, " (PRAGMA quick_check: ", sqlite3_errmsg(db_),
            "); nothing was changed: try again once whatever holds or breaks it is gone"));
      }
      if (rc != SQLITE_DONE || rows.size() != 1 || rows[0] != "ok") {
        // One line: its first problems (a row may hold several lines, and
        // a "*** in database main ***" heading).
        std::vector<std::string> problems;
        for (const std::string& row : rows) {
          for (absl::string_view line : absl::StrSplit(row, '\n', absl::SkipEmpty())) {
            if (!absl::StartsWith(line, "***")) problems.emplace_back(line);
          }
        }
        if (problems.empty()) problems.push_back(sqlite3_errmsg(db_));
        const size_t shown = std::min<size_t>(problems.size(), 3);
        std::string what = absl::StrJoin(problems.begin(), problems.begin() + shown, "; ");
        if (problems.size() > shown) absl::StrAppend(&what, "; and more");
        return absl::DataLossError(absl::StrCat("job database ", path_,
                                                " is damaged (PRAGMA quick_check: ", what,
                                                "); it was left as it is: ", RecoveryHint(path_)));
      }
    }
    bool versioned = false;
    if (std::find(names.begin(), names.end(), "meta") != names.end()) {
      Stmt v(db_, "SELECT value FROM meta WHERE key='schema_version'");
      versioned = v.ok() && v.Step() == SQLITE_ROW;
    }
    if (!names.empty() && !versioned) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job database ", path_, " is an SQLite database but not a dgca job database (tables ",
          absl::StrJoin(names, ", "), ", no dgca schema version); it was left as it is: move it aside "
          "or use another --state-dir"));
    }
  }
  absl::Status s = Exec("PRAGMA journal_mode=WAL");
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        s.message(), " (", path_,
        " is not a usable dgca job database; move it aside and start with --new-store to begin "
        "an empty store)"));
  }
  for (const char* sql : {
           "PRAGMA synchronous=FULL",
           "PRAGMA foreign_keys=ON",
           "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
           "CREATE TABLE IF NOT EXISTS jobs ("
           " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,"
           " state INTEGER NOT NULL, spec BLOB, spec_yaml TEXT, plan BLOB, message TEXT,"
           " created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
           " restarts INTEGER NOT NULL DEFAULT 0, eval BLOB /* v1::Job: eval, ranks, loss, sps, eta */, last_step INTEGER NOT NULL DEFAULT 0)",
           "CREATE TABLE IF NOT EXISTS events ("
           " job_id TEXT NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
           " state INTEGER NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL,"
           " PRIMARY KEY (job_id, seq))",
           "CREATE TABLE IF NOT EXISTS ranks ("
           " job_id TEXT NOT NULL, rank INTEGER NOT NULL, attempt INTEGER NOT NULL,"
           " node TEXT NOT NULL, pid INTEGER NOT NULL, pgid INTEGER NOT NULL,"
           " PRIMARY KEY (job_id, rank))",
           // `dgca diagnose comm` results, one row per size.
           "CREATE TABLE IF NOT EXISTS comm_measurements ("
           " job_id TEXT NOT NULL, node_set TEXT NOT NULL, backend TEXT NOT NULL,"
           " ranks INTEGER NOT NULL, time_ms INTEGER NOT NULL, bytes INTEGER NOT NULL,"
           " row BLOB NOT NULL /* v1::CommProbeRow */, PRIMARY KEY (job_id, bytes))",
           "CREATE INDEX IF NOT EXISTS comm_measurements_key"
           " ON comm_measurements(node_set, backend, ranks, time_ms)",
           // Compute time per micro-step measured by finished jobs (the
           // planner's c(m) for the next job of the same key).
           "CREATE TABLE IF NOT EXISTS step_measurements ("
           " job_id TEXT PRIMARY KEY, key TEXT NOT NULL, micro_batch INTEGER NOT NULL,"
           " compute_s REAL NOT NULL, samples INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
           " comm_key TEXT NOT NULL DEFAULT '', allreduce_probe_s REAL NOT NULL DEFAULT 0,"
           " allreduce_measured_s REAL NOT NULL DEFAULT 0)",
           "CREATE INDEX IF NOT EXISTS step_measurements_key"
           " ON step_measurements(key, time_ms)",
           // The most memory finished jobs' ranks held (the point the next
           // plan of the same key puts its memory line through). A table of
           // its own: older databases get it without a migration.
           "CREATE TABLE IF NOT EXISTS memory_measurements ("
           " job_id TEXT PRIMARY KEY, key TEXT NOT NULL, micro_batch INTEGER NOT NULL,"
           " peak_bytes REAL NOT NULL, time_ms INTEGER NOT NULL)",
           "CREATE INDEX IF NOT EXISTS memory_measurements_key"
           " ON memory_measurements(key, time_ms)",
           // What finished jobs reached of the compute prior's ideal time,
           // per device class (planner/compute_prior.h).
           "CREATE TABLE IF NOT EXISTS efficiency_measurements ("
           " job_id TEXT PRIMARY KEY, device_class TEXT NOT NULL, micro_batch INTEGER NOT NULL,"
           " efficiency REAL NOT NULL, time_ms INTEGER NOT NULL)",
           "CREATE INDEX IF NOT EXISTS efficiency_measurements_class"
           " ON efficiency_measurements(device_class, time_ms)",
           // Allocations of launcher: slurm jobs, one per attempt (tables of
           // their own: older databases get them without a migration).
           "CREATE TABLE IF NOT EXISTS allocations ("
           " job_id TEXT NOT NULL, attempt INTEGER NOT NULL, kind TEXT NOT NULL,"
           " allocation_id TEXT NOT NULL, script TEXT NOT NULL, time_ms INTEGER NOT NULL,"
           " PRIMARY KEY (job_id, attempt))",
           "CREATE TABLE IF NOT EXISTS launcher_topologies ("
           " key TEXT PRIMARY KEY, topology BLOB NOT NULL, time_ms INTEGER NOT NULL)",
       }) {
    s = Exec(sql);
    if (!s.ok()) return s;
  }
  // Coordinators before 2026-11-26 stored failed jobs' peaks too; one that
  // ran out of memory understates what its micro-batch needs (the end-of-job
  // review, coordinator/plan_checks.h, no longer stores them). Idempotent.
  const std::string forget_failed =
      absl::StrCat("DELETE FROM memory_measurements WHERE job_id IN (SELECT id FROM jobs WHERE state = ",
                   static_cast<int>(v1::FAILED), ")");
  s = Exec(forget_failed.c_str());
  if (!s.ok()) return s;
  Stmt q(db_, "SELECT value FROM meta WHERE key='schema_version'");
  if (!q.ok()) return Error("reading schema version");
  if (q.Step() == SQLITE_ROW) {
    int v = std::atoi(q.Str(0).c_str());
    if (v > kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job database ", path_, " has schema version ", v, "; this coordinator knows up to ",
          kSchemaVersion, " (use a newer dgca-coordinator or another --state-dir)"));
    }
    if (v < 2) return MigrateToV2();
  } else {
    Stmt ins(db_, "INSERT INTO meta(key, value) VALUES('schema_version', ?)");
    ins.BindText(1, std::to_string(kSchemaVersion));
    if (ins.Step() != SQLITE_DONE) return Error("writing schema version");
  }
  return absl::OkStatus();
}

absl::Status JobStore::MigrateToV2() {
  Txn txn(db_);
  if (!txn.ok()) return Error("migrating to schema 2: begin");
  std::vector<std::pair<std::string, std::string>> updated;  // id, spec
  {
    Stmt q(db_, "SELECT id, spec FROM jobs");
    if (!q.ok()) return Error("migrating to schema 2: reading specs");
    while (q.Step() == SQLITE_ROW) {
      v1::JobSpec spec;
      if (!spec.ParseFromString(q.Str(1)) || spec.model().has_dropout()) continue;
      spec.mutable_model()->mutable_dropout()->set_hidden(0);
      spec.mutable_model()->mutable_dropout()->set_attention(0);
      updated.emplace_back(q.Str(0), spec.SerializeAsString());
    }
  }
  for (const auto& [id, blob] : updated) {
    Stmt u(db_, "UPDATE jobs SET spec=? WHERE id=?");
    u.Bind(1, blob).BindText(2, id);
    if (u.Step() != SQLITE_DONE) return Error("migrating to schema 2: writing a spec");
  }
  Stmt v(db_, "UPDATE meta SET value='2' WHERE key='schema_version'");
  if (v.Step() != SQLITE_DONE) return Error("migrating to schema 2: version");
  if (!txn.Commit()) return Error("migrating to schema 2: commit");
  return absl::OkStatus();
}

absl::StatusOr<v1::JobEvent> JobStore::AppendEventLocked(const std::string& id,
                                                         v1::JobState state,
                                                         const std::string& kind,
                                                         const std::string& message,
                                                         int64_t now) {
  Stmt q(db_, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id=?");
  q.BindText(1, id);
  if (q.Step() != SQLITE_ROW) return Error("reading event seq");
  int64_t seq = q.Int(0) + 1;
  Stmt ins(db_, "INSERT INTO events(job_id, seq, time_ms, state, kind, message) "
                "VALUES(?,?,?,?,?,?)");
  ins.BindText(1, id).Bind(2, seq).Bind(3, now).Bind(4, static_cast<int64_t>(state));
  ins.BindText(5, kind).BindText(6, message);
  if (ins.Step() != SQLITE_DONE) return Error("appending event");
  v1::JobEvent e;
  e.set_job_id(id);
  e.set_seq(seq);
  e.set_time_unix_ms(now);
  e.set_state(state);
  e.set_kind(kind);
  e.set_message(message);
  return e;
}

absl::StatusOr<v1::Job> JobStore::CreateJob(const v1::JobSpec& spec,
                                            const std::string& spec_yaml) {
  absl::MutexLock lock(&mu_);
  Txn txn(db_);
  if (!txn.ok()) return Error("begin");
  int64_t now = NowUnixMs();
  Stmt ins(db_, "INSERT INTO jobs(id, name, state, spec, spec_yaml, message, created_ms, updated_ms)"
                " VALUES(?,?,?,?,?,?,?,?)");
  // Temporary unique id; replaced below once the counter is known.
  std::random_device rd;
  std::string tmp = absl::StrCat("tmp-", rd(), "-", now);
  ins.BindText(1, tmp).BindText(2, spec.name()).Bind(3, static_cast<int64_t>(v1::PENDING));
  ins.Bind(4, spec.SerializeAsString()).BindText(5, spec_yaml).BindText(6, "submitted");
  ins.Bind(7, now).Bind(8, now);
  if (ins.Step() != SQLITE_DONE) return Error("inserting job");
  int64_t seq = sqlite3_last_insert_rowid(db_);
  std::string id = absl::StrFormat("j-%06d-%04x", seq, rd() & 0xffff);
  Stmt upd(db_, "UPDATE jobs SET id=? WHERE seq=?");
  upd.BindText(1, id).Bind(2, seq);
  if (upd.Step() != SQLITE_DONE) return Error("naming job");
  auto ev = AppendEventLocked(id, v1::PENDING, "state", "submitted", now);
  if (!ev.ok()) return ev.status();
  if (!txn.Commit()) return Error("commit");
  v1::Job job;
  job.set_id(id);
  job.set_name(spec.name());
  job.set_state(v1::PENDING);
  *job.mutable_spec() = spec;
  job.set_spec_yaml(spec_yaml);
  job.set_created_unix_ms(now);
  job.set_updated_unix_ms(now);
  job.set_message("submitted");
  job.set_total_steps(spec.train().steps());
  return job;
}

absl::StatusOr<v1::JobEvent> JobStore::SetState(const std::string& id, v1::JobState state,
                                                const std::string& message,
                                                const std::string& kind,
                                                const std::string& event_message) {
  absl::MutexLock lock(&mu_);
  Txn txn(db_);
  if (!txn.ok()) return Error("begin");
  int64_t now = NowUnixMs();
  Stmt upd(db_, "UPDATE jobs SET state=?, message=?, updated_ms=? WHERE id=?");
  upd.Bind(1, static_cast<int64_t>(state)).BindText(2, message).Bind(3, now).BindText(4, id);
  if (upd.Step() != SQLITE_DONE) return Error("updating job state");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  auto ev = AppendEventLocked(id, state, kind, event_message.empty() ? message : event_message,
                              now);
  if (!ev.ok()) return ev.status();
  if (!txn.Commit()) return Error("commit");
  return ev;
}

absl::StatusOr<v1::JobEvent> JobStore::AppendEvent(const std::string& id, const std::string& kind,
                                                   const std::string& message) {
  absl::MutexLock lock(&mu_);
  Txn txn(db_);
  if (!txn.ok()) return Error("begin");
  Stmt q(db_, "SELECT state FROM jobs WHERE id=?");
  q.BindText(1, id);
  if (q.Step() != SQLITE_ROW) return absl::NotFoundError(absl::StrCat("no job ", id));
  auto ev = AppendEventLocked(id, static_cast<v1::JobState>(q.Int(0)), kind, message, NowUnixMs());
  if (!ev.ok()) return ev.status();
  if (!txn.Commit()) return Error("commit");
  return ev;
}

absl::Status JobStore::SetPlan(const std::string& id, const v1::Plan& plan) {
  absl::MutexLock lock(&mu_);
  Stmt upd(db_, "UPDATE jobs SET plan=?, updated_ms=? WHERE id=?");
  upd.Bind(1, plan.SerializeAsString()).Bind(2, NowUnixMs()).BindText(3, id);
  if (upd.Step() != SQLITE_DONE) return Error("storing plan");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::OkStatus();
}

absl::Status JobStore::SetRestarts(const std::string& id, int32_t restarts) {
  absl::MutexLock lock(&mu_);
  Stmt upd(db_, "UPDATE jobs SET restarts=?, updated_ms=? WHERE id=?");
  upd.Bind(1, static_cast<int64_t>(restarts)).Bind(2, NowUnixMs()).BindText(3, id);
  if (upd.Step() != SQLITE_DONE) return Error("storing restarts");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::OkStatus();
}

absl::StatusOr<v1::JobEvent> JobStore::RecordRestart(const std::string& id, int32_t restarts,
                                                     const std::string& message) {
  absl::MutexLock lock(&mu_);
  Txn txn(db_);
  if (!txn.ok()) return Error("begin");
  const int64_t now = NowUnixMs();
  Stmt upd(db_, "UPDATE jobs SET restarts=?, updated_ms=? WHERE id=?");
  upd.Bind(1, static_cast<int64_t>(restarts)).Bind(2, now).BindText(3, id);
  if (upd.Step() != SQLITE_DONE) return Error("storing restarts");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  Stmt q(db_, "SELECT state FROM jobs WHERE id=?");
  q.BindText(1, id);
  if (q.Step() != SQLITE_ROW) return absl::NotFoundError(absl::StrCat("no job ", id));
  auto ev = AppendEventLocked(id, static_cast<v1::JobState>(q.Int(0)), "restart", message, now);
  if (!ev.ok()) return ev.status();
  if (!txn.Commit()) return Error("commit");
  return ev;
}

absl::Status JobStore::SetProgress(const std::string& id, const v1::Job& progress) {
  absl::MutexLock lock(&mu_);
  v1::Job holder;
  *holder.mutable_eval() = progress.eval();
  *holder.mutable_ranks() = progress.ranks();
  holder.set_loss(progress.loss());
  holder.set_samples_per_second(progress.samples_per_second());
  holder.set_eta_seconds(progress.eta_seconds());
  if (progress.has_plan_check()) *holder.mutable_plan_check() = progress.plan_check();
  *holder.mutable_loss_curve() = progress.loss_curve();
  if (progress.has_launcher()) *holder.mutable_launcher() = progress.launcher();
  if (progress.has_final_loss()) {
    holder.set_final_loss(progress.final_loss());
    holder.set_final_loss_steps(progress.final_loss_steps());
    holder.set_final_loss_ranks(progress.final_loss_ranks());
  }
  if (progress.has_exit()) *holder.mutable_exit() = progress.exit();
  holder.set_peak_memory_bytes(progress.peak_memory_bytes());
  Stmt upd(db_, "UPDATE jobs SET last_step=?, eval=?, updated_ms=? WHERE id=?");
  upd.Bind(1, progress.step()).Bind(2, holder.SerializeAsString()).Bind(3, NowUnixMs()).BindText(4, id);
  if (upd.Step() != SQLITE_DONE) return Error("storing progress");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", id));
  return absl::OkStatus();
}

absl::StatusOr<StoredJob> JobStore::GetJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id=?").c_str());
  if (!q.ok()) return Error("preparing query");
  q.BindText(1, id);
  int rc = q.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (rc != SQLITE_ROW) return Error("reading job");
  StoredJob out;
  if (absl::Status st = ReadJobRow(q, path_, &out); !st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::ListJobs(const std::vector<v1::JobState>& states,
                                                        int limit) {
  absl::MutexLock lock(&mu_);
  // The states are picked in SQL: only the rows asked for are read, so a
  // damaged finished job does not stop the recovery of the active ones.
  std::vector<std::string> wanted;
  for (auto st : states) wanted.push_back(std::to_string(static_cast<int>(st)));
  const std::string where =
      wanted.empty() ? "" : absl::StrCat(" WHERE state IN (", absl::StrJoin(wanted, ","), ")");
  Stmt q(db_,
         absl::StrCat("SELECT ", kJobColumns, " FROM jobs", where, " ORDER BY seq DESC").c_str());
  if (!q.ok()) return Error("preparing query");
  std::vector<v1::Job> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    StoredJob j;
    if (absl::Status st = ReadJobRow(q, path_, &j); !st.ok()) return st;
    out.push_back(std::move(j.job));
    if (limit > 0 && static_cast<int>(out.size()) >= limit) break;
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("listing jobs");
  return out;
}

absl::StatusOr<std::map<v1::JobState, int>> JobStore::CountByState() {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  std::map<v1::JobState, int> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out[static_cast<v1::JobState>(q.Int(0))] = static_cast<int>(q.Int(1));
  }
  if (rc != SQLITE_DONE) return Error("counting jobs");
  return out;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::ListEvents(const std::string& id,
                                                               int64_t after_seq) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT seq, time_ms, state, kind, message FROM events "
              "WHERE job_id=? AND seq>? ORDER BY seq");
  q.BindText(1, id).Bind(2, after_seq);
  std::vector<v1::JobEvent> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    v1::JobEvent e;
    e.set_job_id(id);
    e.set_seq(q.Int(0));
    e.set_time_unix_ms(q.Int(1));
    e.set_state(static_cast<v1::JobState>(q.Int(2)));
    if (!ValidText(q.Str(3)) || !ValidText(q.Str(4))) {
      return DamagedRow(path_,
                        absl::StrCat("job ", Printable(id), "'s event ", e.seq(),
                                     " is not valid UTF-8"),
                        absl::StrCat("DELETE FROM events WHERE job_id=", SqlLiteral(id),
                                     " AND seq=", e.seq()));
    }
    e.set_kind(q.Str(3));
    e.set_message(q.Str(4));
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return Error("listing events");
  return out;
}

absl::Status JobStore::RecordRank(const StoredRank& r) {
  absl::MutexLock lock(&mu_);
  Stmt ins(db_, "INSERT OR REPLACE INTO ranks(job_id, rank, attempt, node, pid, pgid) "
                "VALUES(?,?,?,?,?,?)");
  ins.BindText(1, r.job_id).Bind(2, static_cast<int64_t>(r.rank));
  ins.Bind(3, static_cast<int64_t>(r.attempt)).BindText(4, r.node);
  ins.Bind(5, static_cast<int64_t>(r.pid)).Bind(6, static_cast<int64_t>(r.pgid));
  if (ins.Step() != SQLITE_DONE) return Error("recording rank");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredRank>> JobStore::ListRanks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt q(db_, "SELECT rank, attempt, node, pid, pgid FROM ranks WHERE job_id=? ORDER BY rank");
  q.BindText(1, job_id);
  std::vector<StoredRank> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    StoredRank r;
    r.job_id = job_id;
    r.rank = static_cast<int32_t>(q.Int(0));
    r.attempt = static_cast<int32_t>(q.Int(1));
    r.node = q.Str(2);
    r.pid = static_cast<int32_t>(q.Int(3));
    r.pgid = static_cast<int32_t>(q.Int(4));
    out.push_back(r);
  }
  if (rc != SQLITE_DONE) return Error("listing ranks");
  return out;
}

absl::Status JobStore::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Txn txn(db_);
  if (!txn.ok()) return Error("starting a transaction to delete a job");
  for (const char* sql : {"DELETE FROM events WHERE job_id=?", "DELETE FROM ranks WHERE job_id=?",
                          "DELETE FROM allocations WHERE job_id=?", "DELETE FROM jobs WHERE id=?"}) {
    Stmt del(db_, sql);
    del.BindText(1, job_id);
    if (del.Step() != SQLITE_DONE) return Error("deleting a job");
  }
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (!txn.Commit()) return Error("committing a job's deletion");
  return absl::OkStatus();
}

absl::Status JobStore::ClearRanks(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Stmt del(db_, "DELETE FROM ranks WHERE job_id=?");
  del.BindText(1, job_id);
  if (del.Step() != SQLITE_DONE) return Error("clearing ranks");
  return absl::OkStatus();
}

}  // namespace dgca
