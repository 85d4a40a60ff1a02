#include "model/cuda_check/op_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "model/core/json.h"
#include "model/cpu/ops.h"
#include "model/cuda/attention.h"
#include "model/cuda/flash_attention.h"
#include "model/cuda/kernels.h"

namespace dgca {
namespace cuda {

double MaxRelErr(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(want[i])));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

StatusOr<PeerErrors> ParsePeerErrors(const std::string& json_text, const std::string& source) {
  DGCA_ASSIGN_OR_RETURN(JsonValue doc, ParseJson(json_text, source));
  const JsonValue* errors = doc.Find("errors");
  if (errors == nullptr || !errors->is_object()) {
    return InvalidArgumentError(source + ": expected an object with \"errors\": {dtype: {op: error}} "
                                "(bench/gpu/torch_reference.py --mode op-errors)");
  }
  PeerErrors out;
  for (const auto& [dtype, ops] : errors->object) {
    if (!ops.is_object()) {
      return InvalidArgumentError(source + ":" + ops.Where() + ": errors." + dtype + " must be an object of op: error");
    }
    auto& list = out.by_dtype[dtype];
    for (const auto& [op, v] : ops.object) {
      if (v.type == JsonValue::Type::kNull) continue;  // no kernel for this dtype there
      if (!v.is_number() || !(v.number >= 0)) {
        return InvalidArgumentError(source + ":" + v.Where() + ": errors." + dtype + "." + op +
                                    " must be a number >= 0 or null");
      }
      list.emplace_back(op, v.number);
    }
  }
  return out;
}

bool ApplyPeerTolerance(const PeerErrors& peer, double factor, CheckRow* row) {
  auto it = peer.by_dtype.find(row->dtype);
  if (it == peer.by_dtype.end()) return false;
  const std::pair<std::string, double>* best = nullptr;
  for (const auto& e : it->second)
    if (row->op.compare(0, e.first.size(), e.first) == 0 && (best == nullptr || e.first.size() > best->first.size()))
      best = &e;
  if (best == nullptr) return false;
  row->tolerance = factor * best->second;
  row->peer_tolerance = true;
  return true;
}

namespace {

using Rng = std::mt19937_64;
using Bytes = DeviceArray<uint8_t>;
using Rows = std::vector<CheckRow>;


size_t Size(DType t) { return t == DType::kF32 ? 4 : 2; }

std::vector<float> Round(DType t, std::vector<float> v) {
  for (float& x : v) x = RoundTo(t, x);
  return v;
}
std::vector<float> Rand(size_t n, Rng* rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}
std::vector<int32_t> RandIds(size_t n, Rng* rng, int lo, int hi) {
  std::uniform_int_distribution<int> u(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = u(*rng);
  return v;
}

StatusOr<Bytes> Up(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> raw(v.size() * Size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&raw[4 * i], &v[i], 4);
    } else if (t == DType::kBF16) {
      bf16 b = __float2bfloat16(v[i]);
      std::memcpy(&raw[2 * i], &b, 2);
    } else {
      __half h = __float2half(v[i]);
      std::memcpy(&raw[2 * i], &h, 2);
    }
  }
  Bytes d;
  DGCA_RETURN_IF_ERROR(d.Upload(raw));
  return d;
}
StatusOr<DeviceArray<int32_t>> UpInts(const std::vector<int32_t>& v) {
  DeviceArray<int32_t> d;
  DGCA_RETURN_IF_ERROR(d.Upload(v));
  return d;
}
StatusOr<Bytes> Poisoned(DType t, size_t n) {
  Bytes d;
  DGCA_RETURN_IF_ERROR(d.Allocate(n * Size(t)));
  DGCA_RETURN_IF_ERROR(d.Poison());
  return d;
}
StatusOr<std::vector<float>> Down(DType t, const Bytes& d) {
  std::vector<uint8_t> raw;
  DGCA_RETURN_IF_ERROR(d.Download(&raw));
  std::vector<float> v(raw.size() / Size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&v[i], &raw[4 * i], 4);
    } else if (t == DType::kBF16) {
      bf16 b;
      std::memcpy(&b, &raw[2 * i], 2);
      v[i] = __bfloat162float(b);
    } else {
      __half h;
      std::memcpy(&h, &raw[2 * i], 2);
      v[i] = __half2float(h);
    }
  }
  return v;
}
template <typename T> T* P(const Bytes& b) { return reinterpret_cast<T*>(b.get()); }
float* F(const Bytes& b) { return reinterpret_cast<float*>(b.get()); }

// Uploads and poisons go through the legacy default stream; the context's
// stream is non-blocking, so wait for them before launching.
Status SyncDevice() { return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void Add(Rows* rows, const std::string& op, DType t, const std::vector<float>& got,
         const std::vector<float>& want, double tol) {
  rows->push_back(CheckRow{op, DTypeName(t), MaxRelErr(got, want), tol});
}

// ---------------------------------------------------------------- GEMM
struct GemmCase {
  const char* name;
  bool ta, tb;
  int M, N, K;
  bool bias;
  DType in, out;
  int batch;
  bool residual = false;  // beta = 1 on a separate C_in (C and D distinct)
};

Status CheckGemm(const GemmCase& c, const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t sa = a_rows * a_cols, sb = b_rows * b_cols, sc = int64_t(c.M) * c.N;
  std::vector<float> A = Round(c.in, Rand(sa * c.batch, rng));
  std::vector<float> B = Round(c.in, Rand(sb * c.batch, rng));
  std::vector<float> bias = Round(c.out, Rand(c.N, rng));
  DGCA_ASSIGN_OR_RETURN(Bytes dA, Up(c.in, A));
  DGCA_ASSIGN_OR_RETURN(Bytes dB, Up(c.in, B));
  DGCA_ASSIGN_OR_RETURN(Bytes dbias, Up(c.out, bias));
  DGCA_ASSIGN_OR_RETURN(Bytes dC, Poisoned(c.out, sc * c.batch));
  std::vector<float> cin = Round(c.out, Rand(sc * c.batch, rng));
  DGCA_ASSIGN_OR_RETURN(Bytes dCin, Up(c.out, cin));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  GemmArgs g;
  g.trans_a = c.ta; g.trans_b = c.tb;
  g.M = c.M; g.N = c.N; g.K = c.K;
  g.A = dA.get(); g.lda = a_cols; g.B = dB.get(); g.ldb = b_cols; g.C = dC.get(); g.ldc = c.N;
  g.in_type = c.in; g.out_type = c.out;
  g.bias = c.bias ? dbias.get() : nullptr;
  g.batch = c.batch; g.stride_a = sa; g.stride_b = sb; g.stride_c = sc;
  if (c.residual) {
    g.beta = 1.0f;
    g.C_in = dCin.get();
  }
  DGCA_RETURN_IF_ERROR(gemm->Run(g));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(std::vector<float> got, Down(c.out, dC));
  std::vector<float> want(sc * c.batch);
  cpu::Context cc;
  for (int b = 0; b < c.batch; ++b) {
    cpu::Gemm(cc, c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.data() + b * sa, int(a_cols), B.data() + b * sb,
              int(b_cols), 0.0f, want.data() + b * sc, c.N);
    if (c.bias) {
      for (int i = 0; i < c.M; ++i)
        for (int j = 0; j < c.N; ++j) want[b * sc + int64_t(i) * c.N + j] += bias[j];
    }
    if (c.residual)
      for (int64_t i = 0; i < sc; ++i) want[b * sc + i] += cin[b * sc + i];
  }
  std::string name = std::string(c.name) + " " + std::to_string(c.M) + "x" + std::to_string(c.N) + "x" +
                     std::to_string(c.K) + (c.batch > 1 ? " x" + std::to_string(c.batch) : "") + " ->" +
                     DTypeName(c.out);
  // Tolerance of the coarser of input and output precision.
  Add(rows, name, c.in, got, want, std::max(DefaultTolerance(c.in), DefaultTolerance(c.out)));
  return OkStatus();
}

// ---------------------------------------------------------------- LayerNorm
template <typename T>
Status CheckLayerNorm(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  // 37 rows: one chunk of the column reductions; 300: three (kernels.h).
  for (const int n : {37, 300}) {
  const int c = 200;
  const std::string sz = n > kColumnChunkRows ? " (" + std::to_string(n) + " rows)" : "";
  const float eps = 1e-12f;
  std::vector<float> x = Round(t, Rand(size_t(n) * c, rng, -2.0f, 3.0f));
  std::vector<float> gamma = Round(t, Rand(c, rng, 0.5f, 1.5f));
  std::vector<float> beta = Round(t, Rand(c, rng, -0.5f, 0.5f));
  std::vector<float> dout = Round(t, Rand(size_t(n) * c, rng));
  std::vector<float> dgamma0 = Rand(c, rng), dbeta0 = Rand(c, rng);
  cpu::Context cc;
  std::vector<float> out(size_t(n) * c), mean(n), rstd(n), dinp(size_t(n) * c);
  std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
  cpu::LayerNormForward(cc, out.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), n, c, eps);
  cpu::LayerNormBackward(cc, dinp.data(), false, dgamma.data(), dbeta.data(), dout.data(), x.data(), gamma.data(),
                         mean.data(), rstd.data(), n, c);
  DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(t, x));
  DGCA_ASSIGN_OR_RETURN(Bytes dg, Up(t, gamma));
  DGCA_ASSIGN_OR_RETURN(Bytes db, Up(t, beta));
  DGCA_ASSIGN_OR_RETURN(Bytes ddout, Up(t, dout));
  DGCA_ASSIGN_OR_RETURN(Bytes dmean_ref, Up(DType::kF32, mean));
  DGCA_ASSIGN_OR_RETURN(Bytes drstd_ref, Up(DType::kF32, rstd));
  DGCA_ASSIGN_OR_RETURN(Bytes ddg, Up(DType::kF32, dgamma0));
  DGCA_ASSIGN_OR_RETURN(Bytes ddb, Up(DType::kF32, dbeta0));
  DGCA_ASSIGN_OR_RETURN(Bytes dout_fwd, Poisoned(t, size_t(n) * c));
  DGCA_ASSIGN_OR_RETURN(Bytes dmean, Poisoned(DType::kF32, n));
  DGCA_ASSIGN_OR_RETURN(Bytes drstd, Poisoned(DType::kF32, n));
  DGCA_ASSIGN_OR_RETURN(Bytes ddinp, Poisoned(t, size_t(n) * c));
  DGCA_ASSIGN_OR_RETURN(Bytes scratch, Poisoned(DType::kF32, 2 * ColumnSumScratchElems(n, c)));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(LayerNormForward<T>(ctx.stream(), P<T>(dout_fwd), F(dmean), F(drstd), P<T>(dx), P<T>(dg),
                                           P<T>(db), n, c, eps));
  // The backward reads the reference statistics so its check is independent
  // of the forward's.
  DGCA_RETURN_IF_ERROR(LayerNormBackward<T>(ctx.stream(), P<T>(ddinp), false, F(ddg), F(ddb), P<T>(ddout), P<T>(dx),
                                            P<T>(dg), F(dmean_ref), F(drstd_ref), n, c, F(scratch)));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  const double tol = DefaultTolerance(t);
  DGCA_ASSIGN_OR_RETURN(auto g_out, Down(t, dout_fwd));
  DGCA_ASSIGN_OR_RETURN(auto g_mean, Down(DType::kF32, dmean));
  DGCA_ASSIGN_OR_RETURN(auto g_rstd, Down(DType::kF32, drstd));
  DGCA_ASSIGN_OR_RETURN(auto g_dinp, Down(t, ddinp));
  DGCA_ASSIGN_OR_RETURN(auto g_dg, Down(DType::kF32, ddg));
  DGCA_ASSIGN_OR_RETURN(auto g_db, Down(DType::kF32, ddb));
  Add(rows, "layernorm_fwd.out" + sz, t, g_out, out, tol);
  Add(rows, "layernorm_fwd.mean" + sz, t, g_mean, mean, kF32Tol);
  Add(rows, "layernorm_fwd.rstd" + sz, t, g_rstd, rstd, kF32Tol);
  Add(rows, "layernorm_bwd.dinp" + sz, t, g_dinp, dinp, tol);
  Add(rows, "layernorm_bwd.dgamma" + sz, t, g_dg, dgamma, kF32Tol);
  Add(rows, "layernorm_bwd.dbeta" + sz, t, g_db, dbeta, kF32Tol);
  }
  return OkStatus();
}

// ---------------------------------------------------------------- GELU
template <typename T>
Status CheckGelu(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const int64_t n = 10007;
  std::vector<float> x = Round(t, Rand(n, rng, -4.0f, 4.0f)), dout = Round(t, Rand(n, rng));
  cpu::Context cc;
  std::vector<float> out(n), dinp(n);
  cpu::GeluForward(cc, out.data(), x.data(), n);
  cpu::GeluBackward(cc, dinp.data(), x.data(), dout.data(), n);
  DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(t, x));
  DGCA_ASSIGN_OR_RETURN(Bytes dd, Up(t, dout));
  DGCA_ASSIGN_OR_RETURN(Bytes dout_fwd, Poisoned(t, n));
  DGCA_ASSIGN_OR_RETURN(Bytes ddinp, Poisoned(t, n));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(GeluForward<T>(ctx.stream(), P<T>(dout_fwd), P<T>(dx), n));
  DGCA_RETURN_IF_ERROR(GeluBackward<T>(ctx.stream(), P<T>(ddinp), P<T>(dx), P<T>(dd), n));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_out, Down(t, dout_fwd));
  DGCA_ASSIGN_OR_RETURN(auto g_dinp, Down(t, ddinp));
  Add(rows, "gelu_fwd", t, g_out, out, DefaultTolerance(t));
  Add(rows, "gelu_bwd", t, g_dinp, dinp, DefaultTolerance(t));
  return OkStatus();
}

// ---------------------------------------------------------------- softmax
template <typename T>
Status CheckSoftmax(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  for (int cols : {300, 1000}) {
    const int r = 33;
    std::vector<float> x = Round(t, Rand(size_t(r) * cols, rng, -5.0f, 5.0f));
    std::vector<float> want(x.size());
    cpu::Context cc;
    cpu::SoftmaxRows(cc, want.data(), x.data(), r, cols);
    DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(t, x));
    DGCA_ASSIGN_OR_RETURN(Bytes dy, Poisoned(t, x.size()));
    DGCA_RETURN_IF_ERROR(SyncDevice());
    DGCA_RETURN_IF_ERROR(SoftmaxRows<T>(ctx.stream(), P<T>(dy), P<T>(dx), r, cols));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    DGCA_ASSIGN_OR_RETURN(auto got, Down(t, dy));
    Add(rows, "softmax_rows cols=" + std::to_string(cols), t, got, want, DefaultTolerance(t));
  }
  return OkStatus();
}

// ---------------------------------------------------------------- attention
// An attention case and its CPU forward: random qkv (rounded to t); the
// mask pads batch 1 from a random length on and, when B > 2, leaves batch 2
// without any real key (its rows must come out zero).
struct AttentionReference {
  std::vector<float> qkv, out, probs;
  std::vector<int32_t> mask;
};
AttentionReference MakeAttentionReference(DType t, int B, int L, int H, int nh, Rng* rng,
                                          const AttentionDropout& drop = {}) {
  AttentionReference r;
  r.qkv = Round(t, Rand(size_t(B) * L * 3 * H, rng, -1.5f, 1.5f));
  r.mask.assign(size_t(B) * L, 1);
  std::uniform_int_distribution<int> len(L / 2, L - 1);
  const int real = len(*rng);
  for (int j = real; j < L; ++j) r.mask[L + j] = 0;
  if (B > 2) std::fill(r.mask.begin() + 2 * L, r.mask.begin() + 3 * L, 0);
  r.out.resize(size_t(B) * L * H);
  r.probs.resize(size_t(B) * nh * L * L);
  cpu::Context cc;
  cpu::AttentionForward(cc, r.out.data(), r.probs.data(), r.qkv.data(), r.mask.data(), B, L, H, nh, drop);
  return r;
}

// Dropout on the probabilities for a check: p, fresh keys per row, layer 3
// (any layer: the site key must be what the CPU uses). The host and device
// copies of the keys.
struct CheckDrop {
  std::vector<uint64_t> keys;
  DeviceArray<uint64_t> dkeys;
  float p = 0.0f;
  AttentionDropout host() const { return p > 0 ? AttentionDropout{keys.data(), 3, p} : AttentionDropout{}; }
  AttentionDropout device() const { return p > 0 ? AttentionDropout{dkeys.get(), 3, p} : AttentionDropout{}; }
  std::string tag() const { return p > 0 ? " dropout " + std::to_string(p).substr(0, 3) : ""; }
};
StatusOr<CheckDrop> MakeCheckDrop(int B, float p, Rng* rng) {
  CheckDrop d;
  d.p = p;
  for (int b = 0; b < B; ++b) d.keys.push_back((*rng)());
  DGCA_RETURN_IF_ERROR(d.dkeys.Upload(d.keys));
  return d;
}

template <typename T>
Status CheckAttentionWith(float drop_p, const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const int B = 2, L = 40, H = 64, nh = 4;
  DGCA_ASSIGN_OR_RETURN(const CheckDrop drop, MakeCheckDrop(B, drop_p, rng));
  const int64_t extra = drop_p > 0 ? AttentionDropoutScratchElems(B, L, nh) : 0;
  const AttentionReference ref = MakeAttentionReference(t, B, L, H, nh, rng, drop.host());
  cpu::Context cc;
  DGCA_ASSIGN_OR_RETURN(Bytes dqkv, Up(t, ref.qkv));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> dmask, UpInts(ref.mask));
  DGCA_ASSIGN_OR_RETURN(Bytes dout, Poisoned(t, ref.out.size()));
  DGCA_ASSIGN_OR_RETURN(Bytes dprobs, Poisoned(t, ref.probs.size()));
  DGCA_ASSIGN_OR_RETURN(Bytes scratch, Poisoned(t, AttentionScratchElems(B, L, H) + extra));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(AttentionForward<T>(ctx, gemm, P<T>(dout), P<T>(dprobs), P<T>(dqkv), dmask.get(), B, L, H,
                                           nh, P<T>(scratch), drop.device()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_out, Down(t, dout));
  DGCA_ASSIGN_OR_RETURN(auto g_probs, Down(t, dprobs));
  const double tol = t == DType::kF32 ? kF32Tol : t == DType::kBF16 ? kAttnBf16Tol : kAttnF16Tol;
  Add(rows, "attention_fwd.out" + drop.tag(), t, g_out, ref.out, tol);
  Add(rows, "attention_fwd.probs" + drop.tag(), t, g_probs, ref.probs, tol);

  // Backward from the reference probabilities (rounded to T, as the GPU
  // reads them), so it is checked independently of the forward.
  std::vector<float> probs_t = Round(t, ref.probs);
  std::vector<float> h_dout = Round(t, Rand(ref.out.size(), rng));
  std::vector<float> h_dqkv(ref.qkv.size());
  cpu::AttentionBackward(cc, h_dqkv.data(), h_dout.data(), ref.qkv.data(), probs_t.data(), B, L, H, nh,
                         drop.host());
  DGCA_ASSIGN_OR_RETURN(Bytes dprobs_ref, Up(t, probs_t));
  DGCA_ASSIGN_OR_RETURN(Bytes ddout, Up(t, h_dout));
  DGCA_ASSIGN_OR_RETURN(Bytes ddqkv, Poisoned(t, ref.qkv.size()));
  DGCA_ASSIGN_OR_RETURN(Bytes bscratch, Poisoned(t, AttentionBackwardScratchElems(B, L, H, nh) + extra));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(AttentionBackward<T>(ctx, gemm, P<T>(ddqkv), P<T>(ddout), P<T>(dqkv), P<T>(dprobs_ref), B, L,
                                            H, nh, P<T>(bscratch), drop.device()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_dqkv, Down(t, ddqkv));
  Add(rows, "attention_bwd.dqkv" + drop.tag(), t, g_dqkv, h_dqkv, tol);
  return OkStatus();
}
template <typename T>
Status CheckAttention(const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  return CheckAttentionWith<T>(0.0f, ctx, gemm, rng, rows);
}
template <typename T>
Status CheckAttentionDropout(const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  return CheckAttentionWith<T>(0.2f, ctx, gemm, rng, rows);
}

// The fused kernels (flash_attention.h) against the same CPU reference, on
// shapes that cover their edges: head sizes 16, 32 and 64, partial query and
// key tiles, several key tiles, a padded sequence and one whose keys are all
// padding (its rows must come out zero), bert-base's heads (L 128, H 768,
// 12 heads) and the longest sequence (512). The backward runs on the fused
// forward's own out and log-sum-exp (that is what it is given in training).
// With dropout (CheckFusedAttentionDropout) on fewer shapes: each head
// size, partial tiles, padding, a row without real keys and the longest
// sequence among them.
struct FusedShape {
  int B, L, H, nh;
};
template <typename T>
Status CheckFusedAttentionWith(float drop_p, std::initializer_list<FusedShape> shapes, Rng* rng, const CudaContext& ctx,
                               Rows* rows) {
  const DType t = kDType<T>;
  for (const FusedShape& s : shapes) {
    const int B = s.B, L = s.L, H = s.H, nh = s.nh;
    DGCA_ASSIGN_OR_RETURN(const CheckDrop drop, MakeCheckDrop(B, drop_p, rng));
    const std::string tag =
        " (fused, L=" + std::to_string(L) + ", d=" + std::to_string(H / nh) + ")" + drop.tag();
    if (!FusedAttentionSupported(t, L, H, nh)) return InternalError("fused attention: check shape unsupported" + tag);
    const AttentionReference ref = MakeAttentionReference(t, B, L, H, nh, rng, drop.host());
    cpu::Context cc;
    DGCA_ASSIGN_OR_RETURN(Bytes dqkv, Up(t, ref.qkv));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> dmask, UpInts(ref.mask));
    DGCA_ASSIGN_OR_RETURN(Bytes dout, Poisoned(t, ref.out.size()));
    DGCA_ASSIGN_OR_RETURN(Bytes dlse, Poisoned(DType::kF32, size_t(B) * nh * L));
    DGCA_RETURN_IF_ERROR(SyncDevice());
    DGCA_RETURN_IF_ERROR(
        FusedAttentionForward<T>(ctx.stream(), P<T>(dout), P<float>(dlse), P<T>(dqkv), dmask.get(), B, L, H, nh,
                                 drop.device()));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    DGCA_ASSIGN_OR_RETURN(auto g_out, Down(t, dout));
    const double tol = t == DType::kBF16 ? kAttnBf16Tol : kAttnF16Tol;
    Add(rows, "attention_fwd.out" + tag, t, g_out, ref.out, tol);

    std::vector<float> h_dout = Round(t, Rand(ref.out.size(), rng));
    std::vector<float> h_dqkv(ref.qkv.size());
    cpu::AttentionBackward(cc, h_dqkv.data(), h_dout.data(), ref.qkv.data(), Round(t, ref.probs).data(), B, L, H, nh,
                           drop.host());
    DGCA_ASSIGN_OR_RETURN(Bytes ddout, Up(t, h_dout));
    DGCA_ASSIGN_OR_RETURN(Bytes ddqkv, Poisoned(t, ref.qkv.size()));
    DGCA_ASSIGN_OR_RETURN(Bytes bscratch, Poisoned(DType::kF32, FusedAttentionBackwardScratchFloats(B, L, nh)));
    DGCA_RETURN_IF_ERROR(SyncDevice());
    DGCA_RETURN_IF_ERROR(FusedAttentionBackward<T>(ctx.stream(), P<T>(ddqkv), P<T>(ddout), P<T>(dqkv), P<T>(dout),
                                                   P<float>(dlse), dmask.get(), B, L, H, nh, P<float>(bscratch),
                                                   drop.device()));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    DGCA_ASSIGN_OR_RETURN(auto g_dqkv, Down(t, ddqkv));
    Add(rows, "attention_bwd.dqkv" + tag, t, g_dqkv, h_dqkv, tol);
  }
  return OkStatus();
}
template <typename T>
Status CheckFusedAttention(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  return CheckFusedAttentionWith<T>(0.0f,
                                    {FusedShape{3, 75, 128, 2}, FusedShape{2, 40, 64, 2}, FusedShape{2, 20, 32, 2},
                                     FusedShape{2, 128, 768, 12}, FusedShape{2, 512, 128, 2}},
                                    rng, ctx, rows);
}
template <typename T>
Status CheckFusedAttentionDropout(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  return CheckFusedAttentionWith<T>(
      0.2f,
      {FusedShape{3, 75, 128, 2}, FusedShape{2, 40, 64, 2}, FusedShape{2, 20, 32, 2}, FusedShape{2, 128, 768, 12},
       FusedShape{2, 512, 128, 2}},
      rng, ctx, rows);
}

// ---------------------------------------------------------------- dropout
// Hidden rows (with and without the residual) and probabilities against
// cpu::DropoutRows / the CPU attention's mask, plus the drop pattern
// itself: the inputs are never zero, so an output is zero exactly where
// the mask drops, and the two patterns must agree element for element.
template <typename T>
Status CheckDropout(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const int B = 3, L = 24, H = 40, nh = 2;
  const float p = 0.3f;
  DGCA_ASSIGN_OR_RETURN(const CheckDrop drop, MakeCheckDrop(B, p, rng));
  const size_t n = size_t(B) * L * H;
  std::vector<float> x = Round(t, Rand(n, rng, 0.5f, 1.5f));
  std::vector<float> res = Round(t, Rand(n, rng));
  std::vector<float> want(n), want_res(n);
  cpu::Context cc;
  cpu::DropoutRows(cc, want.data(), x.data(), nullptr, drop.keys.data(), 1, kDropFfnOut, p, B, L, H);
  cpu::DropoutRows(cc, want_res.data(), x.data(), res.data(), drop.keys.data(), 1, kDropFfnOut, p, B, L, H);
  DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(t, x));
  DGCA_ASSIGN_OR_RETURN(Bytes dres, Up(t, res));
  DGCA_ASSIGN_OR_RETURN(Bytes dout, Poisoned(t, n));
  DGCA_ASSIGN_OR_RETURN(Bytes dout_res, Poisoned(t, n));
  // Probabilities [B, nh, L, L] against cpu::DropoutProbs (the mask the
  // CPU attention uses).
  const size_t np = size_t(B) * nh * L * L;
  std::vector<float> probs = Round(t, Rand(np, rng, 0.5f, 1.5f));
  std::vector<float> want_p(np);
  cpu::DropoutProbs(cc, want_p.data(), probs.data(), drop.host(), B, nh, L);
  DGCA_ASSIGN_OR_RETURN(Bytes dprobs, Up(t, probs));
  DGCA_ASSIGN_OR_RETURN(Bytes dprobs_out, Poisoned(t, np));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(DropoutRows<T>(ctx.stream(), P<T>(dout), P<T>(dx), nullptr, drop.dkeys.get(), 1, kDropFfnOut,
                                      p, B, L, H));
  DGCA_RETURN_IF_ERROR(DropoutRows<T>(ctx.stream(), P<T>(dout_res), P<T>(dx), P<T>(dres), drop.dkeys.get(), 1,
                                      kDropFfnOut, p, B, L, H));
  DGCA_RETURN_IF_ERROR(DropoutProbs<T>(ctx.stream(), P<T>(dprobs_out), P<T>(dprobs), drop.device(), B, nh, L));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto got, Down(t, dout));
  DGCA_ASSIGN_OR_RETURN(auto got_res, Down(t, dout_res));
  DGCA_ASSIGN_OR_RETURN(auto got_p, Down(t, dprobs_out));
  Add(rows, "dropout_rows", t, got, want, DefaultTolerance(t));
  Add(rows, "dropout_rows + residual", t, got_res, want_res, DefaultTolerance(t));
  Add(rows, "dropout_probs", t, got_p, want_p, DefaultTolerance(t));
  auto mismatches = [](const std::vector<float>& g, const std::vector<float>& w) {
    if (g.size() != w.size()) return std::numeric_limits<double>::infinity();
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i) bad += (g[i] == 0.0f) != (w[i] == 0.0f) ? 1 : 0;
    return double(bad);
  };
  rows->push_back(CheckRow{"dropout_rows.mask (elements dropped differently)", DTypeName(t), mismatches(got, want), 0.0});
  rows->push_back(
      CheckRow{"dropout_probs.mask (elements dropped differently)", DTypeName(t), mismatches(got_p, want_p), 0.0});
  return OkStatus();
}

// ---------------------------------------------------------------- embedding
template <typename T>
Status CheckEmbedding(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const int V = 50, c = 96, n = 77;
  std::vector<float> table = Round(t, Rand(size_t(V) * c, rng));
  std::vector<float> base = Round(t, Rand(size_t(n) * c, rng));
  std::vector<float> dout = Round(t, Rand(size_t(n) * c, rng));
  std::vector<float> dtable0 = Rand(size_t(V) * c, rng);
  std::vector<int32_t> ids = RandIds(n, rng, 0, V);     // duplicates: 77 draws of 50
  std::vector<int32_t> bids = ids;
  for (int i = 0; i < n; i += 7) bids[i] = -1;        // skipped rows in the backward
  cpu::Context cc;
  std::vector<float> fwd(size_t(n) * c), add = base, dtable = dtable0;
  cpu::EmbeddingForward(cc, fwd.data(), ids.data(), table.data(), n, c);
  cpu::EmbeddingAdd(cc, add.data(), ids.data(), table.data(), n, c);
  cpu::EmbeddingBackward(cc, dtable.data(), bids.data(), dout.data(), n, c);
  DGCA_ASSIGN_OR_RETURN(Bytes dtab, Up(t, table));
  DGCA_ASSIGN_OR_RETURN(Bytes dadd, Up(t, base));
  DGCA_ASSIGN_OR_RETURN(Bytes ddout, Up(t, dout));
  DGCA_ASSIGN_OR_RETURN(Bytes ddt_det, Up(DType::kF32, dtable0));
  DGCA_ASSIGN_OR_RETURN(Bytes ddt_atomic, Up(DType::kF32, dtable0));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> dids, UpInts(ids));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> dbids, UpInts(bids));
  DGCA_ASSIGN_OR_RETURN(Bytes dfwd, Poisoned(t, fwd.size()));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(EmbeddingForward<T>(ctx.stream(), P<T>(dfwd), dids.get(), P<T>(dtab), n, c));
  DGCA_RETURN_IF_ERROR(EmbeddingAdd<T>(ctx.stream(), P<T>(dadd), dids.get(), P<T>(dtab), n, c));
  DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(ctx.stream(), F(ddt_det), dbids.get(), P<T>(ddout), n, c, true));
  DGCA_RETURN_IF_ERROR(EmbeddingBackward<T>(ctx.stream(), F(ddt_atomic), dbids.get(), P<T>(ddout), n, c, false));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_fwd, Down(t, dfwd));
  DGCA_ASSIGN_OR_RETURN(auto g_add, Down(t, dadd));
  DGCA_ASSIGN_OR_RETURN(auto g_det, Down(DType::kF32, ddt_det));
  DGCA_ASSIGN_OR_RETURN(auto g_atomic, Down(DType::kF32, ddt_atomic));
  Add(rows, "embedding_fwd", t, g_fwd, fwd, DefaultTolerance(t));
  Add(rows, "embedding_add", t, g_add, add, DefaultTolerance(t));
  // The deterministic backward sums in the CPU's order: bitwise equal.
  Add(rows, "embedding_bwd deterministic (exact)", t, g_det, dtable, 0.0);
  Add(rows, "embedding_bwd atomic", t, g_atomic, dtable, kF32Tol);
  return OkStatus();
}

// ---------------------------------------------------------------- bias
template <typename T>
Status CheckBias(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  for (const int n : {53, 517}) {  // one chunk of the column sum; five
  const int c = 130;
  const std::string sz = n > kColumnChunkRows ? " (" + std::to_string(n) + " rows)" : "";
  std::vector<float> x = Round(t, Rand(size_t(n) * c, rng)), bias = Round(t, Rand(c, rng));
  std::vector<float> dst0 = Rand(c, rng);
  std::vector<float> want = x, colsum = dst0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < c; ++j) want[size_t(i) * c + j] += bias[j];
  cpu::Context cc;
  cpu::ColumnSumAdd(cc, colsum.data(), x.data(), n, c);
  DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(t, x));
  DGCA_ASSIGN_OR_RETURN(Bytes dsrc, Up(t, x));
  DGCA_ASSIGN_OR_RETURN(Bytes db, Up(t, bias));
  DGCA_ASSIGN_OR_RETURN(Bytes ddst, Up(DType::kF32, dst0));
  DGCA_ASSIGN_OR_RETURN(Bytes scratch, Poisoned(DType::kF32, ColumnSumScratchElems(n, c)));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(BiasAdd<T>(ctx.stream(), P<T>(dx), P<T>(db), n, c));
  DGCA_RETURN_IF_ERROR(ColumnSumAdd<T>(ctx.stream(), F(ddst), P<T>(dsrc), n, c, F(scratch)));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_x, Down(t, dx));
  DGCA_ASSIGN_OR_RETURN(auto g_cs, Down(DType::kF32, ddst));
  Add(rows, "bias_add" + sz, t, g_x, want, DefaultTolerance(t));
  Add(rows, "column_sum_add" + sz, t, g_cs, colsum, kF32Tol);
  }
  return OkStatus();
}

// ---------------------------------------------------------------- cross-entropy
template <typename T>
Status CheckCrossEntropy(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const int n = 20, v = 1000;
  const float dscale = 1.0f / 16;
  std::vector<float> logits = Round(t, Rand(size_t(n) * v, rng, -6.0f, 6.0f));
  std::vector<int32_t> targets = RandIds(n, rng, 0, v);
  for (int i = 1; i < n; i += 5) targets[i] = -100;
  cpu::Context cc;
  std::vector<float> dlogits(logits.size()), row_loss(n);
  cpu::CrossEntropy(cc, dlogits.data(), logits.data(), targets.data(), n, v, dscale, nullptr);
  for (int i = 0; i < n; ++i) {
    row_loss[i] = static_cast<float>(
        cpu::CrossEntropy(cc, nullptr, logits.data() + size_t(i) * v, targets.data() + i, 1, v, 1.0f, nullptr));
  }
  DGCA_ASSIGN_OR_RETURN(Bytes dl, Up(t, logits));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> dt, UpInts(targets));
  DGCA_ASSIGN_OR_RETURN(Bytes dloss, Poisoned(DType::kF32, n));
  DGCA_ASSIGN_OR_RETURN(Bytes dgrad, Poisoned(t, logits.size()));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(CrossEntropy<T>(ctx.stream(), F(dloss), P<T>(dgrad), P<T>(dl), dt.get(), n, v, dscale));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto g_loss, Down(DType::kF32, dloss));
  DGCA_ASSIGN_OR_RETURN(auto g_grad, Down(t, dgrad));
  // Losses are computed in fp32 from the (rounded) logits: fp32 tolerance.
  Add(rows, "cross_entropy.loss", t, g_loss, row_loss, kF32Tol);
  Add(rows, "cross_entropy.dlogits", t, g_grad, dlogits, DefaultTolerance(t));
  return OkStatus();
}

// ---------------------------------------------------------------- AdamW
template <typename H>
Status CheckAdamW(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const DType h = kDType<H>;
  const int64_t n = 5000;
  // lr * wd = 1e-3: a decay applied in the wrong place moves param by 10x its tolerance.
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
  const int64_t step = 3;
  std::vector<float> p = Rand(n, rng), m = Rand(n, rng, -0.1f, 0.1f), v = Rand(n, rng, 0.0f, 0.01f);
  std::vector<float> g = Rand(n, rng, -2.0f, 2.0f);
  DGCA_ASSIGN_OR_RETURN(Bytes dp, Up(DType::kF32, p));
  DGCA_ASSIGN_OR_RETURN(Bytes dm, Up(DType::kF32, m));
  DGCA_ASSIGN_OR_RETURN(Bytes dv, Up(DType::kF32, v));
  DGCA_ASSIGN_OR_RETURN(Bytes dg, Up(DType::kF32, g));
  DGCA_ASSIGN_OR_RETURN(Bytes dcopy, Poisoned(h, n));
  // Reference: model/train/optimizer.cc AdamW::Step with the grad scaled.
  const double bc1 = 1.0 - std::pow(double(b1), double(step));
  const double bc2 = 1.0 - std::pow(double(b2), double(step));
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  // Decay in alternating runs (DecayRuns), as a model's flat buffer: runs
  // end at 700, 1901, 1902 (one element), 3500 and n; the first does not
  // decay, so [700, 1901) and [1902, 3500) do.
  const std::vector<int64_t> run_ends = {700, 1901, 1902, 3500, n};
  DeviceArray<int64_t> druns;
  DGCA_RETURN_IF_ERROR(druns.Upload(run_ends));
  const DecayRuns runs{druns.get(), static_cast<int>(run_ends.size()), false};
  std::vector<float> copy(n);
  for (int64_t j = 0; j < n; ++j) {
    const float gj = g[j] * grad_scale;
    if ((j >= 700 && j < 1901) || (j >= 1902 && j < 3500)) p[j] -= lr * wd * p[j];
    m[j] = b1 * m[j] + (1.0f - b1) * gj;
    v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
    p[j] -= step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_bc2 + eps);
    copy[j] = RoundTo(h, p[j]);
  }
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(AdamW(ctx.stream(), F(dp), F(dm), F(dv), F(dg), P<H>(dcopy), n, lr, b1, b2, eps, wd, step,
                             grad_scale, runs));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto gp, Down(DType::kF32, dp));
  DGCA_ASSIGN_OR_RETURN(auto gm, Down(DType::kF32, dm));
  DGCA_ASSIGN_OR_RETURN(auto gv, Down(DType::kF32, dv));
  DGCA_ASSIGN_OR_RETURN(auto gc, Down(h, dcopy));
  Add(rows, "adamw.param", DType::kF32, gp, p, kF32Tol);
  Add(rows, "adamw.m", DType::kF32, gm, m, kF32Tol);
  Add(rows, "adamw.v", DType::kF32, gv, v, kF32Tol);
  // The copy is the rounded master: exact.
  Add(rows, std::string("adamw.") + DTypeName(h) + "_copy", h, gc, copy, 0.0);
  return OkStatus();
}

// ---------------------------------------------------------------- SumSquares
// The global gradient norm's reduction (trainer clipping and grad_norm).
Status CheckSumSquares(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const int64_t n = 1234567;  // > 1024 blocks x 256 threads: the grid-stride path
  std::vector<float> x = Rand(n, rng, -3.0f, 3.0f);
  double want = 0;
  for (float xi : x) want += double(xi) * xi;
  DGCA_ASSIGN_OR_RETURN(Bytes dx, Up(DType::kF32, x));
  DeviceArray<double> out, partials;
  DGCA_RETURN_IF_ERROR(out.Allocate(1));
  DGCA_RETURN_IF_ERROR(partials.Allocate(kSumSquaresMaxBlocks));
  DGCA_RETURN_IF_ERROR(partials.Poison());  // every block must write its partial
  const double poison = 1e30;  // SumSquares adds: the check zeroes first, as the trainer does
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(out.get(), &poison, sizeof(double), cudaMemcpyHostToDevice),
                                  "cudaMemcpy poison"));
  // A pageable host-to-device cudaMemcpy may return before its DMA lands
  // (CUDA's "API synchronization behavior"), and the context's stream does
  // not wait for the legacy stream: without this the poison could land
  // after the zeroing below (the CUDA emulator's lazy streams showed it).
  DGCA_RETURN_IF_ERROR(SyncDevice());
  // Zeroed on the stream, as the trainer does, then summed.
  auto sum = [&](double* result) -> Status {
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(out.get(), 0, sizeof(double), ctx.stream()), "cudaMemsetAsync"));
    DGCA_RETURN_IF_ERROR(SumSquares(ctx.stream(), out.get(), F(dx), n, partials.get()));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    return CudaStatus(cudaMemcpy(result, out.get(), sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy result");
  };
  double got = 0, again = 0;
  DGCA_RETURN_IF_ERROR(sum(&got));
  Add(rows, "sum_squares", DType::kF32, {static_cast<float>(got)}, {static_cast<float>(want)}, kF32Tol);
  // Deterministic: the same input gives the same bits again (the block sums
  // are added in a fixed order, not by atomics).
  DGCA_RETURN_IF_ERROR(sum(&again));
  if (std::memcmp(&got, &again, sizeof(double)) != 0) {
    return InternalError("sum_squares is not deterministic: " + std::to_string(got) + " then " +
                         std::to_string(again));
  }
  return OkStatus();
}

// ---------------------------------------------------------------- loss scaler
// UnscaleCheck: the division by the loss scale and the overflow flag of an
// fp16 step (the scale's bookkeeping is model/train/loss_scaler.h).
Status CheckLossScale(const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
  const int64_t n = 3000;
  const float scale = 65536.0f;
  std::vector<float> g = Rand(n, rng, -1000.0f, 1000.0f);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] * (1.0f / scale);
  DGCA_ASSIGN_OR_RETURN(Bytes dg, Up(DType::kF32, g));
  std::vector<float> bad = g;
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  bad[pick(*rng)] = std::numeric_limits<float>::infinity();
  std::vector<float> nan = g;
  nan[pick(*rng)] = std::numeric_limits<float>::quiet_NaN();
  DGCA_ASSIGN_OR_RETURN(Bytes dbad, Up(DType::kF32, bad));
  DGCA_ASSIGN_OR_RETURN(Bytes dnan, Up(DType::kF32, nan));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> found_ok, UpInts({0}));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> found_bad, UpInts({0}));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> found_nan, UpInts({0}));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  DGCA_RETURN_IF_ERROR(UnscaleCheck(ctx.stream(), F(dg), n, 1.0f / scale, found_ok.get()));
  DGCA_RETURN_IF_ERROR(UnscaleCheck(ctx.stream(), F(dbad), n, 1.0f / scale, found_bad.get()));
  DGCA_RETURN_IF_ERROR(UnscaleCheck(ctx.stream(), F(dnan), n, 1.0f / scale, found_nan.get()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(auto gg, Down(DType::kF32, dg));
  std::vector<int32_t> fo, fb, fn;
  DGCA_RETURN_IF_ERROR(found_ok.Download(&fo));
  DGCA_RETURN_IF_ERROR(found_bad.Download(&fb));
  DGCA_RETURN_IF_ERROR(found_nan.Download(&fn));
  const double inf = std::numeric_limits<double>::infinity();
  Add(rows, "loss_scale.unscale", DType::kF32, gg, want, kF32Tol);
  rows->push_back(CheckRow{"loss_scale.found_inf (finite grads -> 0)", "fp32", fo[0] == 0 ? 0.0 : inf, 0.0});
  rows->push_back(CheckRow{"loss_scale.found_inf (one inf -> 1)", "fp32", fb[0] == 1 ? 0.0 : inf, 0.0});
  rows->push_back(CheckRow{"loss_scale.found_inf (one NaN -> 1)", "fp32", fn[0] == 1 ? 0.0 : inf, 0.0});
  return OkStatus();
}

template <typename T>
OpCheck Make(const std::string& name,
             Status (*fn)(const CudaContext&, GemmRunner*, Rng*, Rows*)) {
  return OpCheck{name + " " + DTypeName(kDType<T>), fn};
}

std::vector<OpCheck> BuildChecks() {
  std::vector<OpCheck> v;
  const DType f32 = DType::kF32, b16 = DType::kBF16, f16 = DType::kF16;
  const GemmCase gemms[] = {
      {"gemm_nn_bias", false, false, 67, 45, 33, true, f32, f32, 1},
      {"gemm_tn", true, false, 48, 40, 72, false, f32, f32, 1},
      {"gemm_nt", false, true, 64, 56, 40, false, f32, f32, 1},
      {"gemm_nt_batched", false, true, 40, 40, 16, false, f32, f32, 3},
      {"gemm_nn_bias", false, false, 128, 96, 64, true, b16, b16, 1},
      {"gemm_nt", false, true, 128, 96, 64, false, b16, f32, 1},
      {"gemm_tn", true, false, 96, 128, 64, false, b16, b16, 1},
      {"gemm_nt_batched", false, true, 40, 40, 16, false, b16, b16, 3},
      {"gemm_nn_bias", false, false, 128, 96, 64, true, f16, f32, 1},
      {"gemm_nt", false, true, 64, 64, 64, false, f16, f16, 1},
      // Odd leading dimensions: bf16 rows only 2-byte aligned (cuBLASLt may
      // have no algorithm: GemmRunner then falls back, correct either way).
      {"gemm_nn_odd_ld", false, false, 37, 19, 21, false, b16, b16, 1},
      // The residual in the beta term from a separate C_in (CudaBert's
      // attention output and FFN output projections).
      {"gemm_nt_bias_residual", false, true, 96, 64, 48, true, f32, f32, 1, true},
      {"gemm_nt_bias_residual", false, true, 96, 64, 48, true, b16, b16, 1, true},
  };
  for (const GemmCase& c : gemms) {
    v.push_back(OpCheck{std::string(c.name) + " " + DTypeName(c.in) + "->" + DTypeName(c.out),
                        [c](const CudaContext& ctx, GemmRunner* g, Rng* r, Rows* rows) {
                          return CheckGemm(c, ctx, g, r, rows);
                        }});
  }
  // The same shapes through FallbackGemm (what GemmRunner uses when cuBLASLt
  // has no algorithm for a shape), so the slow path is checked too.
  static const std::vector<std::string>* fb_names = [&] {
    auto* n = new std::vector<std::string>;
    for (const GemmCase& c : gemms) n->push_back(std::string("fallback ") + c.name);
    return n;
  }();
  for (size_t i = 0; i < std::size(gemms); ++i) {
    GemmCase f = gemms[i];
    f.name = (*fb_names)[i].c_str();
    v.push_back(OpCheck{std::string(f.name) + " " + DTypeName(f.in) + "->" + DTypeName(f.out),
                        [f](const CudaContext& ctx, GemmRunner*, Rng* r, Rows* rows) -> Status {
                          GemmRunner fb(&ctx);
                          fb.set_force_fallback(true);
                          DGCA_RETURN_IF_ERROR(CheckGemm(f, ctx, &fb, r, rows));
                          if (fb.fallback_plans() != 1) {
                            return InternalError("fallback GEMM check: expected 1 fallback plan, got " +
                                                 std::to_string(fb.fallback_plans()));
                          }
                          return OkStatus();
                        }});
  }
  // Every op in each activation type.
#define DGCA_CHECK_ALL_TYPES(name, fn)              \
  v.push_back(Make<float>(name, fn<float>));        \
  v.push_back(Make<bf16>(name, fn<bf16>));          \
  v.push_back(Make<__half>(name, fn<__half>));
  DGCA_CHECK_ALL_TYPES("layernorm", CheckLayerNorm)
  DGCA_CHECK_ALL_TYPES("gelu", CheckGelu)
  DGCA_CHECK_ALL_TYPES("softmax", CheckSoftmax)
  DGCA_CHECK_ALL_TYPES("attention", CheckAttention)
  v.push_back(Make<bf16>("attention (fused)", CheckFusedAttention<bf16>));
  v.push_back(Make<__half>("attention (fused)", CheckFusedAttention<__half>));
  DGCA_CHECK_ALL_TYPES("attention dropout", CheckAttentionDropout)
  v.push_back(Make<bf16>("attention (fused) dropout", CheckFusedAttentionDropout<bf16>));
  v.push_back(Make<__half>("attention (fused) dropout", CheckFusedAttentionDropout<__half>));
  DGCA_CHECK_ALL_TYPES("dropout", CheckDropout)
  DGCA_CHECK_ALL_TYPES("embedding", CheckEmbedding)
  DGCA_CHECK_ALL_TYPES("bias", CheckBias)
  DGCA_CHECK_ALL_TYPES("cross_entropy", CheckCrossEntropy)
#undef DGCA_CHECK_ALL_TYPES
  v.push_back(OpCheck{"adamw fp32 master + bf16 copy", CheckAdamW<bf16>});
  v.push_back(OpCheck{"adamw fp32 master + fp16 copy", CheckAdamW<__half>});
  v.push_back(OpCheck{"loss_scale fp32", CheckLossScale});
  v.push_back(OpCheck{"sum_squares fp32 (gradient norm)", CheckSumSquares});
  return v;
}

}  // namespace

const std::vector<OpCheck>& AllOpChecks() {
  static const std::vector<OpCheck>* checks = new std::vector<OpCheck>(BuildChecks());
  return *checks;
}

}  // namespace cuda
}  // namespace dgca
