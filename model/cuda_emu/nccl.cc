// The emulator's NCCL (emulator.h): the entry points model/comm/
// nccl_communicator.cc calls, between rank PROCESSES of one machine, each
// with its own emulated GPU. The lent GPU machines have one GPU and NCCL
// refuses two ranks on one device, so this is the only place the
// multi-rank GPU path (rank, CUDA trainer, NCCL all-reduce of device
// buffers, broadcast, barrier) can run.
//
// Transport: a directory /dev/shm/dgca-emu-nccl-<id> per communicator.
// A rank joins by writing join.<rank> (its pid); init completes when all
// have joined. Collective number s (every rank numbers its calls in order,
// as NCCL requires them to be issued in the same order) is a stream item
// that, once its inputs are done, deposits the rank's header and data as
// s<s>.r<rank> (a broadcast's non-roots: the header only; written under a
// temporary name and renamed), becomes ready when every rank's deposit is
// there, then reduces the deposits in rank order (so every rank computes
// bitwise the same sum) into its buffer and writes s<s>.d<rank>; the last
// rank to finish removes the step's files.
//
// Checked, with NCCL's error codes and a message in ncclGetLastError:
// device pointers and their extents, the datatype (float only is
// emulated), ranks that disagree on collective s (kind, count, op, root:
// ncclInvalidUsage), a peer whose process exited or that left the
// communicator before issuing collective s (ncclRemoteError naming the
// rank). ncclCommAbort releases everything waiting.
//
// Thread-safety: the entry points take the emulator's global lock (the
// stream work calling `ready`/`work` holds it too), so ncclCommAbort from
// a watchdog thread is safe; ncclCommInitRankConfig waits for its peers
// without it.
#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/cuda_emu/emulator.h"
#include "model/cuda_emu/internal.h"

namespace {

namespace emu = dgca::cuda::emu;

enum class Kind : int32_t { kAllReduce = 1, kBroadcast = 2 };

// What every rank's deposit starts with; ranks must agree on it.
struct Header {
  int32_t magic;
  int32_t kind;
  int32_t op;    // ncclRedOp_t
  int32_t root;  // broadcast
  uint64_t count;
};
constexpr int32_t kMagic = 0x64676361;  // "dgca"

struct CommState {
  std::string dir;
  int rank = 0;
  int nranks = 0;
  uint64_t next_seq = 0;  // collectives issued (host side)
  bool joined = false;    // every rank's join file seen
  bool aborted = false;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
  std::vector<pid_t> pids;

  std::string File(const std::string& name) const { return dir + "/" + name; }
  // Collective `base` ("s<seq>"): rank r's deposit and its done marker.
  std::string Deposit(const std::string& base, int r) const { return File(base + ".r" + std::to_string(r)); }
  std::string Done(const std::string& base, int r) const { return File(base + ".d" + std::to_string(r)); }
  void Fail(ncclResult_t code, const std::string& why) {
    if (async_error == ncclSuccess || async_error == ncclInProgress) {
      async_error = code;
      last_error = why;
      std::fprintf(stderr, "dgca emulated NCCL (rank %d): %s\n", rank, why.c_str());
    }
  }
  bool broken() const { return aborted || (async_error != ncclSuccess && async_error != ncclInProgress); }
};

}  // namespace

// nccl.h's opaque communicator.
struct ncclComm {
  std::shared_ptr<CommState> state;
};

namespace {

std::string g_last_error;  // for ncclGetLastError(nullptr)

// An emulated unique id: this tag, then random bytes naming the transport.
constexpr char kIdTag[] = "dgca-emu-nccl";
constexpr size_t kIdTagLen = sizeof(kIdTag) - 1;
constexpr size_t kIdRandomBytes = 16;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string ErrnoText() { return std::strerror(errno); }

bool WriteAtomically(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  std::fclose(f);
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool ReadFile(const std::string& path, std::vector<char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

std::string Hex(const char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[(p[i] >> 4) & 15];
    s += digits[p[i] & 15];
  }
  return s;
}

// Rank r's pid from its join file; false while it has not joined.
bool ReadJoinPid(const CommState& st, int r, pid_t* pid) {
  std::vector<char> buf;
  if (!ReadFile(st.File("join." + std::to_string(r)), &buf)) return false;
  *pid = static_cast<pid_t>(std::atol(std::string(buf.begin(), buf.end()).c_str()));
  return true;
}

// Reads the peers' join files; true once all have joined.
bool CheckJoined(CommState* st) {
  if (st->joined) return true;
  std::vector<pid_t> pids(static_cast<size_t>(st->nranks), 0);
  for (int r = 0; r < st->nranks; ++r)
    if (!ReadJoinPid(*st, r, &pids[static_cast<size_t>(r)])) return false;
  st->pids = pids;
  st->joined = true;
  return true;
}

// True when process `pid` exited. (A zombie child still answers
// kill(pid, 0): read its state.)
bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// A peer that will never deposit for collective `seq`: its process is gone,
// or it left the communicator (ncclCommAbort/Destroy) while alive.
bool PeerGone(CommState* st, int peer, const std::string& base) {
  const pid_t pid = st->pids[static_cast<size_t>(peer)];
  std::string why;
  if (pid > 0 && ProcessGone(pid)) {
    why = "its process (pid " + std::to_string(pid) + ") exited";
  } else if (Exists(st->File("left." + std::to_string(peer)))) {
    why = "it destroyed or aborted its communicator";
  } else {
    return false;
  }
  // It may have deposited, finished and left since the caller looked (its
  // deposit stays until this rank is done with it).
  if (Exists(st->Deposit(base, peer))) return false;
  st->Fail(ncclRemoteError, "lost peer rank " + std::to_string(peer) + ": " + why +
                                " without issuing collective #" + base.substr(1) +
                                " (0-based); the communicator is broken");
  return true;
}

ncclResult_t Invalid(const std::string& why) {
  g_last_error = why;
  std::fprintf(stderr, "dgca emulated NCCL: %s\n", why.c_str());
  return ncclInvalidArgument;
}

const char* OpName(int32_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclAvg: return "avg";
    case ncclMax: return "max";
    default: return "?";
  }
}

ncclResult_t Enqueue(ncclComm_t comm, Kind kind, const void* send, void* recv, size_t count,
                     ncclDataType_t type, ncclRedOp_t op, int root, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(emu::internal::Lock());
  if (comm == nullptr || comm->state == nullptr) return Invalid("null communicator");
  std::shared_ptr<CommState> st = comm->state;
  if (st->broken()) return st->aborted ? ncclInvalidUsage : st->async_error;
  const char* name = kind == Kind::kAllReduce ? "ncclAllReduce" : "ncclBroadcast";
  if (type != ncclFloat) return Invalid(std::string(name) + ": only ncclFloat is emulated");
  if (kind == Kind::kAllReduce && op != ncclSum && op != ncclAvg && op != ncclMax)
    return Invalid(std::string(name) + ": only sum, avg and max are emulated");
  if (root < 0 || root >= st->nranks) return Invalid(std::string(name) + ": root " + std::to_string(root) + " out of range");
  const size_t bytes = count * sizeof(float);
  const bool sends = kind == Kind::kAllReduce || st->rank == root;
  if (count > 0) {
    if ((sends && !emu::FindAllocation(send, bytes, nullptr)) || !emu::FindAllocation(recv, bytes, nullptr)) {
      return Invalid(std::string(name) + ": the " + std::to_string(bytes) +
                     "-byte send/receive buffers must lie in device memory (a host pointer faults on a GPU)");
    }
  }
  const uint64_t seq = st->next_seq++;
  const std::string base = "s" + std::to_string(seq);
  const Header want{kMagic, static_cast<int32_t>(kind), static_cast<int32_t>(op), root, count};
  auto deposited = std::make_shared<bool>(false);
  // Every rank deposits its header (so ranks that disagree on the
  // collective are found, a broadcast too); the data comes from every rank
  // of an all-reduce and from a broadcast's root only.
  // As a real NCCL kernel: a failed collective (a lost peer, disagreeing
  // ranks) never completes; the failure shows in ncclCommGetAsyncError,
  // and ncclCommAbort releases it (the item then completes doing nothing).
  auto ready = [st, base, want, sends, send, bytes, deposited](std::string* failure) -> bool {
    if (st->aborted) return true;
    auto failed = [&] {
      *failure = st->last_error;
      return false;
    };
    if (st->broken()) return failed();
    const std::string mine = st->Deposit(base, st->rank);
    if (!*deposited) {
      *deposited = true;
      const size_t payload = sends ? bytes : 0;
      std::vector<char> buf(sizeof(Header) + payload);
      std::memcpy(buf.data(), &want, sizeof(Header));
      if (payload > 0) std::memcpy(buf.data() + sizeof(Header), send, payload);
      if (!WriteAtomically(mine, buf.data(), buf.size())) {
        st->Fail(ncclSystemError, "cannot write " + mine + ": " + ErrnoText());
        return failed();
      }
    }
    for (int r = 0; r < st->nranks; ++r) {
      const std::string path = st->Deposit(base, r);
      if (!Exists(path)) return PeerGone(st.get(), r, base) ? failed() : false;
      Header h;
      std::ifstream f(path, std::ios::binary);
      if (!f.read(reinterpret_cast<char*>(&h), sizeof(h))) {
        st->Fail(ncclSystemError, "cannot read " + path + ": " + ErrnoText());
        return failed();
      }
      if (h.magic != kMagic || h.kind != want.kind || h.op != want.op || h.root != want.root ||
          h.count != want.count) {
        auto describe = [](const Header& x) {
          return x.kind == static_cast<int32_t>(Kind::kAllReduce)
                     ? "a " + std::string(OpName(x.op)) + " all-reduce of " + std::to_string(x.count) + " floats"
                     : "a broadcast of " + std::to_string(x.count) + " floats from rank " + std::to_string(x.root);
        };
        st->Fail(ncclInvalidUsage, "ranks disagree on collective #" + base.substr(1) + " (0-based): rank " +
                                       std::to_string(st->rank) + " issued " + describe(want) + ", rank " +
                                       std::to_string(r) + " " + describe(h) +
                                       " (NCCL needs every rank to issue the same collectives in the same order)");
        return failed();
      }
    }
    return true;
  };
  auto work = [st, base, want, recv, bytes, count]() {
    if (st->broken()) return;
    const bool all = want.kind == static_cast<int32_t>(Kind::kAllReduce);
    std::vector<float> acc;
    for (int r = 0; r < st->nranks; ++r) {
      if (!all && r != want.root) continue;
      std::vector<char> buf;
      const std::string path = st->Deposit(base, r);
      if (!ReadFile(path, &buf) || buf.size() != sizeof(Header) + bytes) {
        st->Fail(ncclSystemError, "cannot read the " + std::to_string(bytes) + " bytes of " + path);
        return;
      }
      const float* v = reinterpret_cast<const float*>(buf.data() + sizeof(Header));
      if (acc.empty()) {
        acc.assign(v, v + count);
      } else if (want.op == ncclMax) {
        for (size_t i = 0; i < count; ++i) acc[i] = acc[i] < v[i] ? v[i] : acc[i];
      } else {
        for (size_t i = 0; i < count; ++i) acc[i] += v[i];
      }
    }
    // Sum in rank order, then divide: every rank gets bitwise the same
    // result (real NCCL's ring order and its pre-scaling for ncclAvg round
    // differently; no test compares against NCCL bits).
    if (all && want.op == ncclAvg)
      for (float& x : acc) x /= static_cast<float>(st->nranks);
    if (bytes > 0) std::memcpy(recv, acc.data(), bytes);
    WriteAtomically(st->Done(base, st->rank), "1", 1);
    // The last rank out removes the step's files.
    for (int r = 0; r < st->nranks; ++r)
      if (!Exists(st->Done(base, r))) return;
    for (int r = 0; r < st->nranks; ++r) {
      std::remove(st->Deposit(base, r).c_str());
      std::remove(st->Done(base, r).c_str());
    }
  };
  const std::string what = std::string(name) + " #" + std::to_string(seq) + " of " + std::to_string(count) +
                           " floats (rank " + std::to_string(st->rank) + " of " + std::to_string(st->nranks) + ")";
  if (emu::EnqueueWhenReady(stream, what, ready, work) != cudaSuccess) {
    st->Fail(ncclUnhandledCudaError, "enqueueing " + what + " failed");
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

}  // namespace

// ====================================================================== API
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code (emulated NCCL)";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && comm->state != nullptr && !comm->state->last_error.empty())
    return comm->state->last_error.c_str();
  return g_last_error.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::random_device rd;
  std::memcpy(id->internal, kIdTag, kIdTagLen);
  for (size_t i = kIdTagLen; i < kIdTagLen + kIdRandomBytes; ++i) id->internal[i] = static_cast<char>(rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  *comm = nullptr;
  const std::string dir = emu::NcclTransportDir(&id);
  if (dir.empty()) return Invalid("ncclCommInitRankConfig: the unique id was not made by the emulated ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return Invalid("ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto st = std::make_shared<CommState>();
  st->dir = dir;
  st->rank = rank;
  st->nranks = nranks;
  mkdir(st->dir.c_str(), 0700);
  const std::string pid = std::to_string(getpid());
  if (!WriteAtomically(st->File("join." + std::to_string(rank)), pid.data(), pid.size()))
    return Invalid("ncclCommInitRankConfig: cannot write under " + st->dir + ": " + ErrnoText());
  *comm = new ncclComm{st};
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return CheckJoined(st.get()) ? ncclSuccess : ncclInProgress;
  while (!CheckJoined(st.get())) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  std::lock_guard<std::recursive_mutex> lock(emu::internal::Lock());
  if (comm == nullptr || comm->state == nullptr) return Invalid("ncclCommGetAsyncError: null communicator");
  CommState* st = comm->state.get();
  if (!st->joined) {
    *async_error = CheckJoined(st) ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
  }
  *async_error = st->async_error;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return Enqueue(comm, Kind::kAllReduce, send, recv, count, type, op, 0, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return Enqueue(comm, Kind::kBroadcast, send, recv, count, type, ncclSum, root, stream);
}

namespace {

// Leaving: this rank's left.<rank>. The last rank out removes the
// directory and whatever is in it (deposits of a collective that never
// completed too); a peer counts as out once it left, if it never joined, or
// if its process is gone (a killed rank never writes left.<rank>, and
// /dev/shm must not fill with dead communicators). Join files stay until
// then: a slow peer may still be reading them.
bool PeerOut(const CommState& st, int r) {
  if (Exists(st.File("left." + std::to_string(r)))) return true;
  pid_t pid = 0;
  return !ReadJoinPid(st, r, &pid) || pid <= 0 || ProcessGone(pid);
}

void RemoveDirectory(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str()); d != nullptr) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") std::remove((dir + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

}  // namespace

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  // DGCA_EMU_NCCL_ABORT_HANG_MS: the abort takes this long first (real
  // NCCL's has been seen to hang joining its proxy thread), outside the
  // runtime lock, so the caller's bound on it can be tested.
  if (const char* h = std::getenv("DGCA_EMU_NCCL_ABORT_HANG_MS"); h != nullptr && std::atoi(h) > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(h)));
  std::lock_guard<std::recursive_mutex> lock(emu::internal::Lock());
  if (std::shared_ptr<CommState> st = comm->state; st != nullptr) {
    st->aborted = true;  // queued items complete doing nothing
    WriteAtomically(st->File("left." + std::to_string(st->rank)), "1", 1);
    bool all_out = true;
    for (int r = 0; r < st->nranks && all_out; ++r) all_out = r == st->rank || PeerOut(*st, r);
    if (all_out) RemoveDirectory(st->dir);
  }
  delete comm;
  return ncclSuccess;
}

// Nothing of a collective is left to flush once its stream work ran (the
// caller synchronized): finalize has nothing to do; destroy leaves.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return Invalid("ncclCommFinalize: null communicator");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclCommAbort(comm); }

namespace dgca {
namespace cuda {
namespace emu {

std::string NcclTransportDir(const void* unique_id) {
  const char* id = static_cast<const char*>(unique_id);
  if (std::memcmp(id, kIdTag, kIdTagLen) != 0) return "";
  return "/dev/shm/" + std::string(kIdTag) + "-" + Hex(id + kIdTagLen, kIdRandomBytes);
}

}  // namespace emu
}  // namespace cuda
}  // namespace dgca
