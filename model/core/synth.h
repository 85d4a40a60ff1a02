// Synthetic ECSpell-format corpus from Chinese text that Debian packages ship
// (debian-reference-zh-cn, manpages-zh), with homophone substitutions from
// Unihan kMandarin readings (unicode-data). Used by `dgca data synth` and
// the quickstart so that nothing has to be downloaded.
//
// Pipeline: read the sources (gzip through popen("zcat -f ..."), roff markup
// stripped), join wrapped lines into paragraphs, split into sentences after
// 。！？；, remove whitespace, keep sentences of min_chars..max_chars
// characters that are mostly Chinese, dedupe, shuffle with the seed, split
// into train and test, and give round(error_rate * n) sentences of each
// split 1-2 homophone substitutions (source = corrupted, target = original).
// Deterministic for a given seed and set of input files.
//
// Thread-safety: SynthesizeCorpus has no shared state.
#ifndef DGCA_MODEL_CORE_SYNTH_H_
#define DGCA_MODEL_CORE_SYNTH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "model/core/status.h"

namespace dgca {

struct SynthOptions {
  std::string out_dir;               // created if missing
  int64_t train_sentences = 3000;
  int64_t test_sentences = 300;
  uint64_t seed = 42;
  double error_rate = 0.5;           // share of sentences with errors
  int min_chars = 8;
  int max_chars = 60;
  // Files or glob(3) patterns; .gz files are decompressed. Missing ones are
  // skipped (at least one must exist).
  std::vector<std::string> sources = {
      "/usr/share/debian-reference/debian-reference.zh-cn.txt.gz",
      "/usr/share/man/zh_CN/man*/*.gz"};
  std::string unihan_path = "/usr/share/unicode/Unihan_Readings.txt.bz2";
};

struct SynthStats {
  int64_t files = 0;                 // source files read
  int64_t candidate_sentences = 0;   // after filtering and dedupe
  int64_t train = 0, test = 0;       // sentences written
  int64_t train_with_errors = 0, test_with_errors = 0;
  int64_t substitutions = 0;         // characters changed, both splits
};

// Writes out_dir/train.txt, out_dir/test.txt (ECSpell format: characters
// separated by single spaces, TAB between source and target) and
// out_dir/README.txt. When fewer sentences are available than requested,
// both splits shrink in proportion (stats say how many were written).
// Errors: no source file found (names the Debian packages), Unihan file or
// bzcat missing, no usable sentence, unwritable out_dir.
Status SynthesizeCorpus(const SynthOptions& options, SynthStats* stats);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_SYNTH_H_
