// topology/topo_matrix.h: `nvidia-smi topo -m` output, which the
// node probe reads from the tool (or a fixture tree's copy of it).
#include "topology/topo_matrix.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = dgca::ParseNvidiaSmiTopo(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (m.ok()) {
    for (int a = 0; a < m->gpu_count(); ++a) {
      for (int b = 0; b < m->gpu_count(); ++b) (void)m->GpuPath(a, b);
    }
  }
  return 0;
}
