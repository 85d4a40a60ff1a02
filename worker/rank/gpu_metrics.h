// GPU metrics of one rank (docs/metrics.md: dgca_gpu_utilization_ratio,
// dgca_gpu_memory_used_bytes, dgca_gpu_power_watts): utilization, memory in
// use and power draw of the rank's GPU, read through NVML loaded at run time
// (dlopen, no link-time dependency; topology/nvml.h does the same for
// the node probe).
//
// The device is the rank's node-local GPU index (DGCA_LOCAL_DEVICE, set by the
// agent from the planner's local device), taken as an NVML index: NVML
// enumerates every GPU of the node whatever CUDA_VISIBLE_DEVICES says.
//
// Absent is -1, never 0: a CPU rank (device < 0), a node without NVML, a
// failed nvmlInit or a query that fails give -1 for that value, and the
// coordinator then exports no series for it (a 0 would read as "idle GPU").
//
// NVML is initialised once (in Open) and shut down with the object; each
// value is queried at most once per `min_interval` (1 s): Sample() between
// two queries returns the last reading, so calling it every training step
// costs nothing measurable.
//
// Thread-safety: not thread-safe; one owner (the rank's training thread).
#ifndef DGCA_WORKER_RANK_GPU_METRICS_H_
#define DGCA_WORKER_RANK_GPU_METRICS_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "topology/nvml.h"

namespace dgca {

struct GpuReading {
  double utilization_ratio = -1;  // 0..1 (NVML's percent / 100)
  double memory_used_bytes = -1;
  double power_watts = -1;        // NVML's milliwatts / 1000
};

class GpuMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  // device < 0: a CPU rank; NVML is not loaded and every reading is absent.
  // Otherwise dlopen(`library`); failures are kept in error(), never fatal.
  static std::unique_ptr<GpuMetrics> Open(int device,
                                          const std::string& library = "libnvidia-ml.so.1");
  // The same with NVML's entry points from `sym` (tests pass a fake table).
  // `what` names the library in error().
  static std::unique_ptr<GpuMetrics> OpenSymbols(int device, NvmlSymbolLookup sym,
                                                 const std::string& what);
  ~GpuMetrics();
  GpuMetrics(const GpuMetrics&) = delete;
  GpuMetrics& operator=(const GpuMetrics&) = delete;

  // The latest reading; queries NVML when the last query is at least
  // min_interval old (the first call always queries).
  GpuReading Sample(Clock::time_point now = Clock::now());

  // True when NVML is initialised and the device handle was found.
  bool available() const { return device_handle_ != nullptr; }
  // Why readings are absent ("" when available; "CPU rank" for device < 0).
  const std::string& error() const { return error_; }
  int device() const { return device_; }
  // Number of NVML queries made so far (each covers the three values).
  int queries() const { return queries_; }

  void set_min_interval(std::chrono::milliseconds d) { min_interval_ = d; }

 private:
  GpuMetrics() = default;
  void Init(NvmlSymbolLookup sym, const std::string& what);

  int device_ = -1;
  void* library_ = nullptr;        // dlopen handle, closed in the destructor
  void* device_handle_ = nullptr;  // nvmlDevice_t
  void* shutdown_ = nullptr;       // nvmlShutdown, when nvmlInit succeeded
  void* utilization_ = nullptr;    // nvmlDeviceGetUtilizationRates
  void* memory_ = nullptr;         // nvmlDeviceGetMemoryInfo
  void* power_ = nullptr;          // nvmlDeviceGetPowerUsage
  std::string error_;
  GpuReading last_;
  bool sampled_ = false;
  Clock::time_point last_query_{};
  std::chrono::milliseconds min_interval_{1000};
  int queries_ = 0;
};

// DGCA_LOCAL_DEVICE as an int; -1 when unset, empty or not a number.
int LocalDeviceFromEnv();

// The CUDA ordinal of the planned GPU `planned` (the node's GPU index, as
// the topology probe and nvidia-smi number them; -1 = none planned) for a
// rank whose environment has CUDA_VISIBLE_DEVICES = `visible` (null or ""
// = unset). Unset: the index itself (CUDA_DEVICE_ORDER=PCI_BUS_ID, which
// the plan sets, makes the orders agree). Set to a list of indices (as
// SLURM, a shell or comm.env may leave it): the planned index's position in
// the list, so that the ranks of a node keep their own GPUs. Nothing
// planned: ordinal 0. Errors (FAILED_PRECONDITION, naming the variable and
// what would work): the planned GPU is not in the list, or the list names
// GPUs by UUID or MIG instance and holds more than one of them.
absl::StatusOr<int> CudaOrdinalFor(int planned, const char* visible);

}  // namespace dgca

#endif  // DGCA_WORKER_RANK_GPU_METRICS_H_
