// Reduction ops, memory, buffer registration, windows, and the host side of the device API.
#include <nccl.h>
#include <nccl_device.h>

#include <cstring>

#include "api_macros.h"
#include "cudasim_ext.h"
#include "internal.h"

using namespace ncclsim;

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclRedOpCreatePreMulSum"); r != ncclSuccess)
    return r;
  if (op == nullptr || scalar == nullptr || dataTypeSize(datatype) == 0) {
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: bad arguments");
  }
  PreMulSumOp custom;
  custom.inUse = true;
  custom.dtype = datatype;
  if (residence == ncclScalarDevice) {
    cudasimHeapRef ref{};
    if (cudasimHeapLocate(scalar, &ref) != 0) {
      return fail(ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: ncclScalarDevice scalar is not device memory");
    }
    custom.onDevice = true;
    custom.devicePointer = scalar;
  } else if (residence == ncclScalarHostImmediate) {
    std::memcpy(custom.hostValue.bytes, scalar, dataTypeSize(datatype));
  } else {
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: bad residence");
  }
  std::lock_guard<std::mutex> lock(comm->redOpMutex);
  size_t index = 0;
  while (index < comm->preMulSumOps.size() && comm->preMulSumOps[index].inUse) ++index;
  if (index == comm->preMulSumOps.size())
    comm->preMulSumOps.push_back(custom);
  else
    comm->preMulSumOps[index] = custom;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + index);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclRedOpDestroy"); r != ncclSuccess) return r;
  std::lock_guard<std::mutex> lock(comm->redOpMutex);
  const size_t index = static_cast<size_t>(op) - ncclNumOps;
  if (op < ncclNumOps || index >= comm->preMulSumOps.size() || !comm->preMulSumOps[index].inUse) {
    return fail(ncclInvalidArgument,
                "ncclRedOpDestroy: not a live op created by ncclRedOpCreatePreMulSum");
  }
  comm->preMulSumOps[index].inUse = false;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  const cudaError_t error = cudaMalloc(ptr, size);
  if (error != cudaSuccess)
    return fail(ncclUnhandledCudaError, std::string("ncclMemAlloc: ") + cudaGetErrorString(error));
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  const cudaError_t error = cudaFree(ptr);
  if (error != cudaSuccess)
    return fail(ncclUnhandledCudaError, std::string("ncclMemFree: ") + cudaGetErrorString(error));
  return ncclSuccess;
}

namespace {
// Registration has nothing to speed up on a CPU; the handle only remembers the range, so that
// misuse (a host pointer, a wrong handle) is still reported.
struct Registration {
  ncclComm* comm;
  void* buffer;
  size_t size;
  bool isWindow;
};

ncclResult_t registerRange(ncclComm_t comm, void* buff, size_t size, bool isWindow,
                           const char* caller, Registration** out) {
  if (ncclResult_t r = checkCommUsable(comm, caller); r != ncclSuccess) return r;
  if (out == nullptr) return fail(ncclInvalidArgument, std::string(caller) + ": handle is NULL");
  cudasimHeapRef ref{};
  if (buff == nullptr || cudasimHeapLocate(buff, &ref) != 0 || ref.bytesToEnd < size) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": buffer is not device memory of that size");
  }
  *out = new Registration{comm, buff, size, isWindow};
  return ncclSuccess;
}

ncclResult_t deregister(ncclComm_t comm, void* handle, bool isWindow, const char* caller) {
  if (ncclResult_t r = checkCommUsable(comm, caller); r != ncclSuccess) return r;
  auto* registration = static_cast<Registration*>(handle);
  if (registration == nullptr || registration->comm != comm || registration->isWindow != isWindow) {
    return fail(ncclInvalidArgument, std::string(caller) + ": unknown handle");
  }
  delete registration;
  return ncclSuccess;
}
}  // namespace

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size,
         void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  Registration* registration = nullptr;
  const ncclResult_t r = registerRange(comm, buff, size, false, "ncclCommRegister", &registration);
  if (r == ncclSuccess) *handle = registration;
  return r;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return deregister(comm, handle, false, "ncclCommDeregister");
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
         ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC) {
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: unknown winFlags");
  }
  if (win == nullptr) return fail(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  Registration* registration = nullptr;
  const ncclResult_t r =
      registerRange(comm, buff, size, true, "ncclCommWindowRegister", &registration);
  if (r == ncclSuccess) *win = reinterpret_cast<ncclWindow_t>(registration);
  return r;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return deregister(comm, reinterpret_cast<void*>(win), true, "ncclCommWindowDeregister");
}

// ----- device API, host side -----
// On one host every rank is reachable by load/store, so the LSA team is the world and the rail
// team has one member per rank position; these are pure functions of the communicator.

NCCL_API(ncclTeam_t, ncclTeamWorld, ncclComm_t comm);
ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  ncclTeam_t team{};
  if (comm) team = ncclTeam_t{comm->nranks, comm->rank, 1};
  return team;
}

NCCL_API(ncclTeam_t, ncclTeamLsa, ncclComm_t comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  return ncclTeamWorld(comm);
}

NCCL_API(ncclTeam_t, ncclTeamRail, ncclComm_t comm);
ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  // The outer factor of the LSA team: as many members as nodes (one), strided by the LSA size.
  ncclTeam_t team{};
  if (comm) team = ncclTeam_t{1, 0, comm->nranks};
  return team;
}

NCCL_API(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  if (!comm) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

NCCL_API(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  return ncclTeamRankToWorld(comm, team, rank);  // the LSA team starts at world rank 0
}

NCCL_API(ncclResult_t, ncclLsaBarrierCreateRequirement, ncclTeam_t team, int nBarriers,
         ncclLsaBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                             ncclLsaBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq) {
  if (outHandle == nullptr || outReq == nullptr || nBarriers < 0) {
    return fail(ncclInvalidArgument, "ncclLsaBarrierCreateRequirement: bad arguments");
  }
  std::memset(outReq, 0, sizeof *outReq);
  outHandle->nBarriers = nBarriers;
  outHandle->bufHandle = 0;
  outReq->bufferSize = static_cast<size_t>(nBarriers) * team.nRanks * sizeof(uint32_t);
  outReq->bufferAlign = 16;
  outReq->outBufferHandle = &outHandle->bufHandle;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, ncclTeam_t team,
         int nBarriers, ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                             ncclGinBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq) {
  if (comm == nullptr || outHandle == nullptr || outReq == nullptr || nBarriers < 0) {
    return fail(ncclInvalidArgument, "ncclGinBarrierCreateRequirement: bad arguments");
  }
  std::memset(outReq, 0, sizeof *outReq);
  outHandle->signal0 = 0;
  outHandle->bufHandle = 0;
  outReq->bufferSize = static_cast<size_t>(nBarriers) * team.nRanks * sizeof(uint64_t);
  outReq->bufferAlign = 16;
  outReq->ginSignalCount = nBarriers;
  outReq->outBufferHandle = &outHandle->bufHandle;
  outReq->outGinSignalStart = &outHandle->signal0;
  return ncclSuccess;
}

NCCL_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  // LL packs 8 payload bytes per 16-byte line: one slot per 8 bytes of every element. This is
  // the sim's own sizing, not NCCL's formula; nothing on a CPU consumes the slots.
  if (maxElts <= 0 || maxEltSize <= 0) return 0;
  return maxElts * ((maxEltSize + 7) / 8);
}

NCCL_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots,
         ncclLLA2AHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                        ncclDevResourceRequirements_t* outReq) {
  if (outHandle == nullptr || outReq == nullptr || nBlocks < 0 || nSlots < 0) {
    return fail(ncclInvalidArgument, "ncclLLA2ACreateRequirement: bad arguments");
  }
  std::memset(outReq, 0, sizeof *outReq);
  outHandle->bufHandle = 0;
  outHandle->nSlots = static_cast<uint32_t>(nSlots);
  outReq->bufferSize = static_cast<size_t>(nBlocks) * nSlots * 16;
  outReq->bufferAlign = 16;
  outReq->outBufferHandle = &outHandle->bufHandle;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
         ncclDevComm_t* outDevComm);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                               ncclDevComm_t* outDevComm) {
  (void)comm;
  (void)reqs;
  (void)outDevComm;
  return fail(ncclInvalidUsage,
              "ncclDevCommCreate: the sim runs no device kernels, so device communicators are not "
              "available");
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, ncclDevComm_t const* devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  (void)comm;
  (void)devComm;
  return fail(ncclInvalidUsage, "ncclDevCommDestroy: the sim never creates device communicators");
}

// ---- for newer_api.cc (the NCCL 2.29-2.32 host API, built against the newer nccl.h) --------

#include "newer_bridge.h"

namespace ncclsim::newer {

int checkComm(void* comm, const char* caller) {
  return checkCommUsable(static_cast<ncclComm*>(comm), caller);
}

int fail(int result, const char* text) {
  return ncclsim::fail(static_cast<ncclResult_t>(result), text);
}

int commRank(void* comm) {
  return static_cast<ncclComm*>(comm)->rank;
}

int windowRange(void* window, void** comm, void** buffer, size_t* bytes, const char* caller) {
  auto* registration = static_cast<Registration*>(window);
  if (registration == nullptr || !registration->isWindow) {
    return ncclsim::fail(ncclInvalidArgument, std::string(caller) + ": not a window");
  }
  if (comm) *comm = registration->comm;
  if (buffer) *buffer = registration->buffer;
  if (bytes) *bytes = registration->size;
  return ncclSuccess;
}

}  // namespace ncclsim::newer
