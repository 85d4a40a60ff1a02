// `--set KEY=VALUE` on `dgca submit/plan/validate`: spec values given on the
// command line over those of the file, as torchrun-style launchers and
// Hydra-style configs let users do (`--set train.steps=200`).
//
// Each override is checked in turn, set among the file's values (and the
// overrides before it), and the problems of its own KEY are located at the
// flag ("--set train.steps=abc: train.steps: expected an integer, got
// 'abc'"), not at a line of a file the user never wrote. The file's own
// problems are found before (ParseJobSpec of the file); any left after the
// last override are named "FILE with --set", without line numbers that
// would point into the re-emitted YAML.
// The merged YAML (the file's mapping with each KEY set, comments dropped,
// a first comment line naming the file and the overrides) is what is
// submitted and stored, so `dgca resubmit` repeats it.
#ifndef DGCA_SPEC_SPEC_OVERRIDES_H_
#define DGCA_SPEC_SPEC_OVERRIDES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/coordinator.pb.h"

namespace dgca {

struct SpecOverrideResult {
  std::string yaml;                       // the merged spec (empty with problems)
  std::vector<v1::SpecProblem> problems;  // each located as "--set KEY=VALUE"
};

// Applies `sets` ("KEY=VALUE": KEY a dotted path of mapping keys, VALUE a
// YAML value: 200, fp32, "[a, b]", "{lr: 1e-3}") in order to `yaml`, the
// text of `spec_path` (already free of problems). A KEY through a value
// that is not a mapping, a KEY or VALUE that cannot be read, or a value the
// spec refuses, is a problem. No sets: `yaml` unchanged.
SpecOverrideResult ApplySpecOverrides(const std::string& yaml, const std::string& spec_path,
                                      const std::vector<std::string>& sets);

}  // namespace dgca

#endif  // DGCA_SPEC_SPEC_OVERRIDES_H_
