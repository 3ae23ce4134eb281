// Rolling a job's trace files back to just before the abort that ended its hang (before_aborts.h).
#include "analysis/before_aborts.h"

#include <algorithm>
#include <map>
#include <tuple>

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
    case RecordState::kIssued:
      // A split or shrink of it still in flight. A collective's pending state says nothing: the
      // abort marks those it ends aborted, and one the watchdog had not yet seen complete when
      // the process aborted at its normal teardown is no hang.
      return trace::isLifecycle(r.op);
    default:
      return false;
  }
}

std::string jobOf(const trace::TraceFile& file) {
  return std::string(trace::jobIdOf(file.header));
}

// A collective of one job's communicator at one seq.
using CallKey = std::tuple<std::string, uint64_t, uint64_t>;

// Per file, its aborts with the calls of their own communicator each found unfinished.
struct Candidate {
  size_t abort;
  std::vector<size_t> unfinished;
};

std::vector<Candidate> candidates(const trace::TraceFile& file) {
  std::vector<Candidate> out;
  for (size_t a = 0; a < file.records.size(); ++a) {
    const CallRecord& abort = file.records[a];
    if (abort.op != OpKind::kAbort) continue;
    Candidate c{a, {}};
    for (size_t i = 0; i < a; ++i) {
      const CallRecord& r = file.records[i];
      if (r.commHash != abort.commHash || r.op == OpKind::kInit) continue;
      if (unfinishedAt(r, abort.issueNs)) c.unfinished.push_back(i);
    }
    // ncclwatch's own abort ends the hang it was asked for, whatever the aborting rank had
    // pending (a rank stuck outside NCCL, the dead rank of the verdict, had nothing).
    if (!c.unfinished.empty() || trace::madeByNcclwatch(abort)) {
      out.push_back(std::move(c));
    }
  }
  return out;
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
  std::vector<std::vector<Candidate>> perFile(files.size());
  // The collectives those aborts ended: one another rank completed was no hang (a rank that
  // aborted with its own calls still in flight, which its peers went on to complete, is the
  // local-abort bug, not the end of a hang).
  std::map<CallKey, std::vector<int>> completedBy;  // pids, of the calls asked about only
  for (size_t f = 0; f < files.size(); ++f) {
    if (!files[f].usable) continue;
    perFile[f] = candidates(files[f]);
    for (const Candidate& c : perFile[f]) {
      for (size_t i : c.unfinished) {
        const CallRecord& r = files[f].records[i];
        if (trace::isCollective(r.op)) completedBy[{jobOf(files[f]), r.commHash, r.seq}];
      }
    }
  }
  if (!completedBy.empty()) {
    for (const trace::TraceFile& file : files) {
      if (!file.usable) continue;
      std::string job = jobOf(file);
      for (const CallRecord& r : file.records) {
        if (r.state != RecordState::kCompleted || !trace::isCollective(r.op)) continue;
        auto found = completedBy.find({job, r.commHash, r.seq});
        if (found != completedBy.end()) found->second.push_back(file.header.pid);
      }
    }
  }
  auto hung = [&](const trace::TraceFile& file, const CallRecord& r) {
    if (!trace::isCollective(r.op)) return true;
    const std::vector<int>& by = completedBy[{jobOf(file), r.commHash, r.seq}];
    return std::all_of(by.begin(), by.end(), [&](int pid) { return pid == file.header.pid; });
  };
  // Per job id, the earliest abort that ended a hang, in wall-clock time.
  std::map<std::string, RolledBack> byJob;
  for (size_t f = 0; f < files.size(); ++f) {
    const trace::TraceFile& file = files[f];
    for (const Candidate& c : perFile[f]) {
      bool endedAHang = trace::madeByNcclwatch(file.records[c.abort]) ||
                        std::any_of(c.unfinished.begin(), c.unfinished.end(),
                                    [&](size_t i) { return hung(file, file.records[i]); });
      if (!endedAHang) continue;
      const CallRecord& abort = file.records[c.abort];
      int64_t wall = abort.issueNs + toWall(file);
      auto [slot, added] = byJob.try_emplace(jobOf(file));
      if (added || wall < slot->second.atNs) {
        slot->second.jobId = jobOf(file);
        slot->second.atNs = wall;
        slot->second.rank = file.header.rank;
        slot->second.comm = abort.commHash;
        slot->second.byNcclwatch = trace::madeByNcclwatch(abort);
      }
      break;  // its first such abort
    }
  }
  if (byJob.empty()) return {};
  for (trace::TraceFile& file : files) {
    if (!file.usable) continue;
    auto found = byJob.find(jobOf(file));
    if (found == byJob.end()) continue;
    RolledBack& rolled = found->second;
    int64_t t = rolled.atNs - toWall(file);
    // A process that began after the abort (a restart under the same job id) is another try.
    if (!file.records.empty() && file.records.front().issueNs >= t) continue;
    file.readBeforeAbort = true;
    size_t kept = 0;
    for (CallRecord& r : file.records) {
      if (r.issueNs >= t) {
        ++rolled.left;
        file.ranAfterAbort = true;
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
  std::string who = rolled.byNcclwatch
                        ? "ncclwatch aborted comm " + shortHash(rolled.comm) + " on rank " +
                              std::to_string(rolled.rank) + " (run --abort or NCCLWATCH_ON_HANG)"
                        : "rank " + std::to_string(rolled.rank) + " aborted comm " +
                              shortHash(rolled.comm) + " with a call of its own on it unfinished";
  return "Read as of " + wallText(rolled.atNs) + ", just before " + who +
         ": that abort ended the hang, so " + calls(rolled.undone) + " that finished after it " +
         (rolled.undone == 1 ? "is" : "are") + " read as pending and " + calls(rolled.left) +
         " issued after it " + (rolled.left == 1 ? "is" : "are") + " left out.";
}

}  // namespace ncclwatch::analysis
