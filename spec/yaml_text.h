// The text-level guards of the job spec parser (spec/spec.h) around
// yaml-cpp 0.7: what must be refused before yaml-cpp reads the text, or
// checked in the text after it has, because yaml-cpp would hang, run out of
// memory or silently accept it. Pure functions.
#ifndef DGCA_SPEC_YAML_TEXT_H_
#define DGCA_SPEC_YAML_TEXT_H_

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>
#include <vector>

namespace dgca {

// Whether `text` has a YAML document marker line ("---" or "...", alone or
// followed by a space) after its first document began: what a real second
// document starts with. The first document's own leading "---" (after
// blank, comment and directive lines) does not count.
bool HasDocumentMarker(const std::string& text);

// Whether `text` holds a second YAML document; *second gets where it starts.
// Reads at most two documents: yaml-cpp 0.7 (Debian 12's) gets stuck on
// some malformed input, returning the same empty document forever, and its
// YAML::LoadAll then allocates until the process runs out of memory (found by
// tools/fuzz.sh: a spec with a line indented under a comment, see
// spec_parser_test; upstream jbeder/yaml-cpp#1319). A second document that
// starts where the first did, or with no marker line to start it, is that
// state (*stuck): a syntax error at that place.
bool SecondDocument(const std::string& text, YAML::Mark* second, bool* stuck);

// The deepest nesting of flow collections ('[', '{'), counted in the text:
// deeply nested ones are refused before yaml-cpp recurses into them.
int MaxFlowNesting(const std::string& text);

// The byte offset of the first invalid UTF-8 sequence (overlong forms and
// surrogates included), or npos.
size_t FirstInvalidUtf8(const std::string& s);

// Quoted scalars (keys and values) must close on the line they open on.
// YAML lets a quoted string run over line breaks (folded into spaces), and
// yaml-cpp also takes an unclosed quote at the end of the text: either way
// a missing closing quote would silently swallow the following fields into
// one string (found: `train: '/data/train.txt` with no closing quote was
// "valid", every later field inside the path and their defaults in use).
// A job spec's strings are one line. One entry per quoted scalar of the
// tree `root` (parsed from `text`) whose quote is not closed on its line.
struct UnclosedQuote {
  YAML::Mark mark;  // where the quote opens
  char quote;       // '"' or '\''
};
std::vector<UnclosedQuote> UnclosedQuotes(const YAML::Node& root, const std::string& text);

}  // namespace dgca

#endif  // DGCA_SPEC_YAML_TEXT_H_
