// Fused (flash-style) multi-head self-attention for bf16 and fp16: the
// same math and layout as AttentionForward/AttentionBackward (attention.h,
// cpu::AttentionForward): qkv [B,L,3H] (q | k | v, head h at columns
// h*d..h*d+d of each), mask [B,L] (1 = real key; a padding key gets exactly
// zero weight; a row without any real key gives zeros), out [B,L,H], and
// the backward writes dqkv [B,L,3H].
//
// Why: the GEMM version writes the B*nh*L*L score matrix, reads it back for
// the softmax, writes the probabilities, reads them for P*V and again in the
// backward, and copies q, k, v and the context between the [B,L,3H] layout
// and per-head layout (8 extra passes over B*L*H). Here a block keeps one
// head's tile of queries in shared memory, streams the keys and values
// through it and never stores anything L*L: the forward saves only the
// per-row log-sum-exp (fp32 [B,nh,L]), and the backward recomputes the
// probabilities from it. Tensor cores through nvcuda::wmma (16x16x16
// tiles, fp32 accumulation); the softmax and the gradient of the scores in
// fp32 on shared memory.
//
// Forward (grid: 64-query tiles x heads x batch, 4 warps of 16 queries):
// pass 1 streams the keys for each row's max and sum of exponentials
// (online update); pass 2 recomputes the scores, forms
// P = exp(s - max) / sum rounded to T (as the GEMM version stores it) and
// accumulates P V. Two passes over K instead of rescaling the output
// accumulator keeps the output in tensor-core fragments (their element
// mapping is unspecified, so no per-row rescale is possible there).
// Backward: D = rowsum(dO * O) (fp32), then one kernel per 64-key tile
// for dK and dV (loops over query tiles) and one per 64-query tile for dQ
// (loops over key tiles): both recompute P from the log-sum-exp, so no
// atomics and the result is deterministic.
//
// Keys after a batch row's last real key are never read: the loops over
// key tiles stop at the tile holding it and a 64-key tile past it writes
// zero dK and dV at once. A batch is trimmed to its longest row, so its
// shorter rows cost only their own length (the GEMM version pays L x L for
// every row). Exact: those keys would add 0 * V and 0 * Q.
//
// Supported: T = bf16 or __half, head size d = H / nh of 16, 32 or 64, L in
// 1..512, 16-byte aligned qkv, out, dout and dqkv (cudaMalloc's are).
// FusedAttentionSupported says whether a shape qualifies; the functions
// return INVALID_ARGUMENT otherwise. Every call only enqueues on `stream`.
//
// Thread-safety: stateless; any thread, any stream.
#ifndef DGCA_MODEL_CUDA_FLASH_ATTENTION_H_
#define DGCA_MODEL_CUDA_FLASH_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "model/core/status.h"
#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {

// Whether the fused kernels take this shape and type (see above).
bool FusedAttentionSupported(DType type, int L, int H, int nh);

// out [B,L,H] and lse [B,nh,L] (fp32: max + log(sum), +inf for a row
// without real keys) from qkv and mask.
template <typename T>
Status FusedAttentionForward(cudaStream_t stream, T* out, float* lse, const T* qkv, const int32_t* mask,
                             int B, int L, int H, int nh);

// fp32 elements the backward's scratch must hold (the rows' rowsum(dO * O)).
inline int64_t FusedAttentionBackwardScratchFloats(int B, int L, int nh) { return int64_t(B) * nh * L; }

// dqkv [B,L,3H] (overwritten) from dout [B,L,H], the forward's qkv, out,
// lse and the mask. dqkv must not overlap qkv, dout or out (the dQ kernel
// reads qkv after the dK/dV kernel has written dqkv).
template <typename T>
Status FusedAttentionBackward(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const T* out,
                              const float* lse, const int32_t* mask, int B, int L, int H, int nh,
                              float* scratch);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_FLASH_ATTENTION_H_
