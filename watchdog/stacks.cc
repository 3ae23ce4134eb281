// Capture half of watchdog/stacks.h: the signal handler, the request handshake, the module
// snapshot that libunwind reads instead of calling dl_iterate_phdr, and /proc hints.
//
// Rules for everything reachable from onSignal(): no lock, no allocation, no stdio, no loader
// call, errno preserved, bounded work. The only shared state it touches is atomics and
// preallocated static buffers.
#include "watchdog/stacks.h"

#include "watchdog/loaded_modules.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <libunwind.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace ncclwatch::watchdog {
namespace {

// ---------------------------------------------------------------------------------------------
// Module snapshot. LLVM libunwind finds a pc's .eh_frame_hdr through dl_iterate_phdr, which
// takes the loader's write lock; a thread interrupted inside dlopen/dlclose would deadlock in
// its own handler. The build renames libunwind's reference to
// ncclwatch_unwind_dl_iterate_phdr (objcopy --redefine-sym, see watchdog/CMakeLists.txt), and
// that function walks a copy of the module list taken by the watchdog before it signals.
// Two snapshots: the watchdog rewrites only the one no handler reads.

constexpr int kMaxModules = 1024;
constexpr int kMaxPhdrs = 16384;

struct ModuleEntry {
  ElfW(Addr) bias;
  uint32_t firstPhdr;
  uint32_t phnum;
  uintptr_t probe;     // an address inside the module's first PT_LOAD
  uintptr_t mapStart;  // _dl_find_object(probe)->dlfo_map_start at snapshot time; 0: unknown
};

struct ModuleSnapshot {
  std::atomic<int> readers{0};
  int count = 0;
  uint32_t phdrCount = 0;
  ModuleEntry modules[kMaxModules];
  ElfW(Phdr) phdrs[kMaxPhdrs];
};

ModuleSnapshot g_snapshots[2];
std::atomic<int> g_currentSnapshot{0};

bool addModule(ModuleSnapshot& snapshot, uintptr_t bias, const ElfW(Phdr) * phdrs, int phnum) {
  if (phnum <= 0 || snapshot.count >= kMaxModules ||
      snapshot.phdrCount + static_cast<uint32_t>(phnum) > static_cast<uint32_t>(kMaxPhdrs)) {
    return false;
  }
  ModuleEntry& entry = snapshot.modules[snapshot.count];
  entry.bias = bias;
  entry.firstPhdr = snapshot.phdrCount;
  entry.phnum = static_cast<uint32_t>(phnum);
  entry.probe = 0;
  for (int i = 0; i < phnum; ++i) {
    snapshot.phdrs[snapshot.phdrCount + i] = phdrs[i];
    if (entry.probe == 0 && phdrs[i].p_type == PT_LOAD && phdrs[i].p_memsz > 0) {
      entry.probe = bias + phdrs[i].p_vaddr;
    }
  }
  entry.mapStart = entry.probe != 0 ? loadedMapStart(entry.probe) : 0;
  snapshot.phdrCount += static_cast<uint32_t>(phnum);
  ++snapshot.count;
  return true;
}

bool addListedModule(const LoadedModuleView& module, void* data) {
  addModule(*static_cast<ModuleSnapshot*>(data), module.bias, module.phdrs, module.phnum);
  return true;
}

int addIteratedModule(dl_phdr_info* info, size_t, void* data) {
  addModule(*static_cast<ModuleSnapshot*>(data), info->dlpi_addr, info->dlpi_phdr,
            info->dlpi_phnum);
  return 0;
}

// Watchdog side; the caller holds g_lock. False when a (stuck) handler still reads the spare.
bool refreshSnapshot() {
  const int current = g_currentSnapshot.load();
  ModuleSnapshot& spare = g_snapshots[1 - current];
  if (spare.readers.load() != 0) return false;
  spare.count = 0;
  spare.phdrCount = 0;
  // Lock-free listing first; dl_iterate_phdr (the loader's lock) only where it is unavailable.
  if (!forEachLoadedModule(addListedModule, &spare)) {
    spare.count = 0;
    spare.phdrCount = 0;
    dl_iterate_phdr(addIteratedModule, &spare);
  }
  g_currentSnapshot.store(1 - current);
  return true;
}

ModuleSnapshot* pinSnapshot() {
  for (;;) {
    const int index = g_currentSnapshot.load();
    ModuleSnapshot* snapshot = &g_snapshots[index];
    snapshot->readers.fetch_add(1);
    if (g_currentSnapshot.load() == index) return snapshot;
    snapshot->readers.fetch_sub(1);
  }
}

}  // namespace
}  // namespace ncclwatch::watchdog

// Called by libunwind (and only by it) in place of dl_iterate_phdr. Async-signal-safe.
extern "C" __attribute__((visibility("hidden"))) int ncclwatch_unwind_dl_iterate_phdr(
    int (*callback)(dl_phdr_info*, size_t, void*), void* data) {
  using namespace ncclwatch::watchdog;
  ModuleSnapshot* snapshot = pinSnapshot();
  int result = 0;
  for (int i = 0; i < snapshot->count && result == 0; ++i) {
    const ModuleEntry& entry = snapshot->modules[i];
    // Skip a module unloaded (or replaced) since the snapshot: its headers are gone.
    if (entry.mapStart != 0 && loadedMapStart(entry.probe) != entry.mapStart) continue;
    dl_phdr_info info;
    std::memset(&info, 0, sizeof(info));
    info.dlpi_addr = entry.bias;
    info.dlpi_name = "";
    info.dlpi_phdr = &snapshot->phdrs[entry.firstPhdr];
    info.dlpi_phnum = static_cast<ElfW(Half)>(entry.phnum);
    result = callback(&info, sizeof(info), data);
  }
  snapshot->readers.fetch_sub(1);
  return result;
}

namespace ncclwatch::watchdog {
namespace {

// ---------------------------------------------------------------------------------------------
// Request handshake. One request at a time (captures are serialized by g_lock). The word holds
// a generation and a state; the handler claims it with a CAS, so a late answer to a request
// the watchdog gave up on can never write into the buffer of a newer one.

enum State : uint32_t {
  kIdle = 0,
  kRequested = 1,
  kRunning = 2,
  kDone = 3,
  kAbandoned = 4,  // given up before the handler started
  kOrphaned = 5,   // given up while the handler ran: the handler frees its buffer
  // On an alternate signal stack too small to unwind on, the handler hands over the
  // interrupted registers (kRegisters) and waits; the watchdog claims them (kUnwinding),
  // unwinds the frozen stack from its own, and ends with kDone.
  kRegisters = 6,
  kUnwinding = 7,
};
constexpr uint32_t kStateBits = 3;
constexpr uint32_t kStateMask = (1u << kStateBits) - 1;
constexpr uint32_t makeWord(uint32_t generation, State state) {
  return (generation << kStateBits) | state;
}

// Where a handler writes. A buffer held by a handler that never finished stays unusable.
struct Buffer {
  std::atomic<bool> inUse{false};
  int count = 0;
  bool truncated = false;
  uintptr_t pthreadId = 0;  // the answering thread's pthread_self()
  uintptr_t pcs[kMaxFrames];
  unw_context_t registers;  // kRegisters: the interrupted thread's, in libunwind's layout
};
constexpr int kBuffers = 4;
Buffer g_buffers[kBuffers];

struct Request {
  std::atomic<uint32_t> word{0};
  std::atomic<int> tid{0};
  std::atomic<int> buffer{0};
};
Request g_request;
uint32_t g_generation = 0;  // watchdog only, under g_lock

// Signals sent but not yet taken, per tid. A real-time signal queues: a thread that blocked it
// takes it much later, and it must then be recognized as ours (and dropped), not chained.
constexpr int kPendingSlots = 1024;
struct Pending {
  std::atomic<int> tid{0};
  std::atomic<int> count{0};
};
Pending g_pending[kPendingSlots];
std::atomic<int> g_pendingUsed{0};

std::mutex g_lock;  // serializes install() and captures
std::atomic<int> g_signal{0};
struct sigaction g_previous;  // the action replaced by ours; written before ours is installed

int currentTid() {
  return static_cast<int>(syscall(SYS_gettid));
}

void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

// Handler side: takes one pending signal of `tid`, if any.
bool takePending(int tid) {
  const int used = g_pendingUsed.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    if (g_pending[i].tid.load(std::memory_order_acquire) != tid) continue;
    int count = g_pending[i].count.load();
    while (count > 0) {
      if (g_pending[i].count.compare_exchange_weak(count, count - 1)) return true;
    }
    return false;
  }
  return false;
}

// Watchdog side (under g_lock): the pending counter of `tid`, created if needed.
Pending* pendingFor(int tid) {
  const int used = g_pendingUsed.load();
  Pending* reusable = nullptr;
  for (int i = 0; i < used; ++i) {
    if (g_pending[i].tid.load() == tid) return &g_pending[i];
    if (reusable == nullptr && g_pending[i].count.load() == 0) reusable = &g_pending[i];
  }
  if (reusable == nullptr && used < kPendingSlots) {
    reusable = &g_pending[used];
    reusable->tid.store(tid, std::memory_order_release);
    g_pendingUsed.store(used + 1, std::memory_order_release);
    return reusable;
  }
  if (reusable != nullptr) reusable->tid.store(tid, std::memory_order_release);
  return reusable;
}

uintptr_t interruptedPc(void* context) {
  if (context == nullptr) return 0;
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// Unwinds the calling thread. With `startPc` (the pc the signal interrupted), frames before it
// (this function, the handler, the signal trampoline) are dropped; if it is never met (a
// sanitizer delivered the signal late, with a stale context), the first `skip` are dropped.
__attribute__((noinline)) int unwindSelf(uintptr_t* out, int max, uintptr_t startPc, int skip,
                                         bool* truncated) {
  constexpr int kRaw = kMaxFrames + 32;
  uintptr_t raw[kRaw];
  int n = 0;
  bool more = false;
  unw_context_t context;
  unw_cursor_t cursor;
  if (unw_getcontext(&context) == 0 && unw_init_local(&cursor, &context) == 0) {
    for (;;) {
      unw_word_t ip = 0;
      if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0 || ip == 0) break;
      if (n > 0 && raw[n - 1] == ip && n >= 2 && raw[n - 2] == ip) break;  // not advancing
      if (n == kRaw) {
        more = true;
        break;
      }
      raw[n++] = ip;
      const int step = unw_step(&cursor);
      if (step > 0) continue;
      // A step into code without unwind information reports the end but has moved the pc:
      // keep that last frame, it names where the unwind stopped.
      if (step == 0 && unw_get_reg(&cursor, UNW_REG_IP, &ip) == 0 && ip != 0 && ip != raw[n - 1] &&
          n < kRaw) {
        raw[n++] = ip;
      }
      break;
    }
  }
  int first = std::min(skip, n);
  if (startPc != 0) {
    for (int i = 0; i < n; ++i) {
      if (raw[i] == startPc) {
        first = i;
        break;
      }
    }
  }
  const int count = std::min(n - first, max);
  for (int i = 0; i < count; ++i) out[i] = raw[first + i];
  *truncated = more || n - first > max;
  return count;
}

// LLVM libunwind 14 applies a CFI row only to pcs past its first address, which is right for a
// return address (the call is at pc-1) and wrong for an interrupted pc: a thread stopped right
// after `leave` or `add rsp` would be unwound with the row before it, reading its return address
// through a stale frame pointer (a SIGSEGV in the unwinder, seen in the vDSO's clock_gettime).
// So the interrupted frame is looked up at pc+1, which selects exactly the row in force at pc,
// unless pc is its function's last byte: there (a `ret`) the return address is at rsp.
// `registers` is in the unw_context_t layout of registersFromSignal.
bool startAtInterruptedPc(unw_context_t& registers, unw_cursor_t* cursor) {
#if defined(__x86_64__)
  auto* words = reinterpret_cast<uint64_t*>(&registers);
  constexpr int kRsp = 7;
  constexpr int kRip = 16;
  const uint64_t pc = words[kRip];
  unw_proc_info_t at{};
  unw_proc_info_t after{};
  if (pc != 0 && unw_init_local(cursor, &registers) == 0 && unw_get_proc_info(cursor, &at) == 0) {
    words[kRip] = pc + 1;
    const bool sameFunction = unw_init_local(cursor, &registers) == 0 &&
                              unw_get_proc_info(cursor, &after) == 0 &&
                              after.start_ip == at.start_ip && pc + 1 < at.end_ip;
    words[kRip] = pc;
    if (sameFunction) {
      words[kRip] = pc + 1;
      const bool ok = unw_init_local(cursor, &registers) == 0;
      words[kRip] = pc;
      return ok;
    }
    if (*reinterpret_cast<const uint8_t*>(pc) == 0xc3) {  // ret: its return address is at rsp
      unw_context_t caller = registers;
      auto* callerWords = reinterpret_cast<uint64_t*>(&caller);
      callerWords[kRip] = *reinterpret_cast<const uint64_t*>(words[kRsp]);
      callerWords[kRsp] = words[kRsp] + 8;
      return unw_init_local(cursor, &caller) == 0;
    }
  }
#endif
  return unw_init_local(cursor, &registers) == 0;
}

// Unwinds a thread from the registers its signal interrupted: its own, in its handler, or
// another thread's, frozen in its handler while the watchdog unwinds it.
int unwindFrom(unw_context_t& registers, uintptr_t* out, int max, bool* truncated) {
  unw_cursor_t cursor;
  int n = 0;
  *truncated = false;
  const uintptr_t pc = reinterpret_cast<const uint64_t*>(&registers)[16];
  if (max <= 0 || pc == 0) return 0;
  out[n++] = pc;
  if (!startAtInterruptedPc(registers, &cursor)) return n;
  unw_word_t ip = 0;
  // After the pc+1 start, the cursor still sits in the interrupted frame: step out of it once.
  if (unw_get_reg(&cursor, UNW_REG_IP, &ip) == 0 && (ip == pc || ip == pc + 1) &&
      unw_step(&cursor) <= 0) {
    return n;
  }
  for (;;) {
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0 || ip == 0) break;
    if (n == max) {
      *truncated = true;
      break;
    }
    if (n >= 2 && out[n - 1] == ip && out[n - 2] == ip) break;  // not advancing
    out[n++] = ip;
    if (unw_step(&cursor) <= 0) break;
  }
  return n;
}

// True when the handler runs on an alternate signal stack with too little room left for
// libunwind (its cursor, context and CFI parsing take ~10 KiB; more under sanitizers).
bool altStackTooSmall() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr uintptr_t kNeeded = 32 * 1024;
#else
  constexpr uintptr_t kNeeded = 16 * 1024;
#endif
  stack_t current;
  if (sigaltstack(nullptr, &current) != 0 || !(current.ss_flags & SS_ONSTACK)) return false;
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  const auto low = reinterpret_cast<uintptr_t>(current.ss_sp);
  return here < low || here - low < kNeeded;
}

// The interrupted registers in LLVM libunwind's x86-64 unw_context_t layout (what its
// unw_getcontext stores: rax rbx rcx rdx rdi rsi rbp rsp r8-r15 rip); false elsewhere.
bool registersFromSignal(void* context, unw_context_t* out) {
#if defined(__x86_64__)
  if (context == nullptr) return false;
  const greg_t* g = static_cast<const ucontext_t*>(context)->uc_mcontext.gregs;
  const int order[] = {REG_RAX, REG_RBX, REG_RCX, REG_RDX, REG_RDI, REG_RSI,
                       REG_RBP, REG_RSP, REG_R8,  REG_R9,  REG_R10, REG_R11,
                       REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP};
  std::memset(out, 0, sizeof *out);
  auto* words = reinterpret_cast<uint64_t*>(out);
  for (size_t i = 0; i < sizeof order / sizeof order[0]; ++i) {
    words[i] = static_cast<uint64_t>(g[order[i]]);
  }
  return true;
#else
  (void)context;
  (void)out;
  return false;
#endif
}

// Handler side, on a small alternate stack: publishes the registers and keeps the thread (and
// so its stack) still until the watchdog has unwound it. Bounded: if the watchdog never claims
// them, the handler takes them back and returns. True when the watchdog answered.
bool handOverRegisters(Buffer& buffer, uint32_t word, void* context) {
  if (!registersFromSignal(context, &buffer.registers)) return false;
  const uint32_t base = word & ~kStateMask;
  g_request.word.store(base | kRegisters, std::memory_order_release);
  futexWake(&g_request.word);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    const uint32_t now = g_request.word.load(std::memory_order_acquire);
    if ((now & ~kStateMask) != base || (now & kStateMask) == kDone) return true;
    if ((now & kStateMask) == kRegisters && std::chrono::steady_clock::now() > deadline) {
      uint32_t expected = base | kRegisters;
      if (g_request.word.compare_exchange_strong(expected, base | kOrphaned)) {
        buffer.inUse.store(false, std::memory_order_release);
        return true;  // given up: nothing was written, the watchdog sees kOrphaned
      }
      continue;  // claimed meanwhile: the watchdog is unwinding, wait for its kDone
    }
    futexWait(&g_request.word, now, std::chrono::milliseconds(20));
  }
}

// TSan delivers a signal late, at its next safe point, with the context of the moment the
// signal arrived: the stack has moved on since, and unwinding from those registers reads
// garbage. There the handler unwinds its own stack instead (unwindSelf finds the frames).
#if defined(__SANITIZE_THREAD__)
constexpr bool kSignalContextIsCurrent = false;
#else
constexpr bool kSignalContextIsCurrent = true;
#endif

void serveRequest(int self, void* context) {
  const uint32_t word = g_request.word.load(std::memory_order_acquire);
  if ((word & kStateMask) != kRequested) return;  // a late answer to a request given up on
  if (g_request.tid.load(std::memory_order_relaxed) != self) return;
  uint32_t expected = word;
  if (!g_request.word.compare_exchange_strong(expected, (word & ~kStateMask) | kRunning,
                                              std::memory_order_acq_rel)) {
    return;
  }
  Buffer& buffer = g_buffers[g_request.buffer.load(std::memory_order_relaxed)];
  // glibc's pthread_self() reads the thread pointer (no lock, no call out): safe here.
  buffer.pthreadId = static_cast<uintptr_t>(pthread_self());
  const uintptr_t pc = interruptedPc(context);
  if (altStackTooSmall()) {
    // Unwinding needs ~10 KiB of stack: on a small sigaltstack (a sanitizer's, a runtime's)
    // the watchdog unwinds this thread's stack from its own while we wait here.
    if (handOverRegisters(buffer, word, context)) return;
    buffer.count = pc != 0 ? 1 : 0;  // no registers to hand over: just the interrupted pc
    buffer.pcs[0] = pc;
    buffer.truncated = true;
  } else {
    // From the interrupted registers, not through the signal trampoline: libunwind looks up
    // the frame after a trampoline at pc-1 as if it were a return address, and an interrupted
    // pc right after an epilogue's `add rsp` then reads its CFA from the wrong row (garbage
    // return addresses, a SIGSEGV inside the unwinder). Starting at the registers looks the
    // first frame up at its exact pc.
    bool truncated = false;
    unw_context_t registers;
    if (kSignalContextIsCurrent && registersFromSignal(context, &registers)) {
      buffer.count = unwindFrom(registers, buffer.pcs, kMaxFrames, &truncated);
    } else {
      buffer.count = unwindSelf(buffer.pcs, kMaxFrames, pc, 1, &truncated);
    }
    buffer.truncated = truncated;
  }
  expected = (word & ~kStateMask) | kRunning;
  if (g_request.word.compare_exchange_strong(expected, (word & ~kStateMask) | kDone,
                                             std::memory_order_acq_rel)) {
    futexWake(&g_request.word);
  } else {
    buffer.inUse.store(false, std::memory_order_release);  // the watchdog gave up on us
  }
}

void chain(int signalNumber, siginfo_t* info, void* context) {
  const struct sigaction& previous = g_previous;
  if (previous.sa_flags & SA_SIGINFO) {
    auto* handler = previous.sa_sigaction;
    const auto raw = reinterpret_cast<uintptr_t>(handler);
    if (raw == reinterpret_cast<uintptr_t>(SIG_DFL) ||
        raw == reinterpret_cast<uintptr_t>(SIG_IGN)) {
      return;
    }
    handler(signalNumber, info, context);
    return;
  }
  // SIG_DFL of a real-time signal would end the process: a stray signal is dropped instead.
  if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) return;
  previous.sa_handler(signalNumber);
}

void onSignal(int signalNumber, siginfo_t* info, void* context) {
  const int savedErrno = errno;
  const int self = currentTid();
  if (info != nullptr && info->si_code == SI_TKILL && info->si_pid == getpid() &&
      takePending(self)) {
    serveRequest(self, context);
  } else {
    chain(signalNumber, info, context);
  }
  errno = savedErrno;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Watchdog side.

void readTaskFile(int tid, const char* leaf, char* out, size_t size, bool wholeFile) {
  out[0] = '\0';
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/%s", tid, leaf);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n;
  do {
    n = ::read(fd, out, size - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return;
  out[n] = '\0';
  if (wholeFile) return;
  for (ssize_t i = 0; i < n; ++i) {
    if (out[i] == '\n') {
      out[i] = '\0';
      break;
    }
    if (static_cast<unsigned char>(out[i]) < 0x20) out[i] = ' ';
  }
}

namespace {

void resetSlot(ThreadStack& slot, int tid) {
  slot = ThreadStack{};
  slot.tid = tid;
  readTaskFile(tid, "comm", slot.name, sizeof(slot.name));
}

// Signals `tid` and waits for its stack. False when it did not answer in time.
bool requestStack(int tid, int signalNumber, std::chrono::milliseconds timeout, ThreadStack& slot) {
  int index = -1;
  for (int i = 0; i < kBuffers && index < 0; ++i) {
    bool expected = false;
    if (g_buffers[i].inUse.compare_exchange_strong(expected, true)) index = i;
  }
  if (index < 0) return false;  // every buffer is held by a handler that never finished
  Buffer& buffer = g_buffers[index];
  Pending* pending = pendingFor(tid);
  if (pending == nullptr) {
    buffer.inUse.store(false);
    return false;
  }
  const uint32_t generation = (++g_generation) & ((1u << (32 - kStateBits)) - 1);
  g_request.tid.store(tid, std::memory_order_relaxed);
  g_request.buffer.store(index, std::memory_order_relaxed);
  g_request.word.store(makeWord(generation, kRequested), std::memory_order_release);
  pending->count.fetch_add(1);
  if (syscall(SYS_tgkill, getpid(), tid, signalNumber) != 0) {
    pending->count.fetch_sub(1);
    g_request.word.store(makeWord(generation, kAbandoned), std::memory_order_release);
    buffer.inUse.store(false);
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint32_t word = g_request.word.load(std::memory_order_acquire);
    if (word == makeWord(generation, kDone)) break;
    if (word == makeWord(generation, kRegisters)) {
      uint32_t expected = word;
      if (g_request.word.compare_exchange_strong(expected, makeWord(generation, kUnwinding))) {
        // The thread waits in its handler: its stack stays as the signal found it.
        bool truncated = false;
        buffer.count = unwindFrom(buffer.registers, buffer.pcs, kMaxFrames, &truncated);
        buffer.truncated = truncated;
        g_request.word.store(makeWord(generation, kDone), std::memory_order_release);
        futexWake(&g_request.word);
        break;
      }
      continue;
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) {
      uint32_t expected = makeWord(generation, kRequested);
      if (g_request.word.compare_exchange_strong(expected, makeWord(generation, kAbandoned))) {
        buffer.inUse.store(false);
        return false;
      }
      if (expected == makeWord(generation, kRunning) &&
          g_request.word.compare_exchange_strong(expected, makeWord(generation, kOrphaned))) {
        return false;  // the handler frees the buffer when (if) it finishes
      }
      if (expected != makeWord(generation, kDone)) return false;
      break;
    }
    futexWait(&g_request.word, word,
              std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(50)));
  }
  slot.answered = true;
  slot.pthreadId = buffer.pthreadId;
  slot.frameCount = buffer.count;
  slot.truncated = buffer.truncated;
  std::copy(buffer.pcs, buffer.pcs + buffer.count, slot.pcs);
  buffer.inUse.store(false, std::memory_order_release);
  return true;
}

// True when /proc/self/task/<tid>/status says the thread blocks `signalNumber` (CPython's
// faulthandler thread, sanitizer and other helper threads block every signal): it would not
// answer, so it is not waited on.
bool threadBlocks(int tid, int signalNumber) {
  char status[4096];
  readTaskFile(tid, "status", status, sizeof(status), /*wholeFile=*/true);
  const char* field = std::strstr(status, "SigBlk:");
  if (field == nullptr) return false;
  field += 7;
  while (*field == ' ' || *field == '\t') ++field;
  uint64_t mask = 0;
  for (; *field != '\0'; ++field) {
    const char c = *field;
    if (c >= '0' && c <= '9') {
      mask = (mask << 4) | static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      mask = (mask << 4) | static_cast<uint64_t>(c - 'a' + 10);
    } else {
      break;
    }
  }
  return signalNumber <= 64 && ((mask >> (signalNumber - 1)) & 1) != 0;
}

void captureOther(int tid, int signalNumber, std::chrono::milliseconds timeout, ThreadStack& slot) {
  resetSlot(slot, tid);
  // A thread may mask signals for a moment (pthread_create, posix_spawn, parts of the loader):
  // look again for a short while before deciding that it blocks the signal for good.
  bool blocks = signalNumber != 0 && threadBlocks(tid, signalNumber);
  const auto recheckUntil =
      std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(20));
  while (blocks && std::chrono::steady_clock::now() < recheckUntil) {
    usleep(500);
    blocks = threadBlocks(tid, signalNumber);
  }
  if (signalNumber != 0 && !blocks && requestStack(tid, signalNumber, timeout, slot)) return;
  readTaskFile(tid, "wchan", slot.wchan, sizeof(slot.wchan));
  readTaskFile(tid, "syscall", slot.syscall, sizeof(slot.syscall));
  if (blocks) {
    // Keep the syscall numbers, say why: "blocks signal; 230 0x0 ...".
    char syscallLine[sizeof(slot.syscall)];
    std::memcpy(syscallLine, slot.syscall, sizeof(syscallLine));
    std::snprintf(slot.syscall, sizeof(slot.syscall), "blocks signal; %.48s", syscallLine);
  } else if (slot.wchan[0] == '\0' && slot.syscall[0] == '\0') {
    std::snprintf(slot.syscall, sizeof(slot.syscall), "%s",
                  signalNumber == 0 ? "sampler not installed" : "exited or unreadable");
  }
}

struct LinuxDirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[1];
};

}  // namespace

bool StackSampler::install(int signalNumber, std::string* error) {
  std::lock_guard<std::mutex> lock(g_lock);
  const int current = g_signal.load();
  if (current != 0) {
    if (current == signalNumber) return true;
    if (error) {
      *error = "stack sampler already installed on signal " + std::to_string(current) + ", not " +
               std::to_string(signalNumber);
    }
    return false;
  }
  if (signalNumber < SIGRTMIN || signalNumber > SIGRTMAX) {
    if (error) {
      *error = "stack sampler signal " + std::to_string(signalNumber) +
               " is not a real-time signal (" + std::to_string(SIGRTMIN) + ".." +
               std::to_string(SIGRTMAX) + ")";
    }
    return false;
  }
  refreshSnapshot();
  // Warm-up: run every piece the handler uses once, here, so that one-time initialization
  // (libunwind's, lazy PLT binding) never happens inside a handler.
  {
    uintptr_t pcs[kMaxFrames];
    bool truncated = false;
    if (unwindSelf(pcs, kMaxFrames, 0, 0, &truncated) == 0) {
      if (error) *error = "stack sampler: libunwind could not unwind the installing thread";
      return false;
    }
    std::atomic<uint32_t> dummy{0};
    futexWake(&dummy);
    (void)takePending(currentTid());
    (void)getpid();
    (void)interruptedPc(nullptr);
    (void)altStackTooSmall();
    (void)pthread_self();
  }
  struct sigaction previous;
  std::memset(&previous, 0, sizeof(previous));
  if (sigaction(signalNumber, nullptr, &previous) != 0) {
    if (error) *error = std::string("stack sampler: sigaction: ") + std::strerror(errno);
    return false;
  }
  g_previous = previous;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = onSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(signalNumber, &action, &previous) != 0) {
    if (error) *error = std::string("stack sampler: sigaction: ") + std::strerror(errno);
    return false;
  }
  g_signal.store(signalNumber);
  return true;
}

bool StackSampler::installed() {
  return g_signal.load() != 0;
}

int StackSampler::signalNumber() {
  return g_signal.load();
}

CaptureResult StackSampler::captureAll(std::span<ThreadStack> slots,
                                       std::chrono::milliseconds perThreadTimeout) {
  CaptureResult result;
  std::unique_lock<std::mutex> lock(g_lock, std::try_to_lock);
  if (!lock.owns_lock()) {
    result.busy = true;
    return result;
  }
  const int self = currentTid();
  const int signalNumber = g_signal.load();
  if (signalNumber != 0) refreshSnapshot();

  result.threads = 1;
  if (!slots.empty()) {
    ThreadStack& slot = slots[0];
    resetSlot(slot, self);
    slot.answered = true;
    slot.pthreadId = static_cast<uintptr_t>(pthread_self());
    bool truncated = false;
    slot.frameCount = unwindSelf(slot.pcs, kMaxFrames, 0, 1, &truncated);
    slot.truncated = truncated;
    result.count = 1;
  }

  const int fd = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return result;
  alignas(8) char entries[4096];
  for (;;) {
    const long n = syscall(SYS_getdents64, fd, entries, sizeof(entries));
    if (n <= 0) break;
    for (long offset = 0; offset < n;) {
      const auto* entry = reinterpret_cast<const LinuxDirent64*>(entries + offset);
      offset += entry->reclen;
      int tid = 0;
      bool numeric = entry->name[0] != '\0';
      for (const char* c = entry->name; *c != '\0'; ++c) {
        if (*c < '0' || *c > '9') {
          numeric = false;
          break;
        }
        tid = tid * 10 + (*c - '0');
      }
      if (!numeric || tid == self) continue;
      ++result.threads;
      if (result.count < slots.size()) {
        captureOther(tid, signalNumber, perThreadTimeout, slots[result.count++]);
      }
    }
  }
  ::close(fd);
  return result;
}

}  // namespace ncclwatch::watchdog
