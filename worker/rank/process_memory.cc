#include "worker/rank/process_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace dgca {

double ParseVmHwmBytes(absl::string_view status_text) {
  for (absl::string_view line : absl::StrSplit(status_text, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmHWM:")) continue;
    // "VmHWM:\t  123456 kB": the kernel always writes kB.
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return -1;
    int64_t kb = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb) || kb < 0) return -1;
    return static_cast<double>(kb) * 1024.0;
  }
  return -1;
}

double ProcessPeakResidentBytes() {
  std::ifstream in("/proc/self/status");
  if (!in) return -1;
  std::stringstream text;
  text << in.rdbuf();
  return ParseVmHwmBytes(text.str());
}

}  // namespace dgca
