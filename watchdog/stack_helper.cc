#include "watchdog/stack_helper.h"

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

#include "watchdog/sidecar.h"

extern char** environ;

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

namespace ncclwatch::watchdog {
namespace {

constexpr size_t kMaxOutput = 16u << 20;  // a dump of 512 threads x 64 frames fits well
constexpr size_t kMaxError = 4096;

// The child's stack until it calls execve; only the watchdog thread spawns, one at a time.
alignas(64) char g_childStack[64 * 1024];

struct ChildSetup {
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int in = -1, out = -1, err = -1;  // all >= 3, close-on-exec
  int execError = 0;                // written by the child, which shares our memory
};

// Runs in the child, on g_childStack, sharing the parent's memory while the parent thread waits
// (CLONE_VFORK): system calls only. Every signal is blocked (the parent blocked them before
// clone), so no host handler can run here; execve resets the handlers, the helper unblocks.
__attribute__((no_sanitize("address", "thread", "undefined"))) int childMain(void* argument) {
  auto* setup = static_cast<ChildSetup*>(argument);
  if (syscall(SYS_dup3, setup->in, STDIN_FILENO, 0) < 0 ||
      syscall(SYS_dup3, setup->out, STDOUT_FILENO, 0) < 0 ||
      syscall(SYS_dup3, setup->err, STDERR_FILENO, 0) < 0) {
    setup->execError = EBADF;
    syscall(SYS_exit, 127);
  }
#ifdef SYS_close_range
  // The host's other descriptors stay out of the helper (best effort: Linux >= 5.9).
  syscall(SYS_close_range, 3u, ~0u, 0u);
#endif
  syscall(SYS_execve, setup->path, setup->argv, setup->envp);
  // errno here is the waiting parent thread's (same memory, same thread pointer); it restores it.
  setup->execError = errno != 0 ? errno : ENOEXEC;
  syscall(SYS_exit, 127);
  return 127;
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

std::vector<char*> pointers(std::vector<std::string>& words) {
  std::vector<char*> result;
  for (std::string& word : words) result.push_back(word.data());
  result.push_back(nullptr);
  return result;
}

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
  StackHelperSetup setup;
  const char* cli = std::getenv("NCCLWATCH_CLI");
  if (cli != nullptr && *cli != '\0') {
    setup.cli = cli;
  } else if (std::string library = ownLibraryPath(); !library.empty()) {
    setup.cli = cliBesideLibrary(library);
  }
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
  auto deadline = std::chrono::steady_clock::now() + bound;
  Pipe in, out, err;
  if (!in.open() || !out.open() || !err.open()) {
    *why = std::string("no pipe for the helper: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::string> arguments = {setup.cli, "stacks-of", std::to_string(getpid()),
                                        "--wait-go"};
  std::vector<std::string> environment = setup.environment;
  std::vector<char*> argv = pointers(arguments);
  std::vector<char*> envp = pointers(environment);
  ChildSetup child;
  child.path = setup.cli.c_str();
  child.argv = argv.data();
  child.envp = envp.data();
  child.in = in.read;
  child.out = out.write;
  child.err = err.write;

  int savedErrno = errno;
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  // No exit signal: the host sees no SIGCHLD and no child of its own in waitpid(-1).
  pid_t pid = clone(childMain, g_childStack + sizeof g_childStack, CLONE_VM | CLONE_VFORK, &child);
  int cloneErrno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = savedErrno;
  if (pid < 0) {
    *why = std::string("cannot start the helper: ") + std::strerror(cloneErrno);
    return false;
  }
  if (child.execError != 0) {
    waitpid(pid, nullptr, __WALL);
    *why = "cannot run " + setup.cli + ": " + std::strerror(child.execError) +
           " (NCCLWATCH_CLI names the ncclwatch binary)";
    return false;
  }
  in.closeRead();
  out.closeWrite();
  err.closeWrite();
  // Yama's default scope lets a process trace its descendants only; the helper is our child, but
  // it traces its parent. Name it as our tracer for the time of the dump.
  bool namedTracer = yamaScopeIsOne() && prctl(PR_SET_PTRACER, pid, 0, 0, 0) == 0;
  char go = 'g';
  ssize_t ignored = write(in.write, &go, 1);
  (void)ignored;
  in.closeWrite();

  std::string text, errorText;
  bool finished = drain(out.read, err.read, deadline, &text, &errorText);
  if (!finished) kill(pid, SIGKILL);  // the kernel detaches every thread it still holds
  int status = 0;
  pid_t reaped = -1;
  do {
    reaped = waitpid(pid, &status, __WALL);
  } while (reaped < 0 && errno == EINTR);
  if (namedTracer) prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  errno = savedErrno;

  if (!finished) {
    *why = "the helper took longer than " + std::to_string(bound.count()) + " ms (killed)";
    return false;
  }
  bool exitedZero = reaped != pid || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!exitedZero || text.empty()) {
    *why = errorText.empty() ? "the helper ended with status " +
                                   std::to_string(WIFEXITED(status) ? WEXITSTATUS(status)
                                                                    : 128 + WTERMSIG(status))
                             : firstLineOf(errorText);
    return false;
  }
  trace::Dump remote;
  std::string problem;
  if (!trace::parseDump(text, &remote, &problem)) {
    *why = "unreadable helper output: " + problem;
    return false;
  }
  *threads = std::move(remote.threads);
  return true;
}

}  // namespace ncclwatch::watchdog
