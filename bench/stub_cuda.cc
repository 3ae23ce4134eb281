// A CUDA driver whose calls cost nothing, for bench/recording_cost's completion-event case: it
// is linked as libcuda.so.1, where watchdog/driver_api.cc finds the driver, and answers the
// functions completion tracking resolves: one fixed context, events handed out as distinct
// handles, every record accepted at once and every query complete, no stream ever captured.
// What the event path then adds to a call is ncclwatch's own work alone.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace {

char g_context;
std::atomic<uintptr_t> g_nextEvent{0x1000};

CUresult stubCtxGetCurrent(CUcontext* context) {
  *context = reinterpret_cast<CUcontext>(&g_context);
  return CUDA_SUCCESS;
}
CUresult stubCtxSetCurrent(CUcontext) {
  return CUDA_SUCCESS;
}
CUresult stubEventCreate(CUevent* event, unsigned int) {
  *event = reinterpret_cast<CUevent>(g_nextEvent.fetch_add(16, std::memory_order_relaxed));
  return CUDA_SUCCESS;
}
CUresult stubEventRecord(CUevent, CUstream) {
  return CUDA_SUCCESS;
}
CUresult stubEventQuery(CUevent) {
  return CUDA_SUCCESS;
}
CUresult stubEventDestroy(CUevent) {
  return CUDA_SUCCESS;
}
CUresult stubStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult stubThreadExchangeStreamCaptureMode(CUstreamCaptureMode*) {
  return CUDA_SUCCESS;
}

struct Entry {
  const char* name;
  void* function;
};
const Entry kEntries[] = {
    {"cuCtxGetCurrent", reinterpret_cast<void*>(&stubCtxGetCurrent)},
    {"cuCtxSetCurrent", reinterpret_cast<void*>(&stubCtxSetCurrent)},
    {"cuEventCreate", reinterpret_cast<void*>(&stubEventCreate)},
    {"cuEventRecord", reinterpret_cast<void*>(&stubEventRecord)},
    {"cuEventQuery", reinterpret_cast<void*>(&stubEventQuery)},
    {"cuEventDestroy", reinterpret_cast<void*>(&stubEventDestroy)},
    {"cuStreamIsCapturing", reinterpret_cast<void*>(&stubStreamIsCapturing)},
    {"cuThreadExchangeStreamCaptureMode",
     reinterpret_cast<void*>(&stubThreadExchangeStreamCaptureMode)},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** function, int, cuuint64_t, CUdriverProcAddressQueryResult* status) {
  for (const Entry& entry : kEntries) {
    if (std::strcmp(entry.name, symbol) == 0) {
      *function = entry.function;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  *function = nullptr;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
