// Finding the real NCCL behind the wrappers.
#pragma once
#include <nccl.h>

#include <type_traits>

namespace ncclwatch::interpose {

// NCCL's pnccl<Name> (strong aliases of its API, PMPI-style): RTLD_NEXT first, then the
// already-loaded libnccl.so.2, which also finds an NCCL that PyTorch loaded RTLD_LOCAL.
void* resolveReal(const char* realName);

// Says once, on stderr, that there is no NCCL to forward to, and points at plugin mode.
void reportMissingNccl(const char* name);

// What a wrapper returns when there is no NCCL at all: the error NCCL itself uses for a
// missing system component, or a message for the string functions.
template <typename Result>
Result missingNcclResult() {
  if constexpr (std::is_same_v<Result, ncclResult_t>) {
    return ncclSystemError;
  } else {
    return "ncclwatch: no NCCL library to forward to";
  }
}

}  // namespace ncclwatch::interpose
