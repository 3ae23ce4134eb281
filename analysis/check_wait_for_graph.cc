// The wait-for graph: nodes are ranks, arcs come from the head of each stream (a call cannot
// start before the earlier calls on its stream complete). Cycles are deadlocks, fully present
// heads are stuck collectives; stuck p2p pairs are found from the same heads.
#include "analysis/job_state.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"

namespace ncclwatch::analysis::internal {

namespace {
bool isHead(const std::vector<uint32_t>& heads, uint32_t index) {
  return std::binary_search(heads.begin(), heads.end(), index);
}
}  // namespace

void JobAnalysis::checkGraph() {
  if (!stalled_) return;
  int n = static_cast<int>(procs_.size());
  // Heads: per process and stream, the first pending collective or p2p call (and the rest of
  // its group). A collective at an ordinal some rank completed is not pending (stale state).
  // headList[p] ascends (records are scanned in order): a head is found by binary search.
  std::vector<std::vector<uint32_t>> headList(n);
  for (int p = 0; p < n; ++p) {
    if (!procs_[p].pending) continue;  // no pending call at all (its progress says): no head
    const auto& records = procs_[p].file->records;
    std::unordered_map<uint64_t, bool> streamDone;  // stream -> head found
    std::unordered_map<uint64_t, bool> inGroupHead;
    // Every record before the first pending one (its progress says where) is finished.
    for (uint32_t i = procs_[p].progress->firstPendingPosition(); i < records.size(); ++i) {
      const CallRecord& r = records[i];
      if (!(trace::isCollective(r.op) || trace::isPointToPoint(r.op)) || !isPending(r)) continue;
      if (impliedDone(p, i)) continue;
      {
        auto found = streamDone.find(r.stream);
        if (found == streamDone.end()) {
          streamDone[r.stream] = true;
          inGroupHead[r.stream] = (r.flags & trace::kRecordInGroup) != 0;
          headList[p].push_back(i);
        } else if (inGroupHead[r.stream] && (r.flags & trace::kRecordInGroup) &&
                   !headList[p].empty() && records[headList[p].back()].stream == r.stream &&
                   headList[p].back() + 1 == i && sameGroup(records[headList[p].back()], r)) {
          headList[p].push_back(i);
        } else {
          inGroupHead[r.stream] = false;
        }
      }
    }
  }
  // Arcs: p waits for q. Only "behind" arcs (q issued the awaited call but its stream holds it
  // behind q's own head) can close an ordering cycle; a call q never issued is missing, not a
  // deadlock. Each process's arcs ascend, without repeats (the order the cycles are searched in).
  struct HeadInfo {
    const Comm* comm = nullptr;
    uint64_t ordinal = 0;
    int present = 0;
  };
  std::vector<std::vector<HeadInfo>> info(n);
  std::map<std::pair<const Comm*, uint64_t>, std::vector<int>> fullyPresent;
  // Every member waiting at one (comm, ordinal) sees the same others there: the members present
  // (the call at their head, or finished) and those that hold it behind their head. Counted once
  // per (comm, ordinal), not once per waiting member: that was members x members, 10^9 looks at
  // 32,768 ranks waiting in one collective.
  struct AtOrdinal {
    std::vector<char> present;  // per member
    int presentCount = 0;
    std::vector<int> behind;  // procs, ascending (members are in proc order)
    std::vector<char> isBehind;
  };
  std::map<std::pair<const Comm*, uint64_t>, AtOrdinal> atOrdinal;
  auto at = [&](const Comm& comm, uint64_t ordinal) -> const AtOrdinal& {
    auto [slot, added] = atOrdinal.try_emplace({&comm, ordinal});
    AtOrdinal& a = slot->second;
    if (!added) return a;
    a.present.assign(comm.members.size(), 0);
    a.isBehind.assign(comm.members.size(), 0);
    for (size_t mi = 0; mi < comm.members.size(); ++mi) {
      const Member& m = comm.members[mi];
      uint32_t i = m.at(ordinal);
      if (i == kNone) continue;
      if (isHead(headList[m.proc], i) || !isPending(procs_[m.proc].rec(i))) {
        a.present[mi] = 1;  // at its head, or finished there: not what holds the others
        ++a.presentCount;
      } else {
        a.behind.push_back(m.proc);
        a.isBehind[mi] = 1;
      }
    }
    return a;
  };
  // Per process: the arcs of one head are the shared list of its (comm, ordinal); a process
  // with several sources of arcs gets its own merged list.
  std::vector<const std::vector<int>*> arcsOf(n, nullptr);
  std::vector<std::vector<int>> ownArcs(n);
  auto addArcs = [&](int p, const std::vector<int>& more) {
    if (more.empty()) return;
    if (arcsOf[p] == nullptr) {
      arcsOf[p] = &more;
      return;
    }
    std::vector<int> merged;
    std::set_union(arcsOf[p]->begin(), arcsOf[p]->end(), more.begin(), more.end(),
                   std::back_inserter(merged));
    ownArcs[p] = std::move(merged);
    arcsOf[p] = &ownArcs[p];
  };
  std::vector<std::vector<int>> extraArcs(n);  // p2p arcs, and any not in a shared list
  for (int p = 0; p < n; ++p) {
    for (uint32_t h : headList[p]) {
      const CallRecord& r = procs_[p].rec(h);
      auto it = commIndex_.find(r.commHash);
      if (it == commIndex_.end()) continue;
      const Comm& comm = comms_[it->second];
      const Member* me = nullptr;
      size_t myIndex = 0;
      for (const auto& [hash, where] : procMembers_.of(p)) {
        if (hash == r.commHash) {
          me = &comm.members[where.second];
          myIndex = static_cast<size_t>(where.second);
        }
      }
      if (me == nullptr) continue;
      if (trace::isCollective(r.op)) {
        uint64_t ordinal = ordinalOf(p, h);
        if (ordinal == 0) continue;
        const AtOrdinal& a = at(comm, ordinal);
        // The others as they are there, and this process present (its call is its head).
        int present = 1 + a.presentCount - a.present[myIndex];
        if (!a.isBehind[myIndex]) {
          addArcs(p, a.behind);
        } else {
          // Its call at that ordinal is another record than this head (an ordinal recorded
          // twice): the others, not an arc to itself.
          for (int q : a.behind) {
            if (q != p) extraArcs[p].push_back(q);
          }
        }
        info[p].push_back({&comm, ordinal, present});
        if (present == static_cast<int>(comm.members.size()) &&
            present >= std::max(1, comm.desc.size)) {
          fullyPresent[{&comm, ordinal}].push_back(p);
        }
      } else {
        int peer = r.rootOrPeer;
        int pm = comm.byCommRank.find(peer);
        if (pm < 0) continue;
        const Member& other = comm.members[pm];
        bool behind = false;
        for (uint32_t i : other.p2p) {
          const CallRecord& o = procs_[other.proc].rec(i);
          if (o.op != r.op && o.rootOrPeer == me->commRank && o.p2pSeq == r.p2pSeq) {
            behind = !isHead(headList[other.proc], i) && isPending(o);
          }
        }
        if (behind) extraArcs[p].push_back(other.proc);
      }
    }
    if (!extraArcs[p].empty()) {
      std::sort(extraArcs[p].begin(), extraArcs[p].end());
      extraArcs[p].erase(std::unique(extraArcs[p].begin(), extraArcs[p].end()), extraArcs[p].end());
      addArcs(p, extraArcs[p]);
    }
  }
  static const std::vector<int> kNoArcs;
  auto arcs = [&](int v) -> const std::vector<int>& {
    return arcsOf[v] == nullptr ? kNoArcs : *arcsOf[v];
  };
  // Tarjan's strongly connected components.
  std::vector<int> index(n, -1), low(n, 0), stack;
  std::vector<bool> onStack(n, false);
  int counter = 0;
  std::vector<std::vector<int>> sccs;
  std::function<void(int)> connect = [&](int v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    onStack[v] = true;
    for (int w : arcs(v)) {
      if (index[w] < 0) {
        connect(w);
        low[v] = std::min(low[v], low[w]);
      } else if (onStack[w]) {
        low[v] = std::min(low[v], index[w]);
      }
    }
    if (low[v] == index[v]) {
      std::vector<int> scc;
      int w;
      do {
        w = stack.back();
        stack.pop_back();
        onStack[w] = false;
        scc.push_back(w);
      } while (w != v);
      if (scc.size() >= 2) sccs.push_back(scc);
    }
  };
  for (int v = 0; v < n; ++v) {
    if (index[v] < 0) connect(v);
  }
  for (std::vector<int>& scc : sccs) {
    std::sort(scc.begin(), scc.end());
    // A cycle of started sends and receives on one communicator is the p2p check's
    // (checkP2pOrderDeadlock: each rank's call, the one it waits for and the call that holds
    // it, in words that fit it).
    uint64_t p2pComm = 0;
    bool startedP2p = true;
    for (int p : scc) {
      for (uint32_t h : headList[p]) {
        const CallRecord& r = procs_[p].rec(h);
        startedP2p &= trace::isPointToPoint(r.op) && r.state == RecordState::kStarted &&
                      (p2pComm == 0 || p2pComm == r.commHash);
        p2pComm = r.commHash;
      }
    }
    if (startedP2p) continue;
    // Every rank in a cycle has a head (arcs come only from heads). Classes: by head call.
    std::map<std::tuple<uint64_t, uint64_t>, std::vector<int>> byHead;
    std::map<std::tuple<uint64_t, uint64_t>, CallDesc> headCall;
    double lowest = 2.0;
    std::vector<int> culprits;
    const Comm* culpritComm = nullptr;
    int64_t divergence = 0;
    for (int p : scc) {
      if (headList[p].empty()) continue;
      CallDesc d = describe(procs_[p], headList[p][0]);
      auto key = std::make_tuple(d.commHash, d.seq);
      byHead[key].push_back(procs_[p].rank);
      headCall[key] = d;
      divergence = std::max(divergence, procs_[p].wall(procs_[p].rec(headList[p][0]).issueNs));
      for (const HeadInfo& hi : info[p]) {
        double share = static_cast<double>(hi.present) / hi.comm->members.size();
        if (share < lowest - 1e-9) {
          lowest = share;
          culprits = {procs_[p].rank};
          culpritComm = hi.comm;
        } else if (std::abs(share - lowest) < 1e-9 &&
                   std::find(culprits.begin(), culprits.end(), procs_[p].rank) == culprits.end()) {
          culprits.push_back(procs_[p].rank);
        }
      }
    }
    const Comm* comm = culpritComm;
    if (comm == nullptr) {
      auto it = commIndex_.find(std::get<0>(byHead.begin()->first));
      comm = it == commIndex_.end() ? nullptr : &comms_[it->second];
    }
    Verdict v = make(VerdictKind::kDeadlock, comm, 0);
    for (auto& [key, ranks] : byHead) {
      RankClass rc;
      rc.ranks = ranks;
      rc.call = headCall[key];
      rc.call.note = "waits here; its stream holds its later calls";
      if (comm != nullptr && rc.call.commHash == comm->hash) v.seq = rc.call.seq;
      v.classes.push_back(std::move(rc));
    }
    // Heads that are all sends or receives reach no collective: every rank of the cycle.
    if (culprits.empty()) {
      for (int p : scc) culprits.push_back(procs_[p].rank);
    }
    std::sort(culprits.begin(), culprits.end());
    // A tie (two groups sharing ranks 0 and 1, each rank in the other group's call: as few
    // peers reached one as the other) is decided by the order each rank kept until then: the
    // one whose pending call is one it never made at this point before changed its order; the
    // other kept its own. Both named said "ranks 0-1 issued its calls in a different order".
    bool brokeOrder = false;
    if (culprits.size() > 1) {
      std::vector<int> broke;
      for (int p : scc) {
        if (std::binary_search(culprits.begin(), culprits.end(), procs_[p].rank) &&
            brokeItsOwnOrder(p)) {
          broke.push_back(procs_[p].rank);
        }
      }
      std::sort(broke.begin(), broke.end());
      if (!broke.empty() && broke.size() < culprits.size()) {
        culprits = std::move(broke);
        brokeOrder = true;
      }
    }
    v.culprits = culprits;
    v.divergenceNs = divergence;
    // classes in rank order, so that the text does not depend on hash values
    std::sort(v.classes.begin(), v.classes.end(),
              [](const RankClass& a, const RankClass& b) { return a.ranks < b.ranks; });
    std::string cycle;
    for (const RankClass& rc : v.classes) {
      cycle += (cycle.empty() ? "" : ", ") + namedRanks(rc.ranks) + " in " +
               trace::opName(rc.call.op) + " #" + std::to_string(rc.call.seq) + " on " +
               shortHash(rc.call.commHash);
    }
    const bool one = culprits.size() == 1;
    std::string who = namedRanks(culprits);
    v.explanation = "a wait-for cycle across communicators (" + cycle +
                    "): each waits for a call the other has queued behind its own on one "
                    "stream; " +
                    who +
                    (brokeOrder ? std::string(" broke the order of calls it kept until here (its "
                                              "call here is one it never made at this point "
                                              "before)")
                                : " issued " + std::string(one ? "its" : "their") +
                                      " calls in a different order than " +
                                      (one ? "its" : "their") + " peers") +
                    ": issue them in the same order on every rank";
    verdicts_.push_back(std::move(v));
  }
  // Stuck: every member holds the same call at the head of its stream and none completed it.
  std::set<const Comm*> reported;
  for (auto& [key, ps] : fullyPresent) {
    const Comm* comm = key.first;
    if (reported.count(comm)) continue;
    bool deadMember = false;
    for (const Member& m : comm->members) deadMember |= deadRanks_.count(m.proc) > 0;
    if (deadMember) continue;
    bool same = true, anyStarted = false, allStarted = true, anyInferred = false;
    uint64_t k0 = 0;
    std::vector<int> notStarted;
    int64_t since = 0;
    for (const Member& m : comm->members) {
      const CallRecord& r = procs_[m.proc].rec(m.at(key.second));
      if (k0 == 0) k0 = alignKey(r);
      same &= alignKey(r) == k0;
      bool started = r.state == RecordState::kStarted;
      anyStarted |= started;
      allStarted &= started;
      anyInferred |= started && !startSeen(r);
      if (!started) notStarted.push_back(procs_[m.proc].rank);
      since = std::max(since, procs_[m.proc].wall(r.issueNs));
    }
    if (!same) continue;  // the mismatch verdict covers it
    // A communicator another verdict explains (a mismatch later in the same group holds this
    // call's group open) is stuck because of it.
    bool explained = false;
    for (const Verdict& v : verdicts_) explained |= v.comm.hash == comm->hash;
    if (explained) continue;
    if (!anyStarted && comm->maxCompletedOrdinal == 0) continue;  // no completion info at all
    reported.insert(comm);
    const Member& m0 = comm->members[0];
    CallDesc call = describe(procs_[m0.proc], m0.at(key.second));
    Verdict v = make(VerdictKind::kStuck, comm, call.seq);
    RankClass all;
    for (const Member& m : comm->members) all.ranks.push_back(procs_[m.proc].rank);
    all.call = call;
    // One event per call: a start inferred from stream order is "reached".
    all.call.note = !allStarted   ? "issued"
                    : anyInferred ? "reached, never completed"
                                  : "started, never completed";
    v.classes.push_back(std::move(all));
    v.divergenceNs = since;
    if (allStarted && !anyInferred) {
      v.explanation = "every rank issued and started " + callText(call) + " #" +
                      std::to_string(call.seq) +
                      " and none completed it: the network or a GPU stalled (check "
                      "NCCL_DEBUG=INFO logs, link errors, Xid messages)";
    } else if (allStarted) {
      // One event per call cannot tell a collective that runs from one still held by GPU work
      // outside NCCL: on a real GPU, PyTorch's NCCL stream waiting on a long compute kernel
      // read "reached" for seconds. Say both, and how to tell them apart.
      v.explanation = "every rank issued and reached " + callText(call) + " #" +
                      std::to_string(call.seq) +
                      " (every earlier NCCL call on its stream completed) and none completed it: "
                      "either it waits inside NCCL (the network or a GPU stalled: check "
                      "NCCL_DEBUG=INFO logs, link errors, Xid messages) or GPU work outside NCCL "
                      "still holds it (a kernel on its stream, or another stream it waits on, as "
                      "PyTorch's NCCL stream waits on the compute stream); NCCLWATCH_EVENTS=full "
                      "tells them apart";
    } else {
      v.culprits = notStarted;
      v.explanation = "every rank issued " + callText(call) + " #" + std::to_string(call.seq) +
                      " and none completed it; it never started on " + namedRanks(notStarted) +
                      ": GPU work queued before it on that stream never finished";
    }
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
  if (reported.empty()) checkStuckP2p(headList);
}

// Stuck sends and receives: both sides of a pair at the heads of their streams, neither
// completed. When several such pairs share one rank, that rank is where the transfer stalls.
void JobAnalysis::checkStuckP2p(const std::vector<std::vector<uint32_t>>& heads) {
  for (const Comm& comm : comms_) checkStuckP2p(comm, heads);
}

void JobAnalysis::checkStuckP2p(const Comm& comm, const std::vector<std::vector<uint32_t>>& heads) {
  // A communicator another verdict already explains (a mismatch, an unmatched send) is stuck
  // because of it: saying so again would only be noise.
  bool explained = false;
  for (const Verdict& v : verdicts_) explained |= v.comm.hash == comm.hash;
  if (explained) return;
  std::vector<std::pair<int, uint32_t>> sides;  // (proc, record) of every stuck pair
  std::map<int, int> pairsOf;                   // proc -> stuck pairs it is in
  int pairs = 0;
  bool anyStarted = false;
  for (const Member& m : comm.members) {
    for (uint32_t i : m.p2p) {
      const CallRecord& send = procs_[m.proc].rec(i);
      if (send.op != OpKind::kSend || !isHead(heads[m.proc], i)) continue;
      int pm = comm.byCommRank.find(send.rootOrPeer);
      if (pm < 0) continue;
      const Member& other = comm.members[pm];
      for (uint32_t j : other.p2p) {
        const CallRecord& recv = procs_[other.proc].rec(j);
        if (recv.op != OpKind::kRecv || recv.rootOrPeer != m.commRank ||
            recv.p2pSeq != send.p2pSeq || !isHead(heads[other.proc], j)) {
          continue;
        }
        sides.push_back({m.proc, i});
        sides.push_back({other.proc, j});
        ++pairsOf[m.proc];
        ++pairsOf[other.proc];
        ++pairs;
        anyStarted |= send.state == RecordState::kStarted || recv.state == RecordState::kStarted;
      }
    }
  }
  if (pairs == 0) return;
  if (!anyStarted && comm.maxCompletedOrdinal == 0) return;  // no completion info at all
  Verdict v = make(VerdictKind::kStuck, &comm, UINT64_MAX);
  std::vector<int> notStarted, inEvery;
  int64_t since = 0;
  std::set<std::pair<int, uint32_t>> seen;
  for (const auto& side : sides) {
    if (!seen.insert(side).second) continue;
    const Proc& proc = procs_[side.first];
    RankClass rc;
    rc.ranks = {proc.rank};
    rc.call = describe(proc, side.second);
    rc.call.rootOrPeer = globalRank(comm, rc.call.rootOrPeer);
    bool started = rc.call.state == RecordState::kStarted;
    rc.call.note = !started                ? "issued, never started"
                   : rc.call.startInferred ? "reached, never completed"
                                           : "started, never completed";
    if (!started) notStarted.push_back(proc.rank);
    v.seq = std::min(v.seq, rc.call.seq);
    since = std::max(since, proc.wall(proc.rec(side.second).issueNs));
    v.classes.push_back(std::move(rc));
  }
  for (auto [p, count] : pairsOf) {
    if (count == pairs && pairs >= 2) inEvery.push_back(procs_[p].rank);
  }
  std::sort(v.classes.begin(), v.classes.end(), [](const RankClass& a, const RankClass& b) {
    return std::tie(a.ranks, a.call.seq) < std::tie(b.ranks, b.call.seq);
  });
  if (v.classes.size() > 16) v.classes.resize(16);
  std::sort(notStarted.begin(), notStarted.end());
  notStarted.erase(std::unique(notStarted.begin(), notStarted.end()), notStarted.end());
  v.divergenceNs = since;
  std::string pairText =
      std::to_string(pairs) + (pairs == 1 ? " send/receive pair" : " send/receive pairs");
  if (!notStarted.empty()) {
    v.culprits = notStarted;
    v.explanation = pairText + " issued on both sides and never completed; they never started on " +
                    namedRanks(notStarted) +
                    ": GPU work queued before them on that stream never finished";
  } else if (!inEvery.empty()) {
    v.culprits = inEvery;
    std::string who = namedRanks(inEvery);
    v.explanation = pairText +
                    " started on both sides and never completed, every one of them "
                    "with " +
                    who +
                    ": its transfers stalled (check its GPU, links and NCCL_DEBUG=INFO "
                    "logs)";
  } else {
    v.explanation = pairText +
                    " started on both sides and never completed: the network or a "
                    "GPU stalled (check NCCL_DEBUG=INFO logs, link errors, Xid messages)";
  }
  restsOnTiming(v);
  verdicts_.push_back(std::move(v));
}

}  // namespace ncclwatch::analysis::internal
