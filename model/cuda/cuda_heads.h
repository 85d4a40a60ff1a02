// CudaHeads<T>: the GPU mirror of DgcaHeads (model/nn/heads.h) — detector,
// candidate head, detection-guided gated fusion and their losses — on
// device pointers, with the SAME maths, parameter names, loss composition
// and Forward/Backward/Predict contract as the CPU reference. Read heads.h
// for the maths; this header only states what differs.
//
// Checked against the CPU by heads_check.h on the CUDA emulator
// (model/cuda_emu, ctest) and on an H200 (docs/benchmarks.md).
//
// Precision: T (float, __nv_bfloat16 or __half) is the type of the activations the
// model hands over: h [T,H], z [T,V], E [V,H] and the gradients dh, dz.
// Everything inside the heads is fp32 (per-slot scalars in double where the
// CPU uses double): the candidate-head activations a, n, u, the scores,
// log q, the gate, the per-slot losses and every parameter gradient. Head
// weights are read from the fp32 master copy (DeviceParams::master), except
// candidate.dense.weight, which the cuBLASLt GEMMs read as
// DeviceParams::weight<T> (GEMM inputs must share one type), through an
// aligned copy made at each Forward/Predict (the flat buffers put the head
// tensors at odd offsets); for a 16-bit T the dense-layer gradient da is
// rounded to T for those GEMMs (fp32 accumulation, fp32 dW_c). dE is the
// fp32 gradient of the word embeddings
// (DeviceParams::grad), as every parameter gradient.
//
// The fused vocabulary path: no [T,V] tensor exists besides z (and dz,
// which may alias it). Forward runs one block per slot that reads z_t once
// for its max and once for Σ exp(z − max) (logsumexp), takes z_y, and
// finishes the slot's losses and fusion weights w_A, w_B in double on one
// thread. Backward runs one block per slot that recomputes softmax(z_t)
// from z_t and the saved max/sum and writes
//   dz_t = scale/T · w_A · (softmax(z_t) − onehot(y_t))
// (in place when dz == z: each element is read before it is written by the
// same thread).
//
// Losses: per-slot losses are reduced on the device in a fixed order (one
// block, fixed thread-to-slot assignment, fixed tree), so the numbers are
// bit-reproducible run to run (not bitwise equal to the CPU's serial sum).
// They live in a small device struct (device_losses()). Forward(..., out)
// with out != nullptr copies it to the host (ONE cudaMemcpyAsync of 48
// bytes into pinned memory + one stream synchronization); with
// out == nullptr Forward is fully asynchronous (no host sync, no
// allocation; the losses are read from device_losses() later). Backward reads N_c (the
// number of slots with y ∈ C) from that device struct, not from the host.
//
// Ids: the GPU version TRUSTS the ids (the caller validated them on the
// host before the upload, as DgcaHeads::CheckInputs does). Out-of-range ids
// never make a kernel read or write out of bounds: a candidate id outside
// [0, V) is treated as padding; a target id outside [0, V) gives that slot
// no one-hot term (its loss is then meaningless, but memory is safe). Host
// arguments (T, V, null pointers) are checked like the CPU version.
//
// Determinism: every kernel is bit-reproducible run to run. Sums over
// slots (parameter gradients) run in two fixed-order stages (chunks of 32
// slots, then the chunks in order). The one scatter with repeated rows,
// dE[c_tk] += ds_tk·u_t, sorts the (t, k) entries by id with a stable
// radix sort (CUB, part of the CUDA toolkit) and sums each id's run in
// (t, k) order, adding once per id, unless set_deterministic(false), which
// uses atomicAdd (order-dependent rounding).
//
// Usage: ctor(cfg, max_slots) -> Bind(layout, params, ctx, gemm) -> per
// micro-batch Forward(...) then Backward(...). All buffers for max_slots
// slots are allocated once in Bind(). The ParamStore layout is the one the
// CPU DgcaHeads declared into (DgcaHeads::Declare); Bind finds the same
// tensors by name and checks their shapes.
//
// Lifetime: Forward keeps POINTERS to h, z and E (they must stay valid and
// unchanged until Backward returns) and copies the ids into its own device
// buffers.
//
// Thread-safety: not thread-safe; one host thread, work ordered on the
// context's stream.
#ifndef DGCA_MODEL_CUDA_CUDA_HEADS_H_
#define DGCA_MODEL_CUDA_CUDA_HEADS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/core/config.h"
#include "model/core/status.h"
#include "model/cuda/cuda_context.h"
#include "model/cuda/device_params.h"
#include "model/cuda/gemm.h"
#include "model/nn/heads.h"
#include "model/nn/params.h"

namespace dgca {
namespace cuda {

// The device-side HeadLosses (same fields, fixed layout for the copy).
struct DeviceHeadLosses {
  double total;
  double fusion;
  double detector;
  double candidate;
  int64_t slots;
  int64_t candidate_slots;
};

template <typename T>
class CudaHeads {
 public:
  // max_slots: the most target slots a Forward()/Predict() call may get.
  CudaHeads(const ModelConfig& cfg, int max_slots);
  ~CudaHeads();
  CudaHeads(const CudaHeads&) = delete;
  CudaHeads& operator=(const CudaHeads&) = delete;

  bool detector_enabled() const { return detector_; }
  bool candidate_enabled() const { return candidate_; }
  bool gated() const { return gated_; }
  int max_slots() const { return max_slots_; }
  int top_k() const { return K_; }

  // dE scatter mode (see the header comment). Default true.
  void set_deterministic(bool d) { deterministic_ = d; }

  // `layout` must be finalized and hold the tensors DgcaHeads::Declare
  // declares for the same cfg; `params` is its GPU copy (with_half required
  // for T = bf16). None is owned; all must outlive this object. Allocates
  // every buffer. NOT_FOUND / INVALID_ARGUMENT like DgcaHeads::Bind;
  // FAILED_PRECONDITION for a missing bf16 copy; INTERNAL on CUDA errors.
  Status Bind(const ParamStore& layout, DeviceParams* params, const CudaContext* ctx,
              GemmRunner* gemm);

  // As DgcaHeads::Forward, all pointers on the device (cand [T*K], x [T],
  // y [T] int32). Enqueued on ctx->stream(). out: see "Losses" above
  // (nullptr = stay asynchronous, read device_losses()).
  Status Forward(const T* h, const T* z, const T* E, const int32_t* cand, const int32_t* x,
                 const int32_t* y, int T_slots, int V, HeadLosses* out);

  // As DgcaHeads::Backward: ADDS into dh [T,H] (type T) and dE [V,H] (fp32;
  // nullptr allowed when the candidate head is off) and into the head
  // parameters' fp32 grads in DeviceParams; WRITES all of dz [T,V] (dz may
  // equal z). Uses the state of the last Forward(). Enqueued; no host sync.
  Status Backward(float scale, T* dh, T* dz, float* dE);

  // As DgcaHeads::Predict: pred [T] (device int32) = argmax_v P_t[v]
  // (argmax z_t for fusion none), ties to the smallest id. Overwrites the
  // Forward state (no Backward after Predict without a new Forward).
  Status Predict(const T* h, const T* z, const T* E, const int32_t* cand, const int32_t* x,
                 int T_slots, int V, int32_t* pred);

  // The losses of the last Forward() on the device (valid once the stream
  // reaches that point).
  const DeviceHeadLosses* device_losses() const { return losses_.get(); }

  // Tests: fills every internal buffer with NaN / -1 bytes, so a kernel
  // that reads a value nobody wrote is caught. Synchronous.
  Status PoisonScratch();

 private:
  // The state Forward() leaves for Backward().
  void SetForwardInputs(const T* h, const T* z, const T* E, int T_slots, int V) {
    h_ = h;
    z_ = z;
    E_ = E;
    T_ = T_slots;
    V_ = V;
  }

  // The slot kernel over Tn slots (Tn > 0), after the candidate head's
  // dense layer where a head runs: per-slot loss terms (pred null: Forward,
  // every head on), or predictions into pred (Predict: the heads run only
  // when gated; fusion none predicts argmax z, as the CPU).
  Status SlotForward(const T* h, const T* z, const T* E, const int32_t* cand, const int32_t* x,
                     const int32_t* y, int Tn, int V, int32_t* pred);
  Status CheckHost(const void* cand, const void* x, const void* y, int slots, int V, bool need_y) const;

  int H_, K_;
  int max_slots_;
  float eps_;
  bool detector_, candidate_, gated_;
  float lambda_det_, lambda_cand_;
  bool deterministic_ = true;

  const ParamStore* layout_ = nullptr;
  DeviceParams* params_ = nullptr;
  const CudaContext* ctx_ = nullptr;
  GemmRunner* gemm_ = nullptr;
  bool bound_ = false;
  HeadParams p_;

  // State of the last Forward().
  int T_ = 0, V_ = 0;
  const T* h_ = nullptr;
  const T* z_ = nullptr;
  const T* E_ = nullptr;
  DeviceArray<int32_t> cand_, y_, label_;  // [T*K], [T], [T]
  DeviceArray<float> e_, gl_;              // [T] detector / gate logits
  DeviceArray<float> act_, nrm_, u_;       // [T,H] a (bias added), (g-mean)*rstd, LN out
  DeviceArray<float> rstd_;                // [T]
  DeviceArray<float> logq_;                // [T,K] log q (-inf padding)
  DeviceArray<float> logQ_;                // [T] log Q_y (-inf when y ∉ C)
  DeviceArray<float> zmax_, zsum_;         // [T] max_v z, Σ exp(z - max)
  DeviceArray<float> loss_t_;              // [3T] fusion, detector, candidate per slot
  DeviceArray<float> wA_, wB_;             // [T]
  DeviceArray<DeviceHeadLosses> losses_;   // [1]
  DeviceHeadLosses* host_losses_ = nullptr;  // pinned, [1]
  // Backward scratch.
  DeviceArray<float> dl_, de_;             // [T]
  DeviceArray<float> ds_;                  // [T,K]
  DeviceArray<float> du_, da_;             // [T,H]
  DeviceArray<T> da_t_;                    // [T,H] da in T for the GEMMs (bf16 only)
  DeviceArray<float> col_part_;            // [ceil(T/32), 5, H] column partial sums
  // Deterministic dE scatter: (id, t*K+k) pairs, stable radix sort, scratch.
  DeviceArray<int32_t> sort_keys_, sort_vals_, sort_keys_out_, sort_vals_out_;  // [T*K]
  DeviceArray<uint8_t> sort_temp_;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_CUDA_HEADS_H_
