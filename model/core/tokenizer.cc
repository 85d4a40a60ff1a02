#include "model/core/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "model/core/utf8.h"

namespace dgca {
namespace {

StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return InvalidArgumentError(path + ": is a directory, not a " + what + " file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open " + what + " file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLossError(path + ": read error");
  return ss.str();
}

// "path:line:col" error for the first invalid UTF-8 byte in `text`, or OK.
Status CheckUtf8(const std::string& path, const std::string& text) {
  const size_t bad = FindInvalidUtf8(text);
  if (bad == std::string_view::npos) return OkStatus();
  size_t line_start = text.rfind('\n', bad == 0 ? std::string::npos : bad - 1);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  if (bad == 0) line_start = 0;
  const int64_t line = 1 + std::count(text.begin(), text.begin() + bad, '\n');
  return InvalidArgumentError(path + ":" + std::to_string(line) + ":" +
                              std::to_string(bad - line_start + 1) +
                              ": invalid UTF-8 (byte column; file byte " + std::to_string(bad) +
                              "); the file must be UTF-8 text");
}

bool IsBracketToken(const std::string& t) {
  return t.size() > 2 && t.front() == '[' && t.back() == ']';
}

std::vector<std::string> ReservedTokens() {
  std::vector<std::string> t;
  t.reserve(kNumReservedIds);
  t.push_back("[PAD]");
  for (int i = 1; i <= 99; ++i) t.push_back("[unused" + std::to_string(i) + "]");
  t.push_back("[UNK]");
  t.push_back("[CLS]");
  t.push_back("[SEP]");
  t.push_back("[MASK]");
  return t;
}

Vocab BuildFromCounts(const std::unordered_map<uint32_t, int64_t>& counts, int min_count) {
  std::vector<std::pair<uint32_t, int64_t>> chars(counts.begin(), counts.end());
  std::sort(chars.begin(), chars.end(), [](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return a.first < b.first;
  });
  std::vector<std::string> tokens = ReservedTokens();
  for (const auto& c : chars) {
    if (c.second < min_count) break;
    std::string s;
    AppendUtf8(c.first, &s);
    tokens.push_back(std::move(s));
  }
  return Vocab::FromTokens(std::move(tokens));
}

void CountChars(std::string_view text, std::unordered_map<uint32_t, int64_t>* counts) {
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    if (!DecodeUtf8(text, &pos, &cp)) {
      ++pos;
      continue;
    }
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') continue;
    ++(*counts)[cp];
  }
}

}  // namespace

void Vocab::Index() {
  ids_.clear();
  ids_.reserve(tokens_.size() * 2);
  // As Hugging Face's load_vocab: a repeated token maps to its last line.
  for (size_t i = 0; i < tokens_.size(); ++i) ids_[tokens_[i]] = static_cast<int32_t>(i);
  auto find = [this](const char* t, int32_t def) {
    auto it = ids_.find(t);
    return it == ids_.end() ? def : it->second;
  };
  pad_id_ = find("[PAD]", kPadId);
  unk_id_ = find("[UNK]", kUnkId);
  cls_id_ = find("[CLS]", kClsId);
  sep_id_ = find("[SEP]", kSepId);
  mask_id_ = find("[MASK]", kMaskId);
}

Vocab Vocab::FromTokens(std::vector<std::string> tokens) {
  Vocab v;
  v.tokens_ = std::move(tokens);
  v.Index();
  return v;
}

StatusOr<Vocab> Vocab::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open vocabulary file");
  // Read in chunks, checking the limits as the bytes arrive.
  std::string text;
  std::vector<char> buf(1 << 16);
  int64_t line = 1, line_bytes = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') {
        ++line;
        line_bytes = 0;
      } else if (++line_bytes > kMaxLineBytes) {
        return InvalidArgumentError(
            path + ":" + std::to_string(line) + ": vocabulary line longer than the limit of " +
            std::to_string(kMaxLineBytes) +
            " bytes (a BERT vocab.txt holds one short token per line); is it the right file?");
      }
    }
    if (static_cast<int64_t>(text.size() + n) > kMaxFileBytes) {
      return InvalidArgumentError(path + ": vocabulary file larger than the limit of " +
                                  std::to_string(kMaxFileBytes) +
                                  " bytes (a BERT vocab.txt is about 100 KiB); is it the right file?");
    }
    text.append(buf.data(), n);
  }
  if (in.bad()) return DataLossError(path + ": read error");
  if (text.empty()) return InvalidArgumentError(path + ": empty vocabulary file (expected a BERT vocab.txt, one token per line)");
  DGCA_RETURN_IF_ERROR(CheckUtf8(path, text));
  std::vector<std::string> tokens;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    size_t e = end;
    if (e > start && text[e - 1] == '\r') --e;
    tokens.emplace_back(text, start, e - start);
    start = end + 1;
  }
  return FromTokens(std::move(tokens));
}

StatusOr<Vocab> Vocab::BuildFromExamples(const std::vector<std::string>& ecspell_paths,
                                         int min_count) {
  if (ecspell_paths.empty()) return InvalidArgumentError("BuildFromExamples: no data files given");
  std::unordered_map<uint32_t, int64_t> counts;
  for (const std::string& path : ecspell_paths) {
    DGCA_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "training data"));
    DGCA_RETURN_IF_ERROR(CheckUtf8(path, text));
    CountChars(text, &counts);
  }
  return BuildFromCounts(counts, std::max(1, min_count));
}

Vocab Vocab::BuildFromLines(const std::vector<std::string>& lines, int min_count) {
  std::unordered_map<uint32_t, int64_t> counts;
  for (const std::string& l : lines) CountChars(l, &counts);
  return BuildFromCounts(counts, std::max(1, min_count));
}

Status Vocab::Save(const std::string& path) const {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].find('\n') != std::string::npos) {
      return InvalidArgumentError("vocabulary token " + std::to_string(i) + " contains a newline");
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return UnavailableError(tmp + ": cannot open for writing");
    for (const std::string& t : tokens_) out << t << '\n';
    out.flush();
    if (!out) return UnavailableError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return UnavailableError("rename " + tmp + " -> " + path + ": " + std::strerror(errno));
  }
  return OkStatus();
}

int32_t Vocab::Lookup(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? unk_id_ : it->second;
}

bool Vocab::Contains(std::string_view token) const {
  return ids_.count(std::string(token)) != 0;
}

const std::string& Vocab::Token(int32_t id) const {
  static const std::string* const kEmpty = new std::string();
  if (id < 0 || id >= size()) return *kEmpty;
  return tokens_[id];
}

bool Vocab::IsSpecial(int32_t id) const {
  if (id == pad_id_ || id == unk_id_ || id == cls_id_ || id == sep_id_ || id == mask_id_) {
    return true;
  }
  if (id < 0 || id >= size()) return false;
  return IsBracketToken(tokens_[id]);
}

std::vector<std::string> BertTokenizer::BasicTokenize(std::string_view text) const {
  // 1. Clean: drop NUL, U+FFFD (also what invalid bytes decode to) and
  //    control characters; whitespace becomes ' '. 2. Pad CJK characters
  //    with spaces. 3. Split on whitespace, then split off punctuation.
  std::vector<std::string> words;
  std::string cur;
  auto flush = [&]() {
    if (!cur.empty()) {
      words.push_back(std::move(cur));
      cur.clear();
    }
  };
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    if (!DecodeUtf8(text, &pos, &cp)) {
      ++pos;
      continue;
    }
    if (cp == 0 || cp == 0xFFFD || IsControlCodepoint(cp)) continue;
    if (IsWhitespaceCodepoint(cp)) {
      flush();
      continue;
    }
    if (IsCjkCodepoint(cp) || IsPunctuationCodepoint(cp)) {
      flush();
      AppendUtf8(cp, &cur);
      flush();
      continue;
    }
    if (lower_case_ && cp >= 'A' && cp <= 'Z') cp = cp - 'A' + 'a';
    AppendUtf8(cp, &cur);
  }
  flush();
  return words;
}

void BertTokenizer::WordPiece(const std::string& word, std::vector<std::string>* out) const {
  const std::string unk = vocab_->Token(vocab_->unk_id()).empty() ? "[UNK]"
                                                                   : vocab_->Token(vocab_->unk_id());
  // Character boundaries (byte offsets) of the word.
  std::vector<size_t> bounds;
  size_t pos = 0;
  while (pos < word.size()) {
    bounds.push_back(pos);
    uint32_t cp;
    if (!DecodeUtf8(word, &pos, &cp)) ++pos;
  }
  const size_t nchars = bounds.size();
  bounds.push_back(word.size());
  if (nchars > static_cast<size_t>(kMaxCharsPerWord)) {
    out->push_back(unk);
    return;
  }
  std::vector<std::string> pieces;
  size_t start = 0;
  std::string candidate;
  while (start < nchars) {
    size_t end = nchars;
    bool found = false;
    while (start < end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(word, bounds[start], bounds[end] - bounds[start]);
      if (vocab_->Contains(candidate)) {
        found = true;
        break;
      }
      --end;
    }
    if (!found) {
      out->push_back(unk);
      return;
    }
    pieces.push_back(candidate);
    start = end;
  }
  for (auto& p : pieces) out->push_back(std::move(p));
}

std::vector<std::string> BertTokenizer::Tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const std::string& w : BasicTokenize(text)) WordPiece(w, &out);
  return out;
}

std::vector<int32_t> BertTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  for (const std::string& t : Tokenize(text)) ids.push_back(vocab_->Lookup(t));
  return ids;
}

}  // namespace dgca
