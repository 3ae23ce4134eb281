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
//   ncclCommGetUniqueId, ncclCommGrow, ncclPutSignal, ncclSignal, ncclWaitSignal,
//   ncclGetLsaMultimemDevicePointer   not modelled: ncclInvalidUsage, with the reason in
//                         ncclGetLastError.
#include <nccl.h>
#include <nccl_device.h>

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

}  // namespace

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
