// Native stacks of every thread of the current process, taken from a normal thread (the
// watchdog) at hang time.
//
// Capture: the sampler sends a real-time signal to one thread at a time (tgkill); that thread
// unwinds its own stack in the handler with LLVM libunwind and stores raw PCs into a
// preallocated buffer. The handler takes no lock, allocates nothing and never calls the loader:
// libunwind's module lookup is served from a module snapshot that the watchdog takes before
// signalling. Each wait is bounded; a thread that does not answer (it blocks the signal, or is
// stuck in the kernel) is described from /proc/self/task/<tid>/{comm,wchan,syscall}.
//
// Symbolization happens later, outside any handler: function (from the module's .symtab, or
// .dynsym, or dladdr), module path, offset and GNU build-id.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ncclwatch::watchdog {

inline constexpr int kMaxFrames = 64;

struct ThreadStack {
  int tid = 0;
  char name[16] = {};     // /proc/self/task/<tid>/comm
  bool answered = false;  // true: pcs hold the thread's stack, taken by the thread itself
  // Its pthread_self(), read by the thread itself with its stack (0 when it did not answer):
  // CPython names the thread's Python stack by this id, so the two stacks can be joined.
  uintptr_t pthreadId = 0;
  bool truncated = false;  // the stack had more than kMaxFrames frames
  int frameCount = 0;
  // pcs[0] is the exact interrupted pc; every later one is a return address.
  uintptr_t pcs[kMaxFrames] = {};
  // Only for threads that did not answer: what the kernel says they wait on.
  char wchan[48] = {};
  char syscall[64] = {};
};

struct CaptureResult {
  size_t count = 0;    // slots filled
  size_t threads = 0;  // threads seen in /proc/self/task (may exceed count)
  bool busy = false;   // another capture was running: nothing was done
};

class StackSampler {  // one per process; every member is static
 public:
  // The default signal is SIGRTMIN + kDefaultSignalOffset.
  static constexpr int kDefaultSignalOffset = 3;

  // Installs the handler for `signalNumber` (a real-time signal) with
  // SA_SIGINFO|SA_RESTART|SA_ONSTACK, keeping the previous action for chaining, and warms the
  // unwinder by unwinding the calling thread once. Idempotent; false with a one-line `error`
  // when the signal is not a real-time one or differs from the one already installed.
  static bool install(int signalNumber, std::string* error);
  static bool installed();
  static int signalNumber();  // 0 before install

  // From a normal thread (the watchdog): fills slots with the calling thread (unwound directly,
  // slot 0) and then every other thread of the process, signalled one at a time, each waited on
  // for at most `perThreadTimeout`. Never runs two captures at once: a concurrent call returns
  // at once with busy = true. Without install(), other threads are reported unanswered.
  static CaptureResult captureAll(std::span<ThreadStack> slots,
                                  std::chrono::milliseconds perThreadTimeout);
};

struct Frame {
  uintptr_t pc = 0;
  std::string function;  // demangled; empty when unknown
  uintptr_t functionOffset = 0;
  std::string module;          // path of the ELF file mapped there; empty when unknown
  uintptr_t moduleOffset = 0;  // pc minus the module's load bias (what addr2line -e takes)
  std::string buildId;         // GNU build-id of the module, hex; empty when it has none
};

// Symbolizes `pcs` as one stack: pcs[0] is an exact pc, every later one a return address (its
// function is looked up at pc - 1). Allocates and reads files: never call it from a handler.
// Past `budget`, frames still get module, offset and build-id but no function name.
std::vector<Frame> symbolize(std::span<const uintptr_t> pcs,
                             std::chrono::milliseconds budget = std::chrono::milliseconds(2000));

// "function+0x12 (module+0xabc)" for logs and dumps.
std::string formatFrame(const Frame& frame);

// Reads /proc/self/task/<tid>/<leaf> ("comm", "wchan", ...) into `out`: its first line with
// control characters as spaces, or with `wholeFile` all of it; "" when the thread is gone. No
// allocation.
void readTaskFile(int tid, const char* leaf, char* out, size_t size, bool wholeFile = false);

}  // namespace ncclwatch::watchdog
