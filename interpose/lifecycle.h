// What the wrappers do around the real call: record it, and for communicator lifecycle calls
// keep the registry in step (identity of new communicators, split counters, destruction).
#pragma once
#include <nccl.h>

#include "interpose/nvtx_ranges.h"
#include "interpose/recorder.h"

namespace ncclwatch::interpose {

// Records a collective or p2p call, then makes it. Recording never throws into the host and
// never takes a lock across the real call.
template <typename CallReal>
ncclResult_t recordAndCall(ncclComm_t comm, const CallDescription& call, CallReal&& callReal) {
  Recorder* recorder = nullptr;
  IssuedCall issued;
  try {
    recorder = Recorder::get();
    if (recorder != nullptr) recorder->issueInto(recorder->find(comm), call, &issued);
  } catch (...) {
    recorder = nullptr;
  }
  bool ranged = recorder != nullptr && nvtxRangesEnabled();
  if (ranged) nvtxPushCall(call.op, issued.commHash, issued.seq, call.count, call.dtype);
  ncclResult_t result;
  {
    CallInProgress inProgress(recorder != nullptr ? &issued : nullptr);
    result = callReal();
  }
  if (ranged) nvtxPopCall();
  if (recorder != nullptr && (result != ncclSuccess || !issued.finishOnlyOnFailure)) {
    if (result == ncclSuccess && issued.ticket != watchdog::kNoTicket) {
      // A tracked single call that succeeded: its event and its hand-over to the poller.
      issued.completion->finishCall(issued.ticket, issued.stream, issued.index, issued.commHash);
    } else {
      recorder->finish(issued, comm, result);
    }
  }
  return result;
}

// After a forwarded call: ncclCommInitAll gets its unique id through our ncclGetUniqueId, and
// a non-blocking communicator's deferred completion events wait for ncclCommGetAsyncError.
inline void afterForward(ncclResult_t result, bool nested, ncclUniqueId* id) {
  if (nested && result == ncclSuccess && id != nullptr) rememberNestedUniqueId(*id);
}
void afterForward(ncclResult_t result, bool nested, ncclComm_t comm, ncclResult_t* asyncError);
template <typename Result, typename... Args>
void afterForward(Result, bool, Args&&...) {}

// ncclGroupStart/End as the user calls them: nesting per thread, and at the outermost
// ncclGroupEnd completion events for the streams the group's calls used.
inline ncclResult_t groupStart(decltype(&::pncclGroupStart) real) {
  enterGroup();
  return real();
}
ncclResult_t groupEnd(decltype(&::pncclGroupEnd) real);

ncclResult_t lifecycle_ncclCommInitRank(decltype(&::pncclCommInitRank) real, ncclComm_t* comm,
                                        int nranks, ncclUniqueId commId, int rank);
ncclResult_t lifecycle_ncclCommInitRankConfig(decltype(&::pncclCommInitRankConfig) real,
                                              ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config);
ncclResult_t lifecycle_ncclCommInitAll(decltype(&::pncclCommInitAll) real, ncclComm_t* comms,
                                       int ndev, const int* devlist);
ncclResult_t lifecycle_ncclCommInitRankScalable(decltype(&::pncclCommInitRankScalable) real,
                                                ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config);
ncclResult_t lifecycle_ncclCommSplit(decltype(&::pncclCommSplit) real, ncclComm_t comm, int color,
                                     int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t lifecycle_ncclCommShrink(decltype(&::pncclCommShrink) real, ncclComm_t comm,
                                      int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t lifecycle_ncclCommFinalize(decltype(&::pncclCommFinalize) real, ncclComm_t comm);
ncclResult_t lifecycle_ncclCommDestroy(decltype(&::pncclCommDestroy) real, ncclComm_t comm);
ncclResult_t lifecycle_ncclCommAbort(decltype(&::pncclCommAbort) real, ncclComm_t comm);
// The abort itself, recorded (its pending calls end aborted): the application's, and
// ncclwatch's own (Recorder::abortByHash: `byNcclwatch`, flagged kRecordByNcclwatch).
ncclResult_t abortAndRecord(decltype(&::pncclCommAbort) real, ncclComm_t comm, bool byNcclwatch);
ncclResult_t lifecycle_ncclCommRevoke(decltype(&::pncclCommRevoke) real, ncclComm_t comm,
                                      int revokeFlags);

// ncclCommGrow (NCCL 2.29+; its wrapper is compiled against the newer nccl.h, lifecycle_newer.h)
// around the real call: which communicator grows, and the grown one's NCCL magic (a new rank
// and the existing root read it from the id, the other existing ranks derive it from the
// parent's); then, when NCCL accepted the call, the grown communicator joins the registry
// under NCCL's commHash. An unknown magic (a parent the registry does not hold) leaves the
// grown communicator out, as one the table could not hold.
struct GrowPlan {
  bool recording = false;
  CommEntry* parent = nullptr;
  uint64_t magic = 0;
  int childCount = 0;
};
GrowPlan planGrow(ncclComm_t comm, const ncclUniqueId* uniqueId);
void finishGrow(const GrowPlan& plan, ncclResult_t result, ncclComm_t newcomm, int nRanks,
                int rank);

}  // namespace ncclwatch::interpose
