// CPU kernels of the DGCA-ReLM model, llm.c style: plain functions over
// float* with explicit shapes, row-major. The only allocations are small
// per-call scratch vectors (attention backward's dS, cross-entropy's
// per-row losses, the built-in GEMM's packed B).
//
// Conventions
//   - "n" rows of "c" channels; a Linear layer's weight is [out, in] as in
//     PyTorch nn.Linear (so forward is out = inp W^T + b).
//   - Parameter gradients (dw, db, dgamma, dbeta, dtable) are ADDED to, so
//     micro-batches accumulate. Activation gradients (dinp) are overwritten
//     unless the function takes `accumulate` and it is true.
//   - Every function with a ctx runs on ctx.pool's threads (serially without
//     a pool). OpenBLAS itself is kept single-threaded (SetBlasThreads); Gemm
//     splits its output into row or column blocks, one BLAS call per thread.
//
// Determinism: for a fixed ctx.threads() every kernel is bit-reproducible. No
// kernel reduces through atomics: reductions over rows (bias, LayerNorm and
// embedding gradients) are split by columns, each column summed by one
// thread in row order, so they are even independent of the thread count.
// Gemm computes each output element within one single-threaded BLAS call
// (or, built-in, on one thread in a fixed k order); the block split depends
// only on the shapes and the thread count.
//
// Thread-safety: the kernels write only their outputs; calls that share a
// pool must not run concurrently (ThreadPool::Run is not reentrant).
// SetBlasThreads changes OpenBLAS's process-wide setting.
#ifndef DGCA_MODEL_CPU_OPS_H_
#define DGCA_MODEL_CPU_OPS_H_

#include <cstdint>

#include "model/core/dropout.h"
#include "model/cpu/thread_pool.h"

namespace dgca {
namespace cpu {

// What a kernel may use: a thread pool (not owned; null = serial).
struct Context {
  ThreadPool* pool = nullptr;
  int threads() const { return pool != nullptr ? pool->threads() : 1; }
};

// Below this much work (multiply-adds or elements) a parallel region costs
// more than it saves.
constexpr int64_t kParallelMinWork = 1 << 14;

// Splits [0, total) into `parts` contiguous ranges; part p is [*b, *e).
inline void SplitRange(int64_t total, int parts, int p, int64_t* b, int64_t* e) {
  const int64_t base = total / parts, rem = total % parts;
  *b = p * base + (p < rem ? p : rem);
  *e = *b + base + (p < rem ? 1 : 0);
}

// Calls f(begin, end) on contiguous static chunks of [0, n), one per pool
// thread when `work` is large enough, else f(0, n) on the caller.
template <typename F>
void ParallelFor(const Context& ctx, int64_t n, int64_t work, const F& f) {
  const int nt = ctx.threads();
  if (nt <= 1 || n < 2 || work < kParallelMinWork) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
  ctx.pool->Run([&](int p) {
    int64_t b, e;
    SplitRange(n, nt, p, &b, &e);
    if (b < e) f(b, e);
  });
}

// True when Gemm uses OpenBLAS (built with DGCA_HAVE_OPENBLAS).
bool HaveBlas();

// Makes OpenBLAS single-threaded (its setting is process-wide): the kernels
// parallelize GEMMs themselves on the pool, and two spinning thread pools on
// few cores slow each other down. No-op without OpenBLAS.
void SetBlasThreads();

// Row-major C[M,N] = alpha * op(A) * op(B) + beta * C, with op(A) [M,K]
// (A stored [K,M] when trans_a) and op(B) [K,N] (B stored [N,K] when
// trans_b). beta == 0 overwrites C (NaNs in C are not propagated).
void Gemm(const Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The built-in blocked GEMM that Gemm uses without OpenBLAS; exposed so the
// test can compare both paths.
void GemmBuiltin(const Context& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                 float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc);

// out[n,oc] = inp[n,ic] w[oc,ic]^T + b[oc]  (b may be null).
void LinearForward(const Context& ctx, float* out, const float* inp, const float* w,
                   const float* b, int n, int ic, int oc);
// dinp[n,ic] (= or += when accumulate_dinp) dout w; dw[oc,ic] += dout^T inp;
// db[oc] += column sums of dout. dinp, dw, db may each be null (skipped).
void LinearBackward(const Context& ctx, float* dinp, bool accumulate_dinp, float* dw, float* db,
                    const float* dout, const float* inp, const float* w, int n, int ic, int oc);

// dst[c] += sum over rows r of src[r*cols + c]  (rows in order).
void ColumnSumAdd(const Context& ctx, float* dst, const float* src, int rows, int cols);

// out = (inp - mean) * rstd * gamma + beta per row; saves mean and rstd [n]
// for the backward. Statistics are accumulated in double.
void LayerNormForward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                      const float* gamma, const float* beta, int n, int c, float eps);
// dinp (= or += when accumulate) from dout; dgamma, dbeta += (may be null).
void LayerNormBackward(const Context& ctx, float* dinp, bool accumulate, float* dgamma,
                       float* dbeta, const float* dout, const float* inp, const float* gamma,
                       const float* mean, const float* rstd, int n, int c);

// Exact GELU as in BERT: 0.5 x (1 + erf(x / sqrt 2)) (not the tanh form).
void GeluForward(const Context& ctx, float* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp). dinp may alias dout.
void GeluBackward(const Context& ctx, float* dinp, const float* inp, const float* dout, int64_t n);

// Numerically stable softmax of each row. out may alias inp.
void SoftmaxRows(const Context& ctx, float* out, const float* inp, int rows, int cols);

// Multi-head self-attention core (the projections are Linear layers around
// it). qkv [B,L,3H]: query at channel 0, key at H, value at 2H; head h uses
// channels h*d .. h*d+d-1 of each, d = H/nh. mask [B,L]: 1 = real token,
// 0 = padding key. Like HF BertModel (which adds the dtype's minimum to
// masked scores, so their softmax weight underflows to exactly 0), masked
// keys get probability 0; a query row whose keys are all masked (never in
// a ReLM batch: [CLS] is always real) gets all-zero probabilities.
// out [B,L,H] = softmax(q k^T / sqrt(d) + mask) v; probs [B,nh,L,L] saved.
//
// Dropout on the probabilities when drop.keys != null and drop.p > 0
// (model/core/dropout.h, site kDropAttnProbs of layer drop.layer, index
// DropoutProbsIndex(h, i, j), keys[b] per batch row; the struct is
// model/core/dropout.h's): out = (P o M / (1-p)) v,
// probs keeps P without the mask; the backward regenerates the mask.
void AttentionForward(const Context& ctx, float* out, float* probs, const float* qkv,
                      const int32_t* mask, int B, int L, int H, int nh,
                      const AttentionDropout& drop = {});
// dqkv [B,L,3H] (overwritten) from dout [B,L,H]; `drop` as in the forward.
void AttentionBackward(const Context& ctx, float* dqkv, const float* dout, const float* qkv,
                       const float* probs, int B, int L, int H, int nh,
                       const AttentionDropout& drop = {});

// Inverted dropout of hidden rows (model/core/dropout.h): rows of
// [B*L, H], row i of sample b = i / L at position i % L, site `site` of
// layer `layer`, keys[b] (non-null); out = in * M / (1-p), plus residual
// when it is non-null. out may alias in (not residual). Forward and
// backward alike (the backward multiplies the incoming gradient by the
// same mask).
void DropoutRows(const Context& ctx, float* out, const float* in, const float* residual,
                 const uint64_t* keys, int layer, int site, float p, int B, int L, int H);
// out = in * M / (1-p) over probabilities [B, nh, L, L] with the mask of
// `drop` (site kDropAttnProbs, index DropoutProbsIndex); out may alias in.
void DropoutProbs(const Context& ctx, float* out, const float* in, const AttentionDropout& drop, int B,
                  int nh, int L);

// out[i,:] = table[ids[i],:]. ids must be in range (checked by the caller).
void EmbeddingForward(const Context& ctx, float* out, const int32_t* ids, const float* table,
                      int n, int c);
// out[i,:] += table[ids[i],:].
void EmbeddingAdd(const Context& ctx, float* out, const int32_t* ids, const float* table, int n,
                  int c);
// dtable[ids[i],:] += dout[i,:] for every i with ids[i] >= 0 (rows in order).
void EmbeddingBackward(const Context& ctx, float* dtable, const int32_t* ids, const float* dout,
                       int n, int c);

// Cross-entropy of logits [n,v] against targets [n] (ignore_index -100 and
// any negative target skipped). Returns the SUM of -log softmax(logits)[t]
// over the rows that count, and their number in *counted (may be null).
// When dlogits is non-null it gets (softmax - onehot(t)) * dscale for the
// counted rows and 0 for ignored rows; dlogits may alias logits.
double CrossEntropy(const Context& ctx, float* dlogits, const float* logits,
                    const int32_t* targets, int n, int v, float dscale, int64_t* counted);

// out[i] = argmax_j x[i,j] (the first maximum).
void ArgmaxRows(const Context& ctx, int32_t* out, const float* x, int n, int v);

}  // namespace cpu
}  // namespace dgca

#endif  // DGCA_MODEL_CPU_OPS_H_
