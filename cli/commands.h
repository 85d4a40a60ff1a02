// The `dgca` commands (docs/cli.md). Each returns the process
// exit code: 0 ok, 1 the job failed or was cancelled, 2 bad usage or invalid
// spec, 3 cannot reach or authenticate. Results go to `io.out` (what scripts
// read: job ids, tables, JSON), progress and errors to `io.err`.
//
// Thread-safety: each call is independent; they share nothing.
#ifndef DGCA_CLI_COMMANDS_H_
#define DGCA_CLI_COMMANDS_H_

#include <istream>
#include <ostream>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "cli/client.h"

namespace dgca {
namespace cli {

struct Io {
  std::ostream& out;
  std::ostream& err;
  bool err_is_tty = false;  // live \r-updated lines when true
};

// `sets`: --set KEY=VALUE overrides of the file's values (spec/spec_overrides.h).
int CmdSubmit(const GlobalOptions& g, Io io, const std::string& spec_path, bool wait,
              const std::vector<std::string>& sets = {});
// Deletes jobs that have ended, their record and files (cli/resubmit.cc).
int CmdDelete(const GlobalOptions& g, Io io, const std::vector<std::string>& job_ids);
// JOB's stored spec, submitted again as a new job (cli/resubmit.cc).
int CmdResubmit(const GlobalOptions& g, Io io, const std::string& job_id, bool wait);
// `check_files` false (--spec-only): the spec alone, not the files it names
// (a spec checked where its data is not, before the data is built).
int CmdValidate(Io io, const std::string& spec_path, const std::vector<std::string>& sets = {},
                bool check_files = true);
int CmdPlan(const GlobalOptions& g, Io io, const std::string& spec_path, bool json,
            const std::vector<std::string>& sets = {});
// `dgca list` filters (cli/list.h parses --state and --since).
struct ListOptions {
  bool json = false;
  std::vector<std::string> states;  // --state, repeatable, comma-separated
  std::string name;                 // --name: the name contains it
  std::string since;                // --since: a span or a UTC date/time
  int limit = 0;                    // --limit: 0 = all
};
int CmdList(const GlobalOptions& g, Io io, const ListOptions& options);
// --json prints the whole GetJobResponse: {"job": {... "ranks": [per-rank
// progress] ...}, "events": [...], "plan": {...}}.
int CmdStatus(const GlobalOptions& g, Io io, const std::string& job_id, bool json);
int CmdWatch(const GlobalOptions& g, Io io, const std::string& job_id);
int CmdLogs(const GlobalOptions& g, Io io, const std::string& job_id, int rank, bool follow);
int CmdCancel(const GlobalOptions& g, Io io, const std::string& job_id);
int CmdTopo(Io io, const std::string& root, bool json);
int CmdNodes(const GlobalOptions& g, Io io, bool json);
// `dgca nodes forget NODE` (ForgetNodeRequest in coordinator.proto): exit 2
// when refused (unknown, connected, or still holding ranks of a job).
int CmdForgetNode(const GlobalOptions& g, Io io, const std::string& node);
int CmdDiagnose(Io io);
// `dgca diagnose JOB` (DiagnoseJobRequest in coordinator.proto): the step
// breakdown (data wait, compute, exposed communication; per rank when there
// are several), one line per stage (ok / high / LIMITS, with the fix) and
// the limiting stage; --json prints the DiagnoseJobResponse. Exit 2 for an
// unknown job or one with too few steps to diagnose.
int CmdDiagnoseJob(const GlobalOptions& g, Io io, const std::string& job_id, bool json);

// `dgca diagnose comm`: the all-reduce bandwidth probe as a job (like
// nccl-tests' all_reduce_perf). Submits a spec of `kind: comm_probe` (see
// proto/dgca/v1/job.proto JobSpec.kind) with the given ranks, device and
// sizes; the job's events (one per size, on stderr) show each row as it is
// measured; at the end the stored rows are printed to stdout as a table
// (size, count, iters, time us, algbw GB/s, busbw GB/s) or, with --json, as
// {"job_id", "backend", "ranks", "nodes", "rows": [{"bytes", "count", "iters",
// "time_us", "algbw_gbps", "busbw_gbps"}]}. The coordinator keeps the rows as
// the measurement the planner uses for that node set, backend and ranks.
struct DiagnoseCommOptions {
  int ranks = 2;
  std::string device = "auto";  // auto | cpu | cuda
  std::string sizes;            // "" = default; "1K..256M" (x4 steps), "A..B:F", or "4K,1M,..."
  bool json = false;
};
int CmdDiagnoseComm(const GlobalOptions& g, Io io, const DiagnoseCommOptions& o);

// Parses --sizes: sizes with optional K/M/G suffix (powers of 1024), either a
// comma list or a range "LO..HI" (factor 4) or "LO..HI:F". Each a multiple of 4.
absl::StatusOr<std::vector<int64_t>> ParseProbeSizes(const std::string& text);
int CmdDataSynth(Io io, const std::string& out_dir);

// `dgca export` (cli/model_commands.cc, model/train/export.h): a job's
// checkpoint (or any checkpoint directory's) as a Hugging Face BERT
// directory plus the DGCA parts. Exactly one of job_id / checkpoint_dir.
// checkpoint: "best" (by eval; the latest when none has an eval), "latest"
// or a step directory's path. vocab / confusion / max_seq_len (> 0)
// override what the job's spec says (needed with checkpoint_dir when the
// vocabulary is not beside the checkpoints). Exit 2 for bad usage, files
// that are not there (with where they are) or are wrong.
struct ExportOptions {
  std::string job_id;
  std::string checkpoint_dir;
  std::string out_dir;
  std::string checkpoint = "best";
  std::string vocab;
  std::string confusion;
  int max_seq_len = 0;
};
int CmdExport(const GlobalOptions& g, Io io, const ExportOptions& o);

// `dgca correct --model DIR` (model/train/corrector.h): corrects the
// sentences given, else those of --file, else stdin's lines, and prints
// "ORIGINAL -> CORRECTED  [pos:x->y, ...]" (or "ORIGINAL  (no change)") per
// sentence, or with json {"model", "sentences": [{"original", "corrected",
// "changes": [{"position", "from", "to"}]}]}. eval_file: score an ECSpell
// file as the trainer's evaluation does instead (the metrics line, or JSON
// {"model", "file", "sentences", "truncated", "skipped", "metrics"}).
struct CorrectOptions {
  std::string model_dir;
  std::vector<std::string> sentences;
  std::string file;
  std::string eval_file;
  bool json = false;
  int batch_size = 16;
  int threads = 1;
};
int CmdCorrect(Io io, const CorrectOptions& o, std::istream& in);

// Follows a job until it ends, rendering progress on io.err (a \r line on a
// TTY, a line every few seconds otherwise; `full_view`: progress bar plus
// per-rank rows), printing its events as they happen. Returns the exit code
// for the final state (0 SUCCEEDED, 1 FAILED/CANCELLED) and prints the final
// state and evaluation metrics to io.out.
int FollowJob(const GlobalOptions& g, Io io, Client* client, const std::string& job_id,
              bool full_view);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_COMMANDS_H_
