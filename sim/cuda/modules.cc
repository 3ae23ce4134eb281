// Device code on the sim (libcuda.so.1): libraries, modules, kernels and launches. The sim
// never reads a device image: loading one gives a handle in which every name resolves to a
// kernel of that name, and launching a kernel either computes it on the host (the few
// PyTorch elementwise loops in host_kernels.cc) or is a no-op that completes in stream order.
// The first no-op launch of a process prints one line on stderr; CUDASIM_DEBUG=1 names each
// no-op kernel once.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cudasim_ext.h"
#include "driver_internal.h"
#include "host_kernels.h"

using namespace cudasim;

namespace {

constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kMaxDynamicSharedBytes = 232448;  // 227 KiB, as a compute-capability-9.0 device
constexpr int kDefaultDynamicSharedBytes = 49152;
constexpr int kThreadsPerMultiprocessor = 2048;
constexpr int kBlocksPerMultiprocessor = 32;
constexpr size_t kSharedBytesPerMultiprocessor = 233472;

struct Library;

// A kernel: what CUkernel and CUfunction handles point at (CUDA lets a CUkernel be launched as
// a CUfunction; on the sim they are the same object).
struct Function {
  Library* library = nullptr;
  std::string name;
  std::unique_ptr<HostKernel> host;  // null: a no-op on the sim
  std::atomic<bool> announced{false};
  std::atomic<int> maxDynamicSharedBytes{kDefaultDynamicSharedBytes};
  std::atomic<int> preferredCarveout{-1};
};

// CUlibrary and CUmodule handles point at one of these.
struct Library {
  std::mutex mutex;
  std::unordered_map<std::string, std::unique_ptr<Function>> functions;
  std::vector<Function*> order;  // creation order, for enumeration
};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_set<const Library*> libraries;
  std::unordered_set<const Function*> functions;
};

Registry& registry() {
  static Registry* instance = new Registry();  // leaked: launches may come during exit
  return *instance;
}

std::atomic<unsigned long long> g_computedLaunches{0};
std::atomic<unsigned long long> g_noopLaunches{0};
std::atomic<bool> g_noopAnnounced{false};

Library* findLibrary(const void* handle) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto* library = static_cast<const Library*>(handle);
  return r.libraries.count(library) ? const_cast<Library*>(library) : nullptr;
}

Function* findFunction(const void* handle) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto* function = static_cast<const Function*>(handle);
  return r.functions.count(function) ? const_cast<Function*>(function) : nullptr;
}

CUresult newLibrary(const void* image, Library** out) {
  if (image == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* library = new Library();
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.libraries.insert(library);
  *out = library;
  return CUDA_SUCCESS;
}

CUresult unloadLibrary(const void* handle) {
  Library* library = nullptr;
  {
    Registry& r = registry();
    std::unique_lock<std::shared_mutex> lock(r.mutex);
    auto* candidate = static_cast<const Library*>(handle);
    if (!r.libraries.erase(candidate)) return CUDA_ERROR_INVALID_HANDLE;
    library = const_cast<Library*>(candidate);
    for (const Function* function : library->order) r.functions.erase(function);
  }
  delete library;
  return CUDA_SUCCESS;
}

// Every name resolves: the sim cannot tell which kernels an image holds.
CUresult getFunction(Library* library, const char* name, Function** out) {
  if (name == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(library->mutex);
  auto& slot = library->functions[name];
  if (!slot) {
    slot = std::make_unique<Function>();
    slot->library = library;
    slot->name = name;
    slot->host = findHostKernel(name);
    library->order.push_back(slot.get());
    Registry& r = registry();
    std::unique_lock<std::shared_mutex> registryLock(r.mutex);
    r.functions.insert(slot.get());
  }
  *out = slot.get();
  return CUDA_SUCCESS;
}

void announceNoop(Function& function) {
  bool first = !g_noopAnnounced.exchange(true);
  bool firstOfKernel = !function.announced.exchange(true);
  if (first) {
    std::fprintf(stderr,
                 "cudasim: device code does not run on the sim: kernel launches complete in stream "
                 "order without computing, so their outputs keep old contents (first: %.200s). "
                 "Data moved by copies, memsets and NCCL is exact. CUDASIM_DEBUG=1 names each "
                 "kernel.\n",
                 demangledName(function.name.c_str()).c_str());
  } else if (firstOfKernel && debugEnabled()) {
    std::fprintf(stderr, "cudasim: no-op kernel %s\n",
                 demangledName(function.name.c_str()).c_str());
  }
}

CUresult checkDimensions(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz) {
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (gy > 65535 || gz > 65535 || gx > 0x7fffffffu) return CUDA_ERROR_INVALID_VALUE;
  if (bx > 1024 || by > 1024 || bz > 64 ||
      static_cast<unsigned long long>(bx) * by * bz > kMaxThreadsPerBlock) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult launch(CUfunction handle, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned sharedBytes, CUstream streamHandle, void** params) {
  REQUIRE_INIT;
  if (currentContext() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Function* function = findFunction(handle);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult bad = checkDimensions(gx, gy, gz, bx, by, bz)) return bad;
  if (sharedBytes > static_cast<unsigned>(function->maxDynamicSharedBytes.load())) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  RESOLVE_STREAM(stream, streamHandle);
  if (function->host) {
    if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::function<void()> work = function->host->prepare(params);
    if (!work) return CUDA_ERROR_ILLEGAL_ADDRESS;
    enqueue(stream, std::move(work));
    g_computedLaunches.fetch_add(1, std::memory_order_relaxed);
    return CUDA_SUCCESS;
  }
  // A no-op changes nothing, so there is nothing to enqueue: work before and after it on the
  // stream keeps its order, and events recorded after it complete with the work before it.
  g_noopLaunches.fetch_add(1, std::memory_order_relaxed);
  if (!function->announced.load(std::memory_order_relaxed) || !g_noopAnnounced.load()) {
    announceNoop(*function);
  }
  return CUDA_SUCCESS;
}

int blocksPerMultiprocessor(int blockSize, size_t dynamicSharedBytes) {
  if (blockSize > kMaxThreadsPerBlock) return 0;
  int warps = (blockSize + 31) / 32;
  int byThreads = kThreadsPerMultiprocessor / (warps * 32);
  int byShared = static_cast<int>(kSharedBytesPerMultiprocessor / (dynamicSharedBytes + 1024));
  return std::max(0, std::min({kBlocksPerMultiprocessor, byThreads, byShared}));
}

}  // namespace

// ---- the private extension -----------------------------------------------------------------

CUDASIM_API void cudasimKernelLaunchCounts(unsigned long long* computed, unsigned long long* noop) {
  if (computed) *computed = g_computedLaunches.load();
  if (noop) *noop = g_noopLaunches.load();
}

CUDASIM_API int cudasimKernelComputedOnHost(const void* function, char* what, int length) {
  Function* found = findFunction(function);
  if (found == nullptr || !found->host) return 0;
  if (what != nullptr && length > 0) {
    std::snprintf(what, static_cast<size_t>(length), "%s", found->host->describe().c_str());
  }
  return 1;
}

// ---- libraries -----------------------------------------------------------------------------

CUDASIM_API CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                       unsigned int, CUlibraryOption*, void**, unsigned int) {
  REQUIRE_INIT;
  Library* created = nullptr;
  CUresult result = newLibrary(code, &created);
  if (result == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(created);
  return result;
}

CUDASIM_API CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option*,
                                           void**, unsigned int, CUlibraryOption*, void**,
                                           unsigned int) {
  REQUIRE_INIT;
  if (fileName == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (std::FILE* file = std::fopen(fileName, "rb")) {
    std::fclose(file);
  } else {
    return CUDA_ERROR_FILE_NOT_FOUND;
  }
  Library* created = nullptr;
  CUresult result = newLibrary(fileName, &created);
  if (result == CUDA_SUCCESS) *library = reinterpret_cast<CUlibrary>(created);
  return result;
}

CUDASIM_API CUresult cuLibraryUnload(CUlibrary library) {
  REQUIRE_INIT;
  return unloadLibrary(library);
}

CUDASIM_API CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary handle, const char* name) {
  REQUIRE_INIT;
  Library* library = findLibrary(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Function* function = nullptr;
  CUresult result = getFunction(library, name, &function);
  if (result == CUDA_SUCCESS) *kernel = reinterpret_cast<CUkernel>(function);
  return result;
}

CUDASIM_API CUresult cuLibraryGetKernelCount(unsigned int* count, CUlibrary handle) {
  REQUIRE_INIT;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Library* library = findLibrary(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> lock(library->mutex);
  *count = static_cast<unsigned>(library->order.size());  // those looked up so far
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int numKernels,
                                               CUlibrary handle) {
  REQUIRE_INIT;
  Library* library = findLibrary(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (kernels == nullptr && numKernels > 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(library->mutex);
  for (unsigned i = 0; i < numKernels && i < library->order.size(); ++i) {
    kernels[i] = reinterpret_cast<CUkernel>(library->order[i]);
  }
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuLibraryGetModule(CUmodule* module, CUlibrary handle) {
  REQUIRE_INIT;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (findLibrary(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *module = reinterpret_cast<CUmodule>(handle);
  return CUDA_SUCCESS;
}

// The sim does not read images, so it knows no device variables by name.
CUDASIM_API CUresult cuLibraryGetGlobal(CUdeviceptr*, size_t*, CUlibrary handle, const char*) {
  REQUIRE_INIT;
  return findLibrary(handle) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuLibraryGetManaged(CUdeviceptr*, size_t*, CUlibrary handle, const char*) {
  REQUIRE_INIT;
  return findLibrary(handle) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuLibraryGetUnifiedFunction(void**, CUlibrary handle, const char*) {
  REQUIRE_INIT;
  return findLibrary(handle) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuKernelGetFunction(CUfunction* function, CUkernel kernel) {
  REQUIRE_INIT;
  if (function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (findFunction(kernel) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *function = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuKernelGetLibrary(CUlibrary* library, CUkernel kernel) {
  REQUIRE_INIT;
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* function = findFunction(kernel);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *library = reinterpret_cast<CUlibrary>(function->library);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuKernelGetName(const char** name, CUkernel kernel) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* function = findFunction(kernel);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = function->name.c_str();
  return CUDA_SUCCESS;
}

// ---- modules (the older API over the same objects) ----------------------------------------

CUDASIM_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  REQUIRE_INIT;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Library* created = nullptr;
  CUresult result = newLibrary(image, &created);
  if (result == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(created);
  return result;
}

CUDASIM_API CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                        CUjit_option*, void**) {
  return cuModuleLoadData(module, image);
}

CUDASIM_API CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return cuModuleLoadData(module, fatCubin);
}

CUDASIM_API CUresult cuModuleLoad(CUmodule* module, const char* fileName) {
  REQUIRE_INIT;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUlibrary library = nullptr;
  CUresult result =
      cuLibraryLoadFromFile(&library, fileName, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (result == CUDA_SUCCESS) *module = reinterpret_cast<CUmodule>(library);
  return result;
}

CUDASIM_API CUresult cuModuleUnload(CUmodule module) {
  REQUIRE_INIT;
  return unloadLibrary(module);
}

CUDASIM_API CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  return cuLibraryGetKernel(reinterpret_cast<CUkernel*>(function),
                            reinterpret_cast<CUlibrary>(module), name);
}

CUDASIM_API CUresult cuModuleGetGlobal(CUdeviceptr*, size_t*, CUmodule module, const char*) {
  REQUIRE_INIT;
  return findLibrary(module) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuFuncGetModule(CUmodule* module, CUfunction function) {
  return cuKernelGetLibrary(reinterpret_cast<CUlibrary*>(module),
                            reinterpret_cast<CUkernel>(function));
}

CUDASIM_API CUresult cuFuncGetName(const char** name, CUfunction function) {
  return cuKernelGetName(name, reinterpret_cast<CUkernel>(function));
}

CUDASIM_API CUresult cuFuncLoad(CUfunction function) {
  REQUIRE_INIT;
  return findFunction(function) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction function) {
  REQUIRE_INIT;
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (findFunction(function) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}

// ---- attributes: those of a small kernel (the sim has no image to read them from) --------

CUDASIM_API CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute,
                                        CUfunction handle) {
  REQUIRE_INIT;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* function = findFunction(handle);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = kMaxThreadsPerBlock;
      break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *value = 32;
      break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *value = 90;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *value = function->maxDynamicSharedBytes.load();
      break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      *value = function->preferredCarveout.load();
      break;
    default:
      *value = 0;
      break;
  }
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuFuncSetAttribute(CUfunction handle, CUfunction_attribute attribute,
                                        int value) {
  REQUIRE_INIT;
  Function* function = findFunction(handle);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      if (value < 0 || value > kMaxDynamicSharedBytes) return CUDA_ERROR_INVALID_VALUE;
      function->maxDynamicSharedBytes.store(value);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < -1 || value > 100) return CUDA_ERROR_INVALID_VALUE;
      function->preferredCarveout.store(value);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // read-only attributes
  }
}

CUDASIM_API CUresult cuFuncSetCacheConfig(CUfunction handle, CUfunc_cache) {
  REQUIRE_INIT;
  return findFunction(handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUDASIM_API CUresult cuKernelGetAttribute(int* value, CUfunction_attribute attribute,
                                          CUkernel kernel, CUdevice) {
  return cuFuncGetAttribute(value, attribute, reinterpret_cast<CUfunction>(kernel));
}

CUDASIM_API CUresult cuKernelSetAttribute(CUfunction_attribute attribute, int value,
                                          CUkernel kernel, CUdevice) {
  return cuFuncSetAttribute(reinterpret_cast<CUfunction>(kernel), attribute, value);
}

CUDASIM_API CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice) {
  return cuFuncSetCacheConfig(reinterpret_cast<CUfunction>(kernel), config);
}

// ---- occupancy -----------------------------------------------------------------------------

CUDASIM_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, CUfunction handle, int blockSize, size_t dynamicSharedBytes, unsigned int) {
  REQUIRE_INIT;
  if (numBlocks == nullptr || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (findFunction(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *numBlocks = blocksPerMultiprocessor(blockSize, dynamicSharedBytes);
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction handle,
                                                                 int blockSize,
                                                                 size_t dynamicSharedBytes) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, handle, blockSize,
                                                              dynamicSharedBytes, 0);
}

CUDASIM_API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* minGridSize, int* blockSize, CUfunction handle, CUoccupancyB2DSize sharedBytesOfBlock,
    size_t dynamicSharedBytes, int blockSizeLimit, unsigned int) {
  REQUIRE_INIT;
  if (minGridSize == nullptr || blockSize == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (findFunction(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int limit =
      blockSizeLimit > 0 ? std::min(blockSizeLimit, kMaxThreadsPerBlock) : kMaxThreadsPerBlock;
  size_t shared = sharedBytesOfBlock ? sharedBytesOfBlock(limit) : dynamicSharedBytes;
  *blockSize = limit;
  *minGridSize = blocksPerMultiprocessor(limit, shared);  // one multiprocessor per device
  return CUDA_SUCCESS;
}

CUDASIM_API CUresult cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize,
                                                      CUfunction handle,
                                                      CUoccupancyB2DSize sharedBytesOfBlock,
                                                      size_t dynamicSharedBytes,
                                                      int blockSizeLimit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(
      minGridSize, blockSize, handle, sharedBytesOfBlock, dynamicSharedBytes, blockSizeLimit, 0);
}

CUDASIM_API CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* bytes, CUfunction handle,
                                                             int numBlocks, int blockSize) {
  REQUIRE_INIT;
  if (bytes == nullptr || numBlocks <= 0 || blockSize <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (findFunction(handle) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  size_t perBlock = kSharedBytesPerMultiprocessor / static_cast<size_t>(numBlocks);
  *bytes = perBlock > 1024 ? std::min<size_t>(perBlock - 1024, kMaxDynamicSharedBytes) : 0;
  return CUDA_SUCCESS;
}

// ---- launches ------------------------------------------------------------------------------

CUDASIM_API CUresult cuLaunchKernel(CUfunction function, unsigned int gridDimX,
                                    unsigned int gridDimY, unsigned int gridDimZ,
                                    unsigned int blockDimX, unsigned int blockDimY,
                                    unsigned int blockDimZ, unsigned int sharedMemBytes,
                                    CUstream stream, void** kernelParams, void** extra) {
  // `extra` (a packed argument buffer) is accepted for no-op kernels only: the host kernels
  // read kernelParams.
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(function, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                sharedMemBytes, stream, kernelParams);
}

CUDASIM_API CUresult cuLaunchCooperativeKernel(CUfunction function, unsigned int gridDimX,
                                               unsigned int gridDimY, unsigned int gridDimZ,
                                               unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ, unsigned int sharedMemBytes,
                                               CUstream stream, void** kernelParams) {
  return launch(function, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                sharedMemBytes, stream, kernelParams);
}

CUDASIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction function,
                                      void** kernelParams, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(function, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->sharedMemBytes, config->hStream,
                kernelParams);
}
