#include "model/comm/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#ifdef DGCA_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace dgca {

#ifndef DGCA_HAVE_NCCL

namespace {
Status NoNccl() {
  return UnimplementedError(
      "this build has no NCCL support (CUDA toolkit or libnccl not found at configure time; "
      "see model/CMakeLists.txt DGCA_WITH_NCCL)");
}
}  // namespace

StatusOr<int> NcclVisibleDevices() { return NoNccl(); }
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::shared_ptr<KeyValueStore>, int,
                                                             int, const NcclOptions&) {
  return NoNccl();
}
void DeviceBufferDeleter::operator()(float*) const {}
StatusOr<DeviceBuffer> AllocateDeviceFloats(size_t) { return NoNccl(); }
Status CopyToDevice(float*, const float*, size_t) { return NoNccl(); }
Status CopyToHost(float*, const float*, size_t) { return NoNccl(); }

#else  // DGCA_HAVE_NCCL

namespace {

using Clock = std::chrono::steady_clock;

// NCCL 2.14: ncclConfig_t, ncclCommInitRankConfig, ncclCommFinalize.
constexpr int kMinNcclVersion = 21400;

// ncclCommAbort(comm) on a helper thread (on `device`), waited for at most
// `limit` (NcclOptions::abort_limit). Returns "" when it returned, else a
// note for the caller's error; the thread is then left running and the
// communicator must not be touched again.
std::string AbortWithin(ncclComm_t comm, int device, std::chrono::milliseconds limit) {
  if (limit.count() <= 0) {  // unbounded, on this thread
    ncclCommAbort(comm);
    return "";
  }
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> returned = done->get_future();
  try {
    std::thread([comm, device, done] {
      cudaSetDevice(device);
      ncclCommAbort(comm);
      done->set_value();
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: abort here, unbounded
    ncclCommAbort(comm);
    return "";
  }
  if (returned.wait_for(limit) == std::future_status::ready) return "";
  return "; ncclCommAbort did not return within " + std::to_string(limit.count()) +
         " ms (left running; this rank should exit)";
}

// Aborts `comm` after the failure `s` (AbortWithin, o.abort_limit) and
// returns `s`, with AbortWithin's note when the abort was left running:
// then *hung (when given) is set and o.on_abort_hung is called with it.
// Both a failed init and a broken communicator (Break) end here.
Status AbortAfter(ncclComm_t comm, int device, const NcclOptions& o, const Status& s, bool* hung = nullptr) {
  const std::string note = AbortWithin(comm, device, o.abort_limit);
  if (hung != nullptr) *hung = !note.empty();
  if (note.empty()) return s;
  Status out(s.code(), s.message() + note);
  if (o.on_abort_hung) o.on_abort_hung(out);
  return out;
}

Status CudaError(const char* what, cudaError_t e) {
  return InternalError(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                       cudaGetErrorString(e) + ")");
}

Status NcclError(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string m = std::string(what) + ": " + ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last && *last) m += std::string(" (") + last + ")";
  return UnavailableError(m);
}

#define DGCA_CUDA_OK(what, expr)                    \
  do {                                              \
    cudaError_t dgca_e_ = (expr);                   \
    if (dgca_e_ != cudaSuccess) return CudaError(what, dgca_e_); \
  } while (0)

class NcclCommunicator;

class NcclHandle : public CollectiveHandle {
 public:
  NcclHandle(NcclCommunicator* comm, cudaEvent_t start, cudaEvent_t end, double host_start)
      : comm_(comm), start_(start), end_(end), start_time_(host_start), end_time_(host_start) {}
  ~NcclHandle() override;
  Status Wait() override;
  double start_time() const override { return start_time_; }
  double end_time() const override { return end_time_; }

 private:
  NcclCommunicator* comm_;
  cudaEvent_t start_;
  cudaEvent_t end_;
  double start_time_;
  double end_time_;
  bool waited_ = false;
  Status result_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, int rank, int world,
                   const NcclOptions& o, Clock::time_point origin)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), world_(world),
        compute_(static_cast<cudaStream_t>(o.compute_stream)),
        origin_(origin), options_(o) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    // Finish queued work (bounded by the timeout; Sync aborts on failure),
    // then finalize (non-blocking: polled until it settles, within the
    // timeout, as NCCL asks of a non-blocking communicator before destroy)
    // and free it. Settle aborts a finalize that fails or does not settle;
    // a broken communicator was already aborted.
    if (!aborted_ && Sync(stream_).ok() && Settle(ncclCommFinalize(comm_), "ncclCommFinalize").ok()) {
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
    // cudaFree waits for the device, where an unaborted kernel may spin.
    if (scratch_ && !abort_hung_) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  double Now() const override {
    return std::chrono::duration<double>(Clock::now() - origin_).count();
  }

  StatusOr<std::unique_ptr<CollectiveHandle>> StartAllReduce(float* data, size_t count,
                                                              ReduceOp op) override {
    if (!broken_.ok()) return broken_;
    DGCA_CUDA_OK("cudaSetDevice", cudaSetDevice(device_));
    // Destroys the events still held when an early return leaves
    // (destruction is deferred by CUDA until they complete).
    cudaEvent_t ready = nullptr, start = nullptr, end = nullptr;
    struct Events {
      cudaEvent_t* e[3];
      ~Events() {
        for (cudaEvent_t* p : e)
          if (*p != nullptr) cudaEventDestroy(*p);
      }
    } held{{&ready, &start, &end}};
    // `ready` orders the all-reduce after the compute stream's work so far.
    DGCA_CUDA_OK("cudaEventCreate", cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    DGCA_CUDA_OK("cudaEventRecord", cudaEventRecord(ready, compute_));
    DGCA_CUDA_OK("cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, ready, 0));
    DGCA_CUDA_OK("cudaEventCreate", cudaEventCreate(&start));
    DGCA_CUDA_OK("cudaEventCreate", cudaEventCreate(&end));
    double host_start = Now();
    DGCA_CUDA_OK("cudaEventRecord", cudaEventRecord(start, stream_));
    DGCA_RETURN_IF_ERROR(Settle(
        ncclAllReduce(data, data, count, ncclFloat, op == ReduceOp::kAverage ? ncclAvg : ncclSum,
                      comm_, stream_),
        "ncclAllReduce"));
    DGCA_CUDA_OK("cudaEventRecord", cudaEventRecord(end, stream_));
    auto handle = std::unique_ptr<CollectiveHandle>(new NcclHandle(this, start, end, host_start));
    start = end = nullptr;  // the handle's now
    return handle;
  }

  Status Broadcast(float* data, size_t count, int root) override {
    if (!broken_.ok()) return broken_;
    if (root < 0 || root >= world_) {
      return InvalidArgumentError("broadcast root " + std::to_string(root) +
                                  " outside the world of " + std::to_string(world_));
    }
    DGCA_CUDA_OK("cudaSetDevice", cudaSetDevice(device_));
    cudaEvent_t ready = nullptr;
    DGCA_CUDA_OK("cudaEventCreate", cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    DGCA_CUDA_OK("cudaEventRecord", cudaEventRecord(ready, compute_));
    DGCA_CUDA_OK("cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    DGCA_RETURN_IF_ERROR(
        Settle(ncclBroadcast(data, data, count, ncclFloat, root, comm_, stream_), "ncclBroadcast"));
    return Sync(stream_);
  }

  // A one-element all-reduce: returns when every rank reached it.
  Status Barrier() override {
    if (!broken_.ok()) return broken_;
    DGCA_CUDA_OK("cudaSetDevice", cudaSetDevice(device_));
    if (!scratch_) DGCA_CUDA_OK("cudaMalloc", cudaMalloc(&scratch_, sizeof(float)));
    DGCA_RETURN_IF_ERROR(Settle(
        ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce"));
    return Sync(stream_);
  }

  // Polls until the stream (or event) completes, NCCL reports an async error
  // or the timeout expires (then the communicator is aborted).
  template <typename Query>
  Status Poll(Query done, const char* what) {
    auto deadline = Clock::now() + options_.timeout;
    int spins = 0;
    while (true) {
      cudaError_t e = done();
      if (e == cudaSuccess) return OkStatus();
      if (e != cudaErrorNotReady) return Break(CudaError(what, e));
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return Break(NcclError("ncclCommGetAsyncError", r, comm_));
      if (async != ncclSuccess && async != ncclInProgress) {
        return Break(NcclError("NCCL collective failed (a peer rank may have died)", async, comm_));
      }
      if (Clock::now() > deadline) {
        return Break(DeadlineExceededError(
            "NCCL collective did not finish within " + std::to_string(options_.timeout.count()) +
            " ms on rank " + std::to_string(rank_) + " (a peer rank is lost or stuck); "
            "communicator aborted"));
      }
      BackOff(&spins);
    }
  }

  // Between two polls: yield for the first 100, then sleep 50 us, so a wait
  // on a lost or hung peer does not take a core for the whole timeout.
  static void BackOff(int* spins) {
    if (++*spins > 100) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::yield();
    }
  }

  // The communicator is non-blocking (so init can time out): a call may
  // return ncclInProgress, and NCCL's contract is to poll
  // ncclCommGetAsyncError until it leaves ncclInProgress before anything
  // else touches the communicator or its stream (the operation is only then
  // enqueued, so the completion event is recorded after it).
  Status Settle(ncclResult_t r, const char* what) {
    auto deadline = Clock::now() + options_.timeout;
    int spins = 0;
    while (r == ncclInProgress) {
      ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
      if (q != ncclSuccess) r = q;
      if (r == ncclInProgress) {
        if (Clock::now() > deadline) {
          return Break(DeadlineExceededError(std::string(what) + " was not enqueued within " +
                                             std::to_string(options_.timeout.count()) + " ms on rank " +
                                             std::to_string(rank_) + "; communicator aborted"));
        }
        BackOff(&spins);
      }
    }
    if (r != ncclSuccess) return Break(NcclError(what, r, comm_));
    return OkStatus();
  }

  Status Sync(cudaStream_t s) {
    return Poll([s] { return cudaStreamQuery(s); }, "cudaStreamQuery");
  }
  Status SyncEvent(cudaEvent_t e) {
    if (!broken_.ok()) return broken_;
    return Poll([e] { return cudaEventQuery(e); }, "cudaEventQuery");
  }

  Status Break(Status s) {
    if (broken_.ok()) {
      // The abort unblocks kernels waiting on lost peers.
      broken_ = AbortAfter(comm_, device_, options_, s, &abort_hung_);
      aborted_ = true;
    }
    return broken_;
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  int rank_;
  int world_;
  cudaStream_t compute_;
  Clock::time_point origin_;
  float* scratch_ = nullptr;
  Status broken_;
  bool aborted_ = false;
  bool abort_hung_ = false;  // its NCCL kernels may still spin: no cudaFree
  NcclOptions options_;  // timeout, abort_limit, on_abort_hung

  friend class NcclHandle;
};

NcclHandle::~NcclHandle() {
  cudaEventDestroy(start_);
  cudaEventDestroy(end_);
}

Status NcclHandle::Wait() {
  if (waited_) return result_;
  waited_ = true;
  result_ = comm_->SyncEvent(end_);
  if (result_.ok()) {
    end_time_ = comm_->Now();
    float ms = 0;
    // GPU duration between the two events; the host launch time as origin.
    if (cudaEventElapsedTime(&ms, start_, end_) == cudaSuccess) {
      end_time_ = start_time_ + ms / 1000.0;
    }
  }
  return result_;
}

}  // namespace

StatusOr<int> NcclVisibleDevices() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    std::string why = e != cudaSuccess
                          ? std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) +
                                "), error " + std::to_string(static_cast<int>(e))
                          : "0 devices";
    return FailedPreconditionError("no CUDA device visible (cudaGetDeviceCount: " + why +
                                   "); NCCL needs a GPU: use backend gloo with device cpu");
  }
  return n;
}

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::shared_ptr<KeyValueStore> store,
                                                             int rank, int world_size,
                                                             const NcclOptions& o) {
  auto origin = Clock::now();
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("NCCL communicator: rank " + std::to_string(rank) +
                                " outside world of " + std::to_string(world_size));
  }
  if (!store) return InvalidArgumentError("NCCL communicator: no rendezvous store given");
  // NCCL lets NCCL_COMM_BLOCKING in the environment override
  // config.blocking, which would make the init (and every call) block with
  // no timeout: refused, first, before this rank publishes or waits for
  // anything. (A value in ~/.nccl.conf or /etc/nccl.conf, which NCCL reads
  // at its first call, is not seen here.)
  if (const char* b = std::getenv("NCCL_COMM_BLOCKING"); b != nullptr && *b != '\0' && std::string(b) != "0") {
    return FailedPreconditionError(std::string("NCCL_COMM_BLOCKING=") + b +
                                   " is set: it overrides the communicator's non-blocking mode, and a peer that "
                                   "never joins would hang this rank without a timeout; unset it");
  }
  // The library loaded at run time, which may be older than the headers
  // this was built with: the non-blocking init and finalize need 2.14.
  if (int version = 0; ncclGetVersion(&version) == ncclSuccess && version < kMinNcclVersion) {
    return FailedPreconditionError("NCCL communicator: the loaded libnccl is version code " +
                                   std::to_string(version) + ", older than 2.14 (" +
                                   std::to_string(kMinNcclVersion) +
                                   "), which ncclCommInitRankConfig and ncclCommFinalize need; install NCCL >= 2.14");
  }
  DGCA_ASSIGN_OR_RETURN(int devices, NcclVisibleDevices());
  int device = o.device >= 0 ? o.device : rank % devices;
  if (device >= devices) {
    return InvalidArgumentError("NCCL communicator: device " + std::to_string(device) +
                                " requested, " + std::to_string(devices) + " visible");
  }
  DGCA_CUDA_OK("cudaSetDevice", cudaSetDevice(device));

  // Unique id: rank 0 makes it, everyone else reads it from the store.
  const std::string key = o.key_prefix + "nccl/unique_id";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
    DGCA_RETURN_IF_ERROR(
        store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)))
            .WithPrefix("NCCL bootstrap: publishing the unique id"));
  } else {
    auto v = store->Wait(key, o.timeout);
    if (!v.ok()) return v.status().WithPrefix("NCCL bootstrap: waiting for rank 0's unique id");
    if (v->size() != sizeof(id)) {
      return DataLossError("NCCL bootstrap: unique id under '" + key + "' has " +
                           std::to_string(v->size()) + " bytes, expected " +
                           std::to_string(sizeof(id)));
    }
    std::memcpy(&id, v->data(), sizeof(id));
  }

  // Non-blocking init, polled, so a missing peer cannot hang us.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    Status s = NcclError("ncclCommInitRankConfig", r, nullptr);
    return comm ? AbortAfter(comm, device, o, s) : s;
  }
  auto deadline = Clock::now() + o.timeout;
  while (true) {
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      return AbortAfter(comm, device, o, NcclError("NCCL communicator init", state, comm));
    }
    if (Clock::now() > deadline) {
      return AbortAfter(comm, device, o,
                         DeadlineExceededError("NCCL communicator init: not every one of " +
                                               std::to_string(world_size) + " ranks joined within " +
                                               std::to_string(o.timeout.count()) + " ms (rank " +
                                               std::to_string(rank) + ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    return AbortAfter(comm, device, o, CudaError("cudaStreamCreate", e));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, stream, device, rank, world_size, o, origin));
}

void DeviceBufferDeleter::operator()(float* p) const {
  if (p) cudaFree(p);
}

StatusOr<DeviceBuffer> AllocateDeviceFloats(size_t count) {
  DGCA_ASSIGN_OR_RETURN(int devices, NcclVisibleDevices());
  (void)devices;
  void* p = nullptr;
  DGCA_CUDA_OK("cudaMalloc", cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(float)));
  return DeviceBuffer(static_cast<float*>(p));
}

Status CopyToDevice(float* device, const float* host, size_t count) {
  DGCA_CUDA_OK("cudaMemcpy", cudaMemcpy(device, host, count * sizeof(float),
                                        cudaMemcpyHostToDevice));
  return OkStatus();
}

Status CopyToHost(float* host, const float* device, size_t count) {
  DGCA_CUDA_OK("cudaMemcpy", cudaMemcpy(host, device, count * sizeof(float),
                                        cudaMemcpyDeviceToHost));
  return OkStatus();
}

#endif  // DGCA_HAVE_NCCL

}  // namespace dgca
