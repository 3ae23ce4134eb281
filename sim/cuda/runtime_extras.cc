// More of the runtime API (libcudart.so.13 of the sim), each a thin layer over the driver
// function of the same meaning: stream-ordered allocation and memory pools, IPC memory handles,
// registered host memory, 2D copies, device identity, stream priorities and callbacks, driver
// entry points, graph queries and user objects, the profiler switch.
#include <cudaProfiler.h>
#include <cuda_profiler_api.h>

#include <cstring>

#include "runtime_internal.h"

using namespace cudasim::rt;

namespace {

// A freshly made CUDA_MEMCPY2D over unified addresses (the sim has one address space).
CUDA_MEMCPY2D unifiedCopy(void* dst, size_t dstPitch, const void* src, size_t srcPitch,
                          size_t width, size_t height) {
  CUDA_MEMCPY2D copy;
  std::memset(&copy, 0, sizeof(copy));
  copy.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  copy.srcDevice = devicePointer(src);
  copy.srcPitch = srcPitch;
  copy.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  copy.dstDevice = devicePointer(dst);
  copy.dstPitch = dstPitch;
  copy.WidthInBytes = width;
  copy.Height = height;
  return copy;
}

}  // namespace

// ---- stream-ordered allocation and memory pools --------------------------------------------

CUDASIM_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  BIND_OR_RETURN;
  return finish(cuDeviceGetDefaultMemPool(reinterpret_cast<CUmemoryPool*>(pool), device));
}

CUDASIM_API cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  BIND_OR_RETURN;
  if (pointer == nullptr) return finish(cudaErrorInvalidValue);
  CUdeviceptr address = 0;
  CUresult result = cuMemAllocAsync(&address, bytes, driverStream(stream));
  *pointer = reinterpret_cast<void*>(address);
  return finish(result);
}

CUDASIM_API cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  BIND_OR_RETURN;
  return finish(cuMemFreeAsync(devicePointer(pointer), driverStream(stream)));
}

// cudaMemPoolAttr values are the driver's CUmemPool_attribute values.
CUDASIM_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attribute,
                                                void* value) {
  BIND_OR_RETURN;
  return finish(cuMemPoolGetAttribute(reinterpret_cast<CUmemoryPool>(pool),
                                      static_cast<CUmemPool_attribute>(attribute), value));
}

CUDASIM_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attribute,
                                                void* value) {
  BIND_OR_RETURN;
  return finish(cuMemPoolSetAttribute(reinterpret_cast<CUmemoryPool>(pool),
                                      static_cast<CUmemPool_attribute>(attribute), value));
}

CUDASIM_API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool,
                                             const struct cudaMemAccessDesc* descriptors,
                                             size_t count) {
  BIND_OR_RETURN;
  static_assert(sizeof(cudaMemAccessDesc) == sizeof(CUmemAccessDesc));
  return finish(cuMemPoolSetAccess(reinterpret_cast<CUmemoryPool>(pool),
                                   reinterpret_cast<const CUmemAccessDesc*>(descriptors), count));
}

CUDASIM_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep) {
  BIND_OR_RETURN;
  return finish(cuMemPoolTrimTo(reinterpret_cast<CUmemoryPool>(pool), minBytesToKeep));
}

CUDASIM_API cudaError_t cudaDeviceGetGraphMemAttribute(int device,
                                                       enum cudaGraphMemAttributeType attribute,
                                                       void* value) {
  BIND_OR_RETURN;
  return finish(
      cuDeviceGetGraphMemAttribute(device, static_cast<CUgraphMem_attribute>(attribute), value));
}

CUDASIM_API cudaError_t cudaDeviceSetGraphMemAttribute(int device,
                                                       enum cudaGraphMemAttributeType attribute,
                                                       void* value) {
  BIND_OR_RETURN;
  return finish(
      cuDeviceSetGraphMemAttribute(device, static_cast<CUgraphMem_attribute>(attribute), value));
}

// ---- registered host memory, IPC ------------------------------------------------------------

CUDASIM_API cudaError_t cudaHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuMemHostRegister(pointer, bytes, flags));
}

CUDASIM_API cudaError_t cudaHostUnregister(void* pointer) {
  BIND_OR_RETURN;
  return finish(cuMemHostUnregister(pointer));
}

CUDASIM_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* pointer) {
  BIND_OR_RETURN;
  static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
  return finish(
      cuIpcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), devicePointer(pointer)));
}

CUDASIM_API cudaError_t cudaIpcOpenMemHandle(void** pointer, cudaIpcMemHandle_t handle,
                                             unsigned int flags) {
  BIND_OR_RETURN;
  if (pointer == nullptr) return finish(cudaErrorInvalidValue);
  CUipcMemHandle driverHandle;
  std::memcpy(&driverHandle, &handle, sizeof(driverHandle));
  CUdeviceptr address = 0;
  CUresult result = cuIpcOpenMemHandle(&address, driverHandle, flags);
  *pointer = reinterpret_cast<void*>(address);
  return finish(result == CUDA_ERROR_INVALID_CONTEXT ? cudaErrorDeviceUninitialized
                                                     : toRuntime(result));
}

CUDASIM_API cudaError_t cudaIpcCloseMemHandle(void* pointer) {
  BIND_OR_RETURN;
  return finish(cuIpcCloseMemHandle(devicePointer(pointer)));
}

CUDASIM_API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  BIND_OR_RETURN;
  return finish(
      cuIpcGetEventHandle(reinterpret_cast<CUipcEventHandle*>(handle), driverEvent(event)));
}

CUDASIM_API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  BIND_OR_RETURN;
  CUipcEventHandle driverHandle;
  std::memcpy(&driverHandle, &handle, sizeof(driverHandle));
  return finish(cuIpcOpenEventHandle(reinterpret_cast<CUevent*>(event), driverHandle));
}

// ---- copies --------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dstPitch, const void* src,
                                          size_t srcPitch, size_t width, size_t height,
                                          enum cudaMemcpyKind kind, cudaStream_t stream) {
  BIND_OR_RETURN;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return finish(cudaErrorInvalidMemcpyDirection);
  }
  if (height > 1 && (width > dstPitch || width > srcPitch)) {
    return finish(cudaErrorInvalidPitchValue);
  }
  CUDA_MEMCPY2D copy = unifiedCopy(dst, dstPitch, src, srcPitch, width, height);
  return finish(cuMemcpy2DAsync(&copy, driverStream(stream)));
}

CUDASIM_API cudaError_t cudaMemcpy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch,
                                     size_t width, size_t height, enum cudaMemcpyKind kind) {
  BIND_OR_RETURN;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return finish(cudaErrorInvalidMemcpyDirection);
  }
  if (height > 1 && (width > dstPitch || width > srcPitch)) {
    return finish(cudaErrorInvalidPitchValue);
  }
  CUDA_MEMCPY2D copy = unifiedCopy(dst, dstPitch, src, srcPitch, width, height);
  return finish(cuMemcpy2D(&copy));
}

// ---- devices and streams -------------------------------------------------------------------

CUDASIM_API cudaError_t cudaDeviceGetPCIBusId(char* busId, int length, int device) {
  BIND_OR_RETURN;
  return finish(cuDeviceGetPCIBusId(busId, length, device));
}

CUDASIM_API cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority,
                                                         int* greatestPriority) {
  BIND_OR_RETURN;
  return finish(cuCtxGetStreamPriorityRange(leastPriority, greatestPriority));
}

CUDASIM_API cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  BIND_OR_RETURN;
  return finish(cuStreamGetPriority(driverStream(stream), priority));
}

namespace {
struct StreamCallback {
  cudaStreamCallback_t callback;
  void* userData;
};
}  // namespace

CUDASIM_API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                              void* userData, unsigned int flags) {
  BIND_OR_RETURN;
  if (callback == nullptr || flags != 0) return finish(cudaErrorInvalidValue);
  auto* pending = new StreamCallback{callback, userData};
  CUresult result = cuStreamAddCallback(
      driverStream(stream),
      [](CUstream handle, CUresult status, void* data) {
        auto* call = static_cast<StreamCallback*>(data);
        call->callback(reinterpret_cast<cudaStream_t>(handle), toRuntime(status), call->userData);
        delete call;
      },
      pending, 0);
  if (result != CUDA_SUCCESS) delete pending;
  return finish(result);
}

// ---- driver entry points -------------------------------------------------------------------

CUDASIM_API cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** function, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return finish(cudaErrorInvalidValue);
  if (cuInit(0) != CUDA_SUCCESS) return finish(cudaErrorInitializationError);
  // The query result tells a missing symbol apart; the call itself succeeds, as in CUDA.
  CUdriverProcAddressQueryResult driverStatus = CU_GET_PROC_ADDRESS_SUCCESS;
  cuGetProcAddress(symbol, function, static_cast<int>(cudaVersion), flags, &driverStatus);
  if (status) *status = static_cast<cudaDriverEntryPointQueryResult>(driverStatus);
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function,
                                                unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPointByVersion(symbol, function, CUDART_VERSION, flags, status);
}

// ---- graphs --------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                      unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

CUDASIM_API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes,
                                          size_t* count) {
  BIND_OR_RETURN;
  return finish(cuGraphGetNodes(reinterpret_cast<CUgraph>(graph),
                                reinterpret_cast<CUgraphNode*>(nodes), count));
}

CUDASIM_API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node,
                                                     cudaGraphNode_t* dependencies,
                                                     cudaGraphEdgeData* edgeData, size_t* count) {
  BIND_OR_RETURN;
  static_assert(sizeof(cudaGraphEdgeData) == sizeof(CUgraphEdgeData));
  return finish(cuGraphNodeGetDependencies(reinterpret_cast<CUgraphNode>(node),
                                           reinterpret_cast<CUgraphNode*>(dependencies),
                                           reinterpret_cast<CUgraphEdgeData*>(edgeData), count));
}

CUDASIM_API cudaError_t cudaGraphAddNode(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*,
                                         const cudaGraphEdgeData*, size_t,
                                         struct cudaGraphNodeParams*) {
  BIND_OR_RETURN;
  return finish(cudaErrorNotSupported);  // the sim's graphs come from stream capture only
}

CUDASIM_API cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle*, cudaGraph_t,
                                                         unsigned int, unsigned int) {
  BIND_OR_RETURN;
  return finish(cudaErrorNotSupported);
}

CUDASIM_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t, cudaGraph_t,
                                                      const cudaGraphNode_t*,
                                                      const cudaGraphEdgeData*, size_t,
                                                      enum cudaStreamCaptureMode) {
  BIND_OR_RETURN;
  return finish(cudaErrorNotSupported);
}

CUDASIM_API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t, cudaGraphNode_t*,
                                                            const cudaGraphEdgeData*, size_t,
                                                            unsigned int) {
  BIND_OR_RETURN;
  return finish(cudaErrorNotSupported);
}

CUDASIM_API cudaError_t cudaUserObjectCreate(cudaUserObject_t* object, void* pointer,
                                             cudaHostFn_t destroy, unsigned int initialReferences,
                                             unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuUserObjectCreate(reinterpret_cast<CUuserObject*>(object), pointer, destroy,
                                   initialReferences, flags));
}

CUDASIM_API cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count) {
  BIND_OR_RETURN;
  return finish(cuUserObjectRetain(reinterpret_cast<CUuserObject>(object), count));
}

CUDASIM_API cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  BIND_OR_RETURN;
  return finish(cuUserObjectRelease(reinterpret_cast<CUuserObject>(object), count));
}

CUDASIM_API cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                                  unsigned int count, unsigned int flags) {
  BIND_OR_RETURN;
  return finish(cuGraphRetainUserObject(reinterpret_cast<CUgraph>(graph),
                                        reinterpret_cast<CUuserObject>(object), count, flags));
}

CUDASIM_API cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                                   unsigned int count) {
  BIND_OR_RETURN;
  return finish(cuGraphReleaseUserObject(reinterpret_cast<CUgraph>(graph),
                                         reinterpret_cast<CUuserObject>(object), count));
}

// ---- profiler ------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaProfilerStart(void) {
  BIND_OR_RETURN;
  return finish(cuProfilerStart());
}

CUDASIM_API cudaError_t cudaProfilerStop(void) {
  BIND_OR_RETURN;
  return finish(cuProfilerStop());
}
