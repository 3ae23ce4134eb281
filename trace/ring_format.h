// The ring file's header (docs/format.md): a fixed 16 KiB region at offset 0, then `capacity`
// CallRecord slots. The file is a MAP_SHARED mapping of the process that writes it, so it is
// the trace itself and survives SIGKILL and segfaults. In continuous mode segments of persisted
// records follow the slots, appended by a background writer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "trace/record.h"

namespace ncclwatch::trace {

inline constexpr char kRingMagic[8] = {'N', 'C', 'C', 'L', 'W', 'T', 'C', 'H'};
inline constexpr uint32_t kRingFormatVersion = 1;
inline constexpr uint32_t kRingHeaderBytes = 16384;
inline constexpr uint32_t kCommTableCapacity = 96;
inline constexpr uint32_t kMinRingCapacity = 16;
inline constexpr uint32_t kMaxRingCapacity = 1u << 24;

// RingHeader::traceMode. Values are part of the file format.
enum class TraceMode : uint32_t {
  kRing = 0,  // only the ring: the newest `capacity` records
  kFull = 1,  // continuous: segments after the ring keep every record persisted in time
};

// One communicator as this process knows it. 128 bytes.
struct CommInfo {
  uint64_t commHash;
  uint64_t parentHash;   // 0 for root communicators
  uint64_t commPointer;  // ncclComm_t in the writing process, to join with other tools
  int64_t createdNs;     // CLOCK_MONOTONIC
  int32_t nranks;
  int32_t rank;
  int32_t device;
  int32_t color;        // split colour, -1 when not a split child
  int32_t splitIndex;   // the parent's split counter for this child, 0 otherwise
  int32_t shrinkIndex;  // ncclwatch's own counter of shrinks of the parent (NCCL's hash collides)
  uint8_t kind;         // OpKind that created it: kInit, kSplit or kShrink
  uint8_t reserved[3];
  uint32_t flags;
  char name[64];  // ncclConfig_t commName, truncated
};
static_assert(sizeof(CommInfo) == 128);

// How a process saw its NCCL calls (RingHeader::recordingSources bits).
enum RecordingSource : uint32_t {
  kSourceInterposer = 1u << 0,  // the LD_PRELOAD wrappers
  kSourcePlugin = 1u << 1,      // NCCL's profiler-plugin events
};

// States of an operation's kernel as the plugin's KernelCh events tell (WaitNote::kernel).
enum class KernelState : uint8_t {
  kUnknown = 0,     // no KernelCh events (plugin absent, or the mask lacks them)
  kNotStarted = 1,  // no channel has started: the GPU has not reached the operation
  kRunning = 2,     // some channel started, not every started channel stopped
  kStopped = 3,     // every channel stopped
};

// Where one pending call waits inside NCCL: its kernel's channels and, when NCCL reports
// network proxy progress, the step that waits longest. 64 bytes.
struct WaitNote {
  uint64_t commHash;
  uint64_t seq;            // the call's seq on the comm (ours)
  uint64_t ncclSeqNumber;  // NCCL's per-type counter, as the record holds it
  int64_t sinceNs;         // CLOCK_MONOTONIC: when the step entered `stepState` (else the
                           // kernel its state)
  int64_t updatedNs;       // CLOCK_MONOTONIC: when the note was written
  int32_t channel;         // the waiting step's channel, or a started channel; -1 unknown
  int32_t peer;            // the step's peer rank on the comm; -1 unknown
  int32_t step;            // the step number; -1 when no proxy step is known
  uint8_t stepState;       // NCCL's profiler state number (8-12, 20); 0 none
  uint8_t isSend;          // 1: the step sends to `peer`; 0: receives from it
  KernelState kernel;
  uint8_t channelsStarted;
  uint8_t channelsStopped;
  uint8_t nChannels;  // as NCCL announced for the operation; 0 unknown
  uint8_t reserved[2];
  // waitNoteCheck of the bytes above, so that a reader can keep the whole notes of a table its
  // writer ended inside; 0: not checked (empty entries, files before session 22).
  uint32_t check;
};
static_assert(sizeof(WaitNote) == 64);
static_assert(offsetof(WaitNote, check) == 60);
inline constexpr uint32_t kWaitNoteCapacity = 32;
// FNV-1a of a note's first 60 bytes, never 0 (0 in `check` means unchecked).
uint32_t waitNoteCheck(const WaitNote& note);
// "SendPeerWait", "RecvWait", ... for a WaitNote::stepState; "" for 0 and unknown numbers.
const char* proxyStepStateName(uint8_t state);
// How much a step in `state` says about why its call waits, for choosing one to report: 3 for
// states that point at a cause (waiting on the own GPU, on the peer's data or on its credit),
// 2 for the GPU consuming received data, 1 for a posted transfer waiting to complete (a
// consequence of a wait elsewhere), 0 for no wait.
int proxyWaitWeight(uint8_t state);
// "kernel running (2 of 2 channels started); channel 0 proxy step 3 SendGPUWait toward peer 2
// for 1.2 s" for a note; `nowNs` on the note's clock (the writer's CLOCK_MONOTONIC).
std::string describeWait(const WaitNote& note, int64_t nowNs);

// The header's fixed fields. Counters written while the process runs are 64-bit aligned so that
// the writer can update them with atomic operations on the mapping.
struct RingHeader {
  char magic[8];
  uint32_t formatVersion;
  uint32_t headerBytes;
  uint32_t recordBytes;
  uint32_t capacity;  // slots, a power of two
  int32_t pid;
  int32_t rank;               // -1 until known
  int32_t world;              // -1 until known
  int32_t localRank;          // -1 until known
  int64_t anchorMonotonicNs;  // one clock reading pair taken at open ...
  int64_t anchorRealtimeNs;   // ... to map record times to wall-clock time
  int32_t ncclVersion;        // 0 until known
  uint32_t commCount;         // entries used in the table (at most kCommTableCapacity)
  uint64_t nextIndex;         // records reserved so far; slot = index % capacity
  uint64_t droppedComms;      // communicators that did not fit in the table
  uint64_t droppedRecords;    // records not written (full-trace writer behind)
  uint32_t cleanShutdown;     // 1 once the process ended normally
  uint32_t traceMode;         // TraceMode (was reserved: 0, ring, in older files)
  char host[64];
  char ncclLibrary[256];  // path of the real libnccl in use
  char jobId[64];
  // Continuous mode (atomic, written by the persisting thread): every ring index below
  // persistedRecords is in a segment or counted in droppedRecords; the segments written so far
  // end at file offset persistedBytes (0 while there is none).
  uint64_t persistedRecords;
  uint64_t persistedBytes;
  // Set by the fatal-signal handler (async-signal-safe stores): the signal that ended the
  // process and the thread that took it; 0 otherwise.
  int32_t fatalSignal;
  int32_t fatalThread;
  // RecordingSource bits: how this process saw its NCCL calls (0 in files before the plugin).
  uint32_t recordingSources;
  // Seqlock word of `waits` (odd while the watchdog rewrites it): a reader copies the table
  // between two equal even reads.
  uint32_t waitsVersion;
  CommInfo comms[kCommTableCapacity];
  // Where pending calls wait inside NCCL, as the profiler plugin last saw it (watchdog thread);
  // empty entries have commHash 0. Files written before the plugin have zeros here.
  WaitNote waits[kWaitNoteCapacity];
  // Storage trouble the writer met and survived (zeros in files written before these fields):
  // dump and call-site blocks that could not be appended (disk full, file gone), segment
  // writes that failed (their records were retried, or later counted in droppedRecords), and
  // pages of this mapping that faulted (SIGBUS: file truncated or its disk gone) and were
  // replaced by anonymous memory, after which the file no longer follows the process.
  uint64_t unwrittenBlocks;
  uint64_t failedSegmentWrites;
  uint32_t mappingFaults;
  uint32_t storageReserved;  // 0
  // The status the process passed to exit() (glibc's on_exit; Python exits 1 after an uncaught
  // exception), when exitStatusKnown is 1: a process that ended "normally" may have failed.
  // Zeros in files written before session 18 and in processes that never reached exit().
  int32_t exitStatus;
  uint32_t exitStatusKnown;
  // NCCL's own words for the newest failed call (ncclGetLastError on the failing thread, right
  // after the call returned): lastErrorIndex is that call's ring index + 1 (0: none; all ones
  // while a thread writes the text, so a reader drops what it copied then). Zeros in files
  // before session 22.
  uint64_t lastErrorIndex;
  char lastError[256];
};
static_assert(offsetof(RingHeader, droppedRecords) == 80);
static_assert(offsetof(RingHeader, traceMode) == 92);
static_assert(offsetof(RingHeader, host) == 96);
static_assert(offsetof(RingHeader, jobId) == 416);
static_assert(offsetof(RingHeader, persistedRecords) == 480);
static_assert(offsetof(RingHeader, persistedBytes) == 488);
static_assert(offsetof(RingHeader, fatalSignal) == 496);
static_assert(offsetof(RingHeader, recordingSources) == 504);
static_assert(offsetof(RingHeader, comms) == 512);
static_assert(offsetof(RingHeader, waits) == 512 + kCommTableCapacity * sizeof(CommInfo));
static_assert(offsetof(RingHeader, unwrittenBlocks) ==
              512 + kCommTableCapacity * sizeof(CommInfo) + kWaitNoteCapacity * sizeof(WaitNote));
static_assert(offsetof(RingHeader, exitStatus) == offsetof(RingHeader, storageReserved) + 4);
static_assert(offsetof(RingHeader, lastErrorIndex) == 14880);
inline constexpr uint64_t kLastErrorWriting = ~uint64_t{0};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);
static_assert(std::is_trivially_copyable_v<RingHeader>);

// The job id's text: NUL-padded in its 64 bytes, with no NUL when it fills them.
inline std::string_view jobIdOf(const RingHeader& header) {
  return {header.jobId, strnlen(header.jobId, sizeof header.jobId)};
}

// Continuous mode: segments follow the ring slots back to back, from file offset
// kRingHeaderBytes + capacity * sizeof(CallRecord). Each is a SegmentHeader and then
// `recordCount` records with the consecutive ring indices firstIndex, firstIndex + 1, ... Every
// segment's size is a multiple of 32 bytes, so a reader can resynchronize on 32-byte steps.
inline constexpr char kSegmentMagic[8] = {'N', 'W', 'S', 'E', 'G', 'M', 'N', 'T'};
inline constexpr uint32_t kMaxSegmentRecords = 1u << 16;

struct SegmentHeader {
  char magic[8];
  uint64_t firstIndex;   // ring index of the first record
  uint32_t recordCount;  // 1 .. kMaxSegmentRecords
  uint32_t reserved;     // 0
  uint64_t checksum;     // segmentChecksum() of firstIndex, recordCount and the records
};
static_assert(sizeof(SegmentHeader) == 32);
static_assert(sizeof(CallRecord) % sizeof(SegmentHeader) == 0);
static_assert(std::is_trivially_copyable_v<SegmentHeader>);

// 64-bit checksums of blocks after the ring: every step (xor a word, rotate, multiply by an odd
// constant) is a bijection, so any change confined to one 8-byte word always changes the result.
inline uint64_t checksumStep(uint64_t hash, uint64_t word) {
  hash ^= word;
  hash = (hash << 27) | (hash >> 37);
  return hash * 0x9e3779b97f4a7c15ull;
}
inline uint64_t checksumWords(uint64_t hash, const void* data, size_t words) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < words; ++i) {
    uint64_t word;
    std::memcpy(&word, bytes + i * 8, sizeof word);
    hash = checksumStep(hash, word);
  }
  return hash ^ (hash >> 31);
}

// A segment's: of firstIndex, recordCount and the records.
inline uint64_t segmentChecksum(uint64_t firstIndex, uint32_t recordCount, const void* records) {
  uint64_t hash = checksumStep(checksumStep(0x6e77736567637263ull, firstIndex), recordCount);
  return checksumWords(hash, records, static_cast<size_t>(recordCount) * (sizeof(CallRecord) / 8));
}

// Dump blocks (trace/dump.h) share the space after the ring with segments, in either mode: a
// DumpHeader, then `textBytes` of dump text, zero-padded to a multiple of 32 bytes.
inline constexpr char kDumpMagic[8] = {'N', 'W', 'D', 'U', 'M', 'P', 'V', '1'};
inline constexpr uint64_t kMaxDumpBytes = 16u << 20;

struct DumpHeader {
  char magic[8];
  uint64_t textBytes;  // 1 .. kMaxDumpBytes
  uint64_t checksum;   // dumpChecksum() of the padded text
  uint64_t reserved;   // 0
};
static_assert(sizeof(DumpHeader) == sizeof(SegmentHeader));

// Python call sites (trace/python_sites.h) travel in blocks of the dump's shape with this magic.
inline constexpr char kSitesMagic[8] = {'N', 'W', 'S', 'I', 'T', 'E', 'S', '1'};
inline uint64_t paddedDumpBytes(uint64_t textBytes) {
  return (textBytes + sizeof(DumpHeader) - 1) / sizeof(DumpHeader) * sizeof(DumpHeader);
}
inline uint64_t dumpChecksum(uint64_t textBytes, const void* paddedText) {
  return checksumWords(checksumStep(0x6e7764756d706d70ull, textBytes), paddedText,
                       paddedDumpBytes(textBytes) / 8);
}

}  // namespace ncclwatch::trace
