// What the CUDA driver calls that ncclwatch makes per tracked call cost by themselves: the
// current context, the capture check and one event record (the default) or two
// (NCCLWATCH_EVENTS=full) on one stream. On the sim these are
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
  // The median over 200 batches of 200 calls (after 20 warm-up batches) of `calls`.
  auto perCallNs = [&](auto calls) {
    std::vector<double> perCall;
    for (int batch = 0; batch < 220; ++batch) {
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) calls();
      auto end = std::chrono::steady_clock::now();
      cuStreamSynchronize(stream);
      if (batch >= 20)
        perCall.push_back(std::chrono::duration<double, std::nano>(end - start).count() / 200);
    }
    std::sort(perCall.begin(), perCall.end());
    return perCall[perCall.size() / 2];
  };
  auto bookkeeping = [&] {
    CUcontext current;
    CUstreamCaptureStatus status;
    cuCtxGetCurrent(&current);
    cuStreamIsCapturing(stream, &status);
  };
  double record = perCallNs([&] { cuEventRecord(after, stream); });
  double one = perCallNs([&] {
    bookkeeping();
    cuEventRecord(after, stream);
  });
  double full = perCallNs([&] {
    bookkeeping();
    cuEventRecord(before, stream);
    cuEventRecord(after, stream);
  });
  std::printf(
      "driver calls alone: one event record %.1f ns; per call, one event (context, capture "
      "check, 1 record) %.1f ns; full (2 records) %.1f ns\n",
      record, one, full);
  return 0;
}
