// Counts the heap allocations made on the preloaded library's watchdog thread (the thread named
// "ncclwatch") while a 1-rank job calls allreduces steadily. This program defines malloc and
// its kin, forwarding to glibc's, so that every allocation in the process passes here.
//
// Why it matters: a process that forks (DataLoader workers, subprocess launches) while another
// thread holds its allocator's lock leaves the child a lock no thread will release, unless the
// allocator takes its locks around fork(). glibc's malloc does; GCC 12's ASan runtime and some
// allocators users preload do not. The watchdog polls every interval for the job's whole life:
// it must not allocate while it polls.
//
// Prints "watchdog allocations=N calls=M" for the counted window (after a warm-up in which the
// watchdog starts, grows its event pool and, with a collector, connects to it).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* pointer, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* pointer);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_watchdogAllocations{0};

// Not cached per thread: the watchdog names itself after its first allocations.
void noteAllocation() {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  char name[17] = {};
  if (prctl(PR_GET_NAME, name) == 0 && std::strcmp(name, "ncclwatch") == 0) {
    g_watchdogAllocations.fetch_add(1, std::memory_order_relaxed);
  }
}

bool failed(const char* what) {
  std::fprintf(stderr, "alloc_probe: %s failed\n", what);
  return false;
}

// Allreduces with a short pause between them, for `duration`; how many.
long callFor(std::chrono::milliseconds duration, ncclComm_t comm, float* buffer) {
  long calls = 0;
  auto end = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < end) {
    if (ncclAllReduce(buffer, buffer, 256, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) {
      failed("ncclAllReduce");
      return -1;
    }
    if (++calls % 64 == 0 && cudaDeviceSynchronize() != cudaSuccess) return -1;
    usleep(500);
  }
  return cudaDeviceSynchronize() == cudaSuccess ? calls : -1;
}

}  // namespace

extern "C" {
void* malloc(size_t size) {
  noteAllocation();
  return __libc_malloc(size);
}
void* calloc(size_t count, size_t size) {
  noteAllocation();
  return __libc_calloc(count, size);
}
void* realloc(void* pointer, size_t size) {
  noteAllocation();
  return __libc_realloc(pointer, size);
}
void* memalign(size_t alignment, size_t size) {
  noteAllocation();
  return __libc_memalign(alignment, size);
}
void* aligned_alloc(size_t alignment, size_t size) {
  noteAllocation();
  return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  noteAllocation();
  *out = __libc_memalign(alignment, size);
  return *out != nullptr ? 0 : ENOMEM;
}
void free(void* pointer) {
  __libc_free(pointer);
}
}

int main(int argc, char** argv) {
  int warmUpMs = argc > 1 ? std::atoi(argv[1]) : 600;
  ncclComm_t comm;
  ncclUniqueId id;
  float* buffer = nullptr;
  if (cudaSetDevice(0) != cudaSuccess) return failed("cudaSetDevice"), 1;
  if (cudaMalloc(reinterpret_cast<void**>(&buffer), 256 * sizeof(float)) != cudaSuccess)
    return failed("cudaMalloc"), 1;
  if (ncclGetUniqueId(&id) != ncclSuccess) return failed("ncclGetUniqueId"), 1;
  if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return failed("ncclCommInitRank"), 1;
  if (callFor(std::chrono::milliseconds(warmUpMs), comm, buffer) < 0) return 1;
  g_counting.store(true);
  long calls = callFor(std::chrono::milliseconds(1200), comm, buffer);
  g_counting.store(false);
  if (calls < 0) return 1;
  std::printf("watchdog allocations=%ld calls=%ld\n", g_watchdogAllocations.load(), calls);
  std::fflush(stdout);
  if (ncclCommDestroy(comm) != ncclSuccess) return failed("ncclCommDestroy"), 1;
  return cudaFree(buffer) == cudaSuccess ? 0 : 1;
}
