// dgca-bench-dump-confusion: writes the confusion set dgca builds by default
// (Unihan kMandarin homophones over the vocabulary built from TRAIN) as a
// confusion JSON ({"字": ["字1", ...]}), so bench/quality/train_peer.py can
// give the PyTorch peer exactly dgca's candidates.
// Usage: dgca-bench-dump-confusion TRAIN.txt OUT.json
#include <cstdio>
#include <fstream>
#include <string>

#include "model/core/confusion.h"
#include "model/core/tokenizer.h"

namespace {
std::string Quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TRAIN.txt OUT.json\n", argv[0]);
    return 2;
  }
  auto vocab = dgca::Vocab::BuildFromExamples({argv[1]});
  if (!vocab.ok()) {
    std::fprintf(stderr, "%s\n", vocab.status().ToString().c_str());
    return 1;
  }
  auto conf = dgca::ConfusionSet::BuildFromUnihan(*vocab);
  if (!conf.ok()) {
    std::fprintf(stderr, "%s\n", conf.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(argv[2]);
  out << "{\n";
  bool first = true;
  for (int32_t id = 0; id < vocab->size(); ++id) {
    int m = 0;
    const int32_t* c = conf->Candidates(id, &m);
    if (m == 0) continue;
    out << (first ? "" : ",\n") << Quote(vocab->Token(id)) << ": [";
    first = false;
    for (int k = 0; k < m; ++k) out << (k ? ", " : "") << Quote(vocab->Token(c[k]));
    out << "]";
  }
  out << "\n}\n";
  return out ? 0 : 1;
}
