// CudaPromptEncoder: the GPU mirror of PromptEncoder (model/nn/prompt_encoder.h),
// ReLM's prompt encoder: Embedding(S=2P, H) -> [2-layer BiLSTM] -> Linear ->
// ReLU -> Linear, producing the S prompt rows [S, H] on the device. Same
// kinds (lstm, mlp, none), parameter names, shapes, gate order (i, f, g, o)
// and maths as the CPU reference; read that header.
//
// Checked against the CPU by heads_check.h on the CUDA emulator
// (model/cuda_emu, ctest) and on an H200 (docs/benchmarks.md).
//
// Precision: fp32 throughout (the encoder is tiny: S = 2P rows, its cost is
// launches, not FLOPs). It reads the fp32 master weights and ADDS into the
// fp32 grads of DeviceParams. ForwardAs<T> converts the rows at the edge
// for a bf16 or fp16 model (the backward takes the fp32 gradient the
// embedding backward accumulates).
//
// Implementation: the input projections, the two Linears and every weight
// gradient are cuBLASLt GEMMs (GemmRunner, fp32 compute, no TF32); the LSTM
// recurrence runs per time step as a 1-row GEMM (gates += h_{t-1} W_hh^T)
// and a pointwise kernel (2 launches per step and direction; S*4*2 in all
// for the forward). Backward walks the steps in reverse with a pointwise
// kernel and a 1-row GEMM (dh_{t-1} = dgates_t W_hh) per step; dW_hh is ONE
// GEMM over all steps afterwards (dgates rows of steps > 0 against the
// previous hidden rows), the biases column sums (ColumnSumAdd). Every
// reduction has a fixed order: bit-reproducible run to run.
//
// Usage: ctor(cfg) -> Bind(layout, params, ctx, gemm) -> Forward() then
// Backward(dout) per step. Buffers allocated once in Bind().
// Thread-safety: not thread-safe; work ordered on the context's stream.
#ifndef DGCA_MODEL_CUDA_CUDA_PROMPT_ENCODER_H_
#define DGCA_MODEL_CUDA_CUDA_PROMPT_ENCODER_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/device_params.h"
#include "model/cuda/gemm.h"
#include "model/nn/params.h"
#include "model/nn/prompt_encoder.h"

namespace dgca {
namespace cuda {

class CudaPromptEncoder {
 public:
  explicit CudaPromptEncoder(const ModelConfig& cfg);
  CudaPromptEncoder(const CudaPromptEncoder&) = delete;
  CudaPromptEncoder& operator=(const CudaPromptEncoder&) = delete;

  PromptEncoderKind kind() const { return kind_; }
  bool enabled() const { return kind_ != PromptEncoderKind::kNone; }
  int rows() const { return rows_; }      // S = 2P
  int hidden() const { return hidden_; }  // H

  // `layout` holds the tensors PromptEncoder::Declare declares for the same
  // cfg (finalized); `params` its GPU copy. Not owned; must outlive this.
  // Allocates every buffer. kNone binds nothing. Errors like
  // PromptEncoder::Bind (NOT_FOUND / INVALID_ARGUMENT), INTERNAL for CUDA.
  Status Bind(const ParamStore& layout, DeviceParams* params, const CudaContext* ctx,
              GemmRunner* gemm);

  // Enqueues the forward from the current master weights; *out = the [S,H]
  // fp32 rows (owned, valid until the next Forward); nullptr for kNone.
  Status Forward(const float** out);
  // Forward, then a copy of the rows as T (bf16 or __half; owned) in *out.
  template <typename T>
  Status ForwardAs(const T** out);

  // dout [S,H] fp32 on the device: ADDS into every parameter grad of this
  // encoder (embedding included), from the activations of the last
  // Forward(). No-op for kNone.
  Status Backward(const float* dout);

  // Tests: fills every internal buffer (outputs and activations) with NaN.
  Status PoisonScratch();

 private:
  struct Dir {
    int in = 0;
    bool reverse = false;
    const LstmParams* p = nullptr;  // its parameters' indices (in p_)
    DeviceArray<float> gates;   // [S,4H] activated gates (i, f, g, o)
    DeviceArray<float> c;       // [S,H]
    DeviceArray<float> tanh_c;  // [S,H]
  };
  Status DirForward(Dir* d, const float* x, float* out);
  Status DirBackward(Dir* d, const float* x, const float* out, const float* dout, float* dx);
  Status Gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
              int ldb, float beta, float* C, int ldc);

  PromptEncoderKind kind_;
  int rows_, hidden_;
  bool bound_ = false;
  const ParamStore* layout_ = nullptr;
  DeviceParams* params_ = nullptr;
  const CudaContext* ctx_ = nullptr;
  GemmRunner* gemm_ = nullptr;
  PromptParams p_;
  Dir dirs_[4];  // l0, l0_reverse, l1, l1_reverse

  DeviceArray<float> out0_, out1_;  // [S,2H] LSTM layer outputs
  DeviceArray<float> hid_, out_;    // [S,H]
  DeviceArray<uint16_t> out16_;  // [S,H] ForwardAs's 16-bit copy
  DeviceArray<float> d_out1_, d_out0_, d_hid_;
  DeviceArray<float> dgates_;       // [S,4H]
  DeviceArray<float> dh_, dc_;      // [H]
  DeviceArray<float> col_scratch_;  // bias-gradient column sums (kernels.h)
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_PROMPT_ENCODER_H_
