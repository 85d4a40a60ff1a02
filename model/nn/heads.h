// DgcaHeads: the DGCA-specific heads on the target slots of a ReLM batch —
// detector, candidate head, detection-guided gated fusion — and their losses
// (docs/model.md, "The DGCA-ReLM model"). The MLM head (logits z) and the encoder
// belong to the model; this class takes their outputs as raw pointers.
//
// Notation: T target slots, H hidden, V vocab, K = candidate_top_k.
//   h_t [H]   final hidden state at target slot t
//   z_t [V]   MLM logits at slot t;  p_t = softmax(z_t)
//   E   [V,H] word-embedding matrix (tied decoder); candidate scores use it
//   x_t, y_t  source / target ids; c_tk candidate ids (-1 = padding)
//
// Maths:
//   detector   e_t = w_d·h_t + b_d;  L_det = mean_t BCEWithLogits(e_t, [x_t != y_t])
//   candidate  a_t = W_c h_t + b_c;  u_t = LN(GELU(a_t))  (exact erf GELU,
//              LN eps = cfg.layer_norm_eps, gain/bias candidate.LayerNorm.*)
//              s_tk = u_t·E[c_tk] over REAL candidates (padding is excluded
//              from the softmax); q_t = softmax_k(s_t)
//              Q_t = Σ_{k: c_tk = y_t} q_tk  (duplicate ids are summed)
//              L_cand = mean over slots with y_t ∈ C_t of −log Q_t
//              (0 when no slot has y_t ∈ C_t)
//   gate       l_t = w_g·h_t + a·e_t + b_g  (no a·e_t term when the detector
//              is off);  g_t = σ(l_t)
//   fusion     P_t = (1−g_t)·p_t + g_t·Σ_k q_tk·onehot(c_tk): a dense softmax
//              row plus a sparse add at the K candidate ids; no V-sized
//              temporary per candidate is ever built.
//              L_fus = mean_t −log P_t[y_t], computed in log space:
//              log P = logaddexp(log(1−g)+log p_y, log g+log Q_y), with
//              log(1−g) = −softplus(l) and log p_y = z_y − logsumexp(z).
//              Exact, so no probability floor is needed (log Q_y = −inf when
//              y ∉ C_t, which logaddexp handles).
//   fusion none (cfg.fusion == kNone, or the candidate head is off, which
//              leaves nothing to fuse): L_fus = mean_t CE(softmax(z_t), y_t)
//              and Predict = argmax z_t, i.e. exactly ReLM. The detector and
//              candidate head still train when enabled (their losses are
//              added), but do not affect predictions.
//   total      L = L_fus + λ_det·L_det + λ_cand·L_cand (disabled terms are 0).
//
// Gradients (Backward), with w_A = (1−g)p_y/P, w_B = g·Q_y/P = 1 − w_A:
//   dz_t  = scale/T · w_A·(p_t − onehot(y_t))      (w_A = 1 for fusion none)
//   dl_t  = scale/T · (g·w_A − (1−g)·w_B)           -> w_g, b_g, a, h_t, e_t
//   de_t  = scale·λ_det/T·(σ(e_t) − [x_t≠y_t]) + a·dl_t -> w_d, b_d, h_t
//   ds_tk = (scale·w_B/T + scale·λ_cand/N_c·[y_t∈C_t]) · (q_tk − [c_tk=y_t]·q_tk/Q_t)
//           (0 for padding; the fusion part is 0 when y_t ∉ C_t)
//           -> u_t (Σ_k ds_tk E[c_tk]) and E rows c_tk (ds_tk u_t),
//           then through LN, GELU, W_c, b_c -> h_t.
//   So: dh gets detector, gate and candidate terms; dz gets the fusion
//   (or plain CE) term only; dE gets only candidate rows (the caller adds the
//   decoder's own dE from dz); every head parameter gets its gradient.
//
// Parameters (declared in this order; weight_decay in brackets). Only the
// enabled parts are declared:
//   detector:  detector.weight [H] [decay], detector.bias [1] [no decay]
//   candidate: candidate.dense.weight [H,H] (PyTorch [out,in]) [decay],
//              candidate.dense.bias [H], candidate.LayerNorm.weight [H],
//              candidate.LayerNorm.bias [H] [no decay]
//   gated fusion (candidate on): fusion.gate.weight [H] [decay],
//              fusion.gate.det_scale [1] (the a, detector on only) [decay],
//              fusion.gate.bias [1] [no decay]
//
// Usage: ctor(cfg, max_slots) -> Declare -> store->Finalize() -> Bind ->
// (optionally InitParams) -> per micro-batch Forward(...) then
// Backward(...). Buffers for max_slots slots are allocated once in Bind().
//
// Lifetime: Forward() keeps POINTERS to h, z and E (and copies the ids); they
// must stay valid and unchanged until Backward() returns. dz may alias z
// (Backward then overwrites the logits with their gradient, in place).
//
// Deterministic: fixed loop order; per-slot loops may run on set_threads()
// threads without changing any result; sgemm is OpenBLAS's when present.
// Thread-safety: not thread-safe; owned by one model.
#ifndef DGCA_MODEL_NN_HEADS_H_
#define DGCA_MODEL_NN_HEADS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/param_list.h"
#include "model/core/status.h"
#include "model/nn/params.h"

namespace dgca {

struct HeadLosses {
  double total = 0;      // fusion + λ_det·detector + λ_cand·candidate
  double fusion = 0;     // mean_t −log P_t[y_t] (plain CE when fusion is none)
  double detector = 0;   // mean_t BCE (unweighted); 0 when off
  double candidate = 0;  // mean over slots with y ∈ C of −log Q (unweighted); 0 when off
  int64_t slots = 0;            // T
  int64_t candidate_slots = 0;  // N_c: slots whose target is among their candidates
};

class DgcaHeads {
 public:
  // max_slots: the most target slots a Forward()/Predict() call may get.
  DgcaHeads(const ModelConfig& cfg, int max_slots);

  DgcaHeads(const DgcaHeads&) = delete;
  DgcaHeads& operator=(const DgcaHeads&) = delete;

  bool detector_enabled() const { return detector_; }
  bool candidate_enabled() const { return candidate_; }
  // True when P_t is the gated mixture (fusion gated AND candidate head on).
  bool gated() const { return gated_; }
  int max_slots() const { return max_slots_; }
  int top_k() const { return K_; }

  // Worker threads for the per-slot loops (OpenMP; ignored without it).
  // Results do not depend on the thread count: each slot is computed by one
  // thread and every sum over slots runs serially in slot order. Default 1.
  void set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }
  int threads() const { return threads_; }

  // Floats declared for `cfg`, in closed form: heads_test holds the
  // declared list (model/core/param_list.h) to it.
  static int64_t NumParams(const ModelConfig& cfg);

  // Declares the enabled tensors listed above.
  Status Declare(ParamStore* store);
  // After store->Finalize(): looks tensors up, checks shapes, keeps pointers,
  // allocates buffers for max_slots.
  Status Bind(ParamStore* store);
  // Optional init (deterministic in `seed`): matrices/vectors N(0, 0.02),
  // biases 0, LayerNorm gain 1, det_scale 1. Requires Bind().
  void InitParams(uint64_t seed);

  // Computes losses for T slots (0 <= T <= max_slots) and keeps what
  // Backward needs. h [T,H]; z [T,V]; E [V,H]; cand [T*K] (cand[t*K] is
  // x_t by convention, -1 = padding); x [T]; y [T]. Ids must be in [0, V)
  // (candidates may be -1); otherwise INVALID_ARGUMENT naming the slot.
  // V >= 1 is the row length of z and the row count of E.
  Status Forward(const float* h, const float* z, const float* E, const int32_t* cand,
                 const int32_t* x, const int32_t* y, int T, int V, HeadLosses* out);

  // Gradient of scale·(L_fus + λ_det·L_det + λ_cand·L_cand) for the last
  // Forward(): ADDS into dh [T,H]; WRITES all of dz [T,V] (dz may equal z);
  // ADDS into dE [V,H] (only candidate rows touched; nullptr allowed when
  // the candidate head is off) and into the head parameters' grads.
  void Backward(float scale, float* dh, float* dz, float* dE);

  // argmax_v P_t[v] per slot (argmax z_t for fusion none) into pred[T];
  // ties go to the smallest id. Overwrites the state kept by Forward()
  // (do not call Backward() after Predict() without a new Forward()).
  // Fails like Forward() on bad ids or sizes.
  Status Predict(const float* h, const float* z, const float* E, const int32_t* cand,
                 const int32_t* x, int T, int V, int32_t* pred);

 private:
  Status CheckInputs(const int32_t* cand, const int32_t* x, const int32_t* y, int T,
                     int V) const;
  // Detector logits, candidate head (a, GELU, LN -> u), candidate scores and
  // log-softmax, gate: everything except the z-dependent parts.
  void ForwardHeads(const float* h, const float* E, const int32_t* cand, int T);

  int H_, K_, V_cfg_;
  int max_slots_;
  int threads_ = 1;
  float eps_;
  bool detector_, candidate_, gated_;
  float lambda_det_, lambda_cand_;

  // ParamStore indices and pointers.
  ParamStore* store_ = nullptr;
  bool bound_ = false;
  HeadParams p_;

  // State of the last Forward().
  int T_ = 0, V_ = 0;
  const float* h_ = nullptr;
  const float* z_ = nullptr;
  const float* E_ = nullptr;
  std::vector<int32_t> cand_, y_, label_;  // label_ = [x != y]
  std::vector<float> e_;       // [T] detector logit
  std::vector<float> gl_;      // [T] gate logit
  std::vector<float> act_;     // [T,H] a = W_c h + b_c
  std::vector<float> gel_;     // [T,H] GELU(a)
  std::vector<float> nrm_;     // [T,H] (GELU(a) - mean) * rstd
  std::vector<float> rstd_;    // [T]
  std::vector<float> u_;       // [T,H] LN output
  std::vector<double> logq_;   // [T,K] log q (−inf for padding)
  std::vector<double> logQ_;   // [T] log Q_y (−inf when y ∉ C)
  std::vector<double> lse_;    // [T] logsumexp(z_t)
  std::vector<float> zmax_;    // [T] max_v z_t[v]
  std::vector<double> zsum_;   // [T] Σ_v exp(z_t[v] − zmax)
  std::vector<double> loss_t_; // [3T] per-slot fusion, detector, candidate loss
  std::vector<double> wA_;     // [T] (1-g) p_y / P  (1 for fusion none)
  std::vector<double> wB_;     // [T] g Q_y / P      (0 for fusion none)
  int64_t n_cand_ = 0;         // N_c of the last Forward()
  // Backward scratch.
  std::vector<float> dl_;      // [T] gate-logit grad
  std::vector<float> de_;      // [T] detector-logit grad
  std::vector<float> ds_;      // [T,K]
  std::vector<float> du_;      // [T,H]
  std::vector<float> da_;      // [T,H]
};

// The float exp of the V-wide softmax loops (Cephes polynomial, relative
// error < 3e-7 on [-87, 88], inputs clamped to that range); exposed for
// its test.
float HeadsExpF(float x);

}  // namespace dgca

#endif  // DGCA_MODEL_NN_HEADS_H_
