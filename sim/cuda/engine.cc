// The sim's CUDA engine. Everything lives in one leaked State object so that detached stream
// workers can outlive static destruction at exit, and a fork child starts from a fresh State
// (the parent's worker threads do not exist in the child).
#include "engine.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <map>
#include <unordered_map>

namespace cudasim {
namespace {

constexpr size_t kAllocationAlignment = 256;
constexpr size_t kPunchHoleMinimum = 1 << 20;

struct DeviceState {
  std::mutex mutex;  // orders enqueues on the device so default-stream dependencies are exact
  std::shared_ptr<Stream> legacy;
  std::vector<std::weak_ptr<Stream>> blockingStreams;
};

struct Allocation {
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::kDevice;
  int device = 0;
};

struct Heap {
  std::mutex mutex;
  int fd = -1;
  char* base = nullptr;
  size_t bytes = 0;
  std::map<size_t, size_t> freeBlocks;       // offset -> bytes
  std::map<size_t, Allocation> allocations;  // offset -> allocation
  size_t inUse = 0;
  bool failed = false;
};

struct State {
  pid_t pid = getpid();
  std::atomic<bool> initialized{false};
  int devices = 8;
  std::vector<std::unique_ptr<DeviceState>> deviceStates;
  std::vector<char> contextTags;  // their addresses are the CUcontext handles

  std::mutex registryMutex;
  std::unordered_map<void*, std::shared_ptr<Stream>> streams;
  std::unordered_map<void*, std::shared_ptr<Event>> events;
  std::unordered_map<void*, std::shared_ptr<Graph>> graphs;
  std::unordered_map<void*, std::shared_ptr<Graph>> graphExecs;  // key: a heap-allocated tag

  std::mutex hostRangesMutex;
  std::map<uintptr_t, std::pair<size_t, int>> hostRanges;  // start -> (bytes, device)

  std::mutex captureMutex;
  std::vector<std::shared_ptr<Capture>> activeCaptures;
  uint64_t nextCaptureId = 1;

  Heap heap;
};

// A whole decimal number from the environment within [least, most], else `fallback`.
long envNumber(const char* name, long fallback, long least, long most) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < least || value > most) return fallback;
  return value;
}

int readDeviceCount() {
  return static_cast<int>(envNumber("CUDASIM_DEVICES", 8, 1, 1024));
}

// How many tasks a stream holds before a launch blocks the host thread until the device works
// one off. A real stream takes about a thousand pending kernel launches, then the next launch
// waits for the oldest to finish (NVIDIA's forum, "CUDA stream are blocked when launch lots of
// kernels (>1000)"). Without a bound one rank of a sim job ran a hundred thousand collectives
// ahead of its peer, which no GPU lets a job do (docs/sim.md). CUDASIM_PENDING_LAUNCHES sets it;
// 0 lifts it (a test's way to put more work in flight than one real stream holds).
size_t pendingLaunchLimit() {
  static const size_t limit =
      static_cast<size_t>(envNumber("CUDASIM_PENDING_LAUNCHES", 1024, 0, LONG_MAX));
  return limit;
}

// A stream's worker runs host functions, which may not launch work of their own (CUDA forbids
// CUDA calls there); if one does, it is never held back by the bound (it would wait on itself).
thread_local bool t_onStreamWorker = false;

std::atomic<State*> g_state{nullptr};
std::mutex g_stateCreation;

void forgetParentState() {
  // The child has none of the parent's threads; never touch the parent's locks again.
  new (&g_stateCreation) std::mutex();
  g_state.store(nullptr);
}

State& state() {
  State* current = g_state.load(std::memory_order_acquire);
  if (current != nullptr) return *current;
  std::lock_guard<std::mutex> lock(g_stateCreation);
  current = g_state.load(std::memory_order_relaxed);
  if (current == nullptr) {
    static std::once_flag atforkOnce;
    std::call_once(atforkOnce, [] { pthread_atfork(nullptr, nullptr, forgetParentState); });
    current = new State();  // leaked on purpose: detached workers may still run at exit
    current->devices = readDeviceCount();
    current->contextTags.resize(current->devices);
    for (int i = 0; i < current->devices; ++i) {
      current->deviceStates.push_back(std::make_unique<DeviceState>());
    }
    g_state.store(current, std::memory_order_release);
  }
  return *current;
}

thread_local int t_device = 0;
thread_local CUstreamCaptureMode t_captureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
thread_local std::vector<std::shared_ptr<Stream>> t_perThreadStreams;
thread_local pid_t t_perThreadPid = 0;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void workerLoop(std::shared_ptr<Stream> stream) {
  // Process signals belong to the application's threads, as with the driver's own threads.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  t_onStreamWorker = true;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(stream->mutex);
      stream->changed.wait(lock, [&] { return !stream->queue.empty() || stream->stopping; });
      if (stream->queue.empty()) {
        stream->workerStarted = false;
        return;
      }
      task = std::move(stream->queue.front());
      stream->queue.pop_front();
    }
    for (const Dependency& dependency : task.dependencies) waitFor(dependency);
    if (task.run) task.run();
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      stream->completed = task.ticket;
    }
    stream->changed.notify_all();
  }
}

std::shared_ptr<Stream> makeStream(int device, unsigned flags, int priority, bool legacy) {
  auto stream = std::make_shared<Stream>();
  stream->device = device;
  stream->flags = flags;
  stream->priority = priority;
  stream->isLegacy = legacy;
  return stream;
}

std::shared_ptr<Stream> legacyStream(int device) {
  DeviceState& dev = *state().deviceStates[device];
  std::lock_guard<std::mutex> lock(dev.mutex);
  if (!dev.legacy) dev.legacy = makeStream(device, CU_STREAM_DEFAULT, 0, true);
  return dev.legacy;
}

void registerBlocking(const std::shared_ptr<Stream>& stream) {
  if (stream->flags & CU_STREAM_NON_BLOCKING) return;
  DeviceState& dev = *state().deviceStates[stream->device];
  std::lock_guard<std::mutex> lock(dev.mutex);
  dev.blockingStreams.push_back(stream);
}

std::shared_ptr<Stream> perThreadStream(int device) {
  if (t_perThreadPid != getpid()) {
    t_perThreadStreams.clear();
    t_perThreadPid = getpid();
  }
  if (t_perThreadStreams.size() <= static_cast<size_t>(device)) {
    t_perThreadStreams.resize(device + 1);
  }
  auto& stream = t_perThreadStreams[device];
  if (!stream) {
    stream = makeStream(device, CU_STREAM_DEFAULT, 0, false);
    registerBlocking(stream);
  }
  return stream;
}

// Returns the ticket of the pending tail of `stream`, or 0 when it has nothing pending.
uint64_t pendingTail(Stream& stream) {
  std::lock_guard<std::mutex> lock(stream.mutex);
  return stream.enqueued > stream.completed ? stream.enqueued : 0;
}

Heap& heap() {
  State& s = state();
  Heap& h = s.heap;
  std::lock_guard<std::mutex> lock(h.mutex);
  if (h.base != nullptr || h.failed) return h;
  size_t gib = 16;
  if (const char* text = std::getenv("CUDASIM_HEAP_GB")) {
    long value = std::strtol(text, nullptr, 10);
    if (value >= 1 && value <= 1024) gib = static_cast<size_t>(value);
  }
  h.bytes = gib << 30;
  h.fd = memfd_create("cudasim-heap", MFD_CLOEXEC);
  if (h.fd < 0 || ftruncate(h.fd, static_cast<off_t>(h.bytes)) != 0) {
    h.failed = true;
    return h;
  }
  void* base = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, h.fd, 0);
  if (base == MAP_FAILED) {
    h.failed = true;
    return h;
  }
  h.base = static_cast<char*>(base);
  h.freeBlocks[0] = h.bytes;
  return h;
}

}  // namespace

// ---- devices -------------------------------------------------------------------------------

int deviceCount() {
  return state().devices;
}

CUcontext primaryContext(int device) {
  State& s = state();
  if (device < 0 || device >= s.devices) return nullptr;
  return reinterpret_cast<CUcontext>(&s.contextTags[device]);
}

int contextDevice(CUcontext context) {
  State& s = state();
  auto* tag = reinterpret_cast<char*>(context);
  if (s.contextTags.empty() || tag < &s.contextTags.front() || tag > &s.contextTags.back()) {
    return -1;
  }
  return static_cast<int>(tag - &s.contextTags.front());
}

int currentDevice() {
  return t_device < deviceCount() ? t_device : 0;
}
void setCurrentDevice(int device) {
  t_device = device;
}
bool initialized() {
  return state().initialized.load();
}
void markInitialized() {
  state().initialized.store(true);
}

// ---- streams -------------------------------------------------------------------------------

std::shared_ptr<Stream> resolveStream(CUstream handle) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY) return legacyStream(currentDevice());
  if (handle == CU_STREAM_PER_THREAD) return perThreadStream(currentDevice());
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.streams.find(handle);
  return it == s.streams.end() ? nullptr : it->second;
}

CUstream createStream(unsigned flags, int priority) {
  auto stream = makeStream(currentDevice(), flags, priority, false);
  registerBlocking(stream);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  s.streams[stream.get()] = stream;
  return reinterpret_cast<CUstream>(stream.get());
}

bool destroyStream(CUstream handle) {
  std::shared_ptr<Stream> stream;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.registryMutex);
    auto it = s.streams.find(handle);
    if (it == s.streams.end()) return false;
    stream = it->second;
    s.streams.erase(it);
  }
  {
    // Like cudaStreamDestroy: returns at once; queued work still runs, then the worker exits.
    std::lock_guard<std::mutex> lock(stream->mutex);
    stream->stopping = true;
  }
  stream->changed.notify_all();
  return true;
}

uint64_t enqueue(const std::shared_ptr<Stream>& stream, std::function<void()> work,
                 std::vector<Dependency> extraDependencies) {
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (stream->capture) {
      GraphItem item;
      item.run = std::move(work);
      // Captured work replays in capture order; cross-stream waits are captured separately.
      stream->capture->graph->items.push_back(std::move(item));
      return 0;
    }
  }
  if (const size_t limit = pendingLaunchLimit(); limit > 0 && !t_onStreamWorker) {
    // A full stream: the launch waits for room, as the driver's does. Before the device's lock,
    // so that other streams' launches go on meanwhile.
    std::unique_lock<std::mutex> lock(stream->mutex);
    stream->changed.wait(lock, [&] { return stream->queue.size() < limit || stream->stopping; });
  }
  std::vector<Dependency> dependencies = std::move(extraDependencies);
  std::shared_ptr<Stream> legacy;
  if (!stream->isLegacy && !(stream->flags & CU_STREAM_NON_BLOCKING)) {
    legacy = legacyStream(stream->device);
  }
  DeviceState& dev = *state().deviceStates[stream->device];
  std::lock_guard<std::mutex> deviceLock(dev.mutex);
  if (stream->isLegacy) {
    // The legacy default stream waits for all prior work of the device's blocking streams.
    auto& list = dev.blockingStreams;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const std::weak_ptr<Stream>& w) { return w.expired(); }),
               list.end());
    for (const auto& weak : list) {
      if (auto other = weak.lock()) {
        if (uint64_t tail = pendingTail(*other)) dependencies.push_back({other, tail});
      }
    }
  } else if (legacy) {
    // ...and blocking streams wait for prior work of the legacy default stream.
    if (uint64_t tail = pendingTail(*legacy)) dependencies.push_back({legacy, tail});
  }
  bool startWorker = false;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    Task task;
    task.dependencies = std::move(dependencies);
    task.run = std::move(work);
    task.ticket = ticket = ++stream->enqueued;
    stream->queue.push_back(std::move(task));
    if (!stream->workerStarted) {
      stream->workerStarted = true;
      startWorker = true;
    }
  }
  if (startWorker) {
    std::thread(workerLoop, stream->shared_from_this()).detach();
  } else {
    stream->changed.notify_all();
  }
  return ticket;
}

void waitFor(const Dependency& dependency) {
  if (!dependency.stream) return;
  std::unique_lock<std::mutex> lock(dependency.stream->mutex);
  dependency.stream->changed.wait(
      lock, [&] { return dependency.stream->completed >= dependency.ticket; });
}

bool streamIdle(const std::shared_ptr<Stream>& stream) {
  std::lock_guard<std::mutex> lock(stream->mutex);
  return stream->completed >= stream->enqueued;
}

void synchronizeStream(const std::shared_ptr<Stream>& stream) {
  if (stream->isLegacy) {
    // The legacy stream's work includes its implicit waits for blocking streams: a marker task
    // appended to it completes only when everything before it did.
    std::mutex doneMutex;
    std::condition_variable doneChanged;
    bool done = false;
    enqueue(stream, [&] {
      std::lock_guard<std::mutex> lock(doneMutex);
      done = true;
      doneChanged.notify_all();
    });
    std::unique_lock<std::mutex> lock(doneMutex);
    doneChanged.wait(lock, [&] { return done; });
    return;
  }
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    target = stream->enqueued;
  }
  waitFor({stream, target});
}

void synchronizeDevice(int device) {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    DeviceState& dev = *state().deviceStates[device];
    std::lock_guard<std::mutex> lock(dev.mutex);
    if (dev.legacy) streams.push_back(dev.legacy);
  }
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.registryMutex);
    for (auto& [handle, stream] : s.streams) {
      if (stream->device == device) streams.push_back(stream);
    }
  }
  if (device < static_cast<int>(t_perThreadStreams.size()) && t_perThreadStreams[device]) {
    streams.push_back(t_perThreadStreams[device]);
  }
  for (auto& stream : streams) {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      target = stream->enqueued;
    }
    waitFor({stream, target});
  }
}

// ---- events --------------------------------------------------------------------------------

CUevent createEvent(unsigned flags) {
  auto event = std::make_shared<Event>();
  event->flags = flags;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  s.events[event.get()] = event;
  return reinterpret_cast<CUevent>(event.get());
}

std::shared_ptr<Event> resolveEvent(CUevent handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.events.find(handle);
  return it == s.events.end() ? nullptr : it->second;
}

bool destroyEvent(CUevent handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  return s.events.erase(handle) == 1;
}

void recordEvent(const std::shared_ptr<Event>& event, const std::shared_ptr<Stream>& stream) {
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (stream->capture) {
      GraphItem item;
      item.kind = GraphItem::Kind::kRecordEvent;
      item.event = event;
      stream->capture->graph->items.push_back(std::move(item));
      return;
    }
  }
  std::lock_guard<std::mutex> eventLock(event->mutex);
  // The marker learns its ticket only after enqueue returns; it takes the event's lock, so it
  // cannot stamp the time before the ticket is stored below.
  auto generation = std::make_shared<uint64_t>(0);
  std::weak_ptr<Event> weakEvent = event;
  event->ticket = enqueue(stream, [weakEvent, generation] {
    if (auto target = weakEvent.lock()) {
      std::lock_guard<std::mutex> lock(target->mutex);
      if (target->ticket == *generation) target->completedAtNs = nowNs();
    }
  });
  *generation = event->ticket;
  event->stream = stream;
  event->completedAtNs = -1;
  event->recordedInCapture = false;
}

bool eventComplete(const std::shared_ptr<Event>& event) {
  std::shared_ptr<Stream> stream;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    stream = event->stream;
    ticket = event->ticket;
  }
  if (!stream) return true;
  std::lock_guard<std::mutex> lock(stream->mutex);
  return stream->completed >= ticket;
}

void synchronizeEvent(const std::shared_ptr<Event>& event) {
  Dependency dependency;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    dependency = {event->stream, event->ticket};
  }
  waitFor(dependency);
}

void streamWaitEvent(const std::shared_ptr<Stream>& stream, const std::shared_ptr<Event>& event) {
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (stream->capture) {
      GraphItem item;
      item.kind = GraphItem::Kind::kWaitEvent;
      item.event = event;
      stream->capture->graph->items.push_back(std::move(item));
      return;
    }
  }
  Dependency dependency;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    dependency = {event->stream, event->ticket};
  }
  if (!dependency.stream || dependency.stream == stream) return;  // FIFO already orders it
  enqueue(stream, nullptr, {dependency});
}

// ---- capture -------------------------------------------------------------------------------

CUresult beginCapture(const std::shared_ptr<Stream>& stream, CUstreamCaptureMode mode) {
  if (stream->isLegacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  auto capture = std::make_shared<Capture>();
  capture->graph = std::make_shared<Graph>();
  capture->mode = mode;
  capture->owner = std::this_thread::get_id();
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (stream->capture) return CUDA_ERROR_ILLEGAL_STATE;
    std::lock_guard<std::mutex> captureLock(s.captureMutex);
    capture->id = s.nextCaptureId++;
    stream->capture = capture;
    s.activeCaptures.push_back(capture);
  }
  return CUDA_SUCCESS;
}

CUresult endCapture(const std::shared_ptr<Stream>& stream, CUgraph* graph) {
  std::shared_ptr<Capture> capture;
  {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (!stream->capture) return CUDA_ERROR_ILLEGAL_STATE;
    capture = stream->capture;
    if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
        capture->owner != std::this_thread::get_id()) {
      return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    stream->capture.reset();
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.captureMutex);
  auto& active = s.activeCaptures;
  active.erase(std::remove(active.begin(), active.end(), capture), active.end());
  if (capture->invalidated) {
    if (graph) *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  std::lock_guard<std::mutex> registryLock(s.registryMutex);
  s.graphs[capture->graph.get()] = capture->graph;
  if (graph) *graph = reinterpret_cast<CUgraph>(capture->graph.get());
  return CUDA_SUCCESS;
}

CUstreamCaptureStatus captureStatus(const std::shared_ptr<Stream>& stream, uint64_t* id,
                                    CUgraph* graph) {
  std::lock_guard<std::mutex> lock(stream->mutex);
  if (!stream->capture) return CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = stream->capture->id;
  if (graph) *graph = reinterpret_cast<CUgraph>(stream->capture->graph.get());
  return stream->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

CUstreamCaptureMode exchangeThreadCaptureMode(CUstreamCaptureMode mode) {
  CUstreamCaptureMode previous = t_captureMode;
  t_captureMode = mode;
  return previous;
}

CUresult checkUnsafeCall() {
  if (t_captureMode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.captureMutex);
  const auto me = std::this_thread::get_id();
  bool prohibited = false;
  for (auto& capture : s.activeCaptures) {
    // CUDA's rule: a thread's own non-relaxed capture always prohibits; in global mode, so does
    // another thread's global-mode capture.
    bool own = capture->owner == me && capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool foreign = t_captureMode == CU_STREAM_CAPTURE_MODE_GLOBAL && capture->owner != me &&
                   capture->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign) {
      capture->invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

std::shared_ptr<Graph> resolveGraph(CUgraph handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.graphs.find(handle);
  return it == s.graphs.end() ? nullptr : it->second;
}

bool destroyGraph(CUgraph handle) {
  std::shared_ptr<Graph> graph;  // dropped after the lock: it may release user objects
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.graphs.find(handle);
  if (it == s.graphs.end()) return false;
  graph = std::move(it->second);
  s.graphs.erase(it);
  return true;
}

std::shared_ptr<Graph> graphOfNode(const void* node, size_t* index) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  for (auto& [handle, graph] : s.graphs) {
    auto& items = graph->items;
    if (items.empty()) continue;
    auto* item = static_cast<const GraphItem*>(node);
    if (item >= items.data() && item < items.data() + items.size()) {
      if (index) *index = static_cast<size_t>(item - items.data());
      return graph;
    }
  }
  return nullptr;
}

CUgraphExec instantiateGraph(const std::shared_ptr<Graph>& graph) {
  auto copy = std::make_shared<Graph>(*graph);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  s.graphExecs[copy.get()] = copy;
  return reinterpret_cast<CUgraphExec>(copy.get());
}

std::shared_ptr<Graph> resolveGraphExec(CUgraphExec handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.graphExecs.find(handle);
  return it == s.graphExecs.end() ? nullptr : it->second;
}

bool destroyGraphExec(CUgraphExec handle) {
  std::shared_ptr<Graph> exec;  // dropped after the lock: it may release user objects
  State& s = state();
  std::lock_guard<std::mutex> lock(s.registryMutex);
  auto it = s.graphExecs.find(handle);
  if (it == s.graphExecs.end()) return false;
  exec = std::move(it->second);
  s.graphExecs.erase(it);
  return true;
}

void launchGraph(const std::shared_ptr<Graph>& graph, const std::shared_ptr<Stream>& stream) {
  for (const GraphItem& item : graph->items) {
    switch (item.kind) {
      case GraphItem::Kind::kWork:
        enqueue(stream, item.run);
        break;
      case GraphItem::Kind::kRecordEvent:
        recordEvent(item.event, stream);
        break;
      case GraphItem::Kind::kWaitEvent:
        streamWaitEvent(stream, item.event);
        break;
    }
  }
}

// ---- memory --------------------------------------------------------------------------------

void* allocate(size_t bytes, MemoryKind kind) {
  Heap& h = heap();
  if (h.base == nullptr) return nullptr;
  size_t rounded =
      std::max<size_t>(kAllocationAlignment, (bytes + kAllocationAlignment - 1) /
                                                 kAllocationAlignment * kAllocationAlignment);
  std::lock_guard<std::mutex> lock(h.mutex);
  for (auto it = h.freeBlocks.begin(); it != h.freeBlocks.end(); ++it) {
    if (it->second < rounded) continue;
    size_t offset = it->first;
    size_t remaining = it->second - rounded;
    h.freeBlocks.erase(it);
    if (remaining > 0) h.freeBlocks[offset + rounded] = remaining;
    h.allocations[offset] = {rounded, kind, currentDevice()};
    h.inUse += rounded;
    return h.base + offset;
  }
  return nullptr;
}

bool release(void* pointer) {
  Heap& h = heap();
  if (h.base == nullptr) return false;
  char* p = static_cast<char*>(pointer);
  if (p < h.base || p >= h.base + h.bytes) return false;
  size_t offset = static_cast<size_t>(p - h.base);
  std::lock_guard<std::mutex> lock(h.mutex);
  auto it = h.allocations.find(offset);
  if (it == h.allocations.end()) return false;
  size_t bytes = it->second.bytes;
  h.allocations.erase(it);
  h.inUse -= bytes;
  if (bytes >= kPunchHoleMinimum) {
    // Give the pages back: a long job that frees big buffers must not keep them resident.
    fallocate(h.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(bytes));
  }
  auto next = h.freeBlocks.lower_bound(offset);
  if (next != h.freeBlocks.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = h.freeBlocks.erase(next);
  }
  if (next != h.freeBlocks.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      previous->second += bytes;
      return true;
    }
  }
  h.freeBlocks[offset] = bytes;
  return true;
}

namespace {
bool locateHostRange(const void* pointer, int* device) {
  State& s = state();
  auto address = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(s.hostRangesMutex);
  auto it = s.hostRanges.upper_bound(address);
  if (it == s.hostRanges.begin()) return false;
  --it;
  if (address >= it->first + it->second.first) return false;
  if (device) *device = it->second.second;
  return true;
}
}  // namespace

bool locate(const void* pointer, MemoryKind* kind, int* device) {
  Heap& h = heap();
  const char* p = static_cast<const char*>(pointer);
  if (h.base == nullptr || p < h.base || p >= h.base + h.bytes) {
    if (!locateHostRange(pointer, device)) return false;
    if (kind) *kind = MemoryKind::kHost;
    return true;
  }
  size_t offset = static_cast<size_t>(p - h.base);
  std::lock_guard<std::mutex> lock(h.mutex);
  auto it = h.allocations.upper_bound(offset);
  if (it == h.allocations.begin()) return false;
  --it;
  if (offset >= it->first + it->second.bytes) return false;
  if (kind) *kind = it->second.kind;
  if (device) *device = it->second.device;
  return true;
}

bool allocationRange(const void* pointer, char** base, size_t* bytes) {
  Heap& h = heap();
  const char* p = static_cast<const char*>(pointer);
  if (h.base == nullptr || p < h.base || p >= h.base + h.bytes) return false;
  size_t offset = static_cast<size_t>(p - h.base);
  std::lock_guard<std::mutex> lock(h.mutex);
  auto it = h.allocations.upper_bound(offset);
  if (it == h.allocations.begin()) return false;
  --it;
  if (offset >= it->first + it->second.bytes) return false;
  if (base) *base = h.base + it->first;
  if (bytes) *bytes = it->second.bytes;
  return true;
}

bool registerHostRange(void* pointer, size_t bytes) {
  State& s = state();
  auto start = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(s.hostRangesMutex);
  auto next = s.hostRanges.lower_bound(start);
  if (next != s.hostRanges.end() && next->first < start + bytes) return false;
  if (next != s.hostRanges.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.first > start) return false;
  }
  s.hostRanges[start] = {bytes, currentDevice()};
  return true;
}

bool unregisterHostRange(void* pointer) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.hostRangesMutex);
  return s.hostRanges.erase(reinterpret_cast<uintptr_t>(pointer)) == 1;
}

size_t heapBytes() {
  return heap().bytes;
}

size_t heapBytesInUse() {
  Heap& h = heap();
  std::lock_guard<std::mutex> lock(h.mutex);
  return h.inUse;
}

}  // namespace cudasim

// ---- the private extension for the sim's NCCL -----------------------------------------------

#include "cudasim_ext.h"

extern "C" __attribute__((visibility("default"))) int cudasimHeapLocate(const void* ptr,
                                                                        cudasimHeapRef* out) {
  using namespace cudasim;
  Heap& h = heap();
  const char* p = static_cast<const char*>(ptr);
  if (out == nullptr || h.base == nullptr || p < h.base || p >= h.base + h.bytes) return -1;
  size_t offset = static_cast<size_t>(p - h.base);
  std::lock_guard<std::mutex> lock(h.mutex);
  auto it = h.allocations.upper_bound(offset);
  if (it == h.allocations.begin()) return -1;
  --it;
  if (offset >= it->first + it->second.bytes) return -1;
  out->pid = static_cast<int>(getpid());
  out->fd = h.fd;
  out->offset = offset;
  out->bytesToEnd = it->first + it->second.bytes - offset;
  return 0;
}

extern "C" __attribute__((visibility("default"))) unsigned long long cudasimHeapSize(void) {
  return cudasim::heapBytes();
}
