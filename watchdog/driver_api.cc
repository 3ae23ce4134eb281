#include "watchdog/driver_api.h"

#include <dlfcn.h>

#include <mutex>

namespace ncclwatch::watchdog {
namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

// Asks for the ABI of the toolkit we were compiled against (cuda.h's CUDA_VERSION): the same
// entry points a CUDA 13 program gets for these names.
template <typename Function>
bool resolve(GetProcAddress getProcAddress, const char* name, Function* function) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (getProcAddress(name, &address, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
          CUDA_SUCCESS ||
      address == nullptr) {
    return false;
  }
  *function = reinterpret_cast<Function>(address);
  return true;
}

DriverApi g_api;
const DriverApi* g_loaded = nullptr;
const char* g_why = nullptr;
std::once_flag g_once;

void load() {
  // The program has normally loaded the driver already (through libcudart); never load a
  // second copy beside it, but load it when it is not there yet (a lazily initialized runtime).
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    g_why = "no libcuda.so.1 in this process";
    return;
  }
  auto getProcAddress = reinterpret_cast<GetProcAddress>(dlsym(library, "cuGetProcAddress_v2"));
  if (getProcAddress == nullptr) {
    g_why = "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)";
    return;
  }
  bool complete = resolve(getProcAddress, "cuCtxGetCurrent", &g_api.ctxGetCurrent) &&
                  resolve(getProcAddress, "cuCtxSetCurrent", &g_api.ctxSetCurrent) &&
                  resolve(getProcAddress, "cuEventCreate", &g_api.eventCreate) &&
                  resolve(getProcAddress, "cuEventRecord", &g_api.eventRecord) &&
                  resolve(getProcAddress, "cuEventQuery", &g_api.eventQuery) &&
                  resolve(getProcAddress, "cuEventDestroy", &g_api.eventDestroy) &&
                  resolve(getProcAddress, "cuStreamIsCapturing", &g_api.streamIsCapturing) &&
                  resolve(getProcAddress, "cuThreadExchangeStreamCaptureMode",
                          &g_api.threadExchangeStreamCaptureMode);
  if (!complete) {
    g_why = "libcuda.so.1 lacks an event or capture function";
    return;
  }
  g_loaded = &g_api;
}

}  // namespace

const DriverApi* loadDriverApi(const char** why) {
  std::call_once(g_once, load);
  if (g_loaded == nullptr && why != nullptr) *why = g_why;
  return g_loaded;
}

}  // namespace ncclwatch::watchdog
