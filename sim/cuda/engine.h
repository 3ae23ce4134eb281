// The one engine behind the sim's driver (libcuda.so.1) and runtime (libcudart.so.13): virtual
// devices, a shared-memory heap, streams as FIFO worker threads, events and stream capture.
// The runtime reaches it only through the exported driver API, as the real runtime does.
#pragma once
#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace cudasim {

struct Stream;
struct Event;
struct Graph;

// A dependency: the work of `stream` up to and including `ticket` must be complete.
struct Dependency {
  std::shared_ptr<Stream> stream;
  uint64_t ticket = 0;
};

// One unit of stream work. `run` executes on the stream's worker thread.
struct Task {
  std::vector<Dependency> dependencies;
  std::function<void()> run;
  uint64_t ticket = 0;
};

// An item captured into a graph: replaying it either enqueues `run`, records `event`, or makes
// the stream wait for `event`.
struct GraphItem {
  enum class Kind { kWork, kRecordEvent, kWaitEvent } kind = Kind::kWork;
  std::function<void()> run;
  std::shared_ptr<Event> event;
};

// What a graph keeps alive beyond its items: references on user objects
// (cuGraphRetainUserObject). A graph and the executable graphs instantiated from it share one,
// and the last of them to go runs the releases.
struct GraphResources {
  std::mutex mutex;
  std::vector<std::function<void()>> releases;
  ~GraphResources() {
    for (auto& release : releases) release();
  }
};

struct Graph {
  std::vector<GraphItem> items;  // a linear chain: each item depends on the one before
  std::shared_ptr<GraphResources> resources = std::make_shared<GraphResources>();
};

struct Capture {
  std::shared_ptr<Graph> graph;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id owner;  // the thread that began the capture
  uint64_t id = 0;
  bool invalidated = false;
};

struct Stream : std::enable_shared_from_this<Stream> {
  int device = 0;
  unsigned flags = 0;     // CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING
  bool isLegacy = false;  // the device's legacy default stream
  int priority = 0;

  std::mutex mutex;
  std::condition_variable changed;  // signalled on enqueue and on each completion
  std::deque<Task> queue;
  uint64_t enqueued = 0;   // ticket of the last task enqueued
  uint64_t completed = 0;  // ticket of the last task finished
  bool stopping = false;
  bool workerStarted = false;
  std::shared_ptr<Capture> capture;  // non-null while capturing (guarded by mutex)
};

struct Event {
  unsigned flags = 0;
  std::mutex mutex;
  std::shared_ptr<Stream> stream;  // where it was last recorded; null if never
  uint64_t ticket = 0;             // the marker task's ticket
  int64_t completedAtNs = -1;      // steady-clock time the marker ran, for the recorded ticket
  bool recordedInCapture = false;
};

// ---- devices and contexts -------------------------------------------------------------------
int deviceCount();
CUcontext primaryContext(int device);  // a stable, non-null handle per device
int contextDevice(CUcontext context);  // -1 if not one of ours
int currentDevice();                   // this thread's current context's device
void setCurrentDevice(int device);
bool initialized();
void markInitialized();

// ---- streams ------------------------------------------------------------------------------
// Resolves a handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a created stream) to the
// stream; null when the handle is unknown.
std::shared_ptr<Stream> resolveStream(CUstream handle);
CUstream createStream(unsigned flags, int priority);
bool destroyStream(CUstream handle);
// Enqueues work; while the stream captures, the work is appended to the capture graph instead.
// Returns the task's ticket, or 0 when the work was captured.
uint64_t enqueue(const std::shared_ptr<Stream>& stream, std::function<void()> work,
                 std::vector<Dependency> extraDependencies = {});
void waitFor(const Dependency& dependency);
bool streamIdle(const std::shared_ptr<Stream>& stream);
void synchronizeStream(const std::shared_ptr<Stream>& stream);
void synchronizeDevice(int device);

// ---- events -------------------------------------------------------------------------------
CUevent createEvent(unsigned flags);
std::shared_ptr<Event> resolveEvent(CUevent handle);
bool destroyEvent(CUevent handle);
void recordEvent(const std::shared_ptr<Event>& event, const std::shared_ptr<Stream>& stream);
bool eventComplete(const std::shared_ptr<Event>& event);
void synchronizeEvent(const std::shared_ptr<Event>& event);
void streamWaitEvent(const std::shared_ptr<Stream>& stream, const std::shared_ptr<Event>& event);

// ---- capture ------------------------------------------------------------------------------
CUresult beginCapture(const std::shared_ptr<Stream>& stream, CUstreamCaptureMode mode);
CUresult endCapture(const std::shared_ptr<Stream>& stream, CUgraph* graph);
CUstreamCaptureStatus captureStatus(const std::shared_ptr<Stream>& stream, uint64_t* id,
                                    CUgraph* graph);
CUstreamCaptureMode exchangeThreadCaptureMode(CUstreamCaptureMode mode);
// The capture-safety rule for "potentially unsafe" calls (queries, synchronization, malloc):
// returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the offending captures when the
// calling thread may not make such a call now; CUDA_SUCCESS otherwise.
CUresult checkUnsafeCall();
std::shared_ptr<Graph> resolveGraph(CUgraph handle);
bool destroyGraph(CUgraph handle);
CUgraphExec instantiateGraph(const std::shared_ptr<Graph>& graph);
std::shared_ptr<Graph> resolveGraphExec(CUgraphExec handle);
bool destroyGraphExec(CUgraphExec handle);
void launchGraph(const std::shared_ptr<Graph>& graph, const std::shared_ptr<Stream>& stream);
// The graph (not executable) whose item `node` is (a CUgraphNode is the address of an item of
// a graph that is no longer being captured), with the item's index; null if none.
std::shared_ptr<Graph> graphOfNode(const void* node, size_t* index);

// ---- memory -------------------------------------------------------------------------------
enum class MemoryKind { kDevice, kHost, kManaged };
void* allocate(size_t bytes, MemoryKind kind);  // null when the heap is exhausted
bool release(void* pointer);                    // false if not an allocation start
// Device, host (cudaMallocHost, cudaHostAlloc, or registered with cuMemHostRegister) or managed
// memory; false for pointers the sim knows nothing of.
bool locate(const void* pointer, MemoryKind* kind, int* device);
// The heap allocation holding `pointer`: its start and size.
bool allocationRange(const void* pointer, char** base, size_t* bytes);
// Host memory registered with cuMemHostRegister: false when it overlaps a registered range
// (register) or is not the start of one (unregister).
bool registerHostRange(void* pointer, size_t bytes);
bool unregisterHostRange(void* pointer);
size_t heapBytes();
size_t heapBytesInUse();

}  // namespace cudasim
