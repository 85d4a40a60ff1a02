// The emulator's kernel execution (emulator.h): blocks one after another on
// the calling host thread, every CUDA thread of a block a fiber that runs
// until it reaches a barrier or a warp collective; the scheduler releases a
// barrier when every live thread of the block waits at one, a warp
// collective when every lane of its mask waits at it. Anything else that
// leaves all threads waiting is a deadlock, reported as a device fault.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "model/cuda_emu/internal.h"

// Static __shared__ variables live in this section (device.h); the linker
// defines its bounds when any exist.
extern "C" char __start_dgca_emu_shared[] __attribute__((weak));
extern "C" char __stop_dgca_emu_shared[] __attribute__((weak));

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the
// current stack, stores the stack pointer in *save, switches to `to` and
// restores the same from there. A new fiber's stack is laid out so that the
// first switch "returns" into FiberMain.
extern "C" void dgca_emu_switch(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .globl dgca_emu_switch
    .type dgca_emu_switch, @function
dgca_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size dgca_emu_switch, .-dgca_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {
namespace {

enum class State { kReady, kBarrier, kWarp, kDone };

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

struct Fiber {
  Context ctx;
  char* stack_top = nullptr;
  State state = State::kReady;
  ThreadCoords coords;
  // Where it waits.
  const char* file = "";
  int line = 0;
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  uint64_t result = 0;
};

struct Run {
  const LaunchConfig* config = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber>* fibers = nullptr;
  Context sched;
  void* dynamic_shared = nullptr;
  std::string fault;
};

thread_local Run* g_run = nullptr;
thread_local Fiber* g_fiber = nullptr;
thread_local char g_thread_desc[160];

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kSync: return "__syncwarp";
    case WarpOp::kShflIdx: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kBallot: return "__ballot_sync";
  }
  return "?";
}

std::string Dim(const uint3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string Dim(const dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

void SwitchTo(Context* from, Context* to) {
#if defined(__x86_64__)
  dgca_emu_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

[[noreturn]] void FiberMain() {
  Fiber* f = g_fiber;
  (*g_run->body)();
  f->state = State::kDone;
  SwitchTo(&f->ctx, &g_run->sched);
  std::abort();  // a finished fiber is never resumed
}

void MakeFiber(Fiber* f) {
#if defined(__x86_64__)
  // From the (16-aligned) top down: 8 spare bytes, the return address
  // (FiberMain; at a 16-aligned slot so FiberMain starts as if called),
  // rbp, rbx, r12..r15, then MXCSR/FCW.
  auto* top = reinterpret_cast<uint64_t*>(f->stack_top);
  top[-2] = reinterpret_cast<uint64_t>(&FiberMain);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  uint32_t csr[2];
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  uint16_t cw;
  asm volatile("fnstcw %0" : "=m"(cw));
  csr[1] = cw;
  std::memcpy(&top[-9], csr, 8);
  f->ctx.sp = &top[-9];
#else
  getcontext(&f->ctx.uc);
  f->ctx.uc.uc_stack.ss_sp = f->stack_top - kFiberStackBytes;
  f->ctx.uc.uc_stack.ss_size = kFiberStackBytes;
  f->ctx.uc.uc_link = nullptr;
  makecontext(&f->ctx.uc, reinterpret_cast<void (*)()>(&FiberMain), 0);
#endif
}

// Fiber stacks, reused by every block: kFiberStackBytes each with an
// inaccessible page below (a stack overflow faults instead of corrupting a
// neighbour).
char* StackTop(size_t i) {
  static std::vector<char*>* stacks = new std::vector<char*>;
  while (stacks->size() <= i) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, kFiberStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "dgca CUDA emulator: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(m, page, PROT_NONE);
    stacks->push_back(static_cast<char*>(m) + page + kFiberStackBytes);
  }
  return (*stacks)[i];
}

enum class Order { kForward, kReverse, kAlternate };
Order ScheduleOrder() {
  static const Order order = [] {
    const char* e = std::getenv("DGCA_EMU_ORDER");
    if (e == nullptr || std::strcmp(e, "forward") == 0) return Order::kForward;
    if (std::strcmp(e, "reverse") == 0) return Order::kReverse;
    if (std::strcmp(e, "alternate") == 0) return Order::kAlternate;
    std::fprintf(stderr, "dgca CUDA emulator: DGCA_EMU_ORDER=%s is not forward, reverse or alternate; using forward\n", e);
    return Order::kForward;
  }();
  return order;
}

std::string Where(const Fiber& f) {
  std::string s = "thread " + Dim(f.coords.thread_idx);
  if (f.state == State::kBarrier) s += " at __syncthreads (" + std::string(f.file) + ":" + std::to_string(f.line) + ")";
  if (f.state == State::kWarp) {
    char m[16];
    std::snprintf(m, sizeof(m), "%08x", f.mask);
    s += std::string(" at ") + OpName(f.op) + " mask 0x" + m;
  }
  if (f.state == State::kDone) s += " exited";
  return s;
}

// Resolves every warp collective whose lanes have all arrived. Returns
// whether any was released; sets run->fault on a misuse.
bool ResolveWarps(Run* run) {
  std::vector<Fiber>& fs = *run->fibers;
  const int n = static_cast<int>(fs.size());
  bool released = false;
  for (int w = 0; w * 32 < n; ++w) {
    unsigned handled = 0;
    for (int lane = 0; lane < 32 && w * 32 + lane < n; ++lane) {
      const Fiber& f = fs[w * 32 + lane];
      if (f.state != State::kWarp || (handled >> lane & 1u)) continue;
      const unsigned mask = f.mask;
      if (!(mask >> lane & 1u)) {
        run->fault = Where(f) + ": the calling lane " + std::to_string(lane) + " is not in its own mask";
        return false;
      }
      if (f.width < 1 || f.width > 32 || (f.width & (f.width - 1)) != 0) {
        run->fault = Where(f) + ": width " + std::to_string(f.width) + " is not a power of two in [1, 32]";
        return false;
      }
      bool ready = true;
      for (int b = 0; b < 32; ++b) {
        if (!(mask >> b & 1u)) continue;
        const int idx = w * 32 + b;
        if (idx >= n) {
          run->fault = Where(f) + ": the mask names lane " + std::to_string(b) + " of warp " + std::to_string(w) +
                       ", which does not exist (the block has " + std::to_string(n) + " threads)";
          return false;
        }
        const Fiber& g = fs[idx];
        if (g.state == State::kDone) {
          run->fault = Where(f) + ": the mask names lane " + std::to_string(b) +
                       ", which has exited (undefined on a GPU)";
          return false;
        }
        if (g.state != State::kWarp) {
          ready = false;
          continue;
        }
        if (g.mask != mask || g.op != f.op) {
          run->fault = "lanes of warp " + std::to_string(w) + " disagree: " + Where(f) + ", " + Where(g);
          return false;
        }
      }
      handled |= mask;
      if (!ready) continue;
      // Every lane of the mask is here: compute each lane's result.
      uint64_t any = 0, all = 1, ballot = 0;
      for (int b = 0; b < 32; ++b) {
        if (!(mask >> b & 1u)) continue;
        const uint64_t v = fs[w * 32 + b].value;
        any |= (v != 0);
        all &= (v != 0);
        if (v != 0) ballot |= 1ull << b;
      }
      for (int b = 0; b < 32; ++b) {
        if (!(mask >> b & 1u)) continue;
        Fiber& g = fs[w * 32 + b];
        const int seg = b & ~(g.width - 1);
        int src = b;
        switch (g.op) {
          case WarpOp::kSync: break;
          case WarpOp::kAny: g.result = any; break;
          case WarpOp::kAll: g.result = all; break;
          case WarpOp::kBallot: g.result = ballot; break;
          case WarpOp::kShflIdx: src = seg + (g.arg & (g.width - 1)); break;
          case WarpOp::kShflUp: src = b - g.arg < seg ? b : b - g.arg; break;
          case WarpOp::kShflDown: src = b + g.arg >= seg + g.width ? b : b + g.arg; break;
          case WarpOp::kShflXor: src = (b ^ g.arg) >= seg + g.width ? b : (b ^ g.arg); break;
        }
        if (g.op == WarpOp::kShflIdx || g.op == WarpOp::kShflUp || g.op == WarpOp::kShflDown ||
            g.op == WarpOp::kShflXor) {
          if (src < 0 || src >= 32 || !(mask >> src & 1u)) {
            run->fault = Where(g) + ": reads lane " + std::to_string(src) +
                         ", which is not in the mask (undefined on a GPU)";
            return false;
          }
          g.result = fs[w * 32 + src].value;
        }
      }
      for (int b = 0; b < 32; ++b)
        if (mask >> b & 1u) fs[w * 32 + b].state = State::kReady;
      released = true;
    }
  }
  return released;
}

// Runs one block; false (run->fault set) on a device fault.
bool RunBlock(Run* run, const uint3& block_idx) {
  const LaunchConfig& c = *run->config;
  std::vector<Fiber>& fs = *run->fibers;
  const int n = static_cast<int>(c.block.x * c.block.y * c.block.z);
  // Shared memory is undefined at block start: poison it.
  if (__start_dgca_emu_shared != nullptr && __stop_dgca_emu_shared > __start_dgca_emu_shared)
    FillPoison(__start_dgca_emu_shared, size_t(__stop_dgca_emu_shared - __start_dgca_emu_shared));
  if (run->dynamic_shared != nullptr) FillPoison(run->dynamic_shared, c.dynamic_shared_bytes);
  for (int i = 0; i < n; ++i) {
    Fiber& f = fs[i];
    f.state = State::kReady;
    f.coords.thread_idx = make_uint3(i % c.block.x, (i / c.block.x) % c.block.y, i / (c.block.x * c.block.y));
    f.coords.block_idx = block_idx;
    f.coords.block_dim = c.block;
    f.coords.grid_dim = c.grid;
    f.stack_top = StackTop(i);
    MakeFiber(&f);
  }
  const Order order = ScheduleOrder();
  int round = 0;
  for (;;) {
    const bool reverse = order == Order::kReverse || (order == Order::kAlternate && (round & 1));
    ++round;
    for (int k = 0; k < n; ++k) {
      Fiber& f = fs[reverse ? n - 1 - k : k];
      if (f.state != State::kReady) continue;
      g_fiber = &f;
      SwitchTo(&run->sched, &f.ctx);
      g_fiber = nullptr;
    }
    int done = 0, at_barrier = 0;
    for (const Fiber& f : fs) {
      if (f.state == State::kDone) ++done;
      if (f.state == State::kBarrier) ++at_barrier;
    }
    if (done == n) return true;
    if (ResolveWarps(run)) continue;
    if (!run->fault.empty()) return false;
    if (at_barrier == n - done) {  // exited threads count as arrived
      for (Fiber& f : fs)
        if (f.state == State::kBarrier) f.state = State::kReady;
      continue;
    }
    std::string waits;
    int shown = 0;
    for (const Fiber& f : fs) {
      if (f.state == State::kDone || shown == 6) continue;
      waits += (shown++ ? "; " : "") + Where(f);
    }
    run->fault = "deadlock: " + std::to_string(n - done) + " of " + std::to_string(n) +
                 " threads wait and none can proceed (" + std::to_string(at_barrier) +
                 " at __syncthreads, the rest at warp collectives): " + waits;
    return false;
  }
}

}  // namespace

void RunGrid(const LaunchConfig& c, const std::function<void()>& body) {
  EnsureSignalStack();
  const size_t n = size_t(c.block.x) * c.block.y * c.block.z;
  std::vector<Fiber> fibers(n);
  Run run;
  run.config = &c;
  run.body = &body;
  run.fibers = &fibers;
  if (c.dynamic_shared_bytes > 0) {
    run.dynamic_shared = Allocate(c.dynamic_shared_bytes, MemKind::kPinnedHost);
  }
  Run* saved = g_run;
  g_run = &run;
  for (unsigned z = 0; z < c.grid.z && run.fault.empty(); ++z)
    for (unsigned y = 0; y < c.grid.y && run.fault.empty(); ++y)
      for (unsigned x = 0; x < c.grid.x && run.fault.empty(); ++x) {
        const uint3 b = make_uint3(x, y, z);
        if (!RunBlock(&run, b)) run.fault = "block " + Dim(b) + ": " + run.fault;
      }
  g_run = saved;
  if (run.dynamic_shared != nullptr) {
    std::string overrun;
    Free(run.dynamic_shared, MemKind::kPinnedHost, &overrun);
    if (!overrun.empty() && run.fault.empty()) run.fault = "dynamic shared memory: " + overrun;
  }
  if (!run.fault.empty()) {
    DeviceFault(cudaErrorLaunchFailure, std::string("kernel launched at ") + c.site.file + ":" +
                                            std::to_string(c.site.line) + " (grid " + Dim(c.grid) + ", block " +
                                            Dim(c.block) + "): " + run.fault);
  }
}

const char* CurrentThreadDescription() {
  if (g_fiber == nullptr || g_run == nullptr) return "";
  const ThreadCoords& t = g_fiber->coords;
  std::snprintf(g_thread_desc, sizeof(g_thread_desc), "block (%u,%u,%u) thread (%u,%u,%u)", t.block_idx.x,
                t.block_idx.y, t.block_idx.z, t.thread_idx.x, t.thread_idx.y, t.thread_idx.z);
  return g_thread_desc;
}

}  // namespace internal

const ThreadCoords& Coords() {
  if (internal::g_fiber == nullptr) {
    std::fprintf(stderr, "dgca CUDA emulator: threadIdx/blockIdx read outside a kernel\n");
    std::abort();
  }
  return internal::g_fiber->coords;
}

void SyncThreads(const char* file, int line) {
  internal::Fiber* f = internal::g_fiber;
  if (f == nullptr) {
    std::fprintf(stderr, "dgca CUDA emulator: __syncthreads outside a kernel (%s:%d)\n", file, line);
    std::abort();
  }
  f->state = internal::State::kBarrier;
  f->file = file;
  f->line = line;
  internal::SwitchTo(&f->ctx, &internal::g_run->sched);
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  internal::Fiber* f = internal::g_fiber;
  if (f == nullptr) {
    std::fprintf(stderr, "dgca CUDA emulator: warp intrinsic outside a kernel\n");
    std::abort();
  }
  f->state = internal::State::kWarp;
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->arg = arg;
  f->width = width;
  f->file = file;
  f->line = line;
  internal::SwitchTo(&f->ctx, &internal::g_run->sched);
  return f->result;
}

void* DynamicSharedMemory() {
  if (internal::g_run == nullptr || internal::g_run->dynamic_shared == nullptr) {
    std::fprintf(stderr, "dgca CUDA emulator: extern __shared__ used by a kernel launched without dynamic shared memory\n");
    std::abort();
  }
  return internal::g_run->dynamic_shared;
}

cudaError_t LaunchKernel(const LaunchConfig& c, const std::vector<std::pair<int, const void*>>& pointer_args,
                         std::function<void()> body) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  const std::string site = std::string(c.site.file) + ":" + std::to_string(c.site.line);
  const std::string what = "kernel launched at " + site + " (grid " + internal::Dim(c.grid) + ", block " +
                           internal::Dim(c.block) + ")";
  const uint64_t threads = uint64_t(c.block.x) * c.block.y * c.block.z;
  std::string bad;
  if (c.block.x == 0 || c.block.y == 0 || c.block.z == 0 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0)
    bad = "a grid or block dimension is 0";
  else if (threads > 1024 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64)
    bad = "block of " + std::to_string(threads) + " threads (at most 1024; z at most 64)";
  else if (c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535)
    bad = "grid y and z must be at most 65535, x at most 2^31-1";
  else if (c.dynamic_shared_bytes > 48 * 1024)
    bad = std::to_string(c.dynamic_shared_bytes) + " bytes of dynamic shared memory (at most 49152 without cudaFuncSetAttribute)";
  if (!bad.empty()) return ApiError(cudaErrorInvalidConfiguration, what + ": invalid configuration: " + bad);
  for (const auto& [index, p] : pointer_args) {
    if (!DeviceAccessible(p)) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%p", p);
      DeviceFault(cudaErrorIllegalAddress, what + ": argument " + std::to_string(index) + " (" + buf +
                                               ") is neither device nor pinned host memory: the kernel would fault on a GPU");
      return cudaErrorIllegalAddress;
    }
  }
  return Enqueue(c.stream, what, [c, body = std::move(body)] { internal::RunGrid(c, body); });
}

}  // namespace emu
}  // namespace cuda
}  // namespace dgca
