// The runtime API of the sim (libcudart.so.13): a thin layer over the sim's driver API, as the
// real runtime is over the real driver. It keeps the per-thread current device and last error.
#include <cstring>

#include "runtime_internal.h"

namespace {
thread_local cudaError_t t_lastError = cudaSuccess;
thread_local int t_device = 0;
thread_local bool t_contextBound = false;
}  // namespace

namespace cudasim::rt {

cudaError_t toRuntime(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
      return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_DEVICE:
      return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT:
      return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE:
      return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND:
      return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY:
      return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_STATE:
      return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
      return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return cudaErrorStreamCaptureWrongThread;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return cudaErrorIllegalAddress;
    case CUDA_ERROR_FILE_NOT_FOUND:
      return cudaErrorFileNotFound;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
      return cudaErrorHostMemoryAlreadyRegistered;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
      return cudaErrorHostMemoryNotRegistered;
    default:
      return cudaErrorUnknown;
  }
}

cudaError_t finish(cudaError_t error) {
  if (error != cudaSuccess && error != cudaErrorNotReady) t_lastError = error;
  return error;
}

cudaError_t finish(CUresult result) {
  return finish(toRuntime(result));
}

cudaError_t bindContext() {
  if (t_contextBound) return cudaSuccess;
  CUresult result = cuInit(0);
  CUcontext context = nullptr;
  if (result == CUDA_SUCCESS) result = cuDevicePrimaryCtxRetain(&context, t_device);
  if (result == CUDA_SUCCESS) result = cuCtxSetCurrent(context);
  if (result != CUDA_SUCCESS) return toRuntime(result);
  t_contextBound = true;
  return cudaSuccess;
}

int currentDevice() {
  return t_device;
}

}  // namespace cudasim::rt

using namespace cudasim::rt;

namespace {

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorFileNotFound, "cudaErrorFileNotFound", "file not found"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* findError(cudaError_t code) {
  for (const ErrorText& entry : kErrors) {
    if (entry.code == code) return &entry;
  }
  return nullptr;
}

bool validCopyKind(cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

}  // namespace

// ---- errors --------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaGetLastError(void) {
  cudaError_t error = t_lastError;
  t_lastError = cudaSuccess;
  return error;
}

CUDASIM_API cudaError_t cudaPeekAtLastError(void) {
  return t_lastError;
}

CUDASIM_API const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* entry = findError(error);
  return entry ? entry->text : "unrecognized error code";
}

CUDASIM_API const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* entry = findError(error);
  return entry ? entry->name : "cudaErrorUnknown";
}

// ---- versions and devices ------------------------------------------------------------------

CUDASIM_API cudaError_t cudaDriverGetVersion(int* version) {
  return finish(cuDriverGetVersion(version));
}

CUDASIM_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return finish(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaGetDeviceCount(int* count) {
  if (cuInit(0) != CUDA_SUCCESS) return finish(cudaErrorInitializationError);
  return finish(cuDeviceGetCount(count));
}

CUDASIM_API cudaError_t cudaSetDevice(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return t_lastError;
  if (device < 0 || device >= count) return finish(cudaErrorInvalidDevice);
  t_device = device;
  t_contextBound = false;
  BIND_OR_RETURN;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return finish(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaSetDeviceFlags(unsigned int) {
  BIND_OR_RETURN;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  if (flags == nullptr) return finish(cudaErrorInvalidValue);
  *flags = cudaDeviceScheduleAuto;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attribute,
                                               int device) {
  BIND_OR_RETURN;
  // cudaDeviceAttr values are the driver's CUdevice_attribute values.
  return finish(cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attribute), device));
}

CUDASIM_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* properties, int device) {
  BIND_OR_RETURN;
  if (properties == nullptr) return finish(cudaErrorInvalidValue);
  int count = 0;
  cuDeviceGetCount(&count);
  if (device < 0 || device >= count) return finish(cudaErrorInvalidDevice);
  // As the real runtime does: the name, memory and identity, then one driver attribute per field.
  std::memset(properties, 0, sizeof(*properties));
  cuDeviceGetName(properties->name, sizeof(properties->name), device);
  cuDeviceTotalMem(&properties->totalGlobalMem, device);
  cuDeviceGetUuid(reinterpret_cast<CUuuid*>(&properties->uuid), device);
  auto attribute = [device](CUdevice_attribute which) {
    int value = 0;
    cuDeviceGetAttribute(&value, which, device);
    return value;
  };
  auto& p = *properties;
  p.sharedMemPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  p.regsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  p.warpSize = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  p.memPitch = attribute(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
  p.maxThreadsPerBlock = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  p.maxThreadsDim[0] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  p.maxThreadsDim[1] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  p.maxThreadsDim[2] = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  p.maxGridSize[0] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  p.maxGridSize[1] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  p.maxGridSize[2] = attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  p.totalConstMem = attribute(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
  p.major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  p.minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  p.textureAlignment = attribute(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
  p.texturePitchAlignment = attribute(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
  p.multiProcessorCount = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p.integrated = attribute(CU_DEVICE_ATTRIBUTE_INTEGRATED);
  p.canMapHostMemory = attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  p.surfaceAlignment = attribute(CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT);
  p.concurrentKernels = attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  p.ECCEnabled = attribute(CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
  p.pciBusID = attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  p.pciDeviceID = attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  p.pciDomainID = attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  p.asyncEngineCount = attribute(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  p.unifiedAddressing = attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  p.memoryBusWidth = attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  p.l2CacheSize = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  p.persistingL2CacheMaxSize = attribute(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE);
  p.maxThreadsPerMultiProcessor = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  p.streamPrioritiesSupported = attribute(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
  p.globalL1CacheSupported = attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
  p.localL1CacheSupported = attribute(CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
  p.sharedMemPerMultiprocessor =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  p.regsPerMultiprocessor = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  p.managedMemory = attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  p.isMultiGpuBoard = attribute(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD);
  p.hostNativeAtomicSupported = attribute(CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED);
  p.pageableMemoryAccess = attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
  p.concurrentManagedAccess = attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
  p.computePreemptionSupported = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
  p.canUseHostPointerForRegisteredMem =
      attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
  p.cooperativeLaunch = attribute(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
  p.sharedMemPerBlockOptin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  p.maxBlocksPerMultiProcessor = attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  p.reservedSharedMemPerBlock = attribute(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
  p.hostRegisterSupported = attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
  p.memoryPoolsSupported = attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  p.ipcEventSupported = attribute(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED);
  p.clusterLaunch = attribute(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
  p.deviceNumaId = -1;
  p.hostNumaId = -1;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaDeviceSynchronize(void) {
  BIND_OR_RETURN;
  return finish(cuCtxSynchronize());
}

CUDASIM_API cudaError_t cudaDeviceReset(void) {
  // The sim keeps allocations across a reset; it only drains the device's work.
  return cudaDeviceSynchronize();
}

CUDASIM_API cudaError_t cudaDeviceCanAccessPeer(int* canAccess, int device, int peerDevice) {
  BIND_OR_RETURN;
  int count = 0;
  cuDeviceGetCount(&count);
  if (canAccess == nullptr) return finish(cudaErrorInvalidValue);
  if (device < 0 || device >= count || peerDevice < 0 || peerDevice >= count) {
    return finish(cudaErrorInvalidDevice);
  }
  *canAccess = device != peerDevice;
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  BIND_OR_RETURN;
  int count = 0;
  cuDeviceGetCount(&count);
  if (flags != 0) return finish(cudaErrorInvalidValue);
  if (peerDevice < 0 || peerDevice >= count) return finish(cudaErrorInvalidDevice);
  return cudaSuccess;
}

// ---- memory --------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  BIND_OR_RETURN;
  if (pointer == nullptr) return finish(cudaErrorInvalidValue);
  if (bytes == 0) {
    *pointer = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr device = 0;
  CUresult result = cuMemAlloc(&device, bytes);
  *pointer = reinterpret_cast<void*>(device);
  return finish(result);
}

CUDASIM_API cudaError_t cudaMallocManaged(void** pointer, size_t bytes, unsigned int flags) {
  BIND_OR_RETURN;
  if (pointer == nullptr || bytes == 0) return finish(cudaErrorInvalidValue);
  CUdeviceptr device = 0;
  CUresult result = cuMemAllocManaged(&device, bytes, flags);
  *pointer = reinterpret_cast<void*>(device);
  return finish(result);
}

CUDASIM_API cudaError_t cudaFree(void* pointer) {
  BIND_OR_RETURN;  // cudaFree(0) is the customary way to create the context
  return finish(cuMemFree(devicePointer(pointer)));
}

CUDASIM_API cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
  BIND_OR_RETURN;
  return finish(cuMemAllocHost(pointer, bytes));
}

CUDASIM_API cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuMemHostAlloc(pointer, bytes, flags));
}

CUDASIM_API cudaError_t cudaFreeHost(void* pointer) {
  BIND_OR_RETURN;
  return finish(cuMemFreeHost(pointer));
}

CUDASIM_API cudaError_t cudaMemGetInfo(size_t* freeBytes, size_t* totalBytes) {
  BIND_OR_RETURN;
  return finish(cuMemGetInfo(freeBytes, totalBytes));
}

CUDASIM_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes,
                                                 const void* pointer) {
  BIND_OR_RETURN;
  if (attributes == nullptr) return finish(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof(*attributes));
  unsigned int memoryType = 0;
  if (cuPointerGetAttribute(&memoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                            devicePointer(pointer)) != CUDA_SUCCESS) {
    // Like CUDA 11+: plain host memory is "unregistered", not an error.
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(pointer);
    return cudaSuccess;
  }
  unsigned int managed = 0;
  cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, devicePointer(pointer));
  cuPointerGetAttribute(&attributes->device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        devicePointer(pointer));
  attributes->type =
      managed ? cudaMemoryTypeManaged
              : (memoryType == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost : cudaMemoryTypeDevice);
  attributes->devicePointer = const_cast<void*>(pointer);
  attributes->hostPointer = const_cast<void*>(pointer);
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  BIND_OR_RETURN;
  if (!validCopyKind(kind)) return finish(cudaErrorInvalidMemcpyDirection);
  return finish(cuMemcpy(devicePointer(dst), devicePointer(src), bytes));
}

CUDASIM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                                        cudaMemcpyKind kind, cudaStream_t stream) {
  BIND_OR_RETURN;
  if (!validCopyKind(kind)) return finish(cudaErrorInvalidMemcpyDirection);
  return finish(cuMemcpyAsync(devicePointer(dst), devicePointer(src), bytes, driverStream(stream)));
}

CUDASIM_API cudaError_t cudaMemcpyPeer(void* dst, int, const void* src, int, size_t bytes) {
  BIND_OR_RETURN;
  return finish(cuMemcpy(devicePointer(dst), devicePointer(src), bytes));
}

CUDASIM_API cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t bytes,
                                            cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuMemcpyAsync(devicePointer(dst), devicePointer(src), bytes, driverStream(stream)));
}

CUDASIM_API cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  BIND_OR_RETURN;
  return finish(cuMemsetD8(devicePointer(dst), static_cast<unsigned char>(value), bytes));
}

CUDASIM_API cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuMemsetD8Async(devicePointer(dst), static_cast<unsigned char>(value), bytes,
                                driverStream(stream)));
}

// ---- streams -------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags,
                                                     int priority) {
  BIND_OR_RETURN;
  return finish(cuStreamCreateWithPriority(reinterpret_cast<CUstream*>(stream), flags, priority));
}

CUDASIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

CUDASIM_API cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}

CUDASIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuStreamDestroy(driverStream(stream)));
}

CUDASIM_API cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  BIND_OR_RETURN;
  return finish(cuStreamGetFlags(driverStream(stream), flags));
}

CUDASIM_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuStreamQuery(driverStream(stream)));
}

CUDASIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuStreamSynchronize(driverStream(stream)));
}

CUDASIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                            unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuStreamWaitEvent(driverStream(stream), driverEvent(event), flags));
}

CUDASIM_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t function,
                                           void* userData) {
  BIND_OR_RETURN;
  return finish(cuLaunchHostFunc(driverStream(stream), function, userData));
}

// ---- capture -------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                               enum cudaStreamCaptureMode mode) {
  BIND_OR_RETURN;
  return finish(cuStreamBeginCapture(driverStream(stream), static_cast<CUstreamCaptureMode>(mode)));
}

CUDASIM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  BIND_OR_RETURN;
  return finish(cuStreamEndCapture(driverStream(stream), reinterpret_cast<CUgraph*>(graph)));
}

CUDASIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus* status) {
  BIND_OR_RETURN;
  return finish(
      cuStreamIsCapturing(driverStream(stream), reinterpret_cast<CUstreamCaptureStatus*>(status)));
}

CUDASIM_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                 enum cudaStreamCaptureStatus* status,
                                                 unsigned long long* id, cudaGraph_t* graph,
                                                 const cudaGraphNode_t** dependencies,
                                                 const cudaGraphEdgeData** edgeData,
                                                 size_t* numDependencies) {
  BIND_OR_RETURN;
  return finish(
      cuStreamGetCaptureInfo(driverStream(stream), reinterpret_cast<CUstreamCaptureStatus*>(status),
                             reinterpret_cast<cuuint64_t*>(id), reinterpret_cast<CUgraph*>(graph),
                             reinterpret_cast<const CUgraphNode**>(dependencies),
                             reinterpret_cast<const CUgraphEdgeData**>(edgeData), numDependencies));
}

CUDASIM_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  return finish(cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

CUDASIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                             unsigned long long flags) {
  BIND_OR_RETURN;
  return finish(cuGraphInstantiate(reinterpret_cast<CUgraphExec*>(exec),
                                   reinterpret_cast<CUgraph>(graph), flags));
}

CUDASIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuGraphLaunch(reinterpret_cast<CUgraphExec>(exec), driverStream(stream)));
}

CUDASIM_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  BIND_OR_RETURN;
  return finish(cuGraphDestroy(reinterpret_cast<CUgraph>(graph)));
}

CUDASIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  BIND_OR_RETURN;
  return finish(cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(exec)));
}

// ---- events --------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuEventCreate(reinterpret_cast<CUevent*>(event), flags));
}

CUDASIM_API cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

CUDASIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuEventRecord(driverEvent(event), driverStream(stream)));
}

CUDASIM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                 unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuEventRecordWithFlags(driverEvent(event), driverStream(stream), flags));
}

CUDASIM_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  BIND_OR_RETURN;
  return finish(cuEventQuery(driverEvent(event)));
}

CUDASIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  BIND_OR_RETURN;
  return finish(cuEventSynchronize(driverEvent(event)));
}

CUDASIM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  BIND_OR_RETURN;
  return finish(cuEventDestroy(driverEvent(event)));
}

CUDASIM_API cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start,
                                             cudaEvent_t end) {
  BIND_OR_RETURN;
  return finish(cuEventElapsedTime(milliseconds, driverEvent(start), driverEvent(end)));
}
