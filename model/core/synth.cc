#include "model/core/synth.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unordered_set>

#include <glob.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/core/confusion.h"
#include "model/core/files.h"
#include "model/core/rng.h"
#include "model/core/strings.h"
#include "model/core/tokenizer.h"
#include "model/core/utf8.h"

namespace dgca {
namespace {

constexpr uint64_t kShuffleKey = 0x53594E5448534846ull;  // "SYNTHSHF"
constexpr uint64_t kErrorKey = 0x53594E5448455252ull;    // "SYNTHERR"
// Substitutes are drawn from the first few candidates (same tone first,
// then by frequency in the corpus): realistic and varied enough.
constexpr int kSubstituteFrom = 8;


// Reads and decompresses `files` (zcat -f passes plain files through).
Status ReadSources(const std::vector<std::string>& files, std::string* text) {
  constexpr size_t kPerCommand = 200;  // keep command lines short
  for (size_t i = 0; i < files.size(); i += kPerCommand) {
    std::string cmd = "zcat -f --";
    for (size_t j = i; j < std::min(files.size(), i + kPerCommand); ++j) {
      cmd += " " + ShellQuote(files[j]);
    }
    cmd += " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    if (f == nullptr) return UnavailableError("synth: popen(zcat) failed");
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text->append(buf, n);
    const int rc = pclose(f);
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 127) return UnavailableError("synth: zcat not found (install gzip)");
    // Other non-zero codes (one unreadable file) are tolerated: the text of
    // the others is still good, and the output is checked for content.
    text->push_back('\n');
  }
  return OkStatus();
}

// Removes roff escapes from a text line (\fB, \(em, \*(xx, \s-1, \-, ...).
std::string StripRoff(const std::string& line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c != '\\' || i + 1 >= line.size()) {
      out.push_back(c);
      continue;
    }
    char e = line[++i];
    switch (e) {
      case '"': return out;  // comment to end of line
      case 'f':
        if (i + 1 < line.size() && line[i + 1] == '(') i += 3;
        else if (i + 1 < line.size() && line[i + 1] == '[') { size_t k = line.find(']', i); i = k == std::string::npos ? line.size() : k; }
        else i += 1;
        break;
      case '(': i += 2; break;
      case '*':
        if (i + 1 < line.size() && line[i + 1] == '(') i += 3;
        else if (i + 1 < line.size() && line[i + 1] == '[') { size_t k = line.find(']', i); i = k == std::string::npos ? line.size() : k; }
        else i += 1;
        break;
      case 's':
        if (i + 1 < line.size() && (line[i + 1] == '-' || line[i + 1] == '+')) ++i;
        while (i + 1 < line.size() && line[i + 1] >= '0' && line[i + 1] <= '9') ++i;
        break;
      case '-': out.push_back('-'); break;
      case 'e': case '\\': out.push_back('\\'); break;
      case '&': case 'c': case '|': case '^': case '%': break;
      case ' ': out.push_back(' '); break;
      default: out.push_back(e);
    }
  }
  return out;
}

bool IsTerminator(uint32_t cp) {
  return cp == 0x3002 || cp == 0xFF01 || cp == 0xFF1F || cp == 0xFF1B;  // 。！？；
}

// Appends the sentences of `paragraph` that pass the filters.
void SplitSentences(const std::string& paragraph, const SynthOptions& o,
                    std::vector<std::string>* out) {
  std::vector<uint32_t> cur;
  size_t pos = 0;
  auto emit = [&]() {
    int ideographs = 0;
    bool bad = false;
    for (uint32_t cp : cur) {
      if (IsCjkCodepoint(cp)) ++ideographs;
      if (cp == 0xFFFD || IsControlCodepoint(cp) || cp == '\t') bad = true;
    }
    const int n = static_cast<int>(cur.size());
    if (!bad && n >= o.min_chars && n <= o.max_chars && ideographs * 10 >= n * 7) {
      std::string s;
      for (uint32_t cp : cur) AppendUtf8(cp, &s);
      out->push_back(std::move(s));
    }
    cur.clear();
  };
  while (pos < paragraph.size()) {
    uint32_t cp;
    if (!DecodeUtf8(paragraph, &pos, &cp)) {
      ++pos;
      cp = 0xFFFD;
    }
    if (IsWhitespaceCodepoint(cp)) continue;
    cur.push_back(cp);
    if (IsTerminator(cp)) emit();
  }
  // A tail without a terminator (headings, list items) is not a sentence.
}

std::vector<std::string> ExtractSentences(const std::string& text, const SynthOptions& o) {
  std::vector<std::string> out;
  std::string paragraph;
  size_t start = 0;
  auto flush = [&]() {
    if (!paragraph.empty()) SplitSentences(paragraph, o, &out);
    paragraph.clear();
  };
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '.' || line[first] == '\'' ||
        line.find('|') != std::string::npos || line.compare(first, 2, "+-") == 0) {
      flush();  // blank line, roff request, or table: paragraph break
      continue;
    }
    paragraph += StripRoff(line);
    paragraph.push_back(' ');
  }
  flush();
  return out;
}

std::vector<std::string> SplitChars(const std::string& s) {
  std::vector<std::string> chars;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t begin = pos;
    uint32_t cp;
    if (!DecodeUtf8(s, &pos, &cp)) ++pos;
    chars.emplace_back(s, begin, pos - begin);
  }
  return chars;
}

std::string JoinChars(const std::vector<std::string>& chars) {
  std::string s;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (i) s.push_back(' ');
    s += chars[i];
  }
  return s;
}

// Writes one split; `split_id` keys its RNG streams.
Status WriteSplit(const std::string& path, const std::vector<std::string>& sentences,
                  uint64_t split_id, const SynthOptions& o, const Vocab& vocab,
                  const ConfusionSet& confusion, int64_t* with_errors, int64_t* substitutions) {
  const int64_t n = static_cast<int64_t>(sentences.size());
  const int64_t k = std::min<int64_t>(n, std::llround(std::max(0.0, o.error_rate) * n));
  // Which sentences get errors: the first k of a seeded permutation.
  std::vector<uint8_t> corrupt(n, 0);
  {
    std::vector<int64_t> perm(n);
    for (int64_t i = 0; i < n; ++i) perm[i] = i;
    SplitMix64 rng(MixSeed(o.seed, kErrorKey, split_id));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.NextBelow(i + 1)]);
    for (int64_t i = 0; i < k; ++i) corrupt[perm[i]] = 1;
  }
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return UnavailableError("synth: cannot write " + tmp);
  std::vector<int> eligible;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<std::string> trg = SplitChars(sentences[i]);
    std::vector<std::string> src = trg;
    if (corrupt[i]) {
      SplitMix64 rng(MixSeed(o.seed, kErrorKey, split_id, static_cast<uint64_t>(i) + 1));
      eligible.clear();
      for (int j = 0; j < static_cast<int>(src.size()); ++j) {
        int m;
        confusion.Candidates(vocab.Lookup(src[j]), &m);
        if (m > 0) eligible.push_back(j);
      }
      const int want = std::min<int>(1 + static_cast<int>(rng.NextBelow(2)),
                                     static_cast<int>(eligible.size()));
      for (int s = 0; s < want; ++s) {
        // Partial Fisher-Yates: distinct positions.
        const int pick = s + static_cast<int>(rng.NextBelow(eligible.size() - s));
        std::swap(eligible[s], eligible[pick]);
        const int j = eligible[s];
        int m;
        const int32_t* list = confusion.Candidates(vocab.Lookup(src[j]), &m);
        src[j] = vocab.Token(list[rng.NextBelow(std::min(m, kSubstituteFrom))]);
        ++*substitutions;
      }
      if (want > 0) ++*with_errors;
    }
    out << JoinChars(src) << '\t' << JoinChars(trg) << '\n';
  }
  out.close();
  if (!out) return UnavailableError("synth: write to " + tmp + " failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return UnavailableError("synth: rename " + tmp + " -> " + path + ": " + std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace

Status SynthesizeCorpus(const SynthOptions& o, SynthStats* stats) {
  SynthStats local;
  SynthStats& st = stats != nullptr ? *stats : local;
  st = SynthStats();
  if (o.train_sentences < 0 || o.test_sentences < 0 || o.train_sentences + o.test_sentences == 0) {
    return InvalidArgumentError("synth: train_sentences and test_sentences must be >= 0 and not both 0");
  }
  if (o.error_rate < 0 || o.error_rate > 1) {
    return InvalidArgumentError("synth: error_rate must be in [0, 1]");
  }
  if (o.min_chars < 1 || o.max_chars < o.min_chars) {
    return InvalidArgumentError("synth: need 1 <= min_chars <= max_chars");
  }

  std::vector<std::string> files;
  for (const std::string& pattern : o.sources) {
    glob_t g;
    std::memset(&g, 0, sizeof g);
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
  }
  if (files.empty()) {
    std::string list;
    for (const auto& s : o.sources) list += (list.empty() ? "" : ", ") + s;
    return NotFoundError("synth: no Chinese source text found (looked for " + list +
                         "); install the Debian packages debian-reference-zh-cn and manpages-zh");
  }
  st.files = static_cast<int64_t>(files.size());
  std::string text;
  DGCA_RETURN_IF_ERROR(ReadSources(files, &text));

  std::vector<std::string> all = ExtractSentences(text, o);
  std::vector<std::string> sentences;
  {
    std::unordered_set<std::string> seen;
    for (auto& s : all) {
      if (seen.insert(s).second) sentences.push_back(std::move(s));
    }
  }
  st.candidate_sentences = static_cast<int64_t>(sentences.size());
  if (sentences.empty()) {
    return InvalidArgumentError("synth: no usable Chinese sentences in " + std::to_string(files.size()) +
                                " source files");
  }
  SplitMix64 shuffle(MixSeed(o.seed, kShuffleKey));
  for (int64_t i = static_cast<int64_t>(sentences.size()) - 1; i > 0; --i) {
    std::swap(sentences[i], sentences[shuffle.NextBelow(i + 1)]);
  }
  const int64_t avail = static_cast<int64_t>(sentences.size());
  int64_t n_test = o.test_sentences, n_train = o.train_sentences;
  if (avail < n_train + n_test) {
    n_test = avail * o.test_sentences / (o.train_sentences + o.test_sentences);
    n_train = avail - n_test;
  }
  std::vector<std::string> test(sentences.begin(), sentences.begin() + n_test);
  std::vector<std::string> train(sentences.begin() + n_test, sentences.begin() + n_test + n_train);

  std::vector<std::string> used(test);
  used.insert(used.end(), train.begin(), train.end());
  const Vocab vocab = Vocab::BuildFromLines(used);
  DGCA_ASSIGN_OR_RETURN(ConfusionSet confusion, ConfusionSet::BuildFromUnihan(vocab, o.unihan_path));

  if (o.out_dir.empty()) return InvalidArgumentError("synth: out_dir is empty");
  if (Status st = MakeDirectories(o.out_dir, 0755); !st.ok()) {
    return UnavailableError("synth: " + st.message());
  }
  DGCA_RETURN_IF_ERROR(WriteSplit(o.out_dir + "/train.txt", train, 1, o, vocab, confusion,
                                  &st.train_with_errors, &st.substitutions));
  DGCA_RETURN_IF_ERROR(WriteSplit(o.out_dir + "/test.txt", test, 2, o, vocab, confusion,
                                  &st.test_with_errors, &st.substitutions));
  st.train = n_train;
  st.test = n_test;

  std::ofstream readme(o.out_dir + "/README.txt", std::ios::binary | std::ios::trunc);
  readme << "Synthetic Chinese spelling-correction corpus (ECSpell format), made by\n"
            "`dgca data synth`. Not real spelling errors: homophone substitutions.\n\n"
            "Files\n"
            "  train.txt  " << n_train << " sentence pairs (" << st.train_with_errors << " with errors)\n"
            "  test.txt   " << n_test << " sentence pairs (" << st.test_with_errors << " with errors)\n"
            "Format: one pair per line, SOURCE<TAB>TARGET, characters separated by single\n"
            "spaces; SOURCE has the errors, TARGET is the original sentence.\n\n"
            "Where the text comes from\n"
            "  " << files.size() << " files of Debian packages debian-reference-zh-cn and manpages-zh\n"
            "  (patterns:";
  for (const auto& s : o.sources) readme << " " << s;
  readme << ").\n"
            "  Licenses: see /usr/share/doc/debian-reference-zh-cn/copyright and\n"
            "  /usr/share/doc/manpages-zh/copyright.\n\n"
            "How it was made\n"
            "  roff markup stripped, wrapped lines joined, split after 。！？；, whitespace\n"
            "  removed; kept sentences of " << o.min_chars << "-" << o.max_chars
         << " characters that are at least 70% CJK ideographs;\n"
            "  deduplicated (" << st.candidate_sentences << " candidates), shuffled with seed "
         << o.seed << ", test taken first.\n"
            "  In round(" << o.error_rate << " x n) sentences of each split, 1-2 characters are replaced by a\n"
            "  homophone (same toneless Mandarin reading in Unihan kMandarin, "
         << o.unihan_path << "),\n"
            "  drawn from the first " << kSubstituteFrom
         << " candidates (same tone first, then by corpus frequency).\n"
            "  " << st.substitutions << " characters were changed in all.\n";
  readme.close();
  if (!readme) return UnavailableError("synth: cannot write " + o.out_dir + "/README.txt");
  return OkStatus();
}

}  // namespace dgca
