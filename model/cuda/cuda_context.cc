#include "model/cuda/cuda_context.h"

#include <cstdio>

namespace dgca {
namespace cuda {

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return OkStatus();
  const std::string m = what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  // Out of memory is the one CUDA error a caller can act on (use less).
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(m);
  return InternalError(m);
}

Status Launched(const char* what) { return CudaStatus(cudaGetLastError(), what); }

Status CublasStatus(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return InternalError(what + ": cuBLASLt status " + std::to_string(static_cast<int>(st)) + " (" +
                       cublasLtGetStatusName(st) + ")");
}

int VisibleDeviceCount(std::string* error) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Clear the sticky-free "last error" so later calls start clean.
    cudaGetLastError();
    if (error != nullptr) {
      *error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" +
               cudaGetErrorString(err) + ")";
    }
    return 0;
  }
  if (count == 0 && error != nullptr) *error = "cudaGetDeviceCount: 0 devices";
  return count;
}

StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int device, size_t workspace_bytes) {
  std::string why;
  const int count = VisibleDeviceCount(&why);
  if (count <= 0) return FailedPreconditionError("no CUDA device visible (" + why + ")");
  if (device < 0 || device >= count) {
    return FailedPreconditionError("CUDA device " + std::to_string(device) + " out of range: " +
                                   std::to_string(count) + " visible (valid: 0.." +
                                   std::to_string(count - 1) + ")");
  }
  std::unique_ptr<CudaContext> ctx(new CudaContext());
  ctx->device_ = device;
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  cudaDeviceProp prop;
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  ctx->sm_count_ = prop.multiProcessorCount;
  ctx->cc_ = prop.major * 10 + prop.minor;
  char desc[512];
  std::snprintf(desc, sizeof(desc), "%s (sm_%d, %d SMs, %.1f GiB)", prop.name, ctx->cc_,
                prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30));
  ctx->description_ = desc;
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&ctx->stream_, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags"));
  DGCA_RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&ctx->lt_), "cublasLtCreate"));
  if (workspace_bytes > 0) {
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ctx->workspace_, workspace_bytes), "cudaMalloc workspace"));
    ctx->workspace_bytes_ = workspace_bytes;
  }
  return ctx;
}

CudaContext::~CudaContext() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status CudaContext::Synchronize() const {
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  return CudaStatus(cudaGetLastError(), "kernel launch");
}

}  // namespace cuda
}  // namespace dgca
