// GPU completion of recorded calls. Each tracked call gets pooled, timing-disabled CUDA events on
// its stream; the watchdog thread polls them. Two modes (NCCLWATCH_EVENTS):
//  - one event per call (the default): "after", recorded behind NCCL's work. Complete → the call
//    finished on the GPU. Started is inferred from stream order: once every earlier tracked call
//    on the same stream completed, the stream has reached this call, unless work queued on the
//    stream outside NCCL (copies, kernels, waits on other streams' events) is still ahead of it;
//    such records carry kRecordStartInferred, and the texts say "reached", not "started".
//  - full: "before" is recorded ahead of NCCL's work as well. Complete → everything ahead of the
//    call on its stream finished: started is seen, not inferred. One more driver call per call.
//
// Application threads only take pairs from a lock-free free list (in chunks, into a per-thread
// stash) and push to a lock-free queue; every driver query, state change and pool growth
// happens on the watchdog thread.
#pragma once
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "trace/ring_writer.h"
#include "watchdog/bounded_queue.h"
#include "watchdog/driver_api.h"

namespace ncclwatch::watchdog {

using Ticket = uint32_t;  // a pooled event pair: (context slot << 16) | pair index
inline constexpr Ticket kNoTicket = UINT32_MAX;

enum class EventMode : uint8_t {
  kOff,   // no completion tracking
  kEnd,   // one event per tracked call, behind it; started is inferred from stream order
  kFull,  // two events per tracked call: started is seen
};

enum class StreamCheck : uint8_t {
  kTrackable,    // events may be recorded on it
  kCaptured,     // under stream capture: events would join the graph, so none are recorded
  kUntrackable,  // the driver refused to say (e.g. the legacy stream during a capture)
};

// A communicator's progress as the watchdog sees it after a poll.
struct CommProgress {
  uint64_t commHash = 0;
  size_t pending = 0;          // tracked calls not yet complete
  trace::CallRecord oldest{};  // the oldest of them (valid when pending > 0)
  bool oldestStarted = false;
  uint64_t completedSeq = 0;     // the highest seq seen complete
  int64_t lastCompletionNs = 0;  // when it was seen
  // The slowest issue-to-completion lately (decays by 1% a call), from its second completed call
  // on: the first one waits for the ranks' start skew (seconds under a loaded launcher) and for
  // NCCL's lazy connection set-up, and would raise the hang threshold (10 times this) for good.
  int64_t recentLatencyNs = 0;
  uint64_t completedCalls = 0;
};

struct CompletionCounters {
  std::atomic<uint64_t> tracked{0};       // records the poller took (from its queue)
  std::atomic<uint64_t> noPair{0};        // calls that found no free event pair (shed)
  std::atomic<uint64_t> queueFull{0};     // records the poller never heard of (queue full)
  std::atomic<uint64_t> recordErrors{0};  // cuEventRecord failures
  std::atomic<uint64_t> queryErrors{0};   // cuEventQuery errors other than not-ready
};

class CompletionTracker {
 public:
  static constexpr uint32_t kMaxContexts = 8;
  // Back-to-back small collectives (FSDP, tensor parallelism) issue hundreds of thousands of
  // calls a second; the poller recycles pairs every pass (1 ms while the pool is under
  // pressure), so this many covers ~16 M calls a second before any call is shed.
  static constexpr uint32_t kPairsPerContext = 16384;
  // Created at communicator init: about 1 ms of the real driver's time, and a start that
  // back-to-back calls on an H200 (~1.2 M a second) do not exhaust before the first poll.
  static constexpr uint32_t kInitialPairs = 1024;
  static constexpr uint32_t kGrowPairs = 256;  // the least the poller adds to a low pool
  // What the watchdog thread tops a new pool up to on its next pass, unasked.
  static constexpr uint32_t kWarmPairs = 4096;
  static constexpr size_t kQueueCapacity = 32768;
  // Free pairs a thread takes from its pool at once (one locked instruction per chunk instead
  // of one per call) and keeps for its next calls; given back when it exits or moves to
  // another context's pool.
  static constexpr uint32_t kStashPairs = 16;

  CompletionTracker(const DriverApi& driver, trace::RingWriter& writer,
                    EventMode mode = EventMode::kEnd);
  ~CompletionTracker();
  CompletionTracker(const CompletionTracker&) = delete;
  CompletionTracker& operator=(const CompletionTracker&) = delete;

  // At communicator init, on the application thread: the current context gets its first pairs.
  void prepareCurrentContext();

  // ---- application threads (hot path: no allocation, no lock, no I/O) ----
  // The fast paths are inline (below): a call's whole event path is one driver call for the
  // capture check, a pop, a plain increment, the event record and a push, with no call of ours
  // in between.
  StreamCheck checkStream(uint64_t stream) const;
  // Takes a pair for the current context and, in full mode, records its "before" event on
  // `stream`. kNoTicket when none: `*shed` then says whether it was for want of a free pair (the
  // call outran the poller), as opposed to an unknown context or a driver error.
  Ticket recordBefore(uint64_t stream, bool* shed = nullptr);
  // Records the "after" event behind the call's work; false (pair given back) on failure.
  bool recordAfter(Ticket ticket, uint64_t stream);
  // A single call outside a group that returned ncclSuccess: recordAfter, then submit of its
  // one record. On failure the pair is given back and the record says it has no events.
  void finishCall(Ticket ticket, uint64_t stream, uint64_t ringIndex, uint64_t commHash);
  // Hands the records that share `ticket` to the poller; `updatesState` is false for calls
  // that failed (their record keeps its failed state; the pair only returns when done).
  void submit(Ticket ticket, std::span<const uint64_t> ringIndices, uint64_t commHash,
              uint64_t stream, bool updatesState);
  // Gives back a pair whose before event was recorded but that will not be submitted.
  void abandon(Ticket ticket);
  // The communicator was aborted: its pending records end as aborted.
  void markAborted(uint64_t commHash);

  // ---- the watchdog thread ----
  // Queries pending events, updates record states, grows pools. Returns the pending count.
  size_t poll();
  // True when a pool ran dry since the last poll, is less than half free, or a quarter of the
  // pairs are in flight: the poller should come back within a millisecond instead of its usual
  // interval (watchdog thread).
  bool underPressure() const;
  // Switches the calling thread to the thread-local capture mode, so that its event queries
  // never invalidate another thread's global-mode stream capture.
  void enterPollingThread() const;

  EventMode mode() const { return mode_; }
  const CompletionCounters& counters() const { return counters_; }
  // Every communicator that ever had a tracked call, as of the last poll (watchdog thread).
  const std::vector<CommProgress>& progress() const { return progress_; }

 private:
  // What application threads touch: the events, the sharers and the generation. 32 bytes,
  // aligned: two pairs a line, none across two; the poller only reads it (and counts sharers
  // down), its own state per pair is in PairPoll, on lines of its own.
  struct alignas(32) EventPair {
    CUevent before = nullptr;
    CUevent after = nullptr;
    std::atomic<uint32_t> sharers{0};
    std::atomic<uint32_t> generation{0};  // bumped each time the pair is taken
  };
  // Poller-only, for the generation seen last: one query per pair per pass, so that the records
  // sharing the pair agree.
  struct PairPoll {
    uint64_t queriedPass = 0;
    uint32_t seenGeneration = 0;
    bool beforeDone = false;
    bool afterDone = false;
    bool failed = false;
  };
  struct ContextPool {
    std::atomic<CUcontext> context{nullptr};
    std::atomic<uint32_t> created{0};
    std::atomic<uint64_t> misses{0};      // calls that found the pool empty
    std::atomic<bool> wokePoller{false};  // a call since the last poll already woke the poller
    uint64_t missesSeen = 0;              // poller-only: misses already answered by growth
    BoundedQueue<uint32_t, kPairsPerContext> free;
    EventPair pairs[kPairsPerContext];
    PairPoll polls[kPairsPerContext];
  };
  struct Pending {
    uint64_t ringIndex;
    uint64_t commHash;
    uint64_t stream;
    Ticket ticket;
    uint32_t generation;
    bool updatesState;
    bool started;
  };

  ContextPool* poolOf(Ticket ticket) const { return pools_[ticket >> 16].get(); }
  EventPair& pairOf(Ticket ticket) const { return poolOf(ticket)->pairs[ticket & 0xffff]; }
  PairPoll& pollOf(Ticket ticket) const { return poolOf(ticket)->polls[ticket & 0xffff]; }
  int slotForCurrentContext(bool create);
  int slotForStream(uint64_t stream);     // hot path: a per-thread cache, then the current context
  int slotForNewStream(uint64_t stream);  // the cache missed
  Ticket noFreePair(ContextPool& pool, bool* shed);
  bool refillStash(int slot, uint32_t* index);
  void returnStash();
  friend void returnStashAtThreadExit(void*);
  void wakePollerOnce(ContextPool& pool);
  Ticket recordBeforeFailed(Ticket ticket);
  void afterEventFailed(Ticket ticket, uint64_t ringIndex);
  void eventRecordFailed(Ticket ticket);  // counted, and the pair goes back
  void pushFailed(Ticket ticket, uint64_t ringIndex, bool updatesState);
  void grow(ContextPool& pool, uint32_t pairs);
  void release(Ticket ticket);
  void queryPair(Ticket ticket);

  const DriverApi& driver_;
  // The two driver functions of every call, copied here: one load each instead of two.
  decltype(DriverApi::eventRecord) const eventRecord_;
  decltype(DriverApi::streamIsCapturing) const streamIsCapturing_;
  trace::RingWriter& writer_;
  const EventMode mode_;
  const uint64_t serial_;  // this tracker among the process's (keys per-thread caches)
  std::unique_ptr<ContextPool> pools_[kMaxContexts];
  std::atomic<uint32_t> poolCount_{0};
  std::atomic<CUcontext> wantedContext_{nullptr};  // a context with no pool yet, for the poller
  BoundedQueue<Pending, kQueueCapacity> queue_;
  BoundedQueue<uint64_t, 64> aborts_;
  std::mutex growMutex_;  // app threads at init and the poller may both grow a pool
  CompletionCounters counters_;
  // Poller-only.
  std::vector<Pending> inflight_;
  // Within one pass: (stream, ring index) of each stream's first unfinished call.
  static constexpr size_t kMaxBlocked = 64;
  struct BlockedStream {
    uint64_t stream;
    uint64_t ringIndex;
    Ticket ticket;
  };
  std::vector<BlockedStream> blockedStreams_;
  std::vector<CommProgress> progress_;
  uint64_t pass_ = 0;
  CommProgress& progressOf(uint64_t commHash);
  void noteCompleted(const Pending& pending, int64_t now);
};

namespace detail {
// The pool slot of the stream this thread recorded on last (per tracker): a stream belongs to
// one context for life, so a thread issuing on the same stream again needs no cuCtxGetCurrent
// and no search. The default streams (legacy 0/1, per-thread 2) follow the current device and
// are never cached. Keyed by the tracker's serial, so that a tracker made later at the same
// address (or a fork child's) never sees another's slots. Defined in completion.cc.
extern __thread uint64_t t_cachedStream __attribute__((tls_model("initial-exec")));
extern __thread uint64_t t_cachedTracker __attribute__((tls_model("initial-exec")));
extern __thread int t_cachedSlot __attribute__((tls_model("initial-exec")));
// The thread's stash of free pairs: pairs of the pool in slot t_stashSlot of the tracker with
// serial t_stashTracker (a stash of another tracker, e.g. the parent's in a fork child, is
// forgotten, never given back).
extern __thread uint32_t t_stash[CompletionTracker::kStashPairs]
    __attribute__((tls_model("initial-exec")));
// Pairs t_stash[t_stashNext..t_stashCount) are free, handed out in the pool's order.
extern __thread uint32_t t_stashNext __attribute__((tls_model("initial-exec")));
extern __thread uint32_t t_stashCount __attribute__((tls_model("initial-exec")));
extern __thread uint64_t t_stashTracker __attribute__((tls_model("initial-exec")));
extern __thread int t_stashSlot __attribute__((tls_model("initial-exec")));
}  // namespace detail

inline StreamCheck CompletionTracker::checkStream(uint64_t stream) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (streamIsCapturing_(reinterpret_cast<CUstream>(stream), &status) != CUDA_SUCCESS) {
    return StreamCheck::kUntrackable;
  }
  return status == CU_STREAM_CAPTURE_STATUS_NONE ? StreamCheck::kTrackable : StreamCheck::kCaptured;
}

inline int CompletionTracker::slotForStream(uint64_t stream) {
  if (detail::t_cachedStream == stream && detail::t_cachedTracker == serial_) {
    return detail::t_cachedSlot;  // never set for a default stream
  }
  return slotForNewStream(stream);
}

// Inlined into the recorder's issue even where the compiler would not: its call's register
// saves and restores cost as much as its work.
__attribute__((always_inline)) inline Ticket CompletionTracker::recordBefore(uint64_t stream,
                                                                             bool* shed) {
  int slot = slotForStream(stream);
  if (slot < 0) {
    if (shed != nullptr) *shed = false;
    return kNoTicket;
  }
  uint32_t index = 0;
  if (detail::t_stashNext != detail::t_stashCount && detail::t_stashTracker == serial_ &&
      detail::t_stashSlot == slot) {
    index = detail::t_stash[detail::t_stashNext++];
  } else if (!refillStash(slot, &index)) {
    return noFreePair(*pools_[slot], shed);
  }
  if (shed != nullptr) *shed = false;
  Ticket ticket = (static_cast<uint32_t>(slot) << 16) | index;
  // The pair is this thread's alone until it is submitted: a plain increment, no locked
  // instruction (each costs ~8 ns more than a plain one on an H200 host, bench/recording_cost).
  EventPair& pair = pools_[slot]->pairs[index];
  pair.generation.store(pair.generation.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
  if (mode_ == EventMode::kFull &&
      eventRecord_(pair.before, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS) {
    return recordBeforeFailed(ticket);
  }
  return ticket;
}

inline void CompletionTracker::finishCall(Ticket ticket, uint64_t stream, uint64_t ringIndex,
                                          uint64_t commHash) {
  EventPair& pair = pairOf(ticket);
  if (eventRecord_(pair.after, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS) {
    afterEventFailed(ticket, ringIndex);
    return;
  }
  pair.sharers.store(1, std::memory_order_relaxed);
  // Counted by the poller as it takes them (one locked instruction less per call here).
  if (!queue_.push(Pending{ringIndex, commHash, stream, ticket,
                           pair.generation.load(std::memory_order_relaxed), true, false})) {
    pushFailed(ticket, ringIndex, true);
  }
}

}  // namespace ncclwatch::watchdog
