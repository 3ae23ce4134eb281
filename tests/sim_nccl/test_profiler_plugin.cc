// A recording NCCL profiler plugin for the sim's tests: every callback becomes one line in
// $SIMTEST_PROFILER_LOG, with every field the descriptor of its version has, so tests can check
// what the sim emits, when, and on which thread:
//   pid=P tid=T init v=5 commId=... nranks=2 rank=0 nNodes=1 name=world mask=0 log=1
//   pid=P tid=T start h=3 parent=2 rank=0 type=Coll seq=0 func=AllReduce count=64 ...
//   pid=P tid=T state h=3 s=22 value=...
//   pid=P tid=T stop h=3
//   pid=P tid=T finalize commId=...
// Handles are small numbers (never dereferenced by NCCL), so the log links children to parents.
// The mask it asks for at init is $SIMTEST_PROFILER_MASK (default 0: init and finalize only);
// simtestSetMask() changes it later, as NCCL's example plugin does. Event types in
// $SIMTEST_PROFILER_NULL_TYPES (a mask) get a NULL handle ("h=0"), which NCCL must accept.
//
// Built once per ABI: by default it exports every table v3-v7; SIMTEST_ONLY_V4, SIMTEST_ONLY_V3
// and SIMTEST_ONLY_V2 builds export one older table only.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "plugin/abi/profiler_abi.h"

namespace {

namespace abi = nccl_profiler_abi;

std::atomic<uintptr_t> gNextHandle{1};
int* gMask = nullptr;  // NCCL's process-wide activation mask, from init

void appendLine(const char* line) {
  const char* path = std::getenv("SIMTEST_PROFILER_LOG");
  if (!path) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return;
  char prefixed[1024];
  int length = std::snprintf(prefixed, sizeof prefixed, "pid=%d tid=%ld %s\n", getpid(),
                             static_cast<long>(syscall(SYS_gettid)), line);
  (void)!write(fd, prefixed, static_cast<size_t>(length));
  close(fd);
}

int envMask(const char* name) {
  const char* text = std::getenv(name);
  return text ? std::atoi(text) : 0;
}

uintptr_t id(const void* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

const char* text(const char* value) {
  return value ? value : "(null)";
}

struct Context {
  uint64_t commId;
};

ncclResult_t init(int version, void** context, uint64_t commId, int* mask, const char* name,
                  int nNodes, int nranks, int rank, bool logger) {
  char line[256];
  std::snprintf(line, sizeof line,
                "init v=%d commId=%016llx nranks=%d rank=%d nNodes=%d name=%s mask=%d log=%d",
                version, static_cast<unsigned long long>(commId), nranks, rank, nNodes, text(name),
                mask ? *mask : -1, logger);
  appendLine(line);
  gMask = mask;
  if (mask) *mask = envMask("SIMTEST_PROFILER_MASK");
  *context = new Context{commId};
  return ncclSuccess;
}

// The fields of one event, in the newest layout (older plugins' descriptors are converted into
// it field by field, so a layout slip shows as wrong values). `hash` is v3's commHash.
struct Fields {
  abi::EventDescr d{};
  bool hasHash = false;
  uint64_t hash = 0;
};

void logStart(void* handle, const Fields& f) {
  const abi::EventDescr& d = f.d;
  char line[900];
  int used = std::snprintf(line, sizeof line, "start h=%zu parent=%zu rank=%d", id(handle),
                           id(d.parentObj), d.rank);
  auto add = [&](const char* format, auto... values) {
    used += std::snprintf(line + used, sizeof line - used, format, values...);
  };
  switch (d.type) {
    case abi::kGroupApi:
      add(" type=GroupApi depth=%d captured=%d", d.groupApi.groupDepth, d.groupApi.graphCaptured);
      break;
    case abi::kCollApi:
      add(" type=CollApi func=%s count=%zu dtype=%s root=%d stream=%zx captured=%d",
          text(d.collApi.func), d.collApi.count, text(d.collApi.datatype), d.collApi.root,
          id(d.collApi.stream), d.collApi.graphCaptured);
      break;
    case abi::kP2pApi:
      add(" type=P2pApi func=%s count=%zu dtype=%s stream=%zx captured=%d", text(d.p2pApi.func),
          d.p2pApi.count, text(d.p2pApi.datatype), id(d.p2pApi.stream), d.p2pApi.graphCaptured);
      break;
    case abi::kKernelLaunch:
      add(" type=KernelLaunch stream=%zx", id(d.kernelLaunch.stream));
      break;
    case abi::kGroup:
      add(" type=Group");
      break;
    case abi::kColl:
      add(" type=Coll seq=%llu func=%s sendbuff=%zx recvbuff=%zx count=%zu root=%d dtype=%s "
          "nch=%d nwarps=%d algo=%s proto=%s pgroup=%zu",
          static_cast<unsigned long long>(d.coll.seqNumber), text(d.coll.func), id(d.coll.sendBuff),
          id(d.coll.recvBuff), d.coll.count, d.coll.root, text(d.coll.datatype), d.coll.nChannels,
          d.coll.nWarps, text(d.coll.algo), text(d.coll.proto), id(d.coll.parentGroup));
      break;
    case abi::kP2p:
      add(" type=P2p func=%s buff=%zx count=%zu dtype=%s peer=%d nch=%d pgroup=%zu",
          text(d.p2p.func), id(d.p2p.buff), d.p2p.count, text(d.p2p.datatype), d.p2p.peer,
          d.p2p.nChannels, id(d.p2p.parentGroup));
      break;
    case abi::kProxyOp:
      add(" type=ProxyOp ch=%d peer=%d send=%d nsteps=%d chunk=%d ownpid=%d", d.proxyOp.channelId,
          d.proxyOp.peer, d.proxyOp.isSend, d.proxyOp.nSteps, d.proxyOp.chunkSize,
          d.proxyOp.pid == getpid());
      break;
    case abi::kProxyStep:
      add(" type=ProxyStep step=%d", d.proxyStep.step);
      break;
    case abi::kKernelCh:
      add(" type=KernelCh ch=%d ptimer=%llu", d.kernelCh.channelId,
          static_cast<unsigned long long>(d.kernelCh.pTimer));
      break;
    default:
      add(" type=%llu", static_cast<unsigned long long>(d.type));
  }
  if (f.hasHash) add(" hash=%016llx", static_cast<unsigned long long>(f.hash));
  appendLine(line);
}

ncclResult_t start(void** handle, const Fields& fields) {
  const bool nullHandle = (envMask("SIMTEST_PROFILER_NULL_TYPES") & fields.d.type) != 0;
  *handle = nullHandle ? nullptr : reinterpret_cast<void*>(gNextHandle++);
  logStart(*handle, fields);
  return ncclSuccess;
}

[[maybe_unused]] ncclResult_t startV5(void*, void** handle, abi::EventDescr* descr) {
  Fields fields;
  fields.d = *descr;
  return start(handle, fields);
}

[[maybe_unused]] ncclResult_t startV4(void*, void** handle, abi::EventDescrV4* d4) {
  Fields f;
  abi::EventDescr& d = f.d;
  d.type = d4->type;
  d.parentObj = d4->parentObj;
  d.rank = d4->rank;
  if (d4->type == abi::kColl) {
    const abi::CollDescrV4& c = d4->coll;
    d.coll = {c.seqNumber, c.func, c.sendBuff, c.recvBuff, c.count, c.root, c.datatype, c.nChannels,
              c.nWarps,    c.algo, c.proto,    nullptr,    nullptr, false,  0};
  } else if (d4->type == abi::kP2p) {
    d.p2p = {d4->p2p.func, d4->p2p.buff,      d4->p2p.datatype, d4->p2p.count,
             d4->p2p.peer, d4->p2p.nChannels, nullptr,          0};
  } else if (d4->type == abi::kProxyOp) {
    d.proxyOp = d4->proxyOp;
  } else if (d4->type == abi::kProxyStep) {
    d.proxyStep = d4->proxyStep;
  } else if (d4->type == abi::kKernelCh) {
    d.kernelCh = d4->kernelCh;
  }
  return start(handle, f);
}

[[maybe_unused]] ncclResult_t startV3(void*, void** handle, abi::EventDescrV3* d3) {
  Fields f;
  abi::EventDescr& d = f.d;
  d.type = d3->type;
  d.parentObj = d3->parentObj;
  d.rank = d3->rank;
  if (d3->type == abi::kColl) {
    d.coll.seqNumber = d3->coll.seqNumber;
    d.coll.func = d3->coll.func;
    d.coll.sendBuff = d3->coll.sendBuff;
    d.coll.recvBuff = d3->coll.recvBuff;
    d.coll.count = d3->coll.count;
    d.coll.datatype = d3->coll.datatype;
    d.coll.root = d3->coll.root;
    d.coll.nChannels = d3->coll.nMaxChannels;
    d.coll.nWarps = d3->coll.nWarps;
    d.coll.algo = d3->coll.algo;
    d.coll.proto = d3->coll.proto;
    f.hasHash = true;
    f.hash = d3->coll.commHash;
  } else if (d3->type == abi::kP2p) {
    d.p2p.func = d3->p2p.func;
    d.p2p.buff = d3->p2p.buff;
    d.p2p.count = d3->p2p.count;
    d.p2p.datatype = d3->p2p.datatype;
    d.p2p.peer = d3->p2p.peer;
    f.hasHash = true;
    f.hash = d3->p2p.commHash;
  } else if (d3->type == abi::kProxyOp) {
    d.proxyOp = d3->proxyOp;
  } else if (d3->type == abi::kProxyStep) {
    d.proxyStep = d3->proxyStep;
  } else if (d3->type == abi::kKernelCh) {
    d.kernelCh.channelId = d3->kernelCh.channelId;
  }
  return start(handle, f);
}

ncclResult_t stopEvent(void* handle) {
  char line[64];
  std::snprintf(line, sizeof line, "stop h=%zu", id(handle));
  appendLine(line);
  return ncclSuccess;
}

[[maybe_unused]] ncclResult_t recordState(void* handle, int state, abi::StateArgs* args) {
  char line[96];
  // The first word of the union: a KernelCh stop's pTimer, a ProxyStep's transSize.
  std::snprintf(line, sizeof line, "state h=%zu s=%d value=%llu", id(handle), state,
                args ? static_cast<unsigned long long>(args->kernelCh.pTimer) : 0ull);
  appendLine(line);
  return ncclSuccess;
}
[[maybe_unused]] ncclResult_t recordStateV3(void* handle, int state, abi::StateArgsV3*) {
  return recordState(handle, state, nullptr);
}

ncclResult_t finalize(void* context) {
  char line[128];
  std::snprintf(line, sizeof line, "finalize commId=%016llx",
                static_cast<unsigned long long>(static_cast<Context*>(context)->commId));
  appendLine(line);
  delete static_cast<Context*>(context);
  return ncclSuccess;
}

template <int Version>
[[maybe_unused]] ncclResult_t initNew(void** context, uint64_t commId, int* mask, const char* name,
                                      int nNodes, int nranks, int rank, abi::DebugLogger log) {
  return init(Version, context, commId, mask, name, nNodes, nranks, rank, log != nullptr);
}
[[maybe_unused]] ncclResult_t initV4(void** context, int* mask, const char* name, uint64_t commHash,
                                     int nNodes, int nranks, int rank, abi::DebugLogger log) {
  return init(4, context, commHash, mask, name, nNodes, nranks, rank, log != nullptr);
}
[[maybe_unused]] ncclResult_t initV3(void** context, int* mask) {
  return init(3, context, 0, mask, nullptr, 0, 0, -1, false);
}

}  // namespace

#define SIMTEST_EXPORT __attribute__((visibility("default")))
extern "C" {
// Changes NCCL's activation mask at any time (NCCL samples it at each API call).
SIMTEST_EXPORT void simtestSetMask(int mask) {
  if (gMask) __atomic_store_n(gMask, mask, __ATOMIC_RELAXED);
}

#if defined(SIMTEST_ONLY_V4)
SIMTEST_EXPORT abi::ProfilerV4 ncclProfiler_v4 = {"simtest-v4", initV4,      startV4,
                                                  stopEvent,    recordState, finalize};
#elif defined(SIMTEST_ONLY_V3)
SIMTEST_EXPORT abi::ProfilerV3 ncclProfiler_v3 = {"simtest-v3", initV3,        startV3,
                                                  stopEvent,    recordStateV3, finalize};
#elif defined(SIMTEST_ONLY_V2)
// A v2-only plugin (NCCL 2.24/2.25): the sim recognises it and refuses it. Its table is never
// called, so its shape does not matter here.
SIMTEST_EXPORT abi::ProfilerV3 ncclProfiler_v2 = {"simtest-v2", initV3,        startV3,
                                                  stopEvent,    recordStateV3, finalize};
#else
SIMTEST_EXPORT abi::ProfilerV7 ncclProfiler_v7 = {
    {"simtest", initNew<7>, startV5, stopEvent, recordState, finalize}};
SIMTEST_EXPORT abi::ProfilerV6 ncclProfiler_v6 = {"simtest", initNew<6>,  startV5,
                                                  stopEvent, recordState, finalize};
SIMTEST_EXPORT abi::ProfilerV5 ncclProfiler_v5 = {"simtest", initNew<5>,  startV5,
                                                  stopEvent, recordState, finalize};
SIMTEST_EXPORT abi::ProfilerV4 ncclProfiler_v4 = {"simtest", initV4,      startV4,
                                                  stopEvent, recordState, finalize};
SIMTEST_EXPORT abi::ProfilerV3 ncclProfiler_v3 = {"simtest", initV3,        startV3,
                                                  stopEvent, recordStateV3, finalize};
#endif
}
