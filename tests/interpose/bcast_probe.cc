// One rank that calls ncclBcast once: NCCL implements it by calling ncclBroadcast through the
// PLT, so an interposer that does not guard re-entry records two calls.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

int main() {
  ncclUniqueId id;
  ncclComm_t comm;
  void* buffer = nullptr;
  if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&buffer, 64) != cudaSuccess ||
      ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess ||
      ncclBcast(buffer, 16, ncclFloat, 0, comm, nullptr) != ncclSuccess ||
      cudaDeviceSynchronize() != cudaSuccess || ncclCommDestroy(comm) != ncclSuccess) {
    std::fprintf(stderr, "bcast_probe: a call failed\n");
    return 1;
  }
  return 0;
}
