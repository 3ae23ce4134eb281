// What the driver's source files share (libcuda.so.1 of the sim).
#pragma once
#include <cuda.h>

#include "engine.h"

#define CUDASIM_API extern "C" __attribute__((visibility("default")))

namespace cudasim {

CUcontext currentContext();  // this thread's current context (cuCtxSetCurrent), or null
// CUDASIM_DEBUG=1: one stderr line per distinct no-op kernel and per driver entry point the
// sim does not have (read once).
bool debugEnabled();
// Drops the memory pool's record of a stream-ordered allocation freed by cuMemFree.
void forgetPoolAllocation(void* pointer);

}  // namespace cudasim

#define REQUIRE_INIT                                                  \
  do {                                                                \
    if (!::cudasim::initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

#define RESOLVE_STREAM(var, handle)                                          \
  std::shared_ptr<::cudasim::Stream> var = ::cudasim::resolveStream(handle); \
  if (!var) return CUDA_ERROR_INVALID_HANDLE

#define RESOLVE_EVENT(var, handle)                                         \
  std::shared_ptr<::cudasim::Event> var = ::cudasim::resolveEvent(handle); \
  if (!var) return CUDA_ERROR_INVALID_HANDLE
