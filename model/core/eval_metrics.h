// Spelling-correction metrics on decoded sentences (docs/model.md, "Evaluation metrics").
// Source s, target t, prediction p, same length (characters).
//
// Sentence level: a sentence is positive if s != t. Detection TP: positive
// and the set of positions where p != s equals the set where t != s.
// Correction TP: positive and p == t. Predicted positive: p != s.
// P = TP / predicted positives, R = TP / positives, F1 = 2PR/(P+R) (0 when
// undefined). Character level: the same over error positions (detection: a
// position with p != s that is an error position; correction: also p == t).
// false_positive_rate: share of correct sentences (s == t) with p != s.
//
// Metric names (keys of the map): sentence_detection_{precision,recall,f1},
// sentence_correction_{precision,recall,f1}, char_detection_{...},
// char_correction_{...}, false_positive_rate, sentences.
#ifndef DGCA_MODEL_CORE_EVAL_METRICS_H_
#define DGCA_MODEL_CORE_EVAL_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dgca {

class CorrectionMetrics {
 public:
  // Sequences of token ids (or chars mapped to ids), equal lengths.
  void Add(const std::vector<int32_t>& src, const std::vector<int32_t>& trg,
           const std::vector<int32_t>& pred);
  std::map<std::string, double> Compute() const;
  void Merge(const CorrectionMetrics& other);

 private:
  // counts...
  long long sent_total_ = 0, sent_pos_ = 0, sent_pred_pos_ = 0;
  long long sent_det_tp_ = 0, sent_cor_tp_ = 0, sent_neg_ = 0, sent_fp_ = 0;
  long long char_pos_ = 0, char_pred_pos_ = 0, char_det_tp_ = 0, char_cor_tp_ = 0;
};

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_EVAL_METRICS_H_
