#include "topology/topo_matrix.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dgca {
namespace {

std::vector<std::string> Tokens(absl::string_view line) {
  std::vector<std::string> out;
  for (absl::string_view t :
       absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty()))
    out.emplace_back(t);
  return out;
}

bool IsGpuLabel(absl::string_view s, int* index) {
  if (!absl::ConsumePrefix(&s, "GPU") || s.empty()) return false;
  int i = 0;
  if (!absl::SimpleAtoi(s, &i) || i < 0) return false;
  if (index) *index = i;
  return true;
}

std::string Human(uint64_t bytes) {
  if (bytes == 0) return "unknown";
  const double gib = 1024.0 * 1024 * 1024;
  if (bytes >= gib) return absl::StrFormat("%.1f GiB", bytes / gib);
  return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024));
}

}  // namespace

bool IsValidPathType(absl::string_view c) {
  if (c == "X" || c == "PIX" || c == "PXB" || c == "PHB" || c == "NODE" ||
      c == "SYS")
    return true;
  if (absl::ConsumePrefix(&c, "NV")) {
    int n = 0;
    return !c.empty() && absl::SimpleAtoi(c, &n) && n > 0;
  }
  return false;
}

int TopoMatrix::gpu_count() const {
  int n = 0;
  for (const auto& d : devices)
    if (IsGpuLabel(d, nullptr)) ++n;
  return n;
}

int TopoMatrix::GpuRow(int g) const {
  const std::string label = absl::StrCat("GPU", g);
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == label) return static_cast<int>(i);
  return -1;
}

std::string TopoMatrix::GpuPath(int a, int b) const {
  int ra = GpuRow(a), rb = GpuRow(b);
  if (ra < 0 || rb < 0) return "";
  return cells[ra][rb];
}

absl::StatusOr<TopoMatrix> ParseNvidiaSmiTopo(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  TopoMatrix m;
  size_t header = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> t = Tokens(lines[i]);
    if (!t.empty() && t[0] == "GPU0") {
      header = i;
      break;
    }
  }
  if (header == lines.size())
    return absl::InvalidArgumentError(
        "nvidia-smi topo -m text: no header line starting with GPU0 (expected "
        "the output of `nvidia-smi topo -m`)");
  std::vector<std::string> ht = Tokens(lines[header]);
  for (const std::string& tok : ht) {
    if (tok == "CPU" || tok == "NUMA" || tok == "GPU") break;
    m.devices.push_back(tok);
  }
  const std::string hl(lines[header]);
  const bool has_cpu = absl::StrContains(hl, "CPU Affinity");
  const bool has_numa = absl::StrContains(hl, "NUMA Affinity");
  const size_t d = m.devices.size();
  m.cells.assign(d, std::vector<std::string>(d));
  m.cpu_affinity.assign(d, "");
  m.numa_affinity.assign(d, "");
  std::vector<bool> seen(d, false);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < d; ++i) {
    if (index.count(m.devices[i]))
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", header + 1, ": device \"", m.devices[i],
          "\" appears twice in the header"));
    index[m.devices[i]] = i;
  }

  size_t i = header + 1;
  for (; i < lines.size(); ++i) {
    std::string line(absl::StripAsciiWhitespace(lines[i]));
    if (line.empty()) continue;
    if (absl::StartsWith(line, "Legend")) break;
    std::vector<std::string> t = Tokens(line);
    auto it = index.find(t[0]);
    if (it == index.end())
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", i + 1, ": row label \"", t[0],
          "\" is not one of the header's devices (",
          absl::StrJoin(m.devices, ", "), ")"));
    size_t r = it->second;
    if (seen[r])
      return absl::InvalidArgumentError(
          absl::StrCat("line ", i + 1, ": second row for ", t[0]));
    seen[r] = true;
    if (t.size() < d + 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", i + 1, ": row ", t[0], " has ", t.size() - 1,
          " cells; the header has ", d, " devices"));
    for (size_t c = 0; c < d; ++c) {
      std::string cell = t[c + 1];
      if (cell == "SOC") cell = "SYS";  // pre-2017 drivers
      if (!IsValidPathType(cell))
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", i + 1, ": cell ", c + 1, " of row ", t[0], " is \"",
            cell, "\"; expected X, NV<n>, PIX, PXB, PHB, NODE or SYS"));
      if ((c == r) != (cell == "X"))
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", i + 1, ": row ", t[0], " column ", m.devices[c],
            " is \"", cell, "\"; X belongs on the diagonal and only there"));
      m.cells[r][c] = cell;
    }
    size_t rest = d + 1;
    if (has_cpu && t.size() > rest) {
      if (t[rest] != "N/A") m.cpu_affinity[r] = t[rest];
      ++rest;
    }
    if (has_numa && t.size() > rest && t[rest] != "N/A")
      m.numa_affinity[r] = t[rest];
  }
  // Legend and NIC legend.
  bool in_nic_legend = false;
  for (; i < lines.size(); ++i) {
    std::string line(absl::StripAsciiWhitespace(lines[i]));
    if (absl::StartsWith(line, "NIC Legend")) {
      in_nic_legend = true;
      continue;
    }
    if (!in_nic_legend || line.empty()) continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (kv.size() == 2)
      m.nic_names[std::string(absl::StripAsciiWhitespace(kv[0]))] =
          std::string(absl::StripAsciiWhitespace(kv[1]));
  }
  for (size_t r = 0; r < d; ++r) {
    if (!seen[r] && IsGpuLabel(m.devices[r], nullptr))
      return absl::InvalidArgumentError(absl::StrCat(
          "nvidia-smi topo -m text: no row for ", m.devices[r]));
    if (!seen[r]) {
      // A NIC without a row (truncated paste): fill from the columns.
      for (size_t c = 0; c < d; ++c) m.cells[r][c] = m.cells[c][r];
      m.cells[r][r] = "X";
    }
  }
  int g = m.gpu_count();
  for (int k = 0; k < g; ++k)
    if (m.GpuRow(k) < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "nvidia-smi topo -m text: GPUs are not numbered 0..", g - 1,
          " (GPU", k, " missing)"));
  return m;
}

std::string FormatTopoMatrix(const v1::Topology& t) {
  const int n = t.gpus_size();
  std::map<std::pair<int, int>, std::string> path;
  for (const auto& l : t.links()) {
    path[{l.a(), l.b()}] = l.path();
    path[{l.b(), l.a()}] = l.path();
  }
  std::string out;
  if (n == 0) {
    out += "No NVIDIA GPUs found.\n";
  } else {
    out += absl::StrFormat("%-8s", "");
    for (int j = 0; j < n; ++j) out += absl::StrFormat("%-8s", absl::StrCat("GPU", j));
    out += "CPU Affinity    NUMA Affinity\n";
    for (int i = 0; i < n; ++i) {
      out += absl::StrFormat("%-8s", absl::StrCat("GPU", i));
      for (int j = 0; j < n; ++j) {
        std::string c = i == j ? "X" : "?";
        auto it = path.find({i, j});
        if (i != j && it != path.end()) c = it->second;
        out += absl::StrFormat("%-8s", c == "X" ? " X" : c);
      }
      const v1::Gpu& g = t.gpus(i);
      out += absl::StrFormat(
          "%-16s%s\n", g.cpu_affinity().empty() ? "N/A" : g.cpu_affinity(),
          g.numa_node() < 0 ? "N/A" : absl::StrCat(g.numa_node()));
    }
    out +=
        "\nLegend:\n\n"
        "  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect "
        "between NUMA nodes (e.g., QPI/UPI)\n"
        "  NODE = Connection traversing PCIe as well as the interconnect "
        "between PCIe Host Bridges within a NUMA node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge "
        "(typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges (without "
        "traversing the PCIe Host Bridge)\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks\n"
        "  ?    = Unknown (see the unknown facts below)\n";
  }
  out += absl::StrFormat("\nNode %s (hostname %s)\n", t.node(), t.hostname());
  out += absl::StrFormat("  CPUs: %s%s\n",
                         t.cpu_count() > 0 ? absl::StrCat(t.cpu_count()) : "unknown",
                         t.cgroup_cpu_limit() > 0
                             ? absl::StrFormat(" (cgroup limit %.2f cores)",
                                               t.cgroup_cpu_limit())
                             : "");
  out += absl::StrFormat(
      "  Memory: %s%s\n", Human(t.memory_bytes()),
      t.cgroup_memory_limit_bytes() > 0
          ? absl::StrCat(" (cgroup limit ", Human(t.cgroup_memory_limit_bytes()), ")")
          : "");
  out += absl::StrFormat("  NUMA nodes: %s\n",
                         t.numa_nodes() > 0 ? absl::StrCat(t.numa_nodes()) : "unknown");
  out += absl::StrFormat("  WSL2: %s\n", t.wsl2() ? "yes" : "no");
  out += absl::StrFormat("  /dev/shm: %s total, %s free\n",
                         Human(t.shm_total_bytes()), Human(t.shm_free_bytes()));
  if (!t.driver_version().empty() || !t.cuda_version().empty())
    out += absl::StrFormat("  Driver %s, CUDA %s\n",
                           t.driver_version().empty() ? "unknown" : t.driver_version(),
                           t.cuda_version().empty() ? "unknown" : t.cuda_version());
  for (const auto& g : t.gpus()) {
    out += absl::StrFormat(
        "  GPU%d: %s, %s, bus %s, NUMA %s, compute capability %s, PCIe %s x%s "
        "[%s]\n",
        g.index(), g.name().empty() ? "name unknown" : g.name(),
        Human(g.memory_bytes()), g.pci_bus_id().empty() ? "unknown" : g.pci_bus_id(),
        g.numa_node() < 0 ? "unknown" : absl::StrCat(g.numa_node()),
        g.compute_capability_major() > 0
            ? absl::StrCat(g.compute_capability_major(), ".",
                           g.compute_capability_minor())
            : "unknown",
        g.link_speed().empty() ? "?" : g.link_speed(),
        g.link_width() > 0 ? absl::StrCat(g.link_width()) : "?", g.source());
  }
  if (t.net_devices_size() == 0) out += "  InfiniBand/RoCE: none\n";
  for (const auto& d : t.net_devices())
    out += absl::StrFormat("  %s: %s, %s, %.0f Gb/s%s\n", d.name(), d.link_layer(),
                           d.state(), d.rate_gbps(),
                           d.pci_bus_id().empty() ? "" : absl::StrCat(", bus ", d.pci_bus_id()));
  out += absl::StrFormat("  NVML: %s\n", t.nvml_available()
                                             ? "available"
                                             : absl::StrCat("unavailable (", t.nvml_error(), ")"));
  for (const auto& s : t.sources()) out += absl::StrCat("  source: ", s, "\n");
  if (t.unknown_size() > 0) {
    out += "Unknown facts:\n";
    for (const auto& u : t.unknown()) out += absl::StrCat("  ", u, "\n");
  }
  return out;
}

}  // namespace dgca
