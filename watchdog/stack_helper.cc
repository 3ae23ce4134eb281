#include "watchdog/stack_helper.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "watchdog/sidecar.h"
#include "watchdog/spawn_process.h"

extern char** environ;

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

namespace ncclwatch::watchdog {
namespace {

constexpr size_t kMaxOutput = 16u << 20;  // a dump of 512 threads x 64 frames fits well
constexpr size_t kMaxError = 4096;

// Stacks of the two short-lived processes below until the helper calls execve; only the
// watchdog thread spawns, one helper at a time.
alignas(64) char g_middleStack[16 * 1024];
alignas(64) char g_helperStack[64 * 1024];

using CloneFunction = int (*)(int (*)(void*), void*, int, void*, ...);

// glibc's own clone, not a sanitizer's interceptor of it: TSan's runs its fork bookkeeping in the
// child, which here shares our memory, and so corrupts the runtime's state in the parent.
CloneFunction libcClone() {
  static const CloneFunction found = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void* symbol = libc != nullptr ? dlsym(libc, "clone") : nullptr;
    return symbol != nullptr ? reinterpret_cast<CloneFunction>(symbol) : &::clone;
  }();
  return found;
}

struct ChildSetup {
  CloneFunction clone = nullptr;
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int in = -1, out = -1, err = -1;  // all >= 3, close-on-exec
  // Written by the children, which share our memory until the helper's execve.
  pid_t helper = 0;
  int spawnError = 0;
};

// The helper itself, before execve: system calls only. Every signal is blocked (the parent
// blocked them before the first clone), so no host handler can run here; execve resets the
// handlers and the helper unblocks the signals.
__attribute__((no_sanitize("address", "thread", "undefined"))) int helperMain(void* argument) {
  auto* setup = static_cast<ChildSetup*>(argument);
  if (syscall(SYS_dup3, setup->in, STDIN_FILENO, 0) < 0 ||
      syscall(SYS_dup3, setup->out, STDOUT_FILENO, 0) < 0 ||
      syscall(SYS_dup3, setup->err, STDERR_FILENO, 0) < 0) {
    setup->spawnError = EBADF;
    syscall(SYS_exit, 127);
  }
#ifdef SYS_close_range
  // The host's other descriptors stay out of the helper (best effort: Linux >= 5.9).
  syscall(SYS_close_range, 3u, ~0u, 0u);
#endif
  syscall(SYS_execve, setup->path, setup->argv, setup->envp);
  // errno here is the waiting parent thread's (same memory, same thread pointer); it restores it.
  setup->spawnError = errno != 0 ? errno : ENOEXEC;
  syscall(SYS_exit, 127);
  return 127;
}

// The middle process: starts the helper and exits at once, so that the helper is not our child.
// A child that calls execve gets SIGCHLD as its exit signal whatever clone said, and a SIGCHLD,
// even one the host ignores by default, ends the host's epoll_wait with EINTR while the
// watchdog thread blocks it. This middle process never calls execve and has no exit signal;
// the helper's SIGCHLD goes to whoever adopts it (init or a subreaper).
__attribute__((no_sanitize("address", "thread", "undefined"))) int middleMain(void* argument) {
  auto* setup = static_cast<ChildSetup*>(argument);
  pid_t helper =
      setup->clone(helperMain, g_helperStack + sizeof g_helperStack, CLONE_VM | CLONE_VFORK, setup);
  if (helper < 0) {
    setup->spawnError = errno;
  } else {
    setup->helper = helper;
  }
  syscall(SYS_exit, 0);
  return 0;
}

// A pipe end numbered 3 or more (a host may have closed 0-2), close-on-exec.
int highFd(int fd) {
  if (fd < 0 || fd > STDERR_FILENO) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  close(fd);
  return moved;
}

struct Pipe {
  int read = -1, write = -1;
  bool open() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    read = highFd(fds[0]);
    write = highFd(fds[1]);
    return read >= 0 && write >= 0;
  }
  void closeRead() {
    if (read >= 0) close(read);
    read = -1;
  }
  void closeWrite() {
    if (write >= 0) close(write);
    write = -1;
  }
  ~Pipe() {
    closeRead();
    closeWrite();
  }
};

bool yamaScopeIsOne() {
  int fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[4] = {};
  ssize_t got = ::read(fd, text, sizeof text - 1);
  close(fd);
  return got > 0 && text[0] == '1';
}

// Reads both pipes until end of input on both, or the deadline. False on timeout.
bool drain(int outFd, int errFd, std::chrono::steady_clock::time_point deadline, std::string* out,
           std::string* err) {
  pollfd fds[2] = {{outFd, POLLIN, 0}, {errFd, POLLIN, 0}};
  char buffer[65536];
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    int ready = poll(fds, 2, static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno != EINTR) return false;
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t got = ::read(fds[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds[i].fd = -1;
        continue;
      }
      std::string* text = i == 0 ? out : err;
      size_t room = (i == 0 ? kMaxOutput : kMaxError) -
                    std::min(text->size(), i == 0 ? kMaxOutput : kMaxError);
      text->append(buffer, std::min(room, static_cast<size_t>(got)));
    }
  }
  return true;
}

std::string firstLineOf(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  constexpr char kPrefix[] = "ncclwatch stacks-of: ";
  if (line.rfind(kPrefix, 0) == 0) line.erase(0, sizeof kPrefix - 1);
  return line;
}

// Starts `setup.cli stacks-of <our pid> --wait-go` as a grandchild whose parent exits at once
// (see middleMain). Returns its pid, or 0 with `why`.
pid_t spawnHelper(const StackHelperSetup& setup, int in, int out, int err, std::string* why) {
  std::vector<std::string> arguments = {setup.cli, "stacks-of", std::to_string(getpid()),
                                        "--wait-go"};
  std::vector<std::string> environment = setup.environment;
  std::vector<char*> argv = spawnPointers(arguments);
  std::vector<char*> envp = spawnPointers(environment);
  ChildSetup child;
  child.clone = libcClone();
  child.path = setup.cli.c_str();
  child.argv = argv.data();
  child.envp = envp.data();
  child.in = in;
  child.out = out;
  child.err = err;
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  // Exit signal 0: the middle process's end sends nothing and a host's waitpid(-1) never sees it
  // (only __WALL does, below).
  pid_t middle =
      child.clone(middleMain, g_middleStack + sizeof g_middleStack, CLONE_VM | CLONE_VFORK, &child);
  int cloneErrno = errno;
  if (middle > 0) {
    while (waitpid(middle, nullptr, __WALL) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (middle < 0 || child.helper <= 0) {
    *why = std::string("cannot start the helper: ") +
           std::strerror(middle < 0 ? cloneErrno : child.spawnError);
    return 0;
  }
  if (child.spawnError != 0) {
    *why = "cannot run " + setup.cli + ": " + std::strerror(child.spawnError) +
           " (NCCLWATCH_CLI names the ncclwatch binary)";
    return 0;
  }
  return child.helper;
}

// One byte that lets the helper attach. A helper already gone makes the write fail with EPIPE and
// raise SIGPIPE on this thread: blocked here, and taken back before the mask is restored.
void sendGo(int fd) {
  sigset_t pipeSignal, previous;
  sigemptyset(&pipeSignal);
  sigaddset(&pipeSignal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous);
  char go = 'g';
  if (write(fd, &go, 1) < 0 && errno == EPIPE) {
    timespec none{};
    sigtimedwait(&pipeSignal, nullptr, &none);
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

bool parseStackRoute(const char* text, StackRoute* route) {
  if (std::strcmp(text, "auto") == 0) {
    *route = StackRoute::kAuto;
  } else if (std::strcmp(text, "ptrace") == 0) {
    *route = StackRoute::kPtrace;
  } else if (std::strcmp(text, "signal") == 0) {
    *route = StackRoute::kSignal;
  } else {
    return false;
  }
  return true;
}

StackHelperSetup stackHelperFromEnvironment() {
  libcClone();  // looked up now, on the application thread, rather than at dump time
  StackHelperSetup setup;
  const char* cli = std::getenv("NCCLWATCH_CLI");
  setup.cli = helperProgram(cli != nullptr ? cli : "");
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text = *entry;
    if (text.rfind("DEBUGINFOD_URLS=", 0) == 0) continue;
    if (text.rfind("LD_PRELOAD=", 0) == 0) {
      std::string kept = withoutOurPreload(text.substr(std::strlen("LD_PRELOAD=")));
      if (!kept.empty()) setup.environment.push_back("LD_PRELOAD=" + kept);
      continue;
    }
    setup.environment.push_back(std::move(text));
  }
  return setup;
}

bool takeStacksThroughHelper(const StackHelperSetup& setup, std::chrono::milliseconds bound,
                             std::vector<trace::DumpThread>* threads, std::string* why) {
  if (setup.cli.empty()) {
    *why = "cannot tell where libncclwatch.so was loaded from (set NCCLWATCH_CLI)";
    return false;
  }
  // One helper at a time: the two children's stacks are static (a test may dump from several
  // threads; the agent dumps from its watchdog thread only).
  static std::mutex oneAtATime;
  std::lock_guard<std::mutex> lock(oneAtATime);
  auto deadline = std::chrono::steady_clock::now() + bound;
  Pipe in, out, err;
  if (!in.open() || !out.open() || !err.open()) {
    *why = std::string("no pipe for the helper: ") + std::strerror(errno);
    return false;
  }
  int savedErrno = errno;
  pid_t helper = spawnHelper(setup, in.read, out.write, err.write, why);
  in.closeRead();
  out.closeWrite();
  err.closeWrite();
  if (helper <= 0) {
    errno = savedErrno;
    return false;
  }
  // Not our child: its exit cannot be waited for, only seen through a pidfd (Linux >= 5.3).
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, helper, 0));
  // Yama's default scope lets a process be traced by its ancestors only. Name the helper as our
  // tracer for the time of the dump.
  bool namedTracer = yamaScopeIsOne() && prctl(PR_SET_PTRACER, helper, 0, 0, 0) == 0;
  sendGo(in.write);
  in.closeWrite();

  std::string text, errorText;
  bool finished = drain(out.read, err.read, deadline, &text, &errorText);
  if (!finished) {
    // The kernel detaches every thread the helper still holds as it dies; wait for that.
    if (pidfd >= 0) {
      syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      pollfd exited{pidfd, POLLIN, 0};
      poll(&exited, 1, 500);
    } else {
      kill(helper, SIGKILL);  // its pipes are still open: it has not exited, the pid is its own
    }
  }
  if (pidfd >= 0) close(pidfd);
  if (namedTracer) prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  errno = savedErrno;

  if (!finished) {
    *why = "the helper took longer than " + std::to_string(bound.count()) + " ms (killed)";
    return false;
  }
  trace::Dump remote;
  std::string problem;
  if (text.empty()) {
    *why = errorText.empty() ? "the helper ended without output" : firstLineOf(errorText);
    return false;
  }
  if (!trace::parseDump(text, &remote, &problem)) {
    *why = "unreadable helper output: " + problem;
    return false;
  }
  *threads = std::move(remote.threads);
  return true;
}

}  // namespace ncclwatch::watchdog
