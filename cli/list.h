// `dgca list`: the filters it takes, parsed (cli/list.cc). Private to cli/.
#ifndef DGCA_CLI_LIST_H_
#define DGCA_CLI_LIST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/job.pb.h"

namespace dgca {
namespace cli {

// --state values, each a state name in any case (pending, planning,
// running, succeeded, failed, cancelled), "active" (the first three) or
// "ended" (the last three); a value may list several, comma-separated.
// INVALID_ARGUMENT naming the bad one and the valid ones.
absl::StatusOr<std::vector<v1::JobState>> ParseStates(const std::vector<std::string>& values);

// --since: a span back from `now_unix_ms` ("90s", "30m", "2h", "7d", "1w")
// or a UTC date or time ("2026-11-28", "2026-11-28T14:05",
// "2026-11-28T14:05:09"); the unix time in ms it means. INVALID_ARGUMENT
// saying what would be valid.
absl::StatusOr<int64_t> ParseSince(const std::string& value, int64_t now_unix_ms);

// The `dgca list` table (docs/cli.md): JOB NAME STATE STEP LOSS START END
// ELAPSED EXIT "PEAK MEM" MESSAGE, one row per job; the message cut to one
// line and to what the other columns leave of kListWidth (at least
// kMinMessage); a legend line after the table when a LOSS cell is a last
// step's (marked '*'). `now_unix_ms` ends an active job's ELAPSED and
// decides whether START and END need their date (ShortTime).
constexpr size_t kListWidth = 120;
constexpr size_t kMinMessage = 16;
std::string ListTable(const google::protobuf::RepeatedPtrField<v1::Job>& jobs,
                      int64_t now_unix_ms);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_LIST_H_
