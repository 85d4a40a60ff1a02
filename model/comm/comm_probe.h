// All-reduce bandwidth probe over any Communicator, like nccl-tests'
// all_reduce_perf: for each size, a few warm-up all-reduces, then `iters`
// timed ones back to back. Every rank must call it with the same arguments
// (the number of collectives must match across ranks, so iteration counts
// are a pure function of the size, never of measured time).
//
// algbw = bytes / seconds_per_op; busbw = algbw * 2(n-1)/n (the bytes each
// rank's link actually carries in a ring all-reduce).
//
// Thread-safety: the caller's thread; uses `comm` like the trainer does.
#ifndef DGCA_MODEL_COMM_COMM_PROBE_H_
#define DGCA_MODEL_COMM_COMM_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/comm/communicator.h"
#include "model/core/status.h"

namespace dgca {

struct BusBwRow {
  size_t bytes = 0;
  int iters = 0;
  double seconds_per_op = 0;  // this rank's wall time per all-reduce
  double algbw = 0;           // bytes/s
  double busbw = 0;           // bytes/s
};

struct ProbeOptions {
  std::vector<size_t> sizes_bytes;  // empty: 4 KiB .. 64 MiB, x4
  int warmup = 2;
  // iters(size) = clamp(target_bytes / size, min_iters, max_iters)
  size_t target_bytes = size_t{256} << 20;
  int min_iters = 5;
  int max_iters = 100;
};

// `buffer` holds at least max(sizes)/4 floats in the memory the communicator
// works on (host for Gloo, device for NCCL); its contents are overwritten.
StatusOr<std::vector<BusBwRow>> AllReduceSweep(Communicator* comm, float* buffer,
                                               size_t capacity_floats,
                                               const ProbeOptions& options);

// Default sizes of the sweep.
std::vector<size_t> DefaultProbeSizes();

}  // namespace dgca

#endif  // DGCA_MODEL_COMM_COMM_PROBE_H_
