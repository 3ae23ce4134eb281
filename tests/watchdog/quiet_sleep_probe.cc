// An NCCL program (one rank, on the sim) whose main thread sleeps in ONE call while another
// thread asks the watchdog for dumps (ncclwatchDump): the sleep must last its whole length and
// never end in EINTR when the dump takes stacks through ptrace.
//
//   quiet_sleep_probe --wait nanosleep|poll|epoll [--ms 5000] [--dumps 3] [--threads 8]
//                     [--not-dumpable 1]
//
// --not-dumpable makes ptrace of this process impossible for the helper: PR_SET_DUMPABLE 0, and
// (as root) CAP_SYS_PTRACE dropped from the bounding set, so that the helper it starts lacks it.
//
// Prints "slept <s> s in <wait>: <result>; dumps <ok>/<asked>" and exits 0 when the wait
// lasted its length without EINTR, 1 when it was cut short, 2 on a setup error.
#include <cuda_runtime_api.h>
#include <linux/capability.h>
#include <nccl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" int ncclwatchDump(int waitMs) __attribute__((weak));

namespace {

double monotonicSeconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

struct WaitResult {
  int returned = 0;
  int error = 0;
};

// Each wait is its own function so that the dump's stack of the main thread names it.
__attribute__((noinline)) WaitResult quietSleepInNanosleep(int ms) {
  timespec length{ms / 1000, (ms % 1000) * 1'000'000L};
  timespec left{};
  WaitResult result;
  result.returned = nanosleep(&length, &left);
  result.error = result.returned < 0 ? errno : 0;
  return result;
}

__attribute__((noinline)) WaitResult quietSleepInPoll(int ms) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, errno};
  pollfd never{fds[0], POLLIN, 0};
  WaitResult result;
  result.returned = poll(&never, 1, ms);
  result.error = result.returned < 0 ? errno : 0;
  close(fds[0]);
  close(fds[1]);
  return result;
}

__attribute__((noinline)) WaitResult quietSleepInEpoll(int ms) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, errno};
  int epoll = epoll_create1(0);
  epoll_event interest{};
  interest.events = EPOLLIN;
  epoll_ctl(epoll, EPOLL_CTL_ADD, fds[0], &interest);
  epoll_event ready{};
  WaitResult result;
  result.returned = epoll_wait(epoll, &ready, 1, ms);
  result.error = result.returned < 0 ? errno : 0;
  close(epoll);
  close(fds[0]);
  close(fds[1]);
  return result;
}

int fail(const char* what) {
  std::fprintf(stderr, "quiet_sleep_probe: %s\n", what);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string wait = "nanosleep";
  int ms = 5000, dumps = 3, idleThreads = 8;
  bool notDumpable = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--wait") {
      wait = argv[i + 1];
    } else if (name == "--ms") {
      ms = std::atoi(argv[i + 1]);
    } else if (name == "--dumps") {
      dumps = std::atoi(argv[i + 1]);
    } else if (name == "--threads") {
      idleThreads = std::atoi(argv[i + 1]);
    } else if (name == "--not-dumpable") {
      notDumpable = std::atoi(argv[i + 1]) != 0;
    } else {
      return fail("usage: --wait nanosleep|poll|epoll [--ms N] [--dumps N] [--threads N]");
    }
  }
  if (ncclwatchDump == nullptr) return fail("libncclwatch.so is not preloaded");
  if (notDumpable) {
    prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);  // EPERM when not root: not needed then
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return fail("PR_SET_DUMPABLE");
  }
  if (cudaSetDevice(0) != cudaSuccess) return fail("cudaSetDevice");
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    return fail("no communicator");
  }
  // Threads that wait on a condition of their own, as a real job's helper threads do.
  std::atomic<bool> done{false};
  std::vector<std::thread> idle;
  for (int i = 0; i < idleThreads; ++i) {
    idle.emplace_back([&done] {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
  }
  std::atomic<int> dumped{0};
  std::thread requester([&] {
    // Spread over the first 60% of the sleep, each one a full dump.
    for (int i = 0; i < dumps; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms * 6 / 10 / (dumps + 1)));
      double start = monotonicSeconds();
      bool ok = ncclwatchDump(4000) == 0;
      dumped += ok ? 1 : 0;
      std::printf("dump %d: %s in %.1f ms\n", i + 1, ok ? "written" : "FAILED",
                  (monotonicSeconds() - start) * 1e3);
    }
  });
  double start = monotonicSeconds();
  WaitResult result = wait == "poll"    ? quietSleepInPoll(ms)
                      : wait == "epoll" ? quietSleepInEpoll(ms)
                                        : quietSleepInNanosleep(ms);
  double slept = monotonicSeconds() - start;
  requester.join();
  done = true;
  for (std::thread& thread : idle) thread.join();
  ncclCommDestroy(comm);
  bool whole = slept >= ms / 1000.0 && result.error == 0;
  std::printf("slept %.3f s in %s: %s; dumps %d/%d\n", slept, wait.c_str(),
              result.error == 0 ? "no EINTR" : std::strerror(result.error), dumped.load(), dumps);
  return whole ? 0 : 1;
}
