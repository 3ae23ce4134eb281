// Alignment: each communicator's members on their non-p2p call ordinals (seq minus the p2p calls
// before it), p2p calls keyed on (sender, receiver, p2pSeq), and where each process waits.
#include "analysis/job_state.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/describe.h"
#include "analysis/parallel.h"
#include "analysis/recent_two.h"

namespace ncclwatch::analysis::internal {

uint32_t JobAnalysis::waitPoint(int p) const {
  // Asked several times per process by the hang checks (dead ranks, where the absent ones are,
  // held hosts, order breaks): found once per pass. What it reads (the pending calls and where
  // they are aligned) is settled once the communicators are aligned (alignSkipped starts over).
  if (waitPoints_.size() != procs_.size()) waitPoints_.assign(procs_.size(), kUnknownWaitPoint);
  uint32_t& known = waitPoints_[static_cast<size_t>(p)];
  if (known != kUnknownWaitPoint) return known;
  const Proc& proc = procs_[p];
  known = kNone;
  if (!proc.pending) return known;  // nothing pending at all (its progress says)
  // Every record before the first pending one is finished: the scan starts there.
  for (uint32_t i = proc.progress->firstPendingPosition(); i < proc.records.size(); ++i) {
    if (isPending(proc.rec(i)) && !impliedDone(p, i)) return known = i;
  }
  return known;
}

bool JobAnalysis::impliedDone(int p, uint32_t i) const {
  const CallRecord& r = procs_[p].rec(i);
  if (trace::isPointToPoint(r.op)) {
    // A send or receive whose other side completed is done, whatever this side last recorded
    // (a process that died right after may never have seen its own completion).
    auto member = memberRank(p, r.commHash);
    if (member < 0 || r.p2pSeq == 0) return false;
    bool send = r.op == OpKind::kSend;
    return completedP2p_.count({r.commHash, send ? member : r.rootOrPeer,
                                send ? r.rootOrPeer : member, r.p2pSeq}) > 0;
  }
  auto it = pendingOrdinal_[p].find(i);
  if (it == pendingOrdinal_[p].end()) return false;
  auto c = commIndex_.find(procs_[p].rec(i).commHash);
  return c != commIndex_.end() && trace::isCollective(procs_[p].rec(i).op) &&
         it->second <= comms_[c->second].maxCompletedOrdinal;
}

CallDesc JobAnalysis::whereIs(int p) const {
  readsOtherComms_ = true;  // where a process waits depends on all its communicators
  uint32_t w = waitPoint(p);
  CallDesc d;
  if (w != kNone) {
    d = describe(procs_[p], w);
    d.note = "waits here";
    return d;
  }
  const Proc& proc = procs_[p];
  if (proc.alive) {
    d.note = "no NCCL call pending (busy elsewhere, or silent)";
  } else if (proc.clean) {
    d.note = "process exited cleanly";
  } else {
    d.note = "process ended without a clean shutdown (crashed, exited or killed), nothing pending";
  }
  return d;
}

void JobAnalysis::buildComms() {
  pendingOrdinal_.assign(procs_.size(), {});
  procMembers_.entries.clear();
  procMembers_.starts.assign(1, 0);
  procMembers_.starts.reserve(procs_.size() + 1);
  // Every communicator's members first, with their progress (comm_progress.h); then which to
  // align (a partial pass: chooseRedo); then the alignment.
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    const Proc& proc = procs_[p];
    // this process's members, by comm hash (usually a handful): hash -> (comm, member)
    auto& entries = procMembers_.entries;
    const size_t first = entries.size();
    std::span<const MemberProgress> progress = proc.progress->members();
    auto memberOf = [&](uint64_t hash) -> std::pair<int, int> {
      for (size_t e = first; e < entries.size(); ++e) {
        if (entries[e].first == hash) return entries[e].second;
      }
      return {-1, -1};
    };
    for (const trace::CommInfo& info : proc.file->comms) {
      if (memberOf(info.commHash).first >= 0) continue;
      auto [it, inserted] = commIndex_.try_emplace(info.commHash, static_cast<int>(comms_.size()));
      if (inserted) {
        Comm comm;
        comm.hash = info.commHash;
        comm.desc.hash = info.commHash;
        comm.desc.size = info.nranks;
        comm.desc.parent = info.parentHash;
        comm.desc.color = info.color;
        comm.kind = info.kind;
        comm.desc.name.assign(info.name, strnlen(info.name, sizeof info.name));
        comm.byCommRank = MemberIndex(info.nranks);
        // Room for every member at once: grown by doubling, the world's 32,768 members were moved
        // 15 times a pass (13% of a divergence's pass at that scale), onto fresh pages each time.
        comm.members.reserve(
            static_cast<size_t>(std::clamp<int>(info.nranks, 0, static_cast<int>(procs_.size()))));
        comms_.push_back(std::move(comm));
      }
      Comm& comm = comms_[it->second];
      Member m;
      m.proc = p;
      m.commRank = info.rank;
      // The progress lists the same memberships in the same order (ProcessProgress::rebuild).
      m.progress = &progress[entries.size() - first];
      comm.progress.add(*m.progress, comm.members.empty());
      comm.byCommRank.set(info.rank, static_cast<int>(comm.members.size()));
      entries.push_back({info.commHash, {it->second, static_cast<int>(comm.members.size())}});
      comm.members.push_back(std::move(m));
    }
    procMembers_.starts.push_back(entries.size());
  }
  if (partial_) chooseRedo();
  // A partial pass knows every comm's members but aligns only some: per process, which of its
  // memberships (procMembers_ order) to align.
  std::vector<char> aligned;
  aligned.reserve(procMembers_.entries.size());
  for (const auto& [hash, at] : procMembers_.entries) {
    aligned.push_back(this->aligned(comms_[at.first]) ? 1 : 0);
  }
  alignAll(aligned);
  for (const Comm& comm : comms_) {
    if (this->aligned(comm)) compareProgress(comm);
  }
  findCompletedTransfers();
  // Names: a root comm spanning every process of the job is the world.
  for (Comm& comm : comms_) {
    if (comm.desc.name.empty() && comm.desc.parent == 0 &&
        comm.desc.size == static_cast<int>(procs_.size()) && procs_.size() > 0) {
      comm.desc.name = "world";
    }
  }
}

// Which communicators a partial pass aligns besides the touched ones (redo_ holds those):
// alignOnly_.
//
// When the hang families run (the job quiet, a process gone, a failed call), they must see the
// alignment of every communicator that is not done: some member has a pending call there, or the
// members' issued counts or last ordinals differ. A done communicator needs none, because of
// what each family reads of a communicator's alignment:
//  - the wait-for graph (checkGraph, checkStuckP2p), where a process waits (waitPoint,
//    impliedDone, whereIs), errors (othersWaitOn) and the missing-rank and left-behind checks
//    look only at pending calls and the communicators they are on (their ordinals, the
//    members' calls at those ordinals, the completed ordinal and transfers there): none on a
//    done communicator, which has no pending call;
//  - dead ranks compare each member's last ordinal with the furthest of its communicator: on a
//    done communicator they are all equal, aligned or not (an unaligned one reads 0 for each),
//    so it says "not behind here" either way;
//  - init hangs and the error verdicts' classes read memberships only, which every pass has.
// Whether the job stalled comes from the progress of every communicator (decideStalled).
// The per-communicator checks keep their results for the untouched communicators, as in any
// partial pass, the not-done ones aligned here included: their mismatches, colours, straggler
// tallies and summaries read only their own records, which did not change. Their p2p verdicts
// read the job's state (stalled, dead ranks) for pending calls: drawn again when that state
// changed since they were kept (checkP2p). For the
// same reason a partial pass without the hang checks aligns a not-done communicator whose kept
// p2p verdicts were drawn in another state (CommCache::jobState; checkP2p keeps them when the
// state is the same).
void JobAnalysis::chooseRedo() {
  for (const Comm& comm : comms_) {
    if (comm.progress.done || redo_.count(comm.hash)) continue;
    if (hangChecks_ || cache_->comms[comm.hash].jobState != 0) alignOnly_.insert(comm.hash);
  }
}

void JobAnalysis::compareProgress(const Comm& comm) {
  for (const Member& m : comm.members) {
    const MemberProgress& kept = *m.progress;
    if (kept.maxSeq != m.maxSeq || kept.completedSeq != m.completedSeq ||
        kept.pendingCount != m.pendingCount || kept.lastOrdinal != m.lastOrdinal() ||
        kept.maxCompletedOrdinal != m.completedCollective) {
      ++progressDisagreements_;
    }
  }
}

// Every process's records on the communicators marked in aligned[p], processes split over
// Options::threads: each writes only its own members and pendingOrdinal_[p]; what a communicator
// gathers from all of them (the completed-ordinal watermark, splits, pending transfers) is
// folded in afterwards.
void JobAnalysis::alignAll(const std::vector<char>& aligned) {
  std::vector<AlignScratch> scratch(chunkCount(procs_.size(), options_.threads));
  parallelChunks(procs_.size(), options_.threads, [&](size_t chunk, size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) {
      std::span<const char> slots(aligned.data() + procMembers_.starts[p],
                                  aligned.data() + procMembers_.starts[p + 1]);
      alignProc(static_cast<int>(p), slots, scratch[chunk]);
    }
  });
  for (const AlignScratch& s : scratch) {
    pendingP2p_.insert(s.pendingP2p.begin(), s.pendingP2p.end());
    membersFromKept_ += s.fromKept;
    membersFromRecords_ += s.fromRecordsCount;
  }
  for (Comm& comm : comms_) {
    for (const Member& m : comm.members) {
      comm.maxCompletedOrdinal = std::max(comm.maxCompletedOrdinal, m.completedCollective);
      comm.hasSplits |= m.madeSplit;
    }
  }
}

// Aligns the records of process `p` on the communicators whose slot (its memberships, in
// procMembers_ order) is marked in `aligned`.
void JobAnalysis::alignProc(int p, std::span<const char> alignedSlots, AlignScratch& scratch) {
  // None of its communicators aligned in this pass (a partial one): its records need no look.
  if (std::find(alignedSlots.begin(), alignedSlots.end(), 1) == alignedSlots.end()) return;
  const Proc& proc = procs_[p];
  std::span<const Memberships::Entry> mine = procMembers_.of(p);
  // Members whose calls the progress kept take them from there; the records are read for the
  // others alone, and not at all when there are none.
  std::vector<char>& aligned = scratch.fromRecords;
  aligned.assign(alignedSlots.begin(), alignedSlots.end());
  bool anyFromRecords = false;
  for (size_t s = 0; s < mine.size(); ++s) {
    if (!aligned[s]) continue;
    Member& m = comms_[mine[s].second.first].members[mine[s].second.second];
    if (options_.keptAlignment && takeKeptAlignment(m)) {
      aligned[s] = 0;
      ++scratch.fromKept;
    } else {
      anyFromRecords = true;
      ++scratch.fromRecordsCount;
    }
  }
  if (!anyFromRecords) return;
  // p2p calls seen so far per (comm, peer, direction): their highest p2pSeq. Kept across
  // processes (emptied here) so that a pass allocates them once a thread, not once a process.
  std::vector<std::unordered_map<int64_t, uint64_t>>& p2pMax = scratch.p2pMax;
  if (p2pMax.size() < mine.size()) p2pMax.resize(mine.size());
  for (size_t s = 0; s < mine.size(); ++s) {
    if (!p2pMax[s].empty()) p2pMax[s].clear();
  }
  std::vector<uint64_t>& p2pSum = scratch.p2pSum;
  p2pSum.assign(mine.size(), 0);
  RecentTwo<int> recentSlots;  // the last two communicators' slots
  const trace::RecordRange records = proc.records;
  for (uint32_t i = 0; i < records.size(); ++i) {
    const CallRecord& r = records[i];
    if (!isSequenced(r)) continue;
    int slot = -1;
    if (const int* kept = recentSlots.find(r.commHash)) {
      slot = *kept;
    } else {
      for (int s = 0; s < static_cast<int>(mine.size()); ++s) {
        if (mine[s].first == r.commHash) slot = s;
      }
      if (slot >= 0) recentSlots.remember(r.commHash, slot);
    }
    if (slot < 0 || !aligned[slot]) continue;  // a comm missing from the table (table full)
    Comm& comm = comms_[mine[slot].second.first];
    Member& m = comm.members[mine[slot].second.second];
    m.maxSeq = std::max(m.maxSeq, r.seq);
    bool pending = isPending(r);
    if (pending) {
      ++m.pendingCount;
      m.prefixBroken = true;
    } else if (!m.prefixBroken) {
      m.completedSeq = r.seq;
    }
    if (trace::isPointToPoint(r.op)) {
      m.p2p.push_back(i);
      if (pending && r.p2pSeq != 0) {
        bool send = r.op == OpKind::kSend;
        scratch.pendingP2p.push_back({r.commHash, send ? m.commRank : r.rootOrPeer,
                                      send ? r.rootOrPeer : m.commRank, r.p2pSeq});
      }
      int64_t key = (static_cast<int64_t>(r.rootOrPeer) << 1) | (r.op == OpKind::kSend ? 1 : 0);
      uint64_t& mx = p2pMax[slot][key];
      if (r.p2pSeq > mx) {
        p2pSum[slot] += r.p2pSeq - mx;
        mx = r.p2pSeq;
      }
      continue;
    }
    if (r.seq <= p2pSum[slot]) continue;  // inconsistent: skip
    uint64_t ordinal = r.seq - p2pSum[slot];
    if (m.ownColl.empty()) {
      m.base = ordinal;
      // Room for this process's remaining records shared among its communicators: one
      // allocation where growth by doubling took eight for a window of a few hundred calls.
      m.ownColl.reserve((records.size() - i) / mine.size() + 1);
      m.ownKeys.reserve(m.ownColl.capacity());
    }
    if (ordinal < m.base) continue;
    uint64_t pos = ordinal - m.base;
    if (pos == m.ownColl.size()) {
      m.ownColl.push_back(i);  // the usual case: the next ordinal
      m.ownKeys.push_back(alignKey(r));
    } else {
      // A seq further ahead than every call this process recorded (and then some, for calls
      // dropped between): a damaged record, whose alignment would take memory without bound.
      if (pos >= m.ownColl.size() && pos - m.ownColl.size() > 4 * records.size() + 4096) continue;
      if (pos >= m.ownColl.size()) {
        m.ownColl.resize(pos + 1, kNone);
        m.ownKeys.resize(pos + 1, 0);
      }
      m.ownColl[pos] = i;
      m.ownKeys[pos] = alignKey(r);
    }
    m.madeSplit |= r.op == OpKind::kSplit;
    if (pending) pendingOrdinal_[p][i] = ordinal;
    if (r.state == RecordState::kCompleted && trace::isCollective(r.op)) {
      m.completedCollective = std::max(m.completedCollective, ordinal);
    }
  }
  for (size_t s = 0; s < mine.size(); ++s) {
    if (!aligned[s]) continue;
    Member& m = comms_[mine[s].second.first].members[mine[s].second.second];
    m.coll = m.ownColl;
    m.keys = m.ownKeys;
  }
}

bool JobAnalysis::takeKeptAlignment(Member& m) const {
  const MemberProgress& kept = *m.progress;
  // A pending call needs its ordinal noted (pendingOrdinal_), from its record.
  if (!kept.alignedPlain || kept.pendingCount != 0 || kept.irregular) return false;
  m.maxSeq = kept.maxSeq;
  m.completedSeq = kept.completedSeq;
  m.pendingCount = 0;
  if (!kept.alignedPositions.empty()) {
    m.base = kept.base;
    m.coll = kept.alignedPositions;  // the progress outlives the pass
    m.keys = kept.alignedKeys;
  }
  m.completedCollective = kept.maxCompletedOrdinal;
  m.madeSplit = kept.splits > 0;
  return true;
}

void JobAnalysis::findCompletedTransfers() {
  // Which pending transfers the other side completed (a second pass: the other side may come
  // first in the files). Only pending ones are kept: they are few, the completed ones millions.
  if (!pendingP2p_.empty()) {
    for (const Comm& comm : comms_) {
      for (const Member& m : comm.members) {
        for (uint32_t i : m.p2p) {
          const CallRecord& r = procs_[m.proc].rec(i);
          if (r.state != RecordState::kCompleted || r.p2pSeq == 0) continue;
          bool send = r.op == OpKind::kSend;
          TransferKey key{r.commHash, send ? m.commRank : r.rootOrPeer,
                          send ? r.rootOrPeer : m.commRank, r.p2pSeq};
          if (pendingP2p_.count(key)) completedP2p_.insert(key);
        }
      }
    }
  }
}

// A partial pass that needs every communicator after all: aligns those it skipped, and is a full
// pass from then on.
void JobAnalysis::alignSkipped() {
  std::vector<char> skipped;
  skipped.reserve(procMembers_.entries.size());
  for (const auto& [hash, at] : procMembers_.entries) {
    skipped.push_back(aligned(comms_[at.first]) ? 0 : 1);
  }
  alignAll(skipped);
  for (const Comm& comm : comms_) {
    if (!aligned(comm)) compareProgress(comm);
  }
  partial_ = false;
  redo_.clear();
  alignOnly_.clear();
  waitPoints_.clear();
  findCompletedTransfers();
}

// ncclCommShrink: the excluded ranks never call it and owe the parent nothing from there on
// (they typically failed, or leave). Their later calls on the parent (a destroy) are not a
// divergence: alignment stops for them at the survivors' shrink.
void JobAnalysis::excludeShrunkMembers() {
  for (const Comm& child : comms_) {
    if (child.kind != static_cast<int>(OpKind::kShrink) || child.desc.parent == 0) continue;
    if (static_cast<int>(child.members.size()) != child.desc.size) continue;  // not all known
    auto parentAt = commIndex_.find(child.desc.parent);
    if (parentAt == commIndex_.end()) continue;
    Comm& parent = comms_[parentAt->second];
    std::set<int> survivors;
    for (const Member& m : child.members) survivors.insert(m.proc);
    uint64_t shrinkOrdinal = 0;
    for (const Member& m : parent.members) {
      if (!survivors.count(m.proc)) continue;
      for (size_t i = 0; i < m.coll.size() && shrinkOrdinal == 0; ++i) {
        if (m.coll[i] != kNone && procs_[m.proc].rec(m.coll[i]).op == OpKind::kShrink) {
          shrinkOrdinal = m.base + i;
        }
      }
      if (shrinkOrdinal != 0) break;
    }
    if (shrinkOrdinal == 0) continue;
    for (Member& m : parent.members) {
      if (survivors.count(m.proc) || m.coll.empty() || m.lastOrdinal() < shrinkOrdinal) continue;
      m.coll = m.coll.first(shrinkOrdinal > m.base ? shrinkOrdinal - m.base : 0);
      m.keys = m.keys.first(m.coll.size());
    }
  }
}

}  // namespace ncclwatch::analysis::internal
