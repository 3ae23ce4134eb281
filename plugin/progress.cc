// The plugin's progress source, polled on the watchdog thread: it turns the KernelCh marks that
// NCCL's threads left in the operation slots into record states (the one thread that changes
// states), keeps per-communicator progress for the hang checks of the records it built, and
// writes wait notes for calls pending longer than a moment: kernel channels, and the proxy step
// that says most about the wait (waitRank), the longest waiting among equals, with its peer.
#include <algorithm>
#include <bit>
#include <map>
#include <vector>

#include "interpose/recorder.h"
#include "plugin/plugin.h"
#include "plugin/slots.h"
#include "trace/clock.h"
#include "watchdog/progress_source.h"

namespace ncclwatch::plugin {
namespace {

using trace::RecordState;

constexpr int64_t kWaitNoteAfterNs = 200'000'000;  // pending this long: say where it waits
constexpr int64_t kOrphanApiNs = 10'000'000'000;   // an API event whose operation never came

bool isFinal(RecordState state) {
  return state == RecordState::kCompleted || state == RecordState::kFailed ||
         state == RecordState::kAborted;
}

bool isWaitState(uint8_t state) {
  return trace::proxyStepStateName(state)[0] != '\0';
}

class PluginProgress final : public watchdog::ProgressSource {
 public:
  void poll(int64_t nowNs) override;
  const std::vector<watchdog::CommProgress>& progress() const override { return progress_; }
  const std::vector<trace::WaitNote>& waits() const override { return waits_; }

 private:
  struct CommState {
    uint64_t completedSeq = 0;
    int64_t lastCompletionNs = 0;
    int64_t recentLatencyNs = 0;
  };
  struct Pending {
    CallSlot* slot;
    trace::CallRecord record;
  };
  // One operation slot; true when it is still pending afterwards.
  bool sweep(CallSlot& slot, trace::RingWriter& writer, int64_t nowNs, Pending* pending);
  void completed(const trace::CallRecord& record, int64_t nowNs);
  void buildProgress(const std::vector<Pending>& pending);
  void buildWaits(const std::vector<Pending>& pending, int64_t nowNs);

  std::map<uint64_t, CommState> comms_;
  std::vector<watchdog::CommProgress> progress_;
  std::vector<trace::WaitNote> waits_;
  // Kept between polls with their capacity: the watchdog thread must not allocate every poll
  // (a fork child of a process whose allocator has no fork handlers inherits a held lock).
  std::vector<Pending> pending_;
  std::vector<const Pending*> waiting_;
  std::vector<int> bestStep_;    // per call slot: the child slot index of its longest wait
  std::vector<bool> isWaiting_;  // per call slot: among the calls a wait note is written for
};

void PluginProgress::completed(const trace::CallRecord& record, int64_t nowNs) {
  if ((record.flags & trace::kRecordFromPlugin) == 0) return;
  CommState& comm = comms_[record.commHash];
  comm.completedSeq = std::max(comm.completedSeq, record.seq);
  comm.lastCompletionNs = nowNs;
  int64_t latency = nowNs - record.issueNs;
  comm.recentLatencyNs = std::max(latency, comm.recentLatencyNs - comm.recentLatencyNs / 100);
}

bool PluginProgress::sweep(CallSlot& slot, trace::RingWriter& writer, int64_t nowNs,
                           Pending* pending) {
  Pools& all = pools();
  trace::CallRecord record;
  if (!writer.read(slot.ringIndex, &record)) {
    all.calls.release(&slot);  // the ring moved past it: nothing left to update
    return false;
  }
  bool contextGone =
      slot.context->generation.load(std::memory_order_acquire) != slot.contextGeneration;
  uint64_t started = slot.startedChannels.load(std::memory_order_acquire);
  uint32_t stopped = slot.stoppedChannels.load(std::memory_order_acquire);
  int startedCount = std::popcount(started);
  bool kernelDone = startedCount > 0 && static_cast<int>(stopped) >= startedCount &&
                    static_cast<int>(stopped) >= std::max(1, slot.nChannels);
  // Joined records are the interposer's: its CUDA events complete them unless they had none.
  bool completesRecord = slot.completesRecord;
  if (!isFinal(record.state)) {
    if (kernelDone && completesRecord) {
      int64_t start = slot.kernelStartNs.load(std::memory_order_acquire);
      int64_t stop = slot.kernelStopNs.load(std::memory_order_acquire);
      writer.updateState(slot.ringIndex, RecordState::kCompleted, start, stop ? stop : nowNs);
      record.state = RecordState::kCompleted;
      completed(record, nowNs);
    } else if (started != 0 && record.state == RecordState::kIssued) {
      writer.updateState(slot.ringIndex, RecordState::kStarted,
                         slot.kernelStartNs.load(std::memory_order_acquire), 0);
      record.state = RecordState::kStarted;
    } else if (started != 0 && record.state == RecordState::kStarted &&
               (record.flags & trace::kRecordStartInferred) != 0) {
      // One CUDA event per call inferred the start from stream order; NCCL's kernel events
      // saw it: the start is seen, not inferred (GPU work outside NCCL no longer holds it).
      writer.updateFlags(slot.ringIndex, 0, trace::kRecordStartInferred);
      record.flags &= static_cast<uint8_t>(~trace::kRecordStartInferred);
    } else if (contextGone) {
      // Freed by NCCL (abort) while the kernel had not finished.
      writer.updateState(slot.ringIndex, RecordState::kAborted, 0, 0);
      record.state = RecordState::kAborted;
    }
  }
  bool done = isFinal(record.state) && (kernelDone || contextGone || !completesRecord);
  if (done && slot.enqueued.load(std::memory_order_acquire)) {
    all.calls.release(&slot);
    return false;
  }
  if (isFinal(record.state)) return false;
  pending->slot = &slot;
  pending->record = record;
  return true;
}

void PluginProgress::buildProgress(const std::vector<Pending>& pending) {
  progress_.clear();
  for (const auto& [hash, state] : comms_) {
    watchdog::CommProgress& comm = progress_.emplace_back();
    comm.commHash = hash;
    comm.completedSeq = state.completedSeq;
    comm.lastCompletionNs = state.lastCompletionNs;
    comm.recentLatencyNs = state.recentLatencyNs;
  }
  for (const Pending& call : pending) {
    // The tracker watches joined records; this source watches the records it built.
    if ((call.record.flags & trace::kRecordFromPlugin) == 0) continue;
    const uint64_t hash = call.record.commHash;
    // A process has a handful of communicators: a scan, and no map built every poll.
    auto found =
        std::find_if(progress_.begin(), progress_.end(),
                     [hash](const watchdog::CommProgress& comm) { return comm.commHash == hash; });
    if (found == progress_.end()) {
      found = progress_.emplace(progress_.end());
      found->commHash = hash;
    }
    watchdog::CommProgress& comm = *found;
    if (comm.pending == 0 || call.record.seq < comm.oldest.seq) {
      comm.oldest = call.record;
      comm.oldestStarted = call.record.state == RecordState::kStarted;
    }
    ++comm.pending;
  }
  std::sort(progress_.begin(), progress_.end(),
            [](const watchdog::CommProgress& a, const watchdog::CommProgress& b) {
              return a.commHash < b.commHash;
            });
}

void PluginProgress::buildWaits(const std::vector<Pending>& pending, int64_t nowNs) {
  waits_.clear();
  std::vector<const Pending*>& waiting = waiting_;
  waiting.clear();
  for (const Pending& call : pending) {
    if (nowNs - call.record.issueNs >= kWaitNoteAfterNs) waiting.push_back(&call);
  }
  if (waiting.empty()) return;
  std::sort(waiting.begin(), waiting.end(), [](const Pending* a, const Pending* b) {
    return a->record.issueNs < b->record.issueNs;
  });
  if (waiting.size() > trace::kWaitNoteCapacity) waiting.resize(trace::kWaitNoteCapacity);
  // One pass over the children: for each waiting call, its proxy step that has waited longest.
  Pools& all = pools();
  bestStep_.assign(kCallSlots, -1);
  std::vector<bool>& isWaiting = isWaiting_;
  isWaiting.assign(kCallSlots, false);
  for (const Pending* call : waiting) isWaiting[all.calls.indexOf(call->slot)] = true;
  ChildSlot* children = all.children.begin();
  for (size_t i = 0; i < kChildSlots; ++i) {
    ChildSlot& step = children[i];
    if (!isPublished(step) || step.kind != EventKind::kProxyStep || step.op == nullptr ||
        !isWaitState(step.state.load(std::memory_order_acquire))) {
      continue;
    }
    ChildSlot& op = *step.op;
    if (op.generation.load(std::memory_order_acquire) != step.opGeneration || op.call == nullptr ||
        op.call->generation.load(std::memory_order_acquire) != op.callGeneration) {
      continue;
    }
    size_t callIndex = all.calls.indexOf(op.call);
    if (!isWaiting[callIndex]) continue;
    int& best = bestStep_[callIndex];
    int rank = trace::proxyWaitWeight(step.state.load(std::memory_order_acquire));
    int bestRank =
        best < 0 ? 0 : trace::proxyWaitWeight(children[best].state.load(std::memory_order_acquire));
    if (best < 0 || rank > bestRank ||
        (rank == bestRank && step.sinceNs.load() < children[best].sinceNs.load())) {
      best = static_cast<int>(i);
    }
  }
  for (const Pending* call : waiting) {
    const CallSlot& slot = *call->slot;
    trace::WaitNote note{};
    note.commHash = call->record.commHash;
    note.seq = call->record.seq;
    note.ncclSeqNumber = slot.ncclSeqNumber;
    note.updatedNs = nowNs;
    note.channel = note.peer = note.step = -1;
    uint64_t started = slot.startedChannels.load(std::memory_order_acquire);
    uint32_t stopped = slot.stoppedChannels.load(std::memory_order_acquire);
    note.channelsStarted = static_cast<uint8_t>(std::popcount(started));
    note.channelsStopped = static_cast<uint8_t>(std::min<uint32_t>(stopped, 255));
    note.nChannels = static_cast<uint8_t>(std::clamp(slot.nChannels, 0, 255));
    if (started == 0) {
      note.kernel = trace::KernelState::kNotStarted;
      note.sinceNs = call->record.issueNs;
    } else {
      note.kernel = static_cast<int>(stopped) >= std::popcount(started)
                        ? trace::KernelState::kStopped
                        : trace::KernelState::kRunning;
      note.sinceNs = slot.kernelStartNs.load(std::memory_order_acquire);
      note.channel = std::countr_zero(started);
    }
    int best = bestStep_[all.calls.indexOf(call->slot)];
    if (best >= 0) {
      const ChildSlot& step = children[best];
      note.channel = step.channel;
      note.peer = step.peer;
      note.step = step.step;
      note.isSend = step.isSend ? 1 : 0;
      note.stepState = step.state.load(std::memory_order_acquire);
      note.sinceNs = step.sinceNs.load(std::memory_order_acquire);
    }
    waits_.push_back(note);
  }
}

void PluginProgress::poll(int64_t nowNs) {
  interpose::Recorder* recorder = interpose::Recorder::existing();
  CallSlot* calls = pools().calls.begin();
  if (recorder == nullptr || calls == nullptr) return;
  trace::RingWriter& writer = recorder->writer();
  std::vector<Pending>& pending = pending_;
  pending.clear();
  for (size_t i = 0; i < kCallSlots; ++i) {
    CallSlot& slot = calls[i];
    if (!isPublished(slot)) continue;
    const EventKind kind = slot.kind.load(std::memory_order_relaxed);
    // Again, to read what its owner filled in: the calling thread may have given the slot back
    // and claimed it for another event since (an API slot goes back when its operation starts).
    if (!isPublished(slot)) continue;
    if (kind == EventKind::kCollApi || kind == EventKind::kP2pApi) {
      // An API event whose operation never came (NCCL ran it without a Coll/P2p event).
      if (!slot.apiStopped.load(std::memory_order_acquire)) continue;
      int64_t seenNs = slot.stoppedApiSeenNs.load(std::memory_order_relaxed);
      if (seenNs == 0) slot.stoppedApiSeenNs.store(seenNs = nowNs, std::memory_order_relaxed);
      if (nowNs - seenNs > kOrphanApiNs) pools().calls.release(&slot);
      continue;
    }
    if (!slot.hasRecord) continue;
    Pending call{};
    if (sweep(slot, writer, nowNs, &call)) pending.push_back(call);
  }
  buildProgress(pending);
  buildWaits(pending, nowNs);
}

}  // namespace

void startProgressSource() {
  static PluginProgress* source = new PluginProgress;  // lives as long as the watchdog
  watchdog::setProgressSource(source);
}

}  // namespace ncclwatch::plugin
