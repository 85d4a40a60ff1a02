// Shared pieces of the tests: where the shared data lives, a per-process
// temp path, a fresh temp directory, and writing a small file. (Tests of
// every folder use it: model/, worker/, tests/integration/.)
#ifndef DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
#define DGCA_MODEL_CORE_CORE_TEST_UTIL_H_

#include <errno.h>  // program_invocation_short_name (GNU)
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

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

// A fresh directory /tmp/<prefix>.XXXXXX (mkdtemp); "" if none can be made.
inline std::string MakeTempDir(const std::string& prefix) {
  const std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* d = mkdtemp(buf.data());
  return d ? std::string(d) : std::string();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
