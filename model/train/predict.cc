#include "model/train/predict.h"

#include <algorithm>

#include "model/core/confusion.h"
#include "model/core/eval_metrics.h"

namespace dgca {

StatusOr<std::vector<std::vector<int32_t>>> PredictExamples(DgcaModel* model,
                                                            const std::vector<Example>& examples,
                                                            const ConfusionSet* confusion,
                                                            const BatchOptions& opts, int batch_size,
                                                            int64_t max_samples,
                                                            const std::function<void(int64_t, int64_t)>& on_batch) {
  if (batch_size < 1) {
    return InvalidArgumentError("predict: batch size must be >= 1, got " + std::to_string(batch_size));
  }
  const int64_t n = max_samples > 0 ? std::min<int64_t>(max_samples, examples.size())
                                    : static_cast<int64_t>(examples.size());
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>(n));
  const int64_t batches = (n + batch_size - 1) / batch_size;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    if (on_batch) on_batch(begin / batch_size, batches);
    std::vector<int64_t> idx;
    for (int64_t i = begin; i < std::min<int64_t>(n, begin + batch_size); ++i) idx.push_back(i);
    Batch batch = BuildBatch(examples, idx, opts, confusion, /*mft=*/false, /*epoch=*/0);
    DGCA_ASSIGN_OR_RETURN(std::vector<int32_t> pred, model->Predict(batch));
    if (static_cast<int>(pred.size()) != batch.num_slots()) {
      return InternalError("predict: Predict returned " + std::to_string(pred.size()) +
                           " ids for " + std::to_string(batch.num_slots()) + " target slots");
    }
    size_t t = 0;
    for (int b = 0; b < batch.batch_size; ++b) {
      const size_t len = static_cast<size_t>(batch.row_length[b]);
      out.emplace_back(pred.begin() + t, pred.begin() + t + len);
      t += len;
    }
  }
  return out;
}

std::map<std::string, double> ScorePredictions(const std::vector<Example>& examples,
                                               const std::vector<std::vector<int32_t>>& predictions) {
  CorrectionMetrics metrics;
  for (size_t i = 0; i < predictions.size() && i < examples.size(); ++i) {
    const Example& ex = examples[i];
    const size_t len = predictions[i].size();
    std::vector<int32_t> src(ex.src.begin(), ex.src.begin() + std::min(len, ex.src.size()));
    std::vector<int32_t> trg(ex.trg.begin(), ex.trg.begin() + std::min(len, ex.trg.size()));
    metrics.Add(src, trg, predictions[i]);
  }
  return metrics.Compute();
}

}  // namespace dgca
