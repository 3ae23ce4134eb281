// Loads NCCL_PROFILER_PLUGIN the way NCCL does (reference §3.1) and emits its events through the
// plugin's own ABI version (reference §2, docs/sim.md "Profiler plugin"). The descriptors are
// declared once in plugin/abi/profiler_abi.h, in the layout of the newest version; an older
// plugin gets what NCCL's own shims give it (toV4, toV3).
#include "profiler.h"

#include <dlfcn.h>
#include <unistd.h>

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
// v5; NCCLSIM_PROFILER_MAX_VERSION plays 2.27 (4), 2.29/2.30 (6) or 2.32 (7).
int maxProbedVersion() {
  const char* text = std::getenv("NCCLSIM_PROFILER_MAX_VERSION");
  if (text == nullptr || *text == '\0') return 5;
  int version = std::atoi(text);
  if (version < 3 || version > 7) {
    std::fprintf(stderr, "ncclsim: NCCLSIM_PROFILER_MAX_VERSION=%s is not 3-7; using 5\n", text);
    return 5;
  }
  return version;
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
  for (int version = maxProbedVersion(); version >= 3 && plugin->version == 0; --version) {
    void* table = dlsym(library, ("ncclProfiler_v" + std::to_string(version)).c_str());
    if (table == nullptr) continue;
    plugin->version = version;
    if (version >= 5) plugin->v5 = static_cast<const abi::ProfilerV5*>(table);
    if (version == 4) plugin->v4 = static_cast<const abi::ProfilerV4*>(table);
    if (version == 3) plugin->v3 = static_cast<const abi::ProfilerV3*>(table);
    plugin->name = *static_cast<const char* const*>(table);
  }
  if (plugin->version == 0) {
    for (const char* older : {"ncclProfiler_v2", "ncclProfiler_v1"}) {
      if (dlsym(library, older)) {
        std::fprintf(stderr,
                     "ncclsim: profiler plugin exports only %s; the sim drives v3 and newer\n",
                     older);
      }
    }
    info("External profiler plugin is unsupported (no ncclProfiler_v" +
         std::to_string(maxProbedVersion()) + "..v3)");
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
  } else if (plugin->v4 != nullptr) {
    abi::EventDescrV4 v4;
    if (abi::toV4(descr, &v4)) plugin->v4->startEvent(comm->profilerContext, &handle, &v4);
  } else if (plugin->v3 != nullptr) {
    abi::EventDescrV3 v3;
    if (abi::toV3(descr, comm->commHash, &v3)) {
      plugin->v3->startEvent(comm->profilerContext, &handle, &v3);
    }
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

void recordState(void* handle, int state, uint64_t timer) {
  const LoadedPlugin* plugin = loaded();
  if (plugin == nullptr || handle == nullptr) return;
  abi::StateArgs args{};
  args.kernelCh.pTimer = timer;  // the union's only member these states read
  if (plugin->v5 != nullptr) plugin->v5->recordEventState(handle, state, &args);
  if (plugin->v4 != nullptr) plugin->v4->recordEventState(handle, state, &args);
  // v3 knows neither SendPeerWait (20) nor KernelChStop (22): its stop says it.
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
constexpr int kApiBits = abi::kGroupApi | abi::kP2pApi | abi::kCollApi | abi::kKernelLaunch |
                         abi::kGroup | abi::kColl | abi::kP2p | abi::kProxyOp | abi::kProxyStep |
                         abi::kKernelCh | abi::kNetPlugin;
constexpr int kTaskBits =
    abi::kProxyOp | abi::kProxyStep | abi::kKernelCh | abi::kNetPlugin;  // below Coll and P2p
constexpr int kCollApiBits = abi::kCollApi | abi::kColl | kTaskBits;
constexpr int kP2pApiBits = abi::kP2pApi | abi::kP2p | kTaskBits;
constexpr int kGroupBits = abi::kGroup | abi::kColl | abi::kP2p | kTaskBits;
constexpr int kCollBits = abi::kColl | kTaskBits;
constexpr int kP2pBits = abi::kP2p | kTaskBits;
constexpr int kProxyOpBits = abi::kProxyOp | abi::kProxyStep | abi::kNetPlugin;
constexpr int kProxyStepBits = abi::kProxyStep | abi::kNetPlugin;

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

// The tasks NCCL makes of one call: one, or the P2p pieces of AlltoAll, Gather and Scatter.
std::vector<ProfiledTask> tasksOf(const Operation& op) {
  std::vector<ProfiledTask> tasks;
  const int nranks = op.comm->nranks, rank = op.comm->rank;
  auto piece = [&](int peer, bool send) {
    ProfiledTask task;
    task.peer = peer;
    task.send = send;
    task.channels = kP2pChannels;
    task.count = op.count;
    tasks.push_back(task);
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
    tasks.push_back(task);
  }
  return tasks;
}

// The GroupApi event of this thread's outermost group, while one is open.
thread_local void* tGroupApi = nullptr;
thread_local ncclComm* tGroupApiComm = nullptr;

void endGroupApi() {
  if (tGroupApi == nullptr) return;
  recordState(tGroupApi, abi::kGroupApiEndStart, 0);
  stopEvent(tGroupApi);
  tGroupApi = nullptr;
  tGroupApiComm = nullptr;
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
  tGroupApi = nullptr;
  tGroupApiComm = nullptr;
}

void profilerApiCall(Operation& op, cudaStream_t stream, int groupDepth) {
  op.profile.mask = 0;
  op.profile.tasks.clear();
  ncclComm* comm = op.comm;
  if (loaded() == nullptr || !comm->profilerAttached || comm->nranks == 1) return;
  // NCCL drops a count-0 collective before any event, and a one-rank communicator's too.
  if (op.kind == OpKind::kCollective && op.count == 0) return;
  const int mask = currentMask();
  if ((mask & kApiBits) == 0) return;
  op.profile.mask = mask;
  op.profile.tasks = tasksOf(op);
  if (tGroupApi == nullptr) {
    // The first operation of the outermost group (1: the implicit group around a bare call).
    abi::EventDescr group{};
    group.type = abi::kGroupApi;
    group.groupApi.graphCaptured = false;
    group.groupApi.groupDepth = groupDepth + 1;
    tGroupApi = startEvent(comm, group);
    tGroupApiComm = comm;
    recordState(tGroupApi, abi::kGroupApiStartStop, 0);
  }
  const bool p2pTasks = op.kind != OpKind::kCollective || decomposedIntoP2p(op);
  const int apiBits = p2pTasks ? kP2pApiBits : kCollApiBits;
  if ((mask & apiBits) != 0) {
    for (ProfiledTask& task : op.profile.tasks) {
      abi::EventDescr api{};
      api.parentObj = tGroupApi;
      if (p2pTasks) {
        api.type = abi::kP2pApi;
        api.p2pApi = {
            task.send ? "Send" : "Recv", task.count, eventTypeName(op.dtype), stream, false, 0};
      } else {
        api.type = abi::kCollApi;
        api.collApi = {collKindName(op.coll),
                       op.count,
                       eventTypeName(op.dtype),
                       collKindHasRoot(op.coll) ? op.root : -1,
                       stream,
                       false,
                       0};
      }
      task.api = startEvent(comm, api);
      stopEvent(task.api);
    }
  }
  if (groupDepth == 0) endGroupApi();  // a bare call is its own (implicit) group
}

void profilerGroupEnd() {
  endGroupApi();
}

void profilerLaunch(std::vector<Operation>& ops) {
  void* group = nullptr;
  ncclComm* groupComm = nullptr;
  for (Operation& op : ops) {
    const int mask = op.profile.mask;
    if (mask == 0) continue;
    ncclComm* comm = op.comm;
    if (group == nullptr && (mask & kGroupBits) != 0) {
      abi::EventDescr legacy{};
      legacy.type = abi::kGroup;
      group = startEvent(comm, legacy);
      groupComm = comm;
    }
    const bool p2pTasks = op.kind != OpKind::kCollective || decomposedIntoP2p(op);
    if ((mask & (p2pTasks ? kP2pBits : kCollBits)) == 0) continue;
    for (ProfiledTask& task : op.profile.tasks) {
      abi::EventDescr event{};
      // v4 and older plugins have no API events: their parent is the legacy group.
      event.parentObj = task.api != nullptr ? task.api : group;
      event.rank = comm->rank;
      if (p2pTasks) {
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
        event.type = abi::kColl;
        event.coll = {comm->profilerSeqNumbers[funcIndex(op.coll)]++,
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
      stopEvent(task.op);  // "enqueued"
    }
  }
  if (group != nullptr && groupComm != nullptr) stopEvent(group);
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

ProxyStep::ProxyStep(Operation& op, int peer, bool send, int state) {
  if ((op.profile.mask & kProxyOpBits) == 0 || op.profile.tasks.empty()) return;
  op_ = &op;
  // The task this step serves: the piece toward `peer` when the call was split into pieces.
  void* parent = op.profile.tasks.front().op;
  for (const ProfiledTask& task : op.profile.tasks) {
    if (task.peer == peer && task.send == send) parent = task.op;
  }
  abi::EventDescr proxy{};
  proxy.type = abi::kProxyOp;
  proxy.parentObj = parent;
  proxy.rank = op.comm->rank;
  proxy.proxyOp = {getpid(), 0, peer, 1, 1 << 17, send ? 1 : 0};
  proxyOp_ = startEvent(op.comm, proxy);
  if ((op.profile.mask & kProxyStepBits) == 0) return;
  abi::EventDescr step{};
  step.type = abi::kProxyStep;
  step.parentObj = proxyOp_;
  step.rank = op.comm->rank;
  step.proxyStep.step = static_cast<int>(op.comm->profilerProxySteps++);
  step_ = startEvent(op.comm, step);
  recordState(step_, state, 0);
}

void ProxyStep::enter(int state) {
  if (step_ != nullptr) recordState(step_, state, 0);
}

ProxyStep::~ProxyStep() {
  if (op_ == nullptr) return;
  stopEvent(step_);
  stopEvent(proxyOp_);
}

}  // namespace ncclsim
