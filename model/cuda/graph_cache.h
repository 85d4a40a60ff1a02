// GraphCache: CUDA graphs for repeated device work. The caller names a
// piece of stream work by a key (e.g. segment, batch size, trimmed length);
// the first time a key is seen the work is enqueued as usual (so GEMM plans
// and buffers settle), the second time it is captured into a graph
// (cudaStreamBeginCapture, thread-local mode), and from then on the graph
// is replayed with one cudaGraphLaunch instead of hundreds of launches.
//
// The work must be replayable: everything it does is enqueued on the
// stream (no host synchronization, allocation or pageable copy inside:
// CUDA invalidates such a capture; the CUDA emulator checks the same), and
// every host value it passes to a kernel (sizes, scales) is part of the
// key, because a graph keeps the arguments of its capture. Memory contents
// may change between replays (that is the point: new batches, new
// weights); the addresses may not.
//
// A capture CUDA rejects is not an error: the key runs without a graph from
// then on (stats().capture_failures says how often). At most `capacity`
// keys keep graphs (least recently used evicted; an evicted key is captured
// again on its next sight).
//
// Thread-safety: not thread-safe; one thread, one stream.
#ifndef DGCA_MODEL_CUDA_GRAPH_CACHE_H_
#define DGCA_MODEL_CUDA_GRAPH_CACHE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <vector>

#include "model/core/status.h"

namespace dgca {
namespace cuda {

class GraphCache {
 public:
  using Key = std::vector<int64_t>;
  struct Stats {
    int64_t eager = 0;     // ran without a graph (first sight, failed capture)
    int64_t captured = 0;  // captured (and launched)
    int64_t replayed = 0;  // launched from the cache
    int64_t capture_failures = 0;
  };

  GraphCache(cudaStream_t stream, size_t capacity) : stream_(stream), capacity_(capacity) {}
  ~GraphCache() { Clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Enqueues the work named `key` on the stream: `enqueue` itself, or its
  // graph. Errors of `enqueue` are returned as they are.
  Status Run(const Key& key, const std::function<Status()>& enqueue);
  // Destroys every graph (keys start over as unseen).
  void Clear();
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    int seen = 0;
    bool failed = false;
    cudaGraphExec_t exec = nullptr;
    std::list<Key>::iterator lru;
  };
  Status Capture(Entry* e, const std::function<Status()>& enqueue);
  void Touch(const Key& key, Entry* e);

  cudaStream_t stream_;
  size_t capacity_;
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;  // most recent first; only keys with a graph
  Stats stats_;
};

}  // namespace cuda
}  // namespace dgca

#endif  // DGCA_MODEL_CUDA_GRAPH_CACHE_H_
