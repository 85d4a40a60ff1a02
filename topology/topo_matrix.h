// `nvidia-smi topo -m` text: a parser (a second source for the probe, and the
// reference the fixtures are checked against) and a formatter that prints a
// v1::Topology the same way, plus the node facts (`dgca topo`).
//
// Accepted input (what nvidia-smi has printed over the years, as pasted into
// bug reports): a header line whose first token is GPU0, columns separated by
// tabs or runs of spaces; device columns GPU<n>, NIC<n> or NIC names
// (mlx5_0, mlx4_0, ...); optional trailing "CPU Affinity", "NUMA Affinity"
// and "GPU NUMA ID" columns; cells X, NV<n>, PIX, PXB, PHB, NODE, SYS (SOC,
// the pre-2017 name of SYS, is read as SYS); then "Legend:" and an optional
// "NIC Legend:" with "NIC0: mlx5_0" lines. Lines before the header (a shell
// prompt, the command itself) are ignored.
//
// Thread-safety: pure functions.
#ifndef DGCA_TOPOLOGY_TOPO_MATRIX_H_
#define DGCA_TOPOLOGY_TOPO_MATRIX_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgca/v1/topology.pb.h"

namespace dgca {

struct TopoMatrix {
  // Column/row labels in order, e.g. {"GPU0", "GPU1", "NIC0"}.
  std::vector<std::string> devices;
  // cells[i][j]: path from devices[i] to devices[j] ("X", "NV18", "SYS", ...).
  std::vector<std::vector<std::string>> cells;
  // Per row; "" when the row has no such column (NIC rows) or it is "N/A".
  std::vector<std::string> cpu_affinity;
  std::vector<std::string> numa_affinity;
  // "NIC0" -> "mlx5_0" from the NIC legend.
  std::map<std::string, std::string> nic_names;

  // Number of GPU<n> rows; GPU rows come first in nvidia-smi's output but
  // this does not rely on it.
  int gpu_count() const;
  // Index into devices of "GPU<g>", -1 if absent.
  int GpuRow(int g) const;
  // Path between GPU a and GPU b ("" if either is absent).
  std::string GpuPath(int a, int b) const;
};

// Parses `nvidia-smi topo -m` output. Errors name the line (1-based) and what
// was expected, e.g. "line 4: cell 3 is \"FOO\"; expected X, NV<n>, PIX, PXB,
// PHB, NODE or SYS".
absl::StatusOr<TopoMatrix> ParseNvidiaSmiTopo(absl::string_view text);

// True for X, NV<n>, PIX, PXB, PHB, NODE, SYS.
bool IsValidPathType(absl::string_view cell);

// The GPU matrix of `t` in nvidia-smi's layout (GPU rows and columns, CPU
// Affinity, NUMA Affinity), its legend, then the node facts (CPUs, memory,
// NUMA nodes, WSL2, /dev/shm, cgroup limits, GPUs with memory and compute
// capability, network devices, NVML status, sources) and every unknown.
// Pairs missing from t.links print as "?".
std::string FormatTopoMatrix(const v1::Topology& t);

}  // namespace dgca

#endif  // DGCA_TOPOLOGY_TOPO_MATRIX_H_
