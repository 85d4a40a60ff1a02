// `dgca` argument parsing (CLI11) and dispatch to cli/commands.h. main() is
// RunCli(argc, argv, std::cout, std::cerr, isatty(2)).
//
// Global options (before or after the command): --coordinator HOST:PORT
// (env DGCA_COORDINATOR, default 127.0.0.1:7600), --token-file F (env
// DGCA_TOKEN_FILE, default .dgca/token), --tls-ca F (env DGCA_TLS_CA).
//
// Thread-safety: not thread-safe (it is a program's main).
#ifndef DGCA_CLI_APP_H_
#define DGCA_CLI_APP_H_

#include <ostream>

namespace dgca {
namespace cli {

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           bool err_is_tty);

}  // namespace cli
}  // namespace dgca

#endif  // DGCA_CLI_APP_H_
