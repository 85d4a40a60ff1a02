// The emulator's memory (emulator.h): one mapping per allocation with
// inaccessible pages before and after it, poisoned contents, device memory
// inaccessible to host code outside device work, freed ranges kept
// inaccessible, and a fault handler that names what was hit.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>

#include "model/cuda_emu/internal.h"

namespace dgca {
namespace cuda {
namespace emu {
namespace internal {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's guaranteed alignment
// Freed mappings stay reserved (inaccessible) until this many are kept.
constexpr size_t kMaxFreedMappings = 16384;

struct Mapping {
  uintptr_t map_begin = 0;
  size_t map_len = 0;
  uintptr_t begin = 0;   // the user pointer
  size_t size = 0;       // bytes asked for
  size_t usable = 0;     // size rounded up to kAlign: [begin, begin + usable) is readable
  MemKind kind = MemKind::kDevice;
  bool live = true;
};

size_t Page() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
size_t RoundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Keyed by map_begin; live and freed mappings.
std::map<uintptr_t, Mapping>& Mappings() {
  static auto* m = new std::map<uintptr_t, Mapping>;
  return *m;
}
// The live device mappings (values of Mappings(), whose nodes never move):
// what DeviceAccessScope opens and closes, without walking the freed ones.
std::set<Mapping*>& LiveDevice() {
  static auto* s = new std::set<Mapping*>;
  return *s;
}
std::deque<uintptr_t>& FreedOrder() {
  static auto* d = new std::deque<uintptr_t>;
  return *d;
}
size_t g_in_use[2] = {0, 0};
int g_access_depth = 0;

bool ProtectDevice() {
  static const bool on = [] {
    const char* e = std::getenv("DGCA_EMU_PROTECT");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

// The accessible pages of a live mapping: from the page holding `begin`
// to the end of the data pages.
void SetAccess(const Mapping& m, int prot) {
  const uintptr_t lo = m.begin / Page() * Page();
  const uintptr_t hi = m.begin + m.usable;
  mprotect(reinterpret_cast<void*>(lo), hi - lo, prot);
}

const Mapping* FindMapping(uintptr_t a) {
  auto& maps = Mappings();
  auto it = maps.upper_bound(a);
  if (it == maps.begin()) return nullptr;
  --it;
  const Mapping& m = it->second;
  if (a >= m.map_begin + m.map_len) return nullptr;
  return &m;
}

const char* KindName(MemKind k) { return k == MemKind::kDevice ? "device" : "pinned host"; }

char g_work[512];
struct sigaction g_old_segv, g_old_bus;

void Describe(uintptr_t a, char* out, size_t n) {
  const Mapping* m = FindMapping(a);
  if (m == nullptr) {
    std::snprintf(out, n, "address 0x%" PRIxPTR " is not in any emulated allocation", a);
    return;
  }
  if (!m->live) {
    std::snprintf(out, n,
                  "address 0x%" PRIxPTR " is inside a FREED %s allocation of %zu bytes at 0x%" PRIxPTR
                  " (offset %" PRIdPTR "): use after free",
                  a, KindName(m->kind), m->size, m->begin, intptr_t(a - m->begin));
  } else if (a >= m->begin + m->usable) {
    std::snprintf(out, n,
                  "address 0x%" PRIxPTR " is %" PRIuPTR " bytes past the end of a %s allocation of %zu bytes at 0x%" PRIxPTR,
                  a, uintptr_t(a - (m->begin + m->size)), KindName(m->kind), m->size, m->begin);
  } else if (a < m->begin) {
    std::snprintf(out, n,
                  "address 0x%" PRIxPTR " is %" PRIuPTR " bytes before the start of a %s allocation of %zu bytes at 0x%" PRIxPTR,
                  a, uintptr_t(m->begin - a), KindName(m->kind), m->size, m->begin);
  } else {
    std::snprintf(out, n,
                  "address 0x%" PRIxPTR " is device memory (offset %" PRIuPTR " of an allocation of %zu bytes) "
                  "touched by HOST code: on a GPU this pointer is not dereferenceable on the host",
                  a, uintptr_t(a - m->begin), m->size);
  }
}

void FaultHandler(int sig, siginfo_t* info, void*) {
  char what[768];
  Describe(reinterpret_cast<uintptr_t>(info->si_addr), what, sizeof(what));
  const char* work = g_work[0] != '\0' ? g_work : "host code (no device work running)";
  const char* thread = CurrentThreadDescription();
  char msg[2048];
  const int len = std::snprintf(msg, sizeof(msg), "\ndgca CUDA emulator: %s while running %s%s%s: %s\n",
                                sig == SIGBUS ? "SIGBUS" : "SIGSEGV", work, thread[0] ? ", " : "", thread, what);
  if (len > 0) {
    ssize_t ignored = write(2, msg, size_t(len) < sizeof(msg) ? size_t(len) : sizeof(msg) - 1);
    (void)ignored;
  }
  // Back to the previous disposition; the faulting access repeats and the
  // process dies the usual way (core, exit status 139).
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  sigaction(SIGBUS, &g_old_bus, nullptr);
}

}  // namespace

// Byte i of the poison pattern: 0x7FC0 little-endian.
unsigned char PoisonByte(size_t i) { return (i & 1) ? 0x7F : 0xC0; }

void FillPoison(void* p, size_t bytes) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) b[i] = PoisonByte(i);
}

void* Allocate(size_t bytes, MemKind kind) {
  InstallFaultHandler();
  const size_t page = Page();
  const size_t usable = RoundUp(bytes == 0 ? 1 : bytes, kAlign);
  const size_t data_len = RoundUp(usable, page);
  const size_t map_len = data_len + 2 * page;
  void* base = mmap(nullptr, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  Mapping m;
  m.map_begin = reinterpret_cast<uintptr_t>(base);
  m.map_len = map_len;
  // The allocation ends where the trailing inaccessible page starts.
  m.begin = m.map_begin + page + data_len - usable;
  m.size = bytes;
  m.usable = usable;
  m.kind = kind;
  SetAccess(m, PROT_READ | PROT_WRITE);
  FillPoison(reinterpret_cast<void*>(m.begin), usable);
  if (kind == MemKind::kDevice && ProtectDevice() && g_access_depth == 0) SetAccess(m, PROT_NONE);
  Mapping& stored = Mappings()[m.map_begin] = m;
  if (kind == MemKind::kDevice) LiveDevice().insert(&stored);
  g_in_use[int(kind)] += bytes;
  return reinterpret_cast<void*>(m.begin);
}

bool Free(void* p, MemKind kind, std::string* overrun) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& maps = Mappings();
  const Mapping* found = FindMapping(a);
  if (found == nullptr || !found->live || found->begin != a || found->kind != kind) return false;
  Mapping& m = maps[found->map_begin];
  // The bytes between the requested size and the 256-byte rounding are not
  // guarded by a page: check that nobody wrote them.
  SetAccess(m, PROT_READ | PROT_WRITE);
  const auto* tail = reinterpret_cast<const unsigned char*>(m.begin);
  for (size_t i = m.size; i < m.usable; ++i) {
    if (tail[i] != PoisonByte(i)) {
      if (overrun != nullptr) {
        *overrun = "bytes after the end of a " + std::string(KindName(kind)) + " allocation of " +
                   std::to_string(m.size) + " bytes were written (first at offset " + std::to_string(i) + ")";
      }
      break;
    }
  }
  mprotect(reinterpret_cast<void*>(m.map_begin), m.map_len, PROT_NONE);
  madvise(reinterpret_cast<void*>(m.map_begin), m.map_len, MADV_DONTNEED);
  m.live = false;
  LiveDevice().erase(&m);
  g_in_use[int(kind)] -= m.size;
  FreedOrder().push_back(m.map_begin);
  while (FreedOrder().size() > kMaxFreedMappings) {
    auto old = maps.find(FreedOrder().front());
    FreedOrder().pop_front();
    if (old != maps.end()) {
      munmap(reinterpret_cast<void*>(old->second.map_begin), old->second.map_len);
      maps.erase(old);
    }
  }
  return true;
}

size_t BytesInUse(MemKind kind) { return g_in_use[int(kind)]; }

DeviceAccessScope::DeviceAccessScope() {
  if (g_access_depth++ == 0 && ProtectDevice()) {
    for (Mapping* m : LiveDevice()) SetAccess(*m, PROT_READ | PROT_WRITE);
  }
}
DeviceAccessScope::~DeviceAccessScope() {
  if (--g_access_depth == 0 && ProtectDevice()) {
    for (Mapping* m : LiveDevice()) SetAccess(*m, PROT_NONE);
  }
}

void InstallFaultHandler() {
  static bool installed = [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = FaultHandler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
    return true;
  }();
  (void)installed;
}

void EnsureSignalStack() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  const size_t bytes = 256 << 10;
  void* s = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) return;
  stack_t st;
  st.ss_sp = s;
  st.ss_size = bytes;
  st.ss_flags = 0;
  sigaltstack(&st, nullptr);
}

void SetCurrentWork(const std::string& what) {
  std::snprintf(g_work, sizeof(g_work), "%s", what.c_str());
}

}  // namespace internal

bool FindAllocation(const void* p, size_t bytes, AllocationInfo* info) {
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const internal::Mapping* m = internal::FindMapping(a);
  if (m == nullptr || !m->live || a < m->begin || a + bytes > m->begin + m->size) return false;
  if (info != nullptr) {
    info->begin = m->begin;
    info->size = m->size;
    info->kind = m->kind;
  }
  return true;
}

bool DeviceAccessible(const void* p) {
  if (p == nullptr) return true;
  std::lock_guard<std::recursive_mutex> lock(internal::Lock());
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const internal::Mapping* m = internal::FindMapping(a);
  // One past the end is a valid pointer value (an empty range).
  return m != nullptr && m->live && a >= m->begin && a <= m->begin + m->size;
}

}  // namespace emu
}  // namespace cuda
}  // namespace dgca
