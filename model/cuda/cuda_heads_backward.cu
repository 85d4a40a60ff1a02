// CudaHeads<T>::Backward (model/cuda/cuda_heads.h): the heads' backward
// pass, after the forward pass of cuda_heads.cu saved its per-slot state.
// Checked on the CUDA emulator and on an H200 (docs/benchmarks.md).
//
// Kernels (one block per slot unless noted), in call order:
//   VocabBackwardKernel (dz)  SlotBackwardKernel (dl, de, ds, dh gate and
//   detector terms, du, LN and GELU backward -> da)
//   ColumnPartial/ColumnFinish (two-stage column sums: dw_g, dw_d, dγ, dβ,
//   db_c)  ScalarGradKernel (1 block: db_g, da, db_d)
//   CandSortKeys + CUB stable radix sort + CandRunSum (dE; or
//   CandEmbGradAtomic when not deterministic)
//   [GEMMs dW_c += da^T h, dh += da W_c].
// The per-slot scalar maths (gate and detector grads) runs on thread 0 of
// the slot's block in double, line for line as heads.cc.
#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <climits>
#include <cmath>
#include <string>
#include <type_traits>

#include "model/cuda/cuda_heads.h"
#include "model/cuda/cuda_heads_internal.cuh"
#include "model/cuda/kernels.h"
#include "model/cuda/warp_reduce.cuh"

namespace dgca {
namespace cuda {
namespace {

// ---------------------------------------------------------------- backward
// dz_t = st·w_A·(softmax(z_t) − onehot(y_t)); in place when dz == z (each
// element is read and then written by the same thread).
template <typename T>
__global__ void __launch_bounds__(kVocabThreads) VocabBackwardKernel(
    T* dz, const T* z, const int32_t* y, const float* wA, const float* zmax, const float* zsum,
    double st, int V) {
  const int t = blockIdx.x;
  const double coef = st * double(wA[t]);
  const float f = static_cast<float>(coef / double(zsum[t]));  // coef·p_j = f·exp(z_j − max)
  const float cf = static_cast<float>(coef);
  const float m = zmax[t];
  const int yt = y[t];
  const T* zt = z + int64_t(t) * V;
  T* dzt = dz + int64_t(t) * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float v = f * expf(ToF(zt[j]) - m);
    if (j == yt) v -= cf;
    dzt[j] = FromF<T>(v);
  }
}

template <typename T>
struct BwdArgs {
  const T* h;
  const T* E;
  T* dh;
  int H, K, V;
  double st;        // scale / T
  double cand_num;  // scale·λ_cand (divided by N_c read from `losses`)
  double lam_det;
  bool det, cand_on, gated;
  const DeviceHeadLosses* losses;
  const float* wd;
  const float* wg;
  const float* ga;
  const float* gam;
  const int32_t* cand;
  const int32_t* y;
  const int32_t* label;
  const float* e;
  const float* gl;
  const float* wA;
  const float* wB;
  const float* logq;
  const float* logQ;
  const float* act;
  const float* nrm;
  const float* rstd;
  float* dl;
  float* de;
  float* ds;
  float* du;
  float* da;
  T* da_t;  // 16-bit copy of da for the GEMMs (null for float)
};

// Dynamic shared memory: float s_ds[K], int s_c[K].
template <typename T>
__global__ void __launch_bounds__(kThreads) SlotBackwardKernel(BwdArgs<T> a) {
  extern __shared__ float s_ds[];
  int* s_c = reinterpret_cast<int*>(s_ds + a.K);
  __shared__ float sh[32];
  __shared__ float s_dl, s_de;
  const int t = blockIdx.x, tid = threadIdx.x, nth = blockDim.x;
  const int H = a.H, K = a.K;
  if (tid == 0) {
    double dl = 0.0;
    if (a.gated) {
      const double g = Sigmoid(a.gl[t]);
      dl = a.st * (g * a.wA[t] - (1.0 - g) * a.wB[t]);
    }
    s_dl = static_cast<float>(dl);
    a.dl[t] = s_dl;
    s_de = 0.0f;
    if (a.det) {
      double de = a.st * a.lam_det * (Sigmoid(a.e[t]) - a.label[t]);
      if (a.gated) de += double(a.ga[0]) * dl;
      s_de = static_cast<float>(de);
      a.de[t] = s_de;
    }
    if (a.cand_on) {
      const int64_t nc = a.losses->candidate_slots;
      const double cand_w = nc > 0 ? a.cand_num / double(nc) : 0.0;
      const double logQ = a.logQ[t];
      const double coef = logQ != -INFINITY ? a.st * a.wB[t] + cand_w : 0.0;
      for (int k = 0; k < K; ++k) {
        const int c = a.cand[int64_t(t) * K + k];  // already clamped to -1 by Forward
        s_c[k] = c;
        float d = 0.0f;
        if (c >= 0 && coef != 0.0) {
          const double lq = a.logq[int64_t(t) * K + k];
          const double q = exp(lq);
          const double m = c == a.y[t] ? exp(lq - logQ) : 0.0;
          d = static_cast<float>(coef * (q - m));
        }
        s_ds[k] = d;
        a.ds[int64_t(t) * K + k] = d;
      }
    }
  }
  __syncthreads();
  T* dht = a.dh + int64_t(t) * H;
  if (a.gated || a.det) {
    const float dl = s_dl, de = s_de;
    for (int j = tid; j < H; j += nth) {
      float add = 0.0f;
      if (a.gated) add += dl * a.wg[j];
      if (a.det) add += de * a.wd[j];
      dht[j] = FromF<T>(ToF(dht[j]) + add);
    }
  }
  if (!a.cand_on) return;
  // du = Σ_k ds_k E[c_k] (k in order, as the CPU); LayerNorm and GELU backward.
  float* du = a.du + int64_t(t) * H;
  float* da = a.da + int64_t(t) * H;
  const float* n = a.nrm + int64_t(t) * H;
  const float* ac = a.act + int64_t(t) * H;
  float pdn = 0.0f, pdnn = 0.0f;
  for (int j = tid; j < H; j += nth) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int c = s_c[k];
      if (c < 0 || s_ds[k] == 0.0f) continue;
      s += s_ds[k] * ToF(a.E[int64_t(c) * H + j]);
    }
    du[j] = s;
    const float dn = s * a.gam[j];
    pdn += dn;
    pdnn += dn * n[j];
  }
  const float mdn = BlockReduce<false>(pdn, sh) / H;
  const float mdnn = BlockReduce<false>(pdnn, sh) / H;
  const float rs = a.rstd[t];
  for (int j = tid; j < H; j += nth) {
    const float dn = du[j] * a.gam[j];
    const float dg = rs * (dn - mdn - n[j] * mdnn);
    const float d = dg * GeluGrad(ac[j]);
    da[j] = d;
    if (a.da_t != nullptr) a.da_t[int64_t(t) * H + j] = FromF<T>(d);
  }
}


template <typename T>
__global__ void ColumnPartialKernel(float* part, const T* h, const float* dl, const float* de,
                                    const float* du, const float* nrm, const float* da, int nslots,
                                    int H, bool det, bool cand_on, bool gated) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int c = blockIdx.y;
  if (j >= H) return;
  const int t0 = c * kChunk, t1 = min(nslots, t0 + kChunk);
  float gw = 0.0f, dw = 0.0f, gg = 0.0f, bb = 0.0f, bc = 0.0f;
  for (int t = t0; t < t1; ++t) {
    const int64_t o = int64_t(t) * H + j;
    if (gated || det) {
      const float hv = ToF(h[o]);
      if (gated) gw += dl[t] * hv;
      if (det) dw += de[t] * hv;
    }
    if (cand_on) {
      gg += du[o] * nrm[o];
      bb += du[o];
      bc += da[o];
    }
  }
  float* p = part + int64_t(c) * kColSums * H + j;
  p[0 * H] = gw;
  p[1 * H] = dw;
  p[2 * H] = gg;
  p[3 * H] = bb;
  p[4 * H] = bc;
}

__global__ void ColumnFinishKernel(const float* part, int nchunks, int H, float* dwg, float* dwd,
                                   float* dgam, float* dbet, float* dbc) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= H) return;
  float* dst[kColSums] = {dwg, dwd, dgam, dbet, dbc};
  for (int q = 0; q < kColSums; ++q) {
    if (dst[q] == nullptr) continue;
    float s = 0.0f;
    for (int c = 0; c < nchunks; ++c) s += part[(int64_t(c) * kColSums + q) * H + j];
    dst[q][j] += s;
  }
}

// One block: db_g += Σ dl, da_scale += Σ dl·e, db_d += Σ de (double, fixed order).
__global__ void ScalarGradKernel(const float* dl, const float* de, const float* e, float* dbg,
                                 float* dga, float* dbd, int nslots, bool det, bool gated) {
  __shared__ double sh[32];
  double sg = 0.0, sa = 0.0, sd = 0.0;
  for (int t = threadIdx.x; t < nslots; t += blockDim.x) {
    if (gated) {
      sg += dl[t];
      if (det) sa += double(dl[t]) * e[t];
    }
    if (det) sd += de[t];
  }
  sg = BlockSumD(sg, sh);
  sa = BlockSumD(sa, sh);
  sd = BlockSumD(sd, sh);
  if (threadIdx.x == 0) {
    if (gated) {
      dbg[0] += static_cast<float>(sg);
      if (det) dga[0] += static_cast<float>(sa);
    }
    if (det) dbd[0] += static_cast<float>(sd);
  }
}

// dE[c_tk] += ds_tk·u_t, deterministic: the (t, k) entries are sorted by
// id with a STABLE radix sort (so each id's entries keep their (t, k)
// order, the CPU's order), then the block at the start of each id's run
// sums the run in order, column per thread, and adds once into dE.
// Entries that add nothing (padding, ds = 0) get key INT_MAX and sort last.
__global__ void CandSortKeysKernel(int32_t* keys, int32_t* vals, const int32_t* cand,
                                   const float* ds, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int c = cand[i];
    keys[i] = (c >= 0 && ds[i] != 0.0f) ? c : INT_MAX;
    vals[i] = i;
  }
}
__global__ void CandRunSumKernel(float* dE, const int32_t* keys, const int32_t* vals,
                                 const float* ds, const float* u, int n, int K, int H) {
  const int i = blockIdx.x;
  const int key = keys[i];
  if (key == INT_MAX || (i > 0 && keys[i - 1] == key)) return;  // not the start of a run
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.0f;
    for (int p = i; p < n && keys[p] == key; ++p) {
      const int tk = vals[p];
      acc += ds[tk] * u[int64_t(tk / K) * H + j];
    }
    dE[int64_t(key) * H + j] += acc;
  }
}
// Fast: block per (t, k), atomicAdd (order-dependent rounding).
__global__ void CandEmbGradAtomicKernel(float* dE, const int32_t* cand, const float* ds,
                                        const float* u, int K, int H) {
  const int tk = blockIdx.x;
  const int c = cand[tk];
  const float d = ds[tk];
  if (c < 0 || d == 0.0f) return;
  const float* ut = u + int64_t(tk / K) * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) atomicAdd(&dE[int64_t(c) * H + j], d * ut[j]);
}

}  // namespace

template <typename T>
Status CudaHeads<T>::Backward(float scale, T* dh, T* dz, float* dE) {
  if (!bound_ || T_ == 0) return OkStatus();
  const int Tn = T_, V = V_, H = H_, K = K_;
  if (dz == nullptr || ((detector_ || candidate_) && dh == nullptr))
    return InvalidArgumentError("CudaHeads::Backward: dz and dh are required");
  if (candidate_ && dE == nullptr)
    return InvalidArgumentError("CudaHeads::Backward: dE is required when the candidate head is on");
  cudaStream_t stream = ctx_->stream();
  const double st = static_cast<double>(scale) / Tn;

  VocabBackwardKernel<T><<<Tn, kVocabThreads, 0, stream>>>(dz, z_, y_.get(), wA_.get(),
                                                           zmax_.get(), zsum_.get(), st, V);
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: VocabBackwardKernel"));
  if (!detector_ && !candidate_) return OkStatus();

  BwdArgs<T> a{};
  a.h = h_;
  a.E = E_;
  a.dh = dh;
  a.H = H;
  a.K = K;
  a.V = V;
  a.st = st;
  a.cand_num = static_cast<double>(scale) * lambda_cand_;
  a.lam_det = lambda_det_;
  a.det = detector_;
  a.cand_on = candidate_;
  a.gated = gated_;
  a.losses = losses_.get();
  if (detector_) a.wd = params_->master(p_.det_w);
  if (gated_) {
    a.wg = params_->master(p_.g_w);
    a.ga = detector_ ? params_->master(p_.g_a) : nullptr;
  }
  if (candidate_) a.gam = params_->master(p_.ln_w);
  a.cand = cand_.get();
  a.y = y_.get();
  a.label = label_.get();
  a.e = e_.get();
  a.gl = gl_.get();
  a.wA = wA_.get();
  a.wB = wB_.get();
  a.logq = logq_.get();
  a.logQ = logQ_.get();
  a.act = act_.get();
  a.nrm = nrm_.get();
  a.rstd = rstd_.get();
  a.dl = dl_.get();
  a.de = de_.get();
  a.ds = ds_.get();
  a.du = du_.get();
  a.da = da_.get();
  a.da_t = !std::is_same_v<T, float> ? da_t_.get() : nullptr;
  const size_t shmem = static_cast<size_t>(K) * (sizeof(float) + sizeof(int));
  SlotBackwardKernel<T><<<Tn, kThreads, shmem, stream>>>(a);
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: SlotBackwardKernel"));

  const int nchunks = (Tn + kChunk - 1) / kChunk;
  const int col_blocks = (H + kColThreads - 1) / kColThreads;
  ColumnPartialKernel<T><<<dim3(col_blocks, nchunks), kColThreads, 0, stream>>>(
      col_part_.get(), h_, dl_.get(), de_.get(), du_.get(), nrm_.get(), da_.get(), Tn, H,
      detector_, candidate_, gated_);
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: ColumnPartialKernel"));
  ColumnFinishKernel<<<col_blocks, kColThreads, 0, stream>>>(
      col_part_.get(), nchunks, H, gated_ ? params_->grad(p_.g_w) : nullptr,
      detector_ ? params_->grad(p_.det_w) : nullptr, candidate_ ? params_->grad(p_.ln_w) : nullptr,
      candidate_ ? params_->grad(p_.ln_b) : nullptr, candidate_ ? params_->grad(p_.cd_b) : nullptr);
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: ColumnFinishKernel"));
  if (gated_ || detector_) {
    ScalarGradKernel<<<1, kThreads, 0, stream>>>(
        dl_.get(), de_.get(), e_.get(), gated_ ? params_->grad(p_.g_b) : nullptr,
        (gated_ && detector_) ? params_->grad(p_.g_a) : nullptr,
        detector_ ? params_->grad(p_.det_b) : nullptr, Tn, detector_, gated_);
    DGCA_RETURN_IF_ERROR(Launched("CudaHeads: ScalarGradKernel"));
  }
  if (!candidate_) return OkStatus();

  const int n = Tn * K;
  if (deterministic_) {
    CandSortKeysKernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        sort_keys_.get(), sort_vals_.get(), cand_.get(), ds_.get(), n);
    DGCA_RETURN_IF_ERROR(Launched("CudaHeads: CandSortKeysKernel"));
    size_t bytes = 0;
    DGCA_RETURN_IF_ERROR(CudaStatus(
        cub::DeviceRadixSort::SortPairs(nullptr, bytes, sort_keys_.get(), sort_keys_out_.get(),
                                        sort_vals_.get(), sort_vals_out_.get(), n, 0, 32, stream),
        "CudaHeads: radix sort size"));
    if (bytes > sort_temp_.size())
      return InternalError("CudaHeads: radix sort needs " + std::to_string(bytes) +
                           " bytes of scratch, Bind() allocated " + std::to_string(sort_temp_.size()));
    bytes = sort_temp_.size();
    DGCA_RETURN_IF_ERROR(CudaStatus(
        cub::DeviceRadixSort::SortPairs(sort_temp_.get(), bytes, sort_keys_.get(),
                                        sort_keys_out_.get(), sort_vals_.get(),
                                        sort_vals_out_.get(), n, 0, 32, stream),
        "CudaHeads: radix sort"));
    CandRunSumKernel<<<n, kColThreads, 0, stream>>>(dE, sort_keys_out_.get(), sort_vals_out_.get(),
                                                   ds_.get(), u_.get(), n, K, H);
  } else {
    CandEmbGradAtomicKernel<<<n, kColThreads, 0, stream>>>(dE, cand_.get(), ds_.get(), u_.get(),
                                                          K, H);
  }
  DGCA_RETURN_IF_ERROR(Launched("CudaHeads: CandEmbGrad"));

  // Dense layer: dW_c += da^T h; dh += da W_c.
  const void* da_in = !std::is_same_v<T, float> ? static_cast<const void*>(da_t_.get())
                                                : static_cast<const void*>(da_.get());
  GemmArgs gw;
  gw.trans_a = true;
  gw.trans_b = false;
  gw.M = H;
  gw.N = H;
  gw.K = Tn;
  gw.A = da_in;
  gw.lda = H;
  gw.B = h_;
  gw.ldb = H;
  gw.C = params_->grad(p_.cd_w);  // added into (grads accumulate)
  gw.ldc = H;
  gw.beta = 1.0f;
  gw.in_type = kDType<T>;
  gw.out_type = DType::kF32;
  DGCA_RETURN_IF_ERROR(gemm_->Run(gw));
  GemmArgs gh;
  gh.trans_a = false;
  gh.trans_b = false;
  gh.M = Tn;
  gh.N = H;
  gh.K = H;
  gh.A = da_in;
  gh.lda = H;
  gh.B = params_->weight<T>(p_.cd_w);
  gh.ldb = H;
  gh.C = dh;
  gh.ldc = H;
  gh.beta = 1.0f;
  gh.in_type = kDType<T>;
  gh.out_type = kDType<T>;
  return gemm_->Run(gh);
}
template Status CudaHeads<float>::Backward(float, float*, float*, float*);
template Status CudaHeads<bf16>::Backward(float, bf16*, bf16*, float*);
template Status CudaHeads<__half>::Backward(float, __half*, __half*, float*);

}  // namespace cuda
}  // namespace dgca
