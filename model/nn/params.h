// ParamStore: every trainable tensor of the model, with its gradient, in two
// flat float buffers (values and gradients share one layout).
//
// Two phases: modules Declare() their tensors (name, shape, weight decay or
// not), then Finalize() allocates both buffers once; after that Get() gives
// stable pointers. Declaration order is the forward order of the network;
// data-parallel buckets walk it in reverse (the order backward produces
// gradients), and because the buffer is flat a bucket is a contiguous slice.
//
// Alignment: each tensor starts at a multiple of kAlignFloats floats (32
// bytes of fp32; 16 bytes of a bf16/fp16 copy in the same layout, what
// cuBLASLt's tensor-core kernels and 16-byte vector loads want), except one
// declared with follows_previous, which starts where the one before it
// ends: the fused QKV GEMM reads query, key and value as one [3H, H] weight
// and one [3H] bias, so key and value follow query. The gaps hold zeros and stay zero (no
// gradient reaches them, and AdamW keeps a zero weight with a zero gradient
// at zero), so whole-buffer operations (all-reduce, gradient norm, AdamW
// over a slice) may include them. total_numel() counts them;
// parameter_count() does not.
//
// Names follow Hugging Face BertForMaskedLM ("bert.encoder.layer.0.attention
// .self.query.weight", ...) so HF checkpoints load; DGCA-only tensors use
// their own prefixes ("prompt.", "detector.", "candidate.", "fusion.").
//
// Thread-safety: not thread-safe; owned by one model.
#ifndef DGCA_MODEL_NN_PARAMS_H_
#define DGCA_MODEL_NN_PARAMS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/core/status.h"

namespace dgca {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;   // into the flat buffers, in floats
  int64_t numel = 0;
  bool weight_decay = true;  // false for biases and LayerNorm
};

class ParamStore {
 public:
  // Returns the index of the new tensor. Duplicate names are a programming
  // error and return -1.
  // follows_previous: start where the previous tensor ends (no alignment).
  int Declare(const std::string& name, std::vector<int64_t> shape, bool weight_decay,
              bool follows_previous = false);
  // Allocates values (zeroed) and gradients (zeroed). Declare() after this
  // returns -1.
  void Finalize();
  bool finalized() const { return finalized_; }

  int size() const { return static_cast<int>(params_.size()); }
  const ParamInfo& info(int i) const { return params_[i]; }
  int Find(const std::string& name) const;  // -1 when absent

  float* value(int i) { return values_.data() + params_[i].offset; }
  const float* value(int i) const { return values_.data() + params_[i].offset; }
  float* grad(int i) { return grads_.data() + params_[i].offset; }
  const float* grad(int i) const { return grads_.data() + params_[i].offset; }

  float* values() { return values_.data(); }
  const float* values() const { return values_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // Floats in each flat buffer (the tensors and the alignment gaps).
  int64_t total_numel() const { return total_; }
  // The model's parameters: the sum of the tensors' numel.
  int64_t parameter_count() const { return count_; }
  static constexpr int64_t kAlignFloats = 8;

  void ZeroGrads();

 private:
  std::vector<ParamInfo> params_;
  std::map<std::string, int> by_name_;
  std::vector<float> values_;
  std::vector<float> grads_;
  int64_t total_ = 0;
  int64_t count_ = 0;
  bool finalized_ = false;
};

// The callbacks the model's modules (Bert, PromptEncoder, DgcaHeads and
// their CUDA versions) pass to the ForEach lists of model/core/param_list.h:
// fn(name, shape, weight_decay, &index) declares each parameter
// (ParamDeclarer) or finds it (ParamFinder), with failures as a Status that
// names the module (`who`, e.g. "DgcaHeads::Declare") and the parameter.
// Not owning; the store must outlive them.
class ParamDeclarer {
 public:
  ParamDeclarer(ParamStore* store, std::string who) : store_(store), who_(std::move(who)) {}
  // Declare() into *index: FAILED_PRECONDITION once the store is finalized,
  // INVALID_ARGUMENT for a name already declared.
  Status operator()(const std::string& name, std::vector<int64_t> shape, bool weight_decay,
                    int* index, bool follows_previous = false) const;

 private:
  ParamStore* store_;
  std::string who_;
};

class ParamFinder {
 public:
  ParamFinder(const ParamStore& store, std::string who) : store_(store), who_(std::move(who)) {}
  // The index of a declared parameter, checked against the shape the
  // caller's config needs (weight_decay is the list's, not checked):
  // NOT_FOUND "<who>: parameter <name> was not declared", INVALID_ARGUMENT
  // "<who>: parameter <name> has shape [a, b], expected [c, d]".
  Status operator()(const std::string& name, const std::vector<int64_t>& shape, bool weight_decay,
                    int* index, bool follows_previous = false) const;

 private:
  const ParamStore& store_;
  std::string who_;
};

// "[a, b]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace dgca

#endif  // DGCA_MODEL_NN_PARAMS_H_
