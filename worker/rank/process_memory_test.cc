#include "worker/rank/process_memory.h"

#include <vector>

#include "gtest/gtest.h"

namespace dgca {
namespace {

TEST(ProcessMemoryTest, ParsesTheKernelsVmHwmLine) {
  // As Linux 6.1 writes it (fs/proc/task_mmu.c: "VmHWM:\t%8lu kB").
  const char* status =
      "Name:\tdgca-worker\nVmPeak:\t  812344 kB\nVmSize:\t  812340 kB\n"
      "VmHWM:\t  204800 kB\nVmRSS:\t  198000 kB\n";
  EXPECT_DOUBLE_EQ(ParseVmHwmBytes(status), 204800.0 * 1024);
}

TEST(ProcessMemoryTest, MissingOrMalformedIsMinusOne) {
  EXPECT_EQ(ParseVmHwmBytes(""), -1);
  EXPECT_EQ(ParseVmHwmBytes("VmRSS:\t 10 kB\n"), -1);
  EXPECT_EQ(ParseVmHwmBytes("VmHWM:\t 10 MB\n"), -1);
  EXPECT_EQ(ParseVmHwmBytes("VmHWM:\t ten kB\n"), -1);
}

TEST(ProcessMemoryTest, ThisProcessPeakGrowsWithWhatItTouches) {
  const double before = ProcessPeakResidentBytes();
  ASSERT_GT(before, 0) << "/proc/self/status has no VmHWM";
  // 64 MiB written page by page is resident at once: the peak grows by it.
  std::vector<char> block(64 << 20);
  for (size_t i = 0; i < block.size(); i += 4096) block[i] = static_cast<char>(i);
  volatile char sink = block[block.size() / 2];
  (void)sink;
  EXPECT_GE(ProcessPeakResidentBytes(), before + 60.0 * (1 << 20));
}

}  // namespace
}  // namespace dgca
