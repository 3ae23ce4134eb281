// Shows which NCCL a binary runs against, and that it behaves as that NCCL should: the version,
// a unique id, and what ncclCommInitRank says on this machine. With the real toolkit libraries
// and no GPU driver, the version is 22809, ncclGetUniqueId works, and init fails with an error.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int version = 0;
  ncclResult_t result = ncclGetVersion(&version);
  std::printf("ncclGetVersion: %s, version %d\n", ncclGetErrorString(result), version);
  ncclUniqueId id;
  result = ncclGetUniqueId(&id);
  std::printf("ncclGetUniqueId: %s\n", ncclGetErrorString(result));
  if (result != ncclSuccess) return 1;
  ncclComm_t comm = nullptr;
  result = ncclCommInitRank(&comm, 1, id, 0);
  std::printf("ncclCommInitRank: %d (%s)\n", static_cast<int>(result), ncclGetErrorString(result));
  if (result == ncclSuccess) ncclCommDestroy(comm);
  return 0;
}
