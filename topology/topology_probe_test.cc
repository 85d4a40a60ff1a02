#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "model/core/core_test_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "topology/nvml.h"
#include "topology/probe.h"
#include "topology/probe_internal.h"
#include "topology/topo_matrix.h"

namespace dgca {
namespace {

std::string SourceDir() {
  const char* src = std::getenv("DGCA_SOURCE_DIR");
  return src ? src : ".";
}
std::string FixtureDir(const std::string& name) {
  return SourceDir() + "/tests/fixtures/" + name;
}
std::string Fixture(const std::string& name) { return FixtureDir(name) + "/root"; }

using testutil::ReadFile;

bool HasUnknown(const v1::Topology& t, const std::string& needle) {
  for (const auto& u : t.unknown())
    if (absl::StrContains(u, needle)) return true;
  return false;
}

std::string Unknowns(const v1::Topology& t) {
  return absl::StrJoin(t.unknown(), "\n");
}

v1::Topology Probe(const std::string& fixture) {
  ProbeOptions opt;
  opt.root = Fixture(fixture);
  opt.use_nvml = false;
  auto t = ProbeTopology(opt);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : v1::Topology();
}

std::map<std::pair<int, int>, std::string> Links(const v1::Topology& t) {
  std::map<std::pair<int, int>, std::string> m;
  for (const auto& l : t.links()) {
    m[{l.a(), l.b()}] = l.path();
    m[{l.b(), l.a()}] = l.path();
  }
  return m;
}

// ---- Parser -----------------------------------------------------------------

TEST(NvidiaSmiTopoParser, SpacesNicsAndLegend) {
  auto m = ParseNvidiaSmiTopo(ReadFile(FixtureDir("nvlink-8-h100") + "/nvidia-smi-topo-m.txt"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->gpu_count(), 8);
  EXPECT_EQ(m->devices.size(), 17u);
  EXPECT_EQ(m->GpuPath(0, 7), "NV18");
  EXPECT_EQ(m->GpuPath(3, 3), "X");
  EXPECT_EQ(m->cpu_affinity[m->GpuRow(4)], "32-63,96-127");
  EXPECT_EQ(m->numa_affinity[m->GpuRow(4)], "1");
  EXPECT_EQ(m->nic_names.at("NIC3"), "mlx5_3");
  EXPECT_EQ(m->cells[m->GpuRow(3)][12], "PIX");  // GPU3-NIC4
  EXPECT_EQ(m->cells[8][0], "PIX");              // NIC0-GPU0
}

TEST(NvidiaSmiTopoParser, TabsOldLayoutNamedNic) {
  auto m = ParseNvidiaSmiTopo(ReadFile(FixtureDir("a100-4x-pcie") + "/nvidia-smi-topo-m.txt"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->gpu_count(), 4);
  EXPECT_EQ(m->devices.back(), "mlx5_0");
  EXPECT_EQ(m->GpuPath(0, 1), "PIX");
  EXPECT_EQ(m->GpuPath(1, 2), "SYS");
  EXPECT_EQ(m->cpu_affinity[m->GpuRow(2)], "14-27");
  EXPECT_EQ(m->numa_affinity[m->GpuRow(2)], "");
}

TEST(NvidiaSmiTopoParser, NotApplicableAffinity) {
  auto m = ParseNvidiaSmiTopo(ReadFile(FixtureDir("wsl2-2x4090") + "/nvidia-smi-topo-m.txt"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->GpuPath(0, 1), "SYS");
  EXPECT_EQ(m->cpu_affinity[0], "");
}

TEST(NvidiaSmiTopoParser, PromptLinesBeforeHeaderAndSocName) {
  auto m = ParseNvidiaSmiTopo(
      "$ nvidia-smi topo -m\n\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\n"
      "GPU1\tSOC\t X \t8-15\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->GpuPath(0, 1), "SYS");
}

TEST(NvidiaSmiTopoParser, ErrorsNameTheLine) {
  auto bad_cell = ParseNvidiaSmiTopo("GPU0 GPU1\nGPU0 X FOO\nGPU1 FOO X\n");
  ASSERT_FALSE(bad_cell.ok());
  EXPECT_TRUE(absl::StrContains(bad_cell.status().message(), "line 2"))
      << bad_cell.status();
  EXPECT_TRUE(absl::StrContains(bad_cell.status().message(), "FOO"));
  auto no_header = ParseNvidiaSmiTopo("hello\nworld\n");
  EXPECT_FALSE(no_header.ok());
  auto short_row = ParseNvidiaSmiTopo("GPU0 GPU1\nGPU0 X\nGPU1 SYS X\n");
  ASSERT_FALSE(short_row.ok());
  EXPECT_TRUE(absl::StrContains(short_row.status().message(), "1 cells"));
  auto missing_row = ParseNvidiaSmiTopo("GPU0 GPU1\nGPU0 X SYS\n");
  EXPECT_FALSE(missing_row.ok());
  auto x_off_diagonal = ParseNvidiaSmiTopo("GPU0 GPU1\nGPU0 X X\nGPU1 X X\n");
  EXPECT_FALSE(x_off_diagonal.ok());
  EXPECT_FALSE(ParseNvidiaSmiTopo("").ok());
}

// ---- Each fixture reproduces its nvidia-smi matrix ------------

void ExpectGpuMatrixMatches(const std::string& fixture) {
  SCOPED_TRACE(fixture);
  auto ref = ParseNvidiaSmiTopo(ReadFile(FixtureDir(fixture) + "/nvidia-smi-topo-m.txt"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  v1::Topology t = Probe(fixture);
  ASSERT_EQ(t.gpus_size(), ref->gpu_count()) << Unknowns(t);
  auto links = Links(t);
  for (int a = 0; a < ref->gpu_count(); ++a) {
    for (int b = 0; b < ref->gpu_count(); ++b) {
      if (a == b) continue;
      ASSERT_TRUE(links.count(std::make_pair(a, b))) << "no path for GPU" << a << "-GPU" << b;
      EXPECT_EQ(links[std::make_pair(a, b)], ref->GpuPath(a, b)) << "GPU" << a << "-GPU" << b;
    }
    int r = ref->GpuRow(a);
    EXPECT_EQ(t.gpus(a).cpu_affinity(), ref->cpu_affinity[r]) << "GPU" << a;
    if (!ref->numa_affinity[r].empty())
      EXPECT_EQ(absl::StrCat(t.gpus(a).numa_node()), ref->numa_affinity[r]);
  }
  // No disagreement between sysfs and nvidia-smi was needed to get there.
  EXPECT_FALSE(HasUnknown(t, "sysfs says")) << Unknowns(t);
}

TEST(FixtureMatrix, NvLink8H100) { ExpectGpuMatrixMatches("nvlink-8-h100"); }
TEST(FixtureMatrix, Wsl2TwoRtx4090) { ExpectGpuMatrixMatches("wsl2-2x4090"); }
TEST(FixtureMatrix, Workstation3Gpu) { ExpectGpuMatrixMatches("workstation-3gpu"); }
TEST(FixtureMatrix, A100FourPcie) { ExpectGpuMatrixMatches("a100-4x-pcie"); }

// The sysfs trees themselves (no nvidia-smi text involved) give every
// non-NVLink cell of the reference, NIC rows and columns included.
void ExpectSysfsTreeMatches(const std::string& fixture) {
  SCOPED_TRACE(fixture);
  using topo_internal::PciLocation;
  auto ref = ParseNvidiaSmiTopo(ReadFile(FixtureDir(fixture) + "/nvidia-smi-topo-m.txt"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::string root = Fixture(fixture);
  v1::Topology t = Probe(fixture);
  std::vector<PciLocation> locs;
  for (size_t i = 0; i < ref->devices.size(); ++i) {
    const std::string& d = ref->devices[i];
    std::string bdf;
    if (absl::StartsWith(d, "GPU")) {
      bdf = t.gpus(std::stoi(d.substr(3))).pci_bus_id();
    } else {
      std::string name = ref->nic_names.count(d) ? ref->nic_names.at(d) : d;
      char buf[4096];
      std::string link = root + "/sys/class/infiniband/" + name + "/device";
      ASSERT_NE(realpath(link.c_str(), buf), nullptr) << link;
      bdf = std::string(buf).substr(std::string(buf).find_last_of('/') + 1);
    }
    auto loc = topo_internal::ResolvePciLocation(root, bdf);
    ASSERT_TRUE(loc.has_value()) << d << " " << bdf;
    loc->numa = std::stoi(ReadFile(root + "/sys/bus/pci/devices/" + bdf + "/numa_node"));
    locs.push_back(*loc);
  }
  int checked = 0;
  for (size_t i = 0; i < locs.size(); ++i)
    for (size_t j = 0; j < locs.size(); ++j) {
      const std::string& want = ref->cells[i][j];
      if (i == j || absl::StartsWith(want, "NV")) continue;
      EXPECT_EQ(topo_internal::PciPathType(locs[i], locs[j]), want)
          << ref->devices[i] << "-" << ref->devices[j];
      ++checked;
    }
  EXPECT_GT(checked, 0);
}

TEST(FixtureSysfs, NvLink8H100Nics) { ExpectSysfsTreeMatches("nvlink-8-h100"); }
TEST(FixtureSysfs, Workstation3Gpu) { ExpectSysfsTreeMatches("workstation-3gpu"); }
TEST(FixtureSysfs, A100FourPcie) { ExpectSysfsTreeMatches("a100-4x-pcie"); }

// ---- Node facts ----------------------------------------------------------------

TEST(TopologyProbe, CpuOnlyContainer) {
  v1::Topology t = Probe("cpu-only");
  EXPECT_EQ(t.cpu_count(), 8);
  EXPECT_DOUBLE_EQ(t.cgroup_cpu_limit(), 4.0);
  EXPECT_EQ(t.cgroup_memory_limit_bytes(), 16ull << 30);
  EXPECT_EQ(t.memory_bytes(), 32768000ull * 1024);
  EXPECT_EQ(t.numa_nodes(), 1);
  EXPECT_FALSE(t.wsl2());
  EXPECT_EQ(t.shm_total_bytes(), 16ull << 30);
  EXPECT_EQ(t.hostname(), "cpu-node");
  EXPECT_EQ(t.gpus_size(), 0);
  EXPECT_EQ(t.net_devices_size(), 0);
  EXPECT_EQ(t.unknown_size(), 0) << Unknowns(t);
}

TEST(TopologyProbe, Wsl2Facts) {
  v1::Topology t = Probe("wsl2-2x4090");
  EXPECT_TRUE(t.wsl2());
  EXPECT_EQ(t.shm_total_bytes(), 64ull << 20);
  ASSERT_EQ(t.gpus_size(), 2);
  EXPECT_EQ(t.gpus(1).name(), "NVIDIA GeForce RTX 4090");
  EXPECT_EQ(t.gpus(1).memory_bytes(), 24564ull << 20);
  EXPECT_EQ(t.gpus(1).compute_capability_major(), 8);
  EXPECT_EQ(t.gpus(1).compute_capability_minor(), 9);
  EXPECT_EQ(t.gpus(1).pci_bus_id(), "0000:4c:00.0");
  bool from_text = false;
  for (const auto& s : t.sources())
    from_text |= absl::StrContains(s, "nvidia-smi-topo.txt") &&
                 absl::StrContains(s, "WSL2");
  EXPECT_TRUE(from_text) << absl::StrJoin(t.sources(), "\n");
}

TEST(TopologyProbe, H100FactsAndNics) {
  v1::Topology t = Probe("nvlink-8-h100");
  EXPECT_EQ(t.cpu_count(), 128);
  EXPECT_EQ(t.numa_nodes(), 2);
  ASSERT_EQ(t.gpus_size(), 8);
  EXPECT_EQ(t.gpus(0).pci_bus_id(), "0000:1b:00.0");
  EXPECT_EQ(t.gpus(7).numa_node(), 1);
  EXPECT_EQ(t.gpus(0).link_speed(), "32.0 GT/s PCIe");
  EXPECT_EQ(t.gpus(0).link_width(), 16);
  EXPECT_EQ(t.gpus(0).memory_bytes(), 81559ull << 20);
  ASSERT_EQ(t.net_devices_size(), 9);
  int ib = 0, roce = 0;
  for (const auto& d : t.net_devices()) {
    EXPECT_EQ(d.state(), "ACTIVE");
    ib += d.link_layer() == "InfiniBand";
    roce += d.link_layer() == "Ethernet";
  }
  EXPECT_EQ(ib, 8);
  EXPECT_EQ(roce, 1);
  EXPECT_DOUBLE_EQ(t.net_devices(0).rate_gbps(), 400);
  EXPECT_EQ(t.unknown_size(), 0) << Unknowns(t);
}

TEST(TopologyProbe, WorkstationWithoutGpuDetailsReportsUnknowns) {
  v1::Topology t = Probe("workstation-3gpu");
  ASSERT_EQ(t.gpus_size(), 3);
  EXPECT_EQ(t.gpus(0).memory_bytes(), 0u);
  EXPECT_TRUE(HasUnknown(t, "gpu 0000:01:00.0 memory: unknown")) << Unknowns(t);
  EXPECT_TRUE(HasUnknown(t, "compute capability: unknown")) << Unknowns(t);
}

// PXB: two switch levels below one root port (built at test time).
class TempTree {
 public:
  TempTree() : root_(testutil::MakeTempDir("dgca_topo")) {}
  const std::string& root() const { return root_; }
  void Write(const std::string& rel, const std::string& text) {
    std::string p = root_ + "/" + rel;
    Mkdirs(p.substr(0, p.find_last_of('/')));
    std::ofstream(p) << text;
  }
  void Mkdirs(const std::string& p) {
    std::string cmd = "mkdir -p '" + p + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  void Gpu(const std::string& host, const std::vector<std::string>& chain, int numa) {
    std::string rel = "sys/devices/" + host;
    for (const auto& c : chain) rel += "/" + c;
    Write(rel + "/vendor", "0x10de\n");
    Write(rel + "/class", "0x030200\n");
    Write(rel + "/numa_node", absl::StrCat(numa, "\n"));
    Write(rel + "/current_link_speed", "16.0 GT/s PCIe\n");
    Write(rel + "/current_link_width", "16\n");
    Mkdirs(root_ + "/sys/bus/pci/devices");
    std::string link = root_ + "/sys/bus/pci/devices/" + chain.back();
    ASSERT_EQ(symlink(("../../../devices/" + rel.substr(12)).c_str(), link.c_str()), 0);
  }

 private:
  std::string root_;
};

TEST(TopologyProbe, PxbAcrossTwoSwitchLevels) {
  TempTree t;
  ASSERT_FALSE(t.root().empty());
  // root port 00:01.0 -> switch A (01:00.0) -> downstream 02:00.0/02:01.0,
  // each leading to its own switch (03:00.0 / 06:00.0) with one GPU port.
  t.Gpu("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0",
                       "0000:04:00.0", "0000:05:00.0"}, 0);
  t.Gpu("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:06:00.0",
                       "0000:07:00.0", "0000:08:00.0"}, 0);
  t.Gpu("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0",
                       "0000:04:01.0", "0000:09:00.0"}, 0);
  t.Gpu("pci0000:40", {"0000:40:01.0", "0000:41:00.0"}, 1);
  ProbeOptions opt;
  opt.root = t.root();
  opt.use_nvml = false;
  auto topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok()) << topo.status();
  ASSERT_EQ(topo->gpus_size(), 4);
  auto l = Links(*topo);
  EXPECT_EQ((l[{0, 1}]), "PXB");
  EXPECT_EQ((l[{0, 2}]), "PIX");
  EXPECT_EQ((l[{1, 2}]), "PXB");
  EXPECT_EQ((l[{0, 3}]), "SYS");
}

TEST(PciHelpers, NormalizeBusId) {
  EXPECT_EQ(topo_internal::NormalizeBusId("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(topo_internal::NormalizeBusId("17:00.0"), "0000:17:00.0");
  EXPECT_EQ(topo_internal::NormalizeBusId("garbage"), "");
  EXPECT_EQ(topo_internal::CountCpuList("0-3,8,10-11"), 7);
  EXPECT_EQ(topo_internal::CountCpuList("banana"), -1);
}

// ---- Broken roots never crash ----------------------------------------

TEST(BrokenRoot, EveryGarbageFactIsReportedUnknown) {
  ProbeOptions opt;
  opt.root = Fixture("broken");
  opt.use_nvml = true;
  opt.nvml_library = FixtureDir("broken") + "/fake-libnvidia-ml.so.1";
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->nvml_available());
  EXPECT_TRUE(absl::StrContains(t->nvml_error(), "dlopen")) << t->nvml_error();
  EXPECT_EQ(t->cpu_count(), 0);
  EXPECT_TRUE(HasUnknown(*t, "cpu_count")) << Unknowns(*t);
  EXPECT_TRUE(HasUnknown(*t, "memory: /proc/meminfo MemTotal is garbage"));
  EXPECT_TRUE(HasUnknown(*t, "shm: /dev/shm.size is garbage"));
  EXPECT_TRUE(HasUnknown(*t, "cgroup memory.max is garbage"));
  EXPECT_TRUE(HasUnknown(*t, "cgroup cpu.max is garbage"));
  EXPECT_TRUE(HasUnknown(*t, "gpu 0000:01:00.0 numa_node: garbage"));
  EXPECT_TRUE(HasUnknown(*t, "gpu 0000:01:00.0 current_link_width: garbage"));
  EXPECT_TRUE(HasUnknown(*t, "gpu 0000:02:00.0 pci path"));
  EXPECT_TRUE(HasUnknown(*t, "pci 0000:03:00.0 (NVIDIA) class: unreadable"));
  EXPECT_TRUE(HasUnknown(*t, "nvidia-smi-topo.txt: not usable"));
  EXPECT_TRUE(HasUnknown(*t, "gpu pair 0-1 path: unknown"));
  EXPECT_TRUE(HasUnknown(*t, "infiniband mlx5_9 link_layer"));
  EXPECT_TRUE(HasUnknown(*t, "nvidia-smi-query-gpu.csv:2: index"));
  EXPECT_EQ(t->gpus_size(), 2);
  // The formatter prints unknown pairs as "?" and the unknown list.
  std::string text = FormatTopoMatrix(*t);
  EXPECT_TRUE(absl::StrContains(text, "?")) << text;
  EXPECT_TRUE(absl::StrContains(text, "Unknown facts:")) << text;
}

// Every fixture's nvidia-smi text mutated at random (testutil::MutateBytes):
// the parser returns a matrix that keeps its shape or an error, never
// crashes; and the probe, given a mutated text, still returns a topology.
TEST(BrokenRoot, MutatedNvidiaSmiTextNeverCrashes) {
  std::mt19937_64 rng(11);
  int accepted = 0, total = 0;
  for (const char* fixture : {"nvlink-8-h100", "a100-4x-pcie", "wsl2-2x4090", "workstation-3gpu"}) {
    const std::string original = ReadFile(FixtureDir(fixture) + "/nvidia-smi-topo-m.txt");
    ASSERT_FALSE(original.empty()) << fixture;
    for (int i = 0; i < 500; ++i, ++total) {
      const std::string text = testutil::MutateBytes(original, &rng);
      SCOPED_TRACE(absl::StrCat(fixture, " mutation ", i));
      auto m = ParseNvidiaSmiTopo(text);
      if (!m.ok()) {
        EXPECT_FALSE(m.status().message().empty());
        continue;
      }
      ++accepted;
      const size_t n = m->devices.size();
      ASSERT_EQ(m->cells.size(), n);
      for (const auto& row : m->cells) ASSERT_EQ(row.size(), n);
      EXPECT_EQ(m->cpu_affinity.size(), n);
      EXPECT_EQ(m->numa_affinity.size(), n);
      for (int a = 0; a < m->gpu_count(); ++a) {
        for (int b = 0; b < m->gpu_count(); ++b) m->GpuPath(a, b);
      }
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, total);
  // Through the probe, on the WSL2 fixture (no PCI GPUs: the text is the
  // whole matrix), a mutated text degrades into unknowns.
  const std::string original = ReadFile(FixtureDir("wsl2-2x4090") + "/nvidia-smi-topo-m.txt");
  for (int i = 0; i < 200; ++i) {
    ProbeOptions opt;
    opt.root = Fixture("wsl2-2x4090");
    opt.use_nvml = false;
    opt.nvidia_smi_topo_text = testutil::MutateBytes(original, &rng);
    auto t = ProbeTopology(opt);
    ASSERT_TRUE(t.ok()) << "mutation " << i << ": " << t.status();
    for (const auto& link : t->links()) {
      EXPECT_LT(link.a(), link.b());
      EXPECT_LT(link.b(), t->gpus_size());
      EXPECT_TRUE(IsValidPathType(link.path())) << link.path();
    }
  }
}

TEST(BrokenRoot, EmptyRootReportsMissingFacts) {
  TempTree t;
  ProbeOptions opt;
  opt.root = t.root();
  opt.use_nvml = false;
  auto topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_TRUE(HasUnknown(*topo, "memory: /proc/meminfo unreadable"));
  EXPECT_TRUE(HasUnknown(*topo, "gpus: /sys/bus/pci/devices missing"));
  EXPECT_TRUE(HasUnknown(*topo, "shm: /dev/shm missing"));
  EXPECT_EQ(topo->nvml_error(), "not loaded (ProbeOptions.use_nvml = false)");
}

TEST(BrokenRoot, MissingRootIsAnError) {
  ProbeOptions opt;
  opt.root = "/nonexistent/dgca/root";
  auto t = ProbeTopology(opt);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "/nonexistent/dgca/root"));
}

TEST(TopologyProbe, RealMachineDoesNotCrash) {
  auto t = ProbeTopology(ProbeOptions{});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->cpu_count(), 0);
  EXPECT_GT(t->memory_bytes(), 0u);
  // NVML may or may not exist here; either way it is reported, not fatal.
  if (!t->nvml_available()) EXPECT_FALSE(t->nvml_error().empty());
}

// ---- NVML through fake entry points ---------------------------------------------------

namespace fake_nvml {
// Layouts of nvml.h's nvmlMemory_t and nvmlPciInfo_t.
struct Memory {
  unsigned long long total, free, used;
};
struct PciInfo {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct Dev {
  std::string name, bus;
  unsigned long long mem;
  int major, minor;
  std::vector<std::string> links;  // remote bus id per active NVLink
};
std::vector<Dev> devs;
std::map<std::pair<int, int>, int> levels;
int init_rc = 0;

int Init() { return init_rc; }
int Shutdown() { return 0; }
const char* Err(int) { return "Driver Not Loaded"; }
int Count(unsigned* n) {
  *n = static_cast<unsigned>(devs.size());
  return 0;
}
int Handle(unsigned i, void** d) {
  if (i >= devs.size()) return 2;
  *d = &devs[i];
  return 0;
}
int Name(void* d, char* buf, unsigned len) {
  snprintf(buf, len, "%s", static_cast<Dev*>(d)->name.c_str());
  return 0;
}
int Mem(void* d, Memory* m) {
  m->total = static_cast<Dev*>(d)->mem;
  return 0;
}
int Cc(void* d, int* ma, int* mi) {
  *ma = static_cast<Dev*>(d)->major;
  *mi = static_cast<Dev*>(d)->minor;
  return 0;
}
int Pci(void* d, PciInfo* p) {
  snprintf(p->busId, sizeof(p->busId), "%s", static_cast<Dev*>(d)->bus.c_str());
  return 0;
}
int Driver(char* buf, unsigned len) {
  snprintf(buf, len, "550.54.15");
  return 0;
}
int Cuda(int* v) {
  *v = 12040;
  return 0;
}
int LinkState(void* d, unsigned l, int* active) {
  *active = l < static_cast<Dev*>(d)->links.size();
  return 0;
}
int Remote(void* d, unsigned l, PciInfo* p) {
  snprintf(p->busId, sizeof(p->busId), "%s", static_cast<Dev*>(d)->links.at(l).c_str());
  return 0;
}
int Ancestor(void* a, void* b, int* level) {
  int ia = static_cast<int>(static_cast<Dev*>(a) - devs.data());
  int ib = static_cast<int>(static_cast<Dev*>(b) - devs.data());
  auto it = levels.find({std::min(ia, ib), std::max(ia, ib)});
  if (it == levels.end()) return 3;
  *level = it->second;
  return 0;
}
void* Lookup(const char* name) {
  static const std::map<std::string, void*> table = {
      {"nvmlInit_v2", reinterpret_cast<void*>(&Init)},
      {"nvmlShutdown", reinterpret_cast<void*>(&Shutdown)},
      {"nvmlErrorString", reinterpret_cast<void*>(&Err)},
      {"nvmlDeviceGetCount_v2", reinterpret_cast<void*>(&Count)},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void*>(&Handle)},
      {"nvmlDeviceGetName", reinterpret_cast<void*>(&Name)},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&Mem)},
      {"nvmlDeviceGetCudaComputeCapability", reinterpret_cast<void*>(&Cc)},
      {"nvmlDeviceGetPciInfo_v3", reinterpret_cast<void*>(&Pci)},
      {"nvmlSystemGetDriverVersion", reinterpret_cast<void*>(&Driver)},
      {"nvmlSystemGetCudaDriverVersion_v2", reinterpret_cast<void*>(&Cuda)},
      {"nvmlDeviceGetNvLinkState", reinterpret_cast<void*>(&LinkState)},
      {"nvmlDeviceGetNvLinkRemotePciInfo_v2", reinterpret_cast<void*>(&Remote)},
      {"nvmlDeviceGetTopologyCommonAncestor", reinterpret_cast<void*>(&Ancestor)},
  };
  auto it = table.find(name);
  return it == table.end() ? nullptr : it->second;
}
}  // namespace fake_nvml

TEST(Nvml, NvLinkBridgeOverridesPcieAndNamesWin) {
  using fake_nvml::Dev;
  const std::string b0 = "00000000:04:00.0", b1 = "00000000:05:00.0",
                    b2 = "00000000:84:00.0", b3 = "00000000:85:00.0";
  fake_nvml::devs = {
      Dev{"NVIDIA A100 80GB PCIe", b0, 85899345920ull, 8, 0, std::vector<std::string>(12, b1)},
      Dev{"NVIDIA A100 80GB PCIe", b1, 85899345920ull, 8, 0, std::vector<std::string>(12, b0)},
      Dev{"NVIDIA A100 80GB PCIe", b2, 85899345920ull, 8, 0, {}},
      Dev{"NVIDIA A100 80GB PCIe", b3, 85899345920ull, 8, 0, {}}};
  fake_nvml::levels.clear();
  fake_nvml::init_rc = 0;
  NvmlReport r = QueryNvmlSymbols(&fake_nvml::Lookup, "fake");
  ASSERT_TRUE(r.available) << r.error;
  EXPECT_EQ(r.cuda_version, "12.4");
  EXPECT_EQ(r.gpus[1].bus_id, "0000:05:00.0");
  ProbeOptions opt;
  opt.root = Fixture("a100-4x-pcie");
  auto t = topo_internal::ProbeTopologyWithNvml(opt, &r);
  ASSERT_TRUE(t.ok()) << t.status();
  auto l = Links(*t);
  EXPECT_EQ((l[{0, 1}]), "NV12");
  EXPECT_EQ((l[{2, 3}]), "PIX");
  EXPECT_EQ((l[{0, 2}]), "SYS");
  EXPECT_EQ(t->gpus(0).name(), "NVIDIA A100 80GB PCIe");  // NVML over the CSV
  EXPECT_EQ(t->gpus(3).memory_bytes(), 85899345920ull);
  EXPECT_EQ(t->driver_version(), "550.54.15");
  EXPECT_TRUE(t->nvml_available());
}

TEST(Nvml, NvSwitchGpusWithoutSysfs) {
  using fake_nvml::Dev;
  fake_nvml::devs.clear();
  fake_nvml::levels.clear();
  for (int g = 0; g < 4; ++g) {
    // 18 links each, all to NVSwitches (not GPUs).
    std::vector<std::string> sw;
    for (int l = 0; l < 18; ++l) sw.push_back(absl::StrCat("00000000:0", l % 4, ":00.0"));
    fake_nvml::devs.push_back(Dev{"NVIDIA H100 80GB HBM3",
                                  absl::StrCat("00000000:", 0x18 + 0x10 * g, ":00.0"),
                                  85520809984ull, 9, 0, sw});
  }
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) fake_nvml::levels[{a, b}] = (a < 2) == (b < 2) ? 40 : 50;
  fake_nvml::init_rc = 0;
  NvmlReport r = QueryNvmlSymbols(&fake_nvml::Lookup, "fake");
  ASSERT_TRUE(r.available);
  EXPECT_EQ((r.paths[{0, 1}]), "NODE");
  EXPECT_EQ((r.paths[{1, 2}]), "SYS");
  TempTree tree;
  ProbeOptions opt;
  opt.root = tree.root();
  auto t = topo_internal::ProbeTopologyWithNvml(opt, &r);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus_size(), 4);
  auto l = Links(*t);
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) EXPECT_EQ((l[{a, b}]), "NV18") << a << "-" << b;
}

TEST(Nvml, InitFailureAndMissingSymbolsAreReported) {
  fake_nvml::init_rc = 9;
  NvmlReport r = QueryNvmlSymbols(&fake_nvml::Lookup, "fake");
  EXPECT_FALSE(r.available);
  EXPECT_EQ(r.error, "nvmlInit_v2: Driver Not Loaded");
  fake_nvml::init_rc = 0;
  NvmlReport none = QueryNvmlSymbols([](const char*) -> void* { return nullptr; }, "libfoo.so");
  EXPECT_FALSE(none.available);
  EXPECT_TRUE(absl::StrContains(none.error, "not an NVML library")) << none.error;
  // And through the probe: a plain file as the library.
  ProbeOptions opt;
  opt.root = Fixture("cpu-only");
  opt.nvml_library = FixtureDir("broken") + "/fake-libnvidia-ml.so.1";
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->nvml_available());
  EXPECT_TRUE(absl::StrContains(t->nvml_error(), "fake-libnvidia-ml.so.1"));
}

TEST(CgroupV1AndCpuinfo, Fallbacks) {
  TempTree t;
  t.Write("proc/cpuinfo", "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n\nprocessor\t: 2\n");
  t.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296\n");
  t.Write("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "150000\n");
  t.Write("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  t.Write("proc/version", "Linux version 5.15.90.1-Microsoft-standard-WSL2\n");
  ProbeOptions opt;
  opt.root = t.root();
  opt.use_nvml = false;
  auto topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->cpu_count(), 3);
  EXPECT_EQ(topo->cgroup_memory_limit_bytes(), 4ull << 30);
  EXPECT_DOUBLE_EQ(topo->cgroup_cpu_limit(), 1.5);
  EXPECT_TRUE(topo->wsl2());  // case-insensitive "microsoft"
  // v1 "no limit" is a huge number: not a limit.
  t.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->cgroup_memory_limit_bytes(), 0u);
}

// The CPU's kind for the compute prior: the first processor's model name,
// clock and widest SIMD; later processors do not override it.
TEST(Cpuinfo, ModelClockAndVectorWidth) {
  TempTree t;
  t.Write("proc/cpuinfo",
          "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\ncpu MHz\t\t: 2100.000\n"
          "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw\n\n"
          "processor\t: 1\nmodel name\t: other\ncpu MHz\t\t: 900.0\nflags\t\t: sse2\n");
  ProbeOptions opt;
  opt.root = t.root();
  opt.use_nvml = false;
  auto topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->cpu_model(), "Intel(R) Xeon(R) Processor");
  EXPECT_DOUBLE_EQ(topo->cpu_mhz(), 2100.0);
  EXPECT_EQ(topo->cpu_vector_bits(), 512);
  EXPECT_EQ(topo->cpu_count(), 2);
  // AVX2 needs FMA for 256-bit FMAs; an ARM core's asimd is 128 bits.
  t.Write("proc/cpuinfo", "processor\t: 0\nflags\t\t: sse2 avx avx2 fma\n");
  EXPECT_EQ(ProbeTopology(opt)->cpu_vector_bits(), 256);
  t.Write("proc/cpuinfo", "processor\t: 0\nFeatures\t: fp asimd evtstrm\n");
  EXPECT_EQ(ProbeTopology(opt)->cpu_vector_bits(), 128);
  // Garbage: unknown, not a crash.
  t.Write("proc/cpuinfo", "processor\t: 0\ncpu MHz\t: fast\nflags\t: \n");
  topo = ProbeTopology(opt);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->cpu_mhz(), 0);
  EXPECT_EQ(topo->cpu_vector_bits(), 0);
}

// The GEMM rate comes from the program the agent names; a failing or
// garbled program leaves it unknown with the reason, never a crash.
TEST(GemmRate, FromTheProgramsLines) {
  ProbeOptions opt;
  opt.root = Fixture("cpu-only");
  opt.use_nvml = false;
  opt.gemm_rate_command = {"/bin/sh", "-c", "echo threads=1 flops=2.8e10; echo threads=2 flops=3.4e10"};
  auto t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->cpu_gemm_flops_one_thread(), 2.8e10);
  EXPECT_DOUBLE_EQ(t->cpu_gemm_flops_all_threads(), 3.4e10);
  auto unknown_has = [](const v1::Topology& topo, const std::string& what) {
    for (const auto& u : topo.unknown())
      if (absl::StrContains(u, "cpu_gemm:") && absl::StrContains(u, what)) return true;
    return false;
  };
  opt.gemm_rate_command = {"/bin/sh", "-c", "echo broken >&2; exit 3"};
  t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->cpu_gemm_flops_one_thread(), 0);
  EXPECT_TRUE(unknown_has(*t, "exited 3: broken"));
  opt.gemm_rate_command = {"/bin/sh", "-c", "echo threads=1 flops=fast"};
  t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(unknown_has(*t, "printed no"));
  opt.gemm_rate_command = {"/nonexistent/dgca-worker", "gemm-rate"};
  t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(unknown_has(*t, "/nonexistent/dgca-worker"));
  // Not asked for (fixtures, `dgca topo`): nothing measured, nothing unknown.
  opt.gemm_rate_command.clear();
  t = ProbeTopology(opt);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(unknown_has(*t, ""));
}

// ---- Formatter ------------------------------------------------------------------

TEST(FormatTopoMatrix, RoundTripsThroughTheParser) {
  for (const char* f : {"nvlink-8-h100", "wsl2-2x4090", "workstation-3gpu", "a100-4x-pcie"}) {
    SCOPED_TRACE(f);
    v1::Topology t = Probe(f);
    std::string text = FormatTopoMatrix(t);
    auto m = ParseNvidiaSmiTopo(text);
    ASSERT_TRUE(m.ok()) << m.status() << "\n" << text;
    ASSERT_EQ(m->gpu_count(), t.gpus_size());
    for (const auto& l : t.links()) EXPECT_EQ(m->GpuPath(l.a(), l.b()), l.path());
    EXPECT_TRUE(absl::StrContains(text, "WSL2: ")) << text;
    EXPECT_TRUE(absl::StrContains(text, "/dev/shm: ")) << text;
  }
  std::string cpu = FormatTopoMatrix(Probe("cpu-only"));
  EXPECT_TRUE(absl::StrContains(cpu, "No NVIDIA GPUs found.")) << cpu;
  EXPECT_TRUE(absl::StrContains(cpu, "cgroup limit 4.00 cores")) << cpu;
}

}  // namespace
}  // namespace dgca
