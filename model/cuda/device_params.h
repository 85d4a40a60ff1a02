// DeviceParams: the GPU copy of a ParamStore (model/nn/params.h), in the
// SAME flat layout, so ParamStore's indices and offsets address it:
//   master  fp32 [total_numel]   the weights AdamW updates (fp32 master)
//   copy    bf16 or fp16 [total_numel] (optional) the copy a 16-bit
//                                 forward/backward reads; refreshed from
//                                 master by RefreshCopy() or by AdamW's
//                                 half_out (kernels.h)
//   grad    fp32 [total_numel]   gradients, ADDED to by backward (as
//                                 ParamStore::grads(); the trainer zeroes)
// Because the buffers are flat, a data-parallel bucket is a contiguous slice
// of grad(), exactly as on the CPU.
//
// Modules templated on T (float, bf16 or fp16) read weights through
// weight<T>(i): the fp32 master for T = float (so an fp32 run is the CPU
// reference's arithmetic), the 16-bit copy for T = bf16 or fp16.
//
// Thread-safety: not thread-safe; owned by one CUDA model, used on its
// context's stream.
#ifndef DGCA_MODEL_CUDA_DEVICE_PARAMS_H_
#define DGCA_MODEL_CUDA_DEVICE_PARAMS_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <memory>
#include <type_traits>

#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/dtype.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {

class DeviceParams {
 public:
  // Allocates master, grad (zeroed) and the 16-bit copy of type `copy`
  // (kBF16 or kF16; kF32 = no copy), for `layout` (must be finalized; it is
  // referenced, not copied, and must outlive this object). Values are NOT
  // copied: call Upload().
  static StatusOr<std::unique_ptr<DeviceParams>> Create(const ParamStore* layout, DType copy);

  // host values -> master (and the copy when present). Synchronous.
  Status Upload(const ParamStore& host);
  // master -> host values; grad -> host grads. Synchronous.
  Status DownloadValues(ParamStore* host) const;
  Status DownloadGrads(ParamStore* host) const;
  // Enqueued on `stream`.
  Status ZeroGrads(cudaStream_t stream);
  Status RefreshCopy(cudaStream_t stream);  // copy = round(master)

  const ParamStore& layout() const { return *layout_; }
  // kF32 when there is no 16-bit copy.
  DType copy_type() const { return copy_type_; }
  int64_t total_numel() const { return layout_->total_numel(); }

  float* master() const { return master_.get(); }
  float* grad() const { return grad_.get(); }
  float* master(int i) const { return master_.get() + layout_->info(i).offset; }
  float* grad(int i) const { return grad_.get() + layout_->info(i).offset; }
  // The 16-bit copy as T (bf16 or __half); null unless copy_type() is T's.
  template <typename T>
  T* copy() const {
    static_assert(!std::is_same_v<T, float>, "the copy is bf16 or fp16");
    return copy_type_ == kDType<T> ? reinterpret_cast<T*>(copy_.get()) : nullptr;
  }

  // The weights a T-typed kernel reads: master for float, the copy for bf16
  // and fp16 (null when the copy has another type: Bind checks).
  template <typename T>
  const T* weight(int i) const {
    if constexpr (std::is_same_v<T, float>) {
      return master(i);
    } else {
      T* c = copy<T>();
      return c == nullptr ? nullptr : c + layout_->info(i).offset;
    }
  }

 private:
  DeviceParams() = default;
  Status CopyFromMaster(cudaStream_t stream);  // no-op without a copy
  const ParamStore* layout_ = nullptr;
  DType copy_type_ = DType::kF32;
  DeviceArray<float> master_;
  DeviceArray<uint16_t> copy_;  // bf16 or fp16 bits
  DeviceArray<float> grad_;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_DEVICE_PARAMS_H_
