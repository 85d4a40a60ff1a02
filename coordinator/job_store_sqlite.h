// SQLite helpers of the job store (coordinator/job_store.cc and
// job_store_measurements.cc): a prepared statement and a transaction, each
// releasing what it holds when it goes out of scope. Private to the store.
//
// Thread-safety: none; the store calls them under its mutex.
#ifndef DGCA_COORDINATOR_JOB_STORE_SQLITE_H_
#define DGCA_COORDINATOR_JOB_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

namespace dgca {
namespace store_internal {

// RAII prepared statement.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &st_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(st_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, const std::string& s) {
    sqlite3_bind_blob(st_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindText(int i, const std::string& s) {
    sqlite3_bind_text(st_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(st_, i, v);
    return *this;
  }
  Stmt& BindDouble(int i, double v) {
    sqlite3_bind_double(st_, i, v);
    return *this;
  }
  double Double(int c) { return sqlite3_column_double(st_, c); }
  // SQLITE_ROW or SQLITE_DONE or an error.
  int Step() { return sqlite3_step(st_); }
  int64_t Int(int c) { return sqlite3_column_int64(st_, c); }
  std::string Str(int c) {
    const void* p = sqlite3_column_blob(st_, c);
    int n = sqlite3_column_bytes(st_, c);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
  int rc_;
};

// Commits on Commit(), rolls back otherwise.
class Txn {
 public:
  explicit Txn(sqlite3* db) : db_(db) {
    ok_ = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  ~Txn() {
    if (ok_ && !done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  bool ok() const { return ok_; }
  bool Commit() {
    done_ = true;
    return sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK;
  }

 private:
  sqlite3* db_;
  bool ok_ = false;
  bool done_ = false;
};

}  // namespace store_internal
}  // namespace dgca

#endif  // DGCA_COORDINATOR_JOB_STORE_SQLITE_H_
