// cuGetProcAddress of the sim (libcuda.so.1): the driver entry points by their unversioned
// names, with the ABI a caller of the requested CUDA version expects. cuBLAS, PyTorch and the
// runtime's cudaGetDriverEntryPointByVersion reach the driver this way; cuBLAS's first request
// is "cuGetProcAddress" itself.
#include <cuda.h>
#include <cudaProfiler.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "driver_internal.h"

namespace {

struct ProcEntry {
  const char* name;        // the unversioned name callers ask for
  void* function;          // the ABI a caller of at least minimumCudaVersion expects
  int minimumCudaVersion;  // callers asking for an older ABI get VERSION_NOT_SUFFICIENT
};

// The ABI of CUDA 11.3-11.8's cuGetProcAddress, without the status argument.
CUresult getProcAddressV1(const char* symbol, void** function, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress(symbol, function, cudaVersion, flags, nullptr);
}

#define PROC(name, version) \
  { #name, reinterpret_cast < void*>(&name), version }
const ProcEntry kProcs[] = {
    {"cuGetProcAddress", reinterpret_cast<void*>(&getProcAddressV1), 11030},
    {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress), 12000},
    PROC(cuInit, 2000),
    PROC(cuDriverGetVersion, 2020),
    PROC(cuDeviceGet, 2000),
    PROC(cuDeviceGetCount, 2000),
    PROC(cuDeviceGetName, 2000),
    PROC(cuDeviceTotalMem, 3020),
    PROC(cuDeviceGetAttribute, 2000),
    PROC(cuDevicePrimaryCtxRetain, 7000),
    PROC(cuDevicePrimaryCtxRelease, 11000),
    PROC(cuCtxGetCurrent, 4000),
    PROC(cuCtxSetCurrent, 4000),
    PROC(cuCtxGetDevice, 2000),
    PROC(cuCtxSynchronize, 2000),
    PROC(cuMemAlloc, 3020),
    PROC(cuMemAllocManaged, 6000),
    PROC(cuMemAllocHost, 3020),
    PROC(cuMemHostAlloc, 2020),
    PROC(cuMemFree, 3020),
    PROC(cuMemFreeHost, 2000),
    PROC(cuMemGetInfo, 3020),
    PROC(cuPointerGetAttribute, 4000),
    PROC(cuMemcpy, 4000),
    PROC(cuMemcpyAsync, 4000),
    PROC(cuMemsetD8, 3020),
    PROC(cuMemsetD8Async, 3020),
    PROC(cuStreamCreate, 2000),
    PROC(cuStreamCreateWithPriority, 5050),
    PROC(cuStreamDestroy, 4000),
    PROC(cuStreamGetFlags, 5050),
    PROC(cuStreamQuery, 2000),
    PROC(cuStreamSynchronize, 2000),
    PROC(cuStreamWaitEvent, 3020),
    PROC(cuLaunchHostFunc, 10000),
    PROC(cuStreamBeginCapture, 10010),
    PROC(cuStreamEndCapture, 10000),
    PROC(cuStreamIsCapturing, 10000),
    PROC(cuStreamGetCaptureInfo, 12030),
    PROC(cuThreadExchangeStreamCaptureMode, 10010),
    PROC(cuGraphInstantiate, 11040),
    PROC(cuGraphLaunch, 10000),
    PROC(cuGraphDestroy, 10000),
    PROC(cuGraphExecDestroy, 10000),
    PROC(cuEventCreate, 2000),
    PROC(cuEventRecord, 2000),
    PROC(cuEventRecordWithFlags, 11010),
    PROC(cuEventQuery, 2000),
    PROC(cuEventSynchronize, 2000),
    PROC(cuEventDestroy, 4000),
    PROC(cuEventElapsedTime, 12080),
    PROC(cuGetErrorString, 6000),
    PROC(cuGetErrorName, 6000),
    PROC(cuDevicePrimaryCtxGetState, 7000),
    PROC(cuDevicePrimaryCtxSetFlags, 11000),
    PROC(cuDevicePrimaryCtxReset, 11000),
    PROC(cuCtxGetStreamPriorityRange, 5050),
    PROC(cuCtxGetFlags, 7000),
    PROC(cuCtxGetApiVersion, 3020),
    PROC(cuCtxGetId, 12000),
    PROC(cuCtxPushCurrent, 4000),
    PROC(cuCtxPopCurrent, 4000),
    PROC(cuCtxEnablePeerAccess, 4000),
    PROC(cuDeviceGetPCIBusId, 4010),
    PROC(cuDeviceGetUuid, 11040),
    PROC(cuDeviceCanAccessPeer, 4000),
    PROC(cuDeviceGetP2PAttribute, 8000),
    PROC(cuStreamGetPriority, 5050),
    PROC(cuStreamAddCallback, 5000),
    PROC(cuStreamGetId, 12000),
    PROC(cuMemcpy2D, 3020),
    PROC(cuMemcpy2DAsync, 3020),
    PROC(cuMemcpyHtoD, 3020),
    PROC(cuMemcpyDtoH, 3020),
    PROC(cuMemcpyDtoD, 3020),
    PROC(cuMemcpyHtoDAsync, 3020),
    PROC(cuMemcpyDtoHAsync, 3020),
    PROC(cuMemcpyDtoDAsync, 3020),
    PROC(cuMemsetD16, 3020),
    PROC(cuMemsetD16Async, 3020),
    PROC(cuMemsetD32, 3020),
    PROC(cuMemsetD32Async, 3020),
    PROC(cuMemGetAddressRange, 3020),
    PROC(cuMemHostRegister, 6050),
    PROC(cuMemHostUnregister, 4000),
    PROC(cuMemHostGetDevicePointer, 3020),
    PROC(cuDeviceGetDefaultMemPool, 11020),
    PROC(cuDeviceGetMemPool, 11020),
    PROC(cuMemAllocAsync, 11020),
    PROC(cuMemAllocFromPoolAsync, 11020),
    PROC(cuMemFreeAsync, 11020),
    PROC(cuMemPoolGetAttribute, 11020),
    PROC(cuMemPoolSetAttribute, 11020),
    PROC(cuMemPoolTrimTo, 11020),
    PROC(cuMemPoolSetAccess, 11020),
    PROC(cuMemPoolGetAccess, 11020),
    PROC(cuIpcGetMemHandle, 4010),
    PROC(cuIpcOpenMemHandle, 11000),
    PROC(cuIpcCloseMemHandle, 4010),
    PROC(cuIpcGetEventHandle, 4010),
    PROC(cuIpcOpenEventHandle, 4010),
    PROC(cuGraphGetNodes, 10000),
    PROC(cuGraphNodeGetDependencies, 12030),
    PROC(cuGraphAddNode, 12030),
    PROC(cuGraphConditionalHandleCreate, 12030),
    PROC(cuStreamBeginCaptureToGraph, 12030),
    PROC(cuStreamUpdateCaptureDependencies, 12030),
    PROC(cuGraphInstantiateWithFlags, 11040),
    PROC(cuUserObjectCreate, 11030),
    PROC(cuUserObjectRetain, 11030),
    PROC(cuUserObjectRelease, 11030),
    PROC(cuGraphRetainUserObject, 11030),
    PROC(cuGraphReleaseUserObject, 11030),
    PROC(cuDeviceGetGraphMemAttribute, 11040),
    PROC(cuDeviceSetGraphMemAttribute, 11040),
    PROC(cuDeviceGraphMemTrim, 11040),
    PROC(cuProfilerStart, 4000),
    PROC(cuProfilerStop, 4000),
    PROC(cuLibraryLoadData, 12000),
    PROC(cuLibraryLoadFromFile, 12000),
    PROC(cuLibraryUnload, 12000),
    PROC(cuLibraryGetKernel, 12000),
    PROC(cuLibraryGetKernelCount, 12040),
    PROC(cuLibraryEnumerateKernels, 12040),
    PROC(cuLibraryGetModule, 12000),
    PROC(cuLibraryGetGlobal, 12000),
    PROC(cuLibraryGetManaged, 12000),
    PROC(cuLibraryGetUnifiedFunction, 12000),
    PROC(cuKernelGetFunction, 12000),
    PROC(cuKernelGetLibrary, 12050),
    PROC(cuKernelGetName, 12030),
    PROC(cuKernelGetAttribute, 12000),
    PROC(cuKernelSetAttribute, 12000),
    PROC(cuKernelSetCacheConfig, 12000),
    PROC(cuModuleLoad, 2000),
    PROC(cuModuleLoadData, 2000),
    PROC(cuModuleLoadDataEx, 2010),
    PROC(cuModuleLoadFatBinary, 2000),
    PROC(cuModuleUnload, 2000),
    PROC(cuModuleGetFunction, 2000),
    PROC(cuModuleGetGlobal, 3020),
    PROC(cuModuleGetLoadingMode, 11070),
    PROC(cuFuncGetModule, 11000),
    PROC(cuFuncGetName, 12030),
    PROC(cuFuncLoad, 12040),
    PROC(cuFuncIsLoaded, 12040),
    PROC(cuFuncGetAttribute, 2020),
    PROC(cuFuncSetAttribute, 9000),
    PROC(cuFuncSetCacheConfig, 3000),
    PROC(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050),
    PROC(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 7000),
    PROC(cuOccupancyMaxPotentialBlockSize, 6050),
    PROC(cuOccupancyMaxPotentialBlockSizeWithFlags, 7000),
    PROC(cuOccupancyAvailableDynamicSMemPerBlock, 11000),
    PROC(cuLaunchKernel, 4000),
    PROC(cuLaunchCooperativeKernel, 9000),
    PROC(cuLaunchKernelEx, 11060),
};
#undef PROC

void reportMissing(const char* symbol) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mutex);
  if (reported.insert(symbol).second) {
    std::fprintf(stderr, "cudasim: cuGetProcAddress(\"%s\"): the sim has no such entry point\n",
                 symbol);
  }
}

}  // namespace

CUDASIM_API CUresult cuGetProcAddress(const char* symbol, void** function, int cudaVersion,
                                      cuuint64_t, CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *function = nullptr;
  const ProcEntry* best = nullptr;
  bool known = false;
  for (const ProcEntry& entry : kProcs) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    known = true;
    if (cudaVersion >= entry.minimumCudaVersion &&
        (best == nullptr || entry.minimumCudaVersion > best->minimumCudaVersion)) {
      best = &entry;
    }
  }
  if (best == nullptr) {
    if (!known && cudasim::debugEnabled()) reportMissing(symbol);
    if (status) {
      *status =
          known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  *function = best->function;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

// The unsuffixed export, for programs that look the old ABI up with dlsym.
#undef cuGetProcAddress
CUDASIM_API CUresult cuGetProcAddress(const char* symbol, void** function, int cudaVersion,
                                      cuuint64_t flags) {
  return getProcAddressV1(symbol, function, cudaVersion, flags);
}
