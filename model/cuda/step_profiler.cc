#include "model/cuda/step_profiler.h"

#include <map>

#include "model/cuda/cuda_context.h"

namespace dgca {
namespace cuda {

StatusOr<std::unique_ptr<StepProfiler>> StepProfiler::Create(cudaStream_t stream, int max_events) {
  if (max_events < 2) return InvalidArgumentError("StepProfiler: max_events must be >= 2");
  std::unique_ptr<StepProfiler> p(new StepProfiler(stream));
  p->pool_.resize(static_cast<size_t>(max_events), nullptr);
  for (cudaEvent_t& e : p->pool_)
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "StepProfiler: cudaEventCreate"));
  p->entries_.reserve(p->pool_.size());
  return p;
}

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : pool_)
    if (e != nullptr) cudaEventDestroy(e);
}

Status StepProfiler::Record(Kind kind, const char* phase) {
  if (entries_.size() == pool_.size()) {
    dropped_ = true;
    return OkStatus();
  }
  cudaEvent_t e = pool_[entries_.size()];
  entries_.push_back({kind, phase, e});
  return CudaStatus(cudaEventRecord(e, stream_), "StepProfiler: cudaEventRecord");
}

Status StepProfiler::Mark(const char* phase) { return Record(Kind::kPhase, phase); }
Status StepProfiler::BeginGemm() { return Record(Kind::kGemmBegin, nullptr); }
Status StepProfiler::EndGemm() { return Record(Kind::kGemmEnd, nullptr); }

StatusOr<StepProfile> StepProfiler::Collect() {
  std::vector<Entry> entries;
  entries.swap(entries_);
  entries_.reserve(pool_.size());
  if (dropped_) {
    dropped_ = false;
    return FailedPreconditionError("StepProfiler: more than " + std::to_string(pool_.size()) +
                                   " marks between collections; some were dropped");
  }
  StepProfile out;
  std::map<std::string, size_t> index;
  const char* phase = nullptr;
  cudaEvent_t phase_start = nullptr, gemm_start = nullptr, first = nullptr, last = nullptr;
  auto elapsed = [](cudaEvent_t a, cudaEvent_t b) -> StatusOr<double> {
    float ms = 0;
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, a, b), "StepProfiler: cudaEventElapsedTime"));
    return ms / 1e3;
  };
  for (const Entry& e : entries) {
    if (first == nullptr) first = e.event;
    last = e.event;
    switch (e.kind) {
      case Kind::kGemmBegin:
        if (gemm_start != nullptr) return FailedPreconditionError("StepProfiler: nested BeginGemm");
        gemm_start = e.event;
        break;
      case Kind::kGemmEnd: {
        if (gemm_start == nullptr) return FailedPreconditionError("StepProfiler: EndGemm without BeginGemm");
        DGCA_ASSIGN_OR_RETURN(double s, elapsed(gemm_start, e.event));
        out.gemm_seconds += s;
        ++out.gemms;
        gemm_start = nullptr;
        break;
      }
      case Kind::kPhase: {
        if (phase != nullptr) {
          DGCA_ASSIGN_OR_RETURN(double s, elapsed(phase_start, e.event));
          auto it = index.find(phase);
          if (it == index.end()) {
            it = index.emplace(phase, out.phase_seconds.size()).first;
            out.phase_seconds.emplace_back(phase, 0.0);
          }
          out.phase_seconds[it->second].second += s;
        }
        phase = e.phase;
        phase_start = e.event;
        break;
      }
    }
  }
  if (gemm_start != nullptr) return FailedPreconditionError("StepProfiler: a GEMM bracket is still open");
  if (first != nullptr && first != last) {
    DGCA_ASSIGN_OR_RETURN(out.total_seconds, elapsed(first, last));
  }
  return out;
}

}  // namespace cuda
}  // namespace dgca
