// Private extension exported by the sim's libcuda.so.1 for the sim's libnccl.so.2.
// Real CUDA has no such symbol; only the sim's NCCL uses it, to read peers' "device" memory
// the way real NCCL uses CUDA IPC.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Where a sim allocation lives: device memory is carved out of a per-process memfd heap, which a
// peer process on the same host maps through /proc/<pid>/fd/<fd>.
typedef struct {
  int pid;                        // owning process
  int fd;                         // memfd of the heap, in the owning process
  unsigned long long offset;      // byte offset of ptr inside the heap
  unsigned long long bytesToEnd;  // bytes from ptr to the end of its allocation
} cudasimHeapRef;

// Returns 0 and fills *out when ptr points into memory allocated by cudaMalloc, cudaMallocHost,
// cudaHostAlloc, cudaMallocManaged or cuMemAlloc of this process; -1 otherwise.
int cudasimHeapLocate(const void* ptr, cudasimHeapRef* out);

// Size in bytes of the heap mapping (the same for every process of one build): peers map this
// many bytes of the memfd.
unsigned long long cudasimHeapSize(void);

#ifdef __cplusplus
}
#endif
