// The exported ncclProfiler_v7 ... v3 tables: one thin adapter per ABI version that reads
// NCCL's descriptor of that version into the internal EventStart and calls the one
// implementation (plugin/recording.cc). NCCL picks the newest table its loader knows (2.32:
// v7, 2.29-2.30: v6, 2.28: v5, 2.27: v4, 2.26: v3).
#include <cstring>

#include "plugin/abi/profiler_abi.h"
#include "plugin/event_model.h"

namespace ncclwatch::plugin {
namespace {

namespace abi = nccl_profiler_abi;

constexpr const char* kPluginName = "ncclwatch";

// The v5/v6/v7 descriptor (one shape; a version never sets members it lacks).
EventStart fromDescr(const abi::EventDescr& d) {
  EventStart e;
  e.parent = d.parentObj;
  switch (d.type) {
    case abi::kGroupApi:
      e.kind = EventKind::kGroupApi;
      e.groupDepth = d.groupApi.groupDepth;
      e.graphCaptured = d.groupApi.graphCaptured;
      break;
    case abi::kCollApi:
      e.kind = EventKind::kCollApi;
      e.func = d.collApi.func;
      e.count = d.collApi.count;
      e.datatype = d.collApi.datatype;
      e.root = d.collApi.root;
      e.stream = d.collApi.stream;
      e.graphCaptured = d.collApi.graphCaptured;
      break;
    case abi::kP2pApi:
      e.kind = EventKind::kP2pApi;
      e.func = d.p2pApi.func;
      e.count = d.p2pApi.count;
      e.datatype = d.p2pApi.datatype;
      e.stream = d.p2pApi.stream;
      e.graphCaptured = d.p2pApi.graphCaptured;
      break;
    case abi::kKernelLaunch:
      e.kind = EventKind::kKernelLaunch;
      e.stream = d.kernelLaunch.stream;
      break;
    case abi::kGroup:
      e.kind = EventKind::kGroup;
      break;
    case abi::kColl:
      e.kind = EventKind::kColl;
      e.rank = d.rank;
      e.hasSeqNumber = true;
      e.seqNumber = d.coll.seqNumber;
      e.func = d.coll.func;
      e.count = d.coll.count;
      e.root = d.coll.root;
      e.datatype = d.coll.datatype;
      e.nChannels = d.coll.nChannels;
      break;
    case abi::kP2p:
      e.kind = EventKind::kP2p;
      e.rank = d.rank;
      e.func = d.p2p.func;
      e.datatype = d.p2p.datatype;
      e.count = d.p2p.count;
      e.peer = d.p2p.peer;
      e.nChannels = d.p2p.nChannels;
      break;
    case abi::kProxyOp:
      e.kind = EventKind::kProxyOp;
      e.rank = d.rank;
      e.pid = d.proxyOp.pid;
      e.channel = d.proxyOp.channelId;
      e.peer = d.proxyOp.peer;
      e.nSteps = d.proxyOp.nSteps;
      e.isSend = d.proxyOp.isSend != 0;
      break;
    case abi::kProxyStep:
      e.kind = EventKind::kProxyStep;
      e.rank = d.rank;
      e.step = d.proxyStep.step;
      break;
    case abi::kKernelCh:
      e.kind = EventKind::kKernelCh;
      e.channel = d.kernelCh.channelId;
      break;
    default:
      break;  // ProxyCtrl, NetPlugin, CE and KernelPhase events: not used
  }
  return e;
}

EventStart fromDescrV4(const abi::EventDescrV4& d) {
  EventStart e;
  e.parent = d.parentObj;
  switch (d.type) {
    case abi::kGroup:
      e.kind = EventKind::kGroup;
      break;
    case abi::kColl:
      e.kind = EventKind::kColl;
      e.rank = d.rank;
      e.hasSeqNumber = true;
      e.seqNumber = d.coll.seqNumber;
      e.func = d.coll.func;
      e.count = d.coll.count;
      e.root = d.coll.root;
      e.datatype = d.coll.datatype;
      e.nChannels = d.coll.nChannels;
      break;
    case abi::kP2p:
      e.kind = EventKind::kP2p;
      e.rank = d.rank;
      e.func = d.p2p.func;
      e.datatype = d.p2p.datatype;
      e.count = d.p2p.count;
      e.peer = d.p2p.peer;
      e.nChannels = d.p2p.nChannels;
      break;
    case abi::kProxyOp:
      e.kind = EventKind::kProxyOp;
      e.rank = d.rank;
      e.pid = d.proxyOp.pid;
      e.channel = d.proxyOp.channelId;
      e.peer = d.proxyOp.peer;
      e.nSteps = d.proxyOp.nSteps;
      e.isSend = d.proxyOp.isSend != 0;
      break;
    case abi::kProxyStep:
      e.kind = EventKind::kProxyStep;
      e.rank = d.rank;
      e.step = d.proxyStep.step;
      break;
    case abi::kKernelCh:
      e.kind = EventKind::kKernelCh;
      e.channel = d.kernelCh.channelId;
      break;
    default:
      break;
  }
  return e;
}

EventStart fromDescrV3(const abi::EventDescrV3& d) {
  EventStart e;
  e.parent = d.parentObj;
  switch (d.type) {
    case abi::kGroup:
      e.kind = EventKind::kGroup;
      break;
    case abi::kColl:
      e.kind = EventKind::kColl;
      e.rank = d.rank;
      e.commHash = d.coll.commHash;
      e.hasSeqNumber = true;
      e.seqNumber = d.coll.seqNumber;
      e.func = d.coll.func;
      e.count = d.coll.count;
      e.root = d.coll.root;
      e.datatype = d.coll.datatype;
      e.nChannels = d.coll.nMaxChannels;
      break;
    case abi::kP2p:
      e.kind = EventKind::kP2p;
      e.rank = d.rank;
      e.commHash = d.p2p.commHash;
      e.func = d.p2p.func;
      e.datatype = d.p2p.datatype;
      e.count = d.p2p.count;
      e.peer = d.p2p.peer;
      break;
    case abi::kProxyOp:
      e.kind = EventKind::kProxyOp;
      e.rank = d.rank;
      e.pid = d.proxyOp.pid;
      e.channel = d.proxyOp.channelId;
      e.peer = d.proxyOp.peer;
      e.nSteps = d.proxyOp.nSteps;
      e.isSend = d.proxyOp.isSend != 0;
      break;
    case abi::kProxyStep:
      e.kind = EventKind::kProxyStep;
      e.rank = d.rank;
      e.step = d.proxyStep.step;
      break;
    case abi::kKernelCh:
      e.kind = EventKind::kKernelCh;
      e.channel = d.kernelCh.channelId;
      break;
    default:
      break;
  }
  return e;
}

// Every entry point catches everything: nothing of ours may unwind into NCCL.
template <typename Body>
ncclResult_t guarded(Body body) {
  try {
    return body();
  } catch (...) {
    return ncclSuccess;
  }
}

ncclResult_t initV5(void** context, uint64_t commId, int* mask, const char* name, int nNodes,
                    int nranks, int rank, abi::DebugLogger, int version) {
  return guarded([&] {
    CommIdentity comm{true, commId, name, nNodes, nranks, rank};
    return initContext(context, mask, comm, version);
  });
}
ncclResult_t initV7(void** context, uint64_t commId, int* mask, const char* name, int nNodes,
                    int nranks, int rank, abi::DebugLogger log) {
  return initV5(context, commId, mask, name, nNodes, nranks, rank, log, 7);
}
ncclResult_t initV6(void** context, uint64_t commId, int* mask, const char* name, int nNodes,
                    int nranks, int rank, abi::DebugLogger log) {
  return initV5(context, commId, mask, name, nNodes, nranks, rank, log, 6);
}
ncclResult_t initV5Table(void** context, uint64_t commId, int* mask, const char* name, int nNodes,
                         int nranks, int rank, abi::DebugLogger log) {
  return initV5(context, commId, mask, name, nNodes, nranks, rank, log, 5);
}
// v4 passes the commHash after the name (v5 moved it first).
ncclResult_t initV4(void** context, int* mask, const char* name, uint64_t commHash, int nNodes,
                    int nranks, int rank, abi::DebugLogger) {
  return guarded([&] {
    CommIdentity comm{true, commHash, name, nNodes, nranks, rank};
    return initContext(context, mask, comm, 4);
  });
}
ncclResult_t initV3(void** context, int* mask) {
  return guarded([&] { return initContext(context, mask, CommIdentity{}, 3); });
}

ncclResult_t start(void* context, void** handle, abi::EventDescr* descr) {
  *handle = nullptr;  // written first: NCCL must never keep a stale handle
  return guarded([&] { return startEvent(context, handle, fromDescr(*descr)); });
}
ncclResult_t startV4(void* context, void** handle, abi::EventDescrV4* descr) {
  *handle = nullptr;
  return guarded([&] { return startEvent(context, handle, fromDescrV4(*descr)); });
}
ncclResult_t startV3(void* context, void** handle, abi::EventDescrV3* descr) {
  *handle = nullptr;
  return guarded([&] { return startEvent(context, handle, fromDescrV3(*descr)); });
}

ncclResult_t stop(void* handle) {
  return guarded([&] { return stopEvent(handle); });
}

ncclResult_t state(void* handle, int eventState, abi::StateArgs* args) {
  return guarded([&] {
    uint64_t timer =
        eventState == abi::kKernelChStop && args != nullptr ? args->kernelCh.pTimer : 0;
    return recordState(handle, eventState, timer);
  });
}
ncclResult_t stateV3(void* handle, int eventState, abi::StateArgsV3*) {
  return guarded([&] { return recordState(handle, eventState, 0); });
}

ncclResult_t finalize(void* context) {
  return guarded([&] { return finalizeContext(context); });
}

}  // namespace

// Non-const data objects, as NCCL's loader expects (it reads them through dlsym). The block
// form of extern "C" makes these definitions, not declarations.
#define NCCLWATCH_EXPORT __attribute__((visibility("default")))
extern "C" {
NCCLWATCH_EXPORT abi::ProfilerV7 ncclProfiler_v7 = {
    {kPluginName, initV7, start, stop, state, finalize}};
NCCLWATCH_EXPORT abi::ProfilerV6 ncclProfiler_v6 = {kPluginName, initV6, start,
                                                    stop,        state,  finalize};
NCCLWATCH_EXPORT abi::ProfilerV5 ncclProfiler_v5 = {kPluginName, initV5Table, start,
                                                    stop,        state,       finalize};
NCCLWATCH_EXPORT abi::ProfilerV4 ncclProfiler_v4 = {kPluginName, initV4, startV4,
                                                    stop,        state,  finalize};
NCCLWATCH_EXPORT abi::ProfilerV3 ncclProfiler_v3 = {kPluginName, initV3,  startV3,
                                                    stop,        stateV3, finalize};
}

}  // namespace ncclwatch::plugin
