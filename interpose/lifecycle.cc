#include "interpose/lifecycle.h"

#include "interpose/aborted_comms.h"

#include "trace/identity.h"
#include "watchdog/discovery.h"

namespace ncclwatch::interpose {
namespace {

using trace::OpKind;

bool accepted(ncclResult_t result) {
  return result == ncclSuccess || result == ncclInProgress;
}

// Size, rank and device of a new communicator, asked through our own forwarding wrappers
// (a non-blocking comm still initializing may not answer yet: then they stay unknown).
void describeComm(ncclComm_t comm, CommCreation* creation) {
  int value = 0;
  if (ncclCommCount(comm, &value) == ncclSuccess) creation->nranks = value;
  if (ncclCommUserRank(comm, &value) == ncclSuccess) creation->rank = value;
  if (ncclCommCuDevice(comm, &value) == ncclSuccess) creation->device = value;
}

// Records a lifecycle call on an existing communicator (it takes its place in the comm's
// sequence), makes it, and stores a failure.
template <typename CallReal>
ncclResult_t recordOnComm(ncclComm_t comm, OpKind op, int rootOrPeer, CallReal&& callReal,
                          uint8_t extraFlags = 0) {
  CallDescription call;
  call.op = op;
  call.rootOrPeer = rootOrPeer;
  call.extraFlags = extraFlags;
  call.callSite = detail::t_lifecycleSite;  // where the application called it (its wrapper's)
  return recordAndCall(comm, call, callReal);
}

// Counts a call that makes a child of `parent` (split, shrink) while it is inside NCCL.
class ChildInFlight {
 public:
  explicit ChildInFlight(CommEntry* parent) : parent_(parent) {
    if (parent_ != nullptr) parent_->childrenInFlight.fetch_add(1, std::memory_order_seq_cst);
  }
  ~ChildInFlight() {
    if (parent_ != nullptr) parent_->childrenInFlight.fetch_sub(1, std::memory_order_release);
  }
  ChildInFlight(const ChildInFlight&) = delete;
  ChildInFlight& operator=(const ChildInFlight&) = delete;

 private:
  CommEntry* parent_;
};

// A root communicator's Init record: its hash comes from the unique id, known before NCCL runs
// and even when init fails, so a failed init is still recorded under the communicator it was
// meant to create.
CallDescription rootInitCall(uint64_t hash, int nranks, int rank) {
  CallDescription call;
  call.op = OpKind::kInit;
  call.count = static_cast<uint64_t>(nranks);
  call.rootOrPeer = rank;
  call.countsInSequence = false;
  call.commHash = hash;
  call.callSite = detail::t_lifecycleSite;  // where the application called it
  return call;
}

// A root init about to run, recorded before NCCL is called: a rank held inside it (a peer that
// never comes, a GPU another rank took) has a trace with the init pending, and its watchdog
// speaks to the collector while it waits. Only for ids from the job's rendezvous (not made in
// this process by ncclCommInitAll): the first such id is what every rank can derive the
// collector's secret from.
struct PendingInit {
  Recorder* recorder = nullptr;
  IssuedCall issued;
};

PendingInit beginRootInit(const ncclUniqueId& id, int nranks, int rank) {
  PendingInit pending;
  pending.recorder = Recorder::get();
  if (pending.recorder == nullptr) return pending;
  const uint64_t hash = trace::rootCommHash(&id, sizeof id);
  watchdog::offerCommHashForSecret(hash);  // before the watchdog starts, for its first step
  pending.issued = pending.recorder->issue(nullptr, rootInitCall(hash, nranks, rank));
  pending.recorder->startWatchdog();
  return pending;
}

// After the root init returned: the communicator registered, its Init record finished (the
// pending one, or one made now).
ncclResult_t finishRootInit(ncclResult_t result, ncclComm_t comm, const ncclUniqueId& id,
                            int nranks, int rank, const PendingInit* pending) {
  Recorder* recorder = pending != nullptr ? pending->recorder : Recorder::get();
  if (recorder == nullptr) return result;
  CommCreation creation;
  creation.comm = comm;
  creation.hash = trace::rootCommHash(&id, sizeof id);
  creation.magic = trace::uniqueIdMagic(&id);
  creation.nranks = nranks;
  creation.rank = rank;
  CommEntry* entry = nullptr;
  if (accepted(result) && comm != nullptr) {
    forgetAbortedByUs(comm);  // NCCL reused the address of one ncclwatch aborted
    describeComm(comm, &creation);
    recorder->writer().addRecordingSource(trace::kSourceInterposer);
    entry = recorder->add(creation);
    recorder->communicatorCreated();
  }
  IssuedCall issued = pending != nullptr
                          ? pending->issued
                          : recorder->issue(entry, rootInitCall(creation.hash, nranks, rank));
  recorder->finish(issued, comm, result);
  return result;
}

// A new communicator made from `parent` (a split, shrink or grow child; null for a grow's new
// rank, which has no parent here): registered, and its Init recorded.
void addChild(ncclComm_t child, CommEntry* parent, CommCreation creation) {
  Recorder* recorder = Recorder::get();
  if (recorder == nullptr || child == nullptr) return;
  creation.comm = child;
  creation.parentHash = parent != nullptr ? parent->hash : 0;
  forgetAbortedByUs(child);  // NCCL reused the address of one ncclwatch aborted
  describeComm(child, &creation);
  recorder->writer().addRecordingSource(trace::kSourceInterposer);
  CommEntry* entry = recorder->add(creation);
  recorder->communicatorCreated();
  CallDescription call;
  call.op = OpKind::kInit;
  call.count = static_cast<uint64_t>(creation.nranks);
  call.rootOrPeer = creation.rank;
  call.countsInSequence = false;
  call.commHash = creation.hash;
  recorder->finish(recorder->issue(entry, call), child, ncclSuccess);
}

// A split or shrink child: NCCL's bootstrap magic of a child is its own commHash.
void addSplitChild(ncclComm_t child, CommEntry* parent, uint64_t hash, OpKind kind, int color,
                   int splitIndex, int shrinkIndex) {
  CommCreation creation;
  creation.hash = hash;
  creation.magic = hash;
  creation.color = color;
  creation.splitIndex = splitIndex;
  creation.shrinkIndex = shrinkIndex;
  creation.kind = kind;
  addChild(child, parent, creation);
}

}  // namespace

ncclResult_t lifecycle_ncclCommInitRank(decltype(&::pncclCommInitRank) real, ncclComm_t* comm,
                                        int nranks, ncclUniqueId commId, int rank) {
  PendingInit pending = beginRootInit(commId, nranks, rank);
  ncclResult_t result = real(comm, nranks, commId, rank);
  return finishRootInit(result, comm != nullptr ? *comm : nullptr, commId, nranks, rank, &pending);
}

ncclResult_t lifecycle_ncclCommInitRankConfig(decltype(&::pncclCommInitRankConfig) real,
                                              ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  PendingInit pending = beginRootInit(commId, nranks, rank);
  ncclResult_t result = real(comm, nranks, commId, rank, config);
  return finishRootInit(result, comm != nullptr ? *comm : nullptr, commId, nranks, rank, &pending);
}

ncclResult_t lifecycle_ncclCommInitRankScalable(decltype(&::pncclCommInitRankScalable) real,
                                                ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  if (commIds == nullptr || nId < 1) return real(newcomm, nranks, myrank, nId, commIds, config);
  PendingInit pending = beginRootInit(commIds[0], nranks, myrank);
  ncclResult_t result = real(newcomm, nranks, myrank, nId, commIds, config);
  return finishRootInit(result, newcomm != nullptr ? *newcomm : nullptr, commIds[0], nranks, myrank,
                        &pending);
}

ncclResult_t lifecycle_ncclCommInitAll(decltype(&::pncclCommInitAll) real, ncclComm_t* comms,
                                       int ndev, const int* devlist) {
  ncclResult_t result = real(comms, ndev, devlist);
  ncclUniqueId id;
  if (!takeNestedUniqueId(&id) || comms == nullptr) return result;
  for (int i = 0; i < ndev; ++i) {
    finishRootInit(result, accepted(result) ? comms[i] : nullptr, id, ndev, i, nullptr);
  }
  return result;
}

ncclResult_t lifecycle_ncclCommSplit(decltype(&::pncclCommSplit) real, ncclComm_t comm, int color,
                                     int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  Recorder* recorder = Recorder::get();
  CommEntry* parent = recorder != nullptr ? recorder->find(comm) : nullptr;
  // NCCL counts every split of the parent, NCCL_SPLIT_NOCOLOR included.
  int splitIndex = parent != nullptr ? parent->splitCount.fetch_add(1) + 1 : 0;
  ncclResult_t result;
  {
    ChildInFlight inFlight(parent);
    result = recordOnComm(comm, OpKind::kSplit, color,
                          [&] { return real(comm, color, key, newcomm, config); });
  }
  if (accepted(result) && newcomm != nullptr && *newcomm != nullptr && parent != nullptr) {
    addSplitChild(*newcomm, parent, trace::splitCommHash(parent->hash, splitIndex, color),
                  OpKind::kSplit, color, splitIndex, 0);
  }
  return result;
}

ncclResult_t lifecycle_ncclCommShrink(decltype(&::pncclCommShrink) real, ncclComm_t comm,
                                      int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  Recorder* recorder = Recorder::get();
  CommEntry* parent = recorder != nullptr ? recorder->find(comm) : nullptr;
  int shrinkIndex = parent != nullptr ? parent->shrinkCount.fetch_add(1) + 1 : 0;
  ncclResult_t result;
  {
    ChildInFlight inFlight(parent);
    result = recordOnComm(comm, OpKind::kShrink, excludeRanksCount, [&] {
      return real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
    });
  }
  if (accepted(result) && newcomm != nullptr && *newcomm != nullptr && parent != nullptr) {
    addSplitChild(*newcomm, parent, trace::shrinkCommHash(parent->hash), OpKind::kShrink, -1, 0,
                  shrinkIndex);
  }
  return result;
}

GrowPlan planGrow(ncclComm_t comm, const ncclUniqueId* uniqueId) {
  GrowPlan plan;
  Recorder* recorder = nullptr;
  try {
    recorder = Recorder::get();
  } catch (...) {
    return plan;
  }
  if (recorder == nullptr) return plan;
  plan.recording = true;
  if (comm != nullptr) plan.parent = recorder->find(comm);
  // Every existing rank's NCCL counts the grow among the parent's children (before making it),
  // so a later split of the parent hashes with the count that includes it; finishGrow counts
  // it once NCCL accepted the call (one refused at its argument checks does not count).
  if (plan.parent != nullptr) plan.childCount = plan.parent->splitCount.load() + 1;
  if (uniqueId != nullptr) {
    plan.magic = trace::uniqueIdMagic(uniqueId);  // a new rank, or the existing root
  } else if (plan.parent != nullptr && plan.parent->magic != 0) {
    plan.magic = trace::growMagic(plan.parent->magic, plan.childCount);
  }
  return plan;
}

void finishGrow(const GrowPlan& plan, ncclResult_t result, ncclComm_t newcomm, int nRanks,
                int rank) {
  if (!plan.recording || !accepted(result)) return;
  if (plan.parent != nullptr) plan.parent->splitCount.fetch_add(1);
  if (newcomm == nullptr || plan.magic == 0) return;
  try {
    CommCreation creation;
    creation.hash = trace::growCommHash(plan.magic, nRanks);
    creation.magic = plan.magic;
    creation.nranks = nRanks;
    // Existing ranks pass rank -1 and keep their rank; new ranks are given theirs.
    creation.rank = plan.parent != nullptr ? plan.parent->rank : rank;
    creation.kind = OpKind::kGrow;
    addChild(newcomm, plan.parent, creation);
  } catch (...) {
  }
}

ncclResult_t lifecycle_ncclCommFinalize(decltype(&::pncclCommFinalize) real, ncclComm_t comm) {
  return recordOnComm(comm, OpKind::kFinalize, -1, [&] { return real(comm); });
}

namespace {

// The application begins to free `comm` (abort or destroy): false when ncclwatch's own abort of
// it began a moment ago (its handle not remembered yet, or this call would have been answered by
// the wrapper): NCCL frees it once, there.
bool applicationMayFree(ncclComm_t comm) {
  Recorder* recorder = Recorder::get();
  CommEntry* entry = recorder != nullptr ? recorder->find(comm) : nullptr;
  return entry == nullptr || !entry->closing.exchange(true);
}

}  // namespace

ncclResult_t lifecycle_ncclCommDestroy(decltype(&::pncclCommDestroy) real, ncclComm_t comm) {
  if (!applicationMayFree(comm)) return ncclSuccess;
  ncclResult_t result = recordOnComm(comm, OpKind::kDestroy, -1, [&] { return real(comm); });
  if (Recorder* recorder = Recorder::get()) recorder->forget(comm);
  return result;
}

ncclResult_t abortAndRecord(decltype(&::pncclCommAbort) real, ncclComm_t comm, bool byNcclwatch) {
  if (Recorder* recorder = Recorder::get()) {
    if (CommEntry* entry = recorder->find(comm)) recorder->communicatorAborted(entry->hash);
  }
  ncclResult_t result = recordOnComm(
      comm, OpKind::kAbort, -1, [&] { return real(comm); },
      byNcclwatch ? trace::kRecordByNcclwatch : 0);
  if (Recorder* recorder = Recorder::get()) recorder->forget(comm);
  return result;
}

ncclResult_t lifecycle_ncclCommAbort(decltype(&::pncclCommAbort) real, ncclComm_t comm) {
  if (!applicationMayFree(comm)) return ncclSuccess;
  return abortAndRecord(real, comm, false);
}

ncclResult_t lifecycle_ncclCommRevoke(decltype(&::pncclCommRevoke) real, ncclComm_t comm,
                                      int revokeFlags) {
  return recordOnComm(comm, OpKind::kRevoke, revokeFlags, [&] { return real(comm, revokeFlags); });
}

ncclResult_t groupEnd(decltype(&::pncclGroupEnd) real) {
  leaveGroup();
  Recorder* recorder = nullptr;
  if (groupDepth() == 0) {
    try {
      recorder = Recorder::get();
    } catch (...) {
      recorder = nullptr;
    }
  }
  if (recorder != nullptr) recorder->beforeGroupEnd();
  ncclResult_t result = real();
  if (recorder != nullptr) recorder->afterGroupEnd(result);
  return result;
}

void afterForward(ncclResult_t result, bool nested, ncclComm_t comm, ncclResult_t* asyncError) {
  if (nested || result != ncclSuccess || asyncError == nullptr) return;
  try {
    if (Recorder* recorder = Recorder::get()) recorder->asyncErrorPolled(comm, *asyncError);
  } catch (...) {
  }
}

}  // namespace ncclwatch::interpose
