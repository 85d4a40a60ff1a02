#include "model/cuda/graph_cache.h"

#include <iterator>

#include "model/cuda/cuda_context.h"

namespace dgca {
namespace cuda {

void GraphCache::Clear() {
  for (auto& [key, e] : entries_)
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  entries_.clear();
  lru_.clear();
}

void GraphCache::Touch(const Key& key, Entry* e) {
  lru_.erase(e->lru);
  lru_.push_front(key);
  e->lru = lru_.begin();
}

Status GraphCache::Capture(Entry* e, const std::function<Status()>& enqueue) {
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    e->failed = true;
    ++stats_.capture_failures;
    ++stats_.eager;
    return enqueue();
  }
  Status s = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (!s.ok() && end == cudaSuccess) {  // the work itself failed: as without a graph
    if (graph != nullptr) cudaGraphDestroy(graph);
    return s;
  }
  // A capture CUDA invalidated (something in the work, say inside a
  // library, is not capturable) makes the launches after it fail too: not
  // the work's failure, so it is rerun eagerly below like any capture CUDA
  // rejects (a real failure then shows there). The work is then enqueued
  // twice, so whatever host state it advances (a dropout seed's offset, a
  // profiler mark) advances twice: keep such state out of the work, or
  // accept that a failed capture's step differs from a captured one's.
  cudaGraphExec_t exec = nullptr;
  if (end != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    // CUDA would not take it as a graph: nothing ran, so run it now, and
    // never capture this key again.
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    e->failed = true;
    ++stats_.capture_failures;
    ++stats_.eager;
    return enqueue();
  }
  cudaGraphDestroy(graph);  // the executable graph stands alone
  e->exec = exec;
  ++stats_.captured;
  return CudaStatus(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
}

Status GraphCache::Run(const Key& key, const std::function<Status()>& enqueue) {
  if (entries_.size() > 4096) {  // a safety net for keys that never repeat: forget those without a graph
    for (auto it = entries_.begin(); it != entries_.end();)
      it = it->second.exec == nullptr ? entries_.erase(it) : std::next(it);
  }
  Entry& e = entries_[key];
  if (e.exec != nullptr) {
    Touch(key, &e);
    ++stats_.replayed;
    return CudaStatus(cudaGraphLaunch(e.exec, stream_), "cudaGraphLaunch");
  }
  if (e.failed || e.seen++ == 0) {
    ++stats_.eager;
    return enqueue();
  }
  DGCA_RETURN_IF_ERROR(Capture(&e, enqueue));
  if (e.exec != nullptr) {
    lru_.push_front(key);
    e.lru = lru_.begin();
    while (lru_.size() > capacity_) {
      auto old = entries_.find(lru_.back());
      lru_.pop_back();
      if (old != entries_.end()) {
        // Keep the entry (its key was seen): it is captured again on its
        // next sight instead of running eagerly first.
        cudaGraphExecDestroy(old->second.exec);
        old->second.exec = nullptr;
      }
    }
  }
  return OkStatus();
}

}  // namespace cuda
}  // namespace dgca
