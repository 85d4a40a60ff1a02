// Shared pieces of the model/core tests: where the shared data lives, a
// per-process temp path, and writing a small file.
#ifndef DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
#define DGCA_MODEL_CORE_CORE_TEST_UTIL_H_

#include <errno.h>  // program_invocation_short_name (GNU)
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dgca {
namespace testutil {

// ../shared/data as ctest passes it (DGCA_SHARED_DATA).
inline std::string SharedData() {
  const char* d = std::getenv("DGCA_SHARED_DATA");
  return d ? d : "/work/shared/data";
}

// /tmp/dgca_<test binary>_<pid>_<name>: unique per process.
inline std::string TempPath(const std::string& name) {
  return "/tmp/dgca_" + std::string(program_invocation_short_name) + "_" +
         std::to_string(getpid()) + "_" + name;
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
