// Runs one fuzz target (tests/fuzz/NAME_fuzz.cc, its LLVMFuzzerTestOneInput)
// without libFuzzer, as part of `make test`: over its seed inputs, then over
// a fixed number of deterministic mutations of them (testutil::MutateBytes:
// bit flips, byte edits, inserted tokens, cut and duplicated ranges, odd
// numbers; and splices of two seeds). Not
// coverage-guided, so it finds far less than tools/fuzz.sh; it keeps every
// target building and running in CI, and the kind of input tools/fuzz.sh
// has found (yaml-cpp looping on a malformed spec) from coming back.
//
//   NAME_fuzz_replay [--mutations N] [--seed S] [--max-len B] PATH...
//
// PATH: a file or a directory (its regular files, sorted); "@shared/REL" is
// REL under $DGCA_SHARED_DATA (skipped, with a note, when absent; exit 77,
// ctest's skip, when no seed is left; exit 2 when no seed was given). Each seed
// is cut to --max-len bytes (default 4096, as tools/fuzz.sh). An input that
// crashes the target, or runs longer than 10 s, is written to
// $TMPDIR/NAME-crash-PID.bin and named; the exit status is then non-zero
// (the signal's). Address space is capped at 4 GiB and a failed allocation
// aborts (even where the reader would catch std::bad_alloc), so an input
// that makes a reader allocate without bound fails instead of swapping the
// machine.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/core/mutate_bytes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, for the signal handler.
const std::string* g_current = nullptr;
char g_crash_path[512];
int g_skipped_shared = 0;  // @shared/ seeds not found

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Async-signal-safe: writes the input to g_crash_path, says so, and dies of
// the same signal.
void OnFatal(int sig) {
  const char* what = sig == SIGALRM ? "ran longer than 10 s" : "crashed";
  const int fd = open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && g_current != nullptr) {
    WriteAll(fd, g_current->data(), g_current->size());
    close(fd);
  }
  WriteAll(2, "fuzz replay: an input ", 22);
  WriteAll(2, what, std::strlen(what));
  WriteAll(2, "; it is in ", 11);
  WriteAll(2, g_crash_path, std::strlen(g_crash_path));
  WriteAll(2, "\n", 1);
  signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  raise(sig == SIGALRM ? SIGABRT : sig);
}

std::string ReadPrefix(const std::string& path, size_t max_len) {
  std::ifstream in(path, std::ios::binary);
  std::string s(max_len, '\0');
  in.read(&s[0], static_cast<std::streamsize>(max_len));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// Seeds from PATH arguments (see the top of the file).
bool AddSeeds(const std::string& arg, size_t max_len, std::vector<std::string>* seeds) {
  std::string path = arg;
  if (arg.rfind("@shared/", 0) == 0) {
    const char* shared = std::getenv("DGCA_SHARED_DATA");
    path = std::string(shared != nullptr ? shared : "../shared/data") + "/" + arg.substr(8);
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (arg.rfind("@shared/", 0) == 0) {
      std::fprintf(stderr, "fuzz replay: %s not found: skipped (shared data absent)\n", path.c_str());
      ++g_skipped_shared;
      return true;
    }
    std::fprintf(stderr, "fuzz replay: no such seed file or directory: %s\n", path.c_str());
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    seeds->push_back(ReadPrefix(path, max_len));
    return true;
  }
  std::vector<std::string> files;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string f = path + "/" + e->d_name;
      struct stat fs;
      if (stat(f.c_str(), &fs) == 0 && S_ISREG(fs.st_mode)) files.push_back(f);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) seeds->push_back(ReadPrefix(f, max_len));
  return true;
}

// A mutant: testutil::MutateBytes' edits of one seed, or (one time in
// eight) one seed's head spliced onto another's tail first.
std::string Mutate(const std::vector<std::string>& seeds, std::mt19937_64* rng, size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>((*rng)() % n); };
  std::string s = seeds[pick(seeds.size())];
  if (pick(8) == 0) {
    const std::string& other = seeds[pick(seeds.size())];
    s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size() + 1));
  }
  s = dgca::testutil::MutateBytes(std::move(s), rng);
  if (s.size() > max_len) s.resize(max_len);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const char* base = std::strrchr(argv[0], '/');
  const std::string name = base != nullptr ? base + 1 : argv[0];
  long mutations = 20000;
  uint64_t seed = 20261126;
  size_t max_len = 4096;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--mutations" || a == "--seed" || a == "--max-len") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--mutations") mutations = std::strtol(v, nullptr, 10);
      if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
      if (a == "--max-len") max_len = std::strtoull(v, nullptr, 10);
    } else if (!AddSeeds(a, max_len, &seeds)) {
      return 2;
    }
  }
  if (seeds.empty()) {
    // Nothing to start from would mutate the empty input and pass having
    // tested little: a skip when the shared data is absent, else an error.
    if (g_skipped_shared > 0) {
      std::printf("fuzz replay %s: SKIPPED, its seeds are in the shared data, which is absent\n", name.c_str());
      return 77;  // ctest SKIP_RETURN_CODE
    }
    std::fprintf(stderr, "fuzz replay %s: no seed input (give files or non-empty directories)\n", name.c_str());
    return 2;
  }
  const char* tmp_env = std::getenv("TMPDIR");
  const std::string tmp = tmp_env != nullptr ? tmp_env : "/tmp";
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/%s-crash-%d.bin", tmp.c_str(), name.c_str(),
                static_cast<int>(getpid()));
  // The targets that read files write each input under $TMPDIR
  // (fuzz_input.h): a directory of this run's own, removed at the end.
  std::string scratch = tmp + "/" + name + "-XXXXXX";
  if (mkdtemp(&scratch[0]) == nullptr) {
    std::fprintf(stderr, "fuzz replay: cannot make a directory under %s\n", tmp.c_str());
    return 2;
  }
  setenv("TMPDIR", scratch.c_str(), 1);
  // The handler runs on a stack of its own: a stack overflow (deep
  // recursion, the usual parser crash) still saves its input.
  static char alt_stack[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = OnFatal;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGALRM}) sigaction(sig, &sa, nullptr);
  // An allocation that fails (past the cap below) is a finding, even where
  // the reader would catch std::bad_alloc and return an error (the spec
  // parser does: yaml-cpp's LoadAll loop would pass as "cannot parse"
  // after eating the memory): abort, so OnFatal saves the input.
  std::set_new_handler([] {
    static const char kMsg[] = "fuzz replay: an allocation failed (past the 4 GiB cap)\n";
    WriteAll(2, kMsg, sizeof(kMsg) - 1);
    std::abort();
  });
#if defined(__SANITIZE_ADDRESS__)
  // ASan has reserved terabytes of shadow already: a cap would fail every
  // later mapping (tools/sanitize.sh; ASAN_OPTIONS=malloc_limit_mb caps it there).
#else
  const rlim_t cap = rlim_t{4} << 30;
  rlimit as{cap, cap};
  setrlimit(RLIMIT_AS, &as);
#endif

  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);
  auto run = [](const std::string& input) {
    g_current = &input;
    alarm(10);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    alarm(0);
    g_current = nullptr;
  };
  for (const std::string& s : seeds) run(s);
  for (long i = 0; i < mutations; ++i) run(Mutate(seeds, &rng, max_len));
  if (DIR* d = opendir(scratch.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') unlink((scratch + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(scratch.c_str());
  std::printf("fuzz replay %s: %zu seeds and %ld mutations (seed %llu) ran clean in %.1f s\n", name.c_str(),
              seeds.size(), mutations, static_cast<unsigned long long>(seed),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}
