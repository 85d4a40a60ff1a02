// Malformed files against every reader of model/core: a valid file of each
// format, mutated thousands of times at random (testutil::MutateBytes: bit
// flips, integers overwritten with 0/-1/2^62, truncation, repeated and
// deleted chunks, junk bytes). Whatever comes out, the reader returns a
// value that keeps its documented invariants or an error that names the
// file; it never crashes, hangs or throws. Seeded, so a failure repeats;
// tools/sanitize.sh runs it under ASan and UBSan, which turn a read past a
// buffer into a failure too.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/core/batch_io.h"
#include "model/core/confusion.h"
#include "model/core/core_test_util.h"
#include "model/core/data.h"
#include "model/core/json.h"
#include "model/core/safetensors.h"
#include "model/core/tokenizer.h"

namespace dgca {
namespace {

constexpr int kMutations = 1500;

// Runs `check(mutated_path)` on kMutations mutations of `original`, written
// to a fresh file each time; returns how many the reader accepted.
template <typename Check>
int ForEachMutation(const std::string& original, const std::string& path, uint64_t seed, Check check) {
  std::mt19937_64 rng(seed);
  int accepted = 0;
  for (int i = 0; i < kMutations; ++i) {
    const std::string bytes = testutil::MutateBytes(original, &rng);
    testutil::WriteFile(path, bytes);
    SCOPED_TRACE("mutation " + std::to_string(i) + " of seed " + std::to_string(seed) + ", " +
                 std::to_string(bytes.size()) + " bytes");
    accepted += check(path) ? 1 : 0;
    if (::testing::Test::HasFatalFailure()) break;
  }
  std::remove(path.c_str());
  return accepted;
}

// An error must say which file it is about.
void ExpectNamesFile(const Status& s, const std::string& path) {
  EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A safetensors file with one number of its JSON header (a shape
// dimension, an offset) replaced and the 8-byte header length written back:
// the file stays well-formed, only what it claims changes. Random bytes
// rarely get past the length prefix and the JSON; these reach the size and
// offset checks.
std::string MutateHeaderNumber(const std::string& file, std::mt19937_64* rng) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string header = file.substr(8, n);
  std::vector<std::pair<size_t, size_t>> numbers;  // (start, length)
  for (size_t i = 0; i < header.size();) {
    if (std::isdigit(static_cast<unsigned char>(header[i]))) {
      size_t j = i;
      while (j < header.size() && std::isdigit(static_cast<unsigned char>(header[j]))) ++j;
      numbers.emplace_back(i, j - i);
      i = j;
    } else {
      ++i;
    }
  }
  if (numbers.empty()) return file;
  static const char* kValues[] = {"0",  "1",     "2",          "3",          "5",
                                  "24", "25",    "40",         "4096",       "2147483648",
                                  "-1", "1e300", "4294967296", "9007199254740993", "18446744073709551615"};
  const auto& [at, len] = numbers[std::uniform_int_distribution<size_t>(0, numbers.size() - 1)(*rng)];
  header.replace(at, len, kValues[std::uniform_int_distribution<size_t>(0, std::size(kValues) - 1)(*rng)]);
  const uint64_t m = header.size();
  std::string out(8, '\0');
  std::memcpy(&out[0], &m, 8);
  return out + header + file.substr(8 + n);
}

TEST(MalformedInput, Safetensors) {
  const std::string path = testutil::TempPath("mut.safetensors");
  std::vector<float> a(6), b(4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * static_cast<float>(i);
  ASSERT_TRUE(WriteSafetensors(path, {{"bert.a", {2, 3}, a.data()}, {"cls.b", {4}, b.data()}},
                               {{"format", "pt"}})
                  .ok());
  const std::string original = testutil::ReadFile(path);
  ASSERT_GT(original.size(), 8u);
  const int accepted = ForEachMutation(original, path, 1, [&](const std::string& p) {
    StatusOr<SafetensorsFile> f = ReadSafetensors(p);
    if (!f.ok()) {
      ExpectNamesFile(f.status(), p);
      return false;
    }
    for (const auto& [name, t] : f->tensors) {
      for (int64_t d : t.shape) EXPECT_GE(d, 0) << name;
      EXPECT_EQ(static_cast<int64_t>(t.data.size()), Numel(t.shape)) << name;
    }
    return true;
  });
  // Most mutations break the header or the sizes; some (a flipped data bit)
  // leave a valid file. Both must happen, or the mutations test nothing.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kMutations);

  // Well-formed files whose header lies about a shape or an offset.
  std::mt19937_64 rng(11);
  int header_accepted = 0;
  for (int i = 0; i < kMutations; ++i) {
    SCOPED_TRACE("header mutation " + std::to_string(i) + " of seed 11");
    testutil::WriteFile(path, MutateHeaderNumber(original, &rng));
    StatusOr<SafetensorsFile> f = ReadSafetensors(path);
    if (!f.ok()) {
      ExpectNamesFile(f.status(), path);
      continue;
    }
    ++header_accepted;  // e.g. an offset rewritten with its own value
    for (const auto& [name, t] : f->tensors) EXPECT_EQ(static_cast<int64_t>(t.data.size()), Numel(t.shape));
  }
  std::remove(path.c_str());
  EXPECT_LT(header_accepted, kMutations);
}

TEST(MalformedInput, Json) {
  const std::string doc =
      "{\"step\": 120, \"seed\": 42, \"rate\": -1.5e-3, \"ok\": true, \"none\": null,\n"
      " \"name\": \"a\\\"b\\\\c\\u4e2d\\ud83d\\ude00\", \"list\": [1, [2, [3, {}]], \"\\n\"],\n"
      " \"config\": {\"hidden\": 768, \"layers\": 12}}\n";
  ASSERT_TRUE(ParseJson(doc, "doc.json").ok());
  std::mt19937_64 rng(2);
  int accepted = 0;
  for (int i = 0; i < 4 * kMutations; ++i) {
    const std::string text = testutil::MutateBytes(doc, &rng);
    StatusOr<JsonValue> v = ParseJson(text, "doc.json");
    if (v.ok()) {
      ++accepted;
      continue;
    }
    ExpectNamesFile(v.status(), "doc.json");
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "mutation " << i << ": " << text;
      break;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 4 * kMutations);
  // Nesting past kJsonMaxDepth is an error, not a stack overflow.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  StatusOr<JsonValue> v = ParseJson(deep, "deep.json");
  ASSERT_FALSE(v.ok());
  ExpectNamesFile(v.status(), "deep.json");
}

// Two records as dgca-train --dump-batches writes them.
std::string BatchRecordsFile(const std::string& path) {
  auto writer = BatchRecordWriter::Open(path);
  EXPECT_TRUE(writer.ok());
  if (!writer.ok()) return "";
  for (int r = 0; r < 2; ++r) {
    Batch b;
    b.batch_size = 2;
    b.seq_len = 5;
    b.top_k = 2;
    const int T = 3;
    b.input_ids.assign(10, 7 + r);
    b.attention_mask.assign(10, 1);
    b.token_type_ids.assign(10, 0);
    b.prompt_slot.assign(10, -1);
    b.labels.assign(10, -100);
    b.mft_labels.assign(10, -100);
    b.slot_index = {2, 3, 8};
    b.slot_source_id = {11, 12, 13};
    b.slot_target_id = {11, 14, 13};
    b.candidates.assign(T * 2, 11);
    b.row_length = {4, 3};
    b.sample_index = {r * 2, r * 2 + 1};
    EXPECT_TRUE((*writer)->Append(r, 0, b).ok());
  }
  EXPECT_TRUE((*writer)->Close().ok());
  return testutil::ReadFile(path);
}

TEST(MalformedInput, BatchRecords) {
  const std::string path = testutil::TempPath("mut.batches");
  const std::string original = BatchRecordsFile(path);
  ASSERT_FALSE(original.empty());
  const int accepted = ForEachMutation(original, path, 3, [&](const std::string& p) {
    StatusOr<std::vector<BatchRecord>> recs = ReadBatchRecords(p);
    if (!recs.ok()) {
      ExpectNamesFile(recs.status(), p);
      return false;
    }
    for (const BatchRecord& r : *recs) {
      const Batch& b = r.batch;
      const size_t bl = static_cast<size_t>(b.batch_size) * b.seq_len;
      EXPECT_EQ(b.input_ids.size(), bl);
      EXPECT_EQ(b.attention_mask.size(), bl);
      EXPECT_EQ(b.prompt_slot.size(), bl);
      EXPECT_EQ(b.labels.size(), bl);
      EXPECT_EQ(b.mft_labels.size(), bl);
      EXPECT_EQ(b.slot_source_id.size(), b.slot_index.size());
      EXPECT_EQ(b.slot_target_id.size(), b.slot_index.size());
      EXPECT_EQ(b.candidates.size(), b.slot_index.size() * static_cast<size_t>(b.top_k));
      EXPECT_EQ(b.row_length.size(), static_cast<size_t>(b.batch_size));
    }
    return true;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kMutations);
}

Vocab SmallVocab() {
  std::vector<std::string> tokens = {"[PAD]"};
  for (int i = 1; i < 100; ++i) tokens.push_back("[unused" + std::to_string(i) + "]");
  for (const char* t : {"[UNK]", "[CLS]", "[SEP]", "[MASK]", "我", "爱", "你", "他", "她", "们", "中", "文"}) {
    tokens.push_back(t);
  }
  return Vocab::FromTokens(tokens);
}

TEST(MalformedInput, EcspellData) {
  const std::string path = testutil::TempPath("mut_train.txt");
  const std::string original =
      "我 爱 你\t我 爱 你\n他 们 爱 中 文\t她 们 爱 中 文\r\n\n中 文\t中 文\n我 们\t我 他\n";
  const Vocab vocab = SmallVocab();
  const int accepted = ForEachMutation(original, path, 4, [&](const std::string& p) {
    ReadStats stats;
    StatusOr<std::vector<Example>> ex = ReadEcspell(p, vocab, /*max_chars=*/3, &stats);
    if (!ex.ok()) {
      ExpectNamesFile(ex.status(), p);
      return false;
    }
    EXPECT_FALSE(ex->empty());  // no usable pair is an error
    for (const Example& e : *ex) {
      EXPECT_EQ(e.src.size(), e.trg.size());
      EXPECT_EQ(e.src.size(), e.src_chars.size());
      EXPECT_EQ(e.trg.size(), e.trg_chars.size());
      EXPECT_LE(e.src.size(), 3u);
      EXPECT_GT(e.src.size(), 0u);
      for (int32_t id : e.src) EXPECT_TRUE(id >= 0 && id < vocab.size()) << id;
    }
    EXPECT_EQ(stats.kept, static_cast<int64_t>(ex->size()));
    return true;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kMutations);
}

TEST(MalformedInput, VocabFile) {
  const std::string path = testutil::TempPath("mut_vocab.txt");
  std::string original;
  const Vocab base = SmallVocab();
  for (int i = 0; i < base.size(); ++i) original += base.Token(i) + "\n";
  const int accepted = ForEachMutation(original, path, 5, [&](const std::string& p) {
    StatusOr<Vocab> v = Vocab::Load(p);
    if (!v.ok()) {
      ExpectNamesFile(v.status(), p);
      return false;
    }
    EXPECT_GT(v->size(), 0);
    // Every token looks up to an id of that same token (a token listed
    // twice maps to its last line, as HF's load_vocab does).
    for (int i = 0; i < v->size(); ++i) {
      const int32_t id = v->Lookup(v->Token(i));
      if (id < 0 || id >= v->size()) {
        ADD_FAILURE() << "token " << i << " looks up to id " << id;
        continue;
      }
      EXPECT_EQ(v->Token(id), v->Token(i)) << i;
    }
    return true;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kMutations);
}

TEST(MalformedInput, ConfusionJson) {
  const std::string path = testutil::TempPath("mut_confusion.json");
  const std::string original = "{\"他\": [\"她\", \"你\", \"他\"], \"我\": [\"你\"], \"x\": [\"中\"],\n \"们\": []}\n";
  const Vocab vocab = SmallVocab();
  const int accepted = ForEachMutation(original, path, 6, [&](const std::string& p) {
    StatusOr<ConfusionSet> c = ConfusionSet::LoadJson(p, vocab);
    if (!c.ok()) {
      ExpectNamesFile(c.status(), p);
      return false;
    }
    return true;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kMutations);
}

}  // namespace
}  // namespace dgca
