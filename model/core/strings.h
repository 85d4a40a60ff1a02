// Small string helpers for libdgca_model, which builds without Abseil
// (model/core/status.h says why): what absl::EndsWith and a shell quote
// would be.
//
// Thread-safety: pure functions.
#ifndef DGCA_MODEL_CORE_STRINGS_H_
#define DGCA_MODEL_CORE_STRINGS_H_

#include <string>

namespace dgca {

// Whether s ends with suffix.
bool EndsWith(const std::string& s, const std::string& suffix);

// s as one POSIX shell word: in single quotes, each ' written as '\''.
// For the file names model/core hands to popen (bzcat, zcat).
std::string ShellQuote(const std::string& s);

}  // namespace dgca

#endif  // DGCA_MODEL_CORE_STRINGS_H_
