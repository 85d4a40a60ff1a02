// The whole-training-step check (model_check.h): CudaDgcaModel against the
// CPU DgcaModel + AdamW. Run on the CUDA emulator and on an H200 (docs/benchmarks.md).
#include "model/cuda_check/model_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/core/batch.h"
#include "model/core/config.h"
#include "model/core/strings.h"
#include "model/cuda_check/check_io.h"
#include "model/cuda/cuda_model.h"
#include "model/nn/model.h"
#include "model/nn/params.h"
#include "model/nn/synthetic_batch.h"
#include "model/train/optimizer.h"

namespace dgca {
namespace cuda {
namespace {

using Rng = std::mt19937_64;
using Rows = std::vector<CheckRow>;

constexpr double kInf = std::numeric_limits<double>::infinity();

ModelConfig CheckConfig() {
  ModelConfig c;
  c.vocab_size = 300;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 4;
  c.ffn = 128;
  c.max_position = 64;
  c.prompt_length = 2;
  c.prompt_encoder = PromptEncoderKind::kLstm;
  c.detector = true;
  c.candidate = true;
  c.candidate_top_k = 4;
  c.fusion = FusionKind::kGated;
  c.lambda_detector = 0.7f;
  c.lambda_candidate = 0.4f;
  return c;
}

// fp16 runs scale the loss by this (a power of two: exact to undo) so the
// check covers the scaled backward and UnscaleAndSquaredNorm.
constexpr float kCheckLossScale = 1024.0f;

double MaxAbs(const float* p, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(p[i])));
  return m;
}

// Tensors whose reference gradient can cancel to near zero, and the
// tensor whose scale their terms have: the key bias (softmax makes its true
// gradient zero; it is rounding noise of the value bias' scale); the
// detector's one-logit bias (a signed sum over the batch's target slots:
// seen at 1.1e-4 from terms near 0.1 in fp16, where the GPU's 4e-6
// difference read as 4% relative; the per-slot terms are what the detector
// weight's gradient is made of); and the gate's scalars, bias and detector
// scale (sums over the slots of the same per-slot gate gradient the gate
// weight's is made of: det_scale read 7.3e-2 against 5e-2 in a bf16 run
// whose other gradients were within 1e-2).
struct ScalePartner {
  const char* suffix;
  const char* partner_suffix;
};
constexpr ScalePartner kScalePartners[] = {
    {"attention.self.key.bias", "attention.self.value.bias"},
    {"detector.bias", "detector.weight"},
    {"fusion.gate.bias", "fusion.gate.weight"},
    {"fusion.gate.det_scale", "fusion.gate.weight"},
};

// max|got - want| / scale; scale = max|want| (for a kScalePartners tensor
// also its partner's in want_base); an all-zero reference compares
// absolutely. NaN -> inf.
double TensorErr(const ParamStore& layout, int i, const float* got, const float* want,
                 const float* want_base) {
  const ParamInfo& info = layout.info(i);
  double diff = 0;
  for (int64_t j = 0; j < info.numel; ++j) {
    const double d = std::fabs(static_cast<double>(got[j]) - want[j]);
    if (std::isnan(d)) return kInf;
    diff = std::max(diff, d);
  }
  double scale = MaxAbs(want, info.numel);
  for (const ScalePartner& sp : kScalePartners) {
    if (!EndsWith(info.name, sp.suffix)) continue;
    const std::string partner =
        info.name.substr(0, info.name.size() - std::string(sp.suffix).size()) + sp.partner_suffix;
    const int v = layout.Find(partner);
    if (v >= 0) scale = std::max(scale, MaxAbs(want_base + layout.info(v).offset, layout.info(v).numel));
  }
  return scale > 0 ? diff / scale : diff;
}

double ScalarErr(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return kInf;
  if (want == 0) return std::fabs(got);
  return std::fabs(got - want) / std::fabs(want);
}

void LossRows(const std::string& prefix, const std::string& dt, double tol, const LossBreakdown& g,
              const LossBreakdown& c, Rows* rows) {
  rows->push_back({prefix + " loss.total", dt, ScalarErr(g.total, c.total), tol});
  rows->push_back({prefix + " loss.fusion", dt, ScalarErr(g.fusion, c.fusion), tol});
  rows->push_back({prefix + " loss.mft", dt, ScalarErr(g.mft, c.mft), tol});
  rows->push_back({prefix + " loss.detector", dt, ScalarErr(g.detector, c.detector), tol});
  rows->push_back({prefix + " loss.candidate", dt, ScalarErr(g.candidate, c.candidate), tol});
  rows->push_back({prefix + " target_slots", dt, g.target_slots == c.target_slots ? 0.0 : kInf, 0.0});
}

// One row per tensor (all = true) or one row for the worst tensor.
// `got`/`want` are flat buffers in the layout; `base` the reference the
// scales come from (want itself, or the update).
void TensorRows(const std::string& prefix, const std::string& dt, double tol,
                const ParamStore& layout, const float* got, const float* want, bool all,
                Rows* rows) {
  double worst = -1;
  std::string worst_name;
  for (int i = 0; i < layout.size(); ++i) {
    const ParamInfo& info = layout.info(i);
    const double e = TensorErr(layout, i, got + info.offset, want + info.offset, want);
    if (all) rows->push_back({prefix + " " + info.name, dt, e, tol});
    if (e > worst || std::isnan(e)) worst = e, worst_name = info.name;
  }
  if (!all) rows->push_back({prefix + " (worst: " + worst_name + ")", dt, worst, tol});
}

// The check config with dropout 0.1 on hidden states and probabilities:
// the CPU and GPU models draw the same masks from the batches' keys
// (model/core/dropout.h), so every row holds as without dropout.
ModelConfig CheckConfigWith(bool dropout) {
  ModelConfig c = CheckConfig();
  if (dropout) c.hidden_dropout = c.attention_dropout = 0.1f;
  return c;
}

Status CheckModel(Precision prec, bool dropout, const CudaContext& ctx, Rng* rng, Rows* rows) {
  const ModelConfig cfg = CheckConfigWith(dropout);
  const std::string dt = PrecisionName(prec);
  const std::string model = dropout ? "cuda_model dropout" : "cuda_model";
  const bool bf16 = prec == Precision::kBf16, fp16 = prec == Precision::kFp16;
  const bool half = bf16 || fp16;
  const double tol = bf16 ? kModelBf16Tol : fp16 ? kModelF16Tol : kF32Tol;
  auto round16 = [&](float x) { return RoundTo(PrecisionDType(prec), x); };
  const int max_batch = 4, L = 32;
  const uint64_t seed = (*rng)();

  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DgcaModel> cpu,
                        DgcaModel::Create(cfg, max_batch, L, seed, /*threads=*/1));
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDgcaModel> gpu,
                        CudaDgcaModel::Create(cfg, max_batch, L, seed, prec, &ctx));
  ParamStore& cp = cpu->params();
  ParamStore& gp = gpu->params();
  // Same layout (by construction; a mismatch would make every row meaningless).
  bool same_layout = cp.size() == gp.size() && cp.total_numel() == gp.total_numel();
  for (int i = 0; same_layout && i < cp.size(); ++i)
    same_layout = cp.info(i).name == gp.info(i).name && cp.info(i).offset == gp.info(i).offset &&
                  cp.info(i).numel == gp.info(i).numel &&
                  cp.info(i).weight_decay == gp.info(i).weight_decay;
  if (!same_layout) return InternalError("cuda_model check: the GPU model's layout differs from the CPU's");
  const int64_t n = cp.total_numel();
  // Same initial values from the same seed.
  {
    double e = 0;
    for (int64_t j = 0; j < n; ++j) e = std::max(e, std::fabs(double(cp.values()[j]) - gp.values()[j]));
    rows->push_back({model + " init == cpu init (max abs diff)", dt, e, 0.0});
  }
  // Non-trivial biases / LayerNorm parameters; bf16-representable values
  // for bf16. Then the GPU gets exactly the CPU's values.
  {
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (int i = 0; i < cp.size(); ++i) {
      if (cp.info(i).weight_decay) continue;
      float* p = cp.value(i);
      for (int64_t j = 0; j < cp.info(i).numel; ++j) p[j] += u(*rng);
    }
    if (half)
      for (int64_t j = 0; j < n; ++j) cp.values()[j] = round16(cp.values()[j]);
    std::memcpy(gp.values(), cp.values(), sizeof(float) * n);
    DGCA_RETURN_IF_ERROR(gpu->UploadValues());
  }
  cp.ZeroGrads();
  DGCA_RETURN_IF_ERROR(gpu->ZeroGrads());

  const uint32_t bseed = static_cast<uint32_t>((*rng)());
  // Row lengths: 2n + 2P + 2 <= L = 32 -> n <= 13; batch 2 has trailing
  // all-padding columns (Trim).
  const Batch b1 = SyntheticBatch(cfg, L, {9, 12, 6, 13}, /*mft=*/true, bseed);
  const Batch b2 = SyntheticBatch(cfg, L, {7, 10, 5}, /*mft=*/true, bseed + 1);

  const float loss_scale = fp16 ? kCheckLossScale : 1.0f;
  gpu->set_loss_scale(loss_scale);
  std::vector<float> grads_after_1;
  for (int step = 1; step <= 2; ++step) {
    const Batch& b = step == 1 ? b1 : b2;
    std::vector<int> ready_c, ready_g;
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lc,
                          cpu->ForwardBackward(b, 0.5f, [&](int i) { ready_c.push_back(i); }));
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lg,
                          gpu->ForwardBackward(b, 0.5f, [&](int i) { ready_g.push_back(i); }));
    const std::string pre = model + " micro" + std::to_string(step);
    LossRows(pre, dt, tol, lg, lc, rows);
    rows->push_back({pre + " grad_ready order", dt, ready_c == ready_g ? 0.0 : kInf, 0.0});
    DGCA_RETURN_IF_ERROR(gpu->DownloadGrads());
    for (int64_t j = 0; j < n; ++j) gp.grads()[j] /= loss_scale;
    TensorRows(pre + (step == 1 ? " grads" : " accumulated grad"), dt, tol, cp, gp.grads(),
               cp.grads(), /*all=*/step == 2, rows);
  }
  if (fp16) {
    // The device's own unscale: the same gradients, and no overflow.
    DGCA_ASSIGN_OR_RETURN(CudaDgcaModel::GradStats st, gpu->UnscaleAndSquaredNorm(1.0f / loss_scale));
    rows->push_back({model + " unscale: no overflow at loss scale 1024", dt, st.found_inf ? kInf : 0.0, 0.0});
    DGCA_RETURN_IF_ERROR(gpu->DownloadGrads());
    TensorRows(model + " unscaled grads", dt, tol, cp, gp.grads(), cp.grads(), /*all=*/false, rows);
    // The squared norm of the unscaled gradients, against the CPU's.
    double want_sq = 0.0;
    for (int64_t j = 0; j < n; ++j) want_sq += double(cp.grads()[j]) * cp.grads()[j];
    rows->push_back({model + " unscaled grad squared norm", dt, ScalarErr(st.squared_norm, want_sq), tol});
    // A scale no fp16 gradient survives: the overflow must be seen.
    DGCA_RETURN_IF_ERROR(gpu->ZeroGrads());
    gpu->set_loss_scale(1e30f);
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lo, gpu->ForwardBackward(b1, 0.5f, GradReadyFn()));
    (void)lo;
    DGCA_ASSIGN_OR_RETURN(CudaDgcaModel::GradStats over, gpu->UnscaleAndSquaredNorm(1e-30f));
    rows->push_back({model + " unscale: overflow seen at loss scale 1e30", dt, over.found_inf ? 0.0 : kInf, 0.0});
    gpu->set_loss_scale(1.0f);
  }

  // AdamW from the same gradients (see model_check.h for why).
  std::vector<float> before(cp.values(), cp.values() + n);
  std::memcpy(gp.grads(), cp.grads(), sizeof(float) * n);
  DGCA_RETURN_IF_ERROR(gpu->UploadGrads());
  AdamWOptions opt;
  opt.weight_decay = 0.01f;
  const float lr = 1e-2f;
  AdamW cpu_opt(&cp, opt);
  cpu_opt.Step(lr);
  DGCA_RETURN_IF_ERROR(gpu->Step(lr, opt));
  DGCA_RETURN_IF_ERROR(gpu->DownloadValues());
  {
    std::vector<float> dg(n), dc(n);
    for (int64_t j = 0; j < n; ++j) {
      dg[j] = gp.values()[j] - before[j];
      dc[j] = cp.values()[j] - before[j];
    }
    TensorRows(model + " adamw update", dt, kF32Tol, cp, dg.data(), dc.data(), /*all=*/false,
               rows);
  }
  if (half) {
    // AdamW's half_out: the copy the forward reads == round(master), exactly.
    DeviceParams* dp = gpu->device_params();
    DGCA_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    StatusOr<std::vector<float>> copy = bf16 ? DownloadAsFloat(dp->copy<__nv_bfloat16>(), n)
                                             : DownloadAsFloat(dp->copy<__half>(), n);
    DGCA_RETURN_IF_ERROR(copy.status());
    DGCA_ASSIGN_OR_RETURN(std::vector<float> master, DownloadAsFloat(dp->master(), n));
    double e = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float c = (*copy)[j];
      const double d = std::fabs(double(c) - round16(master[j]));
      e = std::max(e, std::isnan(d) ? kInf : d);
    }
    rows->push_back({model + " adamw " + dt + " copy == " + dt + "(master)", dt, e, 0.0});
  }

  // A forward from the updated weights (the GPU reads its own updated
  // master / bf16 copy; the CPU its updated values).
  {
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lc, cpu->Forward(b1));
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lg, gpu->Forward(b1));
    LossRows(model + " after adamw", dt, tol, lg, lc, rows);
  }
  {
    DGCA_ASSIGN_OR_RETURN(std::vector<int32_t> pc, cpu->Predict(b2));
    DGCA_ASSIGN_OR_RETURN(std::vector<int32_t> pg, gpu->Predict(b2));
    double diff = pc.size() == pg.size() ? 0.0 : kInf;
    for (size_t i = 0; i < std::min(pc.size(), pg.size()); ++i) diff += pc[i] != pg[i];
    if (!pc.empty()) diff /= static_cast<double>(pc.size());
    rows->push_back({model + " predict (fraction differing)", dt, diff, half ? 0.2 : 0.0});
  }
  return gpu->Synchronize();
}

// CUDA graphs (cuda_model.h set_cuda_graphs): the same micro-steps with
// and without graphs, from the same weights, give bitwise the same losses
// and gradients (the same kernels in the same order; deterministic mode, so
// no atomics), and the encoder segments of repeated (batch size, L_eff)
// were replayed (4 captured, 10 replayed).
// With dropout the training forward and the evaluation forward are
// separate graphs (6 captured, 6 replayed), and replays must drop with the
// keys of the batch they run (b3 replays b1's graphs with other keys).
Status CheckGraphs(Precision prec, bool dropout, const CudaContext& ctx, Rng* rng, Rows* rows) {
  const ModelConfig cfg = CheckConfigWith(dropout);
  const std::string model = dropout ? "cuda_model dropout" : "cuda_model";
  const std::string dt = PrecisionName(prec);
  const int max_batch = 4, L = 32;
  const uint64_t seed = (*rng)();
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDgcaModel> eager,
                        CudaDgcaModel::Create(cfg, max_batch, L, seed, prec, &ctx));
  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDgcaModel> graphed,
                        CudaDgcaModel::Create(cfg, max_batch, L, seed, prec, &ctx));
  for (CudaDgcaModel* m : {eager.get(), graphed.get()}) {
    m->set_deterministic(true);
    DGCA_RETURN_IF_ERROR(m->ZeroGrads());
  }
  graphed->set_cuda_graphs(true);
  const uint32_t bseed = static_cast<uint32_t>((*rng)());
  const Batch b1 = SyntheticBatch(cfg, L, {9, 12, 6, 13}, /*mft=*/true, bseed);
  const Batch b2 = SyntheticBatch(cfg, L, {7, 10, 5}, /*mft=*/true, bseed + 1);
  // b3: b1's batch size and trimmed length with other rows, slots and
  // labels, so it replays b1's graphs: what the key leaves out (head rows,
  // target slots, contents, and the grad scale, which alternates) must not
  // be baked into them.
  const Batch b3 = SyntheticBatch(cfg, L, {13, 5, 8, 11}, /*mft=*/true, bseed + 2);
  double loss_diff = 0;
  int step = 0;
  for (const Batch* b : {&b1, &b2, &b1, &b3, &b2, &b3}) {
    const float grad_scale = step++ % 2 == 0 ? 0.5f : 0.25f;
    DGCA_ASSIGN_OR_RETURN(LossBreakdown le, eager->ForwardBackward(*b, grad_scale, GradReadyFn()));
    DGCA_ASSIGN_OR_RETURN(LossBreakdown lg, graphed->ForwardBackward(*b, grad_scale, GradReadyFn()));
    loss_diff = std::max(loss_diff, std::fabs(le.total - lg.total) + std::fabs(le.mft - lg.mft) +
                                        std::fabs(le.detector - lg.detector));
    DGCA_ASSIGN_OR_RETURN(LossBreakdown fe, eager->Forward(*b));
    DGCA_ASSIGN_OR_RETURN(LossBreakdown fg, graphed->Forward(*b));
    loss_diff = std::max(loss_diff, std::fabs(fe.total - fg.total));
  }
  rows->push_back({model + " graphs: losses == eager (max abs diff)", dt, loss_diff, 0.0});
  DGCA_RETURN_IF_ERROR(eager->DownloadGrads());
  DGCA_RETURN_IF_ERROR(graphed->DownloadGrads());
  const int64_t n = eager->params().total_numel();
  double grad_diff = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = std::fabs(double(eager->params().grads()[j]) - graphed->params().grads()[j]);
    grad_diff = std::max(grad_diff, std::isnan(d) ? kInf : d);
  }
  rows->push_back({model + " graphs: accumulated grads == eager (max abs diff)", dt, grad_diff, 0.0});
  const GraphCache::Stats st = graphed->cuda_graph_stats();
  // Six steps of two batch sizes (b1 and b3 4 rows, b2 3; all trim to
  // L_eff 32), each a forward+backward then a forward-only pass: the
  // encoder forward and backward segment of each batch size is captured on
  // its second sight (4 graphs; the forward-only pass shares the forward's)
  // and replayed after (10 replays).
  const int want_replayed = dropout ? 6 : 10, want_captured = dropout ? 6 : 4;
  rows->push_back({model + " graphs: replayed (" + std::to_string(st.replayed) + "), captured (" +
                       std::to_string(st.captured) + "), failed captures (" +
                       std::to_string(st.capture_failures) + ")",
                   dt,
                   st.replayed == want_replayed && st.captured == want_captured && st.capture_failures == 0 ? 0.0
                                                                                                             : kInf,
                   0.0});
  return graphed->Synchronize();
}

// The OpCheck running fn (CheckModel or CheckGraphs) at precision p.
OpCheck AtPrecision(const std::string& name, Status (*fn)(Precision, bool, const CudaContext&, Rng*, Rows*),
                    Precision p, bool dropout = false) {
  return OpCheck{name + (dropout ? " dropout " : " ") + PrecisionName(p),
                 [fn, p, dropout](const CudaContext& ctx, GemmRunner*, Rng* rng, Rows* rows) {
                   return fn(p, dropout, ctx, rng, rows);
                 }};
}

}  // namespace

const std::vector<OpCheck>& ModelChecks() {
  static const std::vector<OpCheck>* checks = new std::vector<OpCheck>{
      AtPrecision("cuda_model", CheckModel, Precision::kFp32),
      AtPrecision("cuda_model", CheckModel, Precision::kBf16),
      AtPrecision("cuda_model", CheckModel, Precision::kFp16),
      AtPrecision("cuda_model graphs", CheckGraphs, Precision::kFp32),
      AtPrecision("cuda_model graphs", CheckGraphs, Precision::kBf16),
      AtPrecision("cuda_model", CheckModel, Precision::kFp32, /*dropout=*/true),
      AtPrecision("cuda_model", CheckModel, Precision::kBf16, /*dropout=*/true),
      AtPrecision("cuda_model", CheckModel, Precision::kFp16, /*dropout=*/true),
      AtPrecision("cuda_model graphs", CheckGraphs, Precision::kFp32, /*dropout=*/true),
      AtPrecision("cuda_model graphs", CheckGraphs, Precision::kBf16, /*dropout=*/true),
  };
  return *checks;
}

}  // namespace cuda
}  // namespace dgca
