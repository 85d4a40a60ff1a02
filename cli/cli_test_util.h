// For the CLI's tests: `dgca ARGS...` run in-process through RunCli
// (cli/app.h), its exit code and what it printed.
#ifndef DGCA_CLI_CLI_TEST_UTIL_H_
#define DGCA_CLI_CLI_TEST_UTIL_H_

#include <sstream>
#include <string>
#include <vector>

#include "cli/app.h"

namespace dgca {
namespace cli {

struct CliRun {
  int code;
  std::string out, err;
};

inline CliRun Cli(std::vector<std::string> args) {
  std::vector<const char*> argv = {"dgca"};
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  int code = RunCli(static_cast<int>(argv.size()), argv.data(), out, err, false);
  return {code, out.str(), err.str()};
}

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_CLI_TEST_UTIL_H_
