#include "model/nn/batch_index.h"

#include <algorithm>
#include <string>

namespace dgca {
namespace {

std::string Where(const char* field, int64_t i, int L) {
  return std::string("batch.") + field + "[" + std::to_string(i) + "] (row " +
         std::to_string(L > 0 ? i / L : 0) + ", position " + std::to_string(L > 0 ? i % L : 0) +
         ")";
}

Status Bad(const std::string& m) { return InvalidArgumentError("DgcaModel: " + m); }

}  // namespace

int BatchIndex::MaxRows(const ModelConfig& cfg, int max_batch, int seq_len) {
  return max_batch * std::max(1, seq_len - 2 - 2 * cfg.prompt_length);
}

BatchIndex::BatchIndex(const ModelConfig& cfg, int max_batch, int seq_len)
    : cfg_(cfg),
      max_batch_(max_batch),
      seq_len_(seq_len),
      max_rows_(MaxRows(cfg, max_batch, seq_len)),
      heads_on_(cfg.detector || cfg.candidate) {
  const size_t N = static_cast<size_t>(std::max(0, max_batch)) * std::max(0, seq_len);
  types_.assign(N, 0);
  slots_.assign(N, -1);
  rows_.reserve(N);
  targets_.reserve(N);
  mark_.reserve(N);
}

Status BatchIndex::Check(const Batch& b, bool need_labels) {
  const int B = b.batch_size, L = b.seq_len;
  if (B < 0 || B > max_batch_)
    return Bad("batch_size " + std::to_string(B) + " outside [0, max_batch=" + std::to_string(max_batch_) + "]");
  if (L < 1 || L > seq_len_)
    return Bad("batch.seq_len " + std::to_string(L) + " outside [1, " + std::to_string(seq_len_) +
               "] (the model's seq_len)");
  const size_t N = static_cast<size_t>(B) * L;
  auto size_err = [&](const char* f, size_t got) {
    return Bad("batch." + std::string(f) + " has " + std::to_string(got) +
               " entries; expected batch_size*seq_len = " + std::to_string(N));
  };
  if (b.input_ids.size() != N) return size_err("input_ids", b.input_ids.size());
  if (b.attention_mask.size() != N) return size_err("attention_mask", b.attention_mask.size());
  if (!b.token_type_ids.empty() && b.token_type_ids.size() != N)
    return size_err("token_type_ids", b.token_type_ids.size());
  if (!b.prompt_slot.empty() && b.prompt_slot.size() != N) return size_err("prompt_slot", b.prompt_slot.size());
  if (!b.labels.empty() && b.labels.size() != N) return size_err("labels", b.labels.size());
  if (!b.mft_labels.empty() && b.mft_labels.size() != N) return size_err("mft_labels", b.mft_labels.size());
  const int V = cfg_.vocab_size, S = 2 * cfg_.prompt_length;
  for (size_t i = 0; i < N; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= V)
      return Bad(Where("input_ids", i, L) + " = " + std::to_string(b.input_ids[i]) +
                 " outside [0, vocab_size=" + std::to_string(V) + ")");
    const int32_t tt = b.token_type_ids.empty() ? 0 : b.token_type_ids[i];
    if (tt < 0 || tt >= cfg_.type_vocab)
      return Bad(Where("token_type_ids", i, L) + " = " + std::to_string(tt) + " outside [0, " +
                 std::to_string(cfg_.type_vocab) + ")");
    types_[i] = tt;
    const int32_t ps = b.prompt_slot.empty() ? -1 : b.prompt_slot[i];
    if (ps < -1 || ps >= S)
      return Bad(Where("prompt_slot", i, L) + " = " + std::to_string(ps) + "; valid is -1 or [0, 2P=" +
                 std::to_string(S) + ")");
    slots_[i] = ps;
    if (!b.mft_labels.empty() && b.mft_labels[i] != -100 && (b.mft_labels[i] < 0 || b.mft_labels[i] >= V))
      return Bad(Where("mft_labels", i, L) + " = " + std::to_string(b.mft_labels[i]) +
                 "; valid is -100 or [0, vocab_size)");
  }
  // Target slots first, then MFT positions; each position at most once.
  const int T = b.num_slots();
  rows_.clear();
  targets_.clear();
  mark_.assign(N, 0);
  if (!b.slot_target_id.empty() && b.slot_target_id.size() != static_cast<size_t>(T))
    return Bad("batch.slot_target_id has " + std::to_string(b.slot_target_id.size()) +
               " entries; expected one per slot (" + std::to_string(T) + ")");
  for (int t = 0; t < T; ++t) {
    const int32_t r = b.slot_index[t];
    if (r < 0 || static_cast<size_t>(r) >= N)
      return Bad("batch.slot_index[" + std::to_string(t) + "] = " + std::to_string(r) + " outside [0, " +
                 std::to_string(N) + ")");
    if (mark_[r]) return Bad("batch.slot_index[" + std::to_string(t) + "] repeats position " + std::to_string(r));
    mark_[r] = 1;
    rows_.push_back(r);
    const int32_t y = !b.slot_target_id.empty() ? b.slot_target_id[t] : !b.labels.empty() ? b.labels[r] : -100;
    if (need_labels && (y < 0 || y >= V))
      return Bad("target of slot " + std::to_string(t) + " (" + Where("labels", r, L) + ") = " +
                 std::to_string(y) + " outside [0, vocab_size=" + std::to_string(V) + ")");
    targets_.push_back(y);
  }
  if (heads_on_) {
    if (b.slot_source_id.size() != static_cast<size_t>(T))
      return Bad("batch.slot_source_id has " + std::to_string(b.slot_source_id.size()) +
                 " entries; the DGCA heads need one per slot (" + std::to_string(T) + ")");
    const int K = cfg_.candidate_top_k;
    if (cfg_.candidate && (b.top_k != K || b.candidates.size() != static_cast<size_t>(T) * K))
      return Bad("batch.candidates has " + std::to_string(b.candidates.size()) + " entries with top_k " +
                 std::to_string(b.top_k) + "; the model needs top_k " + std::to_string(K) +
                 " and slots*top_k = " + std::to_string(static_cast<int64_t>(T) * K));
    for (int t = 0; t < T; ++t)
      if (b.slot_source_id[t] < 0 || b.slot_source_id[t] >= V)
        return Bad("batch.slot_source_id[" + std::to_string(t) + "] = " + std::to_string(b.slot_source_id[t]) +
                   " outside [0, vocab_size=" + std::to_string(V) + ")");
    if (cfg_.candidate)
      for (size_t i = 0; i < b.candidates.size(); ++i)
        if (b.candidates[i] < -1 || b.candidates[i] >= V)
          return Bad("batch.candidates[" + std::to_string(i) + "] = " + std::to_string(b.candidates[i]) +
                     "; valid is -1 (padding) or [0, vocab_size=" + std::to_string(V) + ")");
  }
  if (!b.mft_labels.empty()) {
    for (size_t i = 0; i < N; ++i) {
      if (b.mft_labels[i] == -100) continue;
      if (mark_[i]) return Bad(Where("mft_labels", i, L) + " is set on a target slot");
      rows_.push_back(static_cast<int32_t>(i));
      targets_.push_back(b.mft_labels[i]);
    }
  }
  if (rows_.size() > static_cast<size_t>(max_rows_))
    return Bad(std::to_string(rows_.size()) + " labelled positions (target slots + MFT) exceed the model's limit of " +
               std::to_string(max_rows_) + " (max_batch * (seq_len - 2 - 2P))");
  return OkStatus();
}

int BatchIndex::TrimmedLength(const Batch& b, int multiple) const {
  const int B = b.batch_size, L = b.seq_len;
  int le = 1;
  for (int r = 0; r < B; ++r)
    for (int pos = L - 1; pos >= le; --pos)
      if (b.attention_mask[static_cast<size_t>(r) * L + pos] != 0) {
        le = pos + 1;
        break;
      }
  for (int32_t row : rows_) le = std::max(le, row % L + 1);
  if (multiple > 1) le = std::min(L, (le + multiple - 1) / multiple * multiple);
  return le;
}

}  // namespace dgca
