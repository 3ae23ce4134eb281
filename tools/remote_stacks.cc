#include "remote_stacks.h"

#include <cxxabi.h>
#include <dirent.h>
#include <elf.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#if NCCLWATCH_HAVE_LIBDW
#include <elfutils/libdwfl.h>
#endif

namespace ncclwatch::stacks_of {
namespace {

int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

std::string firstLine(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

std::string taskFile(pid_t pid, pid_t tid, const char* name) {
  return firstLine("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/" + name);
}

std::vector<pid_t> threadsOf(pid_t pid) {
  std::vector<pid_t> tids;
  std::string path = "/proc/" + std::to_string(pid) + "/task";
  DIR* directory = opendir(path.c_str());
  if (directory == nullptr) return tids;
  while (dirent* entry = readdir(directory)) {
    char* end = nullptr;
    long tid = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && tid > 0) tids.push_back(static_cast<pid_t>(tid));
  }
  closedir(directory);
  std::sort(tids.begin(), tids.end());  // the main thread (tid == pid) first
  return tids;
}

// Why PTRACE_SEIZE was refused, in words a user can act on.
std::string deniedWhy(pid_t pid, pid_t tid, int error) {
  std::string why =
      "ptrace(PTRACE_SEIZE) of thread " + std::to_string(tid) + " refused: " + std::strerror(error);
  std::ifstream status("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("TracerPid:", 0) == 0) {
      long tracer = std::strtol(line.c_str() + 10, nullptr, 10);
      if (tracer != 0) return why + " (already traced by pid " + std::to_string(tracer) + ")";
    }
  }
  std::string scope = firstLine("/proc/sys/kernel/yama/ptrace_scope");
  if (!scope.empty() && scope != "0") why += " (Yama ptrace_scope=" + scope + ")";
  return why + (error == EPERM ? " (no CAP_SYS_PTRACE, not dumpable, or a seccomp policy)" : "");
}

// What /proc/<pid>/task/<tid>/syscall says: the call a thread is blocked in, with its user
// stack pointer and pc.
struct BlockedCall {
  bool blocked = false;
  long number = -1;
  uint64_t sp = 0, pc = 0;
  bool operator==(const BlockedCall&) const = default;
};

BlockedCall blockedCall(pid_t pid, pid_t tid) {
  BlockedCall call;
  std::string line = taskFile(pid, tid, "syscall");
  unsigned long long fields[9] = {};
  long number = -1;
  if (std::sscanf(line.c_str(), "%ld %llx %llx %llx %llx %llx %llx %llx %llx", &number, &fields[0],
                  &fields[1], &fields[2], &fields[3], &fields[4], &fields[5], &fields[6],
                  &fields[7]) == 9 &&
      number >= 0) {
    call = {true, number, fields[6], fields[7]};
  }
  return call;
}

// The calls that Linux ends with EINTR after any stop, even one the program never sees
// (signal(7), "Interruption of system calls ... by stop signals"), PTRACE_INTERRUPT's included.
// A thread blocked in one is unwound without stopping it.
bool stopWouldInterrupt(long number) {
  static const long kCalls[] = {
#ifdef SYS_epoll_wait
      SYS_epoll_wait,
#endif
#ifdef SYS_epoll_pwait2
      SYS_epoll_pwait2,
#endif
#ifdef SYS_semop
      SYS_semop,
#endif
      SYS_epoll_pwait,  SYS_semtimedop, SYS_rt_sigtimedwait, SYS_accept, SYS_accept4, SYS_connect,
      SYS_recvfrom,     SYS_recvmsg,    SYS_recvmmsg,        SYS_sendto, SYS_sendmsg, SYS_sendmmsg,
  };
  return std::find(std::begin(kCalls), std::end(kCalls), number) != std::end(kCalls);
}

enum class Attach { kStopped, kGone, kDenied, kNoStop };

// Attaches to `tid` without a signal and waits at most `bound` for it to stop. A signal that
// arrives meanwhile stops it first (a signal-delivery-stop): it goes back at detach.
Attach attachAndStop(pid_t tid, std::chrono::milliseconds bound, int* pendingSignal, int* error) {
  *pendingSignal = 0;
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
    *error = errno;
    return errno == ESRCH ? Attach::kGone : Attach::kDenied;
  }
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) return Attach::kGone;
  auto deadline = std::chrono::steady_clock::now() + bound;
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int status = 0;
    pid_t done = waitpid(tid, &status, __WALL | WNOHANG);
    if (done == tid) {
      if (!WIFSTOPPED(status)) return Attach::kGone;  // it exited
      if ((status >> 16) != PTRACE_EVENT_STOP) *pendingSignal = WSTOPSIG(status);
      return Attach::kStopped;
    }
    if (done < 0 && errno != EINTR) return Attach::kGone;
    if (std::chrono::steady_clock::now() >= deadline) return Attach::kNoStop;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

}  // namespace

#if NCCLWATCH_HAVE_LIBDW
namespace {

struct Target {
  pid_t pid = 0;
  std::vector<pid_t> tids;
  size_t next = 0;
  // Set while unwinding a thread left running in a call that a stop would cut short: its
  // registers are the sp and pc the kernel shows; the others are recovered from frames that
  // saved them, or the unwind ends early.
  const BlockedCall* unstopped = nullptr;
};

struct Unwound {
  std::vector<std::pair<Dwarf_Addr, bool>> pcs;  // pc, is it exact (not a return address)
  size_t max = 64;
  bool truncated = false;
};

pid_t nextThread(Dwfl*, void* arg, void** threadArg) {
  auto* target = static_cast<Target*>(arg);
  if (target->next >= target->tids.size()) return 0;
  *threadArg = target;
  return target->tids[target->next++];
}

bool getThread(Dwfl*, pid_t, void* arg, void** threadArg) {
  *threadArg = arg;
  return true;
}

bool readWord(Dwfl*, Dwarf_Addr address, Dwarf_Word* result, void* arg) {
  auto* target = static_cast<Target*>(arg);
  iovec local{result, sizeof *result};
  iovec remote{reinterpret_cast<void*>(address), sizeof *result};
  return process_vm_readv(target->pid, &local, 1, &remote, 1, 0) ==
         static_cast<ssize_t>(sizeof *result);
}

bool setInitialRegisters(Dwfl_Thread* thread, void* arg) {
  pid_t tid = dwfl_thread_tid(thread);
  if (const BlockedCall* call = static_cast<Target*>(arg)->unstopped) {
#if defined(__x86_64__)
    constexpr int kSp = 7;
#else
    constexpr int kSp = 31;
#endif
    Dwarf_Word sp = call->sp;
    if (!dwfl_thread_state_registers(thread, kSp, 1, &sp)) return false;
    dwfl_thread_state_register_pc(thread, call->pc);
    return true;
  }
#if defined(__x86_64__)
  user_regs_struct regs{};
  iovec io{&regs, sizeof regs};
  if (ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &io) != 0) return false;
  // The DWARF register numbering of x86-64: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8-r15, rip.
  Dwarf_Word dwarf[17] = {regs.rax, regs.rdx, regs.rcx, regs.rbx, regs.rsi, regs.rdi,
                          regs.rbp, regs.rsp, regs.r8,  regs.r9,  regs.r10, regs.r11,
                          regs.r12, regs.r13, regs.r14, regs.r15, regs.rip};
  return dwfl_thread_state_registers(thread, 0, 17, dwarf);
#elif defined(__aarch64__)
  user_pt_regs regs{};
  iovec io{&regs, sizeof regs};
  if (ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &io) != 0) return false;
  // x0-x30 are DWARF 0-30, sp is 31; the pc has no DWARF number.
  Dwarf_Word dwarf[32];
  for (int i = 0; i < 31; ++i) dwarf[i] = regs.regs[i];
  dwarf[31] = regs.sp;
  if (!dwfl_thread_state_registers(thread, 0, 32, dwarf)) return false;
  dwfl_thread_state_register_pc(thread, regs.pc);
  return true;
#else
  (void)tid;
  return false;
#endif
}

int onFrame(Dwfl_Frame* state, void* arg) {
  auto* unwound = static_cast<Unwound*>(arg);
  Dwarf_Addr pc = 0;
  bool exact = false;
  if (!dwfl_frame_pc(state, &pc, &exact)) return DWARF_CB_ABORT;
  if (unwound->pcs.size() == unwound->max) {
    unwound->truncated = true;
    return DWARF_CB_ABORT;
  }
  unwound->pcs.emplace_back(pc, exact);
  return DWARF_CB_OK;
}

// Demangled, without the symbol version libdwfl appends ("clock_nanosleep@GLIBC_2.2.5"), as the
// in-process symbolizer names functions.
std::string demangled(const char* versioned) {
  std::string symbol = versioned;
  if (size_t at = symbol.find('@'); at != std::string::npos && at > 0) symbol.resize(at);
  int status = -1;
  char* text = abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status);
  std::string result = status == 0 && text != nullptr ? text : symbol;
  std::free(text);
  return result;
}

// The same fields as the in-process symbolizer: functionOffset and moduleOffset are measured
// from the pc itself, the function is looked up at pc - 1 for a return address.
trace::DumpFrame symbolized(Dwfl* dwfl, Dwarf_Addr pc, bool exact) {
  trace::DumpFrame frame;
  frame.pc = pc;
  Dwarf_Addr lookup = exact || pc == 0 ? pc : pc - 1;
  Dwfl_Module* module = dwfl_addrmodule(dwfl, lookup);
  if (module == nullptr) return frame;
  const char* name =
      dwfl_module_info(module, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  if (name != nullptr) frame.module = name;
  Dwarf_Addr bias = 0;
  if (dwfl_module_getelf(module, &bias) != nullptr) frame.moduleOffset = pc - bias;
  const unsigned char* bits = nullptr;
  GElf_Addr noteAddress = 0;
  int length = dwfl_module_build_id(module, &bits, &noteAddress);
  for (int i = 0; i < length; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", bits[i]);
    frame.buildId += hex;
  }
  GElf_Off offset = 0;
  GElf_Sym symbol{};
  const char* function =
      dwfl_module_addrinfo(module, lookup, &offset, &symbol, nullptr, nullptr, nullptr);
  if (function != nullptr) {
    frame.function = demangled(function);
    frame.functionOffset = offset + (pc - lookup);
  }
  return frame;
}

// Opens every module's ELF file and call-frame information before any thread is stopped, so
// that each stop lasts only its own unwind.
int warmModule(Dwfl_Module* module, void**, const char*, Dwarf_Addr, void*) {
  Dwarf_Addr bias = 0;
  if (dwfl_module_getelf(module, &bias) != nullptr) dwfl_module_eh_cfi(module, &bias);
  return DWARF_CB_OK;
}

// No separate debug files (/usr/lib/debug, debuginfod): functions are named from each module's
// own .symtab or .dynsym, as the in-process symbolizer names them, so that the same frame has
// the same name whichever route a rank's dump took (the merged stack tree compares names).
// Offline tools resolve file:line from the build-id.
int noSeparateDebugInfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*,
                        GElf_Word, char**) {
  return -1;
}

const Dwfl_Callbacks kProcessCallbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = noSeparateDebugInfo,
    .section_address = nullptr,
    .debuginfo_path = nullptr,
};

const Dwfl_Thread_Callbacks kThreadCallbacks = {
    .next_thread = nextThread,
    .get_thread = getThread,
    .memory_read = readWord,
    .set_initial_registers = setInitialRegisters,
    .detach = nullptr,
    .thread_detach = nullptr,
};

// A thread blocked in a call that a stop would end with EINTR is unwound where it sleeps, from
// the kernel's sp and pc, without stopping it. Its stack does not change while it stays in the
// call: the frames count only when the call is still the same one afterwards.
bool unwindWithoutStopping(Dwfl* dwfl, Target& target, pid_t tid, Unwound* stack) {
  BlockedCall before = blockedCall(target.pid, tid);
  if (!before.blocked || !stopWouldInterrupt(before.number)) return false;
  target.unstopped = &before;
  Unwound attempt;
  attempt.max = stack->max;
  dwfl_getthread_frames(dwfl, tid, onFrame, &attempt);
  target.unstopped = nullptr;
  if (attempt.pcs.empty() || !(blockedCall(target.pid, tid) == before)) return false;
  *stack = std::move(attempt);
  return true;
}

struct StopTimes {
  int stopped = 0;
  int inPlace = 0;
  int64_t longestNs = 0;
  int64_t totalNs = 0;
};

enum class Taken { kTaken, kGone, kRefused };

// The pthread_self() of a thread stopped by ptrace, which CPython uses as the thread's id: on
// x86-64 glibc keeps the thread's control block at the thread pointer and pthread_self()
// returns that address, i.e. fs_base. 0 elsewhere (aarch64's pthread_self() sits an
// implementation-defined distance below TPIDR_EL0) or when the registers cannot be read.
uint64_t pthreadIdOfStopped(pid_t tid) {
#if defined(__x86_64__)
  user_regs_struct regs{};
  iovec io{&regs, sizeof regs};
  if (ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &io) != 0) return 0;
  return regs.fs_base;
#else
  (void)tid;
  return 0;
#endif
}

// One thread: unwound where it sleeps, or stopped, unwound and detached at once. kRefused with
// `why` when ptrace is refused (already traced by gdb or strace, or not permitted): the agent's
// signal route then takes every thread rather than leave this one out.
Taken takeThread(Dwfl* dwfl, Target& target, pid_t tid, const Options& options,
                 trace::DumpThread* thread, Unwound* stack, StopTimes* times, std::string* why) {
  thread->tid = tid;
  thread->name = taskFile(target.pid, tid, "comm");
  if (unwindWithoutStopping(dwfl, target, tid, stack)) {
    thread->answered = true;
    ++times->inPlace;
    return Taken::kTaken;
  }
  int signal = 0, error = 0;
  int64_t start = monotonicNs();
  Attach attach = attachAndStop(tid, options.perThread, &signal, &error);
  if (attach == Attach::kGone) return Taken::kGone;
  if (attach == Attach::kDenied) {
    *why = deniedWhy(target.pid, tid, error);
    return Taken::kRefused;
  }
  if (attach == Attach::kNoStop) {
    // Stuck in the kernel: what the kernel says. Still attached, it is detached by the kernel
    // when this process ends.
    thread->wchan = taskFile(target.pid, tid, "wchan");
    thread->syscall = "did not stop for ptrace; " + taskFile(target.pid, tid, "syscall");
    return Taken::kTaken;
  }
  thread->pthreadId = pthreadIdOfStopped(tid);
  dwfl_getthread_frames(dwfl, tid, onFrame, stack);
  ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(signal)));
  int64_t stoppedNs = monotonicNs() - start;
  ++times->stopped;
  times->longestNs = std::max(times->longestNs, stoppedNs);
  times->totalNs += stoppedNs;
  thread->answered = !stack->pcs.empty();
  return Taken::kTaken;
}

struct DwflCloser {
  void operator()(Dwfl* dwfl) const { dwfl_end(dwfl); }
};

}  // namespace

bool available() {
  return true;
}

bool takeRemoteStacks(const Options& options, trace::Dump* dump, std::string* why) {
  int64_t start = monotonicNs();
  *dump = trace::Dump{};
  dump->trigger = "stacks-of";
  dump->timeNs = start;
  dump->stackRoute = "ptrace (no signal sent)";
  dump->pythonNote = "not taken (stacks-of)";
  Target target;
  target.pid = options.pid;
  target.tids = threadsOf(options.pid);
  if (target.tids.empty()) {
    *why = "no process " + std::to_string(options.pid) + " (nothing in /proc/<pid>/task)";
    return false;
  }
  std::unique_ptr<Dwfl, DwflCloser> dwfl(dwfl_begin(&kProcessCallbacks));
  if (!dwfl || dwfl_linux_proc_report(dwfl.get(), options.pid) != 0 ||
      dwfl_report_end(dwfl.get(), nullptr, nullptr) != 0) {
    *why = std::string("cannot list the modules of pid ") + std::to_string(options.pid) + ": " +
           dwfl_errmsg(-1);
    return false;
  }
  dwfl_getmodules(dwfl.get(), warmModule, nullptr, 0);
  if (!dwfl_attach_state(dwfl.get(), nullptr, options.pid, &kThreadCallbacks, &target)) {
    *why = std::string("cannot unwind pid ") + std::to_string(options.pid) + ": " + dwfl_errmsg(-1);
    return false;
  }
  std::vector<Unwound> unwound;
  StopTimes times;
  for (pid_t tid : target.tids) {
    if (dump->threads.size() == static_cast<size_t>(options.maxThreads)) {
      dump->reason = " (" + std::to_string(target.tids.size() - dump->threads.size()) +
                     " threads beyond the bound left out)";
      break;
    }
    trace::DumpThread thread;
    Unwound stack;
    stack.max = static_cast<size_t>(options.maxFrames);
    Taken taken = takeThread(dwfl.get(), target, tid, options, &thread, &stack, &times, why);
    if (taken == Taken::kRefused) return false;
    if (taken == Taken::kGone) continue;  // it exited meanwhile
    unwound.push_back(std::move(stack));
    dump->threads.push_back(std::move(thread));
  }
  char stops[160];
  std::snprintf(stops, sizeof stops,
                "; %d threads stopped, each for %.2f ms at most (%.2f ms in all), %d unwound "
                "without a stop",
                times.stopped, static_cast<double>(times.longestNs) / 1e6,
                static_cast<double>(times.totalNs) / 1e6, times.inPlace);
  dump->reason = stops + dump->reason;
  for (size_t i = 0; i < dump->threads.size(); ++i) {
    for (auto [pc, exact] : unwound[i].pcs) {
      dump->threads[i].frames.push_back(symbolized(dwfl.get(), pc, exact));
    }
  }
  dump->reason =
      "native stacks of pid " + std::to_string(options.pid) + " through ptrace" + dump->reason;
  dump->tookNs = monotonicNs() - start;
  return true;
}

#else  // built without libdw

bool available() {
  return false;
}

bool takeRemoteStacks(const Options&, trace::Dump*, std::string* why) {
  *why = "this ncclwatch was built without elfutils' libdw (Debian libdw-dev)";
  return false;
}

#endif

int run(const Options& options, std::ostream& out, std::ostream& err) {
  // The agent spawns us with every signal blocked (its watchdog thread's mask).
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Unwinding needs only the modules' own .eh_frame: never ask a debuginfod server.
  unsetenv("DEBUGINFOD_URLS");  // (belt and braces: no separate debug file is looked up at all)
  if (options.pid <= 0) {
    err << "ncclwatch stacks-of: PID must be a positive process id\n";
    return 2;
  }
  if (options.waitForGo) {
    char go = 0;
    while (read(STDIN_FILENO, &go, 1) < 0 && errno == EINTR) {
    }
  }
  trace::Dump dump;
  std::string why;
  if (!takeRemoteStacks(options, &dump, &why)) {
    err << "ncclwatch stacks-of: " << why << "\n";
    return 3;
  }
  out << trace::formatDump(dump);
  out.flush();
  return out ? 0 : 3;
}

}  // namespace ncclwatch::stacks_of
