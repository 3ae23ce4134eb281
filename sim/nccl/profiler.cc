// Loads NCCL_PROFILER_PLUGIN the way NCCL does (reference §3.1) and emits its events through the
// plugin's own ABI version (reference §2, docs/sim.md "Profiler plugin"). The descriptors are
// declared once in plugin/abi/profiler_abi.h, in the layout of the newest version; an older
// plugin gets what NCCL's own shims give it (toV4, toV3).
#include "profiler.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "internal.h"
#include "plugin/abi/profiler_abi.h"
#include "profiler_names.h"

namespace ncclsim {
namespace {

namespace abi = nccl_profiler_abi;

enum LogLevel { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogTrace = 5 };

// A loaded plugin: immutable once published, so the emitting threads read it without a lock.
struct LoadedPlugin {
  void* library = nullptr;
  int version = 0;                      // 3..7
  const abi::ProfilerV5* v5 = nullptr;  // v5, v6 and v7 tables share this shape
  const abi::ProfilerV4* v4 = nullptr;
  const abi::ProfilerV3* v3 = nullptr;
  const char* name = nullptr;
  // A v3 plugin under its own NCCL (2.26) gets the commHash in Coll/P2p; newer NCCLs' v3 shims
  // pass 0 there (reference §1.8).
  bool v3CommHash = false;
};

struct PluginState {
  std::mutex mutex;
  enum class Load { kNotLoaded, kLoaded, kFailed } load = Load::kNotLoaded;
  int references = 0;
  std::atomic<const LoadedPlugin*> plugin{nullptr};
};

PluginState* gState = new PluginState;  // leaked: comms may be freed during exit

// NCCL passes one process-wide int to every init; plugins may change it at any time.
int gEventActivationMask = 0;

int currentMask() {
  return __atomic_load_n(&gEventActivationMask, __ATOMIC_RELAXED);
}

int debugLevel() {
  const char* level = std::getenv("NCCL_DEBUG");
  if (!level) return kLogNone;
  std::string text = level;
  if (text == "VERSION") return kLogVersion;
  if (text == "WARN") return kLogWarn;
  if (text == "INFO") return kLogInfo;
  if (text == "TRACE") return kLogTrace;
  return kLogNone;
}

void pluginLog(int level, unsigned long, const char* file, int line, const char* fmt, ...) {
  if (level > debugLevel()) return;
  std::fprintf(stderr, "ncclsim: NCCL %s:%d ", file ? file : "?", line);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

void info(const std::string& text) {
  if (debugLevel() >= kLogInfo || simConfig().debug)
    std::fprintf(stderr, "ncclsim: %s\n", text.c_str());
}

// The newest table version this NCCL's loader asks for: 2.28.9 (the sim's ncclGetVersion) knows
// v5; NCCLSIM_PROFILER_MAX_VERSION plays 2.26 (3), 2.27 (4), 2.29/2.30 (6) or 2.32 (7).
int maxProbedVersion() {
  const char* text = std::getenv("NCCLSIM_PROFILER_MAX_VERSION");
  if (text == nullptr || *text == '\0') return 5;
  char* end = nullptr;
  const long version = std::strtol(text, &end, 10);
  if (*end != '\0' || version < 3 || version > 7) {
    std::fprintf(stderr, "ncclsim: NCCLSIM_PROFILER_MAX_VERSION=%s is not 3-7; using 5\n", text);
    return 5;
  }
  return static_cast<int>(version);
}

// Takes the newest table the loader knows from `library`; false when it has none of v3..max.
bool pickTable(void* library, int maxVersion, LoadedPlugin* plugin) {
  for (int version = maxVersion; version >= 3; --version) {
    void* table = dlsym(library, ("ncclProfiler_v" + std::to_string(version)).c_str());
    if (table == nullptr) continue;
    plugin->version = version;
    if (version >= 5) plugin->v5 = static_cast<const abi::ProfilerV5*>(table);
    if (version == 4) plugin->v4 = static_cast<const abi::ProfilerV4*>(table);
    if (version == 3) plugin->v3 = static_cast<const abi::ProfilerV3*>(table);
    plugin->name = *static_cast<const char* const*>(table);
    plugin->v3CommHash = maxVersion == 3;
    return true;
  }
  return false;
}

// The loaded plugin, or null (load failed for good: NCCL never retries a failed load).
const LoadedPlugin* loadPlugin() {
  const ProfilerPluginPlan plan = planProfilerPluginLoad(std::getenv("NCCL_PROFILER_PLUGIN"));
  if (plan.disabled) return nullptr;
  void* library = nullptr;
  std::string tried;
  for (const auto& candidate : plan.candidates) {
    library = dlopen(candidate ? candidate->c_str() : nullptr, RTLD_NOW | RTLD_LOCAL);
    if (library) break;
    tried += " " + (candidate ? *candidate : std::string("(global scope)"));
  }
  if (!library) {
    info("PROFILER/Plugin: Could not find:" + tried);
    return nullptr;
  }
  auto* plugin = new LoadedPlugin;
  plugin->library = library;
  const int maxVersion = maxProbedVersion();
  if (!pickTable(library, maxVersion, plugin)) {
    bool older = false;
    for (const char* symbol : {"ncclProfiler_v2", "ncclProfiler_v1"}) {
      if (older || dlsym(library, symbol) == nullptr) continue;
      older = true;
      std::fprintf(stderr,
                   "ncclsim: profiler plugin exports only %s; the sim drives v3 and newer: "
                   "continuing without a profiler\n",
                   symbol);
    }
    if (!older) {
      std::fprintf(stderr,
                   "ncclsim: profiler plugin has no ncclProfiler_v%d..v3 table: continuing "
                   "without a profiler\n",
                   maxVersion);
    }
    dlclose(library);
    delete plugin;
    return nullptr;
  }
  info(std::string("PROFILER/Plugin: Loaded ") + (plugin->name ? plugin->name : "?") + " (v" +
       std::to_string(plugin->version) + ")");
  return plugin;
}

const LoadedPlugin* loaded() {
  return gState->plugin.load(std::memory_order_acquire);
}

// ---- emitting: one descriptor in the newest layout, converted for older plugins ----

void* startEvent(ncclComm* comm, abi::EventDescr& descr) {
  const LoadedPlugin* plugin = loaded();
  if (plugin == nullptr || !comm->profilerAttached) return nullptr;
  void* handle = nullptr;
  if (plugin->v5 != nullptr) {
    plugin->v5->startEvent(comm->profilerContext, &handle, &descr);
    return handle;
  }
  // NCCL's v4 (and v3) shim hangs Coll and P2p under the legacy Group, as v4 NCCL did.
  void* legacyParent = descr.parentObj;
  if (descr.type == abi::kColl) legacyParent = descr.coll.parentGroup;
  if (descr.type == abi::kP2p) legacyParent = descr.p2p.parentGroup;
  if (plugin->v4 != nullptr) {
    abi::EventDescrV4 v4;
    if (!abi::toV4(descr, &v4)) return nullptr;
    v4.parentObj = legacyParent;
    plugin->v4->startEvent(comm->profilerContext, &handle, &v4);
  } else if (plugin->v3 != nullptr) {
    abi::EventDescrV3 v3;
    if (!abi::toV3(descr, plugin->v3CommHash ? comm->commHash : 0, &v3)) return nullptr;
    v3.parentObj = legacyParent;
    plugin->v3->startEvent(comm->profilerContext, &handle, &v3);
  }
  return handle;
}

void stopEvent(void* handle) {
  const LoadedPlugin* plugin = loaded();
  if (plugin == nullptr || handle == nullptr) return;
  if (plugin->v5 != nullptr) plugin->v5->stopEvent(handle);
  if (plugin->v4 != nullptr) plugin->v4->stopEvent(handle);
  if (plugin->v3 != nullptr) plugin->v3->stopEvent(handle);
}

// `value` fills the state arguments' first word: a KernelCh stop's pTimer, a ProxyStep's
// transSize (the union's members share that offset).
void recordState(void* handle, int state, uint64_t value = 0) {
  const LoadedPlugin* plugin = loaded();
  if (plugin == nullptr || handle == nullptr) return;
  abi::StateArgs args{};
  if (state == abi::kKernelChStop) {
    args.kernelCh.pTimer = value;
  } else {
    args.proxyStep.transSize = value;
  }
  if (plugin->v5 != nullptr) plugin->v5->recordEventState(handle, state, &args);
  if (plugin->v4 != nullptr) plugin->v4->recordEventState(handle, state, &args);
  // v3 knows neither the v4 states (19, 20) nor KernelChStop (22): its stop says it.
  if (plugin->v3 != nullptr && state < abi::kProxyOpInProgress) {
    abi::StateArgsV3 v3{};
    plugin->v3->recordEventState(handle, state, &v3);
  }
}

uint64_t nowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Which mask bits make each event (reference §2.3: lower levels imply their ancestors).
constexpr int kTaskBits =
    abi::kProxyOp | abi::kProxyStep | abi::kKernelCh | abi::kNetPlugin;  // below Coll and P2p
constexpr int kApiBits = abi::kGroupApi | abi::kP2pApi | abi::kCollApi | abi::kKernelLaunch |
                         abi::kGroup | abi::kColl | abi::kP2p | kTaskBits;
constexpr int kCollApiBits = abi::kCollApi | abi::kColl | kTaskBits;
constexpr int kP2pApiBits = abi::kP2pApi | abi::kP2p | kTaskBits;
constexpr int kGroupBits = abi::kGroup | abi::kColl | abi::kP2p | kTaskBits;
constexpr int kCollBits = abi::kColl | kTaskBits;
constexpr int kP2pBits = abi::kP2p | kTaskBits;
constexpr int kProxyOpBits = abi::kProxyOp | abi::kProxyStep | abi::kNetPlugin;
constexpr int kProxyStepBits = abi::kProxyStep | abi::kNetPlugin;
// A captured plan "has proxy ops" (NCCL then runs its Coll events at every replay) when the
// network would (the sim plays a network whenever proxy events are asked for) or KernelCh does.
constexpr int kPlanProxyBits = abi::kKernelCh | kProxyOpBits;

// NCCL's spelling of a datatype in events.
const char* eventTypeName(ncclDataType_t type) {
  static const char* const kNames[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                       "ncclUint32",   "ncclInt64",      "ncclUint64",
                                       "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                       "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  int index = static_cast<int>(type);
  return index >= 0 && index < 12 ? kNames[index] : "ncclInt8";
}

// NCCL's per-communicator, per-function collective counter index (ncclFunc_t order).
int funcIndex(CollKind kind) {
  switch (kind) {
    case CollKind::kBroadcast:
      return 0;
    case CollKind::kReduce:
      return 1;
    case CollKind::kAllGather:
      return 2;
    case CollKind::kReduceScatter:
      return 3;
    default:
      return 4;
  }
}

bool decomposedIntoP2p(const Operation& op) {
  return op.kind == OpKind::kCollective &&
         (op.coll == CollKind::kAlltoAll || op.coll == CollKind::kGather ||
          op.coll == CollKind::kScatter);
}

bool p2pTasks(const Operation& op) {
  return op.kind != OpKind::kCollective || decomposedIntoP2p(op);
}

// The tasks NCCL makes of one call: one, or the P2p pieces of AlltoAll, Gather and Scatter.
void tasksOf(const Operation& op, ProfiledTasks* tasks) {
  const int nranks = op.comm->nranks, rank = op.comm->rank;
  auto piece = [&](int peer, bool send) {
    ProfiledTask task;
    task.peer = peer;
    task.send = send;
    task.channels = kP2pChannels;
    task.count = op.count;
    tasks->add(task);
  };
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
    piece(op.peer, op.kind == OpKind::kSend);
  } else if (op.coll == CollKind::kAlltoAll) {
    for (int peer = 0; peer < nranks; ++peer) {
      piece(peer, true);
      piece(peer, false);
    }
  } else if (op.coll == CollKind::kGather) {
    piece(op.root, true);
    if (rank == op.root) {
      for (int peer = 0; peer < nranks; ++peer) piece(peer, false);
    }
  } else if (op.coll == CollKind::kScatter) {
    if (rank == op.root) {
      for (int peer = 0; peer < nranks; ++peer) piece(peer, true);
    }
    piece(op.root, false);
  } else {
    ProfiledTask task;
    task.channels = kCollChannels;
    task.count = op.count;
    tasks->add(task);
  }
}

bool streamCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

// The GroupApi event of this thread's outermost group while one is open (its handle may be
// NULL: the plugin decides, and a NULL handle is still an open group).
thread_local bool tGroupApiOpen = false;
thread_local void* tGroupApi = nullptr;

void apiEvent(ncclComm* comm, const Operation& op, cudaStream_t stream, ProfiledTask& task) {
  abi::EventDescr api{};
  api.parentObj = tGroupApi;
  if (p2pTasks(op)) {
    api.type = abi::kP2pApi;
    api.p2pApi = {task.send ? "Send" : "Recv", task.count, eventTypeName(op.dtype), stream,
                  op.profile.captured,         0};
  } else {
    api.type = abi::kCollApi;
    api.collApi = {collKindName(op.coll),
                   op.count,
                   eventTypeName(op.dtype),
                   collKindHasRoot(op.coll) ? op.root : -1,
                   stream,
                   op.profile.captured,
                   0};
  }
  task.api = startEvent(comm, api);
  stopEvent(task.api);
}

// The Coll or P2p event of one task, started and stopped ("enqueued") at once.
void taskEvent(Operation& op, ProfiledTask& task, void* group, bool countSeq) {
  ncclComm* comm = op.comm;
  abi::EventDescr event{};
  event.parentObj = task.api;
  event.rank = comm->rank;
  if (p2pTasks(op)) {
    event.type = abi::kP2p;
    event.p2p = {task.send ? "Send" : "Recv",
                 task.send ? const_cast<void*>(op.sendPtr) : op.recvPtr,
                 eventTypeName(op.dtype),
                 task.count,
                 task.peer,
                 static_cast<uint8_t>(task.channels),
                 group,
                 0};
  } else {
    // NCCL counts AllGather and Broadcast in bytes of int8 here (the API event has the user's
    // view), and numbers each function's collectives on its own, from 0.
    const bool inBytes = op.coll == CollKind::kAllGather || op.coll == CollKind::kBroadcast;
    std::atomic<uint64_t>& counter = comm->profilerSeqNumbers[funcIndex(op.coll)];
    event.type = abi::kColl;
    event.coll = {countSeq ? counter.fetch_add(1) : counter.load(),
                  collKindName(op.coll),
                  op.sendPtr,
                  op.recvPtr,
                  inBytes ? op.count * dataTypeSize(op.dtype) : op.count,
                  collKindHasRoot(op.coll) ? op.root : -1,
                  inBytes ? "ncclInt8" : eventTypeName(op.dtype),
                  static_cast<uint8_t>(task.channels),
                  8,
                  "RING",
                  "SIMPLE",
                  group,
                  "sim",
                  false,
                  0};
  }
  task.op = startEvent(comm, event);
  stopEvent(task.op);
}

void countWithoutEvents(const Operation& op) {
  ncclComm* comm = op.comm;
  if (!comm->profilerAttached || op.kind != OpKind::kCollective || decomposedIntoP2p(op) ||
      op.count == 0 || comm->nranks == 1) {
    return;
  }
  comm->profilerSeqNumbers[funcIndex(op.coll)].fetch_add(1, std::memory_order_relaxed);
}

// The API events of one call (out of line: the common path above stays a few instructions).
[[gnu::noinline]] void apiEvents(Operation& op, cudaStream_t stream, int groupDepth, int mask) {
  ncclComm* comm = op.comm;
  op.profile.mask = mask;
  op.profile.captured = streamCapturing(stream);
  tasksOf(op, &op.profile.tasks);
  if (!tGroupApiOpen) {
    // The first operation of the outermost group (1: the implicit group around a bare call).
    abi::EventDescr group{};
    group.type = abi::kGroupApi;
    group.groupApi.graphCaptured = op.profile.captured;
    group.groupApi.groupDepth = groupDepth + 1;
    tGroupApi = startEvent(comm, group);
    tGroupApiOpen = true;
    recordState(tGroupApi, abi::kGroupApiStartStop);
  }
  if ((mask & (p2pTasks(op) ? kP2pApiBits : kCollApiBits)) == 0) return;
  for (ProfiledTask& task : op.profile.tasks) apiEvent(comm, op, stream, task);
}

// The launch events of one communicator's plan: the operations of `ops` on `comm` that have a
// mask. A group spanning communicators makes one plan (KernelLaunch, Group) per communicator.
void planEvents(std::span<Operation> ops, ncclComm* comm, cudaStream_t stream, bool replay) {
  void* group = nullptr;
  bool groupStarted = false;
  bool launchSeen = false;
  for (Operation& op : ops) {
    const int mask = op.profile.mask;
    if (mask == 0 || op.comm != comm) continue;
    // A captured plan: its Coll events come at every replay when it has proxy ops (with a
    // counted seqNumber only if KernelCh asked for them), otherwise once, at capture, uncounted.
    const bool perReplay = op.profile.captured && (mask & kPlanProxyBits) != 0;
    if (replay != perReplay) continue;
    if (!launchSeen && !replay) {
      launchSeen = true;  // the plan's first task with a mask decides, as in NCCL
      if ((mask & abi::kKernelLaunch) != 0) {
        abi::EventDescr launch{};
        launch.type = abi::kKernelLaunch;
        launch.parentObj = tGroupApi;
        launch.kernelLaunch.stream = stream;
        stopEvent(startEvent(comm, launch));
      }
    }
    if (!groupStarted && (mask & kGroupBits) != 0) {
      abi::EventDescr legacy{};
      legacy.type = abi::kGroup;
      group = startEvent(comm, legacy);
      groupStarted = true;
    }
    if ((mask & (p2pTasks(op) ? kP2pBits : kCollBits)) == 0) continue;
    for (ProfiledTask& task : op.profile.tasks) {
      const bool countSeq = !op.profile.captured || (replay && (mask & abi::kKernelCh) != 0 &&
                                                     (group != nullptr || task.api != nullptr));
      taskEvent(op, task, group, countSeq);
    }
  }
  stopEvent(group);
}

[[gnu::noinline]] void launchEvents(std::span<Operation> ops, cudaStream_t stream, bool replay) {
  for (size_t i = 0; i < ops.size(); ++i) {
    bool first = true;  // the first operation of its communicator here
    for (size_t j = 0; j < i && first; ++j) first = ops[j].comm != ops[i].comm;
    if (first) planEvents(ops, ops[i].comm, stream, replay);
  }
}

}  // namespace

void profilerAttach(ncclComm* comm) {
  PluginState& state = *gState;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.load == PluginState::Load::kFailed) return;
  if (state.load == PluginState::Load::kNotLoaded) {
    const LoadedPlugin* plugin = loadPlugin();
    if (plugin == nullptr) {
      state.load = PluginState::Load::kFailed;
      return;
    }
    state.plugin.store(plugin, std::memory_order_release);
    state.load = PluginState::Load::kLoaded;
  }
  const LoadedPlugin* plugin = loaded();
  ++state.references;
  comm->profilerAttached = true;
  void* context = nullptr;
  const char* name = comm->commName.empty() ? nullptr : comm->commName.c_str();
  ncclResult_t result = ncclSuccess;
  if (plugin->v5 != nullptr) {
    result = plugin->v5->init(&context, comm->commHash, &gEventActivationMask, name, 1,
                              comm->nranks, comm->rank, pluginLog);
  } else if (plugin->v4 != nullptr) {
    result = plugin->v4->init(&context, &gEventActivationMask, name, comm->commHash, 1,
                              comm->nranks, comm->rank, pluginLog);
  } else {
    result = plugin->v3->init(&context, &gEventActivationMask);
  }
  // NCCL 2.28 only logs a failed init and carries on with whatever context the plugin wrote.
  if (result != ncclSuccess)
    info("Profiler init failed; continuing without profiler for this communicator");
  comm->profilerContext = context;
}

void profilerDetach(ncclComm* comm) {
  if (!comm->profilerAttached) return;
  PluginState& state = *gState;
  std::lock_guard<std::mutex> lock(state.mutex);
  const LoadedPlugin* plugin = loaded();
  comm->profilerAttached = false;
  if (comm->profilerContext) {
    if (plugin->v5 != nullptr) plugin->v5->finalize(comm->profilerContext);
    if (plugin->v4 != nullptr) plugin->v4->finalize(comm->profilerContext);
    if (plugin->v3 != nullptr) plugin->v3->finalize(comm->profilerContext);
  }
  comm->profilerContext = nullptr;
  if (--state.references == 0) {
    // Like NCCL: close at the last communicator; the next init loads it afresh. The table is
    // unpublished first, so emitters that load it afterwards emit nothing.
    state.plugin.store(nullptr, std::memory_order_release);
    dlclose(plugin->library);
    delete plugin;
    state.load = PluginState::Load::kNotLoaded;
  }
}

void profilerResetAfterFork() {
  // The parent's communicators do not exist in the child: start from "not loaded". The library
  // stays mapped; loading it again only bumps the loader's count.
  gState = new PluginState;
  tGroupApiOpen = false;
  tGroupApi = nullptr;
}

void profilerApiCall(Operation& op, cudaStream_t stream, int groupDepth) {
  op.profile.mask = 0;
  op.profile.tasks.clear();
  ncclComm* comm = op.comm;
  if (loaded() == nullptr || !comm->profilerAttached || comm->nranks == 1) return;
  // NCCL drops a count-0 collective before any event, and a one-rank communicator's too.
  if (op.kind == OpKind::kCollective && op.count == 0) return;
  const int mask = currentMask();
  if ((mask & kApiBits) != 0) apiEvents(op, stream, groupDepth, mask);
}

void profilerGroupEndEntry() {
  if (tGroupApiOpen) recordState(tGroupApi, abi::kGroupApiEndStart);
}

void profilerGroupEndExit() {
  if (!tGroupApiOpen) return;
  stopEvent(tGroupApi);
  tGroupApi = nullptr;
  tGroupApiOpen = false;
}

void profilerLaunch(std::span<Operation> ops, cudaStream_t stream, bool captured, bool replay) {
  if (loaded() == nullptr) return;
  bool events = false;
  for (const Operation& op : ops) {
    // NCCL counts every launched collective, with or without events (RAS reads the same
    // counters); a captured one only under KernelCh, which a mask of 0 lacks.
    if (op.profile.mask != 0) {
      events = true;
    } else if (!captured && !replay) {
      countWithoutEvents(op);
    }
  }
  if (events) launchEvents(ops, stream, replay);
}

void profilerKernelStart(Operation& op) {
  if ((op.profile.mask & abi::kKernelCh) == 0 || op.comm->cancelOps.load()) return;
  for (ProfiledTask& task : op.profile.tasks) {
    for (int channel = 0; channel < task.channels; ++channel) {
      abi::EventDescr kernel{};
      kernel.type = abi::kKernelCh;
      kernel.parentObj = task.op;
      kernel.kernelCh.channelId = static_cast<uint8_t>(channel);
      kernel.kernelCh.pTimer = nowNs();
      task.kernels[channel] = startEvent(op.comm, kernel);
    }
  }
}

void profilerKernelStop(Operation& op) {
  // An aborted communicator's kernel never finishes: NCCL reports no stop for it.
  if ((op.profile.mask & abi::kKernelCh) == 0 || op.comm->cancelOps.load()) return;
  for (ProfiledTask& task : op.profile.tasks) {
    for (int channel = 0; channel < task.channels; ++channel) {
      void*& kernel = task.kernels[channel];
      if (kernel == nullptr) continue;
      recordState(kernel, abi::kKernelChStop, nowNs());
      stopEvent(kernel);
      kernel = nullptr;
    }
  }
}

ProxyTransfer::ProxyTransfer(Operation& op, int peer, bool send, int steps) {
  if ((op.profile.mask & kProxyOpBits) == 0 || op.profile.tasks.empty() ||
      op.comm->cancelOps.load()) {
    return;
  }
  op_ = &op;
  steps_ = steps;
  // The task this transfer serves: the piece toward `peer` when the call was split into pieces.
  const ProfiledTask* task = &op.profile.tasks.front();
  for (const ProfiledTask& piece : op.profile.tasks) {
    if (piece.peer == peer && piece.send == send) task = &piece;
  }
  channels_ = std::clamp(task->channels, 1, kCollChannels);
  const uint64_t bytes = task->count * dataTypeSize(op.dtype);
  stepBytes_ = std::max<uint64_t>(1, bytes / static_cast<uint64_t>(channels_ * steps));
  for (int channel = 0; channel < channels_; ++channel) {
    abi::EventDescr proxy{};
    proxy.type = abi::kProxyOp;
    proxy.parentObj = task->op;
    proxy.rank = op.comm->rank;
    proxy.proxyOp = {getpid(),
                     static_cast<uint8_t>(channel),
                     peer,
                     steps,
                     static_cast<int>(std::min<uint64_t>(stepBytes_, 1 << 30)),
                     send ? 1 : 0};
    proxyOps_[channel] = startEvent(op.comm, proxy);
    recordState(proxyOps_[channel], abi::kProxyOpInProgress);
  }
}

// The step bookkeeping runs whether or not events are emitted (nothing once the communicator is
// aborted), so callers can pace themselves by it.
bool ProxyTransfer::emitsSteps() const {
  return (op_->profile.mask & kProxyStepBits) != 0 && !op_->comm->cancelOps.load();
}

void ProxyTransfer::beginStep(int state) {
  if (op_ == nullptr || inStep_) return;
  inStep_ = true;
  if (!emitsSteps()) return;
  for (int channel = 0; channel < channels_; ++channel) {
    abi::EventDescr step{};
    step.type = abi::kProxyStep;
    step.parentObj = proxyOps_[channel];
    step.rank = op_->comm->rank;
    step.proxyStep.step = stepsDone_;
    stepHandles_[channel] = startEvent(op_->comm, step);
    recordState(stepHandles_[channel], state, stepBytes_);
  }
}

void ProxyTransfer::enter(int state) {
  if (op_ == nullptr || !inStep_ || !emitsSteps()) return;
  for (int channel = 0; channel < channels_; ++channel) {
    recordState(stepHandles_[channel], state, stepBytes_);
  }
}

void ProxyTransfer::endStep() {
  if (op_ == nullptr || !inStep_) return;
  const bool emit = emitsSteps();
  for (int channel = 0; channel < channels_; ++channel) {
    if (emit) stopEvent(stepHandles_[channel]);
    stepHandles_[channel] = nullptr;
  }
  inStep_ = false;
  ++stepsDone_;
}

ProxyTransfer::~ProxyTransfer() {
  // An aborted communicator's proxy work is dropped without events, like its kernels.
  if (op_ == nullptr || op_->comm->cancelOps.load()) return;
  endStep();
  for (int channel = 0; channel < channels_; ++channel) stopEvent(proxyOps_[channel]);
}

}  // namespace ncclsim
