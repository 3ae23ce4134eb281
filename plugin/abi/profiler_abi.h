// The NCCL profiler-plugin ABI, versions 3 to 7, declared from the facts in docs/plugin.md (sizes
// and offsets measured against NVIDIA's headers for 2.26-2.30 and read from NVIDIA/nccl's
// profiler_v7.h for 2.32). Both sides use it: plugin/ implements the tables, and the sim's
// libnccl.so.2 plays NCCL and calls them. Every size and offset either side relies on is pinned
// by a static_assert below, so a layout slip fails the build instead of corrupting events.
//
// Header only; depends on nothing but <nccl.h> (for ncclResult_t) and the C library.
#pragma once
#include <nccl.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace nccl_profiler_abi {

// Event-type bits of the activation mask (one process-wide int NCCL hands to every init).
enum EventType : uint64_t {
  kGroup = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kProxyOp = 1u << 3,
  kProxyStep = 1u << 4,
  kProxyCtrl = 1u << 5,
  kKernelCh = 1u << 6,       // v3+
  kNetPlugin = 1u << 7,      // v3+
  kGroupApi = 1u << 8,       // v5+
  kCollApi = 1u << 9,        // v5+
  kP2pApi = 1u << 10,        // v5+
  kKernelLaunch = 1u << 11,  // v5+
  kCeColl = 1u << 12,        // v6+
  kCeSync = 1u << 13,        // v6+
  kCeBatch = 1u << 14,       // v6+
  kKernelPhase = 1u << 15,   // v7 (2.32)
};

// recordEventState states. Only the numbers are ABI (NCCL's own names differ between headers).
enum EventState : int {
  kProxyOpSendPosted = 0,  // 0-7: v1-v3 ProxyOp states, deprecated from v4
  kProxyOpRecvDone = 7,
  kProxyStepSendGpuWait = 8,  // waiting for the GPU to fill the send staging buffer
  kProxyStepSendWait = 9,     // send posted to the network, waiting for completion
  kProxyStepRecvWait = 10,    // receive posted, waiting for the peer's data
  kProxyStepRecvFlushWait = 11,
  kProxyStepRecvGpuWait = 12,  // waiting for the GPU to consume received data
  kProxyCtrlIdle = 13,
  kProxyCtrlActive = 14,
  kProxyCtrlSleep = 15,
  kProxyCtrlWakeup = 16,
  kProxyCtrlAppend = 17,
  kProxyCtrlAppendEnd = 18,
  kProxyOpInProgress = 19,      // v4+
  kProxyStepSendPeerWait = 20,  // v4+: waiting for the receiver's clear-to-send credit
  kNetPluginUpdate = 21,
  kKernelChStop = 22,
  kGroupApiStartStop = 23,  // v5+: ncclGroupStart returned
  kGroupApiEndStart = 24,   // v5+: ncclGroupEnd entered
};

// NCCL's logger (ncclDebugLog); the level is an enum passed as int.
using DebugLogger = void (*)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);

// ---- descriptor members shared by several versions (same shape, same offsets) ----

struct ProxyOpDescr {
  pid_t pid;  // process that started the proxy op: with PXN, another local process
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
};
struct ProxyStepDescr {
  int step;
};
struct NetPluginDescr {
  int64_t id;
  void* data;
};

// ---- v3 (NCCL 2.26) ----

struct EventDescrV3 {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name;
      uint64_t commHash;
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nMaxChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      uint64_t commHash;
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
    ProxyOpDescr proxyOp;
    ProxyStepDescr proxyStep;
    struct {
      uint8_t channelId;
    } kernelCh;
    NetPluginDescr netPlugin;
  };
};

union StateArgsV3 {
  struct {
    size_t transSize;
    int steps;
  } proxyOp;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
};

struct ProfilerV3 {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask);
  ncclResult_t (*startEvent)(void* context, void** eHandle, EventDescrV3* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, StateArgsV3* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- v4 (NCCL 2.27) ----

struct KernelChDescr {
  uint8_t channelId;
  uint64_t pTimer;  // GPU %globaltimer at the channel's start, ns
};

struct CollDescrV4 {
  uint64_t seqNumber;  // per communicator and per collective type, 0-based
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;  // bytes (datatype "ncclInt8") for AllGather and Broadcast
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
};
struct P2pDescrV4 {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
};

struct EventDescrV4 {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    CollDescrV4 coll;
    P2pDescrV4 p2p;
    ProxyOpDescr proxyOp;
    ProxyStepDescr proxyStep;
    KernelChDescr kernelCh;
    NetPluginDescr netPlugin;
  };
};

// v4 to v7 share one state-argument union.
union StateArgs {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;  // GPU %globaltimer at the channel's stop, ns
  } kernelCh;
};

struct ProfilerV4 {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank, DebugLogger logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, EventDescrV4* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, StateArgs* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- v5 (NCCL 2.28), v6 (2.29-2.30) and v7 (2.32) ----
// v6 appends the copy-engine members to v5's union; v7 appends a user tag to the API, Coll,
// P2p and CeColl members, two Coll members, and a kernel-phase member. Members a version lacks
// are simply never written by NCCL of that version.

struct GroupApiDescr {
  bool graphCaptured;
  int groupDepth;  // 1: an implicit group around one call; >= 2: inside ncclGroupStart
};
struct CollApiDescr {
  const char* func;
  size_t count;  // the user's count and type (Coll rewrites AllGather/Broadcast to bytes)
  const char* datatype;
  int root;
  void* stream;
  bool graphCaptured;
  uint64_t userTag;  // v7
};
struct P2pApiDescr {
  const char* func;
  size_t count;
  const char* datatype;
  void* stream;
  bool graphCaptured;
  uint64_t userTag;  // v7
};
struct KernelLaunchDescr {
  void* stream;
};
struct CollDescr {
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;          // the legacy Group event (v4's parent)
  const char* kernelVariant;  // v7
  bool isSymColl;             // v7
  uint64_t userTag;           // v7
};
struct P2pDescr {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup;
  uint64_t userTag;  // v7
};
struct CeCollDescr {  // v6+
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  const char* syncStrategy;
  bool intraBatchSync;
  uint32_t batchSize;
  uint32_t numBatches;
  uint32_t ceSeqNum;
  void* stream;
  uint64_t userTag;  // v7
};
struct CeSyncDescr {
  bool isComplete;
  int nRanks;
};
struct CeBatchDescr {
  int numOps;
  size_t totalBytes;
  bool useIntraSync;
};
struct KernelPhaseDescr {  // v7
  uint8_t channelId;
  uint8_t phaseId;
  const char* phaseName;
  uint64_t pTimer;
};

// One declaration serves v5, v6 and v7: the members are a strict superset in order, and a
// reader of an older version never looks past its own members (asserted below).
struct EventDescr {
  uint64_t type;
  void* parentObj;
  int rank;  // set for Coll, P2p, ProxyOp, ProxyStep; 0 for the API and KernelCh events
  union {
    GroupApiDescr groupApi;
    CollApiDescr collApi;
    P2pApiDescr p2pApi;
    KernelLaunchDescr kernelLaunch;
    CollDescr coll;
    P2pDescr p2p;
    ProxyOpDescr proxyOp;
    ProxyStepDescr proxyStep;
    KernelChDescr kernelCh;
    NetPluginDescr netPlugin;
    CeCollDescr ceColl;
    CeSyncDescr ceSync;
    CeBatchDescr ceBatch;
    KernelPhaseDescr kernelPhase;
  };
};

// v5, v6 and v7 tables have one shape (v7's descriptor is larger, passed by pointer). The v7
// table ends with one null pointer we add: a public v7 variant carries a trailing member, so
// a loader that reads one more pointer finds null there instead of our neighbour's bytes.
struct ProfilerV5 {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, DebugLogger logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, EventDescr* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, StateArgs* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};
using ProfilerV6 = ProfilerV5;
struct ProfilerV7 : ProfilerV5 {
  void* reservedTrailing = nullptr;
};

// ---- layout pins (x86-64 LP64) ----
#define NPA_AT(type, member, offset) static_assert(offsetof(type, member) == (offset))

static_assert(sizeof(EventDescrV3) == 120);
NPA_AT(EventDescrV3, parentObj, 8);
NPA_AT(EventDescrV3, rank, 16);
NPA_AT(EventDescrV3, coll.commHash, 32);
NPA_AT(EventDescrV3, coll.seqNumber, 40);
NPA_AT(EventDescrV3, coll.func, 48);
NPA_AT(EventDescrV3, coll.count, 72);
NPA_AT(EventDescrV3, coll.root, 80);
NPA_AT(EventDescrV3, coll.datatype, 88);
NPA_AT(EventDescrV3, coll.nMaxChannels, 96);
NPA_AT(EventDescrV3, coll.proto, 112);
NPA_AT(EventDescrV3, p2p.commHash, 32);
NPA_AT(EventDescrV3, p2p.func, 40);
NPA_AT(EventDescrV3, p2p.datatype, 56);
NPA_AT(EventDescrV3, p2p.count, 64);
NPA_AT(EventDescrV3, p2p.peer, 72);
NPA_AT(EventDescrV3, proxyOp.pid, 24);
NPA_AT(EventDescrV3, proxyOp.channelId, 28);
NPA_AT(EventDescrV3, proxyOp.peer, 32);
NPA_AT(EventDescrV3, proxyOp.isSend, 44);
NPA_AT(EventDescrV3, kernelCh.channelId, 24);
static_assert(sizeof(StateArgsV3) == 16);
static_assert(sizeof(ProfilerV3) == 48);

static_assert(sizeof(EventDescrV4) == 104);
NPA_AT(EventDescrV4, parentObj, 8);
NPA_AT(EventDescrV4, coll.seqNumber, 24);
NPA_AT(EventDescrV4, coll.func, 32);
NPA_AT(EventDescrV4, coll.count, 56);
NPA_AT(EventDescrV4, coll.root, 64);
NPA_AT(EventDescrV4, coll.datatype, 72);
NPA_AT(EventDescrV4, coll.nChannels, 80);
NPA_AT(EventDescrV4, coll.proto, 96);
NPA_AT(EventDescrV4, p2p.func, 24);
NPA_AT(EventDescrV4, p2p.count, 48);
NPA_AT(EventDescrV4, p2p.peer, 56);
NPA_AT(EventDescrV4, p2p.nChannels, 60);
NPA_AT(EventDescrV4, kernelCh.pTimer, 32);
static_assert(sizeof(StateArgs) == 8);
static_assert(sizeof(ProfilerV4) == 48);

// v5/v6 readers stop at byte 112; v7 extends Coll to 136.
NPA_AT(EventDescr, parentObj, 8);
NPA_AT(EventDescr, rank, 16);
NPA_AT(EventDescr, groupApi.groupDepth, 28);
NPA_AT(EventDescr, collApi.func, 24);
NPA_AT(EventDescr, collApi.count, 32);
NPA_AT(EventDescr, collApi.datatype, 40);
NPA_AT(EventDescr, collApi.root, 48);
NPA_AT(EventDescr, collApi.stream, 56);
NPA_AT(EventDescr, collApi.graphCaptured, 64);
NPA_AT(EventDescr, collApi.userTag, 72);
NPA_AT(EventDescr, p2pApi.count, 32);
NPA_AT(EventDescr, p2pApi.stream, 48);
NPA_AT(EventDescr, p2pApi.graphCaptured, 56);
NPA_AT(EventDescr, p2pApi.userTag, 64);
NPA_AT(EventDescr, kernelLaunch.stream, 24);
NPA_AT(EventDescr, coll.seqNumber, 24);
NPA_AT(EventDescr, coll.func, 32);
NPA_AT(EventDescr, coll.count, 56);
NPA_AT(EventDescr, coll.root, 64);
NPA_AT(EventDescr, coll.datatype, 72);
NPA_AT(EventDescr, coll.nChannels, 80);
NPA_AT(EventDescr, coll.nWarps, 81);
NPA_AT(EventDescr, coll.algo, 88);
NPA_AT(EventDescr, coll.proto, 96);
NPA_AT(EventDescr, coll.parentGroup, 104);
NPA_AT(EventDescr, coll.kernelVariant, 112);
NPA_AT(EventDescr, coll.isSymColl, 120);
NPA_AT(EventDescr, coll.userTag, 128);
NPA_AT(EventDescr, p2p.func, 24);
NPA_AT(EventDescr, p2p.buff, 32);
NPA_AT(EventDescr, p2p.datatype, 40);
NPA_AT(EventDescr, p2p.count, 48);
NPA_AT(EventDescr, p2p.peer, 56);
NPA_AT(EventDescr, p2p.nChannels, 60);
NPA_AT(EventDescr, p2p.parentGroup, 64);
NPA_AT(EventDescr, p2p.userTag, 72);
NPA_AT(EventDescr, proxyOp.pid, 24);
NPA_AT(EventDescr, proxyOp.channelId, 28);
NPA_AT(EventDescr, proxyOp.peer, 32);
NPA_AT(EventDescr, proxyOp.nSteps, 36);
NPA_AT(EventDescr, proxyOp.chunkSize, 40);
NPA_AT(EventDescr, proxyOp.isSend, 44);
NPA_AT(EventDescr, proxyStep.step, 24);
NPA_AT(EventDescr, kernelCh.channelId, 24);
NPA_AT(EventDescr, kernelCh.pTimer, 32);
NPA_AT(EventDescr, netPlugin.data, 32);
NPA_AT(EventDescr, ceColl.syncStrategy, 80);
NPA_AT(EventDescr, ceColl.ceSeqNum, 100);
NPA_AT(EventDescr, ceColl.stream, 104);
NPA_AT(EventDescr, ceColl.userTag, 112);
NPA_AT(EventDescr, ceSync.nRanks, 28);
NPA_AT(EventDescr, ceBatch.totalBytes, 32);
NPA_AT(EventDescr, kernelPhase.phaseName, 32);
NPA_AT(EventDescr, kernelPhase.pTimer, 40);
static_assert(sizeof(EventDescr) == 136);
// The last byte a v5/v6 reader touches (the end of coll.parentGroup / ceColl.stream).
inline constexpr size_t kEventDescrV5Size = 112;
inline constexpr size_t kEventDescrV7Size = sizeof(EventDescr);
static_assert(sizeof(ProfilerV5) == 48);
static_assert(sizeof(ProfilerV7) == 56);
static_assert(sizeof(ProxyOpDescr) == 24 && sizeof(pid_t) == 4);

#undef NPA_AT

// What an older plugin receives for an event NCCL describes in the newest layout: NCCL's own
// shims do the same copy (v4 has no API events; v3 names the communicator in Coll/P2p). False
// when the version has no such event (the caller then emits nothing for it).
// As NCCL's shims do, an older plugin's Coll/P2p hang under the legacy Group (parentGroup), not
// under the API event it never saw.
inline bool toV4(const EventDescr& d, EventDescrV4* out) {
  *out = EventDescrV4{};
  out->type = static_cast<uint8_t>(d.type);
  out->parentObj = d.type == kColl  ? d.coll.parentGroup
                   : d.type == kP2p ? d.p2p.parentGroup
                                    : d.parentObj;
  out->rank = d.rank;
  switch (d.type) {
    case kColl:
      out->coll = {d.coll.seqNumber, d.coll.func, d.coll.sendBuff, d.coll.recvBuff,
                   d.coll.count,     d.coll.root, d.coll.datatype, d.coll.nChannels,
                   d.coll.nWarps,    d.coll.algo, d.coll.proto};
      return true;
    case kP2p:
      out->p2p = {d.p2p.func, d.p2p.buff, d.p2p.datatype, d.p2p.count, d.p2p.peer, d.p2p.nChannels};
      return true;
    case kProxyOp:
      out->proxyOp = d.proxyOp;
      return true;
    case kProxyStep:
      out->proxyStep = d.proxyStep;
      return true;
    case kKernelCh:
      out->kernelCh = d.kernelCh;
      return true;
    case kGroup:
    case kProxyCtrl:
      return true;
    default:
      return false;
  }
}

inline bool toV3(const EventDescr& d, uint64_t commHash, EventDescrV3* out) {
  *out = EventDescrV3{};
  out->type = static_cast<uint8_t>(d.type);
  out->parentObj = d.type == kColl  ? d.coll.parentGroup
                   : d.type == kP2p ? d.p2p.parentGroup
                                    : d.parentObj;
  out->rank = d.rank;
  switch (d.type) {
    case kColl:
      out->coll.commHash = commHash;
      out->coll.seqNumber = d.coll.seqNumber;
      out->coll.func = d.coll.func;
      out->coll.sendBuff = d.coll.sendBuff;
      out->coll.recvBuff = d.coll.recvBuff;
      out->coll.count = d.coll.count;
      out->coll.root = d.coll.root;
      out->coll.datatype = d.coll.datatype;
      out->coll.nMaxChannels = d.coll.nChannels;
      out->coll.nWarps = d.coll.nWarps;
      out->coll.algo = d.coll.algo;
      out->coll.proto = d.coll.proto;
      return true;
    case kP2p:
      out->p2p.commHash = commHash;
      out->p2p.func = d.p2p.func;
      out->p2p.buff = d.p2p.buff;
      out->p2p.datatype = d.p2p.datatype;
      out->p2p.count = d.p2p.count;
      out->p2p.peer = d.p2p.peer;
      return true;
    case kProxyOp:
      out->proxyOp = d.proxyOp;
      return true;
    case kProxyStep:
      out->proxyStep = d.proxyStep;
      return true;
    case kKernelCh:
      out->kernelCh.channelId = d.kernelCh.channelId;
      return true;
    case kGroup:
    case kProxyCtrl:
      return true;
    default:
      return false;
  }
}

// Collective function names as NCCL's ncclFuncToString spells them in events.
inline constexpr const char* kFuncNames[] = {"AllGather", "AllReduce", "AlltoAll", "Broadcast",
                                             "Gather",    "Recv",      "Reduce",   "ReduceScatter",
                                             "Scatter",   "SendRecv",  "Send"};

}  // namespace nccl_profiler_abi
