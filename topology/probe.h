// Node topology probe: what this machine offers a training job (docs/planner.md,
// "Topology facts"). Every file the probe reads is read under
// ProbeOptions.root, so tests run on fixture trees (tests/fixtures/<name>/root).
//
// Sources, in order:
//   - /proc/cpuinfo, /sys/devices/system/cpu/online: CPU count
//   - /proc/meminfo: memory
//   - /sys/devices/system/node/node*: NUMA nodes
//   - /proc/version, /proc/sys/kernel/osrelease: WSL2 ("microsoft", any case)
//   - /dev/shm: statvfs(root + "/dev/shm"). When root is not "/", a fixture may
//     instead carry the small text file root/dev/shm.size with two numbers
//     "TOTAL_BYTES FREE_BYTES" (or one: total = free); the file wins when it
//     exists, because a fixture cannot carry a tmpfs of the right size.
//   - cgroup v2: /sys/fs/cgroup/memory.max, /sys/fs/cgroup/cpu.max;
//     v1 fallbacks: /sys/fs/cgroup/memory/memory.limit_in_bytes,
//     /sys/fs/cgroup/cpu/cpu.cfs_quota_us + cpu.cfs_period_us
//   - /sys/bus/pci/devices/*: NVIDIA GPUs (vendor 0x10de, class 0x03xxxx),
//     numa_node, current_link_speed, current_link_width; the device symlink
//     resolves to /sys/devices/pciDDDD:BB/<bridge>/.../<gpu>, from which the
//     upstream bridges and the host bridge (the pciDDDD:BB root) are read
//   - /sys/class/infiniband/*: ports/N/link_layer, state, rate (IB and RoCE)
//   - root/nvidia-smi-topo.txt (optional): the text of `nvidia-smi topo -m`,
//     parsed with ParseNvidiaSmiTopo; its NV# entries are used for GPU pairs
//     (NVLink is invisible in sysfs), and it supplies the whole matrix when
//     sysfs shows no GPUs (e.g. WSL2, where GPUs are not PCI devices in the
//     guest). On a real machine the agent may write it there, or pass the text
//     in ProbeOptions.nvidia_smi_topo_text.
//   - root/nvidia-smi-query-gpu.csv (optional): `nvidia-smi --query-gpu=
//     index,name,pci.bus_id,memory.total,compute_cap --format=csv`; fills
//     names, memory and compute capability (matched by bus id, else index).
//   - NVML (dlopen, never linked): names, memory, compute capability, NVLink
//     counts, driver and CUDA versions. Absent or failing -> nvml_available =
//     false with nvml_error; never fatal. use_nvml = false never loads it.
//     NVML describes the machine it runs on, so with a root other than "/"
//     it is loaded (its failure still reported) but its facts are ignored.
//   Order of precedence for GPU pair paths: sysfs PCIe path, then the
//   nvidia-smi text (it wins where it differs; the difference is listed in
//   unknown), then NVML's NVLink counts. Topology.sources lists each source
//   used and what it gave.
//
// Every fact that cannot be read or parsed is recorded in Topology.unknown
// ("gpu 0000:17:00.0 numa_node: unreadable") and the probe continues; the
// probe fails only when ProbeOptions are unusable (root missing).
//
// Thread-safety: ProbeTopology is safe to call from any thread (no globals;
// NVML handles are opened and closed per call).
#ifndef DGCA_TOPOLOGY_PROBE_H_
#define DGCA_TOPOLOGY_PROBE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dgca/v1/topology.pb.h"

namespace dgca {

struct ProbeOptions {
  // Directory every probed path is read under ("/" on a real node).
  std::string root = "/";
  // Load NVML at run time. Ignored (never loaded) when false.
  bool use_nvml = true;
  // What dlopen is asked for; tests point it at a non-library file.
  std::string nvml_library = "libnvidia-ml.so.1";
  // Text of `nvidia-smi topo -m`; when empty, root/nvidia-smi-topo.txt is
  // read if it exists.
  std::string nvidia_smi_topo_text;
  // CSV of `nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,
  // compute_cap --format=csv` (names, memory, compute capability where NVML
  // is absent); when empty, root/nvidia-smi-query-gpu.csv is read if present.
  std::string nvidia_smi_query_text;
  // The program that measures the CPU's GEMM rate (`dgca-worker gemm-rate`,
  // which prints lines "threads=N flops=F"); empty = not measured (the
  // fixtures, `dgca topo`). Run once, for at most 20 s.
  std::vector<std::string> gemm_rate_command;
  // Topology.node; empty = the hostname (root/proc/sys/kernel/hostname, or
  // gethostname() when root is "/").
  std::string node_name;
};

// Probes the node under `options.root`. Fails only if the root is not a
// readable directory; everything else degrades into Topology.unknown.
absl::StatusOr<v1::Topology> ProbeTopology(const ProbeOptions& options);

}  // namespace dgca

#endif  // DGCA_TOPOLOGY_PROBE_H_
