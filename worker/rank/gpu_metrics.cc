// NVML for the rank's GPU metrics, loaded with dlopen. Only the entry points
// used here are declared, with the ABI of nvml.h (stable since NVML 10).
#include "worker/rank/gpu_metrics.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dgca {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;

struct nvmlUtilization_t {
  unsigned int gpu;     // percent of time a kernel ran, over the driver's sample period
  unsigned int memory;  // percent of time device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using HandleFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using UtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using MemFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using PowerFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);

}  // namespace

std::unique_ptr<GpuMetrics> GpuMetrics::Open(int device, const std::string& library) {
  std::unique_ptr<GpuMetrics> g(new GpuMetrics());
  g->device_ = device;
  if (device < 0) {
    g->error_ = "CPU rank";
    return g;
  }
  dlerror();
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    g->error_ = absl::StrCat("dlopen(\"", library, "\"): ", e ? e : "failed");
    return g;
  }
  g->library_ = h;
  g->Init([h](const char* name) { return dlsym(h, name); }, library);
  return g;
}

std::unique_ptr<GpuMetrics> GpuMetrics::OpenSymbols(int device, NvmlSymbolLookup sym,
                                                    const std::string& what) {
  std::unique_ptr<GpuMetrics> g(new GpuMetrics());
  g->device_ = device;
  if (device < 0) {
    g->error_ = "CPU rank";
    return g;
  }
  g->Init(std::move(sym), what);
  return g;
}

void GpuMetrics::Init(NvmlSymbolLookup sym, const std::string& what) {
  auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
  auto shutdown = reinterpret_cast<ShutdownFn>(sym("nvmlShutdown"));
  auto errstr = reinterpret_cast<ErrorStringFn>(sym("nvmlErrorString"));
  auto handle = reinterpret_cast<HandleFn>(sym("nvmlDeviceGetHandleByIndex_v2"));
  if (init == nullptr || shutdown == nullptr || handle == nullptr) {
    error_ = absl::StrCat(what, ": missing nvmlInit_v2/nvmlShutdown/"
                                "nvmlDeviceGetHandleByIndex_v2 (not an NVML library?)");
    return;
  }
  auto why = [&](nvmlReturn_t rc) {
    return errstr ? std::string(errstr(rc)) : absl::StrCat("error ", rc);
  };
  nvmlReturn_t rc = init();
  if (rc != kNvmlSuccess) {
    error_ = absl::StrCat("nvmlInit_v2: ", why(rc));
    return;
  }
  shutdown_ = reinterpret_cast<void*>(shutdown);
  nvmlDevice_t d = nullptr;
  rc = handle(static_cast<unsigned>(device_), &d);
  if (rc != kNvmlSuccess || d == nullptr) {
    error_ = absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", device_, "): ", why(rc));
    return;
  }
  device_handle_ = d;
  utilization_ = sym("nvmlDeviceGetUtilizationRates");
  memory_ = sym("nvmlDeviceGetMemoryInfo");
  power_ = sym("nvmlDeviceGetPowerUsage");
}

GpuMetrics::~GpuMetrics() {
  if (shutdown_ != nullptr) reinterpret_cast<ShutdownFn>(shutdown_)();
  if (library_ != nullptr) dlclose(library_);
}

GpuReading GpuMetrics::Sample(Clock::time_point now) {
  if (device_handle_ == nullptr) return GpuReading();
  if (sampled_ && now - last_query_ < min_interval_) return last_;
  sampled_ = true;
  last_query_ = now;
  ++queries_;
  // Each value on its own: a GPU that cannot report power (some boards) still
  // reports utilization and memory.
  GpuReading r;
  nvmlUtilization_t u{};
  if (utilization_ != nullptr &&
      reinterpret_cast<UtilFn>(utilization_)(device_handle_, &u) == kNvmlSuccess && u.gpu <= 100) {
    r.utilization_ratio = u.gpu / 100.0;
  }
  nvmlMemory_t m{};
  if (memory_ != nullptr &&
      reinterpret_cast<MemFn>(memory_)(device_handle_, &m) == kNvmlSuccess) {
    r.memory_used_bytes = static_cast<double>(m.used);
  }
  unsigned int mw = 0;
  if (power_ != nullptr && reinterpret_cast<PowerFn>(power_)(device_handle_, &mw) == kNvmlSuccess) {
    r.power_watts = mw / 1000.0;
  }
  last_ = r;
  return r;
}

int LocalDeviceFromEnv() {
  const char* v = std::getenv("DGCA_LOCAL_DEVICE");
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  long d = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || d < -1 || d > 1023) return -1;
  return static_cast<int>(d);
}

absl::StatusOr<int> CudaOrdinalFor(int planned, const char* visible) {
  if (visible == nullptr || *visible == '\0') return planned < 0 ? 0 : planned;
  std::vector<std::string> entries;
  for (absl::string_view e : absl::StrSplit(visible, ',')) {
    entries.emplace_back(absl::StripAsciiWhitespace(e));
  }
  if (planned < 0) return 0;
  bool numeric = true;
  for (size_t i = 0; i < entries.size(); ++i) {
    int v = 0;
    if (!absl::SimpleAtoi(entries[i], &v)) {
      numeric = false;
      continue;
    }
    if (v == planned) return static_cast<int>(i);
  }
  if (!numeric && entries.size() == 1) return 0;  // one GPU by UUID: it is the rank's
  if (!numeric) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA_VISIBLE_DEVICES=", visible, " names GPUs by UUID or MIG instance; the plan places "
        "this rank on GPU ", planned, " by index: unset CUDA_VISIBLE_DEVICES in the agent's "
        "environment (and comm.env), or list GPU indices"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the plan places this rank on GPU ", planned, ", which CUDA_VISIBLE_DEVICES=", visible,
      " hides: unset CUDA_VISIBLE_DEVICES in the agent's environment (and comm.env), or include "
      "GPU ", planned));
}

}  // namespace dgca
