// CUDA kernels of the DGCA-ReLM model, mirroring model/cpu/ops.h (same
// argument order, shapes and semantics; see that header). Each launcher
// enqueues on `stream` and returns the launch status (kernel faults show up
// at the next synchronization).
//
// Precision: T is float, __nv_bfloat16 or __half (activations and 16-bit
// weight copies; dtype.h). Arithmetic is fp32 inside every kernel; statistics (LayerNorm
// mean/rstd), parameter gradients (dgamma, dbeta, dtable), optimizer state
// and master weights are fp32.
//
// Determinism: every kernel here is bit-reproducible run to run except
// EmbeddingBackward with deterministic=false (atomicAdd). LayerNorm's
// dgamma/dbeta and ColumnSumAdd sum each column in a fixed order that
// depends only on the sizes (chunks of rows, see ColumnSumScratchElems),
// not the CPU's.
// The deterministic EmbeddingBackward gives each column to one thread that
// sums the rows in order, as the CPU does: exact and slow for many rows
// (CudaDgcaModel uses the atomic path unless set_deterministic(true)).
//
// Thread-safety: launchers are stateless; ordering is the stream's.
#ifndef DGCA_MODEL_CUDA_KERNELS_H_
#define DGCA_MODEL_CUDA_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/core/dropout.h"
#include "model/core/status.h"
#include "model/cuda/dtype.h"

namespace dgca {
namespace cuda {


// Conversion of n elements (T = bf16 or __half; round to nearest even).
template <typename T>
Status CastFromFloat(cudaStream_t stream, T* out, const float* inp, int64_t n);

// out = (inp - mean) * rstd * gamma + beta per row of c; mean, rstd [n] fp32.
template <typename T>
Status LayerNormForward(cudaStream_t stream, T* out, float* mean, float* rstd, const T* inp,
                        const T* gamma, const T* beta, int n, int c, float eps);
// Column reductions over many rows (LayerNorm's dgamma/dbeta, bias
// gradients) sum chunks of kColumnChunkRows rows in parallel blocks, then
// the chunks in order (deterministic). With more than one chunk they need
// device scratch: ColumnSumScratchElems(rows, cols) floats per sum (0 when
// rows <= kColumnChunkRows: scratch may then be null). The scratch is used
// in stream order, so one buffer serves every call on one stream.
constexpr int kColumnChunkRows = 128;
int64_t ColumnSumScratchElems(int rows, int cols);

// dinp (= or += when accumulate); dgamma, dbeta += (fp32; may be null).
// scratch: 2 x ColumnSumScratchElems(n, c) floats.
template <typename T>
Status LayerNormBackward(cudaStream_t stream, T* dinp, bool accumulate, float* dgamma,
                         float* dbeta, const T* dout, const T* inp, const T* gamma,
                         const float* mean, const float* rstd, int n, int c, float* scratch);

// Exact erf GELU (BERT's), not the tanh form of cuBLASLt's GELU epilogue.
template <typename T>
Status GeluForward(cudaStream_t stream, T* out, const T* inp, int64_t n);
// dinp = dout * gelu'(inp); dinp may alias dout.
template <typename T>
Status GeluBackward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, int64_t n);

// Stable softmax of each row; out may alias inp.
template <typename T>
Status SoftmaxRows(cudaStream_t stream, T* out, const T* inp, int rows, int cols);

// Attention softmax: rows of `scores` [B, nh, L, L] (already scaled),
// key j of batch b masked when mask[b*L+j] == 0 (probability exactly 0;
// an all-masked row gets all zeros, as cpu::AttentionForward). In place ok.
template <typename T>
Status MaskedSoftmax(cudaStream_t stream, T* probs, const T* scores, const int32_t* mask, int B,
                     int nh, int L);

// out[i,:] = table[ids[i],:] (ids in range: the caller checks).
template <typename T>
Status EmbeddingForward(cudaStream_t stream, T* out, const int32_t* ids, const T* table, int n,
                        int c);
// out[i,:] += table[ids[i],:].
template <typename T>
Status EmbeddingAdd(cudaStream_t stream, T* out, const int32_t* ids, const T* table, int n, int c);
// dtable[ids[i],:] += dout[i,:] for ids[i] >= 0. deterministic: each column
// walks the rows in order (bitwise equal to the CPU kernel); otherwise
// atomicAdd (faster, order-dependent rounding).
template <typename T>
Status EmbeddingBackward(cudaStream_t stream, float* dtable, const int32_t* ids, const T* dout,
                         int n, int c, bool deterministic);

// out[n,c] += bias[c].
template <typename T>
Status BiasAdd(cudaStream_t stream, T* out, const T* bias, int n, int c);
// dst[c] += sum over rows of src[r*cols+c] (fp32; chunked, see above).
// scratch: ColumnSumScratchElems(rows, cols) floats.
template <typename T>
Status ColumnSumAdd(cudaStream_t stream, float* dst, const T* src, int rows, int cols, float* scratch);

// Cross-entropy of logits [n,v] (the gathered rows: target slots or MFT
// positions) against targets [n]; ignore_index -100 and any negative
// target give loss 0 and dlogits 0. row_loss [n] gets -log softmax[t]
// (fp32); dlogits (may be null; may alias logits) gets
// (softmax - onehot(t)) * dscale for counted rows.
template <typename T>
Status CrossEntropy(cudaStream_t stream, float* row_loss, T* dlogits, const T* logits,
                    const int32_t* targets, int n, int v, float dscale);

// Where AdamW's weight decay applies along its n elements: everywhere
// (runs == 0) or in runs that alternate: run_ends (device memory) holds
// `runs` ascending exclusive ends, the last == n, and run k decays iff
// (k is even) == first_decays. A model's whole flat parameter buffer is
// one launch this way (decayed weights and undecayed biases and LayerNorm
// parameters interleave: bert-base has about 200 runs).
struct DecayRuns {
  const int64_t* run_ends = nullptr;
  int runs = 0;
  bool first_decays = true;
};

// AdamW (PyTorch semantics, as model/train/optimizer.cc) on fp32 master
// weights over n elements: grad is multiplied by grad_scale first (1/loss
// scale for fp16); decay = lr*wd applied before the update (where `runs`
// says); `step` is the 1-based step after increment. half_out (H = bf16 or
// __half; may be null) gets the updated weights rounded to H (the copy the
// forward reads).
template <typename H>
Status AdamW(cudaStream_t stream, float* param, float* m, float* v, const float* grad,
             H* half_out, int64_t n, float lr, float beta1, float beta2, float eps,
             float weight_decay, int64_t step, float grad_scale, const DecayRuns& runs = {});

// *out += sum of x[i]^2 over n floats: fp32 per-thread and per-block
// partials, the block sums (into `partials`, kSumSquaresMaxBlocks doubles of
// scratch) then added in double in a fixed order, so the result is the same
// bit for bit on every run. For the global gradient norm: zero *out first
// (cudaMemsetAsync).
inline constexpr int kSumSquaresMaxBlocks = 1024;
Status SumSquares(cudaStream_t stream, double* out, const float* x, int64_t n, double* partials);

// fp16 dynamic loss scaling (the bookkeeping is model/train/loss_scaler.h):
// grad *= inv_scale in place; *found_inf = 1 if any result is inf or NaN
// (found_inf is only ever set, never cleared: zero it per step).
Status UnscaleCheck(cudaStream_t stream, float* grad, int64_t n, float inv_scale, int32_t* found_inf);

// Attention layout helpers. qkv [B,L,3H] -> q,k,v each [B,nh,L,d].
template <typename T>
Status SplitHeads(cudaStream_t stream, T* q, T* k, T* v, const T* qkv, int B, int L, int H,
                  int nh);
// ctx [B,nh,L,d] -> out [B,L,H].
template <typename T>
Status MergeHeads(cudaStream_t stream, T* out, const T* ctx, int B, int L, int H, int nh);

// Attention backward helpers. dst [B,nh,L,d] gets head h of rows whose
// channels h*d..h*d+d-1 start at src[(b*L+l)*row_stride + offset] (so
// SplitHeads is three of these with row_stride 3H, offsets 0, H, 2H).
template <typename T>
Status GatherHeads(cudaStream_t stream, T* dst, const T* src, int64_t row_stride, int64_t offset,
                   int B, int L, int H, int nh);
// The inverse: dst[(b*L+l)*row_stride + offset + h*d + e] = src[b,h,l,e].
template <typename T>
Status ScatterHeads(cudaStream_t stream, T* dst, int64_t row_stride, int64_t offset, const T* src,
                    int B, int L, int H, int nh);
// Softmax backward per row: dscores = probs * (dprobs - sum_j probs*dprobs).
// dscores may alias dprobs. Masked keys (probs 0) get 0.
template <typename T>
Status SoftmaxBackward(cudaStream_t stream, T* dscores, const T* probs, const T* dprobs, int rows,
                       int cols);

// Inverted dropout of hidden rows, as cpu::DropoutRows (model/core/dropout.h):
// rows of [B*L, H], row i of sample i / L at position i % L, keys [B] in
// device memory (read when the kernel runs, so a CUDA graph replays with
// the keys of the batch uploaded before it). out = in * M / (1-p), plus
// residual when it is non-null. out may alias in (not residual).
template <typename T>
Status DropoutRows(cudaStream_t stream, T* out, const T* in, const T* residual, const uint64_t* keys, int layer,
                   int site, float p, int B, int L, int H);
// out = in * M / (1-p) over probabilities [B, nh, L, L] with the mask of
// drop (site kDropAttnProbs; keys in device memory). out may alias in.
template <typename T>
Status DropoutProbs(cudaStream_t stream, T* out, const T* in, const AttentionDropout& drop, int B, int nh, int L);

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_KERNELS_H_
