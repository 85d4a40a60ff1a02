#include "worker/agent/rank_process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include "absl/strings/string_view.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "model/core/files.h"
#include "proto/rpc/rpc_util.h"

namespace dgca {
namespace {

std::optional<std::string> ReadWhole(const std::string& path, size_t limit) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  while (out.size() < limit) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace

std::string RankId(const std::string& job_id, int rank, int attempt) {
  return absl::StrCat(job_id, "/", rank, "/", attempt);
}

std::string RankIdEntry(const std::string& job_id, int rank, int attempt) {
  return "DGCA_RANK_ID=" + RankId(job_id, rank, attempt);
}

std::string LogTail(const std::string& path, int lines) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string data;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const off_t start = st.st_size > 65536 ? st.st_size - 65536 : 0;
    data.resize(static_cast<size_t>(st.st_size - start));
    const ssize_t got = pread(fd, data.data(), data.size(), start);
    data.resize(got > 0 ? static_cast<size_t>(got) : 0);
  }
  close(fd);
  while (!data.empty() && data.back() == '\n') data.pop_back();
  // The start of the last `lines` lines: after the lines-th newline from
  // the end, or the beginning when there are fewer.
  size_t begin = 0, end = data.size();
  for (int i = 0; i < lines && end > 0; ++i) {
    const size_t nl = data.rfind('\n', end - 1);
    if (nl == std::string::npos) {
      begin = 0;
      break;
    }
    begin = nl + 1;
    end = nl;
  }
  return data.substr(begin);
}

std::string ExitRecordPath(const std::string& log_dir, int rank) {
  return absl::StrCat(log_dir, "/rank-", rank, ".exit");
}

std::string RankTokenPath(const std::string& log_dir, int rank, int attempt) {
  return absl::StrCat(log_dir, "/rank-", rank, ".", attempt, ".token");
}

absl::Status WriteRankToken(const std::string& path, const std::string& token) {
  return ToAbsl(WriteFileAtomically(path, token + "\n", 0600));
}

int SweepRankTokens(const std::string& state_dir, double max_age_s) {
  const std::string jobs = state_dir + "/jobs";
  DIR* d = opendir(jobs.c_str());
  if (d == nullptr) return 0;
  const time_t cutoff = time(nullptr) - static_cast<time_t>(max_age_s);
  int removed = 0;
  while (dirent* j = readdir(d)) {
    if (j->d_name[0] == '.') continue;
    const std::string dir = jobs + "/" + j->d_name;
    DIR* jd = opendir(dir.c_str());
    if (jd == nullptr) continue;
    while (dirent* f = readdir(jd)) {
      const absl::string_view name(f->d_name);
      if (!absl::StartsWith(name, "rank-") ||
          !(absl::EndsWith(name, ".token") || absl::StrContains(name, ".token.tmp"))) {
        continue;
      }
      const std::string path = dir + "/" + f->d_name;
      struct stat st;
      if (lstat(path.c_str(), &st) != 0 || st.st_mtime > cutoff) continue;
      if (unlink(path.c_str()) == 0) ++removed;
    }
    closedir(jd);
  }
  closedir(d);
  return removed;
}

absl::Status WriteExitRecord(const std::string& path, int attempt, int code) {
  return ToAbsl(
      WriteFileAtomically(path, absl::StrCat("attempt ", attempt, " code ", code, "\n"), 0644));
}

std::optional<int> ReadExitRecord(const std::string& path, int attempt) {
  auto text = ReadWhole(path, 256);
  if (!text) return std::nullopt;
  std::vector<absl::string_view> w =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
  int a = 0, code = 0;
  if (w.size() != 4 || w[0] != "attempt" || w[2] != "code" || !absl::SimpleAtoi(w[1], &a) ||
      !absl::SimpleAtoi(w[3], &code) || a != attempt) {
    return std::nullopt;
  }
  return code;
}

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  auto stat = ReadWhole(absl::StrCat("/proc/", pid, "/stat"), 4096);
  if (!stat) return std::nullopt;
  // "PID (COMM) S ppid ...": COMM may hold spaces and ')', so fields are
  // counted from the last ')'. The state is field 3, the start time 22.
  size_t close_paren = stat->rfind(')');
  if (close_paren == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(*stat).substr(close_paren + 1), ' ', absl::SkipEmpty());
  if (f.size() < 20) return std::nullopt;
  if (f[0] == "Z" || f[0] == "X" || f[0] == "x") return std::nullopt;
  uint64_t start = 0;
  if (!absl::SimpleAtoi(f[19], &start)) return std::nullopt;
  return start;
}

bool ProcessEnvironHas(pid_t pid, const std::string& entry) {
  if (pid <= 0) return false;
  auto env = ReadWhole(absl::StrCat("/proc/", pid, "/environ"), 1 << 20);
  if (!env) return false;
  for (absl::string_view e : absl::StrSplit(*env, '\0')) {
    if (e == entry) return true;
  }
  return false;
}

pid_t FindProcessWithEnviron(const std::string& entry) {
  DIR* d = opendir("/proc");
  if (d == nullptr) return 0;
  pid_t found = 0;
  while (struct dirent* e = readdir(d)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid <= 1) continue;
    if ((found == 0 || pid < found) && ProcessStartTime(pid).has_value() &&
        ProcessEnvironHas(pid, entry)) {
      found = pid;
    }
  }
  closedir(d);
  return found;
}

}  // namespace dgca
