// Shared pieces of the tests: where the shared data lives, a per-process
// temp path, a fresh temp directory, writing and reading a small file, and
// random mutations of a file's bytes. (Tests of
// every folder use it: model/, worker/, tests/integration/.)
#ifndef DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
#define DGCA_MODEL_CORE_CORE_TEST_UTIL_H_

#include <errno.h>  // program_invocation_short_name (GNU)
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/core/mutate_bytes.h"  // MutateBytes, for the malformed-input tests

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

// The directories MakeTempDir made in this process, removed when it exits
// normally with every test passed. Kept, to look at, after a failed test
// (their paths are printed), a crash, or with DGCA_KEEP_TEST_TMP=1. Only
// the process that made them removes them: a forked child that calls
// exit() leaves its parent's directories alone.
struct TempDirRegistry {
  pid_t owner = getpid();
  std::vector<std::string> dirs;
  ~TempDirRegistry() {
    if (getpid() != owner || dirs.empty()) return;
    if (std::getenv("DGCA_KEEP_TEST_TMP") != nullptr || ::testing::UnitTest::GetInstance()->Failed()) {
      std::fprintf(stderr, "kept %zu test directories, e.g. %s\n", dirs.size(), dirs.back().c_str());
      return;
    }
    std::error_code ec;  // best effort: a directory a test removed already is fine
    for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
inline TempDirRegistry& TempDirs() {
  static TempDirRegistry registry;  // destroyed at exit, after the tests
  return registry;
}

// A fresh directory /tmp/<prefix>.XXXXXX (mkdtemp), removed with everything
// in it when the process exits (TempDirRegistry); "" if none can be made.
inline std::string MakeTempDir(const std::string& prefix) {
  const std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* d = mkdtemp(buf.data());
  if (d == nullptr) return std::string();
  TempDirs().dirs.push_back(d);
  return std::string(d);
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
