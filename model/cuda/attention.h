// Multi-head self-attention core on the GPU for sequences up to 512, the
// straightforward version: split heads, one strided-batched cuBLASLt GEMM
// for the scores (scaled by 1/sqrt(d) in alpha), a masked row softmax in
// place, a second batched GEMM with V, merge heads. Same layout and mask
// semantics as cpu::AttentionForward (model/cpu/ops.h): qkv [B,L,3H],
// mask [B,L] (1 = real key), out [B,L,H], probs [B,nh,L,L] saved for the
// backward. For bf16/fp16 CudaBert runs the fused kernels of
// flash_attention.h instead (no L*L tensor); this version serves fp32, head
// sizes those kernels do not take, and the comparison row in bench/gpu
// (dgca-bench --gemm-attention).
//
// Thread-safety: as GemmRunner (one thread, one context).
#ifndef DGCA_MODEL_CUDA_ATTENTION_H_
#define DGCA_MODEL_CUDA_ATTENTION_H_

#include <algorithm>
#include <cstdint>

#include "model/core/dropout.h"
#include "model/core/status.h"
#include "model/cuda/gemm.h"

namespace dgca {
namespace cuda {

// Elements of T the scratch must hold: q, k, v and the per-head context,
// each B*L*H.
inline int64_t AttentionScratchElems(int B, int L, int H) { return 4 * int64_t(B) * L * H; }

// T is float or bf16 (kernels.h). INVALID_ARGUMENT when H % nh != 0 or
// L > 512.
// With dropout on the probabilities (drop.on(): keys in device memory;
// model/core/dropout.h, as cpu::AttentionForward) both scratches need
// AttentionDropoutScratchElems more (the masked probabilities); probs keeps
// them unmasked.
inline int64_t AttentionDropoutScratchElems(int B, int L, int nh) { return int64_t(B) * nh * L * L; }
template <typename T>
Status AttentionForward(const CudaContext& ctx, GemmRunner* gemm, T* out, T* probs, const T* qkv,
                        const int32_t* mask, int B, int L, int H, int nh, T* scratch,
                        const AttentionDropout& drop = {});

// Elements of T the backward's scratch must hold: q, k, v, dctx, dq, dk, dv
// (each B*L*H) and dprobs (B*nh*L*L).
inline int64_t AttentionBackwardScratchElems(int B, int L, int H, int nh) {
  return 7 * int64_t(B) * L * H + int64_t(B) * nh * L * L;
}

// dqkv [B,L,3H] (overwritten) from dout [B,L,H], the forward's qkv and
// probs, as cpu::AttentionBackward: dP = dctx V^T, dV = P^T dctx,
// dS = P (dP - rowsum(P dP)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).
template <typename T>
Status AttentionBackward(const CudaContext& ctx, GemmRunner* gemm, T* dqkv, const T* dout, const T* qkv,
                         const T* probs, int B, int L, int H, int nh, T* scratch,
                         const AttentionDropout& drop = {});
// One scratch that serves the forward and the backward alike (CudaBert
// keeps one for all layers): the larger of the two, plus the masked
// probabilities when attention dropout is on.
inline int64_t AttentionSharedScratchElems(int B, int L, int H, int nh, bool dropout) {
  return std::max(AttentionScratchElems(B, L, H), AttentionBackwardScratchElems(B, L, H, nh)) +
         (dropout ? AttentionDropoutScratchElems(B, L, nh) : 0);
}

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_ATTENTION_H_
