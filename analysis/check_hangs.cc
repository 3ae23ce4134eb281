// Hangs: whether the job stopped making progress, ranks that died or never issued what the
// others wait in, and missing-rank verdicts that hold each other.
#include "analysis/job_state.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"

namespace {

// "SIGSEGV" for 11; the number alone where the C library has no name.
std::string signalText(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation != nullptr ? std::string("SIG") + abbreviation : std::to_string(signal);
}

}  // namespace

namespace ncclwatch::analysis::internal {

void JobAnalysis::decideStalled() {
  bool anyAlive = false, anyUnclean = false, anyPending = false;
  for (Proc& proc : procs_) {
    jobLastActivity_ = std::max(jobLastActivity_, proc.lastActivity);
    anyAlive |= proc.alive;
    // Read as of before the abort that ended a hang: it ran then; its clean exit came after.
    anyUnclean |= (!proc.clean && !proc.alive) || proc.file->readBeforeAbort;
    anyPending |= proc.pending;  // from its progress (comm_progress.h)
  }
  ended_ = !anyAlive;
  // From the progress kept on arrival (comm_progress.h): every communicator's, aligned or not.
  bool countsDiffer = false;
  for (const Comm& comm : comms_) countsDiffer |= comm.progress.countsDiffer;
  if (anyAlive) {
    stalled_ = (anyPending || countsDiffer) && now_ - jobLastActivity_ >= options_.quietNs;
    stalledByQuiet_ = stalled_;
  } else {
    stalled_ = anyUnclean && (anyPending || countsDiffer);
  }
}

uint64_t JobAnalysis::leftBehind(const Comm& comm, const Member& gone) const {
  uint64_t first = 0;
  for (const Member& m : comm.members) {
    if (m.proc == gone.proc) continue;
    for (const auto& [index, ordinal] : pendingOrdinal_[m.proc]) {
      if (ordinal <= gone.lastOrdinal() || (first != 0 && ordinal >= first)) continue;
      const CallRecord& r = procs_[m.proc].rec(index);
      if (r.commHash != comm.hash || !trace::isCollective(r.op) || impliedDone(m.proc, index)) {
        continue;
      }
      first = ordinal;
    }
  }
  return first;
}

// A missing verdict's last clause, which sends the user to the verdicts that hold its absent
// ranks; breakMissingCycles drops it where those verdicts are this one's other half.
constexpr std::string_view kFindWhatHolds = ": find what holds ";

void JobAnalysis::checkDeadAndMissing() {
  // A process that ended without a clean shutdown while live ones wait is evidence enough: it
  // will never issue what they wait for, so the job need not go quiet first.
  bool liveOnesWait = false;
  for (const Proc& proc : procs_) liveOnesWait |= proc.alive && proc.pending;
  // Per comm the furthest any member got, and per process its memberships: the loop below is
  // then linear in the memberships, not processes x members (4096 ranks share one world).
  std::vector<uint64_t> furthest(comms_.size(), 0);
  std::vector<std::vector<std::pair<const Comm*, const Member*>>> memberships(procs_.size());
  for (size_t c = 0; c < comms_.size(); ++c) {
    if (comms_[c].members.size() < 2) continue;
    for (const Member& m : comms_[c].members) {
      furthest[c] = std::max(furthest[c], m.lastOrdinal());
      memberships[m.proc].push_back({&comms_[c], &m});
    }
  }
  // Dead (or silent) ranks: behind on every comm they share with others, nothing that explains
  // it pending, and the process gone, or alive but silent for quietNs.
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    const Proc& proc = procs_[p];
    bool crashed = !proc.alive && !proc.clean && liveOnesWait;
    // A process that ended normally (returning from main is no excuse) while another member of
    // one of its communicators waits in a collective it never issued: it will never come. (One
    // that ended otherwise was crashed or killed: the checks below judge it.)
    const Comm* leftWaiting = nullptr;
    uint64_t leftOrdinal = 0;
    if (!proc.alive && proc.clean) {
      for (auto [commPointer, mine] : memberships[p]) {
        // A communicator whose ranks already diverged: that verdict says why they wait.
        bool explained = false;
        for (const Verdict& v : verdicts_) explained |= v.comm.hash == commPointer->hash;
        if (explained) continue;
        uint64_t k = leftBehind(*commPointer, *mine);
        if (k != 0 && (leftWaiting == nullptr || k < leftOrdinal)) {
          leftWaiting = commPointer;
          leftOrdinal = k;
        }
      }
    }
    if (!stalled_ && !crashed && leftWaiting == nullptr) continue;
    bool silent = proc.alive ? now_ - proc.lastActivity >= options_.quietNs : true;
    if (!silent) continue;
    bool behindSomewhere = false, aheadOrEqualSomewhere = false;
    const Comm* where = nullptr;
    uint64_t whereOrdinal = 0;
    for (auto [commPointer, mine] : memberships[p]) {
      const Comm& comm = *commPointer;
      uint64_t best = furthest[static_cast<size_t>(commPointer - comms_.data())];
      if (mine->lastOrdinal() < best) {
        behindSomewhere = true;
        if (where == nullptr || comm.members.size() > where->members.size()) {
          where = &comm;
          whereOrdinal = mine->lastOrdinal() + 1;
        }
      } else {
        aheadOrEqualSomewhere = true;
      }
    }
    // A rank inside a call (its stream reached it, or a blocking lifecycle call) is waiting, not
    // dead; a rank another verdict already blames is explained. A process that is gone with
    // nothing pending waits for nothing: behind on one comm is enough (its peers on another may
    // have stopped there waiting for it too); a live one must be behind everywhere.
    uint32_t w = waitPoint(p);
    bool goneIdle = !proc.alive && w == kNone;
    if (leftWaiting != nullptr) {
      where = leftWaiting;
      whereOrdinal = leftOrdinal;
    } else {
      if (!behindSomewhere || (aheadOrEqualSomewhere && !goneIdle)) continue;
      if (w != kNone &&
          (proc.rec(w).state == RecordState::kStarted || trace::isLifecycle(proc.rec(w).op))) {
        continue;
      }
    }
    // A collective every other member completed was made by this rank too: its records of it
    // never arrived (a stopped process's watchdog sends nothing; a killed one's last poll may
    // not have gone out). The others wait further on: the first call not all of them completed
    // (exp25's sigstop said "wait for it in #2", a call they had completed).
    uint64_t unreportedThrough = 0;  // the seq of the last such call, 0 if none
    if (leftWaiting == nullptr) {
      uint64_t k = whereOrdinal;
      for (;; ++k) {
        bool completedByAll = true, held = false;
        for (const Member& m : where->members) {
          if (m.proc == p) continue;
          uint32_t i = m.at(k);
          if (i == kNone) {
            completedByAll = false;
            break;
          }
          const CallRecord& r = procs_[m.proc].rec(i);
          held = true;
          // Not a broadcast: its last hops need nothing of a non-root rank, and a small one
          // may complete on the others before that rank takes part.
          completedByAll &= trace::isCollective(r.op) && r.op != OpKind::kBroadcast &&
                            r.state == RecordState::kCompleted;
        }
        if (!held || !completedByAll) break;
      }
      // Only where some member has a call there to wait in.
      bool waitsThere = false;
      for (const Member& m : where->members) waitsThere |= m.proc != p && m.at(k) != kNone;
      if (k > whereOrdinal && waitsThere) {
        for (const Member& m : where->members) {
          if (m.proc == p || m.at(k - 1) == kNone) continue;
          unreportedThrough = procs_[m.proc].rec(m.at(k - 1)).seq;
          break;
        }
        whereOrdinal = k;
      }
    }
    bool blamed = false;
    for (const Verdict& other : verdicts_) {
      blamed |= std::find(other.culprits.begin(), other.culprits.end(), proc.rank) !=
                other.culprits.end();
    }
    if (blamed) continue;
    deadRanks_.insert(p);
    Verdict v = make(VerdictKind::kDeadRank, where, 0);
    RankClass waiting;
    for (const Member& m : where->members) {
      if (m.proc == p) continue;
      uint32_t i = m.at(whereOrdinal);
      if (i == kNone) continue;
      waiting.ranks.push_back(procs_[m.proc].rank);
      if (waiting.call.op == OpKind::kUnknown) waiting.call = describe(procs_[m.proc], i);
    }
    v.seq = waiting.call.seq;
    // A creation (init, split) the dead rank never joined; a teardown it never reached is the
    // job's end, not its initialisation: a dead rank as any other call.
    if (trace::isLifecycle(waiting.call.op) && !isTeardown(waiting.call.op)) {
      v.kind = VerdictKind::kInitHang;
    }
    RankClass dead;
    dead.ranks = {proc.rank};
    // Read as of before the abort that ended the hang, a process that issued calls after it
    // (its own abort) was running then, whatever ended it later: alive but silent, as the live
    // collector saw it.
    const bool aliveThen = proc.alive || proc.file->ranAfterAbort;
    const bool failedExit = proc.clean && proc.exitStatus && *proc.exitStatus != 0;
    // How an unclean end came: a fatal signal its handler saw, or (its ring says none) one no
    // handler sees: SIGKILL, which the OOM killer and launchers send, or _exit().
    const int fatalSignal = proc.file->header.fatalSignal;
    // SIGTERM is no fatal signal to the handler, but its dump says it came (a launcher stopping
    // the job, a timeout, a scheduler's time limit): read as SIGKILL, it sent users to dmesg
    // (exp26's loader_spin, stopped by `timeout` while it spun in its data loader).
    const trace::Dump* sigterm = nullptr;
    for (const trace::Dump& dump : proc.file->dumps) {
      if (dump.trigger == "sigterm") sigterm = &dump;
    }
    const bool terminated = !aliveThen && !proc.clean && fatalSignal == 0 && sigterm != nullptr;
    const bool killedUnseen =
        !aliveThen && !proc.clean && fatalSignal == 0 && !terminated && proc.file->endRecorded;
    const std::string signalName =
        fatalSignal > 0 ? std::to_string(fatalSignal) + " (" + signalText(fatalSignal) + ")" : "";
    // Stopped (SIGSTOP, a debugger), nothing of it runs: its watchdog neither sends its last
    // calls nor dumps, and an abort cannot reach it (exp25's sigstop read as any silent rank).
    const bool stopped = proc.alive && stoppedHere(*proc.file);
    if (stopped) {
      dead.call.note = "alive but stopped (state T): nothing in it runs";
    } else if (aliveThen) {
      dead.call.note = "alive but silent: no NCCL call for a while";
    } else if (!proc.clean && fatalSignal > 0) {
      dead.call.note = "process died of signal " + signalName;
    } else if (terminated) {
      dead.call.note = "process terminated by SIGTERM (a launcher, a timeout, a scheduler)";
    } else if (killedUnseen) {
      dead.call.note =
          "process ended with no exit() and no fatal signal a handler saw: killed by SIGKILL (the "
          "OOM killer, a launcher) or ended by _exit()";
    } else if (failedExit) {
      dead.call.note = "process exited with status " + std::to_string(*proc.exitStatus) +
                       " (a failure) without issuing it, its communicator never destroyed";
    } else if (proc.clean) {
      dead.call.note = std::string("process exited normally (returned from main or called exit") +
                       (proc.exitStatus ? " 0" : "") +
                       ") without issuing it, its communicator never destroyed";
    } else {
      dead.call.note = "process ended without a clean shutdown (crashed or exited)";
    }
    v.classes.push_back(std::move(waiting));
    v.classes.push_back(std::move(dead));
    v.culprits = {proc.rank};
    v.culpritAlive = proc.alive;
    v.culpritStopped = stopped;
    v.divergenceNs = proc.lastActivity;
    if (failedExit && !aliveThen) {
      v.explanation = "rank " + std::to_string(proc.rank) + " failed (exit status " +
                      std::to_string(*proc.exitStatus) + ") while the others wait for it in #" +
                      std::to_string(v.seq) +
                      ": its own error is the cause, look at its output (a Python rank exits 1 "
                      "after an uncaught exception: its traceback is on that rank's stderr); the "
                      "others hang because it never made this call";
    } else if (proc.clean && !aliveThen) {
      v.explanation = "rank " + std::to_string(proc.rank) +
                      " ended normally while the others wait for it in #" + std::to_string(v.seq) +
                      ": it left the job early (an early return or exit on a rank-dependent "
                      "path); every rank must make the same collectives before it leaves";
    } else if (stopped) {
      v.explanation = "rank " + std::to_string(proc.rank) + " (pid " +
                      std::to_string(proc.file->header.pid) +
                      ") is stopped (state T: SIGSTOP, SIGTSTP or a debugger) while the others "
                      "wait for it in #" +
                      std::to_string(v.seq) +
                      ": nothing in it runs, not its dump nor an abort, and its last calls may "
                      "not have reached ncclwatch; `kill -CONT " +
                      std::to_string(proc.file->header.pid) + "` resumes it";
    } else if (aliveThen) {
      // Alive: no exit status or core dump to look at. Where it is now says which it is: a
      // long host step (a checkpoint, a data loader) ends by itself, a wait outside NCCL does
      // not.
      v.explanation = "rank " + std::to_string(proc.rank) +
                      " is alive but stopped issuing NCCL calls while the others wait for it in #" +
                      std::to_string(v.seq) +
                      ": its stack (the dump) shows where it is: a long host step (a checkpoint, "
                      "data loading) ends by itself, a wait outside NCCL (a lock, a queue, "
                      "another library's barrier) does not";
    } else if (fatalSignal > 0) {
      v.explanation = "rank " + std::to_string(proc.rank) + " died of signal " + signalName +
                      " while the others wait for it in #" + std::to_string(v.seq) +
                      ": its crash is the cause; its dump (`ncclwatch stacks`), core dump or "
                      "log say where";
    } else if (terminated) {
      // Silent for the quiet time before the SIGTERM: the silence is the cause, the SIGTERM
      // what ended the wait (its dump's stack says where the rank was).
      const bool silentBefore = proc.wall(sigterm->timeNs) - proc.lastActivity >= options_.quietNs;
      v.explanation =
          "rank " + std::to_string(proc.rank) +
          (silentBefore ? " stopped issuing NCCL calls while the others wait for it in #" +
                              std::to_string(v.seq) +
                              ", and was then terminated by SIGTERM (a launcher, a timeout, a "
                              "scheduler): where it was before, in the stack of its SIGTERM "
                              "dump (`ncclwatch stacks`), is the cause"
                        : " was terminated by SIGTERM (a launcher, a timeout, a scheduler) while "
                          "the others wait for it in #" +
                              std::to_string(v.seq) +
                              ": what stopped it (its launcher's log, the scheduler's) says why");
    } else if (killedUnseen) {
      v.explanation = "rank " + std::to_string(proc.rank) +
                      " ended while the others wait for it in #" + std::to_string(v.seq) +
                      " with no exit() and no fatal signal a handler saw: SIGKILL (the OOM "
                      "killer, a launcher) or _exit(): look for the OOM killer in the kernel log "
                      "(dmesg) and at its launcher's log for the exit code";
    } else {
      v.explanation = "rank " + std::to_string(proc.rank) +
                      " is gone while the others wait for it in #" + std::to_string(v.seq) +
                      ": look at its exit status, core dump or log";
    }
    if (unreportedThrough != 0) {
      v.explanation += "; its calls through #" + std::to_string(unreportedThrough) +
                       " went through (the others completed them with it), but its records of "
                       "them never reached ncclwatch";
    }
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
  // Missing: on each comm, the first call some ranks wait in and others never issued (unless an
  // earlier mismatch on the comm already explains why their counts differ). Only once the job
  // stopped moving: ranks merely ahead by a few calls look the same.
  if (!stalled_) return;
  for (const Comm& comm : comms_) {
    if (comm.members.size() < 2) continue;
    bool explained = false;
    for (const Verdict& v : verdicts_) explained |= v.comm.hash == comm.hash;
    if (explained) continue;
    uint64_t minLast = UINT64_MAX, maxLast = 0;
    for (const Member& m : comm.members) {
      minLast = std::min(minLast, m.lastOrdinal());
      maxLast = std::max(maxLast, m.lastOrdinal());
    }
    if (minLast == maxLast) continue;
    uint64_t k = minLast + 1;
    RankClass waiting;
    std::vector<int> missing;
    bool pendingThere = false;
    int64_t since = INT64_MAX;
    for (const Member& m : comm.members) {
      uint32_t i = m.at(k);
      if (i == kNone) {
        missing.push_back(m.proc);
        continue;
      }
      const CallRecord& r = procs_[m.proc].rec(i);
      pendingThere |= isPending(r);
      since = std::min(since, procs_[m.proc].wall(r.issueNs));
      waiting.ranks.push_back(procs_[m.proc].rank);
      if (waiting.call.op == OpKind::kUnknown) waiting.call = describe(procs_[m.proc], i);
    }
    if (!pendingThere || waiting.ranks.empty()) continue;
    bool allDead = true;
    for (int p : missing) allDead &= deadRanks_.count(p) > 0;
    if (allDead) continue;  // the dead_rank verdict says it
    if (cycleThroughAHeldHost(comm, waiting, missing)) continue;
    bool lifecycle = trace::isLifecycle(waiting.call.op);
    Verdict v =
        make(lifecycle ? VerdictKind::kInitHang : VerdictKind::kMissing, &comm, waiting.call.seq);
    v.classes.push_back(std::move(waiting));
    std::map<std::tuple<uint64_t, uint64_t, int>, std::vector<int>> where;
    std::map<std::tuple<uint64_t, uint64_t, int>, CallDesc> whereCall;
    for (int p : missing) {
      CallDesc d = whereIs(p);
      auto key = std::make_tuple(d.commHash, d.seq, static_cast<int>(d.op));
      where[key].push_back(procs_[p].rank);
      whereCall[key] = d;
      v.culprits.push_back(procs_[p].rank);
    }
    for (auto& [key, ranks] : where) {
      RankClass rc;
      rc.ranks = ranks;
      rc.call = whereCall[key];
      if (rc.call.op != OpKind::kUnknown) {
        rc.call.note = "never issued #" + std::to_string(v.seq) + "; waits in " +
                       std::string(trace::opName(rc.call.op)) + " #" + std::to_string(rc.call.seq) +
                       " on comm " + hashText(rc.call.commHash);
      }
      v.classes.push_back(std::move(rc));
    }
    std::sort(v.classes.begin() + 1, v.classes.end(),
              [](const RankClass& a, const RankClass& b) { return a.ranks < b.ranks; });
    std::sort(v.culprits.begin(), v.culprits.end());
    v.divergenceNs = since == INT64_MAX ? 0 : since;
    std::string who = namedRanks(v.culprits);
    const std::vector<int>& waitingRanks = v.classes[0].ranks;
    const std::string waiters =
        namedRanks(waitingRanks) + (waitingRanks.size() == 1 ? " waits in " : " wait in ");
    const bool one = v.culprits.size() == 1;
    if (lifecycle) {
      v.explanation = waiters + trace::opName(v.classes[0].call.op) + " #" + std::to_string(v.seq) +
                      ", which " + who + " never called: every member must call it";
    } else {
      v.explanation =
          waiters + callText(v.classes[0].call) + " #" + std::to_string(v.seq) + " for " + who +
          ", which never issued it and " +
          (where.size() == 1 && where.begin()->second.size() == v.culprits.size() &&
                   whereCall.begin()->second.op != OpKind::kUnknown
               ? (one ? "waits elsewhere (see its line)" : "wait elsewhere (see their line)")
               : (one ? "is elsewhere" : "are elsewhere")) +
          std::string(kFindWhatHolds) + who + " (see the other verdicts)";
    }
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
}

// A call issued and never started while the same process has an earlier pending call: on its
// stream, or on another that PyTorch (or any program ordering its streams with events) made it
// wait for. It is not there for its peers yet.
bool JobAnalysis::heldBehindAnEarlierCall(int p, uint32_t index) const {
  const CallRecord& r = procs_[p].rec(index);
  if (startSeen(r) || !isPending(r)) return false;
  const auto& records = procs_[p].file->records;
  for (uint32_t i = 0; i < records.size(); ++i) {
    const CallRecord& o = records[i];
    if (i == index || o.issueNs >= r.issueNs) continue;
    if ((trace::isCollective(o.op) || trace::isPointToPoint(o.op)) && isPending(o) &&
        !impliedDone(p, i)) {
      return true;
    }
  }
  return false;
}

// The ranks `missing` never issued the call the others wait in on `comm` because their hosts
// are blocked in a call on another comm, whose peers there have it queued behind the very call
// that waits for the missing ranks (rank 0 in a subgroup barrier; rank 1, which skipped that
// barrier, already in the world's next collective with its own next barrier queued behind it).
// A cycle through a blocked host: said as a deadlock, its culprit the side that broke the order
// of calls it kept until then. False (nothing said) when the missing ranks are not held so.
bool JobAnalysis::cycleThroughAHeldHost(const Comm& comm, const RankClass& waiting,
                                        const std::vector<int>& missing) {
  if (missing.size() != 1) return false;
  const int x = missing[0];
  const uint32_t w = waitPoint(x);
  if (w == kNone) return false;
  const CallRecord& held = procs_[x].rec(w);
  auto found = commIndex_.find(held.commHash);
  const uint64_t k = ordinalOf(x, w);
  if (found == commIndex_.end() || held.commHash == comm.hash || k == 0 ||
      !trace::isCollective(held.op)) {
    return false;
  }
  const Comm& other = comms_[found->second];
  std::vector<int> queued;  // procs whose call at k is queued behind their call on `comm`
  uint32_t queuedIndex = kNone;
  for (const Member& m : other.members) {
    if (m.proc == x) continue;
    const uint32_t i = m.at(k);
    if (i == kNone) return false;  // a member that never issued it: that is missing, not this
    const CallRecord& theirs = procs_[m.proc].rec(i);
    // x's call there is not theirs (PyTorch's group=None sends a subgroup's call to the world):
    // a mismatch, which its own verdict names; what waits behind it is no cycle of orders.
    if (theirs.fingerprint != held.fingerprint) return false;
    // Finished there, or started and waiting in it as x is: not what holds x.
    if (!isPending(theirs) || startSeen(theirs)) continue;
    if (!heldBehindAnEarlierCall(m.proc, i)) {
      // Reached (a start inferred from stream order) with nothing earlier pending: it waits in
      // the call as x's peers do.
      if (theirs.state == RecordState::kStarted) continue;
      return false;
    }
    if (std::find(waiting.ranks.begin(), waiting.ranks.end(), procs_[m.proc].rank) ==
        waiting.ranks.end()) {
      return false;
    }
    queued.push_back(m.proc);
    queuedIndex = i;
  }
  if (queued.empty()) return false;
  std::vector<int> queuedRanks;
  for (int q : queued) queuedRanks.push_back(procs_[q].rank);
  std::sort(queuedRanks.begin(), queuedRanks.end());
  const bool queuedBroke =
      std::any_of(queued.begin(), queued.end(), [&](int q) { return brokeItsOwnOrder(q); });
  const bool heldBroke = brokeItsOwnOrder(x);
  std::vector<int> culprits;
  if (queuedBroke && !heldBroke) {
    culprits = queuedRanks;
  } else if (heldBroke && !queuedBroke) {
    culprits = {procs_[x].rank};
  } else {
    culprits = queuedRanks;
    culprits.push_back(procs_[x].rank);
    std::sort(culprits.begin(), culprits.end());
  }
  CallDesc heldCall = describe(procs_[x], w);
  Verdict v = make(VerdictKind::kDeadlock, &other, heldCall.seq);
  RankClass heldClass;
  heldClass.ranks = {procs_[x].rank};
  heldClass.call = heldCall;
  heldClass.call.note = "waits here; never issued #" + std::to_string(waiting.call.seq) +
                        " on comm " + hashText(comm.hash);
  RankClass queuedClass;
  queuedClass.ranks = queuedRanks;
  queuedClass.call = describe(procs_[queued[0]], queuedIndex);
  queuedClass.call.note =
      std::string(queuedClass.call.startInferred
                      ? "issued, and reached as far as its stream's NCCL calls show, yet held "
                        "behind its #"
                      : "issued, never started: queued behind its #") +
      std::to_string(waiting.call.seq) + " on comm " + hashText(comm.hash);
  RankClass waitingClass = waiting;
  waitingClass.call.note = "waits here for rank " + std::to_string(procs_[x].rank);
  v.classes = {std::move(heldClass), std::move(queuedClass), std::move(waitingClass)};
  std::sort(v.classes.begin(), v.classes.end(),
            [](const RankClass& a, const RankClass& b) { return a.ranks < b.ranks; });
  v.culprits = culprits;
  v.divergenceNs = procs_[x].wall(held.issueNs);
  const std::string xText = "rank " + std::to_string(procs_[x].rank);
  const std::string qText = namedRanks(queuedRanks);
  v.explanation = xText + " waits in " + callText(heldCall) + " #" + std::to_string(heldCall.seq) +
                  " on " + shortHash(other.hash) + " for " + qText + ", whose #" +
                  std::to_string(heldCall.seq) + " there is queued behind its " +
                  callText(waiting.call) + " #" + std::to_string(waiting.call.seq) + " on " +
                  shortHash(comm.hash) + ", which waits for " + xText +
                  ": a cycle across communicators. ";
  auto capitalized = [](std::string text) {
    if (!text.empty())
      text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    return text;
  };
  if (culprits == queuedRanks) {
    v.explanation += capitalized(qText) +
                     " broke the order of calls it kept until here: it went on to #" +
                     std::to_string(waiting.call.seq) + " on " + shortHash(comm.hash) +
                     " where it always made its call on " + shortHash(other.hash) +
                     " first, so it skipped (or moved) that call; " + xText + " waits in it";
  } else if (culprits.size() == 1) {
    v.explanation +=
        capitalized(xText) + " broke the order of calls it kept until here: it made its call on " +
        shortHash(other.hash) + " where it always went on to " + shortHash(comm.hash) + " first";
  } else {
    v.explanation +=
        "The two sides issue their calls on the two communicators in different "
        "orders: issue them in the same order on every rank";
  }
  restsOnTiming(v);
  verdicts_.push_back(std::move(v));
  return true;
}

// True when `proc`'s pending call is one it never made at this point before: after the call
// that precedes it (same comm, op and call site), the process always went on to another call
// (a Python line, a native call site). Sites tell calls of one op apart; without them, or
// without history, nothing is novel.
bool JobAnalysis::brokeItsOwnOrder(int p) const {
  const uint32_t current = waitPoint(p);
  if (current == kNone) return false;
  const Proc& proc = procs_[p];
  std::vector<uint32_t> order;
  for (uint32_t i = 0; i < proc.file->records.size(); ++i) {
    if (!trace::isLifecycle(proc.rec(i).op)) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return proc.rec(a).issueNs < proc.rec(b).issueNs;
  });
  auto position = std::find(order.begin(), order.end(), current);
  if (position == order.end() || position == order.begin()) return false;
  auto sameCall = [&](uint32_t a, uint32_t b) {
    const CallRecord& x = proc.rec(a);
    const CallRecord& y = proc.rec(b);
    return x.commHash == y.commHash && x.op == y.op && x.callSite == y.callSite;
  };
  const uint32_t previous = *(position - 1);
  bool seenBefore = false;
  for (auto it = order.begin(); it + 1 < position; ++it) {  // pairs before (previous, current)
    if (!sameCall(*it, previous)) continue;
    if (sameCall(*(it + 1), current)) return false;  // it went this way before
    seenBefore = true;
  }
  return seenBefore;
}

// Missing verdicts that hold each other: the absent ranks of each wait in the other's call
// (rank 0 in a subgroup barrier that rank 1 skipped, rank 1 already in the next collective of
// the world, waiting for rank 0). Each comm alone blames the other side. The cause is the side
// whose absent rank broke the order of calls it kept until then; the other is a consequence.
void JobAnalysis::breakMissingCycles() {
  auto procOf = [&](int rank) {
    for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
      if (procs_[p].rank == rank) return p;
    }
    return -1;
  };
  auto holds = [](const Verdict& absent, const Verdict& waiting) {
    if (absent.culprits.empty() || waiting.classes.empty()) return false;
    const std::vector<int>& waiters = waiting.classes[0].ranks;
    return std::all_of(absent.culprits.begin(), absent.culprits.end(), [&](int rank) {
      return std::find(waiters.begin(), waiters.end(), rank) != waiters.end();
    });
  };
  auto novel = [&](const Verdict& v) {
    return std::any_of(v.culprits.begin(), v.culprits.end(), [&](int rank) {
      const int p = procOf(rank);
      return p >= 0 && brokeItsOwnOrder(p);
    });
  };
  for (size_t i = 0; i < verdicts_.size(); ++i) {
    for (size_t j = i + 1; j < verdicts_.size(); ++j) {
      Verdict& a = verdicts_[i];
      Verdict& b = verdicts_[j];
      if (a.kind != VerdictKind::kMissing || b.kind != VerdictKind::kMissing ||
          a.comm.hash == b.comm.hash || !a.primary || !b.primary || !holds(a, b) || !holds(b, a)) {
        continue;
      }
      const bool aNovel = novel(a);
      const bool bNovel = novel(b);
      if (aNovel == bNovel) {
        // Neither side broke its order: the two wait for each other through the host, a call
        // one rank never issued because a thread of its own holds it (a lock held across a
        // synchronize, one thread per communicator). Said once, on the fewer absent ranks (the
        // others are held by them), each verdict having sent the user to the other before
        // (exp26's sync_lock).
        if (a.culprits.size() == b.culprits.size()) continue;
        Verdict& cause = a.culprits.size() < b.culprits.size() ? a : b;
        Verdict& consequence = a.culprits.size() < b.culprits.size() ? b : a;
        const std::string who = namedRanks(cause.culprits);
        const std::vector<int>& theirs = consequence.culprits;  // whom the cause's ranks wait for
        cause.explanation = cause.explanation.substr(0, cause.explanation.find(kFindWhatHolds));
        cause.explanation += "; and " + who + " wait" + (cause.culprits.size() == 1 ? "s" : "") +
                             " in #" + std::to_string(consequence.seq) + " on comm " +
                             hashText(consequence.comm.hash) + " for " + namedRanks(theirs) +
                             ", which wait here: the two wait for each other, a cycle no order of "
                             "NCCL calls explains: " +
                             who +
                             " issues one of the two from a thread that another of its threads "
                             "holds (a lock held across a synchronize or a wait, a queue): its "
                             "stacks (`ncclwatch stacks`) show both threads";
        consequence.primary = false;
        consequence.explanation =
            consequence.explanation.substr(0, consequence.explanation.find(kFindWhatHolds)) +
            " (a consequence: the other half of the cycle said on comm " +
            hashText(cause.comm.hash) + ")";
        continue;
      }
      Verdict& cause = aNovel ? a : b;
      Verdict& consequence = aNovel ? b : a;
      const std::string who = namedRanks(cause.culprits);
      cause.explanation += "; " + who +
                           " broke the order of calls it kept until here (it went on to a call "
                           "it never made at this point before), so it is the side that skipped";
      consequence.primary = false;
      consequence.explanation += " (a consequence: " + namedRanks(consequence.culprits) +
                                 " wait in #" + std::to_string(cause.seq) + " on comm " +
                                 hashText(cause.comm.hash) + ", which " + who + " skipped)";
    }
  }
}

}  // namespace ncclwatch::analysis::internal
