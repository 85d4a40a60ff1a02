#include "spec/yaml_text.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <sstream>
#include <string_view>

namespace dgca {
namespace {

// Where each YAML document starts; the node tree comes from YAML::Load.
class DocumentStarts : public YAML::EventHandler {
 public:
  YAML::Mark start;
  void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

// A second "document" without a marker is yaml-cpp's stuck state met later on.
bool HasDocumentMarker(const std::string& text) {
  bool in_first = false;  // past the first document's start
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool marker = (line.substr(0, 3) == "---" || line.substr(0, 3) == "...") &&
                        (line.size() == 3 || line[3] == ' ' || line[3] == '\t');
    if (in_first) {
      if (marker) return true;
      continue;
    }
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#' || line[0] == '%') continue;
    in_first = true;  // this line starts the first document (a leading "---" included)
  }
  return false;
}

bool SecondDocument(const std::string& text, YAML::Mark* second, bool* stuck) {
  std::stringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts first, next;
  if (!parser.HandleNextDocument(first)) return false;
  if (!parser.HandleNextDocument(next)) return false;
  *second = next.start;
  *stuck = next.start.pos == first.start.pos || !HasDocumentMarker(text);
  return true;
}

int MaxFlowNesting(const std::string& text) {
  int depth = 0, max_depth = 0;
  for (char c : text) {
    if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return max_depth;
}

size_t FirstInvalidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    if (n == 2 && c < 0xc2) return i;  // overlong
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return i;
    }
    if (n == 3) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) return i;  // overlong / surrogate
    }
    if (n == 4) {
      unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90)) return i;
    }
    i += n;
  }
  return std::string::npos;
}

namespace {

void CollectUnclosedQuotes(const YAML::Node& n, const std::string& text, int depth,
                           std::vector<UnclosedQuote>* out) {
  if (depth > 200) return;  // MaxFlowNesting bounds real specs far below this
  if (n.IsMap()) {
    for (const auto& kv : n) {
      CollectUnclosedQuotes(kv.first, text, depth + 1, out);
      CollectUnclosedQuotes(kv.second, text, depth + 1, out);
    }
    return;
  }
  if (n.IsSequence()) {
    for (const auto& v : n) CollectUnclosedQuotes(v, text, depth + 1, out);
    return;
  }
  if (!n.IsScalar() || n.Tag() != "!") return;  // "!": a quoted (non-plain) scalar
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.line < 0 || m.column < 0) return;
  size_t at = 0;
  for (int line = 0; line < m.line && at != std::string::npos; ++line) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  if (at == std::string::npos || at + m.column >= text.size()) return;
  at += m.column;
  const char q = text[at];
  if (q != '"' && q != '\'') return;  // not where it was expected: say nothing rather than guess
  for (size_t i = at + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r') break;
    if (q == '"' && c == '\\') {
      ++i;  // an escaped character
      continue;
    }
    if (c == q) {
      if (q == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;  // '' inside single quotes is a quote
        continue;
      }
      return;  // closed on its line
    }
  }
  out->push_back({m, q});
}

}  // namespace

std::vector<UnclosedQuote> UnclosedQuotes(const YAML::Node& root, const std::string& text) {
  std::vector<UnclosedQuote> out;
  CollectUnclosedQuotes(root, text, 0, &out);
  return out;
}

}  // namespace dgca
