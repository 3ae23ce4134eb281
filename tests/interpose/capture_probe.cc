// One rank that captures an ncclAllReduce into a CUDA graph in global capture mode while another
// stream holds an uncaptured ncclAllReduce that stays pending for a while (queued behind a slow
// host function). ncclwatch's watchdog polls that pending call's events during the capture; a
// poller that queried in global mode would invalidate the capture and EndCapture would fail.
// Prints "capture ok" when the capture survived and the graph ran.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>

#define CHECK(call)                                                                   \
  do {                                                                                \
    if ((call) != 0) {                                                                \
      std::fprintf(stderr, "capture_probe: %s failed at line %d\n", #call, __LINE__); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static void sleepHalfSecond(void*) {
  usleep(500 * 1000);
}

int main() {
  ncclUniqueId id;
  ncclComm_t comm;
  float* buffer = nullptr;
  float* other = nullptr;
  cudaStream_t captured, pending, slow;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&buffer), 256 * sizeof(float)));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&other), 256 * sizeof(float)));
  CHECK(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&pending, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));

  // The pending call: behind a half-second host function on its stream.
  cudaEvent_t slowDone;
  CHECK(cudaEventCreateWithFlags(&slowDone, cudaEventDisableTiming));
  CHECK(cudaLaunchHostFunc(slow, sleepHalfSecond, nullptr));
  CHECK(cudaEventRecord(slowDone, slow));
  CHECK(cudaStreamWaitEvent(pending, slowDone, 0));
  CHECK(ncclAllReduce(other, other, 256, ncclFloat, ncclSum, comm, pending));

  // The capture, held open while the watchdog polls (every 20 ms in the test).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal));
  CHECK(ncclAllReduce(buffer, buffer, 256, ncclFloat, ncclSum, comm, captured));
  usleep(300 * 1000);
  CHECK(cudaStreamEndCapture(captured, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, captured));
  CHECK(cudaStreamSynchronize(captured));
  CHECK(cudaStreamSynchronize(pending));
  CHECK(ncclCommDestroy(comm));
  std::printf("capture ok\n");
  return 0;
}
