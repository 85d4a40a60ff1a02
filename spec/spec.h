// Job spec parsing and validation: YAML text (docs/job-spec.md) ->
// v1::JobSpec with every default filled in, or a list of problems.
//
// Contract:
//  - ParseJobSpec never throws and never crashes on any input (every yaml-cpp
//    exception is caught inside). It returns an error Status only for
//    conditions outside the spec itself (none today); problems with the text
//    come back in SpecParseResult::problems, ALL of them, in text order.
//  - A result with an empty `problems` is a valid spec: `spec` then holds every
//    default of docs/job-spec.md and the "auto" convention of job.proto
//    (numeric auto = 0, string auto = "auto"). With problems, `spec` holds what
//    could be parsed (defaults elsewhere) and must not be run.
//  - Every problem has file (= file_path), 1-based line and column (0 when the
//    place is unknown, e.g. a missing field), the dotted field name
//    ("train.optimizer.lr", "comm.env.FOO") and a message that says what would
//    be valid.
//  - Unknown fields are errors (with "did you mean" for close names). Relative
//    paths stay as written; JobSpec.base_dir is left empty for the caller.
//    JobSpec.source_path = file_path. Without `name`, the name is the base
//    name of file_path without extension (when it is [A-Za-z0-9_-]+), else
//    "job".
//  - Spellings: numeric "auto" fields accept `auto` (or 0); `heads.candidate`
//    accepts a mapping, `true` (defaults) or `false` (disabled); `heads: false`
//    turns detector, candidate and fusion off (plain ReLM); nullable paths
//    (model.vocab, model.init_from, heads.candidate.confusion) accept null/~.
//    comm.env keys must match NCCL_*, CUDA_* or OMP_* (A-Z, 0-9, _), and be
//    neither NCCL_COMM_BLOCKING nor a variable that loads code into the rank
//    or writes a file on the node (spec/rank_env.h).
//    model.dropout.hidden/attention are numbers in [0, 1) (1 is an error).
//  - Inputs larger than kMaxSpecBytes, with a NUL byte or with invalid UTF-8
//    are rejected with one problem (UTF-8: at the offending line:column).
//    Callers that send a spec over gRPC should parse it locally first: a
//    proto3 string field cannot carry non-UTF-8 text (the server would answer
//    INTERNAL "failed to parse request").
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_SPEC_SPEC_H_
#define DGCA_SPEC_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/coordinator.pb.h"
#include "dgca/v1/job.pb.h"

namespace dgca {

inline constexpr size_t kMaxSpecBytes = 1 << 20;

// model.dropout.hidden and model.dropout.attention when the spec leaves them
// out: HF BertConfig's hidden_dropout_prob and attention_probs_dropout_prob.
// (ModelConfig's own default, and dgca-train's, is 0, so exact comparisons
// stay free of masks.)
inline constexpr double kDefaultDropout = 0.1;

// A model spec's dropout probabilities, each unset field (a JobSpec built in
// code, or stored before model.dropout existed) at kDefaultDropout. Not
// range-checked: ParseJobSpec does that.
struct SpecDropout {
  double hidden = kDefaultDropout;
  double attention = kDefaultDropout;
};
SpecDropout DropoutOf(const v1::ModelSpec& model);

// train.keep_checkpoints when the spec leaves it out. Three, not one: the
// newest is the resume point, and the two before it are what an operator
// rolls back to when the newest turns out bad in a way no checksum catches
// (a diverging loss, a wrong data file), at most 3 checkpoints' disk (plus
// the best by eval, kept in addition). docs/job-spec.md.
inline constexpr int kDefaultKeepCheckpoints = 3;

// A train spec's keep_checkpoints, kDefaultKeepCheckpoints when unset (a
// JobSpec built in code, or stored before the field existed). Not
// range-checked: ParseJobSpec does that (0 = keep every checkpoint).
int KeepCheckpointsOf(const v1::TrainSpec& train);

// train.progress_timeout_s when the spec leaves it out: five minutes, well
// past a healthy rank's longest phase without progress (a first CUDA step
// with its autotuning, a large checkpoint write; an eval advances with
// every batch), yet long before an operator gives up on a silent job.
// Larger than comm.timeout_s (60 s) it usually is: a collective that hangs
// fails there first, by the communicator's timeout, on the ranks waiting
// in it; this timeout catches the rank that never reaches it (a stuck
// loader, a frozen process, a hung GPU kernel) and names it.
inline constexpr double kDefaultProgressTimeoutSeconds = 300;

// A train spec's progress_timeout_s, kDefaultProgressTimeoutSeconds when
// unset (0 = no progress timeout). Not range-checked: ParseJobSpec does that.
double ProgressTimeoutOf(const v1::TrainSpec& train);

struct SpecParseResult {
  v1::JobSpec spec;
  std::vector<v1::SpecProblem> problems;
  bool ok() const { return problems.empty(); }
};

absl::StatusOr<SpecParseResult> ParseJobSpec(const std::string& yaml_text,
                                             const std::string& file_path);

// The JobSpec an empty mapping parses to (every default).
v1::JobSpec DefaultJobSpec();

// One "file:line:col: field: message" line per problem (line:col omitted when
// 0; file omitted when empty), each ending in '\n'.
std::string FormatProblem(const v1::SpecProblem& p);
template <typename Container>
std::string FormatProblems(const Container& problems) {
  std::string out;
  for (const auto& p : problems) out += FormatProblem(p);
  return out;
}

}  // namespace dgca

#endif  // DGCA_SPEC_SPEC_H_
