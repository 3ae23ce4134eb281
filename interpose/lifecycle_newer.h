// The recording hooks of the NCCL 2.29+ lifecycle calls, for wrappers_newer.cc only: their
// real functions' types (decltype(&::pncclCommGrow)) exist only under the newer nccl.h.
#pragma once
#include <nccl.h>

#include "interpose/lifecycle.h"

namespace ncclwatch::interpose {

inline ncclResult_t lifecycle_ncclCommGrow(decltype(&::pncclCommGrow) real, ncclComm_t comm,
                                           int nRanks, const ncclUniqueId* uniqueId, int rank,
                                           ncclComm_t* newcomm, ncclConfig_t* config) {
  GrowPlan plan = planGrow(comm, uniqueId);
  auto callReal = [&] { return real(comm, nRanks, uniqueId, rank, newcomm, config); };
  ncclResult_t result;
  if (comm != nullptr) {
    CallDescription call;
    call.op = trace::OpKind::kGrow;
    call.count = nRanks > 0 ? static_cast<uint64_t>(nRanks) : 0;
    call.callSite = detail::t_lifecycleSite;
    result = recordAndCall(comm, call, callReal);
  } else {
    result = callReal();  // a new rank: no communicator to record on until it exists
  }
  finishGrow(plan, result, newcomm != nullptr ? *newcomm : nullptr, nRanks, rank);
  return result;
}

}  // namespace ncclwatch::interpose
