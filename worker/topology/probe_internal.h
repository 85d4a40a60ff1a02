// Internal helpers of the topology probe (file reading under a root). Not a
// public interface: only worker/topology uses it.
#ifndef DGCA_WORKER_TOPOLOGY_PROBE_INTERNAL_H_
#define DGCA_WORKER_TOPOLOGY_PROBE_INTERNAL_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace dgca {
namespace topo_internal {

// root + path ("/" root leaves path as is).
std::string JoinRoot(const std::string& root, const std::string& path);
// At most max_bytes of the file; nullopt when it cannot be opened.
std::optional<std::string> ReadFile(const std::string& path, size_t max_bytes);
// The file with surrounding whitespace removed (files up to 64 KiB).
std::optional<std::string> ReadTrimmed(const std::string& path);
// Sorted entry names (no "." / ".."); empty when unreadable.
std::vector<std::string> ListDir(const std::string& path);
bool IsDir(const std::string& path);
// Number of CPUs in a kernel cpu list ("0-3,8"); -1 on garbage.
int CountCpuList(const std::string& list);

}  // namespace topo_internal
}  // namespace dgca

#endif  // DGCA_WORKER_TOPOLOGY_PROBE_INTERNAL_H_
