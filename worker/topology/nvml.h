// NVML at run time: dlopen(library), query, dlclose. Never fatal: a library
// that is absent, is not NVML, or fails nvmlInit yields available = false and
// the reason in `error`.
//
// Thread-safety: QueryNvml may be called from any thread (NVML's init/shutdown
// are reference counted).
#ifndef DGCA_WORKER_TOPOLOGY_NVML_H_
#define DGCA_WORKER_TOPOLOGY_NVML_H_

#include <cstdint>
#include <string>
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
};

NvmlReport QueryNvml(const std::string& library);

}  // namespace dgca

#endif  // DGCA_WORKER_TOPOLOGY_NVML_H_
