// Operations: argument checks at issue, groups, and the host tasks that run each operation on
// its stream (rendezvous in shared memory, then the data movement).
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "api_macros.h"
#include "cudasim_ext.h"
#include "internal.h"
#include "newer_bridge.h"
#include "plugin/abi/profiler_abi.h"

namespace ncclsim {
namespace {

// ----- groups -----

struct QueuedOperation {
  Operation op;
  cudaStream_t stream;
};

struct GroupState {
  int depth = 0;
  std::vector<QueuedOperation> operations;
  std::vector<DeferredInit> inits;
};

thread_local GroupState tGroup;

struct Task {
  cudaStream_t stream;
  std::vector<Operation> ops;
  // Captured into a CUDA graph: runs at every replay and is never freed (the sim has no hook for
  // the graph's destruction), holding its communicators' references.
  bool persistent = false;
};

// ----- text for debug lines -----

const char* redOpName(int redop) {
  switch (redop) {
    case ncclSum:
      return "sum";
    case ncclProd:
      return "prod";
    case ncclMax:
      return "max";
    case ncclMin:
      return "min";
    case ncclAvg:
      return "avg";
    default:
      return "premulsum";
  }
}

std::string describe(const CollDescriptor& d) {
  const CollKind kind = static_cast<CollKind>(d.kind);
  std::string text = std::string(collKindName(kind)) + "(" + std::to_string(d.count) + " x " +
                     dataTypeName(static_cast<ncclDataType_t>(d.dtype));
  if (collKindReduces(kind)) text += std::string(" ") + redOpName(d.redop);
  if (collKindHasRoot(kind)) text += " root=" + std::to_string(d.root);
  return text + ")";
}

std::string rankList(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j;
  }
  return text;
}

// ----- execution helpers -----

struct RunningScope {
  explicit RunningScope(ncclComm* c) : comm(c) {
    std::lock_guard<std::mutex> lock(comm->outstandingMutex);
    ++comm->runningOps;
  }
  ~RunningScope() {
    std::lock_guard<std::mutex> lock(comm->outstandingMutex);
    --comm->runningOps;
    comm->outstandingChanged.notify_all();
  }
  ncclComm* comm;
};

bool waitForever(ncclComm* comm) {
  return waitOnSegment(
      comm, comm->cancelOps, [] { return false; }, [] {});
}

// Faults and the slow-rank delay, before the rendezvous. Returns false when the op must fail.
bool prologue(Operation& op) {
  ncclComm* comm = op.comm;
  if (comm->cancelOps.load()) return false;
  if (op.slowUs > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(op.slowUs);
    while (std::chrono::steady_clock::now() < until) {
      if (comm->cancelOps.load()) return false;
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
          until - std::chrono::steady_clock::now());
      std::this_thread::sleep_for(
          std::min<std::chrono::microseconds>(left, std::chrono::milliseconds(50)));
    }
  }
  if (op.stall) {
    debugLine(commLabel(comm) + " op #" + std::to_string(op.issueSeq) + " stalls (NCCLSIM_FAULT)");
    waitForever(comm);
    return false;
  }
  if (op.netError) {
    ncclResult_t expected = ncclSuccess;
    comm->asyncError.compare_exchange_strong(
        expected, op.netErrorIsSystem ? ncclSystemError : ncclRemoteError);
    waitForever(comm);
    return false;
  }
  if (op.scalarDevice) std::memcpy(op.scalar.bytes, op.scalarDevice, dataTypeSize(op.dtype));
  return true;
}

CollDescriptor descriptorOf(const Operation& op) {
  CollDescriptor d;
  d.kind = static_cast<uint32_t>(op.coll);
  d.dtype = op.dtype;
  d.redop = op.redop >= ncclNumOps ? ncclNumOps : op.redop;
  d.root = collKindHasRoot(op.coll) ? op.root : 0;
  d.count = op.count;
  d.bytes = op.count * dataTypeSize(op.dtype);
  d.issueSeq = op.issueSeq;
  d.send = op.send;
  d.scalar = op.redop >= ncclNumOps ? op.scalar : scalarFromDouble(op.dtype, 1.0);
  return d;
}

bool descriptorsAgree(const CollDescriptor& a, const CollDescriptor& b) {
  if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype) return false;
  const CollKind kind = static_cast<CollKind>(a.kind);
  if (collKindHasRoot(kind) && a.root != b.root) return false;
  if (collKindReduces(kind) && a.redop != b.redop) return false;
  return true;
}

// Reads `length` bytes at `offset` of a rank's send buffer. Short or missing buffers (possible
// only with corrupt-mode mismatches) read as zeros instead of faulting.
class InputReader {
 public:
  InputReader(const Operation& op, const std::vector<CollDescriptor>& all) : op_(op), all_(all) {}
  const void* read(int rank, uint64_t offset, uint64_t length) {
    if (length == 0) return nullptr;
    const HeapRef& ref = all_[rank].send;
    const char* base = nullptr;
    if (rank == op_.comm->rank) {
      base = static_cast<const char*>(op_.sendPtr);
    } else if (ref.pid != 0) {
      std::string error;
      base = static_cast<const char*>(mapHeapRef(ref, &error));
    }
    if (base && ref.bytesToEnd >= offset + length) return base + offset;
    scratch_.emplace_back(length, 0);
    if (base && ref.bytesToEnd > offset)
      std::memcpy(scratch_.back().data(), base + offset, ref.bytesToEnd - offset);
    return scratch_.back().data();
  }

 private:
  const Operation& op_;
  const std::vector<CollDescriptor>& all_;
  std::vector<std::vector<char>> scratch_;
};

// Computes this rank's output of a matched collective into `out`, reading peers in rank order.
// Returns false when this rank writes nothing (non-roots of Reduce and Gather).
bool computeCollective(const Operation& op, const std::vector<CollDescriptor>& all,
                       std::vector<char>* out) {
  const int n = op.comm->nranks;
  const int rank = op.comm->rank;
  const uint64_t elementSize = dataTypeSize(op.dtype);
  const uint64_t chunk = op.count * elementSize;
  InputReader reader(op, all);
  auto reduceFrom = [&](uint64_t offset) {
    std::vector<const void*> inputs(n);
    std::vector<Scalar> scalars(n);
    for (int r = 0; r < n; ++r) {
      inputs[r] = reader.read(r, offset, chunk);
      scalars[r] = all[r].scalar;
    }
    Reduction reduction = Reduction::kSum;
    switch (op.redop) {
      case ncclSum:
        reduction = Reduction::kSum;
        break;
      case ncclProd:
        reduction = Reduction::kProd;
        break;
      case ncclMax:
        reduction = Reduction::kMax;
        break;
      case ncclMin:
        reduction = Reduction::kMin;
        break;
      case ncclAvg: {
        const bool isFloat = op.dtype == ncclFloat16 || op.dtype == ncclFloat32 ||
                             op.dtype == ncclFloat64 || op.dtype == ncclBfloat16 ||
                             op.dtype == ncclFloat8e4m3 || op.dtype == ncclFloat8e5m2;
        if (isFloat) {
          reduction = Reduction::kPreMulSum;
          std::fill(scalars.begin(), scalars.end(), averageScalar(op.dtype, n));
        } else {
          reduction = Reduction::kSumPostDiv;
        }
        break;
      }
      default:
        reduction = Reduction::kPreMulSum;
        break;
    }
    out->assign(chunk, 0);
    if (chunk)
      reduceElements(op.dtype, reduction, inputs.data(), scalars.data(), n, op.count, out->data());
  };
  auto copyFrom = [&](int r, uint64_t offset, uint64_t destination) {
    if (const void* source = reader.read(r, offset, chunk))
      std::memcpy(out->data() + destination, source, chunk);
  };
  switch (op.coll) {
    case CollKind::kAllReduce:
      reduceFrom(0);
      return true;
    case CollKind::kReduce:
      if (rank != op.root) return false;
      reduceFrom(0);
      return true;
    case CollKind::kReduceScatter:
      reduceFrom(rank * chunk);
      return true;
    case CollKind::kBroadcast:
      out->assign(chunk, 0);
      copyFrom(op.root, 0, 0);
      return true;
    case CollKind::kScatter:
      out->assign(chunk, 0);
      copyFrom(op.root, rank * chunk, 0);
      return true;
    case CollKind::kAllGather:
    case CollKind::kGather:
      if (op.coll == CollKind::kGather && rank != op.root) return false;
      out->assign(chunk * n, 0);
      for (int r = 0; r < n; ++r) copyFrom(r, 0, r * chunk);
      return true;
    case CollKind::kAlltoAll:
      out->assign(chunk * n, 0);
      for (int r = 0; r < n; ++r) copyFrom(r, rank * chunk, r * chunk);
      return true;
  }
  return false;
}

bool allRanksReached(ncclComm* comm, std::atomic<uint64_t> RankSlot::*counter, uint64_t value,
                     std::vector<int>* missing) {
  bool all = true;
  for (int r = 0; r < comm->nranks; ++r) {
    if ((comm->segment.slot(r)->*counter).load(std::memory_order_acquire) < value) {
      all = false;
      if (!missing) return false;
      missing->push_back(r);
    }
  }
  return all;
}

bool barrier(ncclComm* comm, std::atomic<uint64_t> RankSlot::*counter, uint64_t value,
             const std::string& what) {
  return waitOnSegment(
      comm, comm->cancelOps, [&] { return allRanksReached(comm, counter, value, nullptr); },
      [&] {
        std::vector<int> missing;
        allRanksReached(comm, counter, value, &missing);
        debugLine(what + " waits: " + std::to_string(comm->nranks - missing.size()) + "/" +
                  std::to_string(comm->nranks) + " arrived, missing ranks " + rankList(missing));
      });
}

bool rankPosted(ncclComm* comm, int rank, uint64_t number) {
  return comm->segment.slot(rank)->postedColl.load(std::memory_order_acquire) >= number;
}

// With a profiler asking for proxy events, a collective as NCCL's proxy shows a ring: per channel
// a ProxyOp sending to the next rank and one receiving from the previous rank, with up to
// kRingSteps steps each. Receive step s carries what the s+1 ranks upstream contributed (the
// last step: every rank's data), so its RecvWait names the neighbour that missing data has to
// come through. Send step s waits on the GPU for its data (the receive step before it; step 0:
// this rank's own buffer), then in SendPeerWait for the next rank's buffer (its arrival).
class Ring {
 public:
  Ring(Operation& op, uint64_t number)
      : comm_(op.comm),
        number_(number),
        steps_(std::min(kRingSteps, op.comm->nranks - 1)),
        next_((op.comm->rank + 1) % op.comm->nranks),
        previous_((op.comm->rank + op.comm->nranks - 1) % op.comm->nranks),
        toNext_(op, next_, true, steps_),
        fromPrevious_(op, previous_, false, steps_) {
    // Receives are posted at once; the first send waits for the GPU to fill its buffer.
    fromPrevious_.beginStep(nccl_profiler_abi::kProxyStepRecvWait);
    toNext_.beginStep(nccl_profiler_abi::kProxyStepSendGpuWait);
  }
  bool active() const { return toNext_.active(); }

  // A stalled GPU: the first receive arrives from the network, and the GPU never consumes it.
  bool receiveIntoStalledGpu() {
    if (!waitOnSegment(
            comm_, comm_->cancelOps, [&] { return rankPosted(comm_, previous_, number_); },
            [] {})) {
      return false;
    }
    fromPrevious_.enter(nccl_profiler_abi::kProxyStepRecvFlushWait);
    fromPrevious_.enter(nccl_profiler_abi::kProxyStepRecvGpuWait);
    return true;
  }

  // This rank's GPU is through its prologue and its data is posted: runs every step.
  bool run() {
    return waitOnSegment(
        comm_, comm_->cancelOps, [&] { return advance(); }, [] {});
  }

 private:
  bool receiveStepReady(int step) const {
    if (step == steps_ - 1) return allRanksReached(comm_, &RankSlot::postedColl, number_, nullptr);
    for (int upstream = 0; upstream <= step; ++upstream) {
      const int rank = (previous_ - upstream + comm_->nranks) % comm_->nranks;
      if (!rankPosted(comm_, rank, number_)) return false;
    }
    return true;
  }

  // Moves every step that can move; true once all are done.
  bool advance() {
    namespace abi = nccl_profiler_abi;
    for (bool moved = true; moved;) {
      moved = false;
      const int received = fromPrevious_.stepsDone();
      if (received < steps_ && receiveStepReady(received)) {
        fromPrevious_.beginStep(abi::kProxyStepRecvWait);  // no-op: posted when the last ended
        fromPrevious_.enter(abi::kProxyStepRecvFlushWait);
        fromPrevious_.enter(abi::kProxyStepRecvGpuWait);
        fromPrevious_.endStep();
        if (fromPrevious_.stepsDone() < steps_) fromPrevious_.beginStep(abi::kProxyStepRecvWait);
        moved = true;
      }
      const int sent = toNext_.stepsDone();
      if (sent < steps_ && sent <= fromPrevious_.stepsDone()) {
        if (!toNext_.inStep()) toNext_.beginStep(abi::kProxyStepSendGpuWait);
        if (!peerWait_) {
          toNext_.enter(abi::kProxyStepSendPeerWait);
          peerWait_ = true;
        }
        if (rankPosted(comm_, next_, number_)) {
          toNext_.enter(abi::kProxyStepSendWait);
          toNext_.endStep();
          peerWait_ = false;
          moved = true;
        }
      }
    }
    return toNext_.stepsDone() == steps_ && fromPrevious_.stepsDone() == steps_;
  }

  ncclComm* comm_;
  uint64_t number_;
  int steps_;
  int next_;
  int previous_;
  ProxyTransfer toNext_;
  ProxyTransfer fromPrevious_;
  bool peerWait_ = false;  // the current send step has its GPU's data and waits on the peer
};

// A collective launched after others on its communicator runs after them, whatever stream
// each was launched on: NCCL orders a communicator's kernels through a stream of its own, so
// FSDP's all-gathers on one stream and reduce-scatters on another pair by issue order on every
// rank. (Numbered as they start, they paired by whichever stream ran first, and a real FSDP2 job
// hung on the sim.) False when the communicator's operations were cancelled meanwhile.
bool awaitTurn(const Operation& op) {
  if (op.issueOrdinal == 0) return true;
  ncclComm* comm = op.comm;
  return waitOnSegment(
      comm, comm->cancelOps,
      [&] { return comm->ranCollectives.load(std::memory_order_acquire) + 1 >= op.issueOrdinal; },
      [&] {
        debugLine(commLabel(comm) + " coll #" + std::to_string(op.issueSeq) +
                  " waits for the collectives launched before it on this communicator");
      });
}

// The collective's turn is over (it ran, failed or was cancelled): the next one may run.
void endTurn(const Operation& op) {
  if (op.issueOrdinal == 0) return;
  op.comm->ranCollectives.fetch_add(1, std::memory_order_acq_rel);
  op.comm->segment.notifyAll();
}

bool runCollective(Operation& op) {
  ncclComm* comm = op.comm;
  struct TurnEnds {
    const Operation& op;
    ~TurnEnds() { endTurn(op); }
  } turnEnds{op};
  if (!awaitTurn(op)) return false;
  std::lock_guard<std::mutex> lock(comm->executionMutex);
  const uint64_t number = comm->executedCollectives + 1;
  std::optional<Ring> ring;
  if (comm->nranks > 1) {
    ring.emplace(op, number);
    if (!ring->active()) ring.reset();
  }
  if (ring && op.stall && !ring->receiveIntoStalledGpu()) return false;
  if (!prologue(op)) return false;
  comm->executedCollectives = number;
  const CollDescriptor mine = descriptorOf(op);
  RankSlot* slot = comm->segment.slot(comm->rank);
  slot->descriptor = mine;
  slot->postedColl.store(number, std::memory_order_release);
  comm->segment.notifyAll();
  const std::string what =
      commLabel(comm) + " coll #" + std::to_string(op.issueSeq) + " " + describe(mine);
  if (ring && !ring->run()) return false;
  ring.reset();
  if (!barrier(comm, &RankSlot::postedColl, number, what)) return false;
  std::vector<CollDescriptor> all(comm->nranks);
  for (int r = 0; r < comm->nranks; ++r) all[r] = comm->segment.slot(r)->descriptor;
  for (int r = 0; r < comm->nranks; ++r) {
    if (descriptorsAgree(mine, all[r])) continue;
    if (mismatchProceeds(simConfig(), mine, all[r])) continue;  // silent corruption
    debugLine(what + " waits: mismatch with rank " + std::to_string(r) + " " + describe(all[r]));
    waitForever(comm);  // as on a GPU: nobody completes a mismatched collective
    return false;
  }
  std::vector<char> output;
  const bool writes = computeCollective(op, all, &output);
  slot->doneColl.store(number, std::memory_order_release);
  comm->segment.notifyAll();
  // Barrier 2: in-place operations must not overwrite a send buffer that a peer still reads.
  if (!barrier(comm, &RankSlot::doneColl, number, what + " (completion)")) return false;
  if (writes && !output.empty()) std::memcpy(op.recvPtr, output.data(), output.size());
  return true;
}

std::string p2pText(const Operation& op, const char* verb, const char* direction) {
  return commLabel(op.comm) + " " + (op.kind == OpKind::kSend ? "send" : "recv") + " #" +
         std::to_string(op.issueSeq) + " " + verb + "(" + std::to_string(op.count) + " x " +
         dataTypeName(op.dtype) + " " + direction + " peer " + std::to_string(op.peer) + ")";
}

// Posts a send into the (me -> peer) mailbox; returns its number there, or 0 when cancelled.
// Its proxy step waits on the GPU until the prologue is through, then in SendPeerWait while the
// receiver's mailbox is full; once posted (the sim's sends are eager) it waits in SendWait until
// the receiver has taken the data. (A state reached only when this host task looks would go
// stale while the task waits elsewhere, so a send never claims to wait on its peer once posted.)
uint64_t postSend(Operation& op, ProxyTransfer& transfer) {
  ncclComm* comm = op.comm;
  std::lock_guard<std::mutex> lock(comm->executionMutex);
  if (!prologue(op)) return 0;
  transfer.enter(nccl_profiler_abi::kProxyStepSendPeerWait);
  const uint64_t number = ++comm->sendsExecutedTo[op.peer];
  Mailbox* box = comm->segment.mailbox(comm->rank, op.peer);
  const bool space = waitOnSegment(
      comm, comm->cancelOps,
      [&] {
        return number - box->acked.load(std::memory_order_acquire) <=
               static_cast<uint64_t>(kMailboxDepth);
      },
      [&] {
        debugLine(p2pText(op, "Send", "to") + " waits: mailbox full, rank " +
                  std::to_string(op.peer) + " is not receiving");
      });
  if (!space) return 0;
  P2pPost& post = box->ring[(number - 1) % kMailboxDepth];
  post.bytes = op.count * dataTypeSize(op.dtype);
  post.count = op.count;
  post.dtype = op.dtype;
  post.issueSeq = op.issueSeq;
  post.source = op.send;
  box->posted.store(number, std::memory_order_release);
  comm->segment.notifyAll();
  transfer.enter(nccl_profiler_abi::kProxyStepSendWait);
  return number;
}

bool awaitSendAck(Operation& op, uint64_t number, ProxyTransfer& transfer) {
  ncclComm* comm = op.comm;
  Mailbox* box = comm->segment.mailbox(comm->rank, op.peer);
  const bool acked = waitOnSegment(
      comm, comm->cancelOps, [&] { return box->acked.load(std::memory_order_acquire) >= number; },
      [&] {
        debugLine(p2pText(op, "Send", "to") + " waits: rank " + std::to_string(op.peer) +
                  " has not received");
      });
  if (!acked) return false;
  transfer.endStep();
  return true;
}

bool runRecv(Operation& op) {
  namespace abi = nccl_profiler_abi;
  ncclComm* comm = op.comm;
  std::lock_guard<std::mutex> lock(comm->executionMutex);
  const uint64_t number = comm->recvsExecutedFrom[op.peer] + 1;
  Mailbox* box = comm->segment.mailbox(op.peer, comm->rank);
  auto sent = [&] { return box->posted.load(std::memory_order_acquire) >= number; };
  // The receive is posted at once and waits for the sender's data; a stalled GPU then never
  // consumes it.
  ProxyTransfer transfer(op, op.peer, false, kP2pSteps);
  transfer.beginStep(abi::kProxyStepRecvWait);
  if (op.stall && transfer.active()) {
    if (!waitOnSegment(comm, comm->cancelOps, sent, [] {})) return false;
    transfer.enter(abi::kProxyStepRecvFlushWait);
    transfer.enter(abi::kProxyStepRecvGpuWait);
  }
  if (!prologue(op)) return false;
  comm->recvsExecutedFrom[op.peer] = number;
  const std::string what = p2pText(op, "Recv", "from");
  const bool posted = waitOnSegment(comm, comm->cancelOps, sent, [&] {
    debugLine(what + " waits: rank " + std::to_string(op.peer) + " has not sent");
  });
  if (!posted) return false;
  transfer.enter(abi::kProxyStepRecvFlushWait);
  const P2pPost post = box->ring[(number - 1) % kMailboxDepth];
  const uint64_t wanted = op.count * dataTypeSize(op.dtype);
  uint64_t bytes = wanted;
  if (post.bytes != wanted) {
    if (!simConfig().mismatchCorrupt) {
      debugLine(what + " waits: size mismatch with rank " + std::to_string(op.peer) + " Send(" +
                std::to_string(post.count) + " x " +
                dataTypeName(static_cast<ncclDataType_t>(post.dtype)) + ")");
      waitForever(comm);
      return false;
    }
    bytes = std::min(post.bytes, wanted);
  }
  if (bytes > 0) {
    std::string error;
    const void* source = mapHeapRef(post.source, &error);
    if (!source) {
      debugLine(what + " cannot read the sender's buffer: " + error);
      waitForever(comm);
      return false;
    }
    std::memcpy(op.recvPtr, source, std::min<uint64_t>(bytes, post.source.bytesToEnd));
  }
  transfer.enter(abi::kProxyStepRecvGpuWait);
  box->acked.store(number, std::memory_order_release);
  comm->segment.notifyAll();
  transfer.endStep();
  return true;
}

void finishOperation(Operation& op) {
  ncclComm* comm = op.comm;
  {
    std::lock_guard<std::mutex> lock(comm->outstandingMutex);
    --comm->outstandingOps;
    comm->outstandingChanged.notify_all();
  }
  releaseComm(comm);
}

// The host function, one per ungrouped operation or group: NCCL's group order, so that send/recv
// rings inside a group cannot deadlock: post every send, run the collectives in order, run every
// receive, then wait for the sends.
void CUDART_CB runTask(void* data) {
  Task* task = static_cast<Task*>(data);
  if (task->persistent) {
    // A replay of a captured group: counted as outstanding while it runs, and its Coll/P2p
    // events come now when NCCL would run them from its host callback at every replay.
    for (Operation& op : task->ops) {
      retainComm(op.comm);
      std::lock_guard<std::mutex> lock(op.comm->outstandingMutex);
      ++op.comm->outstandingOps;
    }
    profilerLaunch(task->ops, task->stream, true, true);
  }
  // The group's kernel starts on its channels (the profiler's KernelCh events).
  for (Operation& op : task->ops) profilerKernelStart(op);
  struct PostedSend {
    Operation* op;
    uint64_t number;
    std::unique_ptr<ProxyTransfer> transfer;
  };
  std::vector<PostedSend> postedSends;
  for (Operation& op : task->ops) {
    if (op.kind != OpKind::kSend) continue;
    RunningScope running(op.comm);
    auto transfer = std::make_unique<ProxyTransfer>(op, op.peer, true, kP2pSteps);
    transfer->beginStep(nccl_profiler_abi::kProxyStepSendGpuWait);
    if (const uint64_t number = postSend(op, *transfer)) {
      postedSends.push_back({&op, number, std::move(transfer)});
    }
  }
  for (Operation& op : task->ops) {
    if (op.kind != OpKind::kCollective) continue;
    RunningScope running(op.comm);
    runCollective(op);
  }
  for (Operation& op : task->ops) {
    if (op.kind != OpKind::kRecv) continue;
    RunningScope running(op.comm);
    runRecv(op);
  }
  for (PostedSend& send : postedSends) {
    RunningScope running(send.op->comm);
    awaitSendAck(*send.op, send.number, *send.transfer);
    send.transfer.reset();
  }
  for (Operation& op : task->ops) profilerKernelStop(op);
  for (Operation& op : task->ops) finishOperation(op);
  if (!task->persistent) delete task;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

ncclResult_t launchTask(std::vector<Operation> ops, cudaStream_t stream) {
  auto* task = new Task{stream, std::move(ops), capturing(stream)};
  if (!task->persistent) {
    for (Operation& op : task->ops) {
      std::lock_guard<std::mutex> lock(op.comm->outstandingMutex);
      ++op.comm->outstandingOps;
      if (op.kind == OpKind::kCollective) op.issueOrdinal = ++op.comm->launchedCollectives;
    }
  }
  // Coll/P2p events: before the task can run and start its kernel.
  profilerLaunch(task->ops, stream, task->persistent, false);
  const cudaError_t error = cudaLaunchHostFunc(stream, runTask, task);
  if (error != cudaSuccess) {
    if (task->persistent) {
      for (Operation& op : task->ops) releaseComm(op.comm);
    } else {
      for (Operation& op : task->ops) {
        endTurn(op);  // never runs: the collectives launched after it must not wait for it
        finishOperation(op);
      }
    }
    delete task;
    return fail(ncclUnhandledCudaError,
                std::string("cudaLaunchHostFunc failed: ") + cudaGetErrorString(error));
  }
  return ncclSuccess;
}

// ----- argument checks at issue -----

ncclResult_t locate(const void* pointer, uint64_t bytes, const char* caller, const char* which,
                    HeapRef* ref) {
  if (bytes == 0) return ncclSuccess;
  cudasimHeapRef found{};
  if (pointer == nullptr || cudasimHeapLocate(pointer, &found) != 0) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": " + which +
                    " is not device memory (allocate it with cudaMalloc or ncclMemAlloc)");
  }
  if (found.bytesToEnd < bytes) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": " + which + " is smaller than the operation needs (" +
                    std::to_string(found.bytesToEnd) + " < " + std::to_string(bytes) + " bytes)");
  }
  ref->pid = found.pid;
  ref->fd = found.fd;
  ref->offset = found.offset;
  ref->bytesToEnd = found.bytesToEnd;
  return ncclSuccess;
}

ncclResult_t checkIssue(ncclComm* comm, ncclDataType_t dtype, const char* caller) {
  if (ncclResult_t r = checkCommUsable(comm, caller); r != ncclSuccess) return r;
  if (comm->revoked.load())
    return fail(ncclInvalidUsage, std::string(caller) + ": communicator was revoked");
  if (dataTypeSize(dtype) == 0)
    return fail(ncclInvalidArgument, std::string(caller) + ": invalid datatype");
  return ncclSuccess;
}

ncclResult_t resolveRedOp(ncclComm* comm, ncclRedOp_t redop, ncclDataType_t dtype,
                          const char* caller, Operation* op) {
  if (redop >= ncclSum && redop < ncclNumOps) return ncclSuccess;
  std::lock_guard<std::mutex> lock(comm->redOpMutex);
  const size_t index = static_cast<size_t>(redop) - ncclNumOps;
  if (redop < ncclNumOps || index >= comm->preMulSumOps.size() ||
      !comm->preMulSumOps[index].inUse) {
    return fail(ncclInvalidArgument, std::string(caller) + ": invalid reduction op");
  }
  const PreMulSumOp& custom = comm->preMulSumOps[index];
  if (custom.dtype != dtype) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": PreMulSum op was created for another datatype");
  }
  if (custom.onDevice)
    op->scalarDevice = custom.devicePointer;
  else
    op->scalar = custom.hostValue;
  return ncclSuccess;
}

ncclResult_t issue(Operation&& op, cudaStream_t stream) {
  op.issueSeq = nextIssueSeq(op.comm);
  applyCrashFault(op.comm, op.issueSeq);
  faultsForOperation(op.comm, op.issueSeq, &op);
  profilerApiCall(op, stream, tGroup.depth);
  if (tGroup.depth > 0 || op.profile.mask == 0) return submitOperation(std::move(op), stream);
  // A bare call is its own group: the GroupApi event it opened ends around the launch.
  profilerGroupEndEntry();
  const ncclResult_t result = submitOperation(std::move(op), stream);
  profilerGroupEndExit();
  return result;
}

ncclResult_t issueCollective(CollKind kind, const void* sendbuff, void* recvbuff, size_t count,
                             ncclDataType_t dtype, ncclRedOp_t redop, int root, ncclComm* comm,
                             cudaStream_t stream, const char* caller) {
  if (ncclResult_t r = checkIssue(comm, dtype, caller); r != ncclSuccess) return r;
  Operation op;
  op.comm = comm;
  op.kind = OpKind::kCollective;
  op.coll = kind;
  op.count = count;
  op.dtype = dtype;
  op.redop = collKindReduces(kind) ? redop : ncclSum;
  op.root = root;
  op.sendPtr = sendbuff;
  op.recvPtr = recvbuff;
  if (collKindHasRoot(kind) && (root < 0 || root >= comm->nranks)) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": root " + std::to_string(root) + " out of range");
  }
  if (collKindReduces(kind)) {
    if (ncclResult_t r = resolveRedOp(comm, redop, dtype, caller, &op); r != ncclSuccess) return r;
  }
  const uint64_t chunk = count * dataTypeSize(dtype);
  const uint64_t all = chunk * comm->nranks;
  const bool isRoot = comm->rank == root;
  uint64_t sendBytes = 0, recvBytes = 0;
  switch (kind) {
    case CollKind::kAllReduce:
      sendBytes = chunk;
      recvBytes = chunk;
      break;
    case CollKind::kBroadcast:
      sendBytes = isRoot ? chunk : 0;
      recvBytes = chunk;
      break;
    case CollKind::kReduce:
      sendBytes = chunk;
      recvBytes = isRoot ? chunk : 0;
      break;
    case CollKind::kAllGather:
      sendBytes = chunk;
      recvBytes = all;
      break;
    case CollKind::kReduceScatter:
      sendBytes = all;
      recvBytes = chunk;
      break;
    case CollKind::kAlltoAll:
      sendBytes = all;
      recvBytes = all;
      break;
    case CollKind::kGather:
      sendBytes = chunk;
      recvBytes = isRoot ? all : 0;
      break;
    case CollKind::kScatter:
      sendBytes = isRoot ? all : 0;
      recvBytes = chunk;
      break;
  }
  if (ncclResult_t r = locate(sendbuff, sendBytes, caller, "sendbuff", &op.send); r != ncclSuccess)
    return r;
  HeapRef recvRef;
  if (ncclResult_t r = locate(recvbuff, recvBytes, caller, "recvbuff", &recvRef); r != ncclSuccess)
    return r;
  if (sendBytes == 0 && sendbuff != nullptr) {
    // Non-roots pass a send buffer NCCL ignores; remember it only for corrupt-mode mismatches.
    cudasimHeapRef found{};
    if (cudasimHeapLocate(sendbuff, &found) == 0)
      op.send = HeapRef{found.pid, found.fd, found.offset, found.bytesToEnd};
  }
  return issue(std::move(op), stream);
}

ncclResult_t issueP2p(OpKind kind, const void* buffer, size_t count, ncclDataType_t dtype, int peer,
                      ncclComm* comm, cudaStream_t stream, const char* caller) {
  if (ncclResult_t r = checkIssue(comm, dtype, caller); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": peer " + std::to_string(peer) + " out of range");
  }
  Operation op;
  op.comm = comm;
  op.kind = kind;
  op.count = count;
  op.dtype = dtype;
  op.peer = peer;
  HeapRef ref;
  if (ncclResult_t r = locate(buffer, count * dataTypeSize(dtype), caller,
                              kind == OpKind::kSend ? "sendbuff" : "recvbuff", &ref);
      r != ncclSuccess) {
    return r;
  }
  if (kind == OpKind::kSend) {
    op.sendPtr = buffer;
    op.send = ref;
  } else {
    op.recvPtr = const_cast<void*>(buffer);
  }
  return issue(std::move(op), stream);
}

}  // namespace

int groupDepth() {
  return tGroup.depth;
}

void groupResetAfterFork() {
  // Only the forking thread survives; anything it had queued belongs to the parent's comms.
  tGroup.operations.clear();
  tGroup.inits.clear();
  tGroup.depth = 0;
}

void deferInitToGroupEnd(ncclComm* comm, std::function<ncclResult_t()> work) {
  tGroup.inits.push_back(DeferredInit{comm, std::move(work)});
}

ncclResult_t submitOperation(Operation op, cudaStream_t stream) {
  if (simConfig().instant) {
    // Complete at once: no rendezvous, no data; the profiler sees the kernel run at once too.
    profilerLaunch(std::span<Operation>(&op, 1), stream, false, false);
    if (op.profile.mask != 0) {
      profilerKernelStart(op);
      profilerKernelStop(op);
    }
    return ncclSuccess;
  }
  retainComm(op.comm);
  if (tGroup.depth > 0) {
    tGroup.operations.push_back({std::move(op), stream});
    return ncclSuccess;
  }
  std::vector<Operation> ops;
  ops.push_back(std::move(op));
  return launchTask(std::move(ops), stream);
}

void abortQueuedAndRunning(ncclComm* comm, int boundMs) {
  comm->cancelOps.store(true);
  if (comm->segment.header()) comm->segment.notifyAll();
  std::unique_lock<std::mutex> lock(comm->outstandingMutex);
  comm->outstandingChanged.wait_for(lock, std::chrono::milliseconds(boundMs),
                                    [&] { return comm->runningOps == 0; });
}

void waitOutstanding(ncclComm* comm) {
  std::unique_lock<std::mutex> lock(comm->outstandingMutex);
  comm->outstandingChanged.wait(lock,
                                [&] { return comm->outstandingOps == 0 || comm->aborted.load(); });
}

namespace {

// Makes `waiter` wait for the work queued so far on `producer`.
bool orderAfter(cudaStream_t waiter, cudaStream_t producer) {
  cudaEvent_t event;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return false;
  const bool ok = cudaEventRecord(event, producer) == cudaSuccess &&
                  cudaStreamWaitEvent(waiter, event, 0) == cudaSuccess;
  cudaEventDestroy(event);
  return ok;
}

ncclResult_t endGroup(bool launch, ncclSimInfo_t* simInfo) {
  if (tGroup.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--tGroup.depth > 0) return ncclSuccess;
  profilerGroupEndEntry();
  struct GroupApiEnd {  // whichever way this returns, the GroupApi event ends with the group
    ~GroupApiEnd() { profilerGroupEndExit(); }
  } groupApiEnd;
  std::vector<QueuedOperation> queued = std::move(tGroup.operations);
  std::vector<DeferredInit> inits = std::move(tGroup.inits);
  tGroup.operations.clear();
  tGroup.inits.clear();
  ncclResult_t result = ncclSuccess;
  if (!inits.empty()) result = runDeferredInits(inits);
  if (!launch) {
    // A rough model for ncclGroupSimulateEnd: 5 us per operation plus its bytes at 20 GB/s.
    double microseconds = 0;
    for (QueuedOperation& q : queued) {
      microseconds += 5.0 + static_cast<double>(q.op.count * dataTypeSize(q.op.dtype)) / 20e3;
      releaseComm(q.op.comm);
    }
    if (simInfo) simInfo->estimatedTime = static_cast<float>(microseconds);
    return result;
  }
  if (queued.empty()) return result;
  // Like NCCL, a group is one unit of work per GPU even when it spans streams: the operations of
  // one device run as one host task on its first stream, which first waits for the device's
  // other streams, and those then wait for it, as NCCL joins a group's streams. Separate tasks
  // per stream would let two ranks start the group's collectives in different orders. Devices
  // (ranks) stay separate tasks, so one thread can drive several ranks (ncclCommInitAll).
  std::vector<int> devices;
  for (QueuedOperation& q : queued) {
    if (std::find(devices.begin(), devices.end(), q.op.comm->cudaDevice) == devices.end()) {
      devices.push_back(q.op.comm->cudaDevice);
    }
  }
  for (int device : devices) {
    std::vector<cudaStream_t> streams;
    std::vector<Operation> ops;
    for (QueuedOperation& q : queued) {
      if (q.op.comm->cudaDevice != device) continue;
      if (std::find(streams.begin(), streams.end(), q.stream) == streams.end())
        streams.push_back(q.stream);
      ops.push_back(std::move(q.op));
    }
    const cudaStream_t first = streams.front();
    for (size_t i = 1; i < streams.size(); ++i) {
      if (!orderAfter(first, streams[i]))
        result = fail(ncclUnhandledCudaError, "ncclGroupEnd: cannot join streams");
    }
    if (ncclResult_t r = launchTask(std::move(ops), first); r != ncclSuccess) result = r;
    for (size_t i = 1; i < streams.size(); ++i) {
      if (!orderAfter(streams[i], first))
        result = fail(ncclUnhandledCudaError, "ncclGroupEnd: cannot join streams");
    }
  }
  return result;
}

}  // namespace
}  // namespace ncclsim

using namespace ncclsim;

NCCL_API(ncclResult_t, ncclGroupStart);
ncclResult_t ncclGroupStart() {
  ++tGroup.depth;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd);
ncclResult_t ncclGroupEnd() {
  return endGroup(true, nullptr);
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (simInfo && simInfo->magic != 0x74685283) {
    return fail(ncclInvalidArgument,
                "ncclGroupSimulateEnd: simInfo was not set with NCCL_SIM_INFO_INITIALIZER");
  }
  return endGroup(false, simInfo);
}

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return issueCollective(CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm,
                         stream, "ncclAllReduce");
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return issueCollective(CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root,
                         comm, stream, "ncclBroadcast");
}

NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  // Through the PLT like real NCCL, so an interposer sees ncclBcast and then ncclBroadcast.
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return issueCollective(CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm,
                         stream, "ncclReduce");
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return issueCollective(CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
                         comm, stream, "ncclAllGather");
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return issueCollective(CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0,
                         comm, stream, "ncclReduceScatter");
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return issueCollective(CollKind::kAlltoAll, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm,
                         stream, "ncclAlltoAll");
}

NCCL_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return issueCollective(CollKind::kGather, sendbuff, recvbuff, count, datatype, ncclSum, root,
                         comm, stream, "ncclGather");
}

NCCL_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return issueCollective(CollKind::kScatter, sendbuff, recvbuff, count, datatype, ncclSum, root,
                         comm, stream, "ncclScatter");
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return issueP2p(OpKind::kSend, sendbuff, count, datatype, peer, comm, stream, "ncclSend");
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return issueP2p(OpKind::kRecv, recvbuff, count, datatype, peer, comm, stream, "ncclRecv");
}

// The nccl*Config collectives of newer_api.cc (compiled against another nccl.h) reach the same
// path as the plain calls through this bridge.
namespace ncclsim::newer {

static_assert(
    static_cast<unsigned>(Collective::kAllReduce) == static_cast<unsigned>(CollKind::kAllReduce) &&
    static_cast<unsigned>(Collective::kBroadcast) == static_cast<unsigned>(CollKind::kBroadcast) &&
    static_cast<unsigned>(Collective::kReduce) == static_cast<unsigned>(CollKind::kReduce) &&
    static_cast<unsigned>(Collective::kAllGather) == static_cast<unsigned>(CollKind::kAllGather) &&
    static_cast<unsigned>(Collective::kReduceScatter) ==
        static_cast<unsigned>(CollKind::kReduceScatter) &&
    static_cast<unsigned>(Collective::kAlltoAll) == static_cast<unsigned>(CollKind::kAlltoAll) &&
    static_cast<unsigned>(Collective::kGather) == static_cast<unsigned>(CollKind::kGather) &&
    static_cast<unsigned>(Collective::kScatter) == static_cast<unsigned>(CollKind::kScatter));

int issueCollective(Collective kind, const void* sendbuff, void* recvbuff, size_t count, int dtype,
                    int redop, int root, void* comm, void* stream, const char* caller) {
  const auto coll = static_cast<CollKind>(static_cast<unsigned>(kind));
  // The plain calls pass ncclSum where the collective has no reduction, 0 where it has no root.
  const auto reduction = collKindReduces(coll) ? static_cast<ncclRedOp_t>(redop) : ncclSum;
  return ncclsim::issueCollective(coll, sendbuff, recvbuff, count,
                                  static_cast<ncclDataType_t>(dtype), reduction,
                                  collKindHasRoot(coll) ? root : 0, static_cast<ncclComm*>(comm),
                                  static_cast<cudaStream_t>(stream), caller);
}

}  // namespace ncclsim::newer
