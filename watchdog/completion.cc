#include "watchdog/completion.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <mutex>
#include <new>

#include "trace/clock.h"
#include "watchdog/triggers.h"

namespace ncclwatch::watchdog {
namespace {

CUstream asStream(uint64_t stream) {
  return reinterpret_cast<CUstream>(stream);
}

constexpr auto byRingIndex = [](const auto& a, const auto& b) { return a.ringIndex < b.ringIndex; };

// Pool creation is rare (a new context) and never on the hot path.
std::mutex g_poolCreation;

}  // namespace

__thread uint64_t detail::t_cachedStream __attribute__((tls_model("initial-exec"))) = 0;
__thread uint64_t detail::t_cachedTracker __attribute__((tls_model("initial-exec"))) = 0;
__thread int detail::t_cachedSlot __attribute__((tls_model("initial-exec"))) = -1;

__thread uint32_t detail::t_stash[CompletionTracker::kStashPairs]
    __attribute__((tls_model("initial-exec")));
__thread uint32_t detail::t_stashNext __attribute__((tls_model("initial-exec"))) = 0;
__thread uint32_t detail::t_stashCount __attribute__((tls_model("initial-exec"))) = 0;
__thread uint64_t detail::t_stashTracker __attribute__((tls_model("initial-exec"))) = 0;
__thread int detail::t_stashSlot __attribute__((tls_model("initial-exec"))) = -1;

namespace {
std::atomic<uint64_t> g_trackerSerials{0};

// The live trackers, so that a thread's stash goes back to its pool when the thread exits, and
// never into a tracker destroyed meanwhile. Taken at a thread's exit and a tracker's birth and
// death only.
std::mutex g_liveMutex;
constexpr size_t kMaxLiveTrackers = 64;
CompletionTracker* g_live[kMaxLiveTrackers];
pthread_key_t g_stashKey;
std::once_flag g_stashKeyOnce;
}  // namespace

void returnStashAtThreadExit(void* value) {
  auto* tracker = static_cast<CompletionTracker*>(value);
  std::lock_guard<std::mutex> lock(g_liveMutex);
  for (CompletionTracker* live : g_live) {
    if (live == tracker && tracker != nullptr) tracker->returnStash();
  }
}

void CompletionTracker::returnStash() {
  if (detail::t_stashTracker == serial_ && detail::t_stashSlot >= 0 &&
      static_cast<uint32_t>(detail::t_stashSlot) < poolCount_.load(std::memory_order_acquire)) {
    ContextPool& pool = *pools_[detail::t_stashSlot];
    while (detail::t_stashNext != detail::t_stashCount) {
      pool.free.push(detail::t_stash[detail::t_stashNext++]);
    }
  }
  detail::t_stashNext = detail::t_stashCount = 0;
}

// The stash is empty or holds another pool's pairs: those go back, and a chunk of this pool's
// free pairs is taken with one compare-exchange. Also where a thread says it is running low.
bool CompletionTracker::refillStash(int slot, uint32_t* index) {
  if (detail::t_stashTracker == serial_) {
    returnStash();
  } else {
    detail::t_stashNext = detail::t_stashCount = 0;  // another tracker's: not ours to give back
    detail::t_stashTracker = serial_;
    // Once per thread and tracker: at the thread's exit its stash goes back to this pool.
    pthread_setspecific(g_stashKey, this);
  }
  detail::t_stashSlot = slot;
  ContextPool& pool = *pools_[slot];
  // Taken straight into the stash.
  auto got = static_cast<uint32_t>(pool.free.popMany(detail::t_stash, kStashPairs));
  if (got == 0) return false;
  // Running low: wake the poller now to recycle finished pairs and grow the pool, before calls
  // find it empty (once per poll at most).
  if (pool.free.size() < pool.created.load(std::memory_order_relaxed) / 4) wakePollerOnce(pool);
  detail::t_stashNext = 1;
  detail::t_stashCount = got;
  *index = detail::t_stash[0];
  return true;
}

CompletionTracker::CompletionTracker(const DriverApi& driver, trace::RingWriter& writer,
                                     EventMode mode)
    : driver_(driver),
      eventRecord_(driver.eventRecord),
      streamIsCapturing_(driver.streamIsCapturing),
      writer_(writer),
      mode_(mode),
      serial_(g_trackerSerials.fetch_add(1, std::memory_order_relaxed) + 1) {
  inflight_.reserve(1024);
  blockedStreams_.reserve(kMaxBlocked);
  std::call_once(g_stashKeyOnce, [] {
    pthread_key_create(&g_stashKey, returnStashAtThreadExit);
    // A fork child's only thread may exit through the key's destructor: the lock must not be
    // one a parent thread held at the fork.
    pthread_atfork(nullptr, nullptr, [] { new (&g_liveMutex) std::mutex(); });
  });
  std::lock_guard<std::mutex> lock(g_liveMutex);
  for (CompletionTracker*& live : g_live) {
    if (live == nullptr) {
      live = this;
      break;
    }
  }
}

CompletionTracker::~CompletionTracker() {
  {
    std::lock_guard<std::mutex> lock(g_liveMutex);
    for (CompletionTracker*& live : g_live) {
      if (live == this) live = nullptr;
    }
  }
  // Events belong to the driver; at exit the driver may be gone already, so they are left to
  // process teardown rather than destroyed here.
}

int CompletionTracker::slotForCurrentContext(bool create) {
  CUcontext context = nullptr;
  if (driver_.ctxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr) return -1;
  uint32_t count = poolCount_.load(std::memory_order_acquire);
  for (uint32_t slot = 0; slot < count; ++slot) {
    if (pools_[slot]->context.load(std::memory_order_relaxed) == context) {
      return static_cast<int>(slot);
    }
  }
  if (!create) {
    wantedContext_.store(context, std::memory_order_relaxed);
    return -1;
  }
  std::lock_guard<std::mutex> lock(g_poolCreation);
  count = poolCount_.load(std::memory_order_acquire);
  for (uint32_t slot = 0; slot < count; ++slot) {
    if (pools_[slot]->context.load(std::memory_order_relaxed) == context) {
      return static_cast<int>(slot);
    }
  }
  if (count == kMaxContexts) return -1;
  pools_[count] = std::make_unique<ContextPool>();
  pools_[count]->context.store(context, std::memory_order_relaxed);
  poolCount_.store(count + 1, std::memory_order_release);
  return static_cast<int>(count);
}

// Creates pairs in the pool's context, which must be current on the calling thread. Pairs are
// handed out in chunks as they are made: a large step costs milliseconds of driver calls on a
// real GPU, and calls that find the pool empty meanwhile would be shed. One event per call
// needs no "before" event.
void CompletionTracker::grow(ContextPool& pool, uint32_t pairs) {
  constexpr uint32_t kChunk = 64;
  uint32_t first = pool.created.load(std::memory_order_relaxed);
  uint32_t last = std::min<uint32_t>(first + pairs, kPairsPerContext);
  uint32_t made = first, published = first;
  for (; made < last; ++made) {
    EventPair& pair = pool.pairs[made];
    if (mode_ == EventMode::kFull &&
        driver_.eventCreate(&pair.before, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      break;
    }
    if (driver_.eventCreate(&pair.after, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      if (pair.before != nullptr) driver_.eventDestroy(pair.before);
      pair.before = nullptr;
      break;
    }
    if (made + 1 - published == kChunk || made + 1 == last) {
      pool.created.store(made + 1, std::memory_order_release);
      for (; published <= made; ++published) pool.free.push(published);
    }
  }
  pool.created.store(made, std::memory_order_release);
  for (; published < made; ++published) pool.free.push(published);
}

void CompletionTracker::prepareCurrentContext() {
  int slot = slotForCurrentContext(true);
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(growMutex_);
  if (pools_[slot]->created.load() == 0) {
    grow(*pools_[slot], kInitialPairs);
    Triggers::wake();  // the watchdog thread tops the pool up to kWarmPairs in the background
  }
}

int CompletionTracker::slotForNewStream(uint64_t stream) {
  constexpr uint64_t kLastDefaultStream = 2;  // cudaStreamLegacy 1, cudaStreamPerThread 2
  int slot = slotForCurrentContext(false);
  if (slot >= 0 && stream > kLastDefaultStream) {
    detail::t_cachedStream = stream;
    detail::t_cachedTracker = serial_;
    detail::t_cachedSlot = slot;
  }
  return slot;
}

void CompletionTracker::wakePollerOnce(ContextPool& pool) {
  if (!pool.wokePoller.exchange(true, std::memory_order_relaxed)) Triggers::wake();
}

Ticket CompletionTracker::noFreePair(ContextPool& pool, bool* shed) {
  pool.misses.fetch_add(1, std::memory_order_relaxed);
  counters_.noPair.fetch_add(1, std::memory_order_relaxed);
  if (shed != nullptr) *shed = true;
  // The first miss since the last poll wakes the poller to recycle and grow now rather than at
  // its next interval: one write per poll at most, on a path that is already the slow one.
  wakePollerOnce(pool);
  return kNoTicket;
}

Ticket CompletionTracker::recordBeforeFailed(Ticket ticket) {
  eventRecordFailed(ticket);
  return kNoTicket;
}

void CompletionTracker::afterEventFailed(Ticket ticket, uint64_t ringIndex) {
  eventRecordFailed(ticket);
  writer_.updateFlags(ringIndex, trace::kRecordNoEvents, 0);  // untracked, not pending
}

void CompletionTracker::eventRecordFailed(Ticket ticket) {
  counters_.recordErrors.fetch_add(1, std::memory_order_relaxed);
  abandon(ticket);
}

void CompletionTracker::pushFailed(Ticket ticket, uint64_t ringIndex, bool updatesState) {
  // The poller will never hear of it: its record says it is untracked, not pending.
  if (updatesState) writer_.updateFlags(ringIndex, trace::kRecordNoEvents | trace::kRecordShed, 0);
  counters_.queueFull.fetch_add(1, std::memory_order_relaxed);
  if (pairOf(ticket).sharers.fetch_sub(1, std::memory_order_acq_rel) == 1) abandon(ticket);
}

bool CompletionTracker::recordAfter(Ticket ticket, uint64_t stream) {
  if (eventRecord_(pairOf(ticket).after, asStream(stream)) == CUDA_SUCCESS) return true;
  eventRecordFailed(ticket);
  return false;
}

void CompletionTracker::abandon(Ticket ticket) {
  // Re-recording an event that is still pending is legal: the pair may be reused at once.
  poolOf(ticket)->free.push(ticket & 0xffff);
}

void CompletionTracker::submit(Ticket ticket, std::span<const uint64_t> ringIndices,
                               uint64_t commHash, uint64_t stream, bool updatesState) {
  EventPair& pair = pairOf(ticket);
  // Every sharer is counted before the first is queued, so the poller cannot free the pair
  // while the others are still being handed over.
  pair.sharers.store(static_cast<uint32_t>(ringIndices.size()), std::memory_order_relaxed);
  for (uint64_t ringIndex : ringIndices) {
    uint32_t generation = pair.generation.load(std::memory_order_relaxed);
    // Counted by the poller as it takes them (one locked instruction less per call here).
    if (!queue_.push(
            Pending{ringIndex, commHash, stream, ticket, generation, updatesState, false})) {
      pushFailed(ticket, ringIndex, updatesState);
    }
  }
}

void CompletionTracker::markAborted(uint64_t commHash) {
  aborts_.push(commHash);
}

void CompletionTracker::enterPollingThread() const {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  driver_.threadExchangeStreamCaptureMode(&mode);
}

void CompletionTracker::release(Ticket ticket) {
  if (pairOf(ticket).sharers.fetch_sub(1, std::memory_order_acq_rel) == 1) abandon(ticket);
}

void CompletionTracker::queryPair(Ticket ticket) {
  PairPoll& pair = pollOf(ticket);
  const EventPair& events = pairOf(ticket);
  if (pair.queriedPass == pass_) return;
  pair.queriedPass = pass_;
  if (!pair.afterDone) {
    CUresult after = driver_.eventQuery(events.after);
    if (after == CUDA_SUCCESS) {
      pair.afterDone = pair.beforeDone = true;
    } else if (after != CUDA_ERROR_NOT_READY) {
      counters_.queryErrors.fetch_add(1, std::memory_order_relaxed);
      pair.failed = true;
    }
  }
  if (mode_ == EventMode::kFull && !pair.beforeDone && !pair.failed) {
    CUresult before = driver_.eventQuery(events.before);
    if (before == CUDA_SUCCESS) pair.beforeDone = true;
  }
}

CommProgress& CompletionTracker::progressOf(uint64_t commHash) {
  for (CommProgress& comm : progress_) {
    if (comm.commHash == commHash) return comm;
  }
  progress_.push_back(CommProgress{});
  progress_.back().commHash = commHash;
  return progress_.back();
}

void CompletionTracker::noteCompleted(const Pending& pending, int64_t now) {
  CommProgress& comm = progressOf(pending.commHash);
  trace::CallRecord record;
  if (!writer_.read(pending.ringIndex, &record)) return;
  if (record.seq > comm.completedSeq) comm.completedSeq = record.seq;
  comm.lastCompletionNs = now;
  if (comm.completedCalls++ == 0) return;
  int64_t latency = now - record.issueNs;
  comm.recentLatencyNs = std::max(latency, comm.recentLatencyNs - comm.recentLatencyNs / 100);
}

size_t CompletionTracker::poll() {
  ++pass_;
  for (Pending pending; queue_.pop(&pending);) {
    counters_.tracked.store(counters_.tracked.load(std::memory_order_relaxed) + 1,
                            std::memory_order_relaxed);  // the poller is its only writer
    PairPoll& pair = pollOf(pending.ticket);
    if (pair.seenGeneration != pending.generation) {  // a new use of the pair: forget the old
      pair.seenGeneration = pending.generation;
      pair.queriedPass = 0;
      pair.beforeDone = pair.afterDone = pair.failed = false;
    }
    inflight_.push_back(pending);
  }
  // Stream order is read off ring order below. Calls are submitted nearly in ring order, but a
  // group's records reach the queue at its GroupEnd, after calls of other threads.
  if (!std::is_sorted(inflight_.begin(), inflight_.end(), byRingIndex)) {
    std::stable_sort(inflight_.begin(), inflight_.end(), byRingIndex);
  }
  std::vector<uint64_t> aborted;
  for (uint64_t hash; aborts_.pop(&hash);) aborted.push_back(hash);

  int64_t now = trace::FastClock::nowNs();
  size_t kept = 0;
  // A stream runs its work in order: once a call on it is not finished, the calls issued after
  // it on that stream (larger ring indices) are not either, and need no query this pass.
  // Back-to-back calls can keep thousands in flight; this keeps a pass to the finished ones
  // plus about one per stream.
  blockedStreams_.clear();
  for (Pending& pending : inflight_) {
    PairPoll& pair = pollOf(pending.ticket);
    bool abortedComm = false;
    for (uint64_t hash : aborted) abortedComm |= hash == pending.commHash;
    if (abortedComm) {
      if (pending.updatesState) {
        writer_.updateState(pending.ringIndex, trace::RecordState::kAborted, 0, now);
      }
      release(pending.ticket);
      continue;
    }
    // The stream's first unfinished call this pass, if it is known; calls sharing its pair (a
    // group's calls on that stream) stand at the head of the stream with it.
    const BlockedStream* head = nullptr;
    bool blocked = false;
    for (const BlockedStream& b : blockedStreams_) {
      if (b.stream == pending.stream && b.ringIndex < pending.ringIndex) {
        head = &b;
        blocked = b.ticket != pending.ticket;
        break;
      }
    }
    if (blocked && pair.queriedPass != pass_) {
      inflight_[kept++] = pending;
      continue;
    }
    queryPair(pending.ticket);
    bool atHead = false;
    if (!pair.afterDone && !pair.failed && !blocked) {
      if (head != nullptr) {
        atHead = true;
      } else if (blockedStreams_.size() < kMaxBlocked) {
        blockedStreams_.push_back({pending.stream, pending.ringIndex, pending.ticket});
        atHead = true;
      }
    }
    if (pair.afterDone || pair.failed) {
      if (pending.updatesState && !pair.failed) noteCompleted(pending, now);
      if (pending.updatesState) {
        writer_.updateState(
            pending.ringIndex,
            pair.failed ? trace::RecordState::kFailed : trace::RecordState::kCompleted, now, now);
      }
      release(pending.ticket);
      continue;
    }
    // Full mode sees the start; one-event mode infers it once every earlier tracked call on
    // the stream completed (flagged: work queued outside NCCL may still be ahead of it).
    bool startedNow = mode_ == EventMode::kFull ? pair.beforeDone : atHead;
    if (startedNow && !pending.started) {
      pending.started = true;
      if (pending.updatesState) {
        if (mode_ != EventMode::kFull) {
          writer_.updateFlags(pending.ringIndex, trace::kRecordStartInferred, 0);
        }
        writer_.updateState(pending.ringIndex, trace::RecordState::kStarted, now, 0);
      }
    }
    inflight_[kept++] = pending;
  }
  inflight_.resize(kept);
  for (CommProgress& comm : progress_) comm.pending = 0;
  for (const Pending& pending : inflight_) {
    if (!pending.updatesState) continue;
    CommProgress& comm = progressOf(pending.commHash);
    // Ring indices grow with issue order: the smallest pending one is the oldest call.
    if (comm.pending++ == 0 || pending.ringIndex < comm.oldest.ringIndex) {
      trace::CallRecord record;
      if (writer_.read(pending.ringIndex, &record)) {
        comm.oldest = record;
        comm.oldestStarted = pending.started;
      } else {
        comm.oldest.ringIndex = pending.ringIndex;  // overwritten: the ring wrapped past it
      }
    }
  }

  // Pools: a context seen without one gets one; a pool running low grows.
  CUcontext wanted = wantedContext_.exchange(nullptr, std::memory_order_relaxed);
  CUcontext previous = nullptr;
  driver_.ctxGetCurrent(&previous);
  std::lock_guard<std::mutex> lock(growMutex_);
  if (wanted != nullptr && driver_.ctxSetCurrent(wanted) == CUDA_SUCCESS) {
    int slot = slotForCurrentContext(true);
    if (slot >= 0 && pools_[slot]->created.load() == 0) grow(*pools_[slot], kInitialPairs);
  }
  // A pool grows by what the calls since the last poll lacked (at least a step) when calls
  // found it empty, or when it runs low now.
  // A pool under pressure doubles (at least): a burst of calls finds room at the next pass.
  uint32_t count = poolCount_.load(std::memory_order_acquire);
  for (uint32_t slot = 0; slot < count; ++slot) {
    ContextPool& pool = *pools_[slot];
    uint64_t misses = pool.misses.load(std::memory_order_relaxed);
    uint64_t recentMisses = misses - pool.missesSeen;
    pool.missesSeen = misses;
    pool.wokePoller.store(false, std::memory_order_relaxed);
    uint32_t created = pool.created.load(std::memory_order_relaxed);
    bool low = pool.free.size() < created / 4 + 8;
    bool warming = created < kWarmPairs;
    if ((recentMisses > 0 || low || warming) && created < kPairsPerContext &&
        driver_.ctxSetCurrent(pool.context.load()) == CUDA_SUCCESS) {
      // Calls found it empty: they outrun this pool by more than a pass, so it quadruples (at
      // least 4 x what they lacked). On an H200, back-to-back one-rank allreduces at ~1.2 M
      // calls/s shed up to 8% of a 0.2 s run while the pool doubled its way up from 256.
      // A new pool is topped up to kWarmPairs at once, here on the watchdog thread: the real
      // driver's cuEventCreate takes about a microsecond, so a ramp made while calls already
      // outrun the pool sheds the first tens of milliseconds of a back-to-back burst.
      uint64_t step =
          recentMisses > 0
              ? std::max<uint64_t>({kGrowPairs, 4 * recentMisses, 3 * uint64_t{created}})
              : std::max<uint64_t>(kGrowPairs, created);
      if (warming) step = std::max<uint64_t>(step, kWarmPairs - created);
      grow(pool, static_cast<uint32_t>(step));
    }
  }
  driver_.ctxSetCurrent(previous);
  return inflight_.size();
}

bool CompletionTracker::underPressure() const {
  uint32_t count = poolCount_.load(std::memory_order_acquire);
  uint32_t created = 0;
  for (uint32_t slot = 0; slot < count; ++slot) created += pools_[slot]->created.load();
  // Calls keep many pairs in flight: the next pass should come soon to recycle them.
  if (inflight_.size() * 4 > created) return true;
  for (uint32_t slot = 0; slot < count; ++slot) {
    const ContextPool& pool = *pools_[slot];
    if (pool.misses.load(std::memory_order_relaxed) != pool.missesSeen) return true;
    if (pool.free.size() < pool.created.load(std::memory_order_relaxed) / 2) return true;
  }
  return false;
}

}  // namespace ncclwatch::watchdog
