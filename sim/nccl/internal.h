// Process-local state of the sim's NCCL: communicators, operations, groups, errors.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "datatypes.h"
#include "profiler.h"
#include "shm.h"

namespace ncclsim {

// The configuration of this process, read at the first communicator init (and again in a fork
// child), never in a constructor.
const SimConfig& simConfig();

// Error text for ncclGetLastError; thread-local like NCCL's.
void setLastError(const std::string& text);
ncclResult_t fail(ncclResult_t result, const std::string& text);
const std::string& lastError();

// Prints one "ncclsim: ..." line to stderr when NCCLSIM_DEBUG=1.
void debugLine(const std::string& text);

enum class OpKind { kCollective, kSend, kRecv };

struct PreMulSumOp {
  bool inUse = false;
  ncclDataType_t dtype = ncclFloat32;
  bool onDevice = false;
  const void* devicePointer = nullptr;  // ncclScalarDevice: read when the operation runs
  Scalar hostValue;                     // ncclScalarHostImmediate: read at creation
};

// One queued NCCL operation, with everything its host task needs.
struct Operation {
  ncclComm* comm = nullptr;  // holds a reference (released when the task finishes)
  OpKind kind = OpKind::kCollective;
  CollKind coll = CollKind::kAllReduce;
  uint64_t issueSeq = 0;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t redop = ncclSum;
  int root = 0;  // collectives
  int peer = 0;  // send/recv
  const void* sendPtr = nullptr;
  void* recvPtr = nullptr;
  HeapRef send;
  Scalar scalar;                       // resolved PreMulSum factor of this rank
  const void* scalarDevice = nullptr;  // when the factor lives in device memory
  // Faults that apply to this operation.
  uint64_t slowUs = 0;
  bool stall = false;
  bool netError = false;
  bool netErrorIsSystem = false;
  OperationProfile profile;  // profiler events of this call (profiler.h)
  // A collective's place in the order this process launched its comm's collectives (1-based;
  // 0 for one captured into a CUDA graph, which runs at each replay): runCollective waits for
  // the ones before it, as NCCL runs a communicator's operations in issue order on any stream.
  uint64_t issueOrdinal = 0;
};

}  // namespace ncclsim

// NCCL's opaque communicator type, defined by the sim.
struct ncclComm {
  std::atomic<int> references{1};
  pid_t ownerPid = 0;  // a fork child must not use its parent's communicators
  int rank = 0;
  int nranks = 0;
  int cudaDevice = 0;
  int creationIndex = 0;
  bool blocking = true;
  std::string commName;
  uint64_t commHash = 0;
  uint64_t segmentKey = 0;  // names this communicator's shm segment and its children's
  int creatorPid = 0;       // process that made the root unique id (segment names carry it)
  ncclsim::Segment segment;

  std::atomic<ncclResult_t> initState{ncclInProgress};  // init or split/shrink in progress
  std::atomic<ncclResult_t> asyncError{ncclSuccess};
  std::atomic<bool> finalizing{false};  // non-blocking finalize still waiting
  std::atomic<bool> aborted{false};     // everything stops, including host-side split waits
  std::atomic<bool> cancelOps{false};   // queued and running operations fail (abort, revoke)
  std::atomic<bool> revoked{false};
  bool finalized = false;
  bool destroyed = false;

  // Operation execution is serialized per communicator like NCCL's internal ordering of a comm's
  // kernels; the counters below are assigned under this lock when an operation starts running.
  std::mutex executionMutex;
  uint64_t executedCollectives = 0;
  // Collectives launched outside capture (Operation::issueOrdinal), and how many of them have
  // run, in that order.
  std::atomic<uint64_t> launchedCollectives{0};
  std::atomic<uint64_t> ranCollectives{0};
  std::vector<uint64_t> sendsExecutedTo;
  std::vector<uint64_t> recvsExecutedFrom;

  std::atomic<uint64_t> issuedOps{0};  // the "seq" of docs/plan.md
  int splitCount = 0;
  int shrinkCount = 0;

  std::mutex outstandingMutex;
  std::condition_variable outstandingChanged;
  int outstandingOps = 0;  // enqueued and not yet finished
  int runningOps = 0;      // host tasks currently inside this comm

  std::mutex backgroundMutex;
  std::thread background;  // non-blocking init/split/shrink/finalize

  std::mutex redOpMutex;
  std::vector<ncclsim::PreMulSumOp> preMulSumOps;  // index = op - ncclNumOps

  void* profilerContext = nullptr;
  bool profilerAttached = false;
  // NCCL's per-function Coll counters (the launching thread; a captured plan's replays too)
  std::atomic<uint64_t> profilerSeqNumbers[5] = {};
};

namespace ncclsim {

void retainComm(ncclComm* comm);
void releaseComm(ncclComm* comm);  // frees at zero

// Operations (ops.cc).
ncclResult_t submitOperation(Operation op, cudaStream_t stream);
void abortQueuedAndRunning(ncclComm* comm, int boundMs);
void waitOutstanding(ncclComm* comm);
int groupDepth();
// Inits called inside ncclGroupStart/End run together at the outermost ncclGroupEnd.
struct DeferredInit {
  ncclComm* comm;
  std::function<ncclResult_t()> work;
};
void deferInitToGroupEnd(ncclComm* comm, std::function<ncclResult_t()> work);
ncclResult_t runDeferredInits(std::vector<DeferredInit>& inits);
void groupResetAfterFork();

// Lifecycle helpers (comm.cc).
ncclResult_t checkCommUsable(ncclComm* comm, const char* caller);
// The application gave the handle back (ncclCommDestroy, ncclCommAbort): NCCL freed it there.
void noteCommFreed(const ncclComm* comm);
// A call on a handle the application gave back is a use after free: real NCCL reads freed
// memory and may crash or go on with garbage. The sim stops the process with one line naming
// the call, so that a test sees what a user would meet as a crash or a corrupted run.
void stopOnFreedComm(const ncclComm* comm, const char* caller);
uint64_t nextIssueSeq(ncclComm* comm);
void applyCrashFault(ncclComm* comm, uint64_t seq);
void faultsForOperation(ncclComm* comm, uint64_t seq, Operation* op);
// Waits for a condition on a communicator's segment, waking at least every 200 ms to check the
// cancel flag; returns false when cancelled. onSlowWait is called once after NCCLSIM_DEBUG_WAIT_MS.
template <typename Ready, typename OnSlowWait>
bool waitOnSegment(ncclComm* comm, const std::atomic<bool>& cancel, Ready ready,
                   OnSlowWait onSlowWait);
std::string commLabel(const ncclComm* comm);  // "rank R comm HHHH"

}  // namespace ncclsim

#include "wait_inl.h"
