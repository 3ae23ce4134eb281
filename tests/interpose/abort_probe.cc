// One rank that handles a communicator failure the way PyTorch's ProcessGroupNCCL does, while
// ncclwatch aborts the communicator behind its back (NCCLWATCH_ON_HANG=abort, `run --abort`):
// a thread polls ncclCommGetAsyncError until it reports an error and then aborts the
// communicator itself; the main thread, once its stalled collective returns, calls NCCL on the
// same handle again. Real NCCL freed the communicator in ncclwatch's abort, so every one of
// these calls must be answered without NCCL (the sim stops the process on a use after free).
// Prints what each call returned; exits 0 when the program got through its teardown.
//   abort_probe WARMUP            as above
//   abort_probe WARMUP destroy    destroys the communicator right after the stalled call instead
//                                 (NCCL's destroy waits for it: the rank hangs in its teardown)
//   abort_probe WARMUP split      splits it right after the stalled call instead (the test makes
//                                 the split wait as one for a rank that never comes)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);        // lines in order with the library's stderr
  int warmup = argc > 1 ? std::atoi(argv[1]) : 3;  // calls before the one the test stalls
  ncclUniqueId id;
  ncclComm_t comm;
  cudaStream_t stream;
  void* buffer = nullptr;
  if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&buffer, 256) != cudaSuccess ||
      cudaStreamCreate(&stream) != cudaSuccess || ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    std::fprintf(stderr, "abort_probe: set-up failed\n");
    return 1;
  }
  bool destroyAtOnce = argc > 2 && std::string(argv[2]) == "destroy";
  for (int call = 0; call <= warmup; ++call) {  // the last one stalls
    ncclResult_t result = ncclAllReduce(buffer, buffer, 64, ncclFloat, ncclSum, comm, stream);
    if (result != ncclSuccess) {
      std::fprintf(stderr, "abort_probe: allreduce %d: %s\n", call, ncclGetErrorString(result));
      return 1;
    }
  }
  if (argc > 2 && std::string(argv[2]) == "split") {
    std::printf("splitting with the stalled call pending\n");
    ncclComm_t child = nullptr;
    std::printf("split: %s\n", ncclGetErrorString(ncclCommSplit(comm, 0, 0, &child, nullptr)));
    return 0;
  }
  if (destroyAtOnce) {
    std::printf("destroying with the stalled call pending\n");
    std::printf("destroy: %s\n", ncclGetErrorString(ncclCommDestroy(comm)));
    return 0;
  }
  // ProcessGroupNCCL's watchdog: poll the async error, abort on one.
  std::thread watchdog([comm] {
    for (int poll = 0; poll < 3000; ++poll) {
      ncclResult_t asyncError = ncclSuccess;
      ncclResult_t result = ncclCommGetAsyncError(comm, &asyncError);
      if (result != ncclSuccess || (asyncError != ncclSuccess && asyncError != ncclInProgress)) {
        std::printf("async error: %s (call: %s)\n", ncclGetErrorString(asyncError),
                    ncclGetErrorString(result));
        std::printf("application's abort: %s\n", ncclGetErrorString(ncclCommAbort(comm)));
        std::fflush(stdout);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::printf("async error: none in 30 s\n");
  });
  cudaError_t synced = cudaStreamSynchronize(stream);
  std::printf("stalled collective returned: %s\n", cudaGetErrorName(synced));
  watchdog.join();
  ncclResult_t after = ncclAllReduce(buffer, buffer, 64, ncclFloat, ncclSum, comm, stream);
  std::printf("allreduce after the abort: %s\n", ncclGetErrorString(after));
  std::printf("last error: %s\n", ncclGetLastError(comm));
  std::printf("destroy: %s\n", ncclGetErrorString(ncclCommDestroy(comm)));
  std::fflush(stdout);
  return 0;
}
