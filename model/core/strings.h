// Small string helpers for libdgca_model, which builds without Abseil
// (model/core/status.h says why): what absl::EndsWith and a shell quote
// would be, and the text tables of the CLI and the plan.
//
// Thread-safety: pure functions.
#ifndef DGCA_MODEL_CORE_STRINGS_H_
#define DGCA_MODEL_CORE_STRINGS_H_

#include <string>
#include <vector>

namespace dgca {

// Whether s ends with suffix.
bool EndsWith(const std::string& s, const std::string& suffix);

// s as one POSIX shell word: in single quotes, each ' written as '\''.
// For the file names model/core hands to popen (bzcat, zcat).
std::string ShellQuote(const std::string& s);

// A text table: columns padded to the widest cell plus two spaces, the
// first row the header, trailing spaces cut. One line per row: line breaks
// inside a cell are shown as " / " (a multi-line failure message in
// `dgca list` must not spill into the next rows).
std::string TextTable(const std::vector<std::vector<std::string>>& rows);

// A job's final loss as the rank's log, `dgca status` and `dgca list` say
// it (docs/metrics.md "Final loss"): "4.0367 (mean of the last 10 steps over
// 2 ranks)", the loss at 4 decimals; "none (no step trained)" when `steps`
// is 0. FinalLossValue is the number alone ("4.0367").
std::string FinalLossText(double final_loss, int steps, int ranks);
std::string FinalLossValue(double final_loss);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_STRINGS_H_
