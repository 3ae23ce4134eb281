// One process that forks and execs while recorded: the parent makes a 1-rank communicator and 3
// allreduces, forks a child that makes its own communicator and 5 allreduces and _exit()s, makes
// 2 more allreduces once the child is gone, then spawns itself with --exec-child, which makes a
// communicator and 7 allreduces. Each process prints "<role> pid=<pid>" (parent, fork-child,
// exec-child) so that a test can tell the trace files apart.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

extern char** environ;

namespace {

constexpr size_t kCount = 16;

bool failed(const char* what) {
  std::fprintf(stderr, "fork_probe[%d]: %s failed\n", static_cast<int>(getpid()), what);
  return false;
}

void say(const char* role) {
  std::printf("%s pid=%d\n", role, static_cast<int>(getpid()));
  std::fflush(stdout);  // before any fork: the child must not print the parent's buffer again
}

// A 1-rank communicator of this process on device 0, with a buffer.
bool openComm(ncclComm_t* comm, float** buffer) {
  ncclUniqueId id;
  if (cudaSetDevice(0) != cudaSuccess) return failed("cudaSetDevice");
  if (cudaMalloc(reinterpret_cast<void**>(buffer), kCount * sizeof(float)) != cudaSuccess)
    return failed("cudaMalloc");
  if (ncclGetUniqueId(&id) != ncclSuccess) return failed("ncclGetUniqueId");
  if (ncclCommInitRank(comm, 1, id, 0) != ncclSuccess) return failed("ncclCommInitRank");
  return true;
}

bool allReduces(ncclComm_t comm, float* buffer, int calls) {
  for (int i = 0; i < calls; ++i) {
    if (ncclAllReduce(buffer, buffer, kCount, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
      return failed("ncclAllReduce");
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return failed("cudaDeviceSynchronize");
  return true;
}

bool closeComm(ncclComm_t comm, float* buffer) {
  if (ncclCommDestroy(comm) != ncclSuccess) return failed("ncclCommDestroy");
  if (cudaFree(buffer) != cudaSuccess) return failed("cudaFree");
  return true;
}

// Threads of this process named "ncclwatch" (the preloaded library's watchdog).
int watchdogThreads() {
  int count = 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (dirent* task = readdir(tasks)) {
      if (task->d_name[0] == '.') continue;
      char path[96], name[32] = {};
      std::snprintf(path, sizeof path, "/proc/self/task/%s/comm", task->d_name);
      if (FILE* file = std::fopen(path, "r")) {
        if (std::fgets(name, sizeof name, file) != nullptr && std::strcmp(name, "ncclwatch\n") == 0)
          ++count;
        std::fclose(file);
      }
    }
    closedir(tasks);
  }
  return count;
}

// A whole process's worth of calls: a communicator, `calls` allreduces, the end. Says how many
// watchdog threads ran before its first communicator and after it.
int alone(const char* role, int calls) {
  say(role);
  int before = watchdogThreads();
  ncclComm_t comm;
  float* buffer = nullptr;
  if (!openComm(&comm, &buffer)) return 1;
  // The watchdog names itself once it runs: give it up to 2 s.
  int after = 0;
  for (int waited = 0; waited < 200 && (after = watchdogThreads()) == 0; ++waited) usleep(10000);
  std::printf("%s watchdogs before=%d after=%d\n", role, before, after);
  std::fflush(stdout);
  return allReduces(comm, buffer, calls) && closeComm(comm, buffer) ? 0 : 1;
}

// Waits for a child; true if it exited with 0.
bool reaped(pid_t pid, const char* what) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return failed("waitpid");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "fork_probe: %s ended with status %d\n", what, status);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--exec-child") == 0) return alone("exec-child", 7);

  say("parent");
  ncclComm_t comm;
  float* buffer = nullptr;
  if (!openComm(&comm, &buffer) || !allReduces(comm, buffer, 3)) return 1;

  // Fork once the device's own threads are idle. A fork child may allocate only when no thread
  // held an allocator lock at the fork: glibc's malloc takes its locks around fork(), but GCC
  // 12's ASan runtime (and allocators such as mimalloc) do not, and the sim's stream workers free
  // the last calls' operations just after the synchronize returns (under ASan the child then
  // waited forever on a size class's lock: docs/ci.md, session 16). The preloaded watchdog thread
  // does not allocate while it polls.
  usleep(50'000);
  pid_t child = fork();
  if (child < 0) {
    failed("fork");
    return 1;
  }
  if (child == 0) _exit(alone("fork-child", 5));  // no exit handlers: _exit, as after a fork
  if (!reaped(child, "the fork child")) return 1;

  if (!allReduces(comm, buffer, 2)) return 1;

  char execChild[] = "--exec-child";
  char* childArgv[] = {argv[0], execChild, nullptr};
  pid_t spawned = 0;
  if (posix_spawn(&spawned, "/proc/self/exe", nullptr, nullptr, childArgv, environ) != 0) {
    failed("posix_spawn");
    return 1;
  }
  if (!reaped(spawned, "the exec child")) return 1;

  return closeComm(comm, buffer) ? 0 : 1;
}
