// The files a job spec names (data.train, data.eval, model.vocab,
// model.init_from, model.heads.candidate.confusion): where the spec names
// each, the path the ranks will open, and whether that path can be read
// here. So a missing data file is refused by `dgca validate`, `dgca plan`
// and `dgca submit`, every one at once with its spec line:column, instead of
// failing the job's ranks one NOT_FOUND at a time after they started.
//
// Where each check runs (docs/job-spec.md, "Input files"):
//  - `dgca validate`: in the CLI, on the machine it runs on.
//  - `dgca plan` / `dgca submit`: in the coordinator
//    (Scheduler::Submit), on its node, when its embedded agent runs ranks
//    there (not for launcher: slurm jobs, whose ranks run elsewhere).
//  - Every agent, at each LaunchRank (LaunchRank.inputs, agent.proto),
//    on its own node before it starts the rank.
//
// Relative paths resolve against JobSpec.base_dir, the spec file's
// absolute directory the CLI sends with the spec (ResolveSpecPath; the rank
// runtime resolves with the same function, worker/rank/train_config.h), so
// every node looks for the same path. Without a base_dir a relative path is
// opened from the rank's working directory (its agent's).
//
// Thread-safety: pure functions over the filesystem.
#ifndef DGCA_SPEC_SPEC_FILES_H_
#define DGCA_SPEC_SPEC_FILES_H_

#include <string>
#include <vector>

#include "dgca/v1/agent.pb.h"
#include "dgca/v1/coordinator.pb.h"
#include "dgca/v1/job.pb.h"

namespace dgca {

// `path` resolved against `base_dir` when it is relative ("" stays "";
// an empty base_dir leaves it relative to the working directory).
std::string ResolveSpecPath(const std::string& base_dir, const std::string& path);

// The files the ranks of `spec` will read, in the spec's line order: the non-empty
// path fields, the confusion set only while the candidate head is on. A
// `kind: comm_probe` job reads none. `yaml_text` is the text `spec` was
// parsed from without problems (ParseJobSpec); it gives each field's
// line:column (0:0 when the text does not have the field, e.g. a JobSpec
// built in code). `spec.base_dir()` must already be set to what the ranks
// get.
std::vector<v1::InputFile> SpecInputFiles(const std::string& yaml_text, const v1::JobSpec& spec);

// One problem per file of `inputs` that cannot be read here: missing, not a
// regular file, not readable, or (data files) over kMaxDataFileBytes, by
// the loaders' own checks (model/core/files.h CheckInputFile,
// model/core/data.h CheckDataFile). Each problem carries the spec file,
// line:column and field of the path, and says what was looked for where:
// the resolved path, how a relative one was resolved, `where` (e.g. "on
// this machine", "on node gpu-1") and what would be valid.
std::vector<v1::SpecProblem> CheckInputFiles(const std::vector<v1::InputFile>& inputs,
                                             const std::string& where);

// "N input files of the job cannot be read WHERE:\n" followed by one
// FormatProblem line per problem (no trailing newline): the message a job
// fails with when an agent's launch check finds them.
std::string InputProblemsMessage(const std::vector<v1::SpecProblem>& problems,
                                 const std::string& where);

}  // namespace dgca

#endif  // DGCA_SPEC_SPEC_FILES_H_
