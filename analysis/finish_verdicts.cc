// After the checks: which verdicts are consequences of others, their order, how sure each is,
// where the evidence is incomplete, the stack tops of their classes, and the per-comm summary.
#include "analysis/job_state.h"
#include "analysis/sort_by_index.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"
#include "analysis/stack_tree.h"

namespace ncclwatch::analysis::internal {

namespace {

int priority(const Verdict& v) {
  switch (v.kind) {
    case VerdictKind::kError:
      return -1;
    case VerdictKind::kInitHang:
      return 0;
    case VerdictKind::kMismatch:
      return v.fields.size() == 1 && v.fields[0] == "color" ? 1 : 3;
    case VerdictKind::kDeadlock:
      return 2;
    case VerdictKind::kDeadRank:
      return 4;
    case VerdictKind::kUnmatchedP2p:
      return 5;
    case VerdictKind::kStuck:
      return 6;
    case VerdictKind::kMissing:
      return 7;
    case VerdictKind::kStraggler:
      return 9;
  }
  return 8;
}

// The ranks a verdict involves (its culprits and classes), sorted, each once. A verdict on the
// world lists every rank: marked in a table when they are dense (a sort of 32,768 ranks was 5% of
// a divergence's pass), sorted otherwise (a damaged trace's ranks).
std::vector<int> involvedRanks(const Verdict& v) {
  size_t count = v.culprits.size();
  int top = -1;
  bool negative = false;
  auto look = [&](int rank) {
    top = std::max(top, rank);
    negative |= rank < 0;
  };
  for (int rank : v.culprits) look(rank);
  for (const RankClass& rc : v.classes) {
    count += rc.ranks.size();
    for (int rank : rc.ranks) look(rank);
  }
  std::vector<int> ranks;
  if (!negative && top >= 0 && static_cast<size_t>(top) < 2 * count + 1024) {
    std::vector<char> marked(static_cast<size_t>(top) + 1, 0);
    for (int rank : v.culprits) marked[static_cast<size_t>(rank)] = 1;
    for (const RankClass& rc : v.classes) {
      for (int rank : rc.ranks) marked[static_cast<size_t>(rank)] = 1;
    }
    for (int rank = 0; rank <= top; ++rank) {
      if (marked[static_cast<size_t>(rank)]) ranks.push_back(rank);
    }
    return ranks;
  }
  ranks.assign(v.culprits.begin(), v.culprits.end());
  for (const RankClass& rc : v.classes) ranks.insert(ranks.end(), rc.ranks.begin(), rc.ranks.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

void JobAnalysis::finishVerdicts() {
  breakMissingCycles();
  // Consequences: a missing verdict whose absent ranks are all held by another verdict; p2p
  // and later verdicts after a wrong split colour.
  auto involves = [](const Verdict& v, int rank) {
    for (const RankClass& rc : v.classes) {
      if (std::find(rc.ranks.begin(), rc.ranks.end(), rank) != rc.ranks.end()) return true;
    }
    return false;
  };
  bool colour = false;
  for (const Verdict& v : verdicts_) {
    colour |= v.kind == VerdictKind::kMismatch && v.fields == std::vector<std::string>{"color"};
  }
  for (Verdict& v : verdicts_) {
    if (v.kind == VerdictKind::kMissing && !v.culprits.empty()) {
      const Verdict* holder = nullptr;
      bool all = true;
      for (int rank : v.culprits) {
        bool held = false;
        for (const Verdict& o : verdicts_) {
          // On its own communicator only an unmatched transfer holds them: a rank whose send or
          // receive waits there for a peer that never posts its side never reaches the
          // collective (a dist.gather to another dst: the others went on to the next step).
          if (&o == &v || o.kind == VerdictKind::kStraggler || o.kind == VerdictKind::kMissing ||
              (o.comm.hash == v.comm.hash && o.kind != VerdictKind::kUnmatchedP2p)) {
            continue;
          }
          if (involves(o, rank)) {
            held = true;
            holder = &o;
          }
        }
        all &= held;
      }
      if (all && holder != nullptr) {
        v.primary = false;
        v.explanation += " (a consequence: they are held by the " +
                         std::string(kindName(holder->kind)) + " on comm " +
                         hashText(holder->comm.hash) + ")";
      }
    }
    // What a failed call leaves behind (the others waiting, a mismatch or a missing call where
    // the failed rank stopped) is a consequence of the error.
    if (v.kind != VerdictKind::kError && v.kind != VerdictKind::kStraggler && !v.culprits.empty()) {
      for (const Verdict& error : verdicts_) {
        if (error.kind != VerdictKind::kError) continue;
        bool held = std::all_of(v.culprits.begin(), v.culprits.end(), [&](int rank) {
          return std::find(error.culprits.begin(), error.culprits.end(), rank) !=
                 error.culprits.end();
        });
        if (held && v.primary) {
          v.primary = false;
          v.explanation +=
              " (a consequence of the failed call of " + namedRanks(error.culprits) + ")";
        }
      }
    }
    if (colour && v.kind != VerdictKind::kStraggler &&
        !(v.kind == VerdictKind::kMismatch && v.fields == std::vector<std::string>{"color"})) {
      v.primary = false;
    }
  }
  std::stable_sort(verdicts_.begin(), verdicts_.end(), [](const Verdict& a, const Verdict& b) {
    if (a.primary != b.primary) return a.primary;
    return priority(a) < priority(b);
  });
}

CommSummary JobAnalysis::summarize(const Comm& comm) const {
  CommSummary s;
  s.comm = comm.desc;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::vector<int>> groups;
  for (const Member& m : comm.members) {
    s.ranks.push_back(procs_[m.proc].rank);
    s.calls = std::max(s.calls, m.maxSeq);
    groups[{m.maxSeq, m.completedSeq, m.pendingCount}].push_back(procs_[m.proc].rank);
  }
  // Members come in process order, which is rank order: sorted already, nearly always (a sort of
  // a sorted list still costs n log n: 32,768 ranks, several lists, each pass).
  if (!std::is_sorted(s.ranks.begin(), s.ranks.end())) std::sort(s.ranks.begin(), s.ranks.end());
  for (auto& [key, ranks] : groups) {
    CommSummary::Progress pr;
    pr.ranks = std::move(ranks);
    if (!std::is_sorted(pr.ranks.begin(), pr.ranks.end())) {
      std::sort(pr.ranks.begin(), pr.ranks.end());
    }
    std::tie(pr.issuedSeq, pr.completedSeq, pr.pending) = key;
    s.progress.push_back(std::move(pr));
  }
  return s;
}

void JobAnalysis::summarize(JobReport& report) {
  report.comms.reserve(report.comms.size() + comms_.size());
  for (const Comm& comm : comms_) {
    if (!redo(comm)) {
      report.comms.push_back(cache_->comms[comm.hash].summary);
      continue;
    }
    report.comms.push_back(summarize(comm));
    if (cache_ != nullptr) cache_->comms[comm.hash].summary = report.comms.back();
  }
  sortByIndex(report.comms, [](const CommSummary& a, const CommSummary& b) {
    if (a.comm.parent == 0 && b.comm.parent != 0) return true;
    if (a.comm.parent != 0 && b.comm.parent == 0) return false;
    if (a.ranks != b.ranks) return a.ranks < b.ranks;
    return a.comm.hash < b.comm.hash;
  });
}

// How sure each verdict is. Timing-only doubts are added where the verdicts are made; here the
// evidence itself: ranks without a trace, lost records, calls whose completion nobody tracked.
// Ranks below `world` no process of the job has (procs_ is sorted by rank: a walk, where a set of
// the ranks took 32,768 tree inserts a pass).
std::vector<int> JobAnalysis::untracedRanks(int world) const {
  std::vector<int> untraced;
  size_t at = 0;
  for (int r = 0; r < world; ++r) {
    while (at < procs_.size() && procs_[at].rank < r) ++at;
    if (at == procs_.size() || procs_[at].rank != r) untraced.push_back(r);
  }
  return untraced;
}

// The process of `rank` (the last of them, should a damaged job have two), nullptr if none.
const Proc* JobAnalysis::procOfRank(int rank) const {
  auto after = std::upper_bound(procs_.begin(), procs_.end(), rank,
                                [](int r, const Proc& proc) { return r < proc.rank; });
  return after == procs_.begin() || (after - 1)->rank != rank ? nullptr : &*(after - 1);
}

void JobAnalysis::assessConfidence() {
  int world = 0;
  for (const Proc& proc : procs_) world = std::max(world, proc.file->header.world);
  std::vector<int> untraced = untracedRanks(world);
  for (Verdict& v : verdicts_) {
    if (v.kind == VerdictKind::kStraggler) continue;
    auto doubt = [&v](double factor, std::string why) {
      v.confidence *= factor;
      v.doubts.push_back(std::move(why));
    };
    auto known = commIndex_.find(v.comm.hash);
    int members =
        known == commIndex_.end() ? 0 : static_cast<int>(comms_[known->second].members.size());
    if (known != commIndex_.end() && members < v.comm.size) {
      int missing = v.comm.size - members;
      doubt(0.5, std::to_string(missing) + " of the communicator's " + std::to_string(v.comm.size) +
                     " ranks " + (missing == 1 ? "has" : "have") + " no trace (" +
                     (untraced.empty() ? "not recorded" : namedRanks(untraced)) + "): what " +
                     (missing == 1 ? "it" : "they") + " did is unknown");
    } else if (!untraced.empty()) {
      doubt(0.8, namedRanks(untraced) + " of the job " + (untraced.size() == 1 ? "has" : "have") +
                     " no trace");
    }
    std::vector<int> involved = involvedRanks(v);
    std::vector<int> lossy, untracked;
    uint64_t lost = 0;
    for (int rank : involved) {
      const Proc* proc = procOfRank(rank);
      if (proc == nullptr) continue;
      const trace::TraceFile& file = *proc->file;
      uint64_t missing = file.lostRecords + file.header.droppedRecords;
      if (missing > 0) {
        lossy.push_back(rank);
        lost += missing;
      }
    }
    if (!lossy.empty()) {
      doubt(0.6, std::to_string(lost) + " records of " + namedRanks(lossy) +
                     " were lost: calls between the ones kept are unknown");
    }
    // Completion tracking: each class's first rank's record of its call stands for the class.
    for (const RankClass& rc : v.classes) {
      if (rc.ranks.empty() || rc.call.seq == 0 || rc.call.commHash == 0) continue;
      const Proc* proc = procOfRank(rc.ranks.front());
      if (proc == nullptr) continue;
      const auto& records = proc->file->records;
      for (size_t i = records.size(); i-- > 0;) {
        const CallRecord& r = records[i];
        if (r.commHash != rc.call.commHash || r.seq != rc.call.seq || !isSequenced(r)) continue;
        bool tracked = isTracked(r) || (r.flags & trace::kRecordKernelTracked) != 0;
        if (!tracked && (trace::isCollective(r.op) || trace::isPointToPoint(r.op))) {
          untracked.insert(untracked.end(), rc.ranks.begin(), rc.ranks.end());
        }
        break;
      }
    }
    if (!untracked.empty()) {
      doubt(0.75, "completion was not tracked for the calls of " + namedRanks(untracked) +
                      " (captured in a CUDA graph, or events off): whether they ran and finished "
                      "is unknown");
    }
  }
}

void JobAnalysis::noteEvidenceGaps(JobReport& report) const {
  std::vector<int> untraced = untracedRanks(report.world), noEvents, wrapped;
  if (!untraced.empty()) {
    report.evidenceGaps.push_back(namedRanks(untraced) + " left no trace");
  }
  for (const Proc& proc : procs_) {
    const trace::TraceFile& file = *proc.file;
    uint64_t lost = file.lostRecords + file.header.droppedRecords;
    if (lost > 0) {
      report.evidenceGaps.push_back("rank " + std::to_string(proc.rank) + " lost " +
                                    std::to_string(lost) + " records");
    }
    // Counted in analyzeJobs's one scan of the records.
    if (proc.calls > 0 && !proc.anyTracked) noEvents.push_back(proc.rank);
    if (proc.shed > 0 && proc.anyTracked) {
      report.evidenceGaps.push_back(
          "rank " + std::to_string(proc.rank) + " left " + std::to_string(proc.shed) + " of " +
          std::to_string(proc.calls) +
          " calls untracked (no free CUDA event: its calls outran the watchdog)");
    }
    if (!file.continuous && file.header.nextIndex > file.header.capacity) {
      wrapped.push_back(proc.rank);
    }
  }
  if (!noEvents.empty()) {
    report.evidenceGaps.push_back("completion was not tracked on " + namedRanks(noEvents) +
                                  " (events off or unavailable)");
  }
  if (!wrapped.empty()) {
    report.evidenceGaps.push_back("the rings of " + namedRanks(wrapped) +
                                  " overwrote their oldest calls (NCCLWATCH_TRACE=full keeps all)");
  }
}

// Timing alone: nothing moved for the quiet time while calls were pending. A rank slower than
// that, still alive, looks the same.
void JobAnalysis::restsOnTiming(Verdict& v) const {
  if (!stalledByQuiet_) return;
  bool anyCulpritAlive = v.culprits.empty();
  for (int rank : v.culprits) {
    for (const Proc& proc : procs_) anyCulpritAlive |= proc.rank == rank && proc.alive;
  }
  if (!anyCulpritAlive) return;
  char text[200];
  std::snprintf(text, sizeof text,
                "rests on timing alone: no NCCL progress for %.1f s while calls were pending; "
                "a rank slower than that would look the same",
                (now_ - jobLastActivity_) / 1e9);
  v.confidence *= 0.75;
  v.doubts.push_back(text);
}

// Each class's first rank with a dump says where it was: the frames, in its dump taken on the
// hang (hangDumpOf: not a later SIGABRT/SIGTERM dump of its teardown), of the thread
// that issued the class's call (ranks of one class made the same call, so one speaks for all).
void JobAnalysis::addStackTops() {
  std::unordered_map<int, const Proc*> withDump;  // rank -> its process, when it has a dump
  for (const Proc& proc : procs_) {
    if (!proc.file->dumps.empty()) withDump[proc.rank] = &proc;
  }
  if (withDump.empty()) return;
  for (Verdict& verdict : verdicts_) {
    for (RankClass& rankClass : verdict.classes) {
      for (int rank : rankClass.ranks) {
        auto found = withDump.find(rank);
        if (found == withDump.end()) continue;
        const Proc& proc = *found->second;
        rankClass.stackTop =
            stackTop(*hangDumpOf(*proc.file), rankClass.call.threadId, proc.file->header.pid);
        // A thread caught inside the interpreter with no Python frame to name says nothing a
        // user can act on ("in [Python: untrack_tuples at gcmodule.c:638]", exp24's dtype16,
        // dumped while it ran on after a call that completed): the class's next rank may do.
        if (rankClass.stackTop.starts_with("[Python: ")) rankClass.stackTop.clear();
        if (!rankClass.stackTop.empty()) break;
      }
    }
  }
}

}  // namespace ncclwatch::analysis::internal
