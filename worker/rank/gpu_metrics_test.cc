#include "worker/rank/gpu_metrics.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>

namespace dgca {
namespace {

// A fake NVML: two GPUs, per-device readings, call counters.
namespace fake {
struct Util {
  unsigned int gpu, memory;
};
struct Mem {
  unsigned long long total, free, used;
};
int init_rc = 0;
int inits = 0, shutdowns = 0, queries = 0;
bool power_fails = false;
unsigned int util_percent[2] = {87, 5};
unsigned long long used[2] = {3ull << 30, 1ull << 20};
unsigned int milliwatts[2] = {312500, 61000};
int devs[2] = {0, 1};

int Init() {
  ++inits;
  return init_rc;
}
int Shutdown() {
  ++shutdowns;
  return 0;
}
const char* Err(int rc) { return rc == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int Handle(unsigned i, void** d) {
  if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *d = &devs[i];
  return 0;
}
int Utilization(void* d, Util* u) {
  ++queries;
  int i = *static_cast<int*>(d);
  u->gpu = util_percent[i];
  u->memory = 1;
  return 0;
}
int Memory(void* d, Mem* m) {
  int i = *static_cast<int*>(d);
  m->total = 80ull << 30;
  m->used = used[i];
  m->free = m->total - m->used;
  return 0;
}
int Power(void* d, unsigned int* mw) {
  if (power_fails) return 3;  // NVML_ERROR_NOT_SUPPORTED
  *mw = milliwatts[*static_cast<int*>(d)];
  return 0;
}

void Reset() {
  init_rc = 0;
  inits = shutdowns = queries = 0;
  power_fails = false;
}

NvmlSymbolLookup Table(std::map<std::string, void*> skip = {}) {
  std::map<std::string, void*> t = {
      {"nvmlInit_v2", reinterpret_cast<void*>(&Init)},
      {"nvmlShutdown", reinterpret_cast<void*>(&Shutdown)},
      {"nvmlErrorString", reinterpret_cast<void*>(&Err)},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void*>(&Handle)},
      {"nvmlDeviceGetUtilizationRates", reinterpret_cast<void*>(&Utilization)},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&Memory)},
      {"nvmlDeviceGetPowerUsage", reinterpret_cast<void*>(&Power)},
  };
  for (const auto& [k, v] : skip) t.erase(k);
  return [t](const char* name) -> void* {
    auto it = t.find(name);
    return it == t.end() ? nullptr : it->second;
  };
}
}  // namespace fake

using namespace std::chrono_literals;

TEST(GpuMetricsTest, ReadsTheRanksDeviceInBaseUnits) {
  fake::Reset();
  {
    auto g = GpuMetrics::OpenSymbols(1, fake::Table(), "fake-nvml");
    ASSERT_TRUE(g->available()) << g->error();
    EXPECT_EQ(g->error(), "");
    GpuReading r = g->Sample();
    EXPECT_DOUBLE_EQ(r.utilization_ratio, 0.05);
    EXPECT_DOUBLE_EQ(r.memory_used_bytes, 1048576.0);
    EXPECT_DOUBLE_EQ(r.power_watts, 61.0);
    auto g0 = GpuMetrics::OpenSymbols(0, fake::Table(), "fake-nvml");
    r = g0->Sample();
    EXPECT_DOUBLE_EQ(r.utilization_ratio, 0.87);
    EXPECT_DOUBLE_EQ(r.memory_used_bytes, 3.0 * (1ull << 30));
    EXPECT_DOUBLE_EQ(r.power_watts, 312.5);
    EXPECT_EQ(fake::inits, 2);
  }
  EXPECT_EQ(fake::shutdowns, 2) << "every successful nvmlInit is matched by nvmlShutdown";
}

TEST(GpuMetricsTest, QueriesAtMostOncePerInterval) {
  fake::Reset();
  auto g = GpuMetrics::OpenSymbols(0, fake::Table(), "fake-nvml");
  auto t0 = GpuMetrics::Clock::now();
  GpuReading a = g->Sample(t0);
  fake::util_percent[0] = 50;
  for (int i = 1; i < 10; ++i) {
    GpuReading b = g->Sample(t0 + i * 100ms);  // 0.1 .. 0.9 s later: cached
    EXPECT_DOUBLE_EQ(b.utilization_ratio, a.utilization_ratio);
  }
  EXPECT_EQ(g->queries(), 1);
  EXPECT_EQ(fake::queries, 1);
  GpuReading c = g->Sample(t0 + 1s);
  EXPECT_DOUBLE_EQ(c.utilization_ratio, 0.5);
  EXPECT_EQ(g->queries(), 2);
  fake::util_percent[0] = 87;
}

TEST(GpuMetricsTest, CpuRankIsAbsentWithoutLoadingNvml) {
  fake::Reset();
  auto g = GpuMetrics::OpenSymbols(-1, fake::Table(), "fake-nvml");
  EXPECT_FALSE(g->available());
  EXPECT_EQ(g->error(), "CPU rank");
  GpuReading r = g->Sample();
  EXPECT_EQ(r.utilization_ratio, -1);
  EXPECT_EQ(r.memory_used_bytes, -1);
  EXPECT_EQ(r.power_watts, -1);
  EXPECT_EQ(fake::inits, 0);
  // The real loader too: no dlopen for a CPU rank.
  auto real = GpuMetrics::Open(-1, "/no/such/libnvidia-ml.so.1");
  EXPECT_EQ(real->error(), "CPU rank");
}

TEST(GpuMetricsTest, MissingOrFailingNvmlIsAbsentWithTheReason) {
  fake::Reset();
  auto missing = GpuMetrics::Open(0, "/no/such/libnvidia-ml.so.1");
  EXPECT_FALSE(missing->available());
  EXPECT_NE(missing->error().find("dlopen(\"/no/such/libnvidia-ml.so.1\")"), std::string::npos)
      << missing->error();
  EXPECT_EQ(missing->Sample().power_watts, -1);

  auto not_nvml = GpuMetrics::OpenSymbols(0, fake::Table({{"nvmlInit_v2", nullptr}}), "libfoo.so");
  EXPECT_FALSE(not_nvml->available());
  EXPECT_NE(not_nvml->error().find("libfoo.so: missing nvmlInit_v2"), std::string::npos)
      << not_nvml->error();

  fake::init_rc = 9;
  auto no_driver = GpuMetrics::OpenSymbols(0, fake::Table(), "fake-nvml");
  EXPECT_EQ(no_driver->error(), "nvmlInit_v2: Driver Not Loaded");
  EXPECT_EQ(no_driver->Sample().utilization_ratio, -1);
  no_driver.reset();
  EXPECT_EQ(fake::shutdowns, 0) << "no nvmlShutdown after a failed nvmlInit";

  fake::Reset();
  auto bad_index = GpuMetrics::OpenSymbols(5, fake::Table(), "fake-nvml");
  EXPECT_FALSE(bad_index->available());
  EXPECT_NE(bad_index->error().find("nvmlDeviceGetHandleByIndex_v2(5)"), std::string::npos)
      << bad_index->error();
  bad_index.reset();
  EXPECT_EQ(fake::shutdowns, 1);
}

// A value the GPU cannot report is absent on its own; the others still come.
TEST(GpuMetricsTest, OneFailingQueryLeavesTheOthers) {
  fake::Reset();
  fake::power_fails = true;
  auto g = GpuMetrics::OpenSymbols(0, fake::Table({{"nvmlDeviceGetMemoryInfo", nullptr}}),
                                   "fake-nvml");
  GpuReading r = g->Sample();
  EXPECT_DOUBLE_EQ(r.utilization_ratio, 0.87);
  EXPECT_EQ(r.memory_used_bytes, -1);  // entry point missing
  EXPECT_EQ(r.power_watts, -1);        // NOT_SUPPORTED
}

TEST(GpuMetricsTest, LocalDeviceFromEnv) {
  unsetenv("DGCA_LOCAL_DEVICE");
  EXPECT_EQ(LocalDeviceFromEnv(), -1);
  setenv("DGCA_LOCAL_DEVICE", "3", 1);
  EXPECT_EQ(LocalDeviceFromEnv(), 3);
  setenv("DGCA_LOCAL_DEVICE", "-1", 1);
  EXPECT_EQ(LocalDeviceFromEnv(), -1);
  setenv("DGCA_LOCAL_DEVICE", "gpu0", 1);
  EXPECT_EQ(LocalDeviceFromEnv(), -1);
  setenv("DGCA_LOCAL_DEVICE", "", 1);
  EXPECT_EQ(LocalDeviceFromEnv(), -1);
  unsetenv("DGCA_LOCAL_DEVICE");
}

// Each rank of a node keeps its planned GPU whatever CUDA_VISIBLE_DEVICES
// the agent inherited (it used to send every rank to ordinal 0 whenever the
// variable was set).
TEST(GpuMetricsTest, CudaOrdinalForMapsThePlannedGpu) {
  auto ok = [](int planned, const char* visible) {
    auto r = CudaOrdinalFor(planned, visible);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : -100;
  };
  EXPECT_EQ(ok(2, nullptr), 2);
  EXPECT_EQ(ok(2, ""), 2);
  EXPECT_EQ(ok(-1, nullptr), 0);
  EXPECT_EQ(ok(0, "0,1,2,3"), 0);
  EXPECT_EQ(ok(3, "0,1,2,3"), 3);
  EXPECT_EQ(ok(3, "2, 3"), 1);   // SLURM gave this job GPUs 2 and 3
  EXPECT_EQ(ok(5, "5"), 0);
  EXPECT_EQ(ok(-1, "4,5"), 0);
  EXPECT_EQ(ok(1, "GPU-8f6a1c2e-0000-0000-0000-000000000000"), 0);
  auto hidden = CudaOrdinalFor(1, "2,3");
  EXPECT_EQ(hidden.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(hidden.status().message().find("GPU 1, which CUDA_VISIBLE_DEVICES=2,3 hides"),
            std::string::npos)
      << hidden.status();
  auto uuids = CudaOrdinalFor(0, "GPU-aaaa,GPU-bbbb");
  EXPECT_EQ(uuids.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(uuids.status().message().find("by UUID"), std::string::npos) << uuids.status();
}

}  // namespace
}  // namespace dgca
