// The ring file's header (docs/format.md): a fixed 16 KiB region at offset 0, then `capacity`
// CallRecord slots. The file is a MAP_SHARED mapping of the process that writes it, so it is
// the trace itself and survives SIGKILL and segfaults.
#pragma once
#include <cstdint>
#include <type_traits>

#include "trace/record.h"

namespace ncclwatch::trace {

inline constexpr char kRingMagic[8] = {'N', 'C', 'C', 'L', 'W', 'T', 'C', 'H'};
inline constexpr uint32_t kRingFormatVersion = 1;
inline constexpr uint32_t kRingHeaderBytes = 16384;
inline constexpr uint32_t kCommTableCapacity = 96;
inline constexpr uint32_t kMinRingCapacity = 16;
inline constexpr uint32_t kMaxRingCapacity = 1u << 24;

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
  uint32_t reserved0;
  char host[64];
  char ncclLibrary[256];  // path of the real libnccl in use
  char jobId[64];
  uint8_t reserved1[512 - 480];
  CommInfo comms[kCommTableCapacity];
};
static_assert(offsetof(RingHeader, comms) == 512);
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);
static_assert(std::is_trivially_copyable_v<RingHeader>);

}  // namespace ncclwatch::trace
