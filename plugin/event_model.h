// One internal event model under every profiler ABI version: the per-version tables
// (plugin/tables.cc) translate NCCL's descriptors into EventStart and call these handlers, so
// that the recording logic exists once.
#pragma once
#include <nccl.h>
#include <sys/types.h>

#include <cstdint>

namespace ncclwatch::plugin {

enum class EventKind : uint8_t {
  kOther,  // an event we do not use (ProxyCtrl, NetPlugin, CE, KernelPhase): a NULL handle
  kGroupApi,
  kCollApi,
  kP2pApi,
  kKernelLaunch,
  kGroup,  // the legacy group around a plan's Coll/P2p events
  kColl,
  kP2p,
  kProxyOp,
  kProxyStep,
  kKernelCh,
};

// An event start, with the members of its kind filled in (the others keep their defaults).
struct EventStart {
  EventKind kind = EventKind::kOther;
  void* parent = nullptr;  // NCCL's parentObj: a handle this plugin returned, or null
  int rank = -1;           // the rank NCCL set in the descriptor (-1: not set for this kind)
  // Group API
  int groupDepth = 0;
  bool graphCaptured = false;
  // Coll, P2p and their API events
  const char* func = nullptr;  // "AllReduce", "Send", ...
  const char* datatype = nullptr;
  uint64_t count = 0;
  int root = -1;
  int peer = -1;
  void* stream = nullptr;
  bool hasSeqNumber = false;
  uint64_t seqNumber = 0;  // NCCL's per-type collective counter (Coll only)
  int nChannels = 0;
  uint64_t commHash = 0;  // v3 descriptors carry the communicator (later versions: init does)
  // KernelCh, ProxyOp, ProxyStep
  int channel = -1;
  pid_t pid = 0;  // ProxyOp: the process that owns the operation (PXN: another one)
  bool isSend = false;
  int nSteps = 0;
  int step = -1;
};

// What NCCL's init says about a communicator (v3 says nothing: identity then comes from the
// first Coll or P2p event that carries a commHash).
struct CommIdentity {
  bool known = false;
  uint64_t commHash = 0;
  const char* name = nullptr;
  int nNodes = 0;
  int nranks = 0;
  int rank = -1;
};

// The ABI version a table speaks, for messages and per-version behaviour.
ncclResult_t initContext(void** context, int* activationMask, const CommIdentity& comm,
                         int abiVersion);
ncclResult_t startEvent(void* context, void** handle, const EventStart& event);
ncclResult_t stopEvent(void* handle);
// `state` is NCCL's state number; `gpuTimer` the KernelCh stop's %globaltimer (0 if none).
ncclResult_t recordState(void* handle, int state, uint64_t gpuTimer);
ncclResult_t finalizeContext(void* context);

// The mask this plugin asks NCCL for (NCCLWATCH_PLUGIN_EVENTS: "proxy" adds ProxyOp and
// ProxyStep to the default Coll, P2p, their API events and KernelCh).
int activationMask();

}  // namespace ncclwatch::plugin
