#include "watchdog/python_stacks.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace ncclwatch::watchdog {
namespace {

// The few C API entry points we use, all found by dlsym. PyObject* and friends are opaque here.
struct PyApi {
  int (*isInitialized)() = nullptr;
  const char* (*getVersion)() = nullptr;
  int (*addPendingCall)(int (*)(void*), void*) = nullptr;
  void* (*interpreterMain)() = nullptr;
  // _Py_DumpTracebackThreads(fd, interp, current_tstate): 3.8, 3.11, 3.12.
  const char* (*dumpThreads)(int, void*, void*) = nullptr;
  // PyUnstable_DumpTracebackThreads(fd, interp, current_tstate, max_threads): 3.15. Early 3.15
  // revisions had no max_threads; passing the extra argument to them is harmless (it lands in a
  // register the callee ignores on x86-64 and aarch64).
  const char* (*dumpThreadsUnstable)(int, void*, void*, intptr_t) = nullptr;
  void* (*importModule)(const char*) = nullptr;
  void* (*callMethod)(void*, const char*, const char*, ...) = nullptr;
  void (*decRef)(void*) = nullptr;
  void (*errClear)() = nullptr;
};

enum ArmState : int { kArmNone, kArmPending, kArmDone, kArmFailed };

constexpr intptr_t kMaxThreadsToDump = 100;  // CPython's own MAX_NTHREADS

struct State {
  std::mutex prepareMutex;
  std::atomic<pid_t> preparedPid{0};
  // Written before `route` is published (release) by prepare; read after it (acquire).
  std::atomic<PythonStackRoute> route{PythonStackRoute::kNotPython};
  PyApi api;
  const char* dumpName = "";
  void* interp = nullptr;  // PyInterpreterState_Main(), cached; nullptr lets CPython find it
  char version[32] = "unknown";
  char reason[200] = "";  // why kUnavailable
  int signal = 0;
  int fd = -1;  // faulthandler's output file (route 2)
  // Route 2 arming, done by the pending call on the main thread.
  std::atomic<int> arm{kArmNone};
  std::atomic<pid_t> mainTid{0};
  char armError[160] = "";
  unsigned sent = 0;  // signals the watchdog sent (under `dumping`)
  std::atomic<bool> dumping{false};
};

State& state() {
  static State* s = new State;  // never destroyed: a watchdog may dump during exit
  return *s;
}

// Counts the signals our completion handler saw from this process: faulthandler re-raises the
// signal (chain=True) once it has written every thread, which lands here.
std::atomic<unsigned> g_completions{0};
static_assert(std::atomic<unsigned>::is_always_lock_free);

void completionHandler(int, siginfo_t* info, void*) {
  const int savedErrno = errno;
  if (info != nullptr && info->si_code == SI_TKILL && info->si_pid == getpid()) {
    g_completions.fetch_add(1, std::memory_order_release);
  }
  errno = savedErrno;  // anything else (a stray signal) is dropped
}

bool isOurHandler(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == completionHandler;
}

bool isDefaultOrIgnored(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) == 0 &&
         (action.sa_handler == SIG_DFL || action.sa_handler == SIG_IGN);
}

template <typename Fn>
Fn lookup(const char* name, const void* pythonBase) {
  void* symbol = dlsym(RTLD_DEFAULT, name);
  if (symbol == nullptr) return nullptr;
  // Only take it from the same object as Py_IsInitialized (two Pythons in one process: rare).
  Dl_info info{};
  if (pythonBase != nullptr && dladdr(symbol, &info) != 0 && info.dli_fbase != pythonBase) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(symbol);
}

// An anonymous file that never blocks the writer: memfd, else an unlinked tmpfile.
int makeOutputFile() {
  int fd = memfd_create("ncclwatch-pystacks", MFD_CLOEXEC);
  if (fd >= 0) return fd;
  for (const char* dir : {"/dev/shm", "/tmp"}) {
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
  }
  return -1;
}

bool rewind(int fd) {
  return ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0;
}

// Reads the file from offset 0 into `out`, at most maxBytes, cut at the last complete line.
void readBack(int fd, size_t maxBytes, std::string* out) {
  out->clear();
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return;
  const size_t size = static_cast<size_t>(st.st_size);
  const bool truncated = size > maxBytes;
  out->resize(truncated ? maxBytes : size);
  size_t got = 0;
  while (got < out->size()) {
    const ssize_t n = pread(fd, out->data() + got, out->size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out->resize(got);
  if (truncated || got < size) {
    const size_t lastNewline = out->rfind('\n');
    out->resize(lastNewline == std::string::npos ? 0 : lastNewline + 1);
  }
}

// Appends `line` + '\n' to `out` when it still fits in maxBytes.
void appendNote(std::string* out, size_t maxBytes, const std::string& line) {
  if (out->size() + line.size() + 1 <= maxBytes) {
    out->append(line);
    out->push_back('\n');
  }
}

PythonStackRoute unavailable(std::string* out, size_t maxBytes, const char* version,
                             const std::string& why) {
  std::string line = "Python stacks not available on this Python (";
  line += version;
  line += "): ";
  line += why;
  out->clear();
  if (line.size() + 1 > maxBytes) line.resize(maxBytes > 0 ? maxBytes - 1 : 0);
  if (maxBytes > 0) {
    out->append(line);
    out->push_back('\n');
  }
  return PythonStackRoute::kUnavailable;
}

// Runs on the main thread with the GIL held (Py_AddPendingCall): registers faulthandler on our
// signal, writing to our file, for all threads, chaining to our completion handler.
int armFaulthandler(void*) {
  State& s = state();
  if (s.preparedPid.load() != getpid() || s.arm.load() != kArmPending) return 0;
  s.mainTid.store(static_cast<pid_t>(syscall(SYS_gettid)));
  const PyApi& api = s.api;
  void* module = api.importModule("faulthandler");
  if (module == nullptr) {
    api.errClear();
    std::snprintf(s.armError, sizeof(s.armError), "import faulthandler failed");
    s.arm.store(kArmFailed, std::memory_order_release);
    return 0;
  }
  // register(signum, file, all_threads, chain); `file` may be a file descriptor.
  void* result = api.callMethod(module, "register", "iiii", s.signal, s.fd, 1, 1);
  api.decRef(module);
  if (result == nullptr) {
    api.errClear();
    std::snprintf(s.armError, sizeof(s.armError), "faulthandler.register(%d, fd %d) failed",
                  s.signal, s.fd);
    s.arm.store(kArmFailed, std::memory_order_release);
    return 0;
  }
  api.decRef(result);
  s.arm.store(kArmDone, std::memory_order_release);
  return 0;  // never raise into the application
}

// Prepares route 2; on failure returns false with s.reason set.
bool prepareFaulthandler(State& s, int signalNumber, bool inheritedArm) {
  if (s.api.addPendingCall == nullptr || s.api.importModule == nullptr ||
      s.api.callMethod == nullptr || s.api.decRef == nullptr || s.api.errClear == nullptr) {
    std::snprintf(s.reason, sizeof(s.reason),
                  "no exported traceback dumper, and the C API for faulthandler is missing");
    return false;
  }
  struct sigaction current {};
  if (sigaction(signalNumber, nullptr, &current) != 0) {
    std::snprintf(s.reason, sizeof(s.reason), "bad faulthandler signal %d", signalNumber);
    return false;
  }
  // Free, ours already, or faulthandler's inherited from our prepared parent: else in use.
  if (!isDefaultOrIgnored(current) && !isOurHandler(current) && !inheritedArm) {
    std::snprintf(s.reason, sizeof(s.reason),
                  "signal %d already has a handler; configure another real-time signal",
                  signalNumber);
    return false;
  }
  if (!isOurHandler(current) && !inheritedArm) {
    struct sigaction ours {};
    ours.sa_sigaction = completionHandler;
    ours.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(signalNumber, &ours, nullptr) != 0) {
      std::snprintf(s.reason, sizeof(s.reason), "sigaction(%d) failed: %s", signalNumber,
                    std::strerror(errno));
      return false;
    }
  }
  if (s.fd >= 0) close(s.fd);  // a forked child gets a file of its own
  s.fd = makeOutputFile();
  if (s.fd < 0) {
    std::snprintf(s.reason, sizeof(s.reason), "cannot create an output file: %s",
                  std::strerror(errno));
    return false;
  }
  s.signal = signalNumber;
  s.armError[0] = '\0';
  s.mainTid.store(0);
  s.arm.store(kArmPending);
  if (s.api.addPendingCall(armFaulthandler, nullptr) != 0) {
    s.arm.store(kArmFailed);
    std::snprintf(s.reason, sizeof(s.reason), "Py_AddPendingCall failed (queue full)");
    return false;
  }
  return true;
}

PythonStackRoute dumpWithFunction(State& s, std::string* out, size_t maxBytes) {
  if (s.api.isInitialized() == 0) {
    return unavailable(out, maxBytes, s.version, "the interpreter is finalized");
  }
  const int fd = makeOutputFile();
  if (fd < 0) {
    return unavailable(out, maxBytes, s.version,
                       std::string("cannot create an output file: ") + std::strerror(errno));
  }
  const char* error = s.api.dumpThreadsUnstable != nullptr
                          ? s.api.dumpThreadsUnstable(fd, s.interp, nullptr, kMaxThreadsToDump)
                          : s.api.dumpThreads(fd, s.interp, nullptr);
  readBack(fd, maxBytes, out);
  close(fd);
  if (error != nullptr) {
    const std::string why = std::string(s.dumpName) + " failed: " + error;
    if (out->empty()) return unavailable(out, maxBytes, s.version, why);
    appendNote(out, maxBytes, why);
  }
  return PythonStackRoute::kDumpTracebackThreads;
}

PythonStackRoute dumpWithFaulthandler(State& s, std::string* out, size_t maxBytes,
                                      std::chrono::milliseconds timeout) {
  const int arm = s.arm.load(std::memory_order_acquire);
  if (arm == kArmPending) {
    return unavailable(out, maxBytes, s.version,
                       "faulthandler is not armed yet (the main thread has not run Python code "
                       "since the first communicator init)");
  }
  if (arm != kArmDone) {
    return unavailable(out, maxBytes, s.version, std::string("arming faulthandler: ") + s.armError);
  }
  struct sigaction current {};
  if (sigaction(s.signal, nullptr, &current) != 0 || isDefaultOrIgnored(current)) {
    // Sending it now could end the process.
    return unavailable(out, maxBytes, s.version,
                       "signal " + std::to_string(s.signal) + " lost its handler");
  }
  if (isOurHandler(current)) {
    return unavailable(out, maxBytes, s.version,
                       "faulthandler was unregistered from signal " + std::to_string(s.signal));
  }
  if (g_completions.load(std::memory_order_acquire) < s.sent) {
    // A late handler would write into this dump's file: do not send another.
    return unavailable(out, maxBytes, s.version,
                       "the main thread has not run the previous faulthandler dump yet (it "
                       "blocks signal " +
                           std::to_string(s.signal) + " or is stuck in the kernel)");
  }
  if (!rewind(s.fd)) {
    return unavailable(out, maxBytes, s.version,
                       std::string("cannot reset the output file: ") + std::strerror(errno));
  }
  const unsigned before = g_completions.load(std::memory_order_acquire);
  if (syscall(SYS_tgkill, getpid(), s.mainTid.load(), s.signal) != 0) {
    return unavailable(out, maxBytes, s.version,
                       std::string("cannot signal the main thread: ") + std::strerror(errno));
  }
  s.sent = std::max(s.sent, before) + 1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool done = false;
  while (!(done = g_completions.load(std::memory_order_acquire) != before) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  readBack(s.fd, maxBytes, out);
  if (!done) {
    const std::string why = "the main thread did not finish the faulthandler dump within " +
                            std::to_string(timeout.count()) + " ms";
    if (out->empty()) return unavailable(out, maxBytes, s.version, why);
    appendNote(out, maxBytes, "(incomplete: " + why + ")");
  }
  return PythonStackRoute::kFaulthandler;
}

// ---- parser ----

constexpr size_t kMaxParsedThreads = 4096;
constexpr size_t kMaxParsedFrames = 4096;

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool parseHeader(std::string_view line, uint64_t* id, bool* current) {
  constexpr std::string_view kTail = "(most recent call first)";
  if (startsWith(line, "Stack ") || startsWith(line, "Traceback ")) {
    if (line.find(kTail) == std::string_view::npos) return false;
    *id = 0;
    *current = true;
    return true;
  }
  if (startsWith(line, "Current thread 0x")) {
    line.remove_prefix(17);
    *current = true;
  } else if (startsWith(line, "Thread 0x")) {
    line.remove_prefix(9);
    *current = false;
  } else {
    return false;
  }
  uint64_t value = 0;
  size_t digits = 0;
  for (; digits < line.size(); ++digits) {
    const char c = line[digits];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      break;
    }
    if (digits >= 16) return false;
    value = (value << 4) | static_cast<uint64_t>(d);
  }
  if (digits == 0 || line.substr(digits).find(kTail) == std::string_view::npos) return false;
  *id = value;
  return true;
}

// '<digits or ???> in <function>' after '", line '.
bool parseLineAndFunction(std::string_view rest, PythonFrame* frame) {
  int lineNumber = -1;
  size_t i = 0;
  if (startsWith(rest, "???")) {
    i = 3;
  } else {
    int64_t value = 0;
    for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) {
      if (value <= INT32_MAX) value = value * 10 + (rest[i] - '0');
    }
    if (i == 0) return false;
    lineNumber = value <= INT32_MAX ? static_cast<int>(value) : -1;
  }
  rest.remove_prefix(i);
  if (!startsWith(rest, " in ")) return false;
  rest.remove_prefix(4);
  frame->line = lineNumber;
  frame->function.assign(rest);
  return true;
}

bool parseFrame(std::string_view line, PythonFrame* frame) {
  constexpr std::string_view kHead = "  File \"";
  constexpr std::string_view kSep = "\", line ";
  if (!startsWith(line, kHead)) return false;
  line.remove_prefix(kHead.size());
  // The file name is not escaped for quotes: try the last separator, then the first.
  for (size_t at : {line.rfind(kSep), line.find(kSep)}) {
    if (at == std::string_view::npos) return false;
    if (parseLineAndFunction(line.substr(at + kSep.size()), frame)) {
      frame->file.assign(line.substr(0, at));
      return true;
    }
  }
  return false;
}

}  // namespace

PythonStackRoute preparePythonStacks(int faulthandlerSignal) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.prepareMutex);
  const pid_t pid = getpid();
  const pid_t preparedPid = s.preparedPid.load();
  if (preparedPid == pid) return s.route.load(std::memory_order_acquire);
  // First call in this process (maybe a forked child of a prepared parent).
  const bool inheritedArm = preparedPid != 0 && s.arm.load() == kArmDone;
  const int signalNumber =
      faulthandlerSignal == 0 ? SIGRTMIN + kDefaultPythonSignalOffset : faulthandlerSignal;
  s.preparedPid.store(pid);
  s.reason[0] = '\0';

  auto publish = [&](PythonStackRoute route) {
    s.route.store(route, std::memory_order_release);
    return route;
  };

  auto* isInitialized = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  if (isInitialized == nullptr || isInitialized() == 0) {
    return publish(PythonStackRoute::kNotPython);
  }
  Dl_info info{};
  const void* base =
      dladdr(reinterpret_cast<void*>(isInitialized), &info) != 0 ? info.dli_fbase : nullptr;
  PyApi& api = s.api;
  api = PyApi{};
  api.isInitialized = isInitialized;
  api.getVersion = lookup<const char* (*)()>("Py_GetVersion", base);
  api.addPendingCall = lookup<int (*)(int (*)(void*), void*)>("Py_AddPendingCall", base);
  api.interpreterMain = lookup<void* (*)()>("PyInterpreterState_Main", base);
  api.dumpThreads = lookup<const char* (*)(int, void*, void*)>("_Py_DumpTracebackThreads", base);
  api.dumpThreadsUnstable =
      lookup<const char* (*)(int, void*, void*, intptr_t)>("PyUnstable_DumpTracebackThreads", base);
  api.importModule = lookup<void* (*)(const char*)>("PyImport_ImportModule", base);
  api.callMethod =
      lookup<void* (*)(void*, const char*, const char*, ...)>("PyObject_CallMethod", base);
  api.decRef = lookup<void (*)(void*)>("Py_DecRef", base);
  api.errClear = lookup<void (*)()>("PyErr_Clear", base);

  if (api.getVersion != nullptr) {
    // "3.11.7 (main, ...)": keep the first word.
    const char* full = api.getVersion();
    size_t n = 0;
    while (full != nullptr && full[n] != '\0' && full[n] != ' ' && n + 1 < sizeof(s.version)) {
      s.version[n] = full[n];
      ++n;
    }
    if (n > 0) s.version[n] = '\0';
  }
  // Reads the runtime's main interpreter pointer: no GIL needed.
  s.interp = api.interpreterMain != nullptr ? api.interpreterMain() : nullptr;
  s.dumpName = api.dumpThreadsUnstable != nullptr ? "PyUnstable_DumpTracebackThreads"
                                                  : "_Py_DumpTracebackThreads";

  const char* env = std::getenv("NCCLWATCH_PY_ROUTE");
  const std::string_view forced = env != nullptr ? env : "";
  if (forced == "off") {
    std::snprintf(s.reason, sizeof(s.reason), "disabled by NCCLWATCH_PY_ROUTE=off");
    return publish(PythonStackRoute::kUnavailable);
  }
  const bool haveDumper = api.dumpThreads != nullptr || api.dumpThreadsUnstable != nullptr;
  if (haveDumper && forced != "faulthandler") {
    return publish(PythonStackRoute::kDumpTracebackThreads);
  }
  if (forced == "dump") {
    std::snprintf(s.reason, sizeof(s.reason),
                  "no exported _Py_DumpTracebackThreads (NCCLWATCH_PY_ROUTE=dump)");
    return publish(PythonStackRoute::kUnavailable);
  }
  // The faulthandler route is opt-in: once, under load, CPython 3.9 crashed inside faulthandler's
  // signal handler while its main thread ran without the GIL, and a dump must never take the
  // host down.
  if (forced != "faulthandler") {
    std::snprintf(s.reason, sizeof(s.reason),
                  "it does not export _Py_DumpTracebackThreads; NCCLWATCH_PY_ROUTE=faulthandler "
                  "tries CPython's faulthandler instead (experimental)");
    return publish(PythonStackRoute::kUnavailable);
  }
  if (signalNumber < SIGRTMIN || signalNumber > SIGRTMAX) {
    std::snprintf(s.reason, sizeof(s.reason),
                  "faulthandler signal %d is not a real-time signal (%d..%d)", signalNumber,
                  SIGRTMIN, SIGRTMAX);
    return publish(PythonStackRoute::kUnavailable);
  }
  if (!prepareFaulthandler(s, signalNumber, inheritedArm && s.signal == signalNumber)) {
    return publish(PythonStackRoute::kUnavailable);
  }
  return publish(PythonStackRoute::kFaulthandler);
}

PythonStackRoute dumpPythonStacks(std::string* out, size_t maxBytes,
                                  std::chrono::milliseconds timeout) {
  out->clear();
  State& s = state();
  if (s.preparedPid.load() == 0) {
    return unavailable(out, maxBytes, "unknown version",
                       "not prepared (no communicator was initialized)");
  }
  const PythonStackRoute route = s.route.load(std::memory_order_acquire);
  if (route == PythonStackRoute::kNotPython) return route;
  if (route == PythonStackRoute::kUnavailable) {
    return unavailable(out, maxBytes, s.version, s.reason);
  }
  if (s.dumping.exchange(true, std::memory_order_acq_rel)) {
    return unavailable(out, maxBytes, s.version, "another Python stack dump is in progress");
  }
  PythonStackRoute result;
  if (route == PythonStackRoute::kDumpTracebackThreads) {
    result = dumpWithFunction(s, out, maxBytes);
  } else if (s.preparedPid.load() != getpid()) {
    result = unavailable(out, maxBytes, s.version,
                         "forked child: faulthandler was armed in the parent process");
  } else {
    result = dumpWithFaulthandler(s, out, maxBytes, timeout);
  }
  s.dumping.store(false, std::memory_order_release);
  return result;
}

std::vector<PythonThreadStack> parsePythonTraceback(std::string_view text) {
  std::vector<PythonThreadStack> threads;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t newline = text.find('\n', pos);
    std::string_view line = text.substr(
        pos, newline == std::string_view::npos ? std::string_view::npos : newline - pos);
    pos = newline == std::string_view::npos ? text.size() : newline + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

    uint64_t id = 0;
    bool current = false;
    if (parseHeader(line, &id, &current)) {
      if (threads.size() >= kMaxParsedThreads) break;
      PythonThreadStack& stack = threads.emplace_back();
      stack.threadId = id;
      stack.current = current;
      continue;
    }
    PythonFrame frame;
    if (!threads.empty() && threads.back().frames.size() < kMaxParsedFrames &&
        parseFrame(line, &frame)) {
      threads.back().frames.push_back(std::move(frame));
    }
  }
  return threads;
}

}  // namespace ncclwatch::watchdog
