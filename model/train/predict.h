// Decoding sentences with a trained model: the one prediction path the
// trainer's evaluation (model/train/trainer.cc) and `dgca correct`
// (model/train/corrector.h) share, so a corrected sentence is what the eval
// scored.
//
// Each example becomes a ReLM evaluation row (BuildBatch with no MFT, epoch
// 0, the candidates of the confusion set), `batch_size` rows per
// DgcaModel::Predict call, in order. The target side of an example is not
// read by Predict: a sentence to correct may carry its source there.
//
// Thread-safety: uses `model`, which is not thread-safe; one caller at a time.
#ifndef DGCA_MODEL_TRAIN_PREDICT_H_
#define DGCA_MODEL_TRAIN_PREDICT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/core/data.h"
#include "model/core/status.h"
#include "model/nn/model.h"

namespace dgca {

class ConfusionSet;

// The predicted ids of examples[0..n) (n = examples.size() when max_samples
// <= 0, else at most max_samples), one vector per example, each as long as
// the example's row (its source cut to MaxCharsForSeqLen(opts.seq_len,
// opts.prompt_length)). batch_size must not exceed the model's max_batch.
// INTERNAL when Predict returns another number of ids than target slots.
// `on_batch`, when set, is called before each batch with its index (0-based)
// and the number of batches (the trainer's eval reports it as progress).
StatusOr<std::vector<std::vector<int32_t>>> PredictExamples(
    DgcaModel* model, const std::vector<Example>& examples, const ConfusionSet* confusion,
    const BatchOptions& opts, int batch_size, int64_t max_samples = 0,
    const std::function<void(int64_t batch, int64_t batches)>& on_batch = nullptr);

// The evaluation metrics (model/core/eval_metrics.h) of `predictions` (as
// PredictExamples returns them) against examples' targets, each pair cut
// to its prediction's length.
std::map<std::string, double> ScorePredictions(const std::vector<Example>& examples,
                                               const std::vector<std::vector<int32_t>>& predictions);

}  // namespace dgca

#endif  // DGCA_MODEL_TRAIN_PREDICT_H_
