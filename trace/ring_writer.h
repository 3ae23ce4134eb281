// Writes the ring file from inside the traced process. Opening allocates and does I/O; after
// that, append() and update() are lock-free plain stores into the shared mapping: no
// allocation, no lock, no system call, so they may run on an application's hot path.
//
// Continuous mode (NCCLWATCH_TRACE=full) adds one background duty: persistSegments(), called
// from one background thread, copies records from the ring to segments appended to the file, so
// that the whole run is kept. The hot path is the same in both modes.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trace/ring_format.h"

namespace ncclwatch::trace {

namespace detail {

// Seqlock write of a slot: odd while inside, the next even value once done.
template <typename Body>
inline void writeSlot(CallRecord* slot, Body body) {
  auto version = std::atomic_ref<uint32_t>(slot->slotVersion);
  uint32_t before = version.load(std::memory_order_relaxed);
  // A writer that died inside left an odd value: step past it, staying odd.
  uint32_t inside = (before & 1u) ? before + 2 : before + 1;
  version.store(inside, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  body();
  version.store(inside + 1, std::memory_order_release);
}

// A slot's contents are stored and loaded with relaxed atomic operations: plain moves on every
// target, but a persisting thread that copies a slot while an application thread rewrites it
// then reads torn values only (which the seqlock discards), never races in the C++ sense, and
// thread sanitizer agrees. Layout: 14 words of fields, 4 bytes of small fields, slotVersion,
// ringIndex.
inline constexpr size_t kBodyWords = offsetof(CallRecord, redop) / 8;
static_assert(offsetof(CallRecord, redop) == kBodyWords * 8);
static_assert(offsetof(CallRecord, slotVersion) == offsetof(CallRecord, redop) + 4);
static_assert(offsetof(CallRecord, ringIndex) == 120);

inline uint64_t* words(CallRecord* slot) {
  return reinterpret_cast<uint64_t*>(slot);
}
inline uint32_t* smallFields(CallRecord* slot) {
  return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(slot) + offsetof(CallRecord, redop));
}

// Every field but slotVersion and ringIndex.
inline void storeBody(CallRecord* slot, const CallRecord& record) {
  const auto* source = reinterpret_cast<const unsigned char*>(&record);
#pragma GCC unroll 16
  for (size_t i = 0; i < kBodyWords; ++i) {
    uint64_t word;
    std::memcpy(&word, source + i * 8, sizeof word);
    std::atomic_ref<uint64_t>(words(slot)[i]).store(word, std::memory_order_relaxed);
  }
  uint32_t small;
  std::memcpy(&small, &record.redop, sizeof small);
  std::atomic_ref<uint32_t>(*smallFields(slot)).store(small, std::memory_order_relaxed);
}

}  // namespace detail

struct ProcessInfo {
  int rank = -1;
  int world = -1;
  int localRank = -1;
  std::string host;
  std::string jobId;
};

struct RingOptions {
  uint32_t capacity = 32768;  // slots; rounded as ringCapacityFor() says
  TraceMode mode = TraceMode::kRing;
};

class RingWriter {
 public:
  RingWriter() = default;
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Creates `path` (mode 0600; its folder must exist) sized for `capacity` records (rounded up
  // to a power of two within [kMinRingCapacity, kMaxRingCapacity]) and reserves every block of
  // it before mapping it, so that no store into the mapping can fault for want of space. False
  // with a one-line `error` naming the file on failure (nothing is left behind).
  bool open(const std::string& path, const RingOptions& options, const ProcessInfo& info,
            std::string* error);
  // Ring mode (TraceMode::kRing).
  bool open(const std::string& path, uint32_t capacity, const ProcessInfo& info,
            std::string* error);
  // The same ring in anonymous memory, for when no file can be kept: every reader in this
  // process (watchdog, dumps, collector link) works as with a file; path() is empty.
  void openInMemory(const RingOptions& options, const ProcessInfo& info);
  bool isOpen() const { return header_ != nullptr; }
  // True once the ring lives in memory only: opened so, or its file's pages faulted.
  bool memoryOnly() const { return memoryOnly_.load(std::memory_order_acquire); }
  // What the file missed: dump and call-site blocks not written, segment writes that failed,
  // pages that faulted. Kept in the process too, since the header may be gone.
  struct Losses {
    uint64_t unwrittenBlocks = 0;
    uint64_t failedSegmentWrites = 0;
    uint64_t droppedRecords = 0;
    uint32_t mappingFaults = 0;
  };
  Losses losses() const;

  // From a SIGBUS handler (async-signal-safe): when `address` lies in the mapping of this
  // process's open ring file, replaces the pages that cannot be backed any more (past the
  // file's end, or the faulting page) with anonymous memory, counts it, says so once on
  // stderr and returns true: returning from the handler retries the store. False for any
  // other address.
  static bool recoverFault(const void* address);
  const std::string& path() const { return path_; }
  uint32_t capacity() const { return capacity_; }
  bool continuous() const { return continuous_; }

  // Appends a copy of `record` (its slotVersion and ringIndex are set here) and returns its
  // ring index, which later updates refer to. Inline: the recorder's hot path builds the record
  // in registers and stores it straight into the slot.
  uint64_t append(const CallRecord& record) {
    uint64_t index =
        std::atomic_ref<uint64_t>(header_->nextIndex).fetch_add(1, std::memory_order_relaxed);
    CallRecord* target = slot(index);
    detail::writeSlot(target, [&] {
      detail::storeBody(target, record);
      std::atomic_ref<uint64_t>(target->ringIndex).store(index, std::memory_order_relaxed);
    });
    // The next record's slot, asked for in the state a store needs: the next call finds its two
    // cache lines owned instead of waiting on a read-for-ownership of each (a slot was last
    // written a whole ring ago and is out of this core's caches). A hint: it never faults, and
    // another thread taking that slot first only makes it useless. prefetchw where the build
    // targets it (-mprfchw), else a read prefetch (exclusive when no other core holds the line).
    const char* next = reinterpret_cast<const char*>(slot(index + 1));
    __builtin_prefetch(next, 1, 3);
    __builtin_prefetch(next + 64, 1, 3);
    return index;
  }

  // Changes the state of record `index` if it has not been overwritten since; false if it was.
  bool updateState(uint64_t index, RecordState state, int64_t startNs, int64_t completeNs);

  // Sets and clears RecordFlags bits of record `index`, if it has not been overwritten.
  bool updateFlags(uint64_t index, uint8_t set, uint8_t clear);

  // Stores the ncclResult_t a call returned, if record `index` has not been overwritten.
  bool updateResult(uint64_t index, int32_t result);

  // Records a communicator in the header's table; counts it as dropped when the table is full.
  void addComm(const CommInfo& comm);
  void setRank(int rank, int world, int localRank);
  void setNcclLibrary(int version, const std::string& path);
  // In continuous mode, first persists every record left (persistSegments(true)).
  void markCleanShutdown();
  // The status the process passed to exit(), from the watchdog's exit handler (before the
  // destructor that marks the clean shutdown).
  void setExitStatus(int status);
  // This process sees NCCL calls through `source` too (header recordingSources, atomic or).
  void addRecordingSource(RecordingSource source);
  // Replaces the header's wait notes (at most kWaitNoteCapacity; the rest are left out). One
  // writer only: the watchdog thread.
  void writeWaits(std::span<const WaitNote> notes);
  // NCCL's message for the failed call at ring `index` (any thread; a failure path, never the hot
  // one). A thread that finds another one writing leaves the text to it; the text already kept
  // stays with its call (NCCL's last error outlives the failure that set it).
  void noteLastError(uint64_t index, const char* text);
  // From a fatal-signal handler: async-signal-safe (two atomic stores into the mapping).
  void noteFatalSignal(int signal, int threadId);
  // Records reserved so far (the next record's ring index).
  uint64_t nextIndex() const;
  // The communicator table as it stands, and the header (for its identity fields).
  std::vector<CommInfo> comms() const;
  // How many communicators the table holds, without copying it (the watchdog asks every poll).
  uint32_t commCount() const;
  const RingHeader* header() const { return header_; }
  // The record at ring `index` as it stands, if the slot still holds it (a stable copy).
  bool read(uint64_t index, CallRecord* record) const;
  // The callSite and threadId of ring index `index`'s slot as they stand (relaxed loads of their
  // words, no stable copy: the slot may hold another index or be mid-write). Zeros before the
  // ring is open.
  void callerAt(uint64_t index, uint64_t* callSite, int32_t* threadId) const;

  // Continuous mode: appends the records not yet persisted to segments after the ring
  // (pwrite: the file grows) and returns how many records it wrote; 0 in ring mode. Call it
  // from one background thread, every ~100 ms or more often; calls are serialized. It walks
  // ring indices in order from the persist cursor and stops at the first record it must not
  // take yet. A record is taken once final (completed, failed, aborted, or still issued with
  // kRecordNoEvents / kRecordCaptured and issued more than kNoEventsGraceNs ago, so that a
  // failing call's result lands first), or unconditionally once the ring is more than half a
  // capacity ahead of it, or when `everything` is set. Records the ring overwrote before they
  // were taken are added to the header's droppedRecords. Never on the hot path: it locks,
  // reads the clock and writes the file.
  size_t persistSegments(bool everything = false);
  // Appends a dump block (trace/dump.h text) after the ring and any segments, in either mode.
  // False when the file cannot be written. Serialized with persistSegments(); never on the hot
  // path.
  bool appendDump(std::string_view text);
  // Appends a block of Python call sites (trace/python_sites.h text), like a dump.
  bool appendSites(std::string_view text);
  // Ring indices below this are persisted or dropped (the header's persistedRecords).
  uint64_t persistedRecords() const;
  static constexpr int64_t kNoEventsGraceNs = 1'000'000'000;
  static constexpr uint32_t kSegmentRecords = 1024;  // at most, per segment the writer appends

  // In a fork() child: drop the mapping without writing to it, so that the child never
  // writes into its parent's trace.
  void forgetAfterFork();
  // In continuous mode, persists every record left first. No persistSegments() call may run
  // or start while close() unmaps.
  void close();

 private:
  CallRecord* slot(uint64_t index) const { return &records_[index & (capacity_ - 1)]; }
  bool writeSegment(uint64_t firstIndex, uint32_t count);
  bool appendTextBlock(const char (&magic)[8], std::string_view text);
  void initializeHeader(const ProcessInfo& info, bool continuous);
  void replaceWithMemory(size_t offset, size_t bytes);
  void noteUnwrittenBlock();
  RingHeader* copiedHeader();
  RingHeader* header_ = nullptr;
  CallRecord* records_ = nullptr;
  size_t mappedBytes_ = 0;
  uint32_t capacity_ = 0;
  std::string path_;
  std::atomic<bool> memoryOnly_{false};
  std::string faultLine_;  // said once by the SIGBUS guard
  size_t pageBytes_ = 4096;
  // Restores the header's identity after its page faulted: written when the header changes
  // (never on the hot path), read by the SIGBUS handler.
  std::vector<std::byte> headerCopy_;
  WaitNote writtenWaits_[kWaitNoteCapacity]{};     // the header's wait notes as last written
  mutable std::atomic<uint64_t> lastSeenNext_{0};  // nextIndex() as background readers saw it
  std::atomic<uint64_t> unwrittenBlocks_{0};
  std::atomic<uint64_t> failedSegmentWrites_{0};
  std::atomic<uint32_t> mappingFaults_{0};
  std::atomic<int> faultLock_{0};  // one SIGBUS repair at a time
  size_t faultFloor_ = SIZE_MAX;   // offsets from here to the end are anonymous already
  // Continuous mode; all but fd_ and continuous_ belong to the persisting thread (persistMutex_).
  bool continuous_ = false;
  int fd_ = -1;
  std::mutex persistMutex_;
  uint64_t persistCursor_ = 0;      // next ring index to persist or drop
  uint64_t fileEnd_ = 0;            // where the next segment goes
  std::vector<std::byte> segment_;  // a SegmentHeader, then up to kSegmentRecords records
};

// Rounds to a power of two within the allowed range.
uint32_t ringCapacityFor(uint32_t requested);

}  // namespace ncclwatch::trace
