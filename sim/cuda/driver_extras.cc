// More of the driver API (libcuda.so.1 of the sim), as PyTorch and the libraries it loads use it:
// contexts and device identity, stream priorities and callbacks, 2D and typed copies, stream-
// ordered allocation from memory pools, IPC memory handles, registered host memory, graph
// queries and user objects. See docs/sim.md for what each models and what it does not.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cudaProfiler.h>

#include "cudasim_ext.h"
#include "driver_internal.h"

using namespace cudasim;

namespace {

constexpr int kLeastStreamPriority = 0;
constexpr int kGreatestStreamPriority = -5;  // as a compute-capability-9.0 device

bool validDevice(CUdevice device) {
  return device >= 0 && device < deviceCount();
}

thread_local std::vector<CUcontext> t_contextStack;

CUresult copy2D(const CUDA_MEMCPY2D* copy, CUstream handle, bool wait) {
  REQUIRE_INIT;
  if (copy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (copy->srcMemoryType == CU_MEMORYTYPE_ARRAY || copy->dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    return CUDA_ERROR_NOT_SUPPORTED;  // the sim has no CUDA arrays
  }
  if (copy->Height > 1 &&
      (copy->WidthInBytes > copy->srcPitch || copy->WidthInBytes > copy->dstPitch)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  RESOLVE_STREAM(stream, handle);
  auto address = [](CUmemorytype type, const void* host, CUdeviceptr device) {
    return type == CU_MEMORYTYPE_HOST ? static_cast<const char*>(host)
                                      : reinterpret_cast<const char*>(device);
  };
  const char* from = address(copy->srcMemoryType, copy->srcHost, copy->srcDevice) +
                     copy->srcY * copy->srcPitch + copy->srcXInBytes;
  char* to = const_cast<char*>(address(copy->dstMemoryType, copy->dstHost, copy->dstDevice)) +
             copy->dstY * copy->dstPitch + copy->dstXInBytes;
  if (copy->WidthInBytes > 0 && copy->Height > 0 && (from == nullptr || to == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t width = copy->WidthInBytes, height = copy->Height;
  size_t srcPitch = copy->srcPitch, dstPitch = copy->dstPitch;
  uint64_t ticket = enqueue(stream, [=] {
    for (size_t row = 0; row < height; ++row) {
      std::memmove(to + row * dstPitch, from + row * srcPitch, width);
    }
  });
  if (wait && ticket != 0) waitFor({stream, ticket});
  return CUDA_SUCCESS;
}

template <typename T>
CUresult setWords(CUdeviceptr dst, T value, size_t count, CUstream handle, bool wait) {
  REQUIRE_INIT;
  RESOLVE_STREAM(stream, handle);
  auto* to = reinterpret_cast<T*>(dst);
  if (count > 0 && to == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (reinterpret_cast<uintptr_t>(to) % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t ticket = enqueue(stream, [=] { std::fill(to, to + count, value); });
  if (wait && ticket != 0) waitFor({stream, ticket});
  return CUDA_SUCCESS;
}

// ---- memory pools --------------------------------------------------------------------------

// One pool per device, its default; stream-ordered allocations come from the sim's heap.
struct Pool {
  int device = 0;
  std::mutex mutex;
  uint64_t releaseThreshold = 0;
  int reuseFollowEventDependencies = 1;
  int reuseAllowOpportunistic = 1;
  int reuseAllowInternalDependencies = 1;
  uint64_t usedBytes = 0;
  uint64_t usedHigh = 0;
  std::unordered_map<void*, size_t> allocations;
};

struct Pools {
  std::mutex mutex;
  std::vector<std::unique_ptr<Pool>> byDevice;
};

Pools& pools() {
  static Pools* instance = new Pools();  // leaked: frees may be queued at exit
  return *instance;
}

Pool* defaultPool(int device) {
  Pools& all = pools();
  std::lock_guard<std::mutex> lock(all.mutex);
  if (all.byDevice.empty()) {
    for (int i = 0; i < deviceCount(); ++i) {
      all.byDevice.push_back(std::make_unique<Pool>());
      all.byDevice.back()->device = i;
    }
  }
  return device >= 0 && device < static_cast<int>(all.byDevice.size()) ? all.byDevice[device].get()
                                                                       : nullptr;
}

Pool* findPool(CUmemoryPool handle) {
  for (int device = 0; device < deviceCount(); ++device) {
    if (Pool* pool = defaultPool(device); reinterpret_cast<CUmemoryPool>(pool) == handle) {
      return pool;
    }
  }
  return nullptr;
}

// The pool that allocated `pointer` (removing the record when `forget`), or null.
Pool* poolOf(void* pointer, bool forget, size_t* bytes) {
  for (int device = 0; device < deviceCount(); ++device) {
    Pool* pool = defaultPool(device);
    std::lock_guard<std::mutex> lock(pool->mutex);
    auto it = pool->allocations.find(pointer);
    if (it == pool->allocations.end()) continue;
    if (bytes) *bytes = it->second;
    if (forget) {
      pool->usedBytes -= it->second;
      pool->allocations.erase(it);
    }
    return pool;
  }
  return nullptr;
}

CUresult allocateFromPool(CUdeviceptr* pointer, size_t bytes, Pool* pool, CUstream handle) {
  REQUIRE_INIT;
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  if (captureStatus(stream, nullptr, nullptr) != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_NOT_SUPPORTED;  // allocation nodes in captured graphs are not modelled
  }
  // Memory is usable in stream order from here on; taking it from the heap at once is safe.
  void* memory = allocate(bytes, MemoryKind::kDevice);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  {
    std::lock_guard<std::mutex> lock(pool->mutex);
    pool->allocations[memory] = bytes;
    pool->usedBytes += bytes;
    pool->usedHigh = std::max(pool->usedHigh, pool->usedBytes);
  }
  *pointer = reinterpret_cast<CUdeviceptr>(memory);
  return CUDA_SUCCESS;
}

// ---- IPC memory handles --------------------------------------------------------------------

// What a CUipcMemHandle carries on the sim: where the allocation lives in its owner's heap.
struct IpcMemHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t offset;  // of the allocation's start in the owner's heap
  uint64_t bytes;
};
static_assert(sizeof(IpcMemHandle) <= sizeof(CUipcMemHandle));
constexpr char kIpcMagic[8] = {'c', 'u', 'd', 'a', 's', 'i', 'm', '1'};

// A peer's heap, mapped once per process and shared by every handle opened from it.
struct PeerHeap {
  char* base = nullptr;
  size_t bytes = 0;
  int opened = 0;
};

struct IpcState {
  std::mutex mutex;
  std::map<int, PeerHeap> peers;  // by owner pid
};

IpcState& ipc() {
  static IpcState* instance = new IpcState();
  return *instance;
}

// ---- user objects --------------------------------------------------------------------------

struct UserObject {
  void* pointer = nullptr;
  CUhostFn destroy = nullptr;
  std::atomic<long long> references{0};
};

std::mutex g_userObjectsMutex;
std::unordered_map<const void*, UserObject*>& userObjects() {
  static auto* instance = new std::unordered_map<const void*, UserObject*>();
  return *instance;
}

UserObject* findUserObject(CUuserObject handle) {
  std::lock_guard<std::mutex> lock(g_userObjectsMutex);
  auto it = userObjects().find(handle);
  return it == userObjects().end() ? nullptr : it->second;
}

void releaseUserObject(UserObject* object, unsigned count) {
  if (object->references.fetch_sub(count) != static_cast<long long>(count)) return;
  {
    std::lock_guard<std::mutex> lock(g_userObjectsMutex);
    userObjects().erase(object);
  }
  // CUDA runs destructors asynchronously and forbids CUDA calls in them; running it here,
  // with no lock of ours held, is one of the schedules CUDA may choose.
  if (object->destroy) object->destroy(object->pointer);
  delete object;
}

}  // namespace

void cudasim::forgetPoolAllocation(void* pointer) {
  poolOf(pointer, true, nullptr);
}

// ---- contexts and devices ------------------------------------------------------------------

CUDASIM_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice device, unsigned int) {
  REQUIRE_INIT;
  return validDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUDASIM_API CUresult cuDevicePrimaryCtxReset(CUdevice device) {
  REQUIRE_INIT;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  synchronizeDevice(device);  // the sim keeps allocations; it only drains the device's work
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  REQUIRE_INIT;
  if (leastPriority) *leastPriority = kLeastStreamPriority;
  if (greatestPriority) *greatestPriority = kGreatestStreamPriority;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetFlags(unsigned int* flags) {
  REQUIRE_INIT;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = 0;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetApiVersion(CUcontext context, unsigned int* version) {
  REQUIRE_INIT;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (context != nullptr && contextDevice(context) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxGetId(CUcontext context, unsigned long long* id) {
  REQUIRE_INIT;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (context == nullptr) context = currentContext();
  int device = context ? contextDevice(context) : -1;
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *id = static_cast<unsigned long long>(device) + 1;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxPushCurrent(CUcontext context) {
  REQUIRE_INIT;
  if (context == nullptr || contextDevice(context) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  t_contextStack.push_back(currentContext());
  return cuCtxSetCurrent(context);
}

CUDASIM_API CUresult cuCtxPopCurrent(CUcontext* context) {
  REQUIRE_INIT;
  CUcontext current = currentContext();
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (context) *context = current;
  CUcontext previous = nullptr;
  if (!t_contextStack.empty()) {
    previous = t_contextStack.back();
    t_contextStack.pop_back();
  }
  return cuCtxSetCurrent(previous);
}

CUDASIM_API CUresult cuDeviceGetPCIBusId(char* busId, int length, CUdevice device) {
  REQUIRE_INIT;
  if (busId == nullptr || length <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  // Domain 0, bus = the device's CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, device 0, function 0.
  std::snprintf(busId, static_cast<size_t>(length), "0000:%02x:00.0", device);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  REQUIRE_INIT;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  // A fixed, distinct id per virtual device ("cudasim" and the ordinal).
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, "cudasim", 7);
  uuid->bytes[12] = static_cast<char>((device >> 24) & 0xff);
  uuid->bytes[13] = static_cast<char>((device >> 16) & 0xff);
  uuid->bytes[14] = static_cast<char>((device >> 8) & 0xff);
  uuid->bytes[15] = static_cast<char>(device & 0xff);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceCanAccessPeer(int* canAccess, CUdevice device, CUdevice peer) {
  REQUIRE_INIT;
  if (canAccess == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device) || !validDevice(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *canAccess = device != peer;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attribute,
                                             CUdevice source, CUdevice destination) {
  REQUIRE_INIT;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(source) || !validDevice(destination) || source == destination) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *value = attribute == CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ? 0 : 1;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  REQUIRE_INIT;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer == nullptr || contextDevice(peer) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;  // every device of the sim reads every other's memory
}

// ---- streams -------------------------------------------------------------------------------

CUDASIM_API CUresult cuStreamGetPriority(CUstream handle, int* priority) {
  REQUIRE_INIT;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  *priority = std::clamp(stream->priority, kGreatestStreamPriority, kLeastStreamPriority);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamAddCallback(CUstream handle, CUstreamCallback callback, void* userData,
                                         unsigned int flags) {
  REQUIRE_INIT;
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  enqueue(stream, [=] { callback(handle, CUDA_SUCCESS, userData); });
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuStreamGetId(CUstream handle, unsigned long long* id) {
  REQUIRE_INIT;
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  RESOLVE_STREAM(stream, handle);
  *id = reinterpret_cast<uintptr_t>(stream.get());
  return CUDA_SUCCESS;
}

// ---- copies and memsets --------------------------------------------------------------------

CUDASIM_API CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D* copy, CUstream stream) {
  return copy2D(copy, stream, false);
}

CUDASIM_API CUresult cuMemcpy2D(const CUDA_MEMCPY2D* copy) {
  return copy2D(copy, nullptr, true);
}

CUDASIM_API CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  return cuMemcpy(dst, reinterpret_cast<CUdeviceptr>(src), bytes);
}

CUDASIM_API CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpy(reinterpret_cast<CUdeviceptr>(dst), src, bytes);
}

CUDASIM_API CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return cuMemcpy(dst, src, bytes);
}

CUDASIM_API CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes,
                                       CUstream stream) {
  return cuMemcpyAsync(dst, reinterpret_cast<CUdeviceptr>(src), bytes, stream);
}

CUDASIM_API CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), src, bytes, stream);
}

CUDASIM_API CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                       CUstream stream) {
  return cuMemcpyAsync(dst, src, bytes, stream);
}

CUDASIM_API CUresult cuMemsetD16(CUdeviceptr dst, unsigned short value, size_t count) {
  return setWords<unsigned short>(dst, value, count, nullptr, true);
}

CUDASIM_API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count,
                                      CUstream stream) {
  return setWords<unsigned short>(dst, value, count, stream, false);
}

CUDASIM_API CUresult cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t count) {
  return setWords<unsigned int>(dst, value, count, nullptr, true);
}

CUDASIM_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count,
                                      CUstream stream) {
  return setWords<unsigned int>(dst, value, count, stream, false);
}

// ---- address ranges and registered host memory --------------------------------------------

CUDASIM_API CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* bytes, CUdeviceptr pointer) {
  REQUIRE_INIT;
  char* start = nullptr;
  size_t size = 0;
  if (!allocationRange(reinterpret_cast<const void*>(pointer), &start, &size)) {
    return CUDA_ERROR_NOT_FOUND;
  }
  if (base) *base = reinterpret_cast<CUdeviceptr>(start);
  if (bytes) *bytes = size;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuMemHostRegister(void* pointer, size_t bytes, unsigned int) {
  REQUIRE_INIT;
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (locate(pointer, nullptr, nullptr)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  return registerHostRange(pointer, bytes) ? CUDA_SUCCESS
                                           : CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
}

CUDASIM_API CUresult cuMemHostUnregister(void* pointer) {
  REQUIRE_INIT;
  return unregisterHostRange(pointer) ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUDASIM_API CUresult cuMemHostGetDevicePointer(CUdeviceptr* devicePointer, void* pointer,
                                               unsigned int flags) {
  REQUIRE_INIT;
  if (devicePointer == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  MemoryKind kind;
  if (!locate(pointer, &kind, nullptr) || kind != MemoryKind::kHost) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *devicePointer = reinterpret_cast<CUdeviceptr>(pointer);  // unified addressing
  return CUDA_SUCCESS;
}

// ---- memory pools and stream-ordered allocation -------------------------------------------

CUDASIM_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  REQUIRE_INIT;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(defaultPool(device));
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  return cuDeviceGetDefaultMemPool(pool, device);  // no other pool can be made current
}

CUDASIM_API CUresult cuMemAllocAsync(CUdeviceptr* pointer, size_t bytes, CUstream stream) {
  REQUIRE_INIT;
  return allocateFromPool(pointer, bytes, defaultPool(currentDevice()), stream);
}

CUDASIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* pointer, size_t bytes,
                                             CUmemoryPool handle, CUstream stream) {
  REQUIRE_INIT;
  Pool* pool = findPool(handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return allocateFromPool(pointer, bytes, pool, stream);
}

CUDASIM_API CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream handle) {
  REQUIRE_INIT;
  RESOLVE_STREAM(stream, handle);
  if (pointer == 0) return CUDA_SUCCESS;
  void* memory = reinterpret_cast<void*>(pointer);
  char* base = nullptr;
  if (!allocationRange(memory, &base, nullptr) || base != memory) return CUDA_ERROR_INVALID_VALUE;
  if (captureStatus(stream, nullptr, nullptr) != CU_STREAM_CAPTURE_STATUS_NONE) {
    return CUDA_ERROR_NOT_SUPPORTED;  // free nodes in captured graphs are not modelled
  }
  // The memory goes back when the stream reaches this point, after the work that uses it.
  enqueue(stream, [memory] {
    poolOf(memory, true, nullptr);
    release(memory);
  });
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuMemPoolGetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                           void* value) {
  REQUIRE_INIT;
  Pool* pool = findPool(handle);
  if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(pool->mutex);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *static_cast<int*>(value) = pool->reuseFollowEventDependencies;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *static_cast<int*>(value) = pool->reuseAllowOpportunistic;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = pool->reuseAllowInternalDependencies;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *static_cast<cuuint64_t*>(value) = pool->releaseThreshold;
      return CUDA_SUCCESS;
    // Freed memory goes straight back to the heap, so reserved equals used.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = pool->usedBytes;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = pool->usedHigh;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUDASIM_API CUresult cuMemPoolSetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                           void* value) {
  REQUIRE_INIT;
  Pool* pool = findPool(handle);
  if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(pool->mutex);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      pool->reuseFollowEventDependencies = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      pool->reuseAllowOpportunistic = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      pool->reuseAllowInternalDependencies = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      pool->releaseThreshold = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // Only a reset to zero is allowed: the high mark restarts from the current use.
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->usedHigh = pool->usedBytes;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUDASIM_API CUresult cuMemPoolTrimTo(CUmemoryPool handle, size_t) {
  REQUIRE_INIT;
  return findPool(handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;  // nothing is kept back
}

CUDASIM_API CUresult cuMemPoolSetAccess(CUmemoryPool handle, const CUmemAccessDesc* map,
                                        size_t count) {
  REQUIRE_INIT;
  if (findPool(handle) == nullptr || (map == nullptr && count > 0)) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !validDevice(map[i].location.id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;  // every device reads every other's memory on the sim
}

CUDASIM_API CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool handle,
                                        CUmemLocation* location) {
  REQUIRE_INIT;
  if (flags == nullptr || location == nullptr || findPool(handle) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return CUDA_SUCCESS;
}

// ---- IPC -----------------------------------------------------------------------------------

CUDASIM_API CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  REQUIRE_INIT;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  char* base = nullptr;
  size_t bytes = 0;
  MemoryKind kind;
  if (!allocationRange(reinterpret_cast<void*>(pointer), &base, &bytes) ||
      !locate(base, &kind, nullptr) || kind != MemoryKind::kDevice) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  cudasimHeapRef ref;
  if (cudasimHeapLocate(base, &ref) != 0) return CUDA_ERROR_INVALID_VALUE;
  IpcMemHandle content{};
  std::memcpy(content.magic, kIpcMagic, sizeof(kIpcMagic));
  content.pid = ref.pid;
  content.fd = ref.fd;
  content.offset = ref.offset;
  content.bytes = bytes;
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &content, sizeof(content));
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuIpcOpenMemHandle(CUdeviceptr* pointer, CUipcMemHandle handle,
                                        unsigned int flags) {
  REQUIRE_INIT;
  if (pointer == nullptr || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  IpcMemHandle content;
  std::memcpy(&content, handle.reserved, sizeof(content));
  if (std::memcmp(content.magic, kIpcMagic, sizeof(kIpcMagic)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // CUDA opens a handle only in another process.
  if (content.pid == static_cast<int32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  size_t heapBytes = cudasimHeapSize();
  if (content.offset + content.bytes > heapBytes) return CUDA_ERROR_INVALID_VALUE;
  IpcState& state = ipc();
  std::lock_guard<std::mutex> lock(state.mutex);
  PeerHeap& peer = state.peers[content.pid];
  if (peer.base == nullptr) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", content.pid, content.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      state.peers.erase(content.pid);
      return CUDA_ERROR_INVALID_HANDLE;  // the owner is gone, or not ours to read
    }
    void* base =
        mmap(nullptr, heapBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      state.peers.erase(content.pid);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    peer.base = static_cast<char*>(base);
    peer.bytes = heapBytes;
  }
  ++peer.opened;
  *pointer = reinterpret_cast<CUdeviceptr>(peer.base + content.offset);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuIpcCloseMemHandle(CUdeviceptr pointer) {
  REQUIRE_INIT;
  auto* address = reinterpret_cast<char*>(pointer);
  IpcState& state = ipc();
  std::lock_guard<std::mutex> lock(state.mutex);
  for (auto it = state.peers.begin(); it != state.peers.end(); ++it) {
    PeerHeap& peer = it->second;
    if (address < peer.base || address >= peer.base + peer.bytes) continue;
    if (--peer.opened == 0) {
      munmap(peer.base, peer.bytes);
      state.peers.erase(it);
    }
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// Events are per process on the sim: another process cannot wait on them.
CUDASIM_API CUresult cuIpcGetEventHandle(CUipcEventHandle*, CUevent) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUDASIM_API CUresult cuIpcOpenEventHandle(CUevent*, CUipcEventHandle) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ---- graphs: queries of captured (linear) graphs, user objects, graph memory -------------

CUDASIM_API CUresult cuGraphGetNodes(CUgraph handle, CUgraphNode* nodes, size_t* count) {
  REQUIRE_INIT;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Graph> graph = resolveGraph(handle);
  if (!graph) return CUDA_ERROR_INVALID_HANDLE;
  size_t total = graph->items.size();
  if (nodes == nullptr) {
    *count = total;
    return CUDA_SUCCESS;
  }
  size_t filled = std::min(*count, total);
  for (size_t i = 0; i < filled; ++i) {
    nodes[i] = reinterpret_cast<CUgraphNode>(&graph->items[i]);
  }
  for (size_t i = filled; i < *count; ++i) nodes[i] = nullptr;
  *count = filled;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* dependencies,
                                                CUgraphEdgeData* edgeData, size_t* count) {
  REQUIRE_INIT;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t index = 0;
  std::shared_ptr<Graph> graph = graphOfNode(node, &index);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  size_t total = index > 0 ? 1 : 0;  // the sim's graphs are chains
  if (dependencies == nullptr) {
    *count = total;
    return CUDA_SUCCESS;
  }
  size_t filled = std::min(*count, total);
  if (filled == 1) {
    dependencies[0] = reinterpret_cast<CUgraphNode>(&graph->items[index - 1]);
    if (edgeData) std::memset(&edgeData[0], 0, sizeof(edgeData[0]));
  }
  *count = filled;
  return CUDA_SUCCESS;
}

// Building graphs node by node is not modelled: the sim's graphs come from stream capture.
CUDASIM_API CUresult cuGraphAddNode(CUgraphNode*, CUgraph, const CUgraphNode*,
                                    const CUgraphEdgeData*, size_t, CUgraphNodeParams*) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUDASIM_API CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle*, CUgraph, CUcontext,
                                                    unsigned int, unsigned int) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUDASIM_API CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode*,
                                                 const CUgraphEdgeData*, size_t,
                                                 CUstreamCaptureMode) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUDASIM_API CUresult cuStreamUpdateCaptureDependencies(CUstream, CUgraphNode*,
                                                       const CUgraphEdgeData*, size_t,
                                                       unsigned int) {
  REQUIRE_INIT;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUDASIM_API CUresult cuUserObjectCreate(CUuserObject* handle, void* pointer, CUhostFn destroy,
                                        unsigned int initialReferences, unsigned int flags) {
  REQUIRE_INIT;
  if (handle == nullptr || destroy == nullptr || initialReferences == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* object = new UserObject();
  object->pointer = pointer;
  object->destroy = destroy;
  object->references = initialReferences;
  std::lock_guard<std::mutex> lock(g_userObjectsMutex);
  userObjects()[object] = object;
  *handle = reinterpret_cast<CUuserObject>(object);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuUserObjectRetain(CUuserObject handle, unsigned int count) {
  REQUIRE_INIT;
  UserObject* object = findUserObject(handle);
  if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  object->references += count;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuUserObjectRelease(CUuserObject handle, unsigned int count) {
  REQUIRE_INIT;
  UserObject* object = findUserObject(handle);
  if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  releaseUserObject(object, count);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphRetainUserObject(CUgraph handle, CUuserObject objectHandle,
                                             unsigned int count, unsigned int flags) {
  REQUIRE_INIT;
  std::shared_ptr<Graph> graph = resolveGraph(handle);
  if (!graph) return CUDA_ERROR_INVALID_HANDLE;
  UserObject* object = findUserObject(objectHandle);
  if (object == nullptr || count == 0 || (flags & ~CU_GRAPH_USER_OBJECT_MOVE) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // MOVE takes over the caller's references; otherwise the graph takes new ones.
  if (!(flags & CU_GRAPH_USER_OBJECT_MOVE)) object->references += count;
  std::lock_guard<std::mutex> lock(graph->resources->mutex);
  graph->resources->releases.push_back([object, count] { releaseUserObject(object, count); });
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuGraphReleaseUserObject(CUgraph handle, CUuserObject objectHandle,
                                              unsigned int count) {
  REQUIRE_INIT;
  std::shared_ptr<Graph> graph = resolveGraph(handle);
  if (!graph) return CUDA_ERROR_INVALID_HANDLE;
  UserObject* object = findUserObject(objectHandle);
  if (object == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  releaseUserObject(object, count);
  return CUDA_SUCCESS;
}

// Captured graphs on the sim allocate nothing, so graph memory is always zero.
CUDASIM_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attribute,
                                                  void* value) {
  REQUIRE_INIT;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr || attribute < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT ||
      attribute > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *static_cast<cuuint64_t*>(value) = 0;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attribute,
                                                  void* value) {
  REQUIRE_INIT;
  if (!validDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  bool resettable = attribute == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH ||
                    attribute == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
  if (value == nullptr || !resettable || *static_cast<cuuint64_t*>(value) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuDeviceGraphMemTrim(CUdevice device) {
  REQUIRE_INIT;
  return validDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// ---- profiler ------------------------------------------------------------------------------

// No profiler is attached to the sim; with none attached CUDA also returns success.
CUDASIM_API CUresult cuProfilerStart(void) {
  REQUIRE_INIT;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuProfilerStop(void) {
  REQUIRE_INIT;
  return CUDA_SUCCESS;
}
