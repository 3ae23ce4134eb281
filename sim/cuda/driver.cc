// The driver API of the sim (libcuda.so.1). The names are those cuda.h produces (its macros turn
// e.g. cuEventDestroy into cuEventDestroy_v2), so a program or tool built against the real
// header links and resolves against these unchanged.
#include <cuda.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

#include "driver_internal.h"

using namespace cudasim;

namespace {

thread_local CUcontext t_context = nullptr;

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* findError(CUresult code) {
  for (const ErrorText& entry : kErrors) {
    if (entry.code == code) return &entry;
  }
  return nullptr;
}

bool validDevice(CUdevice device) {
  return device >= 0 && device < deviceCount();
}

// Work on "device memory" is plain host memory access: the heap is ordinary shared memory.
CUresult copyOnStream(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream handle, bool wait) {
  RESOLVE_STREAM(stream, handle);
  void* to = reinterpret_cast<void*>(dst);
  const void* from = reinterpret_cast<const void*>(src);
  if (bytes > 0 && (to == nullptr || from == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  uint64_t ticket = enqueue(stream, [to, from, bytes] { std::memmove(to, from, bytes); });
  if (wait && ticket != 0) waitFor({stream, ticket});
  return CUDA_SUCCESS;
}

CUresult setOnStream(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream handle,
                     bool wait) {
  RESOLVE_STREAM(stream, handle);
  void* to = reinterpret_cast<void*>(dst);
  if (bytes > 0 && to == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t ticket = enqueue(stream, [to, value, bytes] { std::memset(to, value, bytes); });
  if (wait && ticket != 0) waitFor({stream, ticket});
  return CUDA_SUCCESS;
}

}  // namespace

namespace cudasim {

CUcontext currentContext() {
  return t_context;
}

bool debugEnabled() {
  static const bool enabled = [] {
    const char* text = std::getenv("CUDASIM_DEBUG");
    return text != nullptr && std::strcmp(text, "0") != 0 && *text != '\0';
  }();
  return enabled;
}

}  // namespace cudasim

// ---- initialization, devices, contexts ----------------------------------------------------

CUDASIM_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  markInitialized();
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGetCount(int* count) {
  REQUIRE_INIT;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = deviceCount();
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  REQUIRE_INIT;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  REQUIRE_INIT;
  if (name == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::strncpy(name, "ncclwatch sim device", static_cast<size_t>(length) - 1);
  name[length - 1] = '\0';
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  REQUIRE_INIT;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = heapBytes();
  return CUDA_SUCCESS;
}

namespace {
// The attributes of every virtual device: those of a compute-capability-9.0 part with one
// multiprocessor. Anything not listed is 0 (absent features: textures, VMM, multicast, IPC
// events, GPUDirect RDMA), so programs take the paths the sim implements.
int attributeValue(CUdevice_attribute attribute, CUdevice device) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return 233472;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;  // kHz
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;  // kHz
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 50 << 20;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return 32;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return device;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO:
      return 2;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return 1;
    default:
      return 0;
  }
}
}  // namespace

CUDASIM_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                          CUdevice device) {
  REQUIRE_INIT;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute < 1 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  *value = attributeValue(attribute, device);
  return CUDA_SUCCESS;
}

namespace {
// Retains of each device's primary context: a context is active while retained.
std::mutex g_retainsMutex;
std::vector<int> g_retains;
pid_t g_retainsPid = 0;

int& retainsOf(CUdevice device) {
  if (g_retainsPid != getpid()) {  // a fork child starts with no context
    g_retains.assign(deviceCount(), 0);
    g_retainsPid = getpid();
  }
  return g_retains[device];
}
}  // namespace

CUDASIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  REQUIRE_INIT;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  {
    std::lock_guard<std::mutex> lock(g_retainsMutex);
    ++retainsOf(device);
  }
  *context = primaryContext(device);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  REQUIRE_INIT;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_retainsMutex);
  int& retains = retainsOf(device);
  if (retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --retains;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  REQUIRE_INIT;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_retainsMutex);
  *flags = 0;
  *active = retainsOf(device) > 0;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetCurrent(CUcontext* context) {
  REQUIRE_INIT;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *context = t_context;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxSetCurrent(CUcontext context) {
  REQUIRE_INIT;
  if (context != nullptr) {
    int device = contextDevice(context);
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    setCurrentDevice(device);
  }
  t_context = context;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetDevice(CUdevice* device) {
  REQUIRE_INIT;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (t_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = currentDevice();
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxSynchronize(void) {
  REQUIRE_INIT;
  if (t_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  synchronizeDevice(currentDevice());
  return CUDA_SUCCESS;
}

// ---- memory ------------------------------------------------------------------------------

namespace {
CUresult allocateInto(void** pointer, size_t bytes, MemoryKind kind) {
  REQUIRE_INIT;
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  *pointer = allocate(bytes, kind);
  return *pointer ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
}  // namespace

CUDASIM_API CUresult cuMemAlloc(CUdeviceptr* pointer, size_t bytes) {
  if (pointer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  CUresult result = allocateInto(&p, bytes, MemoryKind::kDevice);
  *pointer = reinterpret_cast<CUdeviceptr>(p);
  return result;
}

CUDASIM_API CUresult cuMemAllocManaged(CUdeviceptr* pointer, size_t bytes, unsigned int) {
  if (pointer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  CUresult result = allocateInto(&p, bytes, MemoryKind::kManaged);
  *pointer = reinterpret_cast<CUdeviceptr>(p);
  return result;
}

CUDASIM_API CUresult cuMemAllocHost(void** pointer, size_t bytes) {
  return allocateInto(pointer, bytes, MemoryKind::kHost);
}

CUDASIM_API CUresult cuMemHostAlloc(void** pointer, size_t bytes, unsigned int) {
  return allocateInto(pointer, bytes, MemoryKind::kHost);
}

CUDASIM_API CUresult cuMemFree(CUdeviceptr pointer) {
  REQUIRE_INIT;
  if (pointer == 0) return CUDA_SUCCESS;
  if (!release(reinterpret_cast<void*>(pointer))) return CUDA_ERROR_INVALID_VALUE;
  forgetPoolAllocation(reinterpret_cast<void*>(pointer));  // cuMemAllocAsync memory may come here
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuMemFreeHost(void* pointer) {
  REQUIRE_INIT;
  if (pointer == nullptr) return CUDA_SUCCESS;
  return release(pointer) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUDASIM_API CUresult cuMemGetInfo(size_t* freeBytes, size_t* totalBytes) {
  REQUIRE_INIT;
  if (freeBytes == nullptr || totalBytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *totalBytes = heapBytes();
  *freeBytes = *totalBytes - heapBytesInUse();
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                           CUdeviceptr pointer) {
  REQUIRE_INIT;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  MemoryKind kind;
  int device;
  if (!locate(reinterpret_cast<const void*>(pointer), &kind, &device)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) =
          kind == MemoryKind::kHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<unsigned int*>(data) = kind == MemoryKind::kManaged;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUDASIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  REQUIRE_INIT;
  return copyOnStream(dst, src, bytes, nullptr, true);
}

CUDASIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                   CUstream stream) {
  REQUIRE_INIT;
  return copyOnStream(dst, src, bytes, stream, false);
}

CUDASIM_API CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t bytes) {
  REQUIRE_INIT;
  return setOnStream(dst, value, bytes, nullptr, true);
}

CUDASIM_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes,
                                     CUstream stream) {
  REQUIRE_INIT;
  return setOnStream(dst, value, bytes, stream, false);
}

// ---- streams -----------------------------------------------------------------------------

CUDASIM_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                                int priority) {
  REQUIRE_INIT;
  if (stream == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Out-of-range priorities are clamped to the device's range [-5, 0], as CUDA does.
  *stream = createStream(flags, std::clamp(priority, -5, 0));
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return cuStreamCreateWithPriority(stream, flags, 0);
}

CUDASIM_API CUresult cuStreamDestroy(CUstream stream) {
  REQUIRE_INIT;
  return destroyStream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuStreamGetFlags(CUstream handle, unsigned int* flags) {
  REQUIRE_INIT;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  *flags = stream->flags;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamQuery(CUstream handle) {
  REQUIRE_INIT;
  RESOLVE_STREAM(stream, handle);
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  if (captureStatus(stream, nullptr, nullptr) != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return streamIdle(stream) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUDASIM_API CUresult cuStreamSynchronize(CUstream handle) {
  REQUIRE_INIT;
  RESOLVE_STREAM(stream, handle);
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  if (captureStatus(stream, nullptr, nullptr) != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  synchronizeStream(stream);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamWaitEvent(CUstream handle, CUevent eventHandle, unsigned int) {
  REQUIRE_INIT;
  RESOLVE_STREAM(stream, handle);
  RESOLVE_EVENT(event, eventHandle);
  streamWaitEvent(stream, event);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuLaunchHostFunc(CUstream handle, CUhostFn function, void* userData) {
  REQUIRE_INIT;
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  enqueue(stream, [function, userData] { function(userData); });
  return CUDA_SUCCESS;
}

// ---- capture -----------------------------------------------------------------------------

CUDASIM_API CUresult cuStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode) {
  REQUIRE_INIT;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  RESOLVE_STREAM(stream, handle);
  return beginCapture(stream, mode);
}

CUDASIM_API CUresult cuStreamEndCapture(CUstream handle, CUgraph* graph) {
  REQUIRE_INIT;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  return endCapture(stream, graph);
}

CUDASIM_API CUresult cuStreamIsCapturing(CUstream handle, CUstreamCaptureStatus* status) {
  REQUIRE_INIT;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  *status = captureStatus(stream, nullptr, nullptr);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamGetCaptureInfo(CUstream handle, CUstreamCaptureStatus* status,
                                            cuuint64_t* id, CUgraph* graph,
                                            const CUgraphNode** dependencies,
                                            const CUgraphEdgeData** edgeData,
                                            size_t* numDependencies) {
  REQUIRE_INIT;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  uint64_t captureId = 0;
  CUgraph captureGraph = nullptr;
  *status = captureStatus(stream, &captureId, &captureGraph);
  if (id) *id = captureId;
  if (graph) *graph = captureGraph;
  // The sim's graphs are linear: no node handles to report.
  if (dependencies) *dependencies = nullptr;
  if (edgeData) *edgeData = nullptr;
  if (numDependencies) *numDependencies = 0;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = exchangeThreadCaptureMode(*mode);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graphHandle,
                                        unsigned long long) {
  REQUIRE_INIT;
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Graph> graph = resolveGraph(graphHandle);
  if (!graph) return CUDA_ERROR_INVALID_HANDLE;
  *exec = instantiateGraph(graph);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphLaunch(CUgraphExec execHandle, CUstream handle) {
  REQUIRE_INIT;
  std::shared_ptr<Graph> exec = resolveGraphExec(execHandle);
  if (!exec) return CUDA_ERROR_INVALID_HANDLE;
  RESOLVE_STREAM(stream, handle);
  launchGraph(exec, stream);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphDestroy(CUgraph graph) {
  REQUIRE_INIT;
  return destroyGraph(graph) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuGraphExecDestroy(CUgraphExec exec) {
  REQUIRE_INIT;
  return destroyGraphExec(exec) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

// ---- events ------------------------------------------------------------------------------

CUDASIM_API CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  REQUIRE_INIT;
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (event == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  *event = createEvent(flags);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuEventRecord(CUevent eventHandle, CUstream handle) {
  REQUIRE_INIT;
  RESOLVE_EVENT(event, eventHandle);
  RESOLVE_STREAM(stream, handle);
  recordEvent(event, stream);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuEventRecordWithFlags(CUevent eventHandle, CUstream handle,
                                            unsigned int flags) {
  if (flags & ~CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  return cuEventRecord(eventHandle, handle);
}

CUDASIM_API CUresult cuEventQuery(CUevent eventHandle) {
  REQUIRE_INIT;
  RESOLVE_EVENT(event, eventHandle);
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  return eventComplete(event) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUDASIM_API CUresult cuEventSynchronize(CUevent eventHandle) {
  REQUIRE_INIT;
  RESOLVE_EVENT(event, eventHandle);
  if (CUresult unsafe = checkUnsafeCall()) return unsafe;
  synchronizeEvent(event);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuEventDestroy(CUevent event) {
  REQUIRE_INIT;
  return destroyEvent(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuEventElapsedTime(float* milliseconds, CUevent startHandle,
                                        CUevent endHandle) {
  REQUIRE_INIT;
  if (milliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_EVENT(start, startHandle);
  RESOLVE_EVENT(end, endHandle);
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!eventComplete(start) || !eventComplete(end)) return CUDA_ERROR_NOT_READY;
  int64_t startNs, endNs;
  {
    std::lock_guard<std::mutex> lock(start->mutex);
    startNs = start->completedAtNs;
  }
  {
    std::lock_guard<std::mutex> lock(end->mutex);
    endNs = end->completedAtNs;
  }
  if (startNs < 0 || endNs < 0) return CUDA_ERROR_INVALID_HANDLE;  // never recorded
  *milliseconds = static_cast<float>(endNs - startNs) / 1e6f;
  return CUDA_SUCCESS;
}

// ---- errors ------------------------------------------------------------------------------

CUDASIM_API CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* entry = findError(error);
  *text = entry ? entry->text : nullptr;
  return entry ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUDASIM_API CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* entry = findError(error);
  *name = entry ? entry->name : nullptr;
  return entry ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
