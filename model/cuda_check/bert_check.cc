// CudaBert<T> against dgca::Bert (bert_check.h). Run on the CUDA emulator
// and on an H200 (docs/benchmarks.md).
#include "model/cuda_check/bert_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "model/core/config.h"
#include "model/core/strings.h"
#include "model/cpu/ops.h"
#include "model/cuda_check/check_io.h"
#include "model/cuda/cuda_bert.h"
#include "model/cuda/device_params.h"
#include "model/nn/bert.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {
namespace {

using Rng = std::mt19937_64;
using Rows = std::vector<CheckRow>;
using bf16_t = __nv_bfloat16;



std::vector<float> RandVec(size_t n, Rng* rng, float lo, float hi, DType t) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = RoundTo(t, u(*rng));
  return v;
}

StatusOr<DeviceArray<int32_t>> UpI(const std::vector<int32_t>& v) {
  DeviceArray<int32_t> d;
  DGCA_RETURN_IF_ERROR(d.Upload(v));
  return d;
}

Status SyncDevice() { return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// One micro-step's inputs, ReLM-like: [CLS] prompt*P source ... prompt*P
// [SEP] with padding after a random length; prompt slots 0..P-1 at
// positions 1..P, P..2P-1 just before the last real token.
struct StepInput {
  int B = 0, L = 0, R = 0, extra_rows = 0;
  std::vector<int32_t> ids, types, slot, mask, rows;
  std::vector<float> dlogits, extra;
};

StepInput MakeStep(const ModelConfig& cfg, int B, int L, int R, Rng* rng, DType t) {
  StepInput in;
  in.B = B;
  in.L = L;
  in.R = R;
  in.extra_rows = R / 2;
  const int N = B * L, P = cfg.prompt_length;
  in.ids.assign(N, 0);
  in.types.assign(N, 0);
  in.slot.assign(N, -1);
  in.mask.assign(N, 0);
  std::uniform_int_distribution<int> id(5, cfg.vocab_size - 1);
  std::uniform_int_distribution<int> len_d(L / 2 + 1, L);
  for (int b = 0; b < B; ++b) {
    const int len = b == 0 ? L : len_d(*rng);  // row 0 unpadded, others padded
    for (int j = 0; j < L; ++j) {
      const int i = b * L + j;
      const bool real = j < len;
      in.mask[i] = real ? 1 : 0;
      in.ids[i] = real ? id(*rng) : 0;
      in.types[i] = real && j >= len / 2 ? 1 : 0;
      if (j >= 1 && j <= P) in.slot[i] = j - 1;
      const int second = len - 1 - P;  // first of the second group
      if (j >= second && j < len - 1) in.slot[i] = P + (j - second);
    }
  }
  std::vector<int32_t> all(N);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), *rng);
  in.rows.assign(all.begin(), all.begin() + R);  // distinct
  in.dlogits = RandVec(size_t(R) * cfg.vocab_size, rng, -0.05f, 0.05f, t);
  in.extra = RandVec(size_t(in.extra_rows) * cfg.hidden, rng, -0.05f, 0.05f, t);
  return in;
}

void AddRow(Rows* rows, const std::string& op, DType t, const std::vector<float>& got,
            const std::vector<float>& want, double tol) {
  rows->push_back(CheckRow{op, DTypeName(t), MaxRelErr(got, want), tol});
}

// fused_attention: the attention kernels CudaBert uses for 16-bit T
// (set_fused_attention); fp32 always runs the GEMM version.
template <typename T>
Status CheckBertWith(bool fused_attention, const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  const DType t = kDType<T>;
  const double tol = t == DType::kF32 ? kF32Tol : t == DType::kBF16 ? kBertBf16Tol : kBertF16Tol;
  ModelConfig cfg;
  cfg.vocab_size = 300;
  cfg.hidden = 64;
  cfg.layers = 2;
  cfg.heads = 4;
  cfg.ffn = 128;
  cfg.max_position = 64;
  cfg.type_vocab = 2;
  cfg.prompt_length = 2;
  const int max_batch = 3, seq_len = 24, max_rows = 16;
  const int H = cfg.hidden, V = cfg.vocab_size, S = 2 * cfg.prompt_length;

  // The CPU model, declared as DgcaModel declares it (no prompt encoder
  // tensors here: CudaBert looks its tensors up by name).
  ParamStore store;
  Bert bert(cfg, max_batch, seq_len, max_rows);
  DGCA_RETURN_IF_ERROR(bert.DeclareWordEmbeddings(&store));
  DGCA_RETURN_IF_ERROR(bert.DeclareBody(&store));
  DGCA_RETURN_IF_ERROR(bert.DeclareMlmHead(&store));
  store.Finalize();
  DGCA_RETURN_IF_ERROR(bert.Bind(&store));
  bert.InitParams((*rng)());
  // Redraw every value: BERT's init has zero biases and unit gains, which
  // would hide a dropped bias; weights large enough that attention is far
  // from uniform. Rounded to bf16 for the bf16 run (the reference then uses
  // the weights the GPU reads).
  for (int i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    float lo = -0.15f, hi = 0.15f;
    if (EndsWith(info.name, ".bias")) {
      lo = -0.1f; hi = 0.1f;
    } else if (EndsWith(info.name, "LayerNorm.weight")) {
      lo = 0.8f; hi = 1.2f;
    } else if (info.name.find("embeddings") != std::string::npos) {
      lo = -0.5f; hi = 0.5f;
    }
    const std::vector<float> v = RandVec(static_cast<size_t>(info.numel), rng, lo, hi, t);
    std::copy(v.begin(), v.end(), store.value(i));
  }
  store.ZeroGrads();

  DGCA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceParams> dparams, DeviceParams::Create(&store, t));
  DGCA_RETURN_IF_ERROR(dparams->Upload(store));
  CudaBert<T> gbert(cfg, max_batch, seq_len, max_rows);
  DGCA_RETURN_IF_ERROR(gbert.set_fused_attention(fused_attention));
  DGCA_RETURN_IF_ERROR(gbert.Bind(store, dparams.get(), &ctx, gemm));
  if (gbert.fused_attention() != (fused_attention && t != DType::kF32))
    return InternalError("cuda_bert check: CudaBert did not take the attention kernels asked for");

  const std::vector<float> prompt_rows = RandVec(size_t(S) * H, rng, -0.5f, 0.5f, t);
  DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_prompt_rows, UploadAs<T>(prompt_rows));
  std::vector<float> dprompt_cpu(size_t(S) * H, 0.0f);
  DeviceArray<float> d_dprompt;
  DGCA_RETURN_IF_ERROR(d_dprompt.Allocate(size_t(S) * H));
  DGCA_RETURN_IF_ERROR(d_dprompt.Zero());

  cpu::Context cc;
  const int shapes[2][3] = {{3, 24, 16}, {2, 19, 11}};  // B, L, R
  for (int step = 0; step < 2; ++step) {
    const StepInput in = MakeStep(cfg, shapes[step][0], shapes[step][1], shapes[step][2], rng, t);
    const int B = in.B, L = in.L, R = in.R, N = B * L;
    const std::string tag = " (step " + std::to_string(step + 1) + ", B=" + std::to_string(B) +
                            " L=" + std::to_string(L) + " R=" + std::to_string(R) + ")";

    // CPU reference.
    bert.EmbedForward(cc, in.ids.data(), in.types.data(), in.slot.data(), prompt_rows.data(), B, L);
    bert.EncoderForward(cc, in.mask.data(), B, L);
    const std::vector<float> want_hidden(bert.hidden(), bert.hidden() + size_t(N) * H);
    const float* lg = bert.MlmHeadForward(cc, in.rows.data(), R);
    const std::vector<float> want_logits(lg, lg + size_t(R) * V);
    const std::vector<float> want_gathered(bert.gathered(), bert.gathered() + size_t(R) * H);
    bert.MlmHeadBackward(cc, in.dlogits.data(), in.extra.data(), in.extra_rows);
    bert.EncoderBackward(cc, [](int) {});
    bert.EmbedBackward(cc, dprompt_cpu.data());

    // GPU, every activation poisoned first.
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> d_ids, UpI(in.ids));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> d_types, UpI(in.types));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> d_slot, UpI(in.slot));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> d_mask, UpI(in.mask));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<int32_t> d_rows, UpI(in.rows));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_dlogits, UploadAs<T>(in.dlogits));
    DGCA_ASSIGN_OR_RETURN(DeviceArray<T> d_extra, UploadAs<T>(in.extra));
    DGCA_RETURN_IF_ERROR(gbert.PoisonActivations());
    DGCA_RETURN_IF_ERROR(SyncDevice());  // uploads ran on the legacy stream
    DGCA_RETURN_IF_ERROR(gbert.EmbedForward(d_ids.get(), d_types.get(), d_slot.get(), d_prompt_rows.get(), B, L));
    DGCA_RETURN_IF_ERROR(gbert.EncoderForward(d_mask.get(), B, L));
    DGCA_ASSIGN_OR_RETURN(T * g_logits, gbert.MlmHeadForward(d_rows.get(), R));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    DGCA_ASSIGN_OR_RETURN(std::vector<float> got_hidden, DownloadAsFloat<T>(gbert.hidden(), size_t(N) * H));
    DGCA_ASSIGN_OR_RETURN(std::vector<float> got_logits, DownloadAsFloat<T>(g_logits, size_t(R) * V));
    DGCA_ASSIGN_OR_RETURN(std::vector<float> got_gathered, DownloadAsFloat<T>(gbert.gathered(), size_t(R) * H));
    AddRow(rows, "bert.hidden" + tag, t, got_hidden, want_hidden, tol);
    AddRow(rows, "bert.gathered" + tag, t, got_gathered, want_gathered, tol);
    AddRow(rows, "bert.logits" + tag, t, got_logits, want_logits, tol);

    // Step 1 passes a separate dlogits buffer; step 2 writes dlogits into
    // the logits buffer (the usual use: dlogits may alias the logits).
    const T* dlogits = d_dlogits.get();
    if (step == 1) {
      DGCA_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(g_logits, d_dlogits.get(), sizeof(T) * size_t(R) * V, cudaMemcpyDeviceToDevice),
          "dlogits into the logits buffer"));
      DGCA_RETURN_IF_ERROR(SyncDevice());
      dlogits = g_logits;
    }
    DGCA_RETURN_IF_ERROR(gbert.MlmHeadBackward(dlogits, d_extra.get(), in.extra_rows));
    std::vector<int> order;
    DGCA_RETURN_IF_ERROR(gbert.EncoderBackward([&order](int l) { order.push_back(l); }));
    DGCA_RETURN_IF_ERROR(gbert.EmbedBackward(d_dprompt.get()));
    DGCA_RETURN_IF_ERROR(ctx.Synchronize());
    bool order_ok = static_cast<int>(order.size()) == cfg.layers;
    for (size_t k = 0; order_ok && k < order.size(); ++k) order_ok = order[k] == cfg.layers - 1 - int(k);
    rows->push_back(CheckRow{"bert.on_layer called last to first" + tag, DTypeName(t),
                             order_ok ? 0.0 : std::numeric_limits<double>::infinity(), 0.0});
  }

  // Gradients after both steps (both sides ADD).
  ParamStore gpu = store;  // same layout; grads overwritten by the download
  DGCA_RETURN_IF_ERROR(dparams->DownloadGrads(&gpu));
  for (int i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    if (EndsWith(info.name, "attention.self.key.bias") || EndsWith(info.name, "attention.self.value.bias"))
      continue;  // compared with the query bias as one [3H] block
    int64_t n = info.numel;
    std::string name = info.name;
    if (EndsWith(name, "attention.self.query.bias")) {
      n = 3 * int64_t(H);
      name = name.substr(0, name.size() - std::string("query.bias").size()) + "{query,key,value}.bias";
    }
    const std::vector<float> want(store.grad(i), store.grad(i) + n);
    const std::vector<float> got(gpu.grad(i), gpu.grad(i) + n);
    AddRow(rows, "bert.grad " + name, t, got, want, tol);
  }
  DGCA_ASSIGN_OR_RETURN(std::vector<float> got_dprompt, DownloadAsFloat<float>(d_dprompt.get(), size_t(S) * H));
  AddRow(rows, "bert.dprompt (ADDED over 2 steps)", t, got_dprompt, dprompt_cpu, tol);
  return OkStatus();
}

}  // namespace

// The rows of a 16-bit run say which attention kernels ran.
template <typename T, bool kFusedAttention>
Status CheckBert(const CudaContext& ctx, GemmRunner* gemm, Rng* rng, Rows* rows) {
  const size_t first = rows->size();
  Status s = CheckBertWith<T>(kFusedAttention, ctx, gemm, rng, rows);
  if (kDType<T> != DType::kF32)
    for (size_t i = first; i < rows->size(); ++i) (*rows)[i].op += kFusedAttention ? " [fused attn]" : " [GEMM attn]";
  return s;
}

const std::vector<OpCheck>& BertChecks() {
  static const std::vector<OpCheck>* checks = new std::vector<OpCheck>{
      OpCheck{"cuda_bert fp32", CheckBert<float, false>},
      OpCheck{"cuda_bert bf16 (fused attention)", CheckBert<bf16_t, true>},
      OpCheck{"cuda_bert fp16 (fused attention)", CheckBert<__half, true>},
      OpCheck{"cuda_bert bf16 (GEMM attention)", CheckBert<bf16_t, false>},
      OpCheck{"cuda_bert fp16 (GEMM attention)", CheckBert<__half, false>},
  };
  return *checks;
}

}  // namespace cuda
}  // namespace dgca
