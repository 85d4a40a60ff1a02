// The rank process's own memory, for StepMetrics.host_memory_peak_bytes:
// what a CPU rank's memory is (its weights, activations, loader and
// runtime), compared by `dgca diagnose JOB` with the plan's memory model.
//
// Thread-safety: pure functions; safe from any thread.
#ifndef DGCA_WORKER_RANK_PROCESS_MEMORY_H_
#define DGCA_WORKER_RANK_PROCESS_MEMORY_H_

#include "absl/strings/string_view.h"

namespace dgca {

// The "VmHWM:" line (peak resident set, in kB) of a /proc/<pid>/status text,
// in bytes; -1 when the line is missing or malformed.
double ParseVmHwmBytes(absl::string_view status_text);

// This process's peak resident set (/proc/self/status VmHWM) in bytes; -1
// where /proc is not readable.
double ProcessPeakResidentBytes();

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_PROCESS_MEMORY_H_
