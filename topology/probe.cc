#include "topology/probe.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
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
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "topology/command.h"
#include "topology/nvml.h"
#include "topology/probe_internal.h"
#include "topology/topo_matrix.h"

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
    // Dot entries: "." and "..", and the .gitkeep files that keep empty
    // fixture directories in git (sysfs itself has no dot files).
    if (name.empty() || name[0] == '.') continue;
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
using topo_internal::IsBdf;
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

  // The CPU's GEMM rate from the program that measures it (ProbeOptions.
  // gemm_rate_command): "threads=N flops=F" lines; the first N is 1, the
  // last every CPU.
  void GemmRate() {
    if (opt_.gemm_rate_command.empty()) return;
    const std::string what = CommandLine(opt_.gemm_rate_command);
    auto r = RunCommand(opt_.gemm_rate_command, 20);
    if (!r.ok() || r->exit_code != 0) {
      Unknown(absl::StrCat("cpu_gemm: `", what, "` ",
                           r.ok() ? absl::StrCat("exited ", r->exit_code, ": ",
                                                 absl::StripAsciiWhitespace(r->err).substr(0, 200))
                                  : std::string(r.status().message())));
      return;
    }
    std::vector<std::pair<int, double>> rates;
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
      int threads = 0;
      double flops = 0;
      absl::string_view tv, fv;
      for (absl::string_view kv : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
        if (absl::ConsumePrefix(&kv, "threads=")) tv = kv;
        if (absl::ConsumePrefix(&kv, "flops=")) fv = kv;
      }
      if (absl::SimpleAtoi(tv, &threads) && absl::SimpleAtod(fv, &flops) && threads > 0 &&
          flops > 0 && std::isfinite(flops))
        rates.emplace_back(threads, flops);
    }
    if (rates.empty() || rates.front().first != 1) {
      Unknown(absl::StrCat("cpu_gemm: `", what, "` printed no \"threads=1 flops=F\" line"));
      return;
    }
    t_->set_cpu_gemm_flops_one_thread(rates.front().second);
    t_->set_cpu_gemm_flops_all_threads(rates.back().second);
  }

  // Model name, clock and SIMD width of the first processor block.
  void CpuKind(absl::string_view info) {
    for (absl::string_view line : absl::StrSplit(info, '\n')) {
      if (line.empty()) break;  // the first processor's block ends
      const auto colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
      const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      double mhz = 0;
      if (key == "model name") {
        t_->set_cpu_model(std::string(value));
      } else if (key == "cpu MHz" && absl::SimpleAtod(value, &mhz) && mhz > 0) {
        t_->set_cpu_mhz(mhz);
      } else if (key == "flags" || key == "Features") {
        const std::vector<absl::string_view> flags = absl::StrSplit(value, ' ');
        auto has = [&](absl::string_view f) {
          return std::find(flags.begin(), flags.end(), f) != flags.end();
        };
        t_->set_cpu_vector_bits(has("avx512f")                ? 512
                                : has("avx2") && has("fma")   ? 256
                                : has("sse2") || has("asimd") ? 128
                                                              : 0);
      }
    }
  }

  void Cpus() {
    auto online = ReadTrimmed(P("/sys/devices/system/cpu/online"));
    auto info = ReadFile(P("/proc/cpuinfo"), 16 << 20);
    if (info) CpuKind(*info);
    if (online) {
      int n = CountCpuList(*online);
      if (n > 0) {
        t_->set_cpu_count(n);
        return;
      }
    }
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

  // ---- GPUs ---------------------------------------------------------------

  void PciGpus() {
    const std::string dir = P("/sys/bus/pci/devices");
    if (!IsDir(dir)) {
      Unknown("gpus: /sys/bus/pci/devices missing; PCI GPUs unknown");
      t_->add_sources("sysfs: /sys/bus/pci/devices missing");
      return;
    }
    for (const std::string& bdf : ListDir(dir)) {
      if (!IsBdf(bdf)) continue;
      auto vendor = ReadTrimmed(dir + "/" + bdf + "/vendor");
      if (!vendor) {
        Unknown(absl::StrCat("pci ", bdf, " vendor: unreadable"));
        continue;
      }
      if (absl::AsciiStrToLower(*vendor) != "0x10de") continue;
      auto cls = ReadTrimmed(dir + "/" + bdf + "/class");
      if (!cls) {
        Unknown(absl::StrCat("pci ", bdf, " (NVIDIA) class: unreadable; not counted as a GPU"));
        continue;
      }
      // 0x0300xx VGA, 0x0302xx 3D controller; NVIDIA audio (0x0403) and
      // NVSwitch (0x0680) are not GPUs.
      if (!absl::StartsWith(absl::AsciiStrToLower(*cls), "0x03")) continue;
      GpuEntry e;
      e.bdf = bdf;
      e.gpu.set_pci_bus_id(bdf);
      e.gpu.set_numa_node(-1);
      e.gpu.set_source("sysfs");
      const std::string base = dir + "/" + bdf + "/";
      auto numa = ReadTrimmed(base + "numa_node");
      int nn = -1;
      if (!numa) {
        Unknown(absl::StrCat("gpu ", bdf, " numa_node: unreadable"));
      } else if (!absl::SimpleAtoi(*numa, &nn) || nn < -1 || nn > 4096) {
        Unknown(absl::StrCat("gpu ", bdf, " numa_node: garbage (\"",
                             numa->substr(0, 40), "\")"));
        nn = -1;
      }
      e.gpu.set_numa_node(nn);
      auto speed = ReadTrimmed(base + "current_link_speed");
      if (speed && !speed->empty() && speed->size() < 64 &&
          absl::StrContains(*speed, "GT/s")) {
        e.gpu.set_link_speed(*speed);
      } else {
        Unknown(absl::StrCat("gpu ", bdf, " current_link_speed: ",
                             speed ? "garbage (\"" + speed->substr(0, 40) + "\")"
                                   : std::string("unreadable")));
      }
      auto width = ReadTrimmed(base + "current_link_width");
      int w = 0;
      if (width && absl::SimpleAtoi(*width, &w) && w > 0 && w <= 32) {
        e.gpu.set_link_width(w);
      } else {
        Unknown(absl::StrCat("gpu ", bdf, " current_link_width: ",
                             width ? "garbage (\"" + width->substr(0, 40) + "\")"
                                   : std::string("unreadable")));
      }
      auto cpus = ReadTrimmed(base + "local_cpulist");
      if (cpus && CountCpuList(*cpus) > 0) e.gpu.set_cpu_affinity(*cpus);
      e.loc = topo_internal::ResolvePciLocation(opt_.root, bdf);
      if (!e.loc) {
        Unknown(absl::StrCat(
            "gpu ", bdf, " pci path: /sys/bus/pci/devices/", bdf,
            " does not resolve into /sys/devices/pci*; its path types are unknown"));
      } else {
        e.loc->numa = nn;
      }
      gpus_.push_back(std::move(e));
    }
    for (size_t a = 0; a < gpus_.size(); ++a)
      for (size_t b = a + 1; b < gpus_.size(); ++b)
        if (gpus_[a].loc && gpus_[b].loc)
          links_[{static_cast<int>(a), static_cast<int>(b)}] =
              topo_internal::PciPathType(*gpus_[a].loc, *gpus_[b].loc);
    t_->add_sources(absl::StrCat("sysfs: ", gpus_.size(),
                                 " NVIDIA GPU(s) on the PCI bus"));
  }

  void TopoText() {
    std::string text = opt_.nvidia_smi_topo_text;
    std::string src = "ProbeOptions.nvidia_smi_topo_text";
    if (text.empty()) {
      auto f = ReadFile(P("/nvidia-smi-topo.txt"), 1 << 20);
      if (!f) return;
      text = *f;
      src = "nvidia-smi-topo.txt";
    }
    auto m = ParseNvidiaSmiTopo(text);
    if (!m.ok()) {
      Unknown(absl::StrCat(src, ": not usable: ", m.status().message()));
      return;
    }
    const int n = m->gpu_count();
    if (gpus_.empty()) {
      for (int g = 0; g < n; ++g) {
        GpuEntry e;
        e.gpu.set_numa_node(-1);
        e.gpu.set_source("nvidia-smi");
        int r = m->GpuRow(g);
        int nn;
        if (absl::SimpleAtoi(m->numa_affinity[r], &nn)) e.gpu.set_numa_node(nn);
        e.gpu.set_cpu_affinity(m->cpu_affinity[r]);
        gpus_.push_back(std::move(e));
      }
      for (int a = 0; a < n; ++a)
        for (int b = a + 1; b < n; ++b) links_[{a, b}] = m->GpuPath(a, b);
      t_->add_sources(absl::StrCat(
          src, ": ", n, " GPU(s) and every path (sysfs shows no NVIDIA PCI "
          "GPU, as under WSL2 where GPUs are paravirtualized)"));
      return;
    }
    if (n != static_cast<int>(gpus_.size())) {
      Unknown(absl::StrCat(src, " lists ", n, " GPU(s) but sysfs shows ",
                           gpus_.size(), "; ignored"));
      return;
    }
    int nv = 0, disagree = 0;
    for (int a = 0; a < n; ++a) {
      int r = m->GpuRow(a);
      if (gpus_[a].gpu.cpu_affinity().empty())
        gpus_[a].gpu.set_cpu_affinity(m->cpu_affinity[r]);
      int nn;
      if (gpus_[a].gpu.numa_node() < 0 &&
          absl::SimpleAtoi(m->numa_affinity[r], &nn))
        gpus_[a].gpu.set_numa_node(nn);
      gpus_[a].gpu.set_source(gpus_[a].gpu.source() + "+nvidia-smi");
      for (int b = a + 1; b < n; ++b) {
        const std::string p = m->GpuPath(a, b);
        auto it = links_.find({a, b});
        if (absl::StartsWith(p, "NV")) {
          ++nv;
        } else if (it != links_.end() && it->second != p) {
          ++disagree;
          Unknown(absl::StrCat("gpu pair ", a, "-", b, " path: sysfs says ",
                               it->second, ", ", src, " says ", p,
                               "; using ", src));
        }
        links_[{a, b}] = p;
      }
    }
    t_->add_sources(absl::StrCat(src, ": ", n, " GPU(s); NVLink (NV#) for ",
                                 nv, " pair(s); ", disagree,
                                 " disagreement(s) with sysfs"));
  }

  void QueryCsv() {
    std::string text = opt_.nvidia_smi_query_text;
    std::string src = "ProbeOptions.nvidia_smi_query_text";
    if (text.empty()) {
      auto f = ReadFile(P("/nvidia-smi-query-gpu.csv"), 1 << 20);
      if (!f) return;
      text = *f;
      src = "nvidia-smi-query-gpu.csv";
    }
    std::map<std::string, int> col;
    int matched = 0, lineno = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++lineno;
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      std::vector<std::string> f;
      for (absl::string_view c : absl::StrSplit(line, ','))
        f.emplace_back(absl::StripAsciiWhitespace(c));
      if (col.empty()) {
        for (size_t i = 0; i < f.size(); ++i) {
          std::string k = f[i].substr(0, f[i].find(' '));
          col[k] = static_cast<int>(i);
        }
        if (!col.count("index")) {
          Unknown(absl::StrCat(src, ": no header with an index column; ignored"));
          return;
        }
        continue;
      }
      auto get = [&](const std::string& k) -> std::string {
        auto it = col.find(k);
        if (it == col.end() || it->second >= static_cast<int>(f.size())) return "";
        return f[it->second];
      };
      int idx = -1;
      if (!absl::SimpleAtoi(get("index"), &idx) || idx < 0) {
        Unknown(absl::StrCat(src, ":", lineno, ": index \"", get("index"),
                             "\" is not a number; row ignored"));
        continue;
      }
      GpuEntry* e = nullptr;
      std::string bus = topo_internal::NormalizeBusId(get("pci.bus_id"));
      for (auto& g : gpus_)
        if (!bus.empty() && g.bdf == bus) e = &g;
      if (e == nullptr && idx < static_cast<int>(gpus_.size()) &&
          (gpus_[idx].bdf.empty() || bus.empty()))
        e = &gpus_[idx];
      if (e == nullptr) {
        Unknown(absl::StrCat(src, ":", lineno, ": GPU ", idx, " (", get("pci.bus_id"),
                             ") matches no probed GPU; row ignored"));
        continue;
      }
      ++matched;
      if (!get("name").empty()) e->gpu.set_name(get("name"));
      if (e->gpu.pci_bus_id().empty() && !bus.empty()) e->gpu.set_pci_bus_id(bus);
      std::string mem_s = get("memory.total");
      absl::string_view mem = mem_s;
      absl::ConsumeSuffix(&mem, "MiB");
      uint64_t mib = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(mem), &mib) && mib > 0)
        e->gpu.set_memory_bytes(mib * 1024 * 1024);
      else if (!get("memory.total").empty())
        Unknown(absl::StrCat(src, ":", lineno, ": memory.total \"",
                             get("memory.total"), "\" is garbage"));
      std::vector<std::string> cc = absl::StrSplit(get("compute_cap"), '.');
      int ma = 0, mi = 0;
      if (cc.size() == 2 && absl::SimpleAtoi(cc[0], &ma) &&
          absl::SimpleAtoi(cc[1], &mi) && ma > 0) {
        e->gpu.set_compute_capability_major(ma);
        e->gpu.set_compute_capability_minor(mi);
      } else if (!get("compute_cap").empty()) {
        Unknown(absl::StrCat(src, ":", lineno, ": compute_cap \"",
                             get("compute_cap"), "\" is garbage"));
      }
      e->gpu.set_source(e->gpu.source() + "+query");
    }
    t_->add_sources(absl::StrCat(src, ": name, memory and compute capability for ",
                                 matched, " GPU(s)"));
  }

  void Nvml(const NvmlReport* injected) {
    if (!opt_.use_nvml && injected == nullptr) {
      t_->set_nvml_available(false);
      t_->set_nvml_error("not loaded (ProbeOptions.use_nvml = false)");
      t_->add_sources("nvml: not loaded (use_nvml = false)");
      return;
    }
    NvmlReport r = injected ? *injected : QueryNvml(opt_.nvml_library);
    t_->set_nvml_available(r.available);
    t_->set_nvml_error(r.error);
    if (!r.available) {
      t_->add_sources(absl::StrCat("nvml: unavailable: ", r.error));
      return;
    }
    if (injected == nullptr && !(opt_.root.empty() || opt_.root == "/")) {
      t_->add_sources(absl::StrCat("nvml: loaded but ignored: it describes this "
                                   "machine, not the root ", opt_.root));
      return;
    }
    t_->set_driver_version(r.driver_version);
    t_->set_cuda_version(r.cuda_version);
    std::map<std::string, int> by_bus;
    if (gpus_.empty()) {
      for (const NvmlGpu& g : r.gpus) {
        GpuEntry e;
        e.bdf = g.bus_id;
        e.gpu.set_pci_bus_id(g.bus_id);
        e.gpu.set_numa_node(-1);
        e.gpu.set_source("nvml");
        gpus_.push_back(std::move(e));
      }
    }
    for (size_t i = 0; i < gpus_.size(); ++i) by_bus[gpus_[i].bdf] = static_cast<int>(i);
    std::vector<std::map<int, int>> nv(gpus_.size());
    std::vector<int> to_switch(gpus_.size(), 0);
    int merged = 0;
    for (const NvmlGpu& g : r.gpus) {
      auto it = by_bus.find(g.bus_id);
      if (it == by_bus.end()) {
        Unknown(absl::StrCat("nvml GPU ", g.index, " (", g.bus_id,
                             ") matches no sysfs GPU; ignored"));
        continue;
      }
      ++merged;
      v1::Gpu& out = gpus_[it->second].gpu;
      if (!g.name.empty()) out.set_name(g.name);
      if (g.memory_bytes) out.set_memory_bytes(g.memory_bytes);
      if (g.cc_major) {
        out.set_compute_capability_major(g.cc_major);
        out.set_compute_capability_minor(g.cc_minor);
      }
      if (out.source() != "nvml") out.set_source(out.source() + "+nvml");
      for (const std::string& peer : g.nvlink_peers) {
        auto p = by_bus.find(peer);
        if (p != by_bus.end())
          nv[it->second][p->second]++;
        else
          to_switch[it->second]++;  // NVSwitch (or a non-GPU peer)
      }
    }
    // PCIe paths NVML knows where sysfs and nvidia-smi gave none (WSL2,
    // GPUs whose sysfs link could not be resolved).
    int filled = 0;
    for (const auto& [pair, path] : r.paths) {
      if (pair.first >= static_cast<int>(r.gpus.size()) ||
          pair.second >= static_cast<int>(r.gpus.size()) || path == "X")
        continue;
      auto ia = by_bus.find(r.gpus[pair.first].bus_id);
      auto ib = by_bus.find(r.gpus[pair.second].bus_id);
      if (ia == by_bus.end() || ib == by_bus.end()) continue;
      std::pair<int, int> key = std::minmax(ia->second, ib->second);
      if (links_.count(key)) continue;
      links_[key] = path;
      ++filled;
    }
    int nvpairs = 0;
    for (size_t a = 0; a < gpus_.size(); ++a)
      for (size_t b = a + 1; b < gpus_.size(); ++b) {
        int c = nv[a][static_cast<int>(b)];
        if (c == 0 && to_switch[a] > 0 && to_switch[b] > 0)
          c = std::min(to_switch[a], to_switch[b]);
        if (c > 0) {
          links_[{static_cast<int>(a), static_cast<int>(b)}] = absl::StrCat("NV", c);
          ++nvpairs;
        }
      }
    t_->add_sources(absl::StrCat("nvml: ", merged, " GPU(s); PCIe path for ", filled,
                                 " pair(s) sysfs lacked; NVLink for ", nvpairs,
                                 " pair(s); driver ", r.driver_version));
  }

  void Infiniband() {
    const std::string dir = P("/sys/class/infiniband");
    if (!IsDir(dir)) {
      t_->add_sources("infiniband: none (/sys/class/infiniband absent)");
      return;
    }
    int n = 0;
    for (const std::string& dev : ListDir(dir)) {
      const std::string ports_dir = dir + "/" + dev + "/ports";
      std::vector<std::string> ports = ListDir(ports_dir);
      if (ports.empty()) {
        Unknown(absl::StrCat("infiniband ", dev, ": no ports/ directory"));
        continue;
      }
      std::string bus;
      char buf[PATH_MAX];
      std::string devlink = dir + "/" + dev + "/device";
      if (realpath(devlink.c_str(), buf) != nullptr) {
        std::string rp = buf;
        std::string last = rp.substr(rp.find_last_of('/') + 1);
        if (IsBdf(last)) bus = last;
      }
      for (const std::string& port : ports) {
        const std::string pd = ports_dir + "/" + port + "/";
        v1::NetDevice* d = t_->add_net_devices();
        d->set_name(ports.size() > 1 ? absl::StrCat(dev, ":", port) : dev);
        d->set_pci_bus_id(bus);
        auto ll = ReadTrimmed(pd + "link_layer");
        if (ll && (*ll == "InfiniBand" || *ll == "Ethernet")) {
          d->set_link_layer(*ll);
        } else {
          d->set_link_layer("unknown");
          Unknown(absl::StrCat("infiniband ", d->name(), " link_layer: ",
                               ll ? "garbage (\"" + ll->substr(0, 40) + "\")"
                                  : std::string("unreadable")));
        }
        auto st = ReadTrimmed(pd + "state");  // "4: ACTIVE"
        if (st && !st->empty()) {
          auto colon = st->find(':');
          d->set_state(std::string(absl::StripAsciiWhitespace(
              colon == std::string::npos ? *st : st->substr(colon + 1))));
        } else {
          d->set_state("unknown");
          Unknown(absl::StrCat("infiniband ", d->name(), " state: unreadable"));
        }
        auto rate = ReadTrimmed(pd + "rate");  // "200 Gb/sec (4X HDR)"
        double gbps = 0;
        if (rate && absl::SimpleAtod(rate->substr(0, rate->find(' ')), &gbps) &&
            gbps >= 0) {
          d->set_rate_gbps(gbps);
        } else {
          Unknown(absl::StrCat("infiniband ", d->name(), " rate: ",
                               rate ? "garbage (\"" + rate->substr(0, 40) + "\")"
                                    : std::string("unreadable")));
        }
        ++n;
      }
    }
    t_->add_sources(absl::StrCat("infiniband: ", n, " port(s)"));
  }

  // Writes the GPUs (in bus order, as nvidia-smi numbers them) and links.
  void Finish() {
    for (size_t i = 0; i < gpus_.size(); ++i) {
      v1::Gpu* g = t_->add_gpus();
      *g = gpus_[i].gpu;
      g->set_index(static_cast<int>(i));
      const std::string id =
          g->pci_bus_id().empty() ? absl::StrCat("GPU", i) : g->pci_bus_id();
      if (g->memory_bytes() == 0)
        Unknown(absl::StrCat("gpu ", id,
                             " memory: unknown (no NVML, no nvidia-smi-query-gpu.csv)"));
      if (g->compute_capability_major() == 0)
        Unknown(absl::StrCat("gpu ", id,
                             " compute capability: unknown (no NVML, no "
                             "nvidia-smi-query-gpu.csv)"));
    }
    for (size_t a = 0; a < gpus_.size(); ++a)
      for (size_t b = a + 1; b < gpus_.size(); ++b) {
        auto it = links_.find({static_cast<int>(a), static_cast<int>(b)});
        if (it == links_.end()) {
          Unknown(absl::StrCat("gpu pair ", a, "-", b, " path: unknown"));
          continue;
        }
        v1::GpuLink* l = t_->add_links();
        l->set_a(static_cast<int>(a));
        l->set_b(static_cast<int>(b));
        l->set_path(it->second);
      }
  }

 private:
  struct GpuEntry {
    std::string bdf;
    std::optional<topo_internal::PciLocation> loc;
    v1::Gpu gpu;
  };
  const ProbeOptions& opt_;
  v1::Topology* t_;
  std::vector<GpuEntry> gpus_;
  std::map<std::pair<int, int>, std::string> links_;
};

}  // namespace

absl::StatusOr<v1::Topology> ProbeTopology(const ProbeOptions& options) {
  return topo_internal::ProbeTopologyWithNvml(options, nullptr);
}

absl::StatusOr<v1::Topology> topo_internal::ProbeTopologyWithNvml(
    const ProbeOptions& options, const NvmlReport* nvml) {
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
  p.PciGpus();
  p.TopoText();
  p.QueryCsv();
  p.Nvml(nvml);
  p.Infiniband();
  p.GemmRate();
  p.Finish();
  return t;
}

}  // namespace dgca
