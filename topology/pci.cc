// PCI tree helpers of the topology probe: resolving a device's place in the
// sysfs tree and classifying the path between two devices the way
// `nvidia-smi topo -m` (and NCCL) name it.
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "topology/probe_internal.h"

namespace dgca {
namespace topo_internal {

bool IsBdf(const std::string& s) {
  // DDDD:BB:DD.F
  if (s.size() != 12) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (i == 4 || i == 7) {
      if (c != ':') return false;
    } else if (i == 10) {
      if (c != '.') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

std::string NormalizeBusId(const std::string& in) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(in));
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  std::string out;
  if (parts.size() == 2) {
    out = "0000:" + s;
  } else if (parts.size() == 3) {
    std::string dom = parts[0];
    if (dom.size() > 4) dom = dom.substr(dom.size() - 4);
    while (dom.size() < 4) dom = "0" + dom;
    out = dom + ":" + parts[1] + ":" + parts[2];
  } else {
    return "";
  }
  return IsBdf(out) ? out : "";
}

std::optional<PciLocation> ResolvePciLocation(const std::string& root,
                                              const std::string& bdf) {
  std::string link = JoinRoot(root, "/sys/bus/pci/devices/" + bdf);
  char buf[PATH_MAX];
  if (realpath(link.c_str(), buf) == nullptr) return std::nullopt;
  std::vector<std::string> comps =
      absl::StrSplit(std::string(buf), '/', absl::SkipEmpty());
  PciLocation loc;
  // The last ".../devices/pci*" in the path (the root itself may contain
  // anything).
  size_t i = comps.size();
  for (size_t j = comps.size(); j-- > 1;) {
    if (comps[j - 1] == "devices" && absl::StartsWith(comps[j], "pci")) {
      i = j - 1;
      break;
    }
  }
  if (i + 1 >= comps.size()) return std::nullopt;
  loc.root = comps[i + 1];
  for (size_t j = i + 2; j < comps.size(); ++j) {
    if (IsBdf(comps[j])) loc.chain.push_back(comps[j]);
  }
  if (loc.chain.empty() || loc.chain.back() != bdf) return std::nullopt;
  return loc;
}

std::string PciPathType(const PciLocation& a, const PciLocation& b) {
  if (a.root != b.root) {
    if (a.numa == b.numa) return "NODE";
    return "SYS";
  }
  // Bridges above each device (its chain minus the device itself).
  const size_t na = a.chain.empty() ? 0 : a.chain.size() - 1;
  const size_t nb = b.chain.empty() ? 0 : b.chain.size() - 1;
  size_t common = 0;
  while (common < na && common < nb && a.chain[common] == b.chain[common])
    ++common;
  if (common == 0) return "PHB";
  // Bridges below the deepest common one, on each side. One PCIe switch is
  // an upstream port (common) plus one downstream port per device.
  const size_t below_a = na - common, below_b = nb - common;
  if (below_a <= 1 && below_b <= 1) return "PIX";
  return "PXB";
}

}  // namespace topo_internal
}  // namespace dgca
