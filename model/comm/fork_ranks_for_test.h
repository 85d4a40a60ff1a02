// Test helpers for communicator tests: ranks as forked processes, as the
// agent runs them (one process per rank), so a collective really crosses
// process boundaries.
//
// Thread-safety: call from the test's main thread only (fork).
#ifndef DGCA_MODEL_COMM_FORK_RANKS_FOR_TEST_H_
#define DGCA_MODEL_COMM_FORK_RANKS_FOR_TEST_H_

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "model/core/core_test_util.h"

namespace dgca {
namespace comm_test {

using testutil::MakeTempDir;  // a fresh /tmp/<prefix>.XXXXXX ("" if it cannot be made)

// Runs each fn in its own forked child, concurrently; a child exits with
// fn's return value (0 = ok; 98 = it threw). Children never touch gtest
// (its state is the parent's). Returns the exit codes in order, 128 +
// signal for a killed child.
inline std::vector<int> RunChildren(const std::vector<std::function<int()>>& fns) {
  std::vector<pid_t> pids;
  for (const auto& fn : fns) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 99;
      try {
        rc = fn();
      } catch (...) {
        rc = 98;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// RunChildren with one child per rank 0..world-1 running fn(rank).
inline std::vector<int> RunRanks(int world, const std::function<int(int)>& fn) {
  std::vector<std::function<int()>> fns;
  for (int r = 0; r < world; ++r) fns.push_back([&fn, r] { return fn(r); });
  return RunChildren(fns);
}

}  // namespace comm_test
}  // namespace dgca

#endif  // DGCA_MODEL_COMM_FORK_RANKS_FOR_TEST_H_
