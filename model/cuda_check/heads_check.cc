// GPU-vs-CPU checks of CudaHeads and CudaPromptEncoder (heads_check.h).
// Runs on the CUDA emulator in ctest (model/cuda_emu) and on an H200 (docs/benchmarks.md).
//
// Gradients that the modules ADD into (dh, dE, parameter grads) start from
// the same random values on both sides, and the rows compare the
// INCREMENTS (final − initial): an implementation that overwrote instead of
// adding is off by the whole initial value and fails, and a small
// increment is not hidden behind a large initial value.
#include "model/cuda_check/heads_check.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "model/core/config.h"
#include "model/cuda_check/check_io.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/cuda_heads.h"
#include "model/cuda/cuda_prompt_encoder.h"
#include "model/cuda/device_params.h"
#include "model/cuda/kernels.h"
#include "model/nn/heads.h"
#include "model/nn/params.h"
#include "model/nn/prompt_encoder.h"

namespace dgca {
namespace cuda {
namespace {

using Rng = std::mt19937_64;
using Rows = std::vector<CheckRow>;

constexpr double kHalfLossTol = 1e-3;  // bf16 and fp16 losses

std::vector<float> Rand(size_t n, Rng* rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}
int RandInt(Rng* rng, int lo, int hi) {  // [lo, hi)
  return std::uniform_int_distribution<int>(lo, hi - 1)(*rng);
}
// The values a T-typed GPU buffer holds.
template <typename T>
void RoundTo(std::vector<float>* v) {
  for (float& x : *v) x = RoundTo(kDType<T>, x);
}

StatusOr<std::vector<float>> DownFloats(const float* dev, size_t n) {
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  return DownloadAsFloat(dev, n);
}
// Uploads and poisons use the legacy default stream; the context's stream
// is non-blocking: wait for them before launching.
Status SyncDevice() { return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) r[i] = a[i] - b[i];
  return r;
}
std::vector<float> Slice(const std::vector<float>& v, const ParamInfo& p) {
  return std::vector<float>(v.begin() + p.offset, v.begin() + p.offset + p.numel);
}
void Add(Rows* rows, const std::string& op, const char* dtype, double err, double tol) {
  rows->push_back(CheckRow{op, dtype, err, tol});
}

// Every parameter's increment, GPU against CPU; and the alignment gaps
// between the tensors (ParamStore), which nothing may write: their largest
// change, held to 0.
void GradRows(Rows* rows, const std::string& prefix, const char* dtype, const ParamStore& store,
              const std::vector<float>& grads0, const std::vector<float>& got_grads, double tol) {
  std::vector<bool> in_tensor(got_grads.size(), false);
  for (int i = 0; i < store.size(); ++i) {
    const ParamInfo& p = store.info(i);
    const std::vector<float> g0 = Slice(grads0, p);
    const std::vector<float> want(store.grad(i), store.grad(i) + p.numel);
    Add(rows, prefix + "grad " + p.name, dtype,
        MaxRelErr(Minus(Slice(got_grads, p), g0), Minus(want, g0)), tol);
    std::fill(in_tensor.begin() + p.offset, in_tensor.begin() + p.offset + p.numel, true);
  }
  double gap_change = 0;
  for (size_t k = 0; k < got_grads.size(); ++k) {
    if (in_tensor[k]) continue;
    const double d = std::abs(double(got_grads[k]) - double(grads0[k]));
    gap_change = std::isfinite(d) ? std::max(gap_change, d) : std::numeric_limits<double>::infinity();
  }
  rows->push_back(CheckRow{prefix + "grad alignment gaps (untouched)", dtype, gap_change, 0.0});
}

// ---------------------------------------------------------------- heads
struct HeadsCase {
  const char* name;
  bool detector;
  FusionKind fusion;
  bool alias_dz;  // Backward writes dz over z (in place)
};

constexpr int kH = 32, kV = 200, kK = 4, kSlots = 10, kMaxSlots = 16;

template <typename T>
Status CheckHeads(const HeadsCase& hc, const CudaContext& ctx, GemmRunner* gemm, Rng* rng,
                  Rows* rows) {
  constexpr bool kHalf = !std::is_same_v<T, float>;
  const char* dtype = DTypeName(kDType<T>);
  const double tol = DefaultTolerance(kDType<T>);
  const double loss_tol = kHalf ? kHalfLossTol : kF32Tol;
  const std::string prefix = std::string("heads ") + hc.name + ": ";
  ModelConfig cfg;
  cfg.hidden = kH;
  cfg.vocab_size = kV;
  cfg.candidate_top_k = kK;
  cfg.detector = hc.detector;
  cfg.candidate = true;
  cfg.fusion = hc.fusion;
  cfg.lambda_detector = 0.7f;
  cfg.lambda_candidate = 1.3f;
  const int Tn = kSlots, V = kV, H = kH, K = kK;

  // CPU module and parameters (every value redrawn: no trivial 0/1 weights).
  ParamStore store;
  DgcaHeads cpu(cfg, kMaxSlots);
  DGCA_RETURN_IF_ERROR(cpu.Declare(&store));
  store.Finalize();
  DGCA_RETURN_IF_ERROR(cpu.Bind(&store));
  cpu.InitParams((*rng)());
  for (int i = 0; i < store.size(); ++i) {
    const ParamInfo& p = store.info(i);
    const bool gain = p.name == "candidate.LayerNorm.weight" || p.name == "fusion.gate.det_scale";
    std::vector<float> v = gain ? Rand(p.numel, rng, 0.5f, 1.5f) : Rand(p.numel, rng, -0.5f, 0.5f);
    // The 16-bit GEMMs read W_c as T: give the reference the same values.
    if (kHalf && p.name == "candidate.dense.weight") RoundTo<T>(&v);
    std::copy(v.begin(), v.end(), store.value(i));
  }
  std::vector<float> grads0 = Rand(store.total_numel(), rng, -0.01f, 0.01f);
  std::copy(grads0.begin(), grads0.end(), store.grads());

  // Inputs (rounded to T for a 16-bit check, the same values for both sides).
  std::vector<float> h = Rand(size_t(Tn) * H, rng, -1.0f, 1.0f);
  std::vector<float> z = Rand(size_t(Tn) * V, rng, -4.0f, 4.0f);
  std::vector<float> E = Rand(size_t(V) * H, rng, -0.5f, 0.5f);
  const float dh_amp = kHalf ? 1e-3f : 1e-2f;  // small for 16 bits: their rounding is relative
  std::vector<float> dh0 = Rand(size_t(Tn) * H, rng, -dh_amp, dh_amp);
  std::vector<float> dE0 = Rand(size_t(V) * H, rng, -0.01f, 0.01f);
  if (kHalf) {
    RoundTo<T>(&h);
    RoundTo<T>(&z);
    RoundTo<T>(&E);
    RoundTo<T>(&dh0);
  }
  // Slot kinds by t % 5: 0 correct (y = x ∈ C); 1 error, y among the
  // candidates; 2 error, y outside the candidates; 3 y = a duplicated
  // candidate; 4 padding (two -1) and y = x.
  std::vector<int32_t> x(Tn), y(Tn), cand(size_t(Tn) * K);
  for (int t = 0; t < Tn; ++t) {
    int32_t* c = &cand[size_t(t) * K];
    x[t] = RandInt(rng, 0, V);
    c[0] = x[t];
    for (int k = 1; k < K; ++k) {
      int32_t id;
      do {
        id = RandInt(rng, 0, V);
      } while (std::find(c, c + k, id) != c + k);
      c[k] = id;
    }
    switch (t % 5) {
      case 0: y[t] = x[t]; break;
      case 1: y[t] = c[2]; break;
      case 2: {
        int32_t id;
        do {
          id = RandInt(rng, 0, V);
        } while (std::find(c, c + K, id) != c + K);
        y[t] = id;
        break;
      }
      case 3: c[3] = c[1]; y[t] = c[1]; break;
      default: c[2] = -1; c[3] = -1; y[t] = x[t]; break;
    }
  }
  const float scale = 1.7f;

  // CPU reference.
  HeadLosses want;
  DGCA_RETURN_IF_ERROR(cpu.Forward(h.data(), z.data(), E.data(), cand.data(), x.data(), y.data(),
                                   Tn, V, &want));
  std::vector<float> dz_want(size_t(Tn) * V), dh_want = dh0, dE_want = dE0;
  cpu.Backward(scale, dh_want.data(), dz_want.data(), dE_want.data());
  std::vector<int32_t> pred_want(Tn);
  DGCA_RETURN_IF_ERROR(cpu.Predict(h.data(), z.data(), E.data(), cand.data(), x.data(), Tn, V,
                                   pred_want.data()));

  // GPU.
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceParams> dp, DeviceParams::Create(&store, kDType<T>));
  DGCA_RETURN_IF_ERROR(dp->Upload(store));
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dp->grad(), grads0.data(), grads0.size() * sizeof(float),
                                             cudaMemcpyHostToDevice),
                                  "cudaMemcpy grads"));
  CudaHeads<T> gpu(cfg, kMaxSlots);
  DGCA_RETURN_IF_ERROR(gpu.Bind(store, dp.get(), &ctx, gemm));
  DGCA_RETURN_IF_ERROR(gpu.PoisonScratch());
  DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_h, UploadAs<T>(h));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_z, UploadAs<T>(z));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_E, UploadAs<T>(E));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_dh, UploadAs<T>(dh0));
  DGCA_ASSIGN_OR_RETURN(DeviceArray<float> d_dE, UploadAs<float>(dE0));
  DeviceArray<int32_t> d_x, d_y, d_cand, d_pred;
  DGCA_RETURN_IF_ERROR(d_x.Upload(x));
  DGCA_RETURN_IF_ERROR(d_y.Upload(y));
  DGCA_RETURN_IF_ERROR(d_cand.Upload(cand));
  DGCA_RETURN_IF_ERROR(d_pred.Allocate(Tn));
  DGCA_RETURN_IF_ERROR(d_pred.Poison());
  DeviceArray<T> d_dz;
  if (!hc.alias_dz) {
    DGCA_RETURN_IF_ERROR(d_dz.Allocate(size_t(Tn) * V));
    DGCA_RETURN_IF_ERROR(d_dz.Poison());
  }
  DGCA_RETURN_IF_ERROR(SyncDevice());
  HeadLosses got;
  DGCA_RETURN_IF_ERROR(gpu.Forward(d_h.get(), d_z.get(), d_E.get(), d_cand.get(), d_x.get(),
                                   d_y.get(), Tn, V, &got));
  T* dz_ptr = hc.alias_dz ? d_z.get() : d_dz.get();
  DGCA_RETURN_IF_ERROR(gpu.Backward(scale, d_dh.get(), dz_ptr, d_dE.get()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  const DeviceArray<T>& dz_out = hc.alias_dz ? d_z : d_dz;
  DGCA_ASSIGN_OR_RETURN(std::vector<float> dz_got, DownloadAsFloat(dz_out.get(), dz_out.size()));
  DGCA_ASSIGN_OR_RETURN(std::vector<float> dh_got, DownloadAsFloat(d_dh.get(), d_dh.size()));
  DGCA_ASSIGN_OR_RETURN(std::vector<float> dE_got, DownloadAsFloat(d_dE.get(), d_dE.size()));
  DGCA_ASSIGN_OR_RETURN(std::vector<float> grads_got,
                        DownFloats(dp->grad(), static_cast<size_t>(store.total_numel())));
  // Predict needs the logits again when Backward overwrote them.
  if (hc.alias_dz) {
    DGCA_ASSIGN_OR_RETURN(d_z, UploadAs<T>(z));
    DGCA_RETURN_IF_ERROR(SyncDevice());
  }
  DGCA_RETURN_IF_ERROR(gpu.PoisonScratch());
  DGCA_RETURN_IF_ERROR(gpu.Predict(d_h.get(), d_z.get(), d_E.get(), d_cand.get(), d_x.get(), Tn,
                                   V, d_pred.get()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  std::vector<int32_t> pred_got;
  DGCA_RETURN_IF_ERROR(d_pred.Download(&pred_got));

  // Rows.
  const std::vector<float> lw = {float(want.total), float(want.fusion), float(want.detector),
                                 float(want.candidate)};
  const std::vector<float> lg = {float(got.total), float(got.fusion), float(got.detector),
                                 float(got.candidate)};
  Add(rows, prefix + "losses (total, fusion, det, cand)", dtype, MaxRelErr(lg, lw), loss_tol);
  Add(rows, prefix + "slots, candidate slots (exact)", dtype,
      (got.slots == want.slots && got.candidate_slots == want.candidate_slots) ? 0.0 : 1.0, 0.0);
  Add(rows, prefix + (hc.alias_dz ? "dz (in place over z)" : "dz"), dtype, MaxRelErr(dz_got, dz_want), tol);
  Add(rows, prefix + "dh (increment)", dtype, MaxRelErr(Minus(dh_got, dh0), Minus(dh_want, dh0)), tol);
  Add(rows, prefix + "dE (increment)", dtype, MaxRelErr(Minus(dE_got, dE0), Minus(dE_want, dE0)), tol);
  GradRows(rows, prefix, dtype, store, grads0, grads_got, tol);
  int differ = 0;
  for (int t = 0; t < Tn; ++t) differ += (t >= int(pred_got.size()) || pred_got[t] != pred_want[t]) ? 1 : 0;
  Add(rows, prefix + "predictions (fraction differing)", dtype, double(differ) / Tn, 0.0);
  return OkStatus();
}

// ---------------------------------------------------------------- prompt
Status CheckPrompt(PromptEncoderKind kind, const CudaContext& ctx, GemmRunner* gemm, Rng* rng,
                   Rows* rows) {
  const char* dtype = "fp32";
  const std::string prefix =
      std::string("prompt ") + (kind == PromptEncoderKind::kLstm ? "lstm" : "mlp") + ": ";
  ModelConfig cfg;
  cfg.hidden = kH;
  cfg.prompt_length = 3;
  cfg.prompt_encoder = kind;
  ParamStore store;
  PromptEncoder cpu(cfg);
  DGCA_RETURN_IF_ERROR(cpu.Declare(&store));
  store.Finalize();
  DGCA_RETURN_IF_ERROR(cpu.Bind(&store));
  cpu.InitParams((*rng)());
  std::vector<float> grads0 = Rand(store.total_numel(), rng, -0.01f, 0.01f);
  std::copy(grads0.begin(), grads0.end(), store.grads());
  const int S = cpu.rows(), H = cpu.hidden();
  std::vector<float> dout = Rand(size_t(S) * H, rng, -1.0f, 1.0f);

  const float* o = cpu.Forward();
  if (o == nullptr) return InternalError("PromptEncoder::Forward returned null");
  const std::vector<float> out_want(o, o + size_t(S) * H);
  cpu.Backward(dout.data());

  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceParams> dp, DeviceParams::Create(&store, DType::kF32));
  DGCA_RETURN_IF_ERROR(dp->Upload(store));
  DGCA_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dp->grad(), grads0.data(), grads0.size() * sizeof(float),
                                             cudaMemcpyHostToDevice),
                                  "cudaMemcpy grads"));
  CudaPromptEncoder gpu(cfg);
  DGCA_RETURN_IF_ERROR(gpu.Bind(store, dp.get(), &ctx, gemm));
  DGCA_RETURN_IF_ERROR(gpu.PoisonScratch());
  DGCA_ASSIGN_OR_RETURN(DeviceArray<float> d_dout, UploadAs<float>(dout));
  DGCA_RETURN_IF_ERROR(SyncDevice());
  const float* d_out = nullptr;
  DGCA_RETURN_IF_ERROR(gpu.Forward(&d_out));
  if (d_out == nullptr) return InternalError("CudaPromptEncoder::Forward returned null");
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  // Read the rows before Backward (which does not touch them, but a bug could).
  DGCA_ASSIGN_OR_RETURN(std::vector<float> out_got, DownFloats(d_out, size_t(S) * H));
  DGCA_RETURN_IF_ERROR(gpu.Backward(d_dout.get()));
  DGCA_RETURN_IF_ERROR(ctx.Synchronize());
  DGCA_ASSIGN_OR_RETURN(std::vector<float> grads_got,
                        DownFloats(dp->grad(), static_cast<size_t>(store.total_numel())));
  Add(rows, prefix + "prompt rows", dtype, MaxRelErr(out_got, out_want), kF32Tol);
  GradRows(rows, prefix, dtype, store, grads0, grads_got, kF32Tol);
  return OkStatus();
}


}  // namespace

const std::vector<OpCheck>& HeadsChecks() {
  static const std::vector<OpCheck>* checks = [] {
    auto* v = new std::vector<OpCheck>();
    const HeadsCase gated{"gated", true, FusionKind::kGated, false};
    const HeadsCase gated_alias{"gated", true, FusionKind::kGated, true};
    const HeadsCase gated_nodet{"gated no-detector", false, FusionKind::kGated, false};
    const HeadsCase none{"fusion none", true, FusionKind::kNone, false};
    const HeadsCase none_alias{"fusion none", true, FusionKind::kNone, true};
    auto heads = [v](const HeadsCase& c, DType t) {
      v->push_back(OpCheck{std::string("heads ") + c.name + " " + DTypeName(t),
                           [c, t](const CudaContext& ctx, GemmRunner* g, Rng* r, Rows* rows) {
                             switch (t) {
                               case DType::kBF16: return CheckHeads<bf16>(c, ctx, g, r, rows);
                               case DType::kF16: return CheckHeads<__half>(c, ctx, g, r, rows);
                               case DType::kF32: break;
                             }
                             return CheckHeads<float>(c, ctx, g, r, rows);
                           }});
    };
    heads(gated, DType::kF32);
    heads(gated_alias, DType::kBF16);
    heads(gated_alias, DType::kF16);
    heads(gated_nodet, DType::kF32);
    heads(none, DType::kF32);
    heads(none_alias, DType::kBF16);
    heads(none_alias, DType::kF16);
    v->push_back(OpCheck{"prompt lstm", [](const CudaContext& ctx, GemmRunner* g, Rng* r, Rows* rows) {
                           return CheckPrompt(PromptEncoderKind::kLstm, ctx, g, r, rows);
                         }});
    v->push_back(OpCheck{"prompt mlp", [](const CudaContext& ctx, GemmRunner* g, Rng* r, Rows* rows) {
                           return CheckPrompt(PromptEncoderKind::kMlp, ctx, g, r, rows);
                         }});
    return v;
  }();
  return *checks;
}

}  // namespace cuda
}  // namespace dgca
