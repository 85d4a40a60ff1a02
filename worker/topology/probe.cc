#include "worker/topology/probe.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/topology/probe_internal.h"

namespace dgca {
namespace topo_internal {

std::string JoinRoot(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (!path.empty() && path[0] == '/') return r + path;
  return r + "/" + path;
}

std::optional<std::string> ReadFile(const std::string& path,
                                    size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string out;
  out.resize(max_bytes);
  in.read(&out[0], static_cast<std::streamsize>(max_bytes));
  out.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) return std::nullopt;
  return out;
}

std::optional<std::string> ReadTrimmed(const std::string& path) {
  auto s = ReadFile(path, 64 * 1024);
  if (!s) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(*s));
}

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "0-3,8,10-11" -> 7. Returns -1 on garbage.
int CountCpuList(const std::string& list) {
  std::string s(absl::StripAsciiWhitespace(list));
  if (s.empty()) return -1;
  int count = 0;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> ab = absl::StrSplit(part, '-');
    int a = 0, b = 0;
    if (ab.size() == 1) {
      if (!absl::SimpleAtoi(ab[0], &a) || a < 0) return -1;
      count += 1;
    } else if (ab.size() == 2) {
      if (!absl::SimpleAtoi(ab[0], &a) || !absl::SimpleAtoi(ab[1], &b) ||
          a < 0 || b < a || b - a > 65535)
        return -1;
      count += b - a + 1;
    } else {
      return -1;
    }
  }
  return count;
}

}  // namespace topo_internal

namespace {

using topo_internal::CountCpuList;
using topo_internal::IsDir;
using topo_internal::JoinRoot;
using topo_internal::ListDir;
using topo_internal::ReadFile;
using topo_internal::ReadTrimmed;

class Prober {
 public:
  Prober(const ProbeOptions& opt, v1::Topology* t) : opt_(opt), t_(t) {}

  std::string P(const std::string& path) const {
    return JoinRoot(opt_.root, path);
  }
  void Unknown(const std::string& what) { t_->add_unknown(what); }

  void Hostname() {
    if (!opt_.node_name.empty()) {
      t_->set_node(opt_.node_name);
    }
    auto h = ReadTrimmed(P("/proc/sys/kernel/hostname"));
    std::string host;
    if (h && !h->empty()) {
      host = *h;
    } else if (opt_.root.empty() || opt_.root == "/") {
      char buf[256] = {0};
      if (gethostname(buf, sizeof(buf) - 1) == 0) host = buf;
    }
    if (host.empty()) {
      Unknown("hostname: /proc/sys/kernel/hostname unreadable");
      host = "unknown";
    }
    t_->set_hostname(host);
    if (t_->node().empty()) t_->set_node(host);
  }

  void Cpus() {
    auto online = ReadTrimmed(P("/sys/devices/system/cpu/online"));
    if (online) {
      int n = CountCpuList(*online);
      if (n > 0) {
        t_->set_cpu_count(n);
        return;
      }
    }
    auto info = ReadFile(P("/proc/cpuinfo"), 16 << 20);
    if (info) {
      int n = 0;
      for (absl::string_view line : absl::StrSplit(*info, '\n')) {
        if (absl::StartsWith(line, "processor")) {
          auto colon = line.find(':');
          if (colon != absl::string_view::npos) ++n;
        }
      }
      if (n > 0) {
        t_->set_cpu_count(n);
        return;
      }
    }
    Unknown(online ? "cpu_count: /sys/devices/system/cpu/online is garbage (\"" +
                         online->substr(0, 40) +
                         "\") and /proc/cpuinfo has no processor lines"
                   : "cpu_count: /sys/devices/system/cpu/online and "
                     "/proc/cpuinfo unreadable");
  }

  void Memory() {
    auto info = ReadFile(P("/proc/meminfo"), 1 << 20);
    if (!info) {
      Unknown("memory: /proc/meminfo unreadable");
      return;
    }
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
      line = absl::StripAsciiWhitespace(line);
      absl::ConsumeSuffix(&line, "kB");
      line = absl::StripAsciiWhitespace(line);
      uint64_t kb = 0;
      if (absl::SimpleAtoi(line, &kb) && kb > 0) {
        t_->set_memory_bytes(kb * 1024);
        return;
      }
      Unknown(absl::StrCat("memory: /proc/meminfo MemTotal is garbage (\"",
                           line.substr(0, 40), "\")"));
      return;
    }
    Unknown("memory: /proc/meminfo has no MemTotal line");
  }

  void Numa() {
    std::string dir = P("/sys/devices/system/node");
    if (!IsDir(dir)) {
      Unknown("numa_nodes: /sys/devices/system/node missing");
      return;
    }
    int n = 0;
    for (const std::string& name : ListDir(dir)) {
      int id;
      if (absl::StartsWith(name, "node") &&
          absl::SimpleAtoi(absl::string_view(name).substr(4), &id))
        ++n;
    }
    if (n == 0) {
      Unknown("numa_nodes: no node* under /sys/devices/system/node");
      return;
    }
    t_->set_numa_nodes(n);
  }

  void Wsl2() {
    bool any = false;
    for (const char* f : {"/proc/version", "/proc/sys/kernel/osrelease"}) {
      auto s = ReadFile(P(f), 4096);
      if (!s) continue;
      any = true;
      if (absl::StrContains(absl::AsciiStrToLower(*s), "microsoft")) {
        t_->set_wsl2(true);
        return;
      }
    }
    if (!any)
      Unknown("wsl2: /proc/version and /proc/sys/kernel/osrelease unreadable");
  }

  void Shm() {
    auto size = ReadTrimmed(P("/dev/shm.size"));
    if (size && !(opt_.root.empty() || opt_.root == "/")) {
      std::vector<absl::string_view> parts =
          absl::StrSplit(*size, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
      uint64_t total = 0, free_b = 0;
      if (!parts.empty() && parts.size() <= 2 &&
          absl::SimpleAtoi(parts[0], &total) &&
          (parts.size() == 1 || absl::SimpleAtoi(parts[1], &free_b))) {
        if (parts.size() == 1) free_b = total;
        t_->set_shm_total_bytes(total);
        t_->set_shm_free_bytes(std::min(free_b, total));
        return;
      }
      Unknown(absl::StrCat("shm: /dev/shm.size is garbage (\"",
                           size->substr(0, 40), "\")"));
      return;
    }
    struct statvfs st;
    std::string path = P("/dev/shm");
    if (statvfs(path.c_str(), &st) != 0 || !IsDir(path)) {
      Unknown("shm: /dev/shm missing or not statable");
      return;
    }
    t_->set_shm_total_bytes(static_cast<uint64_t>(st.f_blocks) * st.f_frsize);
    t_->set_shm_free_bytes(static_cast<uint64_t>(st.f_bavail) * st.f_frsize);
  }

  void Cgroup() {
    // cgroup v2 first.
    auto mem = ReadTrimmed(P("/sys/fs/cgroup/memory.max"));
    bool have_v2_mem = false;
    if (mem) {
      have_v2_mem = true;
      uint64_t v;
      if (*mem == "max") {
        // No limit.
      } else if (absl::SimpleAtoi(*mem, &v)) {
        t_->set_cgroup_memory_limit_bytes(v);
      } else {
        Unknown(absl::StrCat("cgroup memory.max is garbage (\"",
                             mem->substr(0, 40), "\")"));
      }
    }
    if (!have_v2_mem) {
      auto v1mem =
          ReadTrimmed(P("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
      uint64_t v;
      if (v1mem && absl::SimpleAtoi(*v1mem, &v)) {
        // v1 reports "no limit" as a huge page-aligned number.
        if (v < (uint64_t{1} << 60)) t_->set_cgroup_memory_limit_bytes(v);
      } else if (v1mem) {
        Unknown(absl::StrCat("cgroup memory.limit_in_bytes is garbage (\"",
                             v1mem->substr(0, 40), "\")"));
      }
    }
    auto cpu = ReadTrimmed(P("/sys/fs/cgroup/cpu.max"));
    if (cpu) {
      std::vector<absl::string_view> parts =
          absl::StrSplit(*cpu, ' ', absl::SkipEmpty());
      double quota = 0, period = 0;
      if (parts.size() == 2 && parts[0] == "max") {
        // No limit.
      } else if (parts.size() == 2 && absl::SimpleAtod(parts[0], &quota) &&
                 absl::SimpleAtod(parts[1], &period) && quota > 0 &&
                 period > 0) {
        t_->set_cgroup_cpu_limit(quota / period);
      } else {
        Unknown(absl::StrCat("cgroup cpu.max is garbage (\"",
                             cpu->substr(0, 40), "\")"));
      }
      return;
    }
    auto q = ReadTrimmed(P("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"));
    auto p = ReadTrimmed(P("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
    if (q && p) {
      double quota = 0, period = 0;
      if (absl::SimpleAtod(*q, &quota) && absl::SimpleAtod(*p, &period)) {
        if (quota > 0 && period > 0) t_->set_cgroup_cpu_limit(quota / period);
      } else {
        Unknown("cgroup cpu.cfs_quota_us/cpu.cfs_period_us are garbage");
      }
    }
  }

 private:
  const ProbeOptions& opt_;
  v1::Topology* t_;
};

}  // namespace

absl::StatusOr<v1::Topology> ProbeTopology(const ProbeOptions& options) {
  std::string root = options.root.empty() ? "/" : options.root;
  if (!IsDir(root)) {
    return absl::NotFoundError(absl::StrCat(
        "topology probe: root \"", root,
        "\" is not a readable directory (use \"/\" or a fixture tree such as "
        "tests/fixtures/cpu-only/root)"));
  }
  ProbeOptions opt = options;
  opt.root = root;
  v1::Topology t;
  Prober p(opt, &t);
  p.Hostname();
  p.Cpus();
  p.Memory();
  p.Numa();
  p.Wsl2();
  p.Shm();
  p.Cgroup();
  return t;
}

}  // namespace dgca
