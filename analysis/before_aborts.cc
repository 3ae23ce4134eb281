// Rolling a job's trace files back to just before the abort that ended its hang (before_aborts.h).
#include "analysis/before_aborts.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "analysis/describe.h"

namespace ncclwatch::analysis {
namespace {

using trace::CallRecord;
using trace::OpKind;
using trace::RecordState;

int64_t toWall(const trace::TraceFile& file) {
  return file.header.anchorRealtimeNs - file.header.anchorMonotonicNs;
}

// Whether `r`, issued before `t` (the process's monotonic clock), was still unfinished at `t`.
// A failure without a time (written before failures were stamped) is taken as one at the call:
// NCCL refused it at once.
bool unfinishedAt(const CallRecord& r, int64_t t) {
  if (r.issueNs >= t) return false;
  switch (r.state) {
    case RecordState::kAborted:
      return true;  // only an abort of its communicator ends a call so
    case RecordState::kFailed:
      return r.completeNs >= t;
    case RecordState::kCompleted:
      return r.completeNs >= t;
    case RecordState::kIssued:
      // A split or shrink of it still in flight. A collective's pending state says nothing: the
      // abort marks those it ends aborted, and one the watchdog had not yet seen complete when
      // the process aborted at its normal teardown is no hang.
      return trace::isLifecycle(r.op);
    default:
      return false;
  }
}

// The first abort in `file` that ended a hang: its process had a call of its own on that
// communicator unfinished when it issued it. -1 if none.
ptrdiff_t firstAbortOfAHang(const trace::TraceFile& file) {
  for (size_t a = 0; a < file.records.size(); ++a) {
    const CallRecord& abort = file.records[a];
    if (abort.op != OpKind::kAbort) continue;
    for (size_t i = 0; i < a; ++i) {
      const CallRecord& r = file.records[i];
      if (r.commHash != abort.commHash || r.op == OpKind::kInit) continue;
      if (unfinishedAt(r, abort.issueNs)) return static_cast<ptrdiff_t>(a);
    }
  }
  return -1;
}

// The state `r` had at `t` (its own monotonic clock), from its times: what finished later (or
// failed or was aborted later) is undone. True if anything changed.
bool undoAfter(CallRecord& r, int64_t t) {
  bool finishedLater = r.state == RecordState::kAborted ||
                       ((r.state == RecordState::kCompleted || r.state == RecordState::kFailed) &&
                        r.completeNs >= t);
  bool startedLater = r.startNs >= t;
  if (!finishedLater && !(r.state == RecordState::kStarted && startedLater)) return false;
  if (r.startNs != 0 && r.startNs < t) {
    r.state = RecordState::kStarted;
  } else {
    r.state = RecordState::kIssued;
    r.startNs = 0;
  }
  r.completeNs = 0;
  r.result = 0;
  return true;
}

}  // namespace

std::vector<RolledBack> rollBackToBeforeAborts(std::vector<trace::TraceFile>& files) {
  // Per job id, the earliest abort that ended a hang, in wall-clock time.
  std::map<std::string, RolledBack> byJob;
  for (const trace::TraceFile& file : files) {
    if (!file.usable) continue;
    ptrdiff_t a = firstAbortOfAHang(file);
    if (a < 0) continue;
    std::string job(file.header.jobId, strnlen(file.header.jobId, sizeof file.header.jobId));
    int64_t wall = file.records[static_cast<size_t>(a)].issueNs + toWall(file);
    auto [slot, added] = byJob.try_emplace(job);
    if (added || wall < slot->second.atNs) {
      slot->second.jobId = job;
      slot->second.atNs = wall;
      slot->second.rank = file.header.rank;
      slot->second.comm = file.records[static_cast<size_t>(a)].commHash;
    }
  }
  if (byJob.empty()) return {};
  for (trace::TraceFile& file : files) {
    if (!file.usable) continue;
    std::string job(file.header.jobId, strnlen(file.header.jobId, sizeof file.header.jobId));
    auto found = byJob.find(job);
    if (found == byJob.end()) continue;
    RolledBack& rolled = found->second;
    int64_t t = rolled.atNs - toWall(file);
    // A process that began after the abort (a restart under the same job id) is another try.
    if (!file.records.empty() && file.records.front().issueNs >= t) continue;
    size_t kept = 0;
    for (CallRecord& r : file.records) {
      if (r.issueNs >= t) {
        ++rolled.left;
        continue;
      }
      rolled.undone += undoAfter(r, t) ? 1 : 0;
      file.records[kept++] = r;
    }
    file.records.resize(kept);
  }
  std::vector<RolledBack> out;
  for (auto& [job, rolled] : byJob) out.push_back(rolled);
  return out;
}

std::string rolledBackText(const RolledBack& rolled) {
  auto calls = [](uint64_t n) { return std::to_string(n) + (n == 1 ? " call" : " calls"); };
  return "Read as of " + wallText(rolled.atNs) + ", just before rank " +
         std::to_string(rolled.rank) + " aborted comm " + shortHash(rolled.comm) +
         " with a call of its own on it unfinished: that abort ended the hang, so " +
         calls(rolled.undone) + " that finished after it are read as pending and " +
         calls(rolled.left) + " issued after it are left out.";
}

}  // namespace ncclwatch::analysis
