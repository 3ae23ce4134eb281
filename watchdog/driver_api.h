// The few CUDA driver functions completion tracking needs, loaded at run time from libcuda.so.1
// through cuGetProcAddress, so that libncclwatch.so never links CUDA and a process without a
// driver simply runs without completion events.
#pragma once
#include <cuda.h>

namespace ncclwatch::watchdog {

struct DriverApi {
  CUresult (*ctxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ctxSetCurrent)(CUcontext) = nullptr;
  CUresult (*eventCreate)(CUevent*, unsigned int) = nullptr;
  CUresult (*eventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*eventQuery)(CUevent) = nullptr;
  CUresult (*eventDestroy)(CUevent) = nullptr;
  CUresult (*streamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
  CUresult (*threadExchangeStreamCaptureMode)(CUstreamCaptureMode*) = nullptr;
};

// Loads the driver once (thread-safe). Null, with `why` set to a one-line reason, when there
// is no libcuda.so.1 or it lacks a function.
const DriverApi* loadDriverApi(const char** why);

}  // namespace ncclwatch::watchdog
