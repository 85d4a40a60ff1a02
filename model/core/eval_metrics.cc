#include "model/core/eval_metrics.h"

#include <algorithm>

namespace dgca {
namespace {

// Element i of v, or a value no token id takes when i is past the end, so a
// length mismatch counts as a difference instead of reading out of bounds.
int64_t At(const std::vector<int32_t>& v, size_t i) {
  return i < v.size() ? v[i] : -(int64_t{1} << 40);
}

double Ratio(long long num, long long den) { return den > 0 ? static_cast<double>(num) / den : 0.0; }

double F1(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0.0; }

}  // namespace

void CorrectionMetrics::Add(const std::vector<int32_t>& src, const std::vector<int32_t>& trg,
                            const std::vector<int32_t>& pred) {
  const size_t n = std::max({src.size(), trg.size(), pred.size()});
  bool positive = false, predicted = false, same_positions = true, exact = true;
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = At(src, i), t = At(trg, i), p = At(pred, i);
    const bool err = t != s, changed = p != s;
    positive |= err;
    predicted |= changed;
    if (err != changed) same_positions = false;
    if (p != t) exact = false;
    char_pos_ += err;
    char_pred_pos_ += changed;
    if (err && changed) {
      ++char_det_tp_;
      char_cor_tp_ += p == t;
    }
  }
  ++sent_total_;
  if (positive) {
    ++sent_pos_;
    sent_det_tp_ += same_positions;
    sent_cor_tp_ += exact;
  } else {
    ++sent_neg_;
    sent_fp_ += predicted;
  }
  sent_pred_pos_ += predicted;
}

std::map<std::string, double> CorrectionMetrics::Compute() const {
  std::map<std::string, double> m;
  auto put = [&m](const std::string& prefix, long long tp, long long pred, long long pos) {
    const double p = Ratio(tp, pred), r = Ratio(tp, pos);
    m[prefix + "_precision"] = p;
    m[prefix + "_recall"] = r;
    m[prefix + "_f1"] = F1(p, r);
  };
  put("sentence_detection", sent_det_tp_, sent_pred_pos_, sent_pos_);
  put("sentence_correction", sent_cor_tp_, sent_pred_pos_, sent_pos_);
  put("char_detection", char_det_tp_, char_pred_pos_, char_pos_);
  put("char_correction", char_cor_tp_, char_pred_pos_, char_pos_);
  m["false_positive_rate"] = Ratio(sent_fp_, sent_neg_);
  m["sentences"] = static_cast<double>(sent_total_);
  return m;
}

void CorrectionMetrics::Merge(const CorrectionMetrics& o) {
  sent_total_ += o.sent_total_;
  sent_pos_ += o.sent_pos_;
  sent_pred_pos_ += o.sent_pred_pos_;
  sent_det_tp_ += o.sent_det_tp_;
  sent_cor_tp_ += o.sent_cor_tp_;
  sent_neg_ += o.sent_neg_;
  sent_fp_ += o.sent_fp_;
  char_pos_ += o.char_pos_;
  char_pred_pos_ += o.char_pred_pos_;
  char_det_tp_ += o.char_det_tp_;
  char_cor_tp_ += o.char_cor_tp_;
}

}  // namespace dgca
