// One rank that calls NCCL 2.29-2.32 host functions (compiled against PyPI's 2.32.3 nccl.h, run
// on the sim): ncclAllReduceConfig with a config, then ncclCommGrow and ncclWaitSignal, which
// the sim does not model. It prints what each returned, so the test can check that the
// interposer handed NCCL's own results back unchanged.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

int main() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&send, 4096) != cudaSuccess ||
      cudaMalloc(&recv, 4096) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess ||
      ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    std::fprintf(stderr, "newer_api_probe: setup failed\n");
    return 1;
  }
  ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;
  config.userProfilerTag = 42;
  ncclResult_t allReduce =
      ncclAllReduceConfig(send, recv, 1000, ncclBfloat16, ncclMax, comm, stream, &config);
  std::printf("allreduce-config=%d\n", static_cast<int>(allReduce));
  if (cudaStreamSynchronize(stream) != cudaSuccess) return 1;

  ncclComm_t grown = reinterpret_cast<ncclComm_t>(&config);  // NCCL must overwrite it
  ncclResult_t grow = ncclCommGrow(comm, 2, nullptr, -1, &grown, nullptr);
  std::printf("grow=%d newcomm-null=%d error=%s\n", static_cast<int>(grow), grown == nullptr,
              ncclGetLastError(comm));

  ncclWaitSignalDesc_t wait = {3, 0, 1, 0};  // 3 signals from rank 0, index 1, context 0
  ncclResult_t waited = ncclWaitSignal(1, &wait, comm, stream);
  std::printf("wait-signal=%d\n", static_cast<int>(waited));

  if (ncclCommDestroy(comm) != ncclSuccess) return 1;
  return allReduce == ncclSuccess ? 0 : 1;
}
