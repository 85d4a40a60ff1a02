// Values of a job spec's resources.slurm section (spec/spec.h,
// docs/slurm.md) that go into an sbatch script, so that nothing in the spec
// can change what the script does beyond the option it sets.
//
// Thread-safety: pure functions.
#ifndef DGCA_SPEC_SLURM_VALUES_H_
#define DGCA_SPEC_SLURM_VALUES_H_

#include <string>

namespace dgca {

// A Slurm partition, account or qos name: 1-64 of A-Z a-z 0-9 . _ -.
bool SlurmName(const std::string& s);

// One of Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
bool SlurmTime(const std::string& t);

// Why `arg` cannot be an extra sbatch option ("" when it can): one
// "--name" or "--name=value" on one line without shell characters, not an
// option the coordinator sets itself nor one with a field of its own.
std::string SbatchArgProblem(const std::string& arg);

}  // namespace dgca

#endif  // DGCA_SPEC_SLURM_VALUES_H_
