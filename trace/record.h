// The call record: one fixed-size, trivially copyable slot per NCCL call, written by the
// interposer on the hot path and read back from the ring file by the CLI.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

namespace ncclwatch::trace {

// Every NCCL host call ncclwatch records. Values are part of the file format: append only.
enum class OpKind : uint8_t {
  kUnknown = 0,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kGroupStart,
  kGroupEnd,
  kInit,
  kSplit,
  kShrink,
  kFinalize,
  kDestroy,
  kAbort,
  kRevoke,
  kRegister,
  kDeregister,
  // NCCL 2.29+ (values appended: older files keep theirs).
  kGrow,        // ncclCommGrow, recorded on the communicator that grows
  kPutSignal,   // one-sided: data into a peer's window, then a signal
  kSignal,      // one-sided: a signal alone
  kWaitSignal,  // waits on the stream for peers' signals
  kCount        // keep last
};

// issued → started → completed, or failed / aborted. Values are part of the file format.
enum class RecordState : uint8_t {
  kEmpty = 0,
  kIssued,
  kStarted,
  kCompleted,
  kFailed,
  kAborted,
};

// Flags of a record.
enum RecordFlags : uint8_t {
  kRecordCaptured = 1 << 0,  // issued during stream capture: no completion events
  kRecordInGroup = 1 << 1,   // issued between ncclGroupStart and ncclGroupEnd
  kRecordNoEvents = 1 << 2,  // completion not tracked (events off or unavailable)
  // Built from NCCL's profiler-plugin events (no LD_PRELOAD wrapper saw the call): the redop
  // is unknown (kRedopUnknown) and the call site is 0.
  kRecordFromPlugin = 1 << 3,
  // The plugin's KernelCh events tell this record's GPU start and completion.
  kRecordKernelTracked = 1 << 4,
  // With kRecordNoEvents: tracking was on but this call found no free event pair (calls outran
  // the watchdog's recycling), so it was shed; the analysis names it as untracked.
  kRecordShed = 1 << 5,
  // State started was inferred from stream order (one completion event per call): every earlier
  // tracked call on its stream completed, yet work queued on the stream outside NCCL may still
  // be ahead of it. Without the flag a started record's start was seen (its own start event).
  kRecordStartInferred = 1 << 6,
  // Made by ncclwatch itself, not the application: the abort that `run --abort` (the
  // collector) or NCCLWATCH_ON_HANG=abort asked for to end a hang. The offline analysis reads a
  // job as it was before such an abort, whatever the aborting rank had pending (a rank stuck
  // outside NCCL had nothing), and never takes it for the application's own ncclCommAbort.
  kRecordByNcclwatch = 1 << 7,
};

// CallRecord::redop when the call's reduction is not known (profiler events do not carry it).
inline constexpr uint8_t kRedopUnknown = 0xff;

const char* opName(OpKind op);
// Names of the NCCL enum values a record holds, as the CLI, dumps and verdicts print them.
const char* dtypeName(int dtype);  // ncclDataType_t: "float", "bfloat16", ...; "?" if unknown
int dtypeBytes(int dtype);         // bytes per element; 0 if unknown
std::string redopName(int redop);  // ncclRedOp_t: "sum", ...; "premulsum#N"; "?" unknown
const char* stateName(RecordState state);
// Inline: the recorder asks these on every call.
inline constexpr bool isCollective(OpKind op) {
  return op >= OpKind::kAllReduce && op <= OpKind::kScatter;
}
inline constexpr bool isPointToPoint(OpKind op) {
  return op == OpKind::kSend || op == OpKind::kRecv;
}
inline constexpr bool isLifecycle(OpKind op) {
  return (op >= OpKind::kInit && op <= OpKind::kRevoke) || op == OpKind::kGrow;
}
// NCCL 2.29's one-sided operations: stream-ordered like a send, but no peer posts a matching
// call, so they take no place in the communicator's sequence (seq 0).
inline constexpr bool isOneSided(OpKind op) {
  return op >= OpKind::kPutSignal && op <= OpKind::kWaitSignal;
}

// 128 bytes, naturally aligned, no padding holes: written with plain stores into a shared
// mapping and read by another process, so its layout is the file format (docs/format.md).
struct CallRecord {
  uint64_t commHash;       // NCCL's commHash of the communicator
  uint64_t seq;            // 1-based, per comm, over every operation issued on it
  uint64_t p2pSeq;         // 1-based, per (comm, peer, direction); 0 for non-p2p
  uint64_t ncclSeqNumber;  // NCCL's per-type counter (collectives or p2p), 0-based
  uint64_t count;          // elements
  uint64_t fingerprint;    // hash of (op, count, dtype, redop, root) or (op, peer, count, dtype)
  uint64_t rollingHash;    // over this comm's fingerprints up to and including this one
  uint64_t stream;         // cudaStream_t as an integer
  int64_t issueNs;         // CLOCK_MONOTONIC at the call
  int64_t startNs;         // first seen started (before-event complete), 0 if not yet
  int64_t completeNs;      // first seen completed (after-event complete), 0 if not yet
  uint64_t callSite;       // return address in the caller of the NCCL function
  int32_t rootOrPeer;      // root for rooted collectives, peer for p2p, -1 otherwise
  int32_t result;          // ncclResult_t the call returned
  int32_t threadId;        // gettid() of the caller
  uint16_t groupDepth;     // ncclGroupStart nesting at the call
  OpKind op;
  uint8_t dtype;  // ncclDataType_t
  uint8_t redop;  // ncclRedOp_t (values >= 5: PreMulSum handles)
  RecordState state;
  uint8_t flags;  // RecordFlags
  // Which ncclGroupStart/ncclGroupEnd of its thread it was issued in (the outermost pair's
  // serial, 1 to 255, wrapping): calls of one group run as one launch, calls of two adjacent
  // groups one after the other. 0: not in a group, or not known (the profiler plugin's records,
  // files before session 20, where the byte was reserved and zero).
  uint8_t groupSerial;
  // Seqlock word of the ring slot: odd while a writer is inside, even when stable, 0 if never
  // written. A reader copies the record between two equal even reads of it.
  uint32_t slotVersion;
  uint64_t ringIndex;  // absolute position in the ring: tells a record from a stale slot
};

static_assert(sizeof(CallRecord) == 128);
static_assert(std::is_trivially_copyable_v<CallRecord>);
static_assert(std::is_standard_layout_v<CallRecord>);

// A call ncclwatch made itself (kRecordByNcclwatch: the abort a verdict or the hang watchdog
// asked for), not the application.
inline bool madeByNcclwatch(const CallRecord& record) {
  return (record.flags & kRecordByNcclwatch) != 0;
}

// A call in its communicator's sequence, the one the analysis aligns (and a host's relay judges,
// tools/relay_fold.h): init and group marks are outside it.
inline bool isSequenced(const CallRecord& record) {
  return record.seq > 0 && record.op != OpKind::kInit && record.op != OpKind::kGroupStart &&
         record.op != OpKind::kGroupEnd;
}

}  // namespace ncclwatch::trace
