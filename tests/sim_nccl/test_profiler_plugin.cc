// A minimal NCCL profiler plugin for tests: logs init/finalize arguments to $SIMTEST_PROFILER_LOG.
// Built twice: as a v5 plugin, and (SIMTEST_ONLY_V4) as one exporting only ncclProfiler_v4.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
typedef int Result;
typedef void (*Logger)(int, unsigned long, const char*, int, const char*, ...);

static void appendLine(const char* line) {
  const char* path = std::getenv("SIMTEST_PROFILER_LOG");
  if (!path) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return;
  (void)!write(fd, line, std::strlen(line));
  close(fd);
}

static Result initV5(void** context, uint64_t commId, int* mask, const char* commName, int nNodes,
                     int nranks, int rank, Logger logfn) {
  char line[256];
  std::snprintf(line, sizeof line,
                "init commId=%016llx nranks=%d rank=%d nNodes=%d name=%s mask=%d log=%d\n",
                static_cast<unsigned long long>(commId), nranks, rank, nNodes,
                commName ? commName : "(null)", mask ? *mask : -1, logfn != nullptr);
  appendLine(line);
  auto* id = new uint64_t(commId);
  *context = id;
  return 0;
}
static Result startEvent(void*, void** handle, void*) {
  *handle = nullptr;
  return 0;
}
static Result stopEvent(void*) {
  return 0;
}
static Result recordEventState(void*, int, void*) {
  return 0;
}
static Result finalize(void* context) {
  char line[128];
  std::snprintf(line, sizeof line, "finalize commId=%016llx\n",
                static_cast<unsigned long long>(*static_cast<uint64_t*>(context)));
  appendLine(line);
  delete static_cast<uint64_t*>(context);
  return 0;
}

struct Table {
  const char* name;
  void* init;
  void* startEvent;
  void* stopEvent;
  void* recordEventState;
  void* finalize;
};

#ifdef SIMTEST_ONLY_V4
__attribute__((visibility("default")))
Table ncclProfiler_v4 = {"simtest-old",
                         reinterpret_cast<void*>(&initV5),
                         reinterpret_cast<void*>(&startEvent),
                         reinterpret_cast<void*>(&stopEvent),
                         reinterpret_cast<void*>(&recordEventState),
                         reinterpret_cast<void*>(&finalize)};
#else
__attribute__((visibility("default")))
Table ncclProfiler_v5 = {"simtest",
                         reinterpret_cast<void*>(&initV5),
                         reinterpret_cast<void*>(&startEvent),
                         reinterpret_cast<void*>(&stopEvent),
                         reinterpret_cast<void*>(&recordEventState),
                         reinterpret_cast<void*>(&finalize)};
#endif
}
