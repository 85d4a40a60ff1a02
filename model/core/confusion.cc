#include "model/core/confusion.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <sys/wait.h>
#include <unistd.h>

#include "model/core/json.h"
#include "model/core/strings.h"
#include "model/core/tokenizer.h"
#include "model/core/utf8.h"

namespace dgca {

ConfusionSet ConfusionSet::FromLists(int vocab_size,
                                     const std::map<int32_t, std::vector<int32_t>>& lists) {
  ConfusionSet cs;
  cs.offsets_.assign(static_cast<size_t>(std::max(vocab_size, 0)) + 1, 0);
  std::vector<std::vector<int32_t>> per(static_cast<size_t>(std::max(vocab_size, 0)));
  for (const auto& kv : lists) {
    const int32_t key = kv.first;
    if (key < 0 || key >= vocab_size) continue;
    std::unordered_set<int32_t> seen;
    for (int32_t c : kv.second) {
      if (c < 0 || c >= vocab_size || c == key) continue;
      if (seen.insert(c).second) per[key].push_back(c);
    }
  }
  for (int i = 0; i < vocab_size; ++i) {
    cs.offsets_[i + 1] = cs.offsets_[i] + static_cast<int64_t>(per[i].size());
    if (!per[i].empty()) ++cs.num_keys_;
  }
  cs.flat_.reserve(cs.offsets_.back());
  for (auto& l : per) cs.flat_.insert(cs.flat_.end(), l.begin(), l.end());
  return cs;
}

std::vector<int32_t> ConfusionSet::CandidatesOf(int32_t id) const {
  int n;
  const int32_t* p = Candidates(id, &n);
  return std::vector<int32_t>(p, p + n);
}

StatusOr<ConfusionSet> ConfusionSet::LoadJson(const std::string& path, const Vocab& vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open confusion-set file");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  DGCA_ASSIGN_OR_RETURN(JsonValue root, ParseJson(text, path));
  if (!root.is_object()) {
    return InvalidArgumentError(path + ":" + std::to_string(root.line) + ":" +
                                std::to_string(root.column) +
                                ": confusion set must be a JSON object {\"字\": [\"字1\", ...]}, found " +
                                JsonValue::TypeName(root.type));
  }
  std::map<int32_t, std::vector<int32_t>> lists;
  for (const auto& kv : root.object) {
    const JsonValue& v = kv.second;
    if (!v.is_array()) {
      return InvalidArgumentError(path + ":" + std::to_string(v.line) + ":" +
                                  std::to_string(v.column) + ": value of key \"" + kv.first +
                                  "\" must be an array of strings, found " +
                                  JsonValue::TypeName(v.type));
    }
    for (const JsonValue& e : v.array) {
      if (!e.is_string()) {
        return InvalidArgumentError(path + ":" + std::to_string(e.line) + ":" +
                                    std::to_string(e.column) + ": entry in the list of \"" +
                                    kv.first + "\" must be a string, found " +
                                    JsonValue::TypeName(e.type));
      }
    }
    if (!vocab.Contains(kv.first)) continue;
    const int32_t key = vocab.Lookup(kv.first);
    std::vector<int32_t>& out = lists[key];  // a repeated key appends
    for (const JsonValue& e : v.array) {
      if (!vocab.Contains(e.string)) continue;
      out.push_back(vocab.Lookup(e.string));
    }
  }
  return FromLists(vocab.size(), lists);
}

std::string StripPinyinTones(const std::string& pinyin) {
  std::string out;
  size_t pos = 0;
  while (pos < pinyin.size()) {
    uint32_t cp;
    if (!DecodeUtf8(pinyin, &pos, &cp)) {
      ++pos;
      continue;
    }
    if (cp >= 0x300 && cp <= 0x36F) continue;  // combining marks
    if (cp >= '0' && cp <= '9') continue;       // tone digits
    switch (cp) {
      case 0xE0: case 0xE1: case 0x101: case 0x1CE: cp = 'a'; break;
      case 0xE8: case 0xE9: case 0x113: case 0x11B: cp = 'e'; break;
      case 0xEC: case 0xED: case 0x12B: case 0x1D0: cp = 'i'; break;
      case 0xF2: case 0xF3: case 0x14D: case 0x1D2: cp = 'o'; break;
      case 0xF9: case 0xFA: case 0x16B: case 0x1D4: cp = 'u'; break;
      case 0x1D6: case 0x1D8: case 0x1DA: case 0x1DC: cp = 0xFC; break;  // ü
      case 0x144: case 0x148: case 0x1F9: cp = 'n'; break;
      case 0x1E3F: cp = 'm'; break;
      default:
        if (cp >= 'A' && cp <= 'Z') cp = cp - 'A' + 'a';
    }
    AppendUtf8(cp, &out);
  }
  return out;
}

namespace {

}  // namespace

StatusOr<ConfusionSet> ConfusionSet::BuildFromUnihan(const Vocab& vocab,
                                                     const std::string& path, int max_per_key) {
  if (access(path.c_str(), R_OK) != 0) {
    return NotFoundError(path + ": Unihan readings file not found (Debian/Ubuntu package "
                         "unicode-data provides it; or give a confusion set JSON file)");
  }
  const bool bz2 = EndsWith(path, ".bz2");
  FILE* f = bz2 ? popen(("bzcat " + ShellQuote(path) + " 2>/dev/null").c_str(), "r")
                : std::fopen(path.c_str(), "r");
  if (f == nullptr) return UnavailableError(path + ": cannot read (popen bzcat failed)");

  // code point -> readings (toned), in file order.
  std::unordered_map<uint32_t, std::vector<std::string>> readings;
  char buf[4096];
  const std::string tag = "\tkMandarin\t";
  while (std::fgets(buf, sizeof buf, f) != nullptr) {
    std::string line(buf);
    if (line.compare(0, 2, "U+") != 0) continue;
    const size_t t = line.find(tag);
    if (t == std::string::npos) continue;
    const uint32_t cp = static_cast<uint32_t>(std::strtoul(line.c_str() + 2, nullptr, 16));
    std::string value = line.substr(t + tag.size());
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
    std::istringstream vs(value);
    std::string r;
    while (vs >> r) readings[cp].push_back(r);
  }
  if (bz2) {
    const int rc = pclose(f);
    if (rc != 0) {
      const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
      if (code == 127) {
        return UnavailableError("bzcat not found: install bzip2 to read " + path);
      }
      return UnavailableError("bzcat " + path + " failed (exit " + std::to_string(code) + ")");
    }
  } else {
    std::fclose(f);
  }
  if (readings.empty()) {
    return InvalidArgumentError(path + ": no kMandarin readings found (expected Unihan_Readings.txt lines "
                                "'U+4E2D<TAB>kMandarin<TAB>zhōng')");
  }

  // Single-character vocabulary tokens with readings.
  std::unordered_map<std::string, std::vector<int32_t>> by_toned, by_toneless;
  std::vector<std::pair<int32_t, const std::vector<std::string>*>> chars;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    const std::string& tok = vocab.Token(id);
    size_t pos = 0;
    uint32_t cp;
    if (tok.empty() || !DecodeUtf8(tok, &pos, &cp) || pos != tok.size()) continue;
    auto it = readings.find(cp);
    if (it == readings.end()) continue;
    chars.emplace_back(id, &it->second);
    for (const std::string& r : it->second) {
      by_toned[r].push_back(id);  // ids arrive ascending
      by_toneless[StripPinyinTones(r)].push_back(id);
    }
  }
  std::map<int32_t, std::vector<int32_t>> lists;
  std::vector<int32_t> same_tone, other;
  for (const auto& c : chars) {
    const int32_t id = c.first;
    same_tone.clear();
    other.clear();
    for (const std::string& r : *c.second) {
      for (int32_t x : by_toned[r]) same_tone.push_back(x);
      for (int32_t x : by_toneless[StripPinyinTones(r)]) other.push_back(x);
    }
    std::sort(same_tone.begin(), same_tone.end());
    same_tone.erase(std::unique(same_tone.begin(), same_tone.end()), same_tone.end());
    std::sort(other.begin(), other.end());
    other.erase(std::unique(other.begin(), other.end()), other.end());
    std::vector<int32_t> list;
    for (int32_t x : same_tone) {
      if (x != id) list.push_back(x);
    }
    for (int32_t x : other) {
      if (x != id && !std::binary_search(same_tone.begin(), same_tone.end(), x)) list.push_back(x);
    }
    if (max_per_key > 0 && static_cast<int>(list.size()) > max_per_key) list.resize(max_per_key);
    if (!list.empty()) lists[id] = std::move(list);
  }
  return FromLists(vocab.size(), lists);
}

}  // namespace dgca
