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

// One to four seeded random edits of `s`, the kinds that break parsers of
// binary and text files alike: a flipped bit, an "interesting" byte (0,
// 0x7F, 0x80, 0xFF, a quote, a bracket, a tab, a newline), a 4- or 8-byte
// little-endian integer overwritten with 0, -1, INT32_MAX or 2^62, the file
// cut short, a chunk deleted or repeated, random bytes inserted. Used by the
// malformed-input tests: whatever comes out, a reader must return a value or
// an error naming the file, never crash.
inline std::string MutateBytes(std::string s, std::mt19937_64* rng) {
  auto pick = [&](size_t n) {
    return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(*rng);
  };
  static const char kInteresting[] = {0, 0x7f, '\x80', '\xff', '"', '[', ']', '{', '}',
                                      ':', ',', '\t', '\n', ' ', '-', '9'};
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(8)) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = kInteresting[pick(sizeof(kInteresting))];
        break;
      case 2: {
        const size_t width = pick(2) ? 4 : 8;
        if (s.size() < width) break;
        const uint64_t values[] = {0, ~uint64_t{0}, 0x7fffffffu, uint64_t{1} << 62};
        const uint64_t v = values[pick(4)];
        std::memcpy(&s[pick(s.size() - width + 1)], &v, width);  // little-endian hosts
        break;
      }
      case 3:
        s.resize(pick(s.size() + 1));
        break;
      case 4: {
        const size_t at = pick(s.size() + 1);
        s.erase(at, 1 + pick(64));
        break;
      }
      case 5: {
        const size_t at = pick(s.size() + 1);
        s.insert(at, s.substr(at, 1 + pick(64)));
        break;
      }
      default: {
        std::string junk(1 + pick(8), '\0');
        for (char& c : junk) c = static_cast<char>(pick(256));
        s.insert(pick(s.size() + 1), junk);
        break;
      }
    }
  }
  return s;
}

}  // namespace testutil
}  // namespace dgca

#endif  // DGCA_MODEL_CORE_CORE_TEST_UTIL_H_
