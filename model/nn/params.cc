#include "model/nn/params.h"

#include <algorithm>

namespace dgca {

int ParamStore::Declare(const std::string& name, std::vector<int64_t> shape,
                        bool weight_decay, bool follows_previous) {
  if (finalized_ || by_name_.count(name)) return -1;
  ParamInfo p;
  p.name = name;
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  // Aligned, unless it must follow the previous tensor (params.h).
  if (!follows_previous) total_ = (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  p.shape = std::move(shape);
  p.offset = total_;
  p.weight_decay = weight_decay;
  total_ += p.numel;
  count_ += p.numel;
  by_name_[name] = static_cast<int>(params_.size());
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

void ParamStore::Finalize() {
  if (finalized_) return;
  values_.assign(static_cast<size_t>(total_), 0.0f);
  grads_.assign(static_cast<size_t>(total_), 0.0f);
  finalized_ = true;
}

int ParamStore::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void ParamStore::ZeroGrads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Status ParamDeclarer::operator()(const std::string& name, std::vector<int64_t> shape, bool weight_decay,
                                 int* index, bool follows_previous) const {
  if (store_->finalized())
    return FailedPreconditionError(who_ + ": the ParamStore is already finalized (declaring " + name + ")");
  const int i = store_->Declare(name, std::move(shape), weight_decay, follows_previous);
  if (i < 0) return InvalidArgumentError(who_ + ": parameter " + name + " is declared twice");
  *index = i;
  return OkStatus();
}

Status ParamFinder::operator()(const std::string& name, const std::vector<int64_t>& shape, bool /*weight_decay*/,
                               int* index, bool /*follows_previous*/) const {
  const int i = store_.Find(name);
  if (i < 0) return NotFoundError(who_ + ": parameter " + name + " was not declared");
  if (store_.info(i).shape != shape)
    return InvalidArgumentError(who_ + ": parameter " + name + " has shape " + ShapeString(store_.info(i).shape) +
                                ", expected " + ShapeString(shape));
  *index = i;
  return OkStatus();
}

}  // namespace dgca
