// DeviceParams (device_params.h). Checked on the CUDA emulator and on an H200 (docs/benchmarks.md).
//
// The synchronous transfers use cudaDeviceSynchronize around plain
// cudaMemcpy: the model's stream is non-blocking (CudaContext), so the
// legacy default stream that cudaMemcpy uses does NOT wait for it; a full
// device sync before a download (and after an upload) is the simple way to
// order them. These run at start, at checkpoints and in checks, never per
// step.
#include "model/cuda/device_params.h"

#include <string>

#include "model/cuda/kernels.h"

namespace dgca {
namespace cuda {
namespace {

Status DeviceSync(const char* what) {
  return CudaStatus(cudaDeviceSynchronize(), std::string("cudaDeviceSynchronize (") + what + ")");
}

Status SameLayout(const ParamStore& a, const ParamStore& b, const char* what) {
  if (!b.finalized()) {
    return FailedPreconditionError(std::string("DeviceParams::") + what + ": the host store is not finalized");
  }
  if (a.total_numel() != b.total_numel() || a.size() != b.size()) {
    return InvalidArgumentError(std::string("DeviceParams::") + what + ": host store has " +
                                std::to_string(b.size()) + " tensors / " + std::to_string(b.total_numel()) +
                                " floats, the device copy " + std::to_string(a.size()) + " / " +
                                std::to_string(a.total_numel()));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<DeviceParams>> DeviceParams::Create(const ParamStore* layout, DType copy) {
  if (layout == nullptr) return InvalidArgumentError("DeviceParams::Create: null layout");
  if (!layout->finalized()) return FailedPreconditionError("DeviceParams::Create: the ParamStore is not finalized");
  std::unique_ptr<DeviceParams> p(new DeviceParams());
  p->layout_ = layout;
  const size_t n = static_cast<size_t>(layout->total_numel());
  DGCA_RETURN_IF_ERROR(p->master_.Allocate(n).WithPrefix("DeviceParams master"));
  DGCA_RETURN_IF_ERROR(p->grad_.Allocate(n).WithPrefix("DeviceParams grad"));
  DGCA_RETURN_IF_ERROR(p->master_.Zero());
  DGCA_RETURN_IF_ERROR(p->grad_.Zero());
  p->copy_type_ = copy;
  if (copy != DType::kF32) {
    DGCA_RETURN_IF_ERROR(p->copy_.Allocate(n).WithPrefix(std::string("DeviceParams ") + DTypeName(copy) + " copy"));
    DGCA_RETURN_IF_ERROR(p->copy_.Zero());
  }
  // cudaMemset may return before it is done; later work goes to a
  // non-blocking stream that would not wait for it.
  DGCA_RETURN_IF_ERROR(DeviceSync("DeviceParams::Create"));
  return p;
}

Status DeviceParams::Upload(const ParamStore& host) {
  DGCA_RETURN_IF_ERROR(SameLayout(*layout_, host, "Upload"));
  const int64_t n = total_numel();
  if (n == 0) return OkStatus();
  DGCA_RETURN_IF_ERROR(DeviceSync("DeviceParams::Upload, before"));  // nothing may still read master
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(master_.get(), host.values(), sizeof(float) * n,
                                             cudaMemcpyHostToDevice),
                                  "DeviceParams::Upload cudaMemcpy"));
  DGCA_RETURN_IF_ERROR(CopyFromMaster(nullptr));
  return DeviceSync("DeviceParams::Upload");
}

Status DeviceParams::DownloadValues(ParamStore* host) const {
  if (host == nullptr) return InvalidArgumentError("DeviceParams::DownloadValues: null host store");
  DGCA_RETURN_IF_ERROR(SameLayout(*layout_, *host, "DownloadValues"));
  const int64_t n = total_numel();
  if (n == 0) return OkStatus();
  DGCA_RETURN_IF_ERROR(DeviceSync("DeviceParams::DownloadValues"));
  return CudaStatus(cudaMemcpy(host->values(), master_.get(), sizeof(float) * n, cudaMemcpyDeviceToHost),
                    "DeviceParams::DownloadValues cudaMemcpy");
}

Status DeviceParams::DownloadGrads(ParamStore* host) const {
  if (host == nullptr) return InvalidArgumentError("DeviceParams::DownloadGrads: null host store");
  DGCA_RETURN_IF_ERROR(SameLayout(*layout_, *host, "DownloadGrads"));
  const int64_t n = total_numel();
  if (n == 0) return OkStatus();
  DGCA_RETURN_IF_ERROR(DeviceSync("DeviceParams::DownloadGrads"));
  return CudaStatus(cudaMemcpy(host->grads(), grad_.get(), sizeof(float) * n, cudaMemcpyDeviceToHost),
                    "DeviceParams::DownloadGrads cudaMemcpy");
}

Status DeviceParams::ZeroGrads(cudaStream_t stream) {
  const int64_t n = total_numel();
  if (n == 0) return OkStatus();
  return CudaStatus(cudaMemsetAsync(grad_.get(), 0, sizeof(float) * n, stream), "DeviceParams::ZeroGrads");
}

Status DeviceParams::CopyFromMaster(cudaStream_t stream) {
  switch (copy_type_) {
    case DType::kBF16: return CastFromFloat(stream, copy<bf16>(), master_.get(), total_numel());
    case DType::kF16: return CastFromFloat(stream, copy<__half>(), master_.get(), total_numel());
    case DType::kF32: return OkStatus();
  }
  return OkStatus();
}

Status DeviceParams::RefreshCopy(cudaStream_t stream) {
  if (copy_type_ == DType::kF32) {
    return FailedPreconditionError("DeviceParams::RefreshCopy: created without a 16-bit copy");
  }
  return CopyFromMaster(stream);
}

}  // namespace cuda
}  // namespace dgca
