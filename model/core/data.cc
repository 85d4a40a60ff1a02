#include "model/core/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "model/core/confusion.h"
#include "model/core/files.h"
#include "model/core/rng.h"
#include "model/core/tokenizer.h"
#include "model/core/utf8.h"
#include "model/core/mutex.h"

namespace dgca {

// ---------------------------------------------------------------- reading

Status CheckDataFile(const std::string& path) {
  return CheckInputFile(path, "data file",
                        "a readable regular file of lines 'src<TAB>trg' of at most " +
                            std::to_string(kMaxDataFileBytes >> 30) +
                            " GiB, which the loader holds in memory",
                        kMaxDataFileBytes);
}

StatusOr<std::vector<Example>> ReadEcspell(const std::string& path, const Vocab& vocab,
                                           ReadStats* stats) {
  return ReadEcspell(path, vocab, 0, stats);
}

StatusOr<std::vector<Example>> ReadEcspell(const std::string& path, const Vocab& vocab,
                                           int max_chars, ReadStats* stats) {
  ReadStats local;
  ReadStats& st = stats != nullptr ? *stats : local;
  st = ReadStats();
  // A FIFO would block the rank for ever and a device such as /dev/zero
  // grows it until the OOM killer ends it: only regular files, checked
  // before opening (opening a FIFO blocks).
  if (Status s = CheckDataFile(path); !s.ok()) return s;
  struct stat file_st {};
  if (stat(path.c_str(), &file_st) != 0) return NotFoundError(path + ": does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open data file");
  // Bounded even if the file grows while it is read.
  std::string text(std::min<uint64_t>(kMaxDataFileBytes + 1,
                                      static_cast<uint64_t>(std::max<off_t>(file_st.st_size, 0))),
                   '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  if (text.empty()) {
    return InvalidArgumentError(path + ": empty data file (expected lines 'src<TAB>trg', "
                                "characters separated by single spaces)");
  }
  const size_t bad = FindInvalidUtf8(text);
  if (bad != std::string_view::npos) {
    const size_t nl = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
    const int64_t line = 1 + std::count(text.begin(), text.begin() + bad, '\n');
    return InvalidArgumentError(path + ":" + std::to_string(line) + ":" +
                                std::to_string(bad - line_start + 1) +
                                ": invalid UTF-8 (column in bytes); the data must be UTF-8 text");
  }

  std::vector<Example> out;
  std::vector<std::string> src_chars, trg_chars;
  auto split = [](std::string_view s, std::vector<std::string>* chars) {
    chars->clear();
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && s[i] == ' ') ++i;
      size_t j = i;
      while (j < s.size() && s[j] != ' ') ++j;
      if (j > i) chars->emplace_back(s.substr(i, j - i));
      i = j;
    }
  };
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_no;
    ++st.lines;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      ++st.skipped_empty;
      continue;
    }
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) +
                                  ": no TAB between source and target (expected 'src<TAB>trg', "
                                  "characters separated by single spaces)");
    }
    const size_t tab2 = line.find('\t', tab + 1);
    if (tab2 != std::string_view::npos) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) + ":" +
                                  std::to_string(tab2 + 1) +
                                  ": more than one TAB (expected exactly 'src<TAB>trg')");
    }
    split(line.substr(0, tab), &src_chars);
    split(line.substr(tab + 1), &trg_chars);
    if (src_chars.size() != trg_chars.size()) {
      ++st.skipped_unequal;
      continue;
    }
    if (src_chars.empty()) {
      ++st.skipped_empty;
      continue;
    }
    if (max_chars > 0 && static_cast<int>(src_chars.size()) > max_chars) {
      src_chars.resize(max_chars);
      trg_chars.resize(max_chars);
      ++st.truncated;
    }
    Example ex;
    ex.src.reserve(src_chars.size());
    ex.trg.reserve(trg_chars.size());
    for (const auto& c : src_chars) ex.src.push_back(vocab.Lookup(c));
    for (const auto& c : trg_chars) ex.trg.push_back(vocab.Lookup(c));
    ex.src_chars = src_chars;
    ex.trg_chars = trg_chars;
    out.push_back(std::move(ex));
  }
  st.kept = static_cast<int64_t>(out.size());
  if (out.empty()) {
    return InvalidArgumentError(path + ": no usable sentence pairs (" + std::to_string(st.lines) +
                                " lines, " + std::to_string(st.skipped_unequal) +
                                " with unequal lengths, " + std::to_string(st.skipped_empty) +
                                " empty)");
  }
  return out;
}

int MaxCharsForSeqLen(int max_seq_len, int prompt_length) {
  return std::max(0, (max_seq_len - 2 - 2 * prompt_length) / 2);
}

void SetSpecialTokens(const Vocab& vocab, BatchOptions* options) {
  options->pad_id = vocab.pad_id();
  options->cls_id = vocab.cls_id();
  options->sep_id = vocab.sep_id();
  options->mask_id = vocab.mask_id();
  auto table = std::make_shared<std::vector<uint8_t>>(vocab.size(), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) (*table)[id] = vocab.IsSpecial(id) ? 1 : 0;
  options->special = std::move(table);
}

// ---------------------------------------------------------------- batches

namespace {

constexpr uint64_t kMftStream = 0x4D46545F4D41534Bull;   // "MFT_MASK"
constexpr uint64_t kShuffleStream = 0x53485546464C4521ull;  // "SHUFFLE!"
constexpr uint64_t kDropoutStream = 0x44524F504F555421ull;  // "DROPOUT!"

// Characters of `ex` that fit (defensive against src/trg of different sizes,
// which the loader reports as an error before building).
int RowChars(const Example& ex, int max_chars) {
  return static_cast<int>(std::min<size_t>(std::min(ex.src.size(), ex.trg.size()),
                                           static_cast<size_t>(max_chars)));
}

// epochs: per-row epoch, or null to use `epoch` for every row.
Batch BuildBatchRows(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                     const BatchOptions& o, const ConfusionSet* confusion, bool mft,
                     int64_t epoch, const int64_t* epochs) {
  Batch b;
  const int B = static_cast<int>(indices.size());
  const int L = o.seq_len;
  const int P = o.prompt_length;
  const int K = std::max(0, o.top_k);
  const int max_chars = MaxCharsForSeqLen(L, P);
  b.batch_size = B;
  b.seq_len = L;
  b.top_k = K;
  const size_t BL = static_cast<size_t>(B) * L;
  b.input_ids.assign(BL, o.pad_id);
  b.attention_mask.assign(BL, 0);
  b.token_type_ids.assign(BL, 0);
  b.prompt_slot.assign(BL, -1);
  b.labels.assign(BL, -100);
  b.mft_labels.assign(BL, -100);
  b.row_length.resize(B);
  b.sample_index.resize(B);
  b.dropout_keys.resize(B);

  // Total target slots, to size the per-slot arrays once.
  int64_t T = 0;
  for (int r = 0; r < B; ++r) {
    T += RowChars(examples[indices[r]], max_chars);
  }
  b.slot_index.resize(T);
  b.slot_source_id.resize(T);
  b.slot_target_id.resize(T);
  b.candidates.assign(static_cast<size_t>(T) * K, -1);

  const bool do_mft = mft && o.mft_mode == MftMode::kNoError && o.mft_rate > 0.0f;
  // P(mask) = rate: compare a uniform 64-bit draw against rate * 2^64.
  const bool mask_all = o.mft_rate >= 1.0f;
  const uint64_t threshold =
      mask_all ? ~uint64_t{0}
               : static_cast<uint64_t>(static_cast<long double>(o.mft_rate) * 18446744073709551616.0L);
  const uint8_t* special = o.special ? o.special->data() : nullptr;
  const int64_t special_n = o.special ? static_cast<int64_t>(o.special->size()) : 0;
  auto is_special = [&](int32_t id) {
    if (special != nullptr) return id < 0 || (id < special_n && special[id] != 0);
    return id < kNumReservedIds;
  };

  int64_t t = 0;
  for (int r = 0; r < B; ++r) {
    const int64_t idx = indices[r];
    const Example& ex = examples[idx];
    const int n = RowChars(ex, max_chars);
    b.row_length[r] = n;
    b.sample_index[r] = idx;
    b.dropout_keys[r] = MixSeed(o.seed, static_cast<uint64_t>(epochs ? epochs[r] : epoch),
                                static_cast<uint64_t>(idx), kDropoutStream);
    const size_t row = static_cast<size_t>(r) * L;
    int32_t* ids = b.input_ids.data() + row;
    int32_t* slot = b.prompt_slot.data() + row;
    int32_t* lab = b.labels.data() + row;
    int32_t* mlab = b.mft_labels.data() + row;
    const int used = 2 * P + 2 * n + 2;  // <= L by the max_chars bound
    std::fill(b.attention_mask.begin() + row, b.attention_mask.begin() + row + std::min(used, L), 1);
    if (used > L) continue;  // seq_len below 2P+2: precondition broken, row left padded
    ids[0] = o.cls_id;
    for (int p = 0; p < P; ++p) {
      ids[1 + p] = o.cls_id;
      slot[1 + p] = p;
      ids[P + n + 1 + p] = o.sep_id;
      slot[P + n + 1 + p] = P + p;
    }
    std::copy(ex.src.begin(), ex.src.begin() + n, ids + P + 1);
    const int tgt0 = 2 * P + n + 1;
    std::fill(ids + tgt0, ids + tgt0 + n, o.mask_id);
    std::copy(ex.trg.begin(), ex.trg.begin() + n, lab + tgt0);
    ids[2 * P + 2 * n + 1] = o.sep_id;

    if (do_mft) {
      // One draw per source position, from a stream keyed by (seed, epoch,
      // sample): independent of batch composition, thread and world size.
      SplitMix64 rng(MixSeed(o.seed, static_cast<uint64_t>(epochs ? epochs[r] : epoch),
                             static_cast<uint64_t>(idx), kMftStream));
      for (int i = 0; i < n; ++i) {
        const uint64_t u = rng.Next();
        const int32_t x = ex.src[i];
        if (x == ex.trg[i] && !is_special(x) && (mask_all || u < threshold)) {
          ids[P + 1 + i] = o.mask_id;
          mlab[P + 1 + i] = x;
        }
      }
    }

    for (int i = 0; i < n; ++i, ++t) {
      b.slot_index[t] = static_cast<int32_t>(row + tgt0 + i);
      b.slot_source_id[t] = ex.src[i];
      b.slot_target_id[t] = ex.trg[i];
      if (K > 0) {
        int32_t* c = b.candidates.data() + static_cast<size_t>(t) * K;
        c[0] = ex.src[i];
        if (confusion != nullptr && K > 1) {
          int m;
          const int32_t* list = confusion->Candidates(ex.src[i], &m);
          // Lists hold no duplicates and never the key (ConfusionSet's
          // invariant), so a straight copy keeps C_i duplicate-free.
          std::copy(list, list + std::min(m, K - 1), c + 1);
        }
      }
    }
  }
  return b;
}

}  // namespace

Batch BuildBatch(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                 const BatchOptions& options, const ConfusionSet* confusion, bool mft,
                 int64_t epoch) {
  return BuildBatchRows(examples, indices, options, confusion, mft, epoch, nullptr);
}

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(epoch), kShuffleStream));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.NextBelow(static_cast<uint64_t>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

namespace {

// Keeps the permutations of the last two epochs touched (a micro-batch spans
// at most a few epochs; the stream moves forward).
class PermutationCache {
 public:
  PermutationCache(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  const std::vector<int64_t>& Get(int64_t epoch) {
    auto it = cache_.find(epoch);
    if (it != cache_.end()) return it->second;
    if (cache_.size() >= 2) cache_.erase(cache_.begin());
    return cache_.emplace(epoch, EpochPermutation(n_, seed_, epoch)).first->second;
  }

 private:
  int64_t n_;
  uint64_t seed_;
  std::map<int64_t, std::vector<int64_t>> cache_;
};

void MicroBatchRefs(int64_t n, const LoaderOptions& o, int64_t step, int micro_step,
                    PermutationCache* cache, std::vector<int64_t>* indices,
                    std::vector<int64_t>* epochs) {
  const int64_t G = static_cast<int64_t>(o.micro_batch) * o.accumulation * o.world_size;
  const int64_t base =
      step * G + (static_cast<int64_t>(micro_step) * o.world_size + o.rank) * o.micro_batch;
  indices->resize(o.micro_batch);
  epochs->resize(o.micro_batch);
  for (int j = 0; j < o.micro_batch; ++j) {
    const int64_t p = base + j;
    const int64_t e = p / n;
    (*epochs)[j] = e;
    (*indices)[j] = cache->Get(e)[p % n];
  }
}

}  // namespace

std::vector<SampleRef> MicroBatchSamples(int64_t num_examples, const LoaderOptions& options,
                                         int64_t step, int micro_step) {
  std::vector<SampleRef> out;
  if (num_examples <= 0) return out;
  PermutationCache cache(num_examples, options.batch.seed);
  std::vector<int64_t> idx, ep;
  MicroBatchRefs(num_examples, options, step, micro_step, &cache, &idx, &ep);
  for (size_t j = 0; j < idx.size(); ++j) out.push_back(SampleRef{ep[j], idx[j]});
  return out;
}

// ---------------------------------------------------------------- loader

namespace {

class BackgroundLoader : public DataLoader {
 public:
  BackgroundLoader(std::shared_ptr<const std::vector<Example>> examples,
                   std::shared_ptr<const ConfusionSet> confusion, const LoaderOptions& o,
                   LoaderPosition start)
      : examples_(std::move(examples)),
        confusion_(std::move(confusion)),
        o_(o),
        start_step_(start.step),
        window_(std::max(std::max(o.prefetch, o.threads), 1)) {
    const int threads = std::max(o.threads, 1);
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }

  ~BackgroundLoader() override {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    cv_ready_.notify_all();
    for (auto& t : threads_) t.join();
  }

  StatusOr<Batch> Next(double* wait_seconds) override {
    const auto t0 = std::chrono::steady_clock::now();
    StatusOr<Batch> result = InternalError("data loader: no micro-batch");
    {
      MutexLock l(&mu_);
      mu_.Wait(cv_ready_, [this]() DGCA_REQUIRES(mu_) { return ready_.count(next_out_) != 0; });
      auto it = ready_.find(next_out_);
      result = std::move(it->second);
      ready_.erase(it);
      if (result.ok()) {
        ++next_out_;
        returned_.store(next_out_, std::memory_order_release);
      } else {
        // Sticky: the failed micro-batch is never skipped; every later call
        // reports the same error.
        ready_.emplace(next_out_, result.status());
      }
    }
    cv_work_.notify_all();
    if (wait_seconds != nullptr) {
      *wait_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return result;
  }

  LoaderPosition position() const override {
    LoaderPosition p;
    p.step = start_step_ + returned_.load(std::memory_order_acquire) / o_.accumulation;
    return p;
  }

 private:
  void Work() {
    const int64_t n = static_cast<int64_t>(examples_->size());
    PermutationCache cache(n, o_.batch.seed);
    std::vector<int64_t> indices, epochs;
    while (true) {
      int64_t k;
      {
        MutexLock l(&mu_);
        mu_.Wait(cv_work_,
                 [this]() DGCA_REQUIRES(mu_) { return stop_ || next_claim_ < next_out_ + window_; });
        if (stop_) return;
        k = next_claim_++;
      }
      StatusOr<Batch> result = InternalError("data loader: micro-batch not built");
      try {
        const int64_t step = start_step_ + k / o_.accumulation;
        const int micro = static_cast<int>(k % o_.accumulation);
        MicroBatchRefs(n, o_, step, micro, &cache, &indices, &epochs);
        Status bad;
        for (int64_t i : indices) {
          const Example& ex = (*examples_)[i];
          if (ex.src.size() != ex.trg.size()) {
            bad = InvalidArgumentError("data loader: training example " + std::to_string(i) +
                                       " has " + std::to_string(ex.src.size()) +
                                       " source but " + std::to_string(ex.trg.size()) +
                                       " target ids");
            break;
          }
        }
        if (bad.ok()) {
          result = BuildBatchRows(*examples_, indices, o_.batch, confusion_.get(),
                                  /*mft=*/true, 0, epochs.data());
        } else {
          result = bad;
        }
      } catch (const std::exception& e) {
        result = InternalError("data loader: building micro-batch " + std::to_string(k) +
                               " failed: " + e.what());
      }
      {
        MutexLock l(&mu_);
        ready_.emplace(k, std::move(result));
      }
      cv_ready_.notify_all();
    }
  }

  const std::shared_ptr<const std::vector<Example>> examples_;
  const std::shared_ptr<const ConfusionSet> confusion_;
  const LoaderOptions o_;
  const int64_t start_step_;
  const int64_t window_;  // micro-batches in flight or ready, at most

  Mutex mu_;
  std::condition_variable cv_work_, cv_ready_;
  bool stop_ DGCA_GUARDED_BY(mu_) = false;
  int64_t next_claim_ DGCA_GUARDED_BY(mu_) = 0;  // next micro-batch (from start) a builder takes
  int64_t next_out_ DGCA_GUARDED_BY(mu_) = 0;    // next micro-batch Next() returns
  std::map<int64_t, StatusOr<Batch>> ready_ DGCA_GUARDED_BY(mu_);
  std::atomic<int64_t> returned_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::shared_ptr<const std::vector<Example>> examples,
    std::shared_ptr<const ConfusionSet> confusion, const LoaderOptions& options,
    LoaderPosition start) {
  if (examples == nullptr || examples->empty()) {
    return InvalidArgumentError("data loader: no training examples");
  }
  const LoaderOptions& o = options;
  if (o.micro_batch < 1) return InvalidArgumentError("data loader: micro_batch must be >= 1, got " + std::to_string(o.micro_batch));
  if (o.accumulation < 1) return InvalidArgumentError("data loader: accumulation must be >= 1, got " + std::to_string(o.accumulation));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("data loader: rank " + std::to_string(o.rank) +
                                " outside world of size " + std::to_string(o.world_size));
  }
  if (o.batch.prompt_length < 0) return InvalidArgumentError("data loader: prompt_length must be >= 0");
  if (o.batch.seq_len < 2 * o.batch.prompt_length + 4) {
    return InvalidArgumentError("data loader: max_seq_len " + std::to_string(o.batch.seq_len) +
                                " leaves no room for a character with " +
                                std::to_string(2 * o.batch.prompt_length) +
                                " prompt slots (need at least " +
                                std::to_string(2 * o.batch.prompt_length + 4) + ")");
  }
  if (o.batch.mft_rate < 0.0f || o.batch.mft_rate > 1.0f) {
    return InvalidArgumentError("data loader: mft rate must be in [0, 1]");
  }
  if (o.batch.top_k < 0) return InvalidArgumentError("data loader: top_k must be >= 0");
  if (start.step < 0) return InvalidArgumentError("data loader: negative start step");
  std::unique_ptr<DataLoader> loader(
      new BackgroundLoader(std::move(examples), std::move(confusion), options, start));
  return loader;
}

}  // namespace dgca
