// NVML at run time: dlopen(library), query, dlclose. Never fatal: a library
// that is absent, is not NVML, or fails nvmlInit yields available = false and
// the reason in `error`.
//
// Thread-safety: QueryNvml may be called from any thread (NVML's init/shutdown
// are reference counted).
#ifndef DGCA_TOPOLOGY_NVML_H_
#define DGCA_TOPOLOGY_NVML_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dgca {

struct NvmlGpu {
  int index = 0;
  std::string name;
  std::string bus_id;          // normalized "0000:17:00.0"
  uint64_t memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  // Remote PCI bus id of every active NVLink (a GPU, or an NVSwitch).
  std::vector<std::string> nvlink_peers;
  std::string error;
};

struct NvmlReport {
  bool available = false;
  std::string error;
  std::string driver_version;
  std::string cuda_version;    // "12.4"
  std::vector<NvmlGpu> gpus;
  // PCIe path between GPUs i < j (NVML indices) from
  // nvmlDeviceGetTopologyCommonAncestor, named as nvidia-smi names it
  // (PIX, PXB, PHB, NODE, SYS; "X" for NVML_TOPOLOGY_INTERNAL boards).
  std::map<std::pair<int, int>, std::string> paths;
};

NvmlReport QueryNvml(const std::string& library);

// The same, with NVML's entry points looked up through `sym` (dlsym on the
// loaded library in QueryNvml; tests pass fakes). `what` names the library
// in error messages.
using NvmlSymbolLookup = std::function<void*(const char*)>;
NvmlReport QueryNvmlSymbols(const NvmlSymbolLookup& sym, const std::string& what);

}  // namespace dgca

#endif  // DGCA_TOPOLOGY_NVML_H_
