// Private extension exported by the sim's libcuda.so.1 for the sim's libnccl.so.2 and tests.
// Real CUDA has no such symbols; the sim's NCCL uses the heap functions to read peers' "device"
// memory the way real NCCL uses CUDA IPC.
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

// Kernel launches since the process started: those the sim computed on the host (the few
// PyTorch elementwise loops it recognises by name) and the no-ops (every other kernel).
void cudasimKernelLaunchCounts(unsigned long long* computed, unsigned long long* noop);

// 1 when the sim computes this kernel (a CUfunction or CUkernel) on the host, with a short
// description such as "fill float" written to `what`; 0 when its launches are no-ops.
int cudasimKernelComputedOnHost(const void* function, char* what, int length);

// Size in bytes of the heap mapping (the same for every process of one build): peers map this
// many bytes of the memfd.
unsigned long long cudasimHeapSize(void);

#ifdef __cplusplus
}
#endif
