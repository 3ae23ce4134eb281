// The in-process recorder behind the wrappers: configuration, the ring file, and the
// communicator registry that gives every call its (comm, seq). Created lazily on the first
// recorded NCCL call, never in a constructor; a fork() child starts over with its own file.
#pragma once
#include <nccl.h>

#include <atomic>
#include <cstdint>

#include "trace/record.h"
#include "trace/ring_writer.h"
#include "watchdog/completion.h"

namespace ncclwatch::interpose {

// One communicator as the recorder tracks it. Entries are never freed (a destroyed comm's slot
// becomes a tombstone, taken again by a later comm), so a pointer held across the real NCCL
// call stays valid.
struct CommEntry {
  std::atomic<ncclComm_t> key{nullptr};
  uint64_t hash = 0;
  uint64_t parentHash = 0;
  int nranks = 0;
  int rank = 0;
  std::atomic<uint64_t> seq{0};          // every operation issued on the comm
  std::atomic<uint64_t> collectives{0};  // NCCL's per-type counters
  std::atomic<uint64_t> pointToPoint{0};
  // NCCL's per-parent child counter: every ncclCommSplit (NOCOLOR included) and ncclCommGrow.
  std::atomic<int> splitCount{0};
  std::atomic<int> shrinkCount{0};  // ours: NCCL gives two shrinks the same hash
  std::atomic<uint64_t> rollingHash{0};
  uint64_t magic = 0;  // NCCL's bootstrap magic (trace/identity.h), for a grown child's hash
  // The key is a real ncclComm_t this process can abort (false: the plugin's own entry, keyed
  // by its profiler context: NCCL's plugin door never hands out the communicator).
  bool abortable = true;
  // NCCL has begun to free it: the application's abort or destroy, or ncclwatch's abort. The
  // others must not free it twice (a rank's death makes PyTorch abort on a remote error just as
  // the collector's dead_rank verdict asks every rank to abort; a rank blocked in its destroy
  // behind a hung call would free it once there and once in ncclwatch's abort).
  std::atomic<bool> closing{false};
  // Splits, shrinks and grows of it this process is inside (a child being made): NCCL reads the
  // parent throughout, and one that waits for a rank that never comes waits for ever. ncclwatch
  // does not free the parent under it (abortByHash).
  std::atomic<int> childrenInFlight{0};
  std::atomic<uint64_t>* sendSeq = nullptr;  // per peer, nranks entries
  std::atomic<uint64_t>* recvSeq = nullptr;
  int peerCapacity = 0;  // entries of sendSeq and recvSeq
};

struct CommCreation {
  ncclComm_t comm = nullptr;
  uint64_t hash = 0;
  uint64_t parentHash = 0;
  uint64_t magic = 0;
  int nranks = 0;
  int rank = 0;
  int device = -1;
  int color = -1;
  int splitIndex = 0;
  int shrinkIndex = 0;
  trace::OpKind kind = trace::OpKind::kInit;
  bool abortable = true;  // false: `comm` is not an ncclComm_t (the plugin's entries)
};

// What a recorded call looks like before it is issued. Wide fields first, then the narrow
// ones: no padding, so that the wrappers build it with one store per field (a padded one was
// cleared whole first, with rep stos, on every call).
struct CallDescription {
  uint64_t count = 0;
  uint64_t stream = 0;
  uint64_t callSite = 0;
  uint64_t commHash = 0;  // used when there is no CommEntry (e.g. a failed init)
  // Set by the profiler plugin, which sees a call after the fact on another thread: the call's
  // own time and thread (0: now, this thread), its group depth (-1: this thread's), record
  // flags to add, and whether CUDA events may track it (the plugin's KernelCh events do).
  int64_t issueNs = 0;
  int dtype = 0;
  int redop = 0;
  int rootOrPeer = -1;
  int threadId = 0;
  int groupDepth = -1;
  trace::OpKind op = trace::OpKind::kUnknown;
  bool countsInSequence = true;  // false for init: a comm's seq starts with its first operation
  uint8_t extraFlags = 0;
  bool eventsAllowed = true;
};
static_assert(sizeof(CallDescription) == 64);

// A wrapper's call: the NCCL arguments, the rest as the wrapper leaves it.
inline CallDescription describeCall(trace::OpKind op, uint64_t count, int dtype, int redop,
                                    int rootOrPeer, uint64_t stream, uint64_t callSite) {
  return CallDescription{.count = count,
                         .stream = stream,
                         .callSite = callSite,
                         .dtype = dtype,
                         .redop = redop,
                         .rootOrPeer = rootOrPeer,
                         .op = op};
}

// What issue() decided for a call, carried to finish() after the real call returned.
struct IssuedCall {
  uint64_t index = 0;  // ring index of the record
  uint64_t commHash = 0;
  uint64_t seq = 0;
  uint64_t stream = 0;
  trace::OpKind op = trace::OpKind::kUnknown;
  watchdog::Ticket ticket = watchdog::kNoTicket;  // events recorded around this call alone
  // The tracker that gave the ticket: the wrapper hands a successful call's event path to it
  // inline, without a call to finish().
  watchdog::CompletionTracker* completion = nullptr;
  bool inGroupBatch = false;  // events come at the outermost ncclGroupEnd
  bool tracked = false;       // CUDA events will complete its record (else it is flagged no-events)
  // finish() has work only if the call fails: an untracked collective or p2p call outside a
  // group (the wrapper then skips the call to finish on success).
  bool finishOnlyOnFailure = false;
};

class Recorder {
 public:
  // The process's recorder, or null when recording is off (NCCLWATCH_ENABLE=0) or the trace
  // file could not be created (said once on stderr). The check for an existing recorder is
  // inline: it runs on every call.
  static Recorder* get() {
    if (Recorder* recorder = instance_.load(std::memory_order_acquire)) return recorder;
    return start();
  }
  // The recorder if one was started, without starting one.
  static Recorder* existing() { return instance_.load(std::memory_order_acquire); }
  // In a fork() child: the parent's recorder is left behind unused (its locks may be held by
  // parent threads that do not exist here); the child starts its own on its next NCCL call.
  static void forgetAfterFork();

  // Most threads call NCCL on one communicator after another of a few: the last one this
  // thread found is checked first, inline (still that comm's entry unless it was destroyed
  // since), then the table.
  CommEntry* find(ncclComm_t comm);
  // The live entry of a communicator by its hash (a linear scan: for the plugin's first event
  // on a communicator, never per call).
  CommEntry* findByHash(uint64_t hash);
  CommEntry* add(const CommCreation& creation);
  void forget(ncclComm_t comm);

  // Appends the call's record (seq, fingerprint, p2p sequence...) and, for a collective or
  // p2p call outside a group, records the "before" completion event on its stream.
  IssuedCall issue(CommEntry* comm, const CallDescription& call) {
    IssuedCall issued;
    issueInto(comm, call, &issued);
    return issued;
  }
  // The same into a default-constructed IssuedCall of the caller's (the wrappers' hot path: no
  // copy of the result).
  void issueInto(CommEntry* comm, const CallDescription& call, IssuedCall* issued);
  // After the real call returned: records the "after" event (or defers it while a non-blocking
  // comm is still enqueueing), marks a host-synchronous lifecycle call completed and a failure
  // failed with its result.
  void finish(const IssuedCall& issued, ncclComm_t comm, ncclResult_t result);

  // A new communicator exists: the watchdog thread starts (once) and the current CUDA context
  // gets its event pool.
  void communicatorCreated();
  // The watchdog thread starts (once), before any communicator exists: a rank held in its first
  // init is watched too. The event pool waits for communicatorCreated.
  void startWatchdog();
  // Around the outermost ncclGroupEnd: events for every stream the group's calls used.
  void beforeGroupEnd();
  void afterGroupEnd(ncclResult_t result);
  // ncclCommGetAsyncError said `comm` finished enqueueing: deferred events are recorded now.
  void asyncErrorPolled(ncclComm_t comm, ncclResult_t asyncError);
  // ncclCommAbort: the comm's pending records end as aborted.
  void communicatorAborted(uint64_t commHash);
  // NCCLWATCH_ON_HANG=abort or the collector's ABORT, from the watchdog: ncclCommAbort on every
  // live comm with this hash that the application handed us (not the plugin's entries, keyed by
  // a profiler context) and is not freeing itself; returns how many it found (0: none, as in
  // plugin-only mode).
  int abortByHash(uint64_t commHash);

  const char* tracePath() const;
  // The ring, for the plugin's progress source (watchdog thread) and its recording-source bit.
  trace::RingWriter& writer();

 private:
  Recorder() = default;
  static Recorder* start();
  CommEntry* findInTable(ncclComm_t comm);
  CommEntry* findAndRemember(ncclComm_t comm);
  friend struct RecorderState;  // the one concrete recorder, defined in recorder.cc
  static inline std::atomic<Recorder*> instance_{nullptr};
};

namespace detail {
// Per-thread state the wrappers touch on every call, inline: initial-exec thread-locals of this
// library (defined in recorder.cc), one instruction to reach, no call. `__thread` rather than
// thread_local: no dynamic initialization, so no TLS wrapper function either.
extern __thread int t_callDepth __attribute__((tls_model("initial-exec")));
extern __thread const IssuedCall* t_callInProgress __attribute__((tls_model("initial-exec")));
// find()'s last answer on this thread.
extern __thread ncclComm_t t_lastComm __attribute__((tls_model("initial-exec")));
extern __thread CommEntry* t_lastEntry __attribute__((tls_model("initial-exec")));
// The return address of the lifecycle call (split, shrink, destroy, abort...) this thread is in,
// set by its wrapper: the call site of its record, which the wrappers' helpers cannot see.
extern __thread uint64_t t_lifecycleSite __attribute__((tls_model("initial-exec")));
}  // namespace detail

inline CommEntry* Recorder::find(ncclComm_t comm) {
  if (detail::t_lastComm == comm && comm != nullptr &&
      detail::t_lastEntry->key.load(std::memory_order_acquire) == comm) {
    return detail::t_lastEntry;
  }
  return findAndRemember(comm);
}

// Thread-local nesting of NCCL calls: NCCL calls some of its own exported functions through
// the PLT (ncclBcast → ncclBroadcast, GetAsyncError inside every collective); only the
// outermost call is the user's.
class CallScope {
 public:
  CallScope() : outermost_(detail::t_callDepth++ == 0) {}
  ~CallScope() { --detail::t_callDepth; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  bool outermost() const { return outermost_; }

 private:
  bool outermost_;
};

namespace detail {
inline std::atomic<bool> g_lifecycleThroughWrappers{false};
}  // namespace detail
// An NCCL lifecycle call (an init, split, finalize...) went through our wrappers in this
// process: NCCL is not bypassing them, so a communicator NCCL initialises on a thread of its own
// (ncclCommInitAll, a grouped or non-blocking init) is still the interposer's to record, though
// no wrapper is on that thread. Set by the lifecycle wrappers (never on the hot path).
inline void noteLifecycleThroughWrappers() {
  detail::g_lifecycleThroughWrappers.store(true, std::memory_order_relaxed);
}
inline bool lifecycleThroughWrappers() {
  return detail::g_lifecycleThroughWrappers.load(std::memory_order_relaxed);
}

int groupDepth();
// Whether this thread is inside one of our NCCL wrappers (any CallScope).
inline bool insideWrapper() {
  return detail::t_callDepth > 0;
}
void enterGroup();
void leaveGroup();

// The call an interposer wrapper is making on this thread, while it is inside the real NCCL
// function: the profiler plugin's API events on the same thread belong to it (combined mode:
// one record per call, enriched with NCCL's own progress). Null outside a wrapper.
inline const IssuedCall* callInProgress() {
  return detail::t_callInProgress;
}
class CallInProgress {
 public:
  explicit CallInProgress(const IssuedCall* call) : previous_(detail::t_callInProgress) {
    detail::t_callInProgress = call;
  }
  ~CallInProgress() { detail::t_callInProgress = previous_; }
  CallInProgress(const CallInProgress&) = delete;
  CallInProgress& operator=(const CallInProgress&) = delete;

 private:
  const IssuedCall* previous_;
};

// The unique id that NCCL's ncclCommInitAll obtained through our ncclGetUniqueId wrapper, so
// that its communicators get their real commHash.
void rememberNestedUniqueId(const ncclUniqueId& id);
bool takeNestedUniqueId(ncclUniqueId* id);

}  // namespace ncclwatch::interpose
