// One process, two devices, ncclCommInitAll (as nccl-tests' -g 2 does): NCCL initialises the
// communicators itself, on threads of its own, where no wrapper of ours is on the stack. Then one
// grouped allreduce over both and the communicators destroyed.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

int main() {
  constexpr int kDevices = 2;
  ncclComm_t comms[kDevices];
  void* buffers[kDevices] = {};
  cudaStream_t streams[kDevices] = {};
  for (int d = 0; d < kDevices; ++d) {
    if (cudaSetDevice(d) != cudaSuccess || cudaMalloc(&buffers[d], 1024) != cudaSuccess ||
        cudaStreamCreate(&streams[d]) != cudaSuccess) {
      std::fprintf(stderr, "init_all_probe: device %d set-up failed\n", d);
      return 1;
    }
  }
  if (ncclCommInitAll(comms, kDevices, nullptr) != ncclSuccess) {
    std::fprintf(stderr, "init_all_probe: ncclCommInitAll failed\n");
    return 1;
  }
  bool ok = ncclGroupStart() == ncclSuccess;
  for (int d = 0; d < kDevices; ++d) {
    ok = ok && ncclAllReduce(buffers[d], buffers[d], 256, ncclFloat, ncclSum, comms[d],
                             streams[d]) == ncclSuccess;
  }
  ok = ok && ncclGroupEnd() == ncclSuccess;
  for (int d = 0; d < kDevices; ++d) {
    ok = ok && cudaSetDevice(d) == cudaSuccess && cudaStreamSynchronize(streams[d]) == cudaSuccess;
  }
  for (int d = 0; d < kDevices; ++d) ok = ok && ncclCommDestroy(comms[d]) == ncclSuccess;
  if (!ok) {
    std::fprintf(stderr, "init_all_probe: a call failed\n");
    return 1;
  }
  return 0;
}
