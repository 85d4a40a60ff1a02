#include "model/nn/params.h"

#include <algorithm>

namespace dgca {

int ParamStore::Declare(const std::string& name, std::vector<int64_t> shape,
                        bool weight_decay) {
  if (finalized_ || by_name_.count(name)) return -1;
  ParamInfo p;
  p.name = name;
  p.numel = 1;
  for (int64_t d : shape) p.numel *= d;
  p.shape = std::move(shape);
  p.offset = total_;
  p.weight_decay = weight_decay;
  total_ += p.numel;
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

}  // namespace dgca
