// What the runtime's source files share (libcudart.so.13 of the sim): error conversion, the
// per-thread last error, and the implicit context binding every runtime call starts with.
#pragma once
#include <cuda.h>
#include <cuda_runtime_api.h>

#define CUDASIM_API extern "C" __attribute__((visibility("default")))

namespace cudasim::rt {

cudaError_t toRuntime(CUresult result);
// Records a failure as the thread's last error ("not ready" is an answer, not an error) and
// returns it.
cudaError_t finish(cudaError_t error);
cudaError_t finish(CUresult result);
// Binds the thread's current device's primary context, initializing the driver on first use,
// as the runtime does implicitly on the first call of each thread.
cudaError_t bindContext();
int currentDevice();  // the runtime's current device of this thread (cudaSetDevice)

inline CUdeviceptr devicePointer(const void* pointer) {
  return reinterpret_cast<CUdeviceptr>(pointer);
}
inline CUstream driverStream(cudaStream_t stream) {
  return reinterpret_cast<CUstream>(stream);
}
inline CUevent driverEvent(cudaEvent_t event) {
  return reinterpret_cast<CUevent>(event);
}

}  // namespace cudasim::rt

#define BIND_OR_RETURN                                             \
  do {                                                             \
    cudaError_t bound = ::cudasim::rt::bindContext();              \
    if (bound != cudaSuccess) return ::cudasim::rt::finish(bound); \
  } while (0)
