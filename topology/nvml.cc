// NVML, loaded with dlopen at run time (no link-time dependency). Only the
// few entry points the probe needs are declared here, with the ABI of
// nvml.h (stable since NVML 10; the _v2/_v3 names are the current ones).
#include "topology/nvml.h"

#include <dlfcn.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "topology/probe_internal.h"

namespace dgca {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvlinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using CountFn = nvmlReturn_t (*)(unsigned*);
using HandleFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using NameFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using MemFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using CcFn = nvmlReturn_t (*)(nvmlDevice_t, int*, int*);
using PciFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*);
using DriverFn = nvmlReturn_t (*)(char*, unsigned);
using CudaFn = nvmlReturn_t (*)(int*);
using LinkStateFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned, int*);
using RemotePciFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*);
using AncestorFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t, int*);

// nvmlGpuTopologyLevel_t -> nvidia-smi's names.
std::string LevelName(int level) {
  switch (level) {
    case 0:
      return "X";  // NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    case 10:
      return "PIX";
    case 20:
      return "PXB";
    case 30:
      return "PHB";
    case 40:
      return "NODE";
    case 50:
      return "SYS";
    default:
      return "";
  }
}

// Closes the library on every path out.
class Library {
 public:
  explicit Library(void* h) : h_(h) {}
  ~Library() {
    if (h_ != nullptr) dlclose(h_);
  }
  template <typename F>
  F Get(const char* name) const {
    return reinterpret_cast<F>(dlsym(h_, name));
  }

 private:
  void* h_;
};

// Typed lookups through a NvmlSymbolLookup.
struct Lookup {
  const NvmlSymbolLookup* sym;
  template <typename F>
  F Get(const char* name) const {
    return reinterpret_cast<F>((*sym)(name));
  }
};

}  // namespace

NvmlReport QueryNvml(const std::string& library) {
  NvmlReport r;
  dlerror();
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    r.error = absl::StrCat("dlopen(\"", library, "\"): ", e ? e : "failed");
    return r;
  }
  Library lib(h);
  return QueryNvmlSymbols([&lib](const char* name) { return lib.Get<void*>(name); },
                          library);
}

NvmlReport QueryNvmlSymbols(const NvmlSymbolLookup& sym, const std::string& library) {
  NvmlReport r;
  Lookup lib{&sym};
  auto init = lib.Get<InitFn>("nvmlInit_v2");
  auto shutdown = lib.Get<ShutdownFn>("nvmlShutdown");
  auto errstr = lib.Get<ErrorStringFn>("nvmlErrorString");
  auto count = lib.Get<CountFn>("nvmlDeviceGetCount_v2");
  auto handle = lib.Get<HandleFn>("nvmlDeviceGetHandleByIndex_v2");
  if (init == nullptr || shutdown == nullptr || count == nullptr ||
      handle == nullptr) {
    r.error = absl::StrCat(library,
                           ": missing nvmlInit_v2/nvmlDeviceGetCount_v2/"
                           "nvmlDeviceGetHandleByIndex_v2 (not an NVML library?)");
    return r;
  }
  auto why = [&](nvmlReturn_t rc) {
    return errstr ? std::string(errstr(rc)) : absl::StrCat("error ", rc);
  };
  nvmlReturn_t rc = init();
  if (rc != kNvmlSuccess) {
    r.error = absl::StrCat("nvmlInit_v2: ", why(rc));
    return r;
  }
  r.available = true;
  auto name = lib.Get<NameFn>("nvmlDeviceGetName");
  auto mem = lib.Get<MemFn>("nvmlDeviceGetMemoryInfo");
  auto cc = lib.Get<CcFn>("nvmlDeviceGetCudaComputeCapability");
  auto pci = lib.Get<PciFn>("nvmlDeviceGetPciInfo_v3");
  auto driver = lib.Get<DriverFn>("nvmlSystemGetDriverVersion");
  auto cuda = lib.Get<CudaFn>("nvmlSystemGetCudaDriverVersion_v2");
  auto link_state = lib.Get<LinkStateFn>("nvmlDeviceGetNvLinkState");
  auto remote = lib.Get<RemotePciFn>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  auto ancestor = lib.Get<AncestorFn>("nvmlDeviceGetTopologyCommonAncestor");
  std::vector<nvmlDevice_t> handles;

  char buf[128];
  if (driver && driver(buf, sizeof(buf)) == kNvmlSuccess) r.driver_version = buf;
  int cv = 0;
  if (cuda && cuda(&cv) == kNvmlSuccess && cv > 0)
    r.cuda_version = absl::StrCat(cv / 1000, ".", (cv % 1000) / 10);

  unsigned n = 0;
  rc = count(&n);
  if (rc != kNvmlSuccess) {
    r.error = absl::StrCat("nvmlDeviceGetCount_v2: ", why(rc));
    r.available = false;
    shutdown();
    return r;
  }
  for (unsigned i = 0; i < n && i < 64; ++i) {
    nvmlDevice_t d = nullptr;
    NvmlGpu g;
    g.index = static_cast<int>(i);
    if (handle(i, &d) != kNvmlSuccess) {
      g.error = "nvmlDeviceGetHandleByIndex_v2 failed";
      r.gpus.push_back(g);
      handles.push_back(nullptr);
      continue;
    }
    handles.push_back(d);
    if (name && name(d, buf, sizeof(buf)) == kNvmlSuccess) g.name = buf;
    nvmlMemory_t m{};
    if (mem && mem(d, &m) == kNvmlSuccess) g.memory_bytes = m.total;
    int ma = 0, mi = 0;
    if (cc && cc(d, &ma, &mi) == kNvmlSuccess) {
      g.cc_major = ma;
      g.cc_minor = mi;
    }
    nvmlPciInfo_t p{};
    if (pci && pci(d, &p) == kNvmlSuccess)
      g.bus_id = topo_internal::NormalizeBusId(p.busId);
    if (link_state && remote) {
      for (unsigned l = 0; l < kNvlinkMaxLinks; ++l) {
        int active = 0;
        if (link_state(d, l, &active) != kNvmlSuccess || active == 0) continue;
        nvmlPciInfo_t rp{};
        if (remote(d, l, &rp) != kNvmlSuccess) continue;
        g.nvlink_peers.push_back(topo_internal::NormalizeBusId(rp.busId));
      }
    }
    r.gpus.push_back(g);
  }
  if (ancestor) {
    for (size_t a = 0; a < handles.size(); ++a)
      for (size_t b = a + 1; b < handles.size(); ++b) {
        int level = -1;
        if (handles[a] == nullptr || handles[b] == nullptr ||
            ancestor(handles[a], handles[b], &level) != kNvmlSuccess)
          continue;
        std::string name = LevelName(level);
        if (!name.empty())
          r.paths[{static_cast<int>(a), static_cast<int>(b)}] = name;
      }
  }
  shutdown();
  return r;
}

}  // namespace dgca
