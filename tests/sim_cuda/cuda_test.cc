// Unit tests of the sim's CUDA runtime and driver: what an NCCL program and a completion tracker
// rely on — streams in FIFO order, default-stream semantics, events, host functions, capture
// rules, the heap, and blocked streams that cost no CPU.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cudasim_ext.h"

namespace {

using namespace std::chrono_literals;

// Host functions that append to a shared log, to observe execution order across streams.
struct OrderLog {
  std::mutex mutex;
  std::vector<int> entries;
  void add(int value) {
    std::lock_guard<std::mutex> lock(mutex);
    entries.push_back(value);
  }
};

struct LogStep {
  OrderLog* log;
  int value;
  int sleepMs;
};

void CUDART_CB logStep(void* data) {
  auto* step = static_cast<LogStep*>(data);
  if (step->sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step->sleepMs));
  step->log->add(step->value);
}

// A host function that blocks its stream until released, like a kernel waiting on a peer.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = false;
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    changed.notify_all();
  }
};

void CUDART_CB waitAtGate(void* data) {
  auto* gate = static_cast<Gate*>(data);
  std::unique_lock<std::mutex> lock(gate->mutex);
  gate->changed.wait(lock, [&] { return gate->open; });
}

double processCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec / 1e9;
}

TEST(SimCudaDevices, CountSetGetAndProperties) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 8);  // CUDASIM_DEVICES default
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 3);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // reading the last error clears it
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, 3), cudaSuccess);
  EXPECT_STREQ(properties.name, "ncclwatch sim device");
  EXPECT_EQ(properties.pciBusID, 3);
  int version = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, CUDART_VERSION);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(SimCudaMemory, AllocationsAreLocatableAndReused) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 1000), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 1 << 20), cudaSuccess);
  cudasimHeapRef ref{};
  ASSERT_EQ(cudasimHeapLocate(static_cast<char*>(a) + 10, &ref), 0);
  EXPECT_EQ(ref.pid, getpid());
  EXPECT_EQ(ref.bytesToEnd, 1024u - 10);  // rounded to 256-byte granules
  int stackValue = 0;
  EXPECT_EQ(cudasimHeapLocate(&stackValue, &ref), -1);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, b), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, &stackValue), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  void* c = nullptr;
  ASSERT_EQ(cudaMalloc(&c, 512), cudaSuccess);
  EXPECT_EQ(c, a);  // first fit reuses the freed block
  EXPECT_EQ(cudaFree(static_cast<char*>(c) + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

TEST(SimCudaMemory, CopiesAndSetsSyncAndAsync) {
  std::vector<int> host(256), back(256, 0);
  for (int i = 0; i < 256; ++i) host[i] = i * 3;
  int* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 256 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), 256 * sizeof(int), cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0, 16 * sizeof(int), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), device, 256 * sizeof(int), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(back[i], i < 16 ? 0 : i * 3);
  EXPECT_EQ(cudaMemcpy(back.data(), device, 4, static_cast<cudaMemcpyKind>(42)),
            cudaErrorInvalidMemcpyDirection);
  cudaGetLastError();
  cudaStreamDestroy(stream);
  cudaFree(device);
}

TEST(SimCudaStreams, FifoOrderAndQuery) {
  OrderLog log;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<LogStep> steps;
  steps.reserve(20);
  for (int i = 0; i < 20; ++i) steps.push_back({&log, i, i == 0 ? 50 : 0});
  for (auto& step : steps) ASSERT_EQ(cudaLaunchHostFunc(stream, logStep, &step), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // "not ready" is not an error
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(log.entries, expected);
  cudaStreamDestroy(stream);
}

TEST(SimCudaStreams, LegacyDefaultStreamSynchronizesWithBlockingStreamsOnly) {
  OrderLog log;
  cudaStream_t blocking, nonBlocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonBlocking, cudaStreamNonBlocking), cudaSuccess);
  Gate gate;
  LogStep slowBlocking{&log, 1, 100};
  LogStep onLegacy{&log, 2, 0};
  LogStep afterLegacy{&log, 3, 0};
  LogStep onNonBlocking{&log, 4, 0};
  ASSERT_EQ(cudaLaunchHostFunc(blocking, logStep, &slowBlocking), cudaSuccess);
  // The legacy stream's work waits for the blocking stream's earlier work...
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, waitAtGate, &gate), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, logStep, &onLegacy), cudaSuccess);
  // ...and later blocking-stream work waits for the legacy stream.
  ASSERT_EQ(cudaLaunchHostFunc(blocking, logStep, &afterLegacy), cudaSuccess);
  // A non-blocking stream ignores the legacy stream entirely.
  ASSERT_EQ(cudaLaunchHostFunc(nonBlocking, logStep, &onNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nonBlocking), cudaSuccess);
  // Step 1 sleeps 100 ms on its stream: wait for it (up to 10 s: a loaded sanitizer run once
  // took longer than the fixed 200 ms this slept), then give 2 and 3 time to run if they could.
  auto entries = [&] {
    std::lock_guard<std::mutex> lock(log.mutex);
    return log.entries;
  };
  for (int waited = 0; entries().size() < 2 && waited < 10000; waited += 10) {
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(entries(), (std::vector<int>{4, 1}));  // 2 and 3 wait behind the gate
  gate.release();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(log.entries, (std::vector<int>{4, 1, 2, 3}));
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonBlocking);
}

TEST(SimCudaEvents, QueryElapsedAndCrossStreamWait) {
  cudaStream_t producer, consumer;
  ASSERT_EQ(cudaStreamCreate(&producer), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, stop, untimed;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(untimed), cudaSuccess);  // never recorded: complete
  Gate gate;
  OrderLog log;
  LogStep consumerStep{&log, 7, 0};
  ASSERT_EQ(cudaEventRecord(start, producer), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(producer, waitAtGate, &gate), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, producer), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, producer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer, untimed, 0), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(consumer, logStep, &consumerStep), cudaSuccess);
  // The gate is held 30 ms after `start` completed (a loaded machine may run the stream late),
  // so the elapsed time below is at least that.
  ASSERT_EQ(cudaEventSynchronize(start), cudaSuccess);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(cudaEventQuery(stop), cudaErrorNotReady);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
  EXPECT_TRUE(log.entries.empty());
  gate.release();
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(log.entries, (std::vector<int>{7}));
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 25.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t event : {start, stop, untimed}) EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(start), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

TEST(SimCudaStreams, BlockedStreamCostsNoCpu) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(stream, waitAtGate, &gate), cudaSuccess);
  std::thread syncer([&] { cudaStreamSynchronize(stream); });  // waits on the hung stream
  std::this_thread::sleep_for(50ms);
  double before = processCpuSeconds();
  std::this_thread::sleep_for(1s);
  double used = processCpuSeconds() - before;
  EXPECT_LT(used, 0.05) << "a hung stream must not spin";
  gate.release();
  syncer.join();
  cudaStreamDestroy(stream);
}

// A real stream takes about a thousand pending launches, then the next launch blocks the host
// until the device finishes one (docs/sim.md). The sim holds 1024: behind a gate, 1024 launches
// return at once (the gate's own task is running, not pending) and the next one waits until the
// gate opens; then everything runs, in order.
TEST(SimCudaStreams, AFullStreamBlocksTheNextLaunchUntilWorkIsDone) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Gate gate;
  OrderLog log;
  ASSERT_EQ(cudaLaunchHostFunc(stream, waitAtGate, &gate), cudaSuccess);
  std::this_thread::sleep_for(20ms);  // the worker takes the gate: it runs, no longer pending
  std::vector<LogStep> steps(1025);
  for (int i = 0; i < 1024; ++i) {
    steps[i] = {&log, i, 0};
    ASSERT_EQ(cudaLaunchHostFunc(stream, logStep, &steps[i]), cudaSuccess);
  }
  steps[1024] = {&log, 1024, 0};
  std::atomic<bool> launched{false};
  std::thread launcher([&] {
    EXPECT_EQ(cudaLaunchHostFunc(stream, logStep, &steps[1024]), cudaSuccess);
    launched = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(launched.load()) << "the 1025th pending launch returned while the stream was full";
  gate.release();
  launcher.join();
  EXPECT_TRUE(launched.load());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(log.entries.size(), 1025u);
  for (int i = 0; i < 1025; ++i) ASSERT_EQ(log.entries[i], i);
  cudaStreamDestroy(stream);
}

TEST(SimCudaCapture, CapturedWorkReplaysAndStatusIsReported) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  OrderLog log;
  LogStep step{&log, 5, 0};
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  ASSERT_EQ(cudaStreamGetCaptureInfo(stream, &status, &id), cudaSuccess);
  EXPECT_NE(id, 0u);
  ASSERT_EQ(cudaLaunchHostFunc(stream, logStep, &step), cudaSuccess);
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(log.entries.empty());  // captured, not executed
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(log.entries, (std::vector<int>{5, 5}));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(SimCudaCapture, UnsafeQueryInvalidatesGlobalCaptureUnlessThreadLocal) {
  cudaStream_t capturing, other;
  ASSERT_EQ(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t event;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);

  // A watchdog-like thread in thread-local mode may query while another thread captures.
  ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread polite([&] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
    EXPECT_EQ(cuEventQuery(reinterpret_cast<CUevent>(event)), CUDA_SUCCESS);
  });
  polite.join();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(capturing, &graph), cudaSuccess);
  cudaGraphDestroy(graph);

  // In global mode the same query is prohibited and breaks the capture.
  ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread careless(
      [&] { EXPECT_EQ(cudaStreamQuery(other), cudaErrorStreamCaptureUnsupported); });
  careless.join();
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(capturing, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(capturing, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  cudaEventDestroy(event);
  cudaStreamDestroy(capturing);
  cudaStreamDestroy(other);
}

TEST(SimCudaDriver, ProcAddressResolvesTheCuda13Abi) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  void* function = nullptr;
  CUdriverProcAddressQueryResult status;
  ASSERT_EQ(
      cuGetProcAddress("cuEventDestroy", &function, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
      CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(function, reinterpret_cast<void*>(&cuEventDestroy_v2));
  ASSERT_EQ(cuGetProcAddress("cuStreamGetCaptureInfo", &function, 13000,
                             CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  EXPECT_EQ(function, reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v3));
  EXPECT_EQ(cuGetProcAddress("cuStreamGetCaptureInfo", &function, 11000,
                             CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(
      cuGetProcAddress("cuNoSuchThing", &function, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
      CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  const char* text = nullptr;
  ASSERT_EQ(cuGetErrorString(CUDA_ERROR_NOT_READY, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "device not ready");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady");
}

TEST(SimCudaFork, ChildGetsItsOwnHeap) {
  void* parentBuffer = nullptr;
  ASSERT_EQ(cudaMalloc(&parentBuffer, 4096), cudaSuccess);
  cudasimHeapRef parentRef{};
  ASSERT_EQ(cudasimHeapLocate(parentBuffer, &parentRef), 0);
  pid_t child = fork();
  if (child == 0) {
    void* childBuffer = nullptr;
    cudasimHeapRef childRef{};
    bool ok = cudaSetDevice(0) == cudaSuccess && cudaMalloc(&childBuffer, 4096) == cudaSuccess &&
              cudasimHeapLocate(childBuffer, &childRef) == 0 && childRef.pid == getpid() &&
              cudaDeviceSynchronize() == cudaSuccess;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cudaFree(parentBuffer);
}

}  // namespace
