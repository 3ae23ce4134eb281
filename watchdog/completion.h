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
// Application threads only take pairs from a lock-free free list and push to a lock-free queue;
// every driver query, state change and pool growth happens on the watchdog thread.
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
  int64_t recentLatencyNs = 0;   // slowest issue-to-completion lately (decays by 1% a call)
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

  CompletionTracker(const DriverApi& driver, trace::RingWriter& writer,
                    EventMode mode = EventMode::kEnd);
  ~CompletionTracker();
  CompletionTracker(const CompletionTracker&) = delete;
  CompletionTracker& operator=(const CompletionTracker&) = delete;

  // At communicator init, on the application thread: the current context gets its first pairs.
  void prepareCurrentContext();

  // ---- application threads (hot path: no allocation, no lock, no I/O) ----
  StreamCheck checkStream(uint64_t stream) const;
  // Takes a pair for the current context and, in full mode, records its "before" event on
  // `stream`. kNoTicket when none: `*shed` then says whether it was for want of a free pair (the
  // call outran the poller), as opposed to an unknown context or a driver error.
  Ticket recordBefore(uint64_t stream, bool* shed = nullptr);
  // Records the "after" event behind the call's work; false (pair given back) on failure.
  bool recordAfter(Ticket ticket, uint64_t stream);
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
  struct EventPair {
    CUevent before = nullptr;
    CUevent after = nullptr;
    std::atomic<uint32_t> sharers{0};
    std::atomic<uint32_t> generation{0};  // bumped each time the pair is taken
    // Poller-only, for the generation seen last: one query per pair per pass, so that the
    // records sharing the pair agree.
    uint32_t seenGeneration = 0;
    uint64_t queriedPass = 0;
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
  int slotForCurrentContext(bool create);
  int slotForStream(uint64_t stream);  // hot path: a per-thread cache, then the current context
  void grow(ContextPool& pool, uint32_t pairs);
  void release(Ticket ticket);
  void queryPair(EventPair& pair);

  const DriverApi& driver_;
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

}  // namespace ncclwatch::watchdog
