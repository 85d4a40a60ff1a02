// PromptEncoder: ReLM's (P-tuning) prompt encoder. It produces the 2P prompt
// embeddings [2P, H] that replace the word embeddings at the prompt slots of
// every row (batch.h: slot 0..P-1 after the first [CLS], P..2P-1 after the
// source). The output does not depend on the batch: run Forward() once per
// step, scatter the rows into each sequence, sum the gradients of all prompt
// positions of all rows into dout[2P, H], then Backward(dout) once.
//
// Kinds (ModelConfig::prompt_encoder), S = 2P, H = hidden:
//   lstm: Embedding(S, H) -> 2-layer bidirectional LSTM over the S positions
//         as ONE sequence (batch 1) -> Linear(2H, H) -> ReLU -> Linear(H, H).
//         Same maths and gate order (i, f, g, o) as PyTorch
//         nn.LSTM(H, H, num_layers=2, bidirectional=True, batch_first=True);
//         initial h and c are zero.
//   mlp:  Embedding(S, H) -> Linear(H, H) -> ReLU -> Linear(H, H).
//   none: no parameters; Forward() returns nullptr ("no prompt": the model
//         keeps the plain word embeddings of [CLS]/[SEP] at the prompt slots)
//         and Backward() does nothing.
//
// Parameter names (Declare order = forward order; weight_decay in brackets):
//   prompt.embedding.weight                 [S, H]      [decay]
//   lstm only, for k in {0, 1}, sfx in {"", "_reverse"} (PyTorch names):
//     prompt.lstm.weight_ih_l{k}{sfx}       [4H, in_k]  [decay]  in_0 = H, in_1 = 2H
//     prompt.lstm.weight_hh_l{k}{sfx}       [4H, H]     [decay]
//     prompt.lstm.bias_ih_l{k}{sfx}         [4H]        [no decay]
//     prompt.lstm.bias_hh_l{k}{sfx}         [4H]        [no decay]
//     declared in the order l0, l0_reverse, l1, l1_reverse, each as
//     weight_ih, weight_hh, bias_ih, bias_hh (PyTorch's state_dict order).
//   prompt.mlp.0.weight                     [H, 2H] (lstm) or [H, H] (mlp)  [decay]
//   prompt.mlp.0.bias                       [H]         [no decay]
//   prompt.mlp.2.weight                     [H, H]      [decay]
//   prompt.mlp.2.bias                       [H]         [no decay]
// Linear weights are [out, in] as in PyTorch: y = x W^T + b.
//
// Usage: ctor -> Declare(store) -> store->Finalize() -> Bind(store) ->
// (optionally InitParams) -> Forward() / Backward(dout) per step.
//
// All buffers are allocated once in Bind(). Results are deterministic for a
// given parameter state (fixed loop order; OpenBLAS sgemm when
// DGCA_HAVE_OPENBLAS, else plain loops).
//
// Thread-safety: not thread-safe; owned by one model.
#ifndef DGCA_MODEL_NN_PROMPT_ENCODER_H_
#define DGCA_MODEL_NN_PROMPT_ENCODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/core/param_list.h"
#include "model/core/status.h"
#include "model/nn/params.h"

namespace dgca {

class PromptEncoder {
 public:
  explicit PromptEncoder(const ModelConfig& cfg);

  PromptEncoder(const PromptEncoder&) = delete;
  PromptEncoder& operator=(const PromptEncoder&) = delete;

  PromptEncoderKind kind() const { return kind_; }
  int rows() const { return rows_; }      // S = 2P
  int hidden() const { return hidden_; }  // H
  bool enabled() const { return kind_ != PromptEncoderKind::kNone; }

  // Number of floats this encoder declares for `cfg` (0 for none), in
  // closed form: prompt_encoder_test holds the declared list
  // (model/core/param_list.h) to it.
  static int64_t NumParams(const ModelConfig& cfg);

  // Declares the tensors listed above. Fails if a name is already declared
  // or the store is finalized. kNone declares nothing.
  Status Declare(ParamStore* store);

  // After store->Finalize(): looks the tensors up by name, checks shapes,
  // keeps value/grad pointers and allocates the activation buffers.
  Status Bind(ParamStore* store);

  // Optional initialisation of this encoder's tensors as PyTorch's defaults
  // would do it: embedding N(0, 1); LSTM weights and biases
  // U(-1/sqrt(H), 1/sqrt(H)); Linear weights and biases
  // U(-1/sqrt(in), 1/sqrt(in)). Deterministic for `seed` (own splitmix64 RNG,
  // portable across standard libraries). The model may instead use its own
  // BERT-style init. Requires Bind().
  void InitParams(uint64_t seed);

  // Computes the prompt embeddings from the current parameter values and
  // keeps the activations Backward() needs. Returns [S, H], owned by the
  // encoder and valid until the next Forward(); nullptr for kNone or before
  // Bind().
  const float* Forward();

  // dout [S, H]: dLoss/d(Forward() output). ADDS into the gradients of every
  // parameter of this encoder (including the embedding). Uses the
  // activations of the last Forward(); the parameters must not have changed
  // since. No-op for kNone.
  void Backward(const float* dout);

 private:
  // One direction of one LSTM layer.
  struct LstmDir {
    int in = 0;  // input width
    const float* Wih = nullptr;  // [4H, in]
    const float* Whh = nullptr;  // [4H, H]
    const float* Bih = nullptr;  // [4H]
    const float* Bhh = nullptr;  // [4H]
    float* dWih = nullptr;
    float* dWhh = nullptr;
    float* dBih = nullptr;
    float* dBhh = nullptr;
    bool reverse = false;
    // Activations, [S, 4H] gates after their nonlinearity (i, f, g, o),
    // [S, H] cell state c_t and tanh(c_t). The hidden output h_t is written
    // straight into the layer output [S, 2H] (columns 0..H-1 forward,
    // H..2H-1 reverse).
    std::vector<float> gates, c, tanh_c;
  };

  void LstmDirForward(LstmDir* d, const float* x, float* out);
  // dout: [S, 2H] gradient of this layer's output; dx: [S, in] (ADDED).
  void LstmDirBackward(LstmDir* d, const float* x, const float* out,
                       const float* dout, float* dx);

  PromptEncoderKind kind_;
  int rows_;
  int hidden_;
  bool bound_ = false;

  PromptParams p_;
  ParamStore* store_ = nullptr;
  LstmDir dirs_[4];  // l0, l0_reverse, l1, l1_reverse

  // Activations.
  std::vector<float> out0_;   // [S, 2H] layer 0 output
  std::vector<float> out1_;   // [S, 2H] layer 1 output
  std::vector<float> hid_;    // [S, H]  mlp.0 output after ReLU
  std::vector<float> out_;    // [S, H]  final output
  // Backward scratch.
  std::vector<float> d_out1_, d_out0_, d_hid_;
  std::vector<float> dgates_, dh_, dc_;
};

}  // namespace dgca

#endif  // DGCA_MODEL_NN_PROMPT_ENCODER_H_
