// dgca: the command-line client. Logic lives in cli/app.cc and cli/commands.cc.
#include <unistd.h>

#include <iostream>

#include "cli/app.h"

int main(int argc, char** argv) {
  return dgca::cli::RunCli(argc, argv, std::cout, std::cerr, isatty(2) != 0);
}
