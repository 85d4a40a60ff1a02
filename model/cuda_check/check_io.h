// Host <-> device transfers for the GPU-vs-CPU checks (bert_check,
// heads_check): float vectors uploaded as T (rounded to nearest even) and
// T arrays read back as floats. Synchronous (plain cudaMemcpy on the legacy
// stream: callers synchronize the device before launching on the context's
// non-blocking stream, and after it before reading back).
//
// Thread-safety: free functions.
#ifndef DGCA_MODEL_CUDA_CHECK_CHECK_IO_H_
#define DGCA_MODEL_CUDA_CHECK_CHECK_IO_H_

#include <cuda_runtime.h>

#include <vector>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {

template <typename T>
StatusOr<DeviceArray<T>> UploadAs(const std::vector<float>& v) {
  std::vector<T> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = FromF<T>(v[i]);
  DeviceArray<T> d;
  DGCA_RETURN_IF_ERROR(d.Upload(h));
  return d;
}

// n elements of T at device pointer p, as floats.
template <typename T>
StatusOr<std::vector<float>> DownloadAsFloat(const T* p, size_t n) {
  std::vector<T> h(n);
  if (n > 0) {
    DGCA_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H"));
  }
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = ToF(h[i]);
  return v;
}

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CHECK_CHECK_IO_H_
