// The CUDA context of the trainer's GPU backend: one device, one stream, a
// cuBLASLt handle and its workspace. Everything in model/cuda runs on the
// context's stream.
//
// Without a GPU (or without a driver) Create fails cleanly with
// FAILED_PRECONDITION "no CUDA device visible (cudaGetDeviceCount: <error>)"
// (docs/build.md, "Without a GPU": cudaGetDeviceCount returns error 35 and count 0
// there, cublasLtCreate NOT_INITIALIZED); nothing aborts.
//
// Thread-safety: a CudaContext is used by one thread at a time (its stream
// orders all work). Distinct contexts are independent.
#ifndef DGCA_MODEL_CUDA_CUDA_CONTEXT_H_
#define DGCA_MODEL_CUDA_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/core/memory_model.h"  // kGemmWorkspaceBytes
#include "model/core/status.h"

namespace dgca {
namespace cuda {

// INTERNAL "<what>: <cudaErrorName> (<cudaGetErrorString>)" for an error,
// OK for cudaSuccess.
Status CudaStatus(cudaError_t err, const std::string& what);
// The kernel launch just made: CudaStatus(cudaGetLastError(), what) —
// a bad launch configuration, or an earlier asynchronous error.
Status Launched(const char* what);
// INTERNAL "<what>: cuBLASLt status <n> (<name>)" unless SUCCESS.
Status CublasStatus(cublasStatus_t st, const std::string& what);

// The number of visible devices; on failure 0 and *error (may be null) set
// to "cudaGetDeviceCount: <error>".
int VisibleDeviceCount(std::string* error);

class CudaContext {
 public:
  // Default cuBLASLt workspace: 32 MiB (what cuBLAS recommends for Hopper).
  static constexpr size_t kDefaultWorkspaceBytes = static_cast<size_t>(kGemmWorkspaceBytes);

  // Binds `device`, creates a non-blocking stream, a cuBLASLt handle and the
  // workspace. FAILED_PRECONDITION without a visible device or with `device`
  // out of range; INTERNAL for other CUDA/cuBLASLt failures.
  static StatusOr<std::unique_ptr<CudaContext>> Create(int device,
                                                      size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)".
  const std::string& description() const { return description_; }
  int sm_count() const { return sm_count_; }
  int compute_capability() const { return cc_; }  // 90 for sm_90

  // Waits for the stream; reports any asynchronous kernel error.
  Status Synchronize() const;

 private:
  CudaContext() = default;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::string description_;
  int sm_count_ = 0;
  int cc_ = 0;
};

// A device array of T, freed on destruction. Move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { Reset(); }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) { Reset(); ptr_ = o.ptr_; n_ = o.n_; o.ptr_ = nullptr; o.n_ = 0; }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  Status Allocate(size_t n) {
    Reset();
    if (n == 0) return OkStatus();
    void* p = nullptr;
    Status s = CudaStatus(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc " + std::to_string(n * sizeof(T)) + " bytes");
    if (!s.ok()) {
      // cudaMalloc's failure is not sticky, but it stays the "last error":
      // clear it, or the next launch check would report it as its own.
      (void)cudaGetLastError();
      return s;
    }
    ptr_ = static_cast<T*>(p);
    n_ = n;
    return OkStatus();
  }
  // Allocates host.size() elements and copies them in; the data is on the
  // device when it returns. (cudaMemcpy from pageable memory returns once
  // the bytes are staged, the DMA possibly still pending on the legacy
  // stream, which a non-blocking stream does not wait for: hence the sync.)
  Status Upload(const std::vector<T>& host) {
    if (host.size() != n_) {
      Status s = Allocate(host.size());
      if (!s.ok()) return s;
    }
    if (n_ == 0) return OkStatus();
    Status s = CudaStatus(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    if (!s.ok()) return s;
    return CudaStatus(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after H2D");
  }
  Status Download(std::vector<T>* host) const {
    host->resize(n_);
    if (n_ == 0) return OkStatus();
    return CudaStatus(cudaMemcpy(host->data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  // Fills every byte with 0xFF: NaN for fp32, bf16 and fp16, -1 for ints.
  // Tests poison outputs so a kernel that skips an element is caught.
  Status Poison() {
    if (n_ == 0) return OkStatus();
    return CudaStatus(cudaMemset(ptr_, 0xFF, n_ * sizeof(T)), "cudaMemset");
  }
  Status Zero() {
    if (n_ == 0) return OkStatus();
    return CudaStatus(cudaMemset(ptr_, 0, n_ * sizeof(T)), "cudaMemset");
  }
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = 0;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_CONTEXT_H_
