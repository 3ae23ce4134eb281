// What newer_api.cc needs from the rest of the sim's NCCL. newer_api.cc is compiled against
// NCCL 2.32's nccl.h (the functions that came after the toolkit's 2.28.9) and every other file
// against 2.28.9's, so this interface uses no NCCL type: communicators and windows are opaque
// pointers and results are ncclResult_t values as int (the same values in both headers).
#pragma once
#include <cstddef>

namespace ncclsim::newer {

// ncclSuccess, or the error (with ncclGetLastError's text set) when comm is not usable.
int checkComm(void* comm, const char* caller);
// Sets ncclGetLastError's text and returns result.
int fail(int result, const char* text);
int commRank(void* comm);
// The user buffer and size of a window registered with ncclCommWindowRegister, and its comm;
// ncclInvalidArgument when `window` is not a live window.
int windowRange(void* window, void** comm, void** buffer, size_t* bytes, const char* caller);

// The collectives, in the order of the sim's CollKind (ops.cc checks it).
enum class Collective : unsigned {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
};
// Issues a collective exactly as the plain ncclX does (same checks, matching, profiler events);
// dtype and redop are ncclDataType_t and ncclRedOp_t values, stream a cudaStream_t.
int issueCollective(Collective kind, const void* sendbuff, void* recvbuff, size_t count, int dtype,
                    int redop, int root, void* comm, void* stream, const char* caller);

}  // namespace ncclsim::newer
