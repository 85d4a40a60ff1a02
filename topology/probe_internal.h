// Internal helpers of the topology probe (file reading under a root). Not a
// public interface: only topology uses it.
#ifndef DGCA_TOPOLOGY_PROBE_INTERNAL_H_
#define DGCA_TOPOLOGY_PROBE_INTERNAL_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/topology.pb.h"
#include "topology/nvml.h"
#include "topology/probe.h"

namespace dgca {
namespace topo_internal {

// root + path ("/" root leaves path as is).
std::string JoinRoot(const std::string& root, const std::string& path);
// At most max_bytes of the file; nullopt when it cannot be opened.
std::optional<std::string> ReadFile(const std::string& path, size_t max_bytes);
// The file with surrounding whitespace removed (files up to 64 KiB).
std::optional<std::string> ReadTrimmed(const std::string& path);
// Sorted entry names (no "." / ".."); empty when unreadable.
std::vector<std::string> ListDir(const std::string& path);
bool IsDir(const std::string& path);
// Number of CPUs in a kernel cpu list ("0-3,8"); -1 on garbage.
int CountCpuList(const std::string& list);

// Where a PCI device sits: the host bridge it hangs under ("pci0000:00", the
// root of /sys/devices/pciDDDD:BB), the chain of bus ids from the root port
// down to the device itself (device last), and its NUMA node (-1 unknown).
struct PciLocation {
  std::string root;
  std::vector<std::string> chain;
  int numa = -1;
};

// Resolves root/sys/bus/pci/devices/<bdf> (a symlink into
// /sys/devices/pciDDDD:BB/...) into a PciLocation (numa not filled).
// nullopt when the link cannot be resolved or has no pci* component.
std::optional<PciLocation> ResolvePciLocation(const std::string& root,
                                              const std::string& bdf);

// The path type between two PCI devices as nvidia-smi names it:
//   different host bridges: NODE if both are on the same NUMA node (both
//     unknown counts as the same), else SYS;
//   same host bridge, different root ports: PHB;
//   same root port: PIX if each side is at most one bridge below the
//     deepest common bridge (one PCIe switch), else PXB.
std::string PciPathType(const PciLocation& a, const PciLocation& b);

// "00000000:17:00.0" / "0000:17:00.0" / "17:00.0" -> "0000:17:00.0"
// (lowercase, 4-digit domain). Returns "" for garbage.
std::string NormalizeBusId(const std::string& s);

// True when s looks like a PCI address "DDDD:BB:DD.F".
bool IsBdf(const std::string& s);

// ProbeTopology with NVML's answer given (tests); nvml == nullptr queries
// NVML as ProbeTopology does. An injected report is merged whatever the root.
absl::StatusOr<v1::Topology> ProbeTopologyWithNvml(const ProbeOptions& options,
                                                   const NvmlReport* nvml);

}  // namespace topo_internal
}  // namespace dgca

#endif  // DGCA_TOPOLOGY_PROBE_INTERNAL_H_
