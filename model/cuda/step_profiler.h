// StepProfiler: where a training step's GPU time goes, measured with
// cudaEvents on the model's stream (no external profiler needed: one
// dgca-bench --profile run on a GPU machine prints the table).
//
// The model marks phase boundaries (Mark("encoder fwd"), ...): the time from
// one mark to the next is charged to the earlier mark's phase. GemmRunner
// brackets every GEMM (BeginGemm/EndGemm), so the report also says how much
// of the step was matrix multiplication and how much everything else
// (element-wise kernels, reductions, copies, host waits).
//
// Events are recorded in stream order, so a phase includes any time the
// GPU idled waiting for the host inside it (e.g. the loss read-back). The
// events themselves cost a few microseconds each: profile separate steps
// from the timed ones.
//
// Thread-safety: not thread-safe; one thread, one stream.
#ifndef DGCA_MODEL_CUDA_STEP_PROFILER_H_
#define DGCA_MODEL_CUDA_STEP_PROFILER_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/core/status.h"

namespace dgca {
namespace cuda {

struct StepProfile {
  // Phases in first-seen order, seconds summed over the profiled steps.
  std::vector<std::pair<std::string, double>> phase_seconds;
  double total_seconds = 0;  // first mark to last mark
  double gemm_seconds = 0;   // inside BeginGemm/EndGemm brackets
  int gemms = 0;
};

class StepProfiler {
 public:
  // Events for up to max_events marks and GEMM brackets between Collect()s
  // (marks beyond are dropped and reported as an error by Collect).
  static StatusOr<std::unique_ptr<StepProfiler>> Create(cudaStream_t stream, int max_events = 16384);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // From here on the stream's work belongs to `phase` (a string literal or
  // another string that outlives the profiler); nullptr ends the current
  // phase without starting one (end a profiled region with it).
  Status Mark(const char* phase);
  Status BeginGemm();
  Status EndGemm();

  // After the stream has been synchronized: the time since the last
  // Collect (or creation), then starts over. FAILED_PRECONDITION when marks
  // were dropped or a GEMM bracket is open.
  StatusOr<StepProfile> Collect();

 private:
  enum class Kind { kPhase, kGemmBegin, kGemmEnd };
  struct Entry {
    Kind kind;
    const char* phase;
    cudaEvent_t event;
  };
  explicit StepProfiler(cudaStream_t stream) : stream_(stream) {}
  Status Record(Kind kind, const char* phase);

  cudaStream_t stream_;
  std::vector<cudaEvent_t> pool_;
  std::vector<Entry> entries_;
  bool dropped_ = false;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_STEP_PROFILER_H_
