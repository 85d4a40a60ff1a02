#include "model/comm/comm_probe.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace dgca {

std::vector<size_t> DefaultProbeSizes() {
  std::vector<size_t> s;
  for (size_t b = 4096; b <= (size_t{64} << 20); b *= 4) s.push_back(b);
  return s;
}

StatusOr<std::vector<BusBwRow>> AllReduceSweep(Communicator* comm, float* buffer,
                                               size_t capacity_floats,
                                               const ProbeOptions& options) {
  if (comm == nullptr) return InvalidArgumentError("probe: null communicator");
  const std::vector<size_t> sizes =
      options.sizes_bytes.empty() ? DefaultProbeSizes() : options.sizes_bytes;
  const int n = comm->world_size();
  std::vector<BusBwRow> rows;
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    if (count == 0 || count > capacity_floats) {
      return InvalidArgumentError("probe: size " + std::to_string(bytes) +
                                  " bytes does not fit the buffer of " +
                                  std::to_string(capacity_floats * sizeof(float)) + " bytes");
    }
    const int iters = static_cast<int>(std::clamp<size_t>(
        options.target_bytes / bytes, static_cast<size_t>(options.min_iters),
        static_cast<size_t>(options.max_iters)));
    for (int i = 0; i < options.warmup; ++i) {
      DGCA_RETURN_IF_ERROR(comm->AllReduce(buffer, count, ReduceOp::kSum).WithPrefix(
          "probe warm-up at " + std::to_string(bytes) + " bytes"));
    }
    DGCA_RETURN_IF_ERROR(comm->Barrier());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      DGCA_RETURN_IF_ERROR(comm->AllReduce(buffer, count, ReduceOp::kSum).WithPrefix(
          "probe at " + std::to_string(bytes) + " bytes"));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BusBwRow row;
    row.bytes = count * sizeof(float);
    row.iters = iters;
    row.seconds_per_op = secs / iters;
    row.algbw = row.seconds_per_op > 0 ? row.bytes / row.seconds_per_op : 0;
    row.busbw = n > 1 ? row.algbw * 2.0 * (n - 1) / n : 0;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace dgca
