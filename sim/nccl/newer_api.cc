// The host API that came after NCCL 2.28 and that PyTorch 2.15 imports, compiled against PyPI's
// NCCL 2.32.3 nccl.h (so each definition is checked against the real prototype); the rest of the
// sim keeps the toolkit's 2.28.9 header and ncclGetVersion stays 22809. What each does on the
// sim (docs/sim.md, "NCCL 2.29-2.32 API"):
//   ncclCommMemStats      the sim holds no GPU memory for a communicator: every statistic is 0,
//                         except ncclStatGpuMemSuspended (1 while suspended).
//   ncclCommSuspend/Resume  recorded per communicator (nothing to release); the sim does not
//                         refuse operations on a suspended communicator, NCCL does.
//   ncclWinGetUserPtr     the window's user buffer.
//   ncclGetPeerDevicePointer  the own rank's window address; other ranks' need collective
//                         windows, which the sim does not model (ncclInvalidUsage).
//   nccl*Config (2.32)    the plain collective, through the same path (matching, profiler events);
//                         config NULL is the plain call; a config not made with
//                         NCCL_COLLCONFIG_INITIALIZER is ncclInvalidArgument; the tuning fields
//                         mean nothing to the sim; launchCompletionEvent is recorded on the
//                         stream just before the collective is enqueued (NCCL's behaviour
//                         before CUDA 12.3), so it completes when the collective's host task
//                         starts; inside a group that is at the call, not at ncclGroupEnd.
//   ncclCommGetUniqueId, ncclCommGrow, ncclPutSignal, ncclSignal, ncclWaitSignal,
//   ncclGetLsaMultimemDevicePointer   not modelled: ncclInvalidUsage, with the reason in
//                         ncclGetLastError.
#include <nccl.h>
#include <nccl_device.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_set>

#include "api_macros.h"
#include "newer_bridge.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0),
              "newer_api.cc must be compiled against NCCL 2.29 or newer's nccl.h");

namespace nb = ncclsim::newer;

namespace {

std::mutex g_suspendedMutex;
std::unordered_set<const void*>& suspended() {
  static auto* set = new std::unordered_set<const void*>();
  return *set;
}

bool isSuspended(const void* comm) {
  std::lock_guard<std::mutex> lock(g_suspendedMutex);
  return suspended().count(comm) > 0;
}

ncclResult_t result(int value) {
  return static_cast<ncclResult_t>(value);
}

ncclResult_t notModelled(const char* caller, const char* what) {
  return result(nb::fail(ncclInvalidUsage, (std::string(caller) + ": " + what).c_str()));
}

// The checks and the launch-completion event of an nccl*Config call, then the plain collective.
ncclResult_t issueWithConfig(nb::Collective kind, const void* sendbuff, void* recvbuff,
                             size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                             ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config,
                             const char* caller) {
  if (config != nullptr) {
    if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclCollConfig_t, ext)) {
      return result(nb::fail(
          ncclInvalidArgument,
          (std::string(caller) + ": config was not initialized with NCCL_COLLCONFIG_INITIALIZER")
              .c_str()));
    }
    constexpr size_t kEventEnd =
        offsetof(ncclCollConfig_t, launchCompletionEvent) + sizeof(cudaEvent_t);
    if (config->size >= kEventEnd && config->launchCompletionEvent != nullptr) {
      if (int r = nb::checkComm(comm, caller)) return result(r);
      if (cudaEventRecord(config->launchCompletionEvent, stream) != cudaSuccess) {
        return result(
            nb::fail(ncclUnhandledCudaError,
                     (std::string(caller) + ": cannot record launchCompletionEvent").c_str()));
      }
    }
  }
  return result(nb::issueCollective(kind, sendbuff, recvbuff, count, datatype, op, root, comm,
                                    stream, caller));
}

}  // namespace

// ---- per-collective-config collectives ---------------------------------------------------

NCCL_API(ncclResult_t, ncclAllReduceConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0,
                         comm, stream, config, "ncclAllReduceConfig");
}

NCCL_API(ncclResult_t, ncclBroadcastConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum,
                         root, comm, stream, config, "ncclBroadcastConfig");
}

NCCL_API(ncclResult_t, ncclReduceConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kReduce, sendbuff, recvbuff, count, datatype, op, root,
                         comm, stream, config, "ncclReduceConfig");
}

NCCL_API(ncclResult_t, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kAllGather, sendbuff, recvbuff, sendcount, datatype,
                         ncclSum, 0, comm, stream, config, "ncclAllGatherConfig");
}

NCCL_API(ncclResult_t, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff,
         size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kReduceScatter, sendbuff, recvbuff, recvcount, datatype,
                         op, 0, comm, stream, config, "ncclReduceScatterConfig");
}

NCCL_API(ncclResult_t, ncclAlltoAllConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kAlltoAll, sendbuff, recvbuff, count, datatype, ncclSum, 0,
                         comm, stream, config, "ncclAlltoAllConfig");
}

NCCL_API(ncclResult_t, ncclGatherConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kGather, sendbuff, recvbuff, count, datatype, ncclSum,
                         root, comm, stream, config, "ncclGatherConfig");
}

NCCL_API(ncclResult_t, ncclScatterConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config) {
  return issueWithConfig(nb::Collective::kScatter, sendbuff, recvbuff, count, datatype, ncclSum,
                         root, comm, stream, config, "ncclScatterConfig");
}

// ---- memory statistics, suspend and resume -------------------------------------------------

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  if (int r = nb::checkComm(comm, "ncclCommMemStats")) return result(r);
  if (value == nullptr) {
    return result(nb::fail(ncclInvalidArgument, "ncclCommMemStats: value is NULL"));
  }
  switch (stat) {
    case ncclStatGpuMemSuspend:
    case ncclStatGpuMemPersist:
    case ncclStatGpuMemTotal:
      *value = 0;  // the sim's communicators live in host shared memory
      return ncclSuccess;
    case ncclStatGpuMemSuspended:
      *value = isSuspended(comm) ? 1 : 0;
      return ncclSuccess;
  }
  return result(nb::fail(ncclInvalidArgument, "ncclCommMemStats: unknown statistic"));
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  if (int r = nb::checkComm(comm, "ncclCommSuspend")) return result(r);
  if ((flags & ~NCCL_SUSPEND_MEM) != 0) {
    return result(nb::fail(ncclInvalidArgument, "ncclCommSuspend: unknown flags"));
  }
  std::lock_guard<std::mutex> lock(g_suspendedMutex);
  if (!suspended().insert(comm).second) {
    return result(nb::fail(ncclInvalidUsage, "ncclCommSuspend: communicator already suspended"));
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm);
ncclResult_t ncclCommResume(ncclComm_t comm) {
  if (int r = nb::checkComm(comm, "ncclCommResume")) return result(r);
  std::lock_guard<std::mutex> lock(g_suspendedMutex);
  if (suspended().erase(comm) == 0) {
    return result(nb::fail(ncclInvalidUsage, "ncclCommResume: communicator is not suspended"));
  }
  return ncclSuccess;
}

// ---- windows -------------------------------------------------------------------------------

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  if (int r = nb::checkComm(comm, "ncclWinGetUserPtr")) return result(r);
  if (outUserPtr == nullptr) {
    return result(nb::fail(ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL"));
  }
  void* owner = nullptr;
  if (int r = nb::windowRange(win, &owner, outUserPtr, nullptr, "ncclWinGetUserPtr")) {
    return result(r);
  }
  if (owner != comm) {
    return result(nb::fail(ncclInvalidArgument, "ncclWinGetUserPtr: window of another comm"));
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer,
         void** outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr) {
  void* comm = nullptr;
  void* buffer = nullptr;
  size_t bytes = 0;
  if (int r = nb::windowRange(window, &comm, &buffer, &bytes, "ncclGetPeerDevicePointer")) {
    return result(r);
  }
  if (outPtr == nullptr || offset >= bytes) {
    return result(nb::fail(ncclInvalidArgument, "ncclGetPeerDevicePointer: bad offset or outPtr"));
  }
  if (peer != nb::commRank(comm)) {
    return notModelled("ncclGetPeerDevicePointer",
                       "the sim's windows are not collective, so peers' addresses are unknown");
  }
  *outPtr = static_cast<char*>(buffer) + offset;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, ncclWindow_t window, size_t offset,
         void** outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t, void**) {
  if (int r =
          nb::windowRange(window, nullptr, nullptr, nullptr, "ncclGetLsaMultimemDevicePointer")) {
    return result(r);
  }
  return notModelled("ncclGetLsaMultimemDevicePointer", "the sim has no multicast memory");
}

// ---- growing communicators, one-sided signals: not modelled --------------------------------

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId*) {
  if (int r = nb::checkComm(comm, "ncclCommGetUniqueId")) return result(r);
  return notModelled("ncclCommGetUniqueId", "ncclCommGrow is not modelled by the sim");
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
         int rank, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommGrow(ncclComm_t comm, int, const ncclUniqueId*, int, ncclComm_t* newcomm,
                          ncclConfig_t*) {
  if (newcomm != nullptr) *newcomm = nullptr;
  if (comm != nullptr) {
    if (int r = nb::checkComm(comm, "ncclCommGrow")) return result(r);
  }
  return notModelled("ncclCommGrow", "growing a communicator is not modelled by the sim");
}

NCCL_API(ncclResult_t, ncclPutSignal, const void* localbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
         unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclPutSignal(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int, int,
                           unsigned int, ncclComm_t comm, cudaStream_t) {
  if (int r = nb::checkComm(comm, "ncclPutSignal")) return result(r);
  return notModelled("ncclPutSignal", "one-sided operations are not modelled by the sim");
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int, int, int, unsigned int, ncclComm_t comm, cudaStream_t) {
  if (int r = nb::checkComm(comm, "ncclSignal")) return result(r);
  return notModelled("ncclSignal", "one-sided operations are not modelled by the sim");
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t* signalDescs,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclWaitSignal(int, ncclWaitSignalDesc_t*, ncclComm_t comm, cudaStream_t) {
  if (int r = nb::checkComm(comm, "ncclWaitSignal")) return result(r);
  return notModelled("ncclWaitSignal", "one-sided operations are not modelled by the sim");
}
