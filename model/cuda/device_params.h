// DeviceParams: the GPU copy of a ParamStore (model/nn/params.h), in the
// SAME flat layout, so ParamStore's indices and offsets address it:
//   master  fp32 [total_numel]   the weights AdamW updates (fp32 master)
//   half    bf16 [total_numel]   the copy the bf16 forward/backward reads;
//                                 refreshed from master by RefreshHalf() or
//                                 by AdamW's bf16_out (kernels.h)
//   grad    fp32 [total_numel]   gradients, ADDED to by backward (as
//                                 ParamStore::grads(); the trainer zeroes)
// Because the buffers are flat, a data-parallel bucket is a contiguous slice
// of grad(), exactly as on the CPU.
//
// Modules templated on T (float or bf16) read weights through weight<T>(i):
// the fp32 master for T = float (so an fp32 run is the CPU reference's
// arithmetic), the bf16 copy for T = bf16.
//
// Thread-safety: not thread-safe; owned by one CUDA model, used on its
// context's stream.
#ifndef DGCA_MODEL_CUDA_DEVICE_PARAMS_H_
#define DGCA_MODEL_CUDA_DEVICE_PARAMS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <type_traits>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {

class DeviceParams {
 public:
  // Allocates master, grad (zeroed) and, when with_half, the bf16 copy, for
  // `layout` (must be finalized; it is referenced, not copied, and must
  // outlive this object). Values are NOT copied: call Upload().
  static StatusOr<std::unique_ptr<DeviceParams>> Create(const ParamStore* layout,
                                                        bool with_half);

  // host values -> master (and half when present). Synchronous.
  Status Upload(const ParamStore& host);
  // master -> host values; grad -> host grads. Synchronous.
  Status DownloadValues(ParamStore* host) const;
  Status DownloadGrads(ParamStore* host) const;
  // Enqueued on `stream`.
  Status ZeroGrads(cudaStream_t stream);
  Status RefreshHalf(cudaStream_t stream);  // half = bf16(master)

  const ParamStore& layout() const { return *layout_; }
  bool has_half() const { return half_.get() != nullptr; }
  int64_t total_numel() const { return layout_->total_numel(); }

  float* master() const { return master_.get(); }
  __nv_bfloat16* half() const { return half_.get(); }
  float* grad() const { return grad_.get(); }
  float* master(int i) const { return master_.get() + layout_->info(i).offset; }
  __nv_bfloat16* half(int i) const { return half_.get() + layout_->info(i).offset; }
  float* grad(int i) const { return grad_.get() + layout_->info(i).offset; }

  // The weights a T-typed kernel reads: master for float, half for bf16.
  template <typename T>
  const T* weight(int i) const {
    if constexpr (std::is_same_v<T, float>) {
      return master(i);
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>, "T is float or bf16");
      return half(i);
    }
  }

 private:
  DeviceParams() = default;
  const ParamStore* layout_ = nullptr;
  DeviceArray<float> master_;
  DeviceArray<__nv_bfloat16> half_;
  DeviceArray<float> grad_;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_DEVICE_PARAMS_H_
