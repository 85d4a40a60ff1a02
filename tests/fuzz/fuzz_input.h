// Fuzz targets' shared helper: the readers under test take a path, so each
// input is written to a file of its own process first.
#ifndef DGCA_TESTS_FUZZ_FUZZ_INPUT_H_
#define DGCA_TESTS_FUZZ_FUZZ_INPUT_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace dgca {

// Writes the input to $TMPDIR/dgca-fuzz-<pid><ext> and returns the path.
inline std::string FuzzInputFile(const uint8_t* data, size_t size, const char* ext) {
  static const std::string path = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") +
                                  "/dgca-fuzz-" + std::to_string(getpid()) + ext;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace dgca

#endif  // DGCA_TESTS_FUZZ_FUZZ_INPUT_H_
