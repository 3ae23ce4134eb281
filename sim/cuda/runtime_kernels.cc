// Device code through the runtime (libcudart.so.13 of the sim): what nvcc's generated host code
// calls when a library with kernels loads (fat binary, kernel and variable registration) and
// when it launches one (<<<...>>>: push/pop of the launch configuration, __cudaGetKernel,
// __cudaLaunchKernel), plus cudaLaunchKernel, function attributes, occupancy, device symbols
// and the cudaLibrary API. Each fat binary becomes a driver library; each registered kernel is
// the driver's kernel of that name, so launches take the driver's path (host_kernels.cc or a
// no-op in stream order).
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "runtime_internal.h"

using namespace cudasim::rt;

namespace {

struct FatBinary {
  CUlibrary library = nullptr;
  std::vector<const void*> functions;  // host stubs registered from it
  std::vector<const void*> variables;  // host shadows registered from it
};

// A __device__ variable: its size, and its device copy per device, made on first use.
struct Variable {
  size_t bytes = 0;
  std::vector<CUdeviceptr> perDevice;
};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const void*, CUkernel> kernels;    // by host stub
  std::unordered_map<const void*, Variable> variables;  // by host shadow
};

Registry& registry() {
  static Registry* instance = new Registry();  // leaked: unregistration runs at exit
  return *instance;
}

struct LaunchConfiguration {
  dim3 grid;
  dim3 block;
  size_t sharedBytes;
  cudaStream_t stream;
};

thread_local std::vector<LaunchConfiguration> t_configurations;

CUkernel kernelOf(const void* hostFunction) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.kernels.find(hostFunction);
  return it == r.kernels.end() ? nullptr : it->second;
}

cudaError_t launchError(CUresult result) {
  // Bad grid or block sizes are a configuration error in the runtime's words.
  return result == CUDA_ERROR_INVALID_VALUE ? cudaErrorInvalidConfiguration : toRuntime(result);
}

cudaError_t launch(CUkernel kernel, dim3 grid, dim3 block, void** args, size_t sharedBytes,
                   cudaStream_t stream) {
  BIND_OR_RETURN;
  if (kernel == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  CUresult result = cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), grid.x, grid.y, grid.z,
                                   block.x, block.y, block.z, static_cast<unsigned>(sharedBytes),
                                   driverStream(stream), args, nullptr);
  if (result == CUDA_ERROR_INVALID_HANDLE) {
    // Either the stream or the kernel; the kernel is ours, so it is the stream.
    return finish(cudaErrorInvalidResourceHandle);
  }
  return finish(launchError(result));
}

cudaError_t symbolAddress(const void* symbol, CUdeviceptr* address, size_t* bytes) {
  BIND_OR_RETURN;
  int device = currentDevice();
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.variables.find(symbol);
  if (it == r.variables.end()) return finish(cudaErrorInvalidSymbol);
  Variable& variable = it->second;
  if (variable.perDevice.size() <= static_cast<size_t>(device)) {
    variable.perDevice.resize(device + 1, 0);
  }
  CUdeviceptr& copy = variable.perDevice[device];
  if (copy == 0) {
    // A device variable starts zeroed on the sim (the initializer lives in the device image).
    CUresult result = cuMemAlloc(&copy, std::max<size_t>(variable.bytes, 1));
    if (result != CUDA_SUCCESS) return finish(result);
    cuMemsetD8(copy, 0, variable.bytes);
  }
  *address = copy;
  if (bytes) *bytes = variable.bytes;
  return cudaSuccess;
}

}  // namespace

// ---- registration, as nvcc's generated host code calls it ----------------------------------

CUDASIM_API void** __cudaRegisterFatBinary(void* fatCubin) {
  auto* binary = new FatBinary();
  if (cuInit(0) == CUDA_SUCCESS) {
    cuLibraryLoadData(&binary->library, fatCubin, nullptr, nullptr, 0, nullptr, nullptr, 0);
  }
  return reinterpret_cast<void**>(binary);
}

CUDASIM_API void __cudaRegisterFatBinaryEnd(void**) {}

CUDASIM_API void __cudaUnregisterFatBinary(void** handle) {
  auto* binary = reinterpret_cast<FatBinary*>(handle);
  if (binary == nullptr) return;
  {
    Registry& r = registry();
    std::unique_lock<std::shared_mutex> lock(r.mutex);
    for (const void* function : binary->functions) r.kernels.erase(function);
    for (const void* variable : binary->variables) r.variables.erase(variable);
  }
  if (binary->library) cuLibraryUnload(binary->library);
  delete binary;
}

CUDASIM_API void __cudaRegisterFunction(void** handle, const char* hostFunction, char*,
                                        const char* deviceName, int, uint3*, uint3*, dim3*, dim3*,
                                        int*) {
  auto* binary = reinterpret_cast<FatBinary*>(handle);
  if (binary == nullptr || binary->library == nullptr || deviceName == nullptr) return;
  CUkernel kernel = nullptr;
  if (cuLibraryGetKernel(&kernel, binary->library, deviceName) != CUDA_SUCCESS) return;
  binary->functions.push_back(hostFunction);
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.kernels[hostFunction] = kernel;
}

CUDASIM_API void __cudaRegisterVar(void** handle, char* hostVariable, char*, const char*, int,
                                   size_t bytes, int, int) {
  auto* binary = reinterpret_cast<FatBinary*>(handle);
  if (binary == nullptr) return;
  binary->variables.push_back(hostVariable);
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.variables[hostVariable].bytes = bytes;
}

CUDASIM_API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t sharedBytes,
                                                 struct CUstream_st* stream) {
  t_configurations.push_back({grid, block, sharedBytes, stream});
  return 0;
}

CUDASIM_API cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* sharedBytes,
                                                   void* stream) {
  if (t_configurations.empty()) return finish(cudaErrorInvalidConfiguration);
  LaunchConfiguration configuration = t_configurations.back();
  t_configurations.pop_back();
  if (grid) *grid = configuration.grid;
  if (block) *block = configuration.block;
  if (sharedBytes) *sharedBytes = configuration.sharedBytes;
  if (stream) *static_cast<cudaStream_t*>(stream) = configuration.stream;
  return cudaSuccess;
}

CUDASIM_API cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* hostFunction) {
  if (kernel == nullptr) return finish(cudaErrorInvalidValue);
  *kernel = reinterpret_cast<cudaKernel_t>(kernelOf(hostFunction));
  return *kernel ? cudaSuccess : finish(cudaErrorInvalidDeviceFunction);
}

CUDASIM_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                           size_t sharedBytes, cudaStream_t stream) {
  return launch(reinterpret_cast<CUkernel>(kernel), grid, block, args, sharedBytes, stream);
}

// ---- launches ------------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaLaunchKernel(const void* function, dim3 grid, dim3 block, void** args,
                                         size_t sharedBytes, cudaStream_t stream) {
  return launch(kernelOf(function), grid, block, args, sharedBytes, stream);
}

CUDASIM_API cudaError_t cudaLaunchCooperativeKernel(const void* function, dim3 grid, dim3 block,
                                                    void** args, size_t sharedBytes,
                                                    cudaStream_t stream) {
  return launch(kernelOf(function), grid, block, args, sharedBytes, stream);
}

CUDASIM_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* function,
                                            void** args) {
  if (config == nullptr) return finish(cudaErrorInvalidValue);
  // Launch attributes (clusters, priorities, programmatic serialization) change nothing here.
  return launch(kernelOf(function), config->gridDim, config->blockDim, args,
                config->dynamicSmemBytes, config->stream);
}

// ---- function attributes and occupancy -----------------------------------------------------

CUDASIM_API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attributes,
                                              const void* function) {
  BIND_OR_RETURN;
  if (attributes == nullptr) return finish(cudaErrorInvalidValue);
  CUkernel kernel = kernelOf(function);
  if (kernel == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  auto handle = reinterpret_cast<CUfunction>(kernel);
  auto get = [handle](CUfunction_attribute which) {
    int value = 0;
    cuFuncGetAttribute(&value, which, handle);
    return value;
  };
  // Exactly the caller's struct (144 bytes in CUDA 13): callers built against older headers
  // pass smaller ones only through versioned entry points the sim does not export.
  std::memset(attributes, 0, sizeof(*attributes));
  attributes->sharedSizeBytes = get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  attributes->constSizeBytes = get(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES);
  attributes->localSizeBytes = get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  attributes->maxThreadsPerBlock = get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  attributes->numRegs = get(CU_FUNC_ATTRIBUTE_NUM_REGS);
  attributes->ptxVersion = get(CU_FUNC_ATTRIBUTE_PTX_VERSION);
  attributes->binaryVersion = get(CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  attributes->cacheModeCA = get(CU_FUNC_ATTRIBUTE_CACHE_MODE_CA);
  attributes->maxDynamicSharedSizeBytes = get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  attributes->preferredShmemCarveout = get(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT);
  return cudaSuccess;
}

CUDASIM_API cudaError_t cudaFuncSetAttribute(const void* function, enum cudaFuncAttribute attribute,
                                             int value) {
  BIND_OR_RETURN;
  CUkernel kernel = kernelOf(function);
  if (kernel == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  // cudaFuncAttribute values are the driver's CUfunction_attribute values.
  return finish(cuFuncSetAttribute(reinterpret_cast<CUfunction>(kernel),
                                   static_cast<CUfunction_attribute>(attribute), value));
}

CUDASIM_API cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel,
                                                        enum cudaFuncAttribute attribute, int value,
                                                        int device) {
  BIND_OR_RETURN;
  CUresult result = cuKernelSetAttribute(static_cast<CUfunction_attribute>(attribute), value,
                                         reinterpret_cast<CUkernel>(kernel), device);
  return finish(result == CUDA_ERROR_INVALID_HANDLE ? cudaErrorInvalidDeviceFunction
                                                    : toRuntime(result));
}

CUDASIM_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, const void* function, int blockSize, size_t dynamicSharedBytes,
    unsigned int flags) {
  BIND_OR_RETURN;
  CUkernel kernel = kernelOf(function);
  if (kernel == nullptr) return finish(cudaErrorInvalidDeviceFunction);
  return finish(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
      numBlocks, reinterpret_cast<CUfunction>(kernel), blockSize, dynamicSharedBytes, flags));
}

CUDASIM_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks,
                                                                      const void* function,
                                                                      int blockSize,
                                                                      size_t dynamicSharedBytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, function, blockSize,
                                                                dynamicSharedBytes, 0);
}

// ---- device symbols ------------------------------------------------------------------------

CUDASIM_API cudaError_t cudaGetSymbolAddress(void** pointer, const void* symbol) {
  if (pointer == nullptr) return finish(cudaErrorInvalidValue);
  CUdeviceptr address = 0;
  cudaError_t error = symbolAddress(symbol, &address, nullptr);
  if (error == cudaSuccess) *pointer = reinterpret_cast<void*>(address);
  return error;
}

CUDASIM_API cudaError_t cudaGetSymbolSize(size_t* bytes, const void* symbol) {
  if (bytes == nullptr) return finish(cudaErrorInvalidValue);
  CUdeviceptr address = 0;
  return symbolAddress(symbol, &address, bytes);
}

CUDASIM_API cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* source, size_t count,
                                           size_t offset, enum cudaMemcpyKind kind) {
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
      kind != cudaMemcpyDefault) {
    return finish(cudaErrorInvalidMemcpyDirection);
  }
  CUdeviceptr address = 0;
  size_t bytes = 0;
  if (cudaError_t error = symbolAddress(symbol, &address, &bytes)) return error;
  if (offset > bytes || count > bytes - offset) return finish(cudaErrorInvalidValue);
  return finish(cuMemcpy(address + offset, devicePointer(source), count));
}

CUDASIM_API cudaError_t cudaMemcpyFromSymbol(void* destination, const void* symbol, size_t count,
                                             size_t offset, enum cudaMemcpyKind kind) {
  if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice &&
      kind != cudaMemcpyDefault) {
    return finish(cudaErrorInvalidMemcpyDirection);
  }
  CUdeviceptr address = 0;
  size_t bytes = 0;
  if (cudaError_t error = symbolAddress(symbol, &address, &bytes)) return error;
  if (offset > bytes || count > bytes - offset) return finish(cudaErrorInvalidValue);
  return finish(cuMemcpy(devicePointer(destination), address + offset, count));
}

// ---- the library API -----------------------------------------------------------------------

CUDASIM_API cudaError_t cudaLibraryLoadData(cudaLibrary_t* library, const void* code,
                                            enum cudaJitOption*, void**, unsigned int,
                                            enum cudaLibraryOption*, void**, unsigned int) {
  BIND_OR_RETURN;
  if (library == nullptr) return finish(cudaErrorInvalidValue);
  return finish(cuLibraryLoadData(reinterpret_cast<CUlibrary*>(library), code, nullptr, nullptr, 0,
                                  nullptr, nullptr, 0));
}

CUDASIM_API cudaError_t cudaLibraryLoadFromFile(cudaLibrary_t* library, const char* fileName,
                                                enum cudaJitOption*, void**, unsigned int,
                                                enum cudaLibraryOption*, void**, unsigned int) {
  BIND_OR_RETURN;
  if (library == nullptr) return finish(cudaErrorInvalidValue);
  return finish(cuLibraryLoadFromFile(reinterpret_cast<CUlibrary*>(library), fileName, nullptr,
                                      nullptr, 0, nullptr, nullptr, 0));
}

CUDASIM_API cudaError_t cudaLibraryUnload(cudaLibrary_t library) {
  BIND_OR_RETURN;
  return finish(cuLibraryUnload(reinterpret_cast<CUlibrary>(library)));
}

CUDASIM_API cudaError_t cudaLibraryGetKernel(cudaKernel_t* kernel, cudaLibrary_t library,
                                             const char* name) {
  BIND_OR_RETURN;
  return finish(cuLibraryGetKernel(reinterpret_cast<CUkernel*>(kernel),
                                   reinterpret_cast<CUlibrary>(library), name));
}

CUDASIM_API cudaError_t cudaLibraryGetKernelCount(unsigned int* count, cudaLibrary_t library) {
  BIND_OR_RETURN;
  return finish(cuLibraryGetKernelCount(count, reinterpret_cast<CUlibrary>(library)));
}

CUDASIM_API cudaError_t cudaLibraryGetGlobal(void** pointer, size_t* bytes, cudaLibrary_t library,
                                             const char* name) {
  BIND_OR_RETURN;
  return finish(cuLibraryGetGlobal(reinterpret_cast<CUdeviceptr*>(pointer), bytes,
                                   reinterpret_cast<CUlibrary>(library), name));
}

CUDASIM_API cudaError_t cudaLibraryGetManaged(void** pointer, size_t* bytes, cudaLibrary_t library,
                                              const char* name) {
  BIND_OR_RETURN;
  return finish(cuLibraryGetManaged(reinterpret_cast<CUdeviceptr*>(pointer), bytes,
                                    reinterpret_cast<CUlibrary>(library), name));
}

CUDASIM_API cudaError_t cudaLibraryGetUnifiedFunction(void** function, cudaLibrary_t library,
                                                      const char* symbol) {
  BIND_OR_RETURN;
  return finish(
      cuLibraryGetUnifiedFunction(function, reinterpret_cast<CUlibrary>(library), symbol));
}
