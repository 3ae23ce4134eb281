// The smallest NCCL job: one world communicator and an ncclAllReduce loop with a final check.
// Used by the scale test (64 ranks on two cores) and by benchmarks.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/launch_env.h"

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int iterations = 100;
  size_t count = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--iters" || arg == "--count") && i + 1 < argc) {
      char* end = nullptr;
      long value = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || value < 1) {
        std::fprintf(stderr, "allreduce_loop: %s needs a positive integer\n", arg.c_str());
        return 2;
      }
      if (arg == "--iters") {
        iterations = static_cast<int>(value);
      } else {
        count = static_cast<size_t>(value);
      }
    } else {
      std::fprintf(stderr, "usage: allreduce_loop [--iters N] [--count N]\n");
      return 2;
    }
  }
  examples::LaunchEnv env = examples::readLaunchEnv();
  int devices = 0;
  EXAMPLE_CUDA_CHECK(env, cudaGetDeviceCount(&devices));
  EXAMPLE_CUDA_CHECK(env, cudaSetDevice(env.localRank % devices));
  cudaStream_t stream;
  EXAMPLE_CUDA_CHECK(env, cudaStreamCreate(&stream));
  ncclUniqueId id = examples::shareUniqueId(env);
  ncclComm_t comm;
  EXAMPLE_NCCL_CHECK(env, ncclCommInitRank(&comm, env.world, id, env.rank));
  std::vector<float> host(count, static_cast<float>(env.rank + 1));
  float* buffer = nullptr;
  EXAMPLE_CUDA_CHECK(env, cudaMalloc(reinterpret_cast<void**>(&buffer), count * sizeof(float)));
  EXAMPLE_CUDA_CHECK(
      env, cudaMemcpy(buffer, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  for (int i = 0; i < iterations; ++i) {
    // Averaging keeps the values fixed: every rank holds the mean after the first iteration.
    EXAMPLE_NCCL_CHECK(env, ncclAllReduce(buffer, buffer, count, ncclFloat, ncclAvg, comm, stream));
  }
  EXAMPLE_CUDA_CHECK(env, cudaMemcpyAsync(host.data(), buffer, count * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream));
  EXAMPLE_CUDA_CHECK(env, cudaStreamSynchronize(stream));
  const float mean = (env.world + 1) / 2.0f;
  for (size_t i = 0; i < count; ++i) {
    if (host[i] != mean) {
      std::fprintf(stderr, "allreduce_loop: rank %d: [%zu] = %g, expected %g\n", env.rank, i,
                   host[i], mean);
      return 3;
    }
  }
  EXAMPLE_NCCL_CHECK(env, ncclCommDestroy(comm));
  if (env.rank == 0)
    std::printf("allreduce_loop: %d iterations on %d ranks ok\n", iterations, env.world);
  return 0;
}
