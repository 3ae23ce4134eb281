// A recording NCCL profiler plugin for the sim's tests: every callback becomes one line in
// $SIMTEST_PROFILER_LOG ("pid=P init v=5 commId=...", "pid=P start h=3 type=Coll parent=2 ...",
// "pid=P state h=3 s=22", "pid=P stop h=3"), so tests can check what the sim emits and when.
// Handles are small numbers (never dereferenced by NCCL), so the log links children to parents.
// The mask it asks for is $SIMTEST_PROFILER_MASK (default 0: init and finalize only).
//
// Built once per ABI: SIMTEST_PLUGIN_VERSIONS lists the tables this build exports (all of v3-v7
// by default; the "old" builds export one older table only).
#include <fcntl.h>
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

void appendLine(const char* line) {
  const char* path = std::getenv("SIMTEST_PROFILER_LOG");
  if (!path) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) return;
  char prefixed[640];
  int length = std::snprintf(prefixed, sizeof prefixed, "pid=%d %s\n", getpid(), line);
  (void)!write(fd, prefixed, static_cast<size_t>(length));
  close(fd);
}

int requestedMask() {
  const char* text = std::getenv("SIMTEST_PROFILER_MASK");
  return text ? std::atoi(text) : 0;
}

uintptr_t id(const void* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

struct Context {
  uint64_t commId;
};

ncclResult_t init(int version, void** context, uint64_t commId, int* mask, const char* name,
                  int nNodes, int nranks, int rank, bool logger) {
  char line[256];
  std::snprintf(line, sizeof line,
                "init v=%d commId=%016llx nranks=%d rank=%d nNodes=%d name=%s mask=%d log=%d",
                version, static_cast<unsigned long long>(commId), nranks, rank, nNodes,
                name ? name : "(null)", mask ? *mask : -1, logger);
  appendLine(line);
  if (mask) *mask = requestedMask();
  *context = new Context{commId};
  return ncclSuccess;
}

// One event, described in the newest layout (older plugins get theirs converted back here).
void logStart(void* handle, const abi::EventDescr& d) {
  char line[512];
  int used = std::snprintf(line, sizeof line, "start h=%zu parent=%zu rank=%d", id(handle),
                           id(d.parentObj), d.rank);
  auto add = [&](const char* format, auto... values) {
    used += std::snprintf(line + used, sizeof line - used, format, values...);
  };
  switch (d.type) {
    case abi::kGroupApi:
      add(" type=GroupApi depth=%d", d.groupApi.groupDepth);
      break;
    case abi::kCollApi:
      add(" type=CollApi func=%s count=%zu dtype=%s root=%d stream=%zu", d.collApi.func,
          d.collApi.count, d.collApi.datatype, d.collApi.root, id(d.collApi.stream));
      break;
    case abi::kP2pApi:
      add(" type=P2pApi func=%s count=%zu dtype=%s", d.p2pApi.func, d.p2pApi.count,
          d.p2pApi.datatype);
      break;
    case abi::kGroup:
      add(" type=Group");
      break;
    case abi::kColl:
      add(" type=Coll seq=%llu func=%s count=%zu dtype=%s root=%d nch=%d",
          static_cast<unsigned long long>(d.coll.seqNumber), d.coll.func, d.coll.count,
          d.coll.datatype, d.coll.root, d.coll.nChannels);
      break;
    case abi::kP2p:
      add(" type=P2p func=%s count=%zu dtype=%s peer=%d nch=%d", d.p2p.func, d.p2p.count,
          d.p2p.datatype, d.p2p.peer, d.p2p.nChannels);
      break;
    case abi::kProxyOp:
      add(" type=ProxyOp peer=%d send=%d ownpid=%d", d.proxyOp.peer, d.proxyOp.isSend,
          d.proxyOp.pid == getpid());
      break;
    case abi::kProxyStep:
      add(" type=ProxyStep step=%d", d.proxyStep.step);
      break;
    case abi::kKernelCh:
      add(" type=KernelCh ch=%d", d.kernelCh.channelId);
      break;
    default:
      add(" type=%llu", static_cast<unsigned long long>(d.type));
  }
  appendLine(line);
}

[[maybe_unused]] ncclResult_t startV5(void*, void** handle, abi::EventDescr* descr) {
  *handle = reinterpret_cast<void*>(gNextHandle++);
  logStart(*handle, *descr);
  return ncclSuccess;
}

[[maybe_unused]] ncclResult_t startV4(void*, void** handle, abi::EventDescrV4* d4) {
  abi::EventDescr d{};
  d.type = d4->type;
  d.parentObj = d4->parentObj;
  d.rank = d4->rank;
  if (d4->type == abi::kColl) {
    d.coll.seqNumber = d4->coll.seqNumber;
    d.coll.func = d4->coll.func;
    d.coll.count = d4->coll.count;
    d.coll.datatype = d4->coll.datatype;
    d.coll.root = d4->coll.root;
    d.coll.nChannels = d4->coll.nChannels;
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
  return startV5(nullptr, handle, &d);
}

[[maybe_unused]] ncclResult_t startV3(void*, void** handle, abi::EventDescrV3* d3) {
  abi::EventDescr d{};
  d.type = d3->type;
  d.parentObj = d3->parentObj;
  d.rank = d3->rank;
  if (d3->type == abi::kColl) {
    d.coll.seqNumber = d3->coll.seqNumber;
    d.coll.func = d3->coll.func;
    d.coll.count = d3->coll.count;
    d.coll.datatype = d3->coll.datatype;
    d.coll.root = d3->coll.root;
    d.coll.nChannels = d3->coll.nMaxChannels;
  } else if (d3->type == abi::kP2p) {
    d.p2p.func = d3->p2p.func;
    d.p2p.count = d3->p2p.count;
    d.p2p.datatype = d3->p2p.datatype;
    d.p2p.peer = d3->p2p.peer;
  } else if (d3->type == abi::kProxyOp) {
    d.proxyOp = d3->proxyOp;
  } else if (d3->type == abi::kProxyStep) {
    d.proxyStep = d3->proxyStep;
  } else if (d3->type == abi::kKernelCh) {
    d.kernelCh.channelId = d3->kernelCh.channelId;
  }
  return startV5(nullptr, handle, &d);
}

ncclResult_t stopEvent(void* handle) {
  char line[64];
  std::snprintf(line, sizeof line, "stop h=%zu", id(handle));
  appendLine(line);
  return ncclSuccess;
}

[[maybe_unused]] ncclResult_t recordState(void* handle, int state, abi::StateArgs*) {
  char line[64];
  std::snprintf(line, sizeof line, "state h=%zu s=%d", id(handle), state);
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
#if defined(SIMTEST_ONLY_V4)
SIMTEST_EXPORT abi::ProfilerV4 ncclProfiler_v4 = {"simtest-v4", initV4,      startV4,
                                                  stopEvent,    recordState, finalize};
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
