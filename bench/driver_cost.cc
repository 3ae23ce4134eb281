// What the CUDA driver calls that ncclwatch makes per tracked call cost by themselves: the
// current context, the capture check and two event records on one stream. On the sim these are
// the sim's costs, not a GPU driver's; overhead.sh prints them beside the events row so that
// the part ncclwatch itself adds can be told from the part the driver adds.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main() {
  CUdevice device;
  CUcontext context;
  CUstream stream;
  CUevent before, after;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
      cuCtxSetCurrent(context) != CUDA_SUCCESS ||
      cuStreamCreate(&stream, CU_STREAM_DEFAULT) != CUDA_SUCCESS ||
      cuEventCreate(&before, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      cuEventCreate(&after, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    std::fprintf(stderr, "driver_cost: CUDA set-up failed\n");
    return 2;
  }
  std::vector<double> perCall;
  for (int batch = 0; batch < 220; ++batch) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) {
      CUcontext current;
      CUstreamCaptureStatus status;
      cuCtxGetCurrent(&current);
      cuStreamIsCapturing(stream, &status);
      cuEventRecord(before, stream);
      cuEventRecord(after, stream);
    }
    auto end = std::chrono::steady_clock::now();
    cuStreamSynchronize(stream);
    if (batch >= 20)
      perCall.push_back(std::chrono::duration<double, std::nano>(end - start).count() / 200);
  }
  std::sort(perCall.begin(), perCall.end());
  std::printf("driver calls alone (context, capture check, 2 event records): %.1f ns per call\n",
              perCall[perCall.size() / 2]);
  return 0;
}
