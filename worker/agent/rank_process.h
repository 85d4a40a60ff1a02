// What outlives an agent about the rank processes it launched, so that a new
// agent can supervise them again without being their parent. That happens
// after a coordinator kill -9: the embedded agent dies with the coordinator,
// its ranks keep training (each in its own process group), and the restarted
// coordinator's agent adopts them (AgentOptions::adopt).
//
//  - Identity: the agent starts every rank with DGCA_RANK_ID=JOB/RANK/ATTEMPT
//    in its environment; a pid is adopted only when /proc/PID/environ holds
//    exactly that entry, so a pid reused by another process is never taken
//    for a rank.
//  - Liveness: /proc/PID/stat's state and start time. A zombie counts as
//    gone (an orphan's reaper may be slow, or absent in a container), and a
//    changed start time means the pid was reused.
//  - Exit status: only a parent gets a wait status, so the rank itself
//    writes "attempt A code C\n" to DGCA_EXIT_FILE (the agent sets it to
//    LOG_DIR/rank-R.exit) as it exits. A rank killed by a signal, or one
//    that crashed, writes none: its status is unknown.
//
// Thread-safety: the functions are thread-safe (no shared state).
#ifndef DGCA_WORKER_AGENT_RANK_PROCESS_H_
#define DGCA_WORKER_AGENT_RANK_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace dgca {

// What names a rank process: "J/R/A", the value of its DGCA_RANK_ID; and
// the environment entry itself, "DGCA_RANK_ID=J/R/A".
std::string RankId(const std::string& job_id, int rank, int attempt);
std::string RankIdEntry(const std::string& job_id, int rank, int attempt);

// The last `lines` lines of a rank's log (at most its last 64 KiB), for the
// message of a rank that failed; "" when the log is empty, missing or not
// a readable file (a full disk, a directory in its place): never a crash.
std::string LogTail(const std::string& path, int lines);

// Where a rank's exit record goes: LOG_DIR/rank-R.exit.
std::string ExitRecordPath(const std::string& log_dir, int rank);

// Where the agent puts an attempt's rank token (LaunchRank.rank_token) for
// the rank to read: LOG_DIR/rank-R.A.token, one per attempt so that the
// clean-up after an old attempt's exit never removes a newer one's.
std::string RankTokenPath(const std::string& log_dir, int rank, int attempt);
// Writes `token` to `path`, mode 0600, atomically (a temporary file renamed
// over it). Errors name the file.
absl::Status WriteRankToken(const std::string& path, const std::string& token);
// Removes the rank token files (rank-R.A.token, and temporaries of them)
// under STATE_DIR/jobs/*/ last written more than `max_age_s` ago. A rank
// reads its token once, as it starts, so an older file serves no one: its
// rank has read it, or ended while no agent watched (killed along with
// its agent, say), and nothing else would remove it. Returns how many.
inline constexpr double kRankTokenMaxAgeSeconds = 60;
int SweepRankTokens(const std::string& state_dir, double max_age_s);

// Writes "attempt A code C\n" to `path` atomically (a temporary file renamed
// over it). Errors name the file.
absl::Status WriteExitRecord(const std::string& path, int attempt, int code);

// The exit code recorded in `path` for `attempt`; nullopt when the file is
// missing, unreadable, malformed or from another attempt.
std::optional<int> ReadExitRecord(const std::string& path, int attempt);

// A live process as /proc/PID/stat shows it: its start time (clock ticks
// since boot). nullopt when there is no such process or it is a zombie.
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// True when /proc/PID/environ (readable for our own processes) contains
// `entry` ("NAME=value") exactly.
bool ProcessEnvironHas(pid_t pid, const std::string& entry);

// The live process whose environment holds `entry`, searched through /proc
// (for a rank whose pid was never recorded); 0 when there is none. With
// several, the lowest pid.
pid_t FindProcessWithEnviron(const std::string& entry);

}  // namespace dgca

#endif  // DGCA_WORKER_AGENT_RANK_PROCESS_H_
