#include "watchdog/triggers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace ncclwatch::watchdog {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE};

std::atomic<int> g_readFd{-1};
std::atomic<int> g_writeFd{-1};
std::atomic<pid_t> g_ownerPid{0};  // the process whose watchdog answers; 0 when none
std::atomic<trace::RingWriter*> g_writer{nullptr};
std::atomic<uint64_t> g_requested{0};
std::atomic<uint64_t> g_completed{0};
std::atomic<int> g_trigger{0};  // of the newest request
std::atomic<int> g_signal{0};
std::atomic<int> g_waitMs{3000};
std::atomic<int> g_dumpSignal{0};
std::atomic<int> g_watchdogTid{0};
// The dump a SIGTERM or fatal signal asked for, per signal: only the first of each asks for one
// (a launcher's repeated SIGTERM, a program that recovers from its own faults); later ones
// wait for that dump's end at most (its deadline, CLOCK_MONOTONIC) and then go on at once.
std::atomic<uint64_t> g_onceGeneration[65];
std::atomic<int64_t> g_onceDeadlineNs[65];
bool g_handlersInstalled = false;  // once per address space: a fork child keeps them
struct sigaction g_previous[65];

bool watchdogHere() {
  return g_ownerPid.load(std::memory_order_acquire) == getpid();
}

uint64_t request(DumpTrigger trigger, int signal) {
  g_trigger.store(static_cast<int>(trigger), std::memory_order_relaxed);
  g_signal.store(signal, std::memory_order_relaxed);
  uint64_t generation = g_requested.fetch_add(1, std::memory_order_acq_rel) + 1;
  Triggers::wake();
  return generation;
}

// Sleeps in 1 ms steps (nanosleep is async-signal-safe) until the dump answering `generation`
// is done or `waitMs` passed.
bool waitFor(uint64_t generation, int waitMs) {
  for (int waited = 0; waited < waitMs; ++waited) {
    if (g_completed.load(std::memory_order_acquire) >= generation) return true;
    timespec step{0, 1000000};
    nanosleep(&step, nullptr);
  }
  return g_completed.load(std::memory_order_acquire) >= generation;
}

int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// True when a program handler (not SIG_DFL or SIG_IGN) was there before ours.
bool programHandles(int signal) {
  const struct sigaction& previous = g_previous[signal];
  return (previous.sa_flags & SA_SIGINFO)
             ? previous.sa_sigaction != nullptr
             : (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN);
}

// Asks for the dump of the first SIGTERM (or fatal signal) and waits for it; a later one only
// waits for what is left of that first dump's time. The watchdog thread itself never waits.
void dumpOnce(int signal, DumpTrigger trigger) {
  constexpr uint64_t kClaimed = UINT64_MAX;  // the first one is still asking
  int waitMs = g_waitMs.load(std::memory_order_relaxed);
  bool watchdogThread = syscall(SYS_gettid) == g_watchdogTid.load(std::memory_order_relaxed);
  uint64_t first = 0;
  if (g_onceGeneration[signal].compare_exchange_strong(first, kClaimed,
                                                       std::memory_order_acq_rel)) {
    g_onceDeadlineNs[signal].store(monotonicNs() + int64_t{waitMs} * 1'000'000,
                                   std::memory_order_release);
    uint64_t generation = request(trigger, signal);
    g_onceGeneration[signal].store(generation, std::memory_order_release);
    if (!watchdogThread) waitFor(generation, waitMs);
    return;
  }
  for (int spins = 0; first == kClaimed && spins < 100; ++spins) {
    timespec step{0, 1000000};
    nanosleep(&step, nullptr);
    first = g_onceGeneration[signal].load(std::memory_order_acquire);
  }
  int64_t leftMs =
      (g_onceDeadlineNs[signal].load(std::memory_order_acquire) - monotonicNs()) / 1'000'000;
  if (!watchdogThread && first != kClaimed && leftMs > 0) waitFor(first, static_cast<int>(leftMs));
}

// Behaves as the process would have without us.
void chain(int signal, siginfo_t* info, void* context) {
  struct sigaction& previous = g_previous[signal];
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler == SIG_IGN) return;
  if (previous.sa_handler == SIG_DFL) {
    // Restore the default and raise again: the signal is blocked inside this handler, so it is
    // delivered as the handler returns, with the default action (exit status, core dump).
    sigaction(signal, &previous, nullptr);
    syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), signal);
    return;
  }
  previous.sa_handler(signal);
}

void onSignal(int signal, siginfo_t* info, void* context) {
  int savedErrno = errno;
  // A page of our own trace file that the disk can no longer back: repaired, and the store
  // that faulted runs again. Not the program's crash.
  if (signal == SIGBUS && info != nullptr && trace::RingWriter::recoverFault(info->si_addr)) {
    errno = savedErrno;
    return;
  }
  if (watchdogHere()) {
    if (signal == g_dumpSignal.load(std::memory_order_relaxed)) {
      request(DumpTrigger::kSignal, signal);
      // The dump signal is ours to take; a previous handler still sees it.
      if (programHandles(signal)) chain(signal, info, context);
      errno = savedErrno;
      return;
    }
    bool fatal = signal != SIGTERM;
    trace::RingWriter* writer = g_writer.load(std::memory_order_acquire);
    if (fatal && writer != nullptr) {
      writer->noteFatalSignal(signal, static_cast<int>(syscall(SYS_gettid)));
    }
    dumpOnce(signal, fatal ? DumpTrigger::kFatalSignal : DumpTrigger::kSigterm);
    // A program handler that returns handled its own fault (a guard page it opened): the
    // process lives on, and its trace must not say it died of the signal.
    bool survives = fatal && programHandles(signal);
    chain(signal, info, context);
    if (survives && writer != nullptr) writer->noteFatalSignal(0, 0);
    errno = savedErrno;
    return;
  }
  chain(signal, info, context);
  errno = savedErrno;
}

bool installHandler(int signal) {
  struct sigaction action {};
  action.sa_sigaction = onSignal;
  // SA_ONSTACK: a stack overflow still gets its dump on the alternate stack if the thread has
  // one. The stack-capture signal stays unblocked, so a thread waiting here still answers.
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&action.sa_mask);
  return sigaction(signal, &action, &g_previous[signal]) == 0;
}

}  // namespace

const char* triggerName(DumpTrigger trigger) {
  switch (trigger) {
    case DumpTrigger::kNone:
      return "none";
    case DumpTrigger::kSigterm:
      return "sigterm";
    case DumpTrigger::kFatalSignal:
      return "fatal-signal";
    case DumpTrigger::kSignal:
      return "signal";
    case DumpTrigger::kRequest:
      return "request";
  }
  return "?";
}

bool Triggers::install(trace::RingWriter* writer, const TriggerOptions& options) {
  if (watchdogHere()) return true;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  g_readFd.store(fds[0]);
  g_writeFd.store(fds[1]);
  g_writer.store(writer, std::memory_order_release);
  g_waitMs.store(options.waitMs);
  g_dumpSignal.store(options.dumpSignal);
  g_ownerPid.store(getpid(), std::memory_order_release);
  if (g_handlersInstalled) return true;  // a fork child: the parent's handlers serve it
  g_handlersInstalled = true;
  bool ok = true;
  if (options.sigterm) ok &= installHandler(SIGTERM);
  if (options.fatalSignals) {
    for (int signal : kFatalSignals) ok &= installHandler(signal);
  }
  if (options.dumpSignal > 0 && options.dumpSignal < 65) ok &= installHandler(options.dumpSignal);
  return ok;
}

void Triggers::setWatchdogThread(int tid) {
  g_watchdogTid.store(tid, std::memory_order_relaxed);
}

int Triggers::wakeFd() {
  return g_readFd.load();
}

void Triggers::drainWake() {
  char buffer[64];
  while (read(g_readFd.load(), buffer, sizeof buffer) > 0) {
  }
}

void Triggers::wake() {
  int fd = g_writeFd.load(std::memory_order_relaxed);
  if (fd < 0) return;
  char byte = 1;
  ssize_t ignored = write(fd, &byte, 1);  // a full pipe already means "wake up"
  (void)ignored;
}

DumpTrigger Triggers::pending(int* signal, uint64_t* generation) {
  uint64_t requested = g_requested.load(std::memory_order_acquire);
  if (requested <= g_completed.load(std::memory_order_acquire)) return DumpTrigger::kNone;
  *generation = requested;
  *signal = g_signal.load(std::memory_order_relaxed);
  return static_cast<DumpTrigger>(g_trigger.load(std::memory_order_relaxed));
}

void Triggers::done(uint64_t generation) {
  uint64_t completed = g_completed.load(std::memory_order_relaxed);
  while (completed < generation &&
         !g_completed.compare_exchange_weak(completed, generation, std::memory_order_acq_rel)) {
  }
}

bool Triggers::requestAndWait(int waitMs) {
  if (!watchdogHere()) return false;
  return waitFor(request(DumpTrigger::kRequest, 0), waitMs);
}

void Triggers::forgetAfterFork() {
  // Handlers stay installed (they were the parent's choice too) but chain at once: no watchdog
  // answers in this process until it starts its own.
  g_ownerPid.store(0, std::memory_order_release);
  g_watchdogTid.store(0, std::memory_order_relaxed);
  for (auto& generation : g_onceGeneration) generation.store(0, std::memory_order_relaxed);
}

}  // namespace ncclwatch::watchdog
