// The one implementation behind every profiler ABI version: communicators from init, records
// from Coll and P2p events (plugin-only mode) or joined to the interposer's record of the same
// call (combined mode), kernel and proxy progress into the slots that the progress source
// (plugin/progress.cc) turns into record states and wait notes on the watchdog thread.
//
// Everything here runs on NCCL's threads (the user's, the launch thread, the proxy thread):
// no lock, no allocation, no I/O on an event; init and finalize may allocate and print.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "interpose/recorder.h"
#include "plugin/abi/profiler_abi.h"
#include "plugin/plugin.h"
#include "plugin/slots.h"
#include "trace/clock.h"
#include "watchdog/discovery.h"
#include "watchdog/python_sites.h"

namespace ncclwatch::plugin {
namespace {

using trace::OpKind;

#define NCCLWATCH_TLS thread_local __attribute__((tls_model("initial-exec")))
NCCLWATCH_TLS int t_threadId = 0;
NCCLWATCH_TLS int t_groupApiDepth = 0;
// NCCL passes the same static strings every time: one remembered pointer per thread saves the
// string comparisons on all but the first event of a kind.
NCCLWATCH_TLS const char* t_lastFunc = nullptr;
NCCLWATCH_TLS OpKind t_lastOp = OpKind::kUnknown;
NCCLWATCH_TLS const char* t_lastType = nullptr;
NCCLWATCH_TLS int t_lastDtype = 0;

// Handles of events that carry nothing we keep: recognisable, never dereferenced by NCCL.
struct Sentinel {
  char unused;
};
Sentinel g_groupApiHandle, g_groupHandle, g_launchHandle;

std::mutex g_initMutex;
std::atomic<bool> g_everInitialized{false};
PluginCounters g_counters;

int threadId() {
  if (t_threadId == 0) t_threadId = static_cast<int>(syscall(SYS_gettid));
  return t_threadId;
}

OpKind opFromName(const char* func) {
  if (func == nullptr) return OpKind::kUnknown;
  if (func == t_lastFunc) return t_lastOp;
  static const struct {
    const char* name;
    OpKind op;
  } kOps[] = {{"AllReduce", OpKind::kAllReduce},
              {"Broadcast", OpKind::kBroadcast},
              {"Reduce", OpKind::kReduce},
              {"AllGather", OpKind::kAllGather},
              {"ReduceScatter", OpKind::kReduceScatter},
              {"Send", OpKind::kSend},
              {"Recv", OpKind::kRecv},
              {"AlltoAll", OpKind::kAlltoAll},
              {"Gather", OpKind::kGather},
              {"Scatter", OpKind::kScatter}};
  OpKind op = OpKind::kUnknown;
  for (const auto& known : kOps) {
    if (std::strcmp(func, known.name) == 0) op = known.op;
  }
  t_lastFunc = func;
  t_lastOp = op;
  return op;
}

// ncclDataType_t from NCCL's event spelling ("ncclFloat32"); -1 when unknown.
int dtypeFromName(const char* name) {
  if (name == nullptr) return -1;
  if (name == t_lastType) return t_lastDtype;
  static const char* const kTypes[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                       "ncclUint32",   "ncclInt64",      "ncclUint64",
                                       "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                       "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  int dtype = -1;
  for (int i = 0; i < static_cast<int>(sizeof kTypes / sizeof kTypes[0]); ++i) {
    if (std::strcmp(name, kTypes[i]) == 0) dtype = i;
  }
  t_lastType = name;
  t_lastDtype = dtype;
  return dtype;
}

Context* liveContext(void* context) {
  Context* ctx = pools().contexts.find(context);
  return ctx != nullptr && ctx->live.load(std::memory_order_acquire) == kPublished ? ctx : nullptr;
}

CallSlot* liveCall(void* handle, uint32_t* generation) {
  CallSlot* slot = pools().calls.find(handle);
  if (slot == nullptr || slot->live.load(std::memory_order_acquire) != kPublished) return nullptr;
  *generation = slot->generation.load(std::memory_order_acquire);
  return slot;
}

// The recorder entry of a communicator: the interposer's when it has one (combined mode),
// else one this plugin adds under the context's address.
interpose::CommEntry* entryOf(Context& ctx, interpose::Recorder& recorder) {
  if (interpose::CommEntry* entry = ctx.entry.load(std::memory_order_acquire)) return entry;
  interpose::CommEntry* entry = recorder.findByHash(ctx.commHash);
  if (entry == nullptr) {
    interpose::CommCreation creation;
    creation.comm = reinterpret_cast<ncclComm_t>(&ctx);
    creation.hash = ctx.commHash;
    creation.nranks = ctx.nranks;
    creation.rank = ctx.rank;
    creation.abortable = false;
    entry = recorder.add(creation);
    ctx.ownEntry = entry != nullptr;
  }
  ctx.entry.store(entry, std::memory_order_release);
  return entry;
}

void recordInit(Context& ctx);

// A v3 context learns its communicator from the first event that names it (its size stays
// unknown: v3 never says it).
bool identify(Context& ctx, const EventStart& event) {
  if (ctx.identified) return true;
  if (event.commHash == 0) return false;
  ctx.commHash = event.commHash;
  ctx.rank = event.rank;
  ctx.identified = true;
  recordInit(ctx);
  return true;
}

// Inside an interposer wrapper on this thread: the wrapper's record is this call. Its CUDA
// events complete it; without them (NCCLWATCH_EVENTS=0, no driver, a full pool) the kernel's
// channels do, and the record says so.
void joinWrapperCall(CallSlot& slot, const interpose::IssuedCall& call) {
  slot.joined = true;
  slot.ringIndex = call.index;
  slot.commHash = call.commHash;
  slot.seq = call.seq;
  slot.completesRecord = !call.tracked;
  if (slot.completesRecord) {
    if (interpose::Recorder* recorder = interpose::Recorder::existing()) {
      recorder->writer().updateFlags(call.index, trace::kRecordKernelTracked,
                                     trace::kRecordNoEvents);
    }
  }
}

void fillApi(CallSlot& slot, Context& ctx, const EventStart& event) {
  slot.kind = event.kind;
  slot.context = &ctx;
  slot.contextGeneration = ctx.generation.load(std::memory_order_relaxed);
  slot.op = opFromName(event.func);
  slot.count = event.count;
  slot.dtype = dtypeFromName(event.datatype);
  slot.root = event.root;
  slot.peer = -1;
  slot.stream = reinterpret_cast<uint64_t>(event.stream);
  slot.apiNs = trace::FastClock::nowNs();
  slot.threadId = threadId();
  slot.groupDepth = t_groupApiDepth;
  slot.captured = event.graphCaptured;
  // On the calling thread, inside the NCCL call: its Python frames are the caller's.
  slot.callSite = watchdog::pythonSitesOn() ? watchdog::pythonCallSite(0) : 0;
  slot.hasRecord = slot.joined = false;
  slot.nChannels = 0;
  slot.apiStopped.store(false, std::memory_order_relaxed);
  slot.stoppedApiSeenNs = 0;
  slot.completesRecord = true;
  if (const interpose::IssuedCall* call = interpose::callInProgress()) joinWrapperCall(slot, *call);
}

// Takes over what the API event knew, if `parent` still is that API event; true if it was.
bool inheritApi(CallSlot& slot, void* parent) {
  uint32_t generation = 0;
  CallSlot* api = liveCall(parent, &generation);
  if (api == nullptr || (api->kind != EventKind::kCollApi && api->kind != EventKind::kP2pApi)) {
    return false;
  }
  OpKind op = api->op;
  uint64_t count = api->count;
  int dtype = api->dtype, root = api->root, groupDepth = api->groupDepth, thread = api->threadId;
  uint64_t stream = api->stream, ringIndex = api->ringIndex, commHash = api->commHash;
  uint64_t seq = api->seq, callSite = api->callSite;
  int64_t apiNs = api->apiNs;
  bool captured = api->captured, joined = api->joined, completes = api->completesRecord;
  // A slot reused while we copied (the sweeper gave it back) is not our parent any more.
  if (api->generation.load(std::memory_order_acquire) != generation) return false;
  if (op != OpKind::kUnknown) slot.op = op;
  slot.count = count;
  slot.dtype = dtype;
  if (root >= 0) slot.root = root;
  slot.groupDepth = groupDepth;
  slot.threadId = thread;
  slot.stream = stream;
  slot.apiNs = apiNs;
  slot.callSite = callSite;
  slot.captured = captured;
  slot.joined = joined;
  slot.completesRecord = completes;
  slot.ringIndex = ringIndex;
  slot.commHash = commHash;
  slot.seq = seq;
  // One operation per API call: the API slot has served its purpose.
  pools().calls.release(api);
  return true;
}

// Plugin-only mode: the record of an operation no interposer wrapper saw.
void recordOperation(CallSlot& slot, Context& ctx) {
  interpose::Recorder* recorder = interpose::Recorder::get();
  if (recorder == nullptr || slot.op == OpKind::kUnknown) {
    g_counters.unrecorded.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  interpose::CallDescription call;
  call.op = slot.op;
  call.count = slot.count;
  call.dtype = slot.dtype < 0 ? 0 : slot.dtype;
  call.redop = trace::isCollective(slot.op) ? trace::kRedopUnknown : 0;
  call.rootOrPeer = trace::isPointToPoint(slot.op) ? slot.peer : slot.root;
  call.stream = slot.stream;
  call.callSite = slot.callSite;
  call.commHash = ctx.commHash;
  call.issueNs = slot.apiNs;
  call.threadId = slot.threadId;
  call.groupDepth = slot.groupDepth;
  call.eventsAllowed = false;
  call.extraFlags = trace::kRecordFromPlugin;
  if (slot.captured) {
    call.extraFlags |= trace::kRecordCaptured;
  } else {
    call.extraFlags |= trace::kRecordKernelTracked;
  }
  interpose::IssuedCall issued = recorder->issue(entryOf(ctx, *recorder), call);
  slot.hasRecord = true;
  slot.ringIndex = issued.index;
  slot.commHash = issued.commHash;
  slot.seq = issued.seq;
}

ncclResult_t startOperation(Context& ctx, void** handle, const EventStart& event) {
  CallSlot* slot = pools().calls.claim();
  CallSlot local;  // a dropped slot still gets its record, untracked
  CallSlot& call = slot != nullptr ? *slot : local;
  call.kind = event.kind;
  call.context = &ctx;
  call.contextGeneration = ctx.generation.load(std::memory_order_relaxed);
  call.op = opFromName(event.func);
  call.count = event.count;
  call.dtype = dtypeFromName(event.datatype);
  call.root = event.root;
  call.peer = event.peer;
  call.stream = 0;
  call.apiNs = trace::FastClock::nowNs();
  call.callSite = 0;
  call.threadId = threadId();
  call.groupDepth = t_groupApiDepth;
  call.captured = false;
  call.joined = call.hasRecord = false;
  call.completesRecord = true;
  call.ncclSeqNumber = event.seqNumber;
  call.nChannels = event.nChannels;
  call.startedChannels.store(0, std::memory_order_relaxed);
  call.stoppedChannels.store(0, std::memory_order_relaxed);
  call.kernelStartNs.store(0, std::memory_order_relaxed);
  call.kernelStopNs.store(0, std::memory_order_relaxed);
  call.enqueued.store(false, std::memory_order_relaxed);
  if (!inheritApi(call, event.parent) && event.kind == EventKind::kColl &&
      (call.op == OpKind::kAllGather || call.op == OpKind::kBroadcast)) {
    // Without the API event (v3/v4) NCCL reports these two in bytes of int8: keep its view,
    // which every rank shares, rather than guess the user's type.
    call.dtype = 0;
  }
  // No API event to inherit from (none had a free slot, or the sweeper took it back before a
  // group launched the operation): a single call still runs inside its wrapper on this thread.
  if (!call.joined) {
    if (const interpose::IssuedCall* inProgress = interpose::callInProgress()) {
      joinWrapperCall(call, *inProgress);
    }
  }
  if (call.joined) {
    call.hasRecord = true;
  } else if (ctx.interposerRecords) {
    // The wrapper recorded this call already. A record of the plugin's own here would be a
    // second one, with no reduction op, that takes the next sequence number: every later call
    // of the communicator would be one behind on this rank, a mismatch that never happened.
    g_counters.unjoined.fetch_add(1, std::memory_order_relaxed);
  } else {
    recordOperation(call, ctx);
  }
  if (slot == nullptr) return ncclSuccess;
  if (call.captured || !call.hasRecord) {
    // Graph-captured work completes at replays NCCL does not tie to this record: not tracked.
    pools().calls.release(slot);
    return ncclSuccess;
  }
  pools().calls.publish(slot);
  *handle = slot;
  return ncclSuccess;
}

ncclResult_t startChild(const EventStart& event, void** handle) {
  ChildSlot* child = pools().children.claim();
  if (child == nullptr) return ncclSuccess;
  child->kind = event.kind;
  child->call = nullptr;
  child->op = nullptr;
  child->channel = event.channel;
  child->peer = event.peer;
  child->isSend = event.isSend;
  child->step = event.step;
  child->stopCounted = false;
  child->state.store(0, std::memory_order_relaxed);
  child->sinceNs.store(trace::FastClock::nowNs(), std::memory_order_relaxed);
  if (event.kind == EventKind::kProxyStep) {
    ChildSlot* op = pools().children.find(event.parent);
    if (op != nullptr && op->live.load(std::memory_order_acquire) == kPublished) {
      child->op = op;
      child->opGeneration = op->generation.load(std::memory_order_acquire);
      child->channel = op->channel;
      child->peer = op->peer;
      child->isSend = op->isSend;
    }
  } else if (event.kind == EventKind::kProxyOp && event.pid != getpid()) {
    // PXN: another local process's operation. Its parent and context are addresses in that
    // process: never dereferenced, never even looked up here.
    g_counters.foreignProxyOps.fetch_add(1, std::memory_order_relaxed);
  } else {
    uint32_t generation = 0;
    CallSlot* call = liveCall(event.parent, &generation);
    if (call != nullptr && (call->kind == EventKind::kColl || call->kind == EventKind::kP2p)) {
      child->call = call;
      child->callGeneration = generation;
      if (event.kind == EventKind::kKernelCh) {
        if (event.channel >= 0 && event.channel < 64) {
          call->startedChannels.fetch_or(1ull << event.channel, std::memory_order_acq_rel);
        }
        int64_t expected = 0;
        call->kernelStartNs.compare_exchange_strong(expected, child->sinceNs.load(),
                                                    std::memory_order_acq_rel);
      }
    }
  }
  pools().children.publish(child);
  *handle = child;
  return ncclSuccess;
}

// A KernelCh's stop, counted once on its operation (NCCL records the state, then stops).
void kernelChannelStopped(ChildSlot& child) {
  if (child.stopCounted || child.call == nullptr) return;
  child.stopCounted = true;
  CallSlot& call = *child.call;
  if (call.generation.load(std::memory_order_acquire) != child.callGeneration) return;
  call.kernelStopNs.store(trace::FastClock::nowNs(), std::memory_order_release);
  call.stoppedChannels.fetch_add(1, std::memory_order_acq_rel);
}

// Pins this library in memory: NCCL dlcloses its plugin when the last communicator goes, but
// our watchdog thread and atexit handler live on.
void pinLibrary() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&pinLibrary), &info) != 0 && info.dli_fname != nullptr) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

// A new communicator: the watchdog starts and the secret is offered (both harmless when the
// interposer does the same right after). Its init record is the interposer's when NCCL was
// called through our wrapper on this thread (combined mode), else this plugin's.
void recordInit(Context& ctx) {
  interpose::Recorder* recorder = interpose::Recorder::get();
  if (recorder == nullptr) return;
  recorder->writer().addRecordingSource(trace::kSourcePlugin);
  watchdog::offerCommHashForSecret(ctx.commHash);
  recorder->communicatorCreated();
  // The interposer records it: NCCL was called through our wrapper on this thread, or inits
  // went through our wrappers and NCCL runs this one on its own thread (ncclCommInitAll).
  if (interpose::insideWrapper() || interpose::lifecycleThroughWrappers()) {
    ctx.interposerRecords = true;
    return;
  }
  noteBypassedInterposer();
  interpose::CallDescription call;
  call.op = OpKind::kInit;
  call.count = static_cast<uint64_t>(ctx.nranks);
  call.rootOrPeer = ctx.rank;
  call.countsInSequence = false;
  call.commHash = ctx.commHash;
  call.extraFlags = trace::kRecordFromPlugin;
  interpose::IssuedCall issued = recorder->issue(entryOf(ctx, *recorder), call);
  recorder->finish(issued, nullptr, ncclSuccess);
}

}  // namespace

Pools& pools() {
  static Pools instance;
  return instance;
}

PluginCounters& counters() {
  return g_counters;
}

int activationMask() {
  namespace abi = nccl_profiler_abi;
  int mask =
      abi::kGroupApi | abi::kCollApi | abi::kP2pApi | abi::kColl | abi::kP2p | abi::kKernelCh;
  const char* events = std::getenv("NCCLWATCH_PLUGIN_EVENTS");
  if (events == nullptr || std::strcmp(events, "proxy") == 0) {
    mask |= abi::kProxyOp | abi::kProxyStep;
  } else if (std::strcmp(events, "basic") != 0) {
    std::fprintf(stderr,
                 "[ncclwatch] NCCLWATCH_PLUGIN_EVENTS=%s is not basic or proxy; using proxy\n",
                 events);
    mask |= abi::kProxyOp | abi::kProxyStep;
  }
  return mask;
}

ncclResult_t initContext(void** context, int* mask, const CommIdentity& comm, int abiVersion) {
  *context = nullptr;
  if (!pluginEnabled()) return ncclSuccess;  // NCCL carries on without events for us
  std::lock_guard<std::mutex> lock(g_initMutex);
  Pools& all = pools();
  if (!g_everInitialized.exchange(true)) {
    all.contexts.allocate();
    all.calls.allocate();
    all.children.allocate();
    pinLibrary();
    startProgressSource();
  }
  Context* ctx = all.contexts.claim();
  if (ctx == nullptr) {
    std::fprintf(stderr,
                 "[ncclwatch] profiler plugin: more than %zu live communicators; comm "
                 "%016llx is not recorded\n",
                 kMaxContexts, static_cast<unsigned long long>(comm.commHash));
    return ncclSuccess;
  }
  ctx->identified = comm.known;
  ctx->commHash = comm.commHash;
  ctx->nranks = comm.nranks;
  ctx->rank = comm.rank;
  ctx->abiVersion = abiVersion;
  ctx->entry.store(nullptr, std::memory_order_relaxed);
  ctx->ownEntry = false;
  std::snprintf(ctx->name, sizeof ctx->name, "%s", comm.name != nullptr ? comm.name : "");
  if (mask != nullptr) {
    // One process-wide int: the last init's write wins, and ours is the same every time.
    __atomic_store_n(mask, activationMask(), __ATOMIC_RELAXED);
  }
  all.contexts.publish(ctx);
  if (ctx->identified) recordInit(*ctx);
  *context = ctx;
  return ncclSuccess;
}

ncclResult_t startEvent(void* context, void** handle, const EventStart& event) {
  *handle = nullptr;
  switch (event.kind) {
    case EventKind::kGroupApi:
      // NCCL's depth 1 is the implicit group around a bare call; 2 and more: ncclGroupStart.
      t_groupApiDepth = event.groupDepth > 1 ? event.groupDepth - 1 : 0;
      *handle = &g_groupApiHandle;
      return ncclSuccess;
    case EventKind::kGroup:
      *handle = &g_groupHandle;
      return ncclSuccess;
    case EventKind::kKernelLaunch:
      *handle = &g_launchHandle;
      return ncclSuccess;
    case EventKind::kKernelCh:
    case EventKind::kProxyOp:
    case EventKind::kProxyStep:
      // Proxy-thread events: the context may be another process's (PXN); not needed here.
      return startChild(event, handle);
    case EventKind::kOther:
      return ncclSuccess;
    default:
      break;
  }
  Context* ctx = liveContext(context);
  if (ctx == nullptr || !identify(*ctx, event)) {
    g_counters.unrecorded.fetch_add(1, std::memory_order_relaxed);
    return ncclSuccess;
  }
  if (event.kind == EventKind::kCollApi || event.kind == EventKind::kP2pApi) {
    CallSlot* slot = pools().calls.claim();
    if (slot == nullptr) return ncclSuccess;
    fillApi(*slot, *ctx, event);
    pools().calls.publish(slot);
    *handle = slot;
    return ncclSuccess;
  }
  return startOperation(*ctx, handle, event);
}

ncclResult_t stopEvent(void* handle) {
  if (handle == &g_groupApiHandle) {
    t_groupApiDepth = 0;
    return ncclSuccess;
  }
  Pools& all = pools();
  if (CallSlot* call = all.calls.find(handle)) {
    if (call->kind == EventKind::kCollApi || call->kind == EventKind::kP2pApi) {
      // Kept for its operation event, which a group launches later; the sweeper returns API
      // slots whose operation never came (copy-engine and symmetric-kernel collectives).
      call->apiStopped.store(true, std::memory_order_release);
    } else {
      call->enqueued.store(true, std::memory_order_release);
    }
    return ncclSuccess;
  }
  if (ChildSlot* child = all.children.find(handle)) {
    if (child->kind == EventKind::kKernelCh) kernelChannelStopped(*child);
    all.children.release(child);
  }
  return ncclSuccess;
}

ncclResult_t recordState(void* handle, int state, uint64_t) {
  ChildSlot* child = pools().children.find(handle);
  if (child == nullptr) return ncclSuccess;
  if (child->kind == EventKind::kKernelCh && state == nccl_profiler_abi::kKernelChStop) {
    kernelChannelStopped(*child);
  } else if (child->kind == EventKind::kProxyStep) {
    child->state.store(static_cast<uint8_t>(state), std::memory_order_release);
    child->sinceNs.store(trace::FastClock::nowNs(), std::memory_order_release);
  }
  return ncclSuccess;
}

namespace {

// Said at the first communicator's end after it happened (finalize may print; events may not).
void sayUnjoinedOnce() {
  static std::atomic<bool> said{false};
  uint64_t unjoined = g_counters.unjoined.load(std::memory_order_relaxed);
  if (unjoined == 0 || said.exchange(true)) return;
  std::fprintf(stderr,
               "[ncclwatch] %" PRIu64
               " operations NCCL launched could not be joined to the wrappers' records of their "
               "calls (more than %zu in flight, or grouped calls launched late): those records "
               "stand, without NCCL's kernel progress\n",
               unjoined, kCallSlots);
}

}  // namespace

ncclResult_t finalizeContext(void* context) {
  Context* ctx = liveContext(context);
  if (ctx == nullptr) return ncclSuccess;
  interpose::Recorder* recorder = interpose::Recorder::existing();
  interpose::CommEntry* entry = ctx->entry.load(std::memory_order_acquire);
  if (recorder != nullptr && ctx->ownEntry && entry != nullptr) {
    // Plugin-only: NCCL frees the communicator (destroy or abort; the plugin cannot tell).
    interpose::CallDescription call;
    call.op = OpKind::kDestroy;
    call.extraFlags = trace::kRecordFromPlugin;
    recorder->finish(recorder->issue(entry, call), nullptr, ncclSuccess);
    recorder->forget(reinterpret_cast<ncclComm_t>(ctx));
  }
  sayUnjoinedOnce();
  // Operations still pending on it end as aborted in the next sweep (generation changed).
  ctx->generation.fetch_add(1, std::memory_order_release);
  pools().contexts.release(ctx);
  return ncclSuccess;
}

}  // namespace ncclwatch::plugin
