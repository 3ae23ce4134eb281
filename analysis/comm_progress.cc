// Per-communicator progress kept on arrival. The per-record rules are align.cc's
// (JobAnalysis::alignProc), applied one record at a time; tests/analysis/comm_progress_test.cc
// and the passes' own check (IncrementalAnalysis::Stats::progressDisagreements) hold them equal.
#include "analysis/comm_progress.h"

#include <algorithm>
#include <utility>

#include "analysis/job_state.h"

namespace ncclwatch::analysis {

using internal::isPending;
using internal::isSequenced;
using internal::isTracked;
using trace::CallRecord;
using trace::OpKind;

uint64_t ProcessProgress::tableSignature(std::span<const trace::CommInfo> comms) {
  uint64_t h = trace::mix64(comms.size() + 1);
  for (const trace::CommInfo& info : comms) {
    h = trace::mix64(h ^ info.commHash) + static_cast<uint32_t>(info.rank);
  }
  return h;
}

bool ProcessProgress::follows(const trace::TraceFile& file) const {
  if (!built_ || records_ != file.records.size() || table_ != tableSignature(file.comms)) {
    return false;
  }
  return file.records.empty() || (file.records.front().ringIndex == firstRing_ &&
                                  file.records.back().ringIndex == lastRing_);
}

int ProcessProgress::slotOf(uint64_t commHash) {
  if (const int* kept = recentSlots_.find(commHash)) return *kept;
  int slot = -1;
  for (size_t s = 0; s < memberCount_; ++s) {
    if (members_[s].commHash == commHash) slot = static_cast<int>(s);
  }
  if (slot >= 0) recentSlots_.remember(commHash, slot);
  return slot;
}

const MemberProgress* ProcessProgress::member(uint64_t commHash) const {
  for (size_t s = 0; s < memberCount_; ++s) {
    if (members_[s].commHash == commHash) return &members_[s];
  }
  return nullptr;
}

namespace {
inline int64_t latestOf(const CallRecord& r) {
  return std::max({r.issueNs, r.startNs, r.completeNs});
}
// A member whose calls are no longer plain from its call at window position `position` on: the
// pass aligns it from its records until that call leaves the window (trimFront).
void dropAligned(MemberProgress& m, uint32_t position) {
  m.notPlainAt = m.alignedPlain ? position : std::max(m.notPlainAt, position);
  m.alignedPlain = false;
  m.alignedPositions.clear();
  m.alignedKeys.clear();
  m.splits = 0;
}
}  // namespace

void ProcessProgress::countFacts(const CallRecord& r, bool pending, int sign) {
  const uint64_t step = static_cast<uint64_t>(static_cast<int64_t>(sign));
  pendingCalls_ += pending ? step : 0;
  failedCalls_ += isFailedCall(r) ? step : 0;
  if (trace::isCollective(r.op) || trace::isPointToPoint(r.op)) {
    calls_ += step;
    tracked_ += isTracked(r) || (r.flags & trace::kRecordKernelTracked) != 0 ? step : 0;
    shed_ += (r.flags & trace::kRecordShed) != 0 ? step : 0;
  }
}

void ProcessProgress::rebuild(const trace::TraceFile& file) {
  rebuildFrom(file.comms, file.records);
}

void ProcessProgress::rebuildFrom(std::span<const trace::CommInfo> comms,
                                  trace::RecordRange records) {
  ++rebuilds_;
  // The memberships: each hash once, in table order (as JobAnalysis::buildComms takes them).
  memberCount_ = 0;
  recentSlots_.clear();
  for (const trace::CommInfo& info : comms) {
    bool seen = false;
    for (size_t s = 0; s < memberCount_; ++s) seen |= members_[s].commHash == info.commHash;
    if (seen) continue;
    if (memberCount_ == members_.size()) members_.emplace_back();
    MemberProgress& m = members_[memberCount_++];
    // Reset, keeping the containers' storage.
    std::vector<MemberProgress::Pending> pending = std::move(m.pending);
    std::vector<MemberProgress::P2pMax> p2pMax = std::move(m.p2pMax);
    std::unordered_map<int64_t, uint32_t> p2pIndex = std::move(m.p2pIndex);
    std::vector<uint32_t> alignedPositions = std::move(m.alignedPositions);
    std::vector<uint64_t> alignedKeys = std::move(m.alignedKeys);
    pending.clear();
    p2pMax.clear();
    p2pIndex.clear();
    alignedPositions.clear();
    alignedKeys.clear();
    m = MemberProgress{};
    m.pending = std::move(pending);
    m.p2pMax = std::move(p2pMax);
    m.p2pIndex = std::move(p2pIndex);
    m.alignedPositions = std::move(alignedPositions);
    m.alignedKeys = std::move(alignedKeys);
    m.commHash = info.commHash;
    m.commRank = info.rank;
    m.keepsAligned = info.nranks >= keepAlignedFrom_;
    m.alignedPlain = m.keepsAligned;
  }
  // The kept aligned calls: room for the window's records shared among the memberships at once,
  // where growth by doubling took several allocations per member and rebuild.
  for (size_t s = 0; s < memberCount_; ++s) {
    if (!members_[s].keepsAligned) continue;
    size_t share = records.size() / std::max<size_t>(memberCount_, 1) + 8;
    members_[s].alignedPositions.reserve(share);
    members_[s].alignedKeys.reserve(share);
  }
  pendingCalls_ = failedCalls_ = calls_ = shed_ = tracked_ = 0;
  latestRecordNs_ = 0;
  pendingAll_.clear();
  pendingAllFront_ = 0;
  ascending_ = true;
  for (size_t i = 0; i < records.size(); ++i) {
    if (i > 0) ascending_ &= records[i].ringIndex > records[i - 1].ringIndex;
    add(records[i], static_cast<uint32_t>(i), records.size());
  }
  table_ = tableSignature(comms);
  records_ = records.size();
  firstRing_ = records.empty() ? 0 : records.front().ringIndex;
  lastRing_ = records.empty() ? 0 : records.back().ringIndex;
  built_ = true;
}

void ProcessProgress::appended(const trace::TraceFile& file) {
  const trace::RecordRange records = file.records.range();
  const CallRecord& r = records.back();
  // Anything but the window this state follows plus one record at its end: from scratch. (A
  // changed communicator table is seen by the pass, in follows(): not looked at per record.)
  bool oneMore = built_ && records_ + 1 == records.size() &&
                 (records_ == 0 || (records.front().ringIndex == firstRing_ &&
                                    records[records_ - 1].ringIndex == lastRing_));
  if (!oneMore) {
    rebuild(file);
    return;
  }
  ascending_ &= records_ == 0 || r.ringIndex > lastRing_;
  add(r, static_cast<uint32_t>(records_), records.size());
  if (records_ == 0) firstRing_ = r.ringIndex;
  ++records_;
  lastRing_ = r.ringIndex;
}

bool ProcessProgress::droppingFront(const trace::TraceFile& file, size_t count) {
  trace::RecordRange records = file.records.range();
  count = std::min(count, records.size());
  if (count == 0 && follows(file)) return true;
  if (follows(file) && trimFront(records.first(count), records.subspan(count))) return true;
  rebuildFrom(file.comms, records.subspan(count));
  return false;
}

// Why dropping the window's front this way equals a rebuild from the records left (R), when no
// check below fails. A member with no sequenced record among the dropped ones (D) sees the same
// records in the same order with the same sums: its values stand (no record of the window is
// irregular, so the window's size, which a rebuild uses, decides nothing). For a member with
// records in D: none is a send or receive, so its p2pSum is 0 at each of them (its candidate
// is its seq) and at each record of R as much as before (sums of R's earlier records alone);
// its candidates ascend, so each was its ordinal and the first in R is the new base, below all
// the others, which keep their ordinals; the highest seq, ordinal and completed ordinal are in
// R (the dropped ones are below them), so they stand, as its last seq, pending calls and head
// (none of D is pending). What changes: its base, its last activity when a dropped record may
// have held it, and the seq before its first call in R (0 now), which is its completedSeq when
// that call is its pending head. And for the process, D's counts and the positions of its
// pending calls, which all are in R.
bool ProcessProgress::trimFront(trace::RecordRange dropped, trace::RecordRange kept) {
  if (kept.empty() || !ascending_) return false;
  for (size_t s = 0; s < memberCount_; ++s) {
    if (members_[s].farJump || members_[s].irregular) return false;
  }
  trimScratch_.assign(memberCount_, TrimMember{false, false, false, false, 0});
  size_t waiting = 0;
  bool latestMayLeave = false;
  for (const CallRecord& d : dropped) {
    if (isPending(d)) return false;
    int64_t latest = latestOf(d);
    latestMayLeave |= latest >= latestRecordNs_;
    if (!isSequenced(d)) continue;
    int slot = slotOf(d.commHash);
    if (slot < 0) continue;
    const MemberProgress& m = members_[static_cast<size_t>(slot)];
    // Below lastOrdinal (a candidate, at most its record's seq), it is below maxSeq too.
    if (trace::isPointToPoint(d.op) || !m.candidatesAscend || d.seq >= m.lastOrdinal) {
      return false;
    }
    if (d.state == trace::RecordState::kCompleted && trace::isCollective(d.op) &&
        d.seq >= m.maxCompletedOrdinal) {
      return false;
    }
    TrimMember& t = trimScratch_[static_cast<size_t>(slot)];
    waiting += t.dropped ? 0 : 1;
    t.dropped = true;
    t.activity |= latest >= m.lastActivityNs;
  }
  if (pendingAllFront_ < pendingAll_.size() &&
      pendingAll_[pendingAllFront_].position < dropped.size()) {
    return false;  // not the window this state was built from
  }
  // Each member with dropped records: its first call in R.
  for (size_t i = 0; waiting > 0 && i < kept.size(); ++i) {
    const CallRecord& r = kept[i];
    if (!isSequenced(r)) continue;
    int slot = slotOf(r.commHash);
    if (slot < 0) continue;
    TrimMember& t = trimScratch_[static_cast<size_t>(slot)];
    if (!t.dropped || t.found) continue;
    // A send or receive first: the new base would need the p2pSum at the first collective.
    if (trace::isPointToPoint(r.op)) return false;
    const MemberProgress& m = members_[static_cast<size_t>(slot)];
    t.found = true;
    t.base = r.seq;
    if (isPending(r)) {
      if (m.pendingCount == 0 || m.pending[m.pendingFront].ringIndex != r.ringIndex) return false;
      t.headFirst = true;
    }
    --waiting;
  }
  if (waiting > 0) return false;

  // Exact: apply.
  ++trims_;
  for (const CallRecord& d : dropped) {
    countFacts(d, false, -1);
    if (d.op != OpKind::kSplit || !isSequenced(d)) continue;
    int slot = slotOf(d.commHash);
    if (slot >= 0 && members_[static_cast<size_t>(slot)].alignedPlain) {
      --members_[static_cast<size_t>(slot)].splits;
    }
  }
  // The kept aligned calls: the dropped ones leave, the others move to the front with the window.
  // A member whose last call that was not plain left is plain again: its calls are taken from
  // the window's records that stay (as a rebuild from them would).
  const uint32_t shift = static_cast<uint32_t>(dropped.size());
  bool plainAgain = false;
  for (size_t s = 0; s < memberCount_; ++s) {
    MemberProgress& m = members_[s];
    if (!m.keepsAligned) continue;
    if (!m.alignedPlain && m.notPlainAt < shift) {
      m.alignedPlain = plainAgain = true;
      m.splits = 0;
      m.alignedPositions.clear();
      m.alignedKeys.clear();
      m.notPlainAt = UINT32_MAX;  // marks it for the scan below
      m.lastCollectivePosition -= std::min(m.lastCollectivePosition, shift);
      continue;
    }
    m.lastCollectivePosition -= std::min(m.lastCollectivePosition, shift);
    if (!m.alignedPlain) {
      m.notPlainAt -= shift;
      continue;
    }
    auto firstKept = std::lower_bound(m.alignedPositions.begin(), m.alignedPositions.end(), shift);
    size_t gone = static_cast<size_t>(firstKept - m.alignedPositions.begin());
    m.alignedPositions.erase(m.alignedPositions.begin(), firstKept);
    m.alignedKeys.erase(m.alignedKeys.begin(),
                        m.alignedKeys.begin() + static_cast<std::ptrdiff_t>(gone));
    for (uint32_t& position : m.alignedPositions) position -= shift;
  }
  for (uint32_t i = 0; plainAgain && i < kept.size(); ++i) {
    const CallRecord& r = kept[i];
    if (!isSequenced(r) || trace::isPointToPoint(r.op)) continue;
    int slot = slotOf(r.commHash);
    if (slot < 0 || members_[static_cast<size_t>(slot)].notPlainAt != UINT32_MAX) continue;
    MemberProgress& m = members_[static_cast<size_t>(slot)];
    m.alignedPositions.push_back(i);
    m.alignedKeys.push_back(internal::alignKey(r));
    m.splits += r.op == OpKind::kSplit ? 1 : 0;
  }
  for (size_t s = 0; plainAgain && s < memberCount_; ++s) {
    if (members_[s].notPlainAt == UINT32_MAX) members_[s].notPlainAt = 0;
  }
  pendingAll_.erase(pendingAll_.begin(),
                    pendingAll_.begin() + static_cast<std::ptrdiff_t>(pendingAllFront_));
  pendingAllFront_ = 0;
  for (PendingCall& p : pendingAll_) p.position -= static_cast<uint32_t>(dropped.size());
  bool rescan = latestMayLeave;
  for (size_t s = 0; s < memberCount_; ++s) {
    const TrimMember& t = trimScratch_[s];
    if (!t.dropped) continue;
    MemberProgress& m = members_[s];
    m.base = t.base;
    if (t.headFirst) {
      m.pending[m.pendingFront].seqBefore = 0;
      m.completedSeq = 0;
    }
    if (t.activity) {
      m.lastActivityNs = 0;
      rescan = true;
    }
  }
  if (rescan) {
    // A dropped record may have held a latest time: the maximum over R, as add() takes it.
    if (latestMayLeave) latestRecordNs_ = 0;
    for (const CallRecord& r : kept) {
      int64_t latest = latestOf(r);
      if (latestMayLeave) latestRecordNs_ = std::max(latestRecordNs_, latest);
      if (!isSequenced(r)) continue;
      int slot = slotOf(r.commHash);
      if (slot < 0 || !trimScratch_[static_cast<size_t>(slot)].activity) continue;
      MemberProgress& m = members_[static_cast<size_t>(slot)];
      m.lastActivityNs = std::max(m.lastActivityNs, latest);
    }
  }
  records_ = kept.size();
  firstRing_ = kept.front().ringIndex;
  return true;
}

// One record at the window's end: align.cc's rules for it.
void ProcessProgress::add(const CallRecord& r, uint32_t position, size_t windowSize) {
  const bool pending = isPending(r);
  countFacts(r, pending, +1);
  if (pending) pendingAll_.push_back({r.ringIndex, position, false});
  int64_t latest = latestOf(r);
  latestRecordNs_ = std::max(latestRecordNs_, latest);
  if (!isSequenced(r)) return;
  int slot = slotOf(r.commHash);
  if (slot < 0) return;  // a communicator missing from the table (table full)
  MemberProgress& m = members_[static_cast<size_t>(slot)];
  m.lastActivityNs = std::max(m.lastActivityNs, latest);
  m.maxSeq = std::max(m.maxSeq, r.seq);
  uint64_t seqBefore = m.lastSeq;
  m.lastSeq = r.seq;
  uint64_t ordinal = 0;
  if (trace::isPointToPoint(r.op)) {
    dropAligned(m, position);
    int64_t key = (static_cast<int64_t>(r.rootOrPeer) << 1) | (r.op == OpKind::kSend ? 1 : 0);
    constexpr size_t kScanned = 8;  // up to this many, a scan; past it, the index
    MemberProgress::P2pMax* mx = nullptr;
    if (m.p2pIndex.empty()) {
      for (MemberProgress::P2pMax& entry : m.p2pMax) {
        if (entry.peerAndDirection == key) mx = &entry;
      }
    } else if (auto found = m.p2pIndex.find(key); found != m.p2pIndex.end()) {
      mx = &m.p2pMax[found->second];
    }
    if (mx == nullptr) {
      m.p2pMax.push_back({key, 0});
      if (m.p2pMax.size() > kScanned) {
        if (m.p2pIndex.empty()) {
          for (uint32_t i = 0; i < m.p2pMax.size(); ++i) {
            m.p2pIndex.emplace(m.p2pMax[i].peerAndDirection, i);
          }
        } else {
          m.p2pIndex.emplace(key, static_cast<uint32_t>(m.p2pMax.size() - 1));
        }
      }
      mx = &m.p2pMax.back();
    }
    if (r.p2pSeq > mx->p2pSeq) {
      m.p2pSum += r.p2pSeq - mx->p2pSeq;
      mx->p2pSeq = r.p2pSeq;
    }
  } else if (r.seq <= m.p2pSum) {
    dropAligned(m, position);  // skipped by the alignment (inconsistent)
  } else {
    uint64_t candidate = r.seq - m.p2pSum;
    if (m.anyCollective) {
      m.candidatesAscend &= candidate > m.lastCandidate;
      m.farJump |= candidate > m.lastOrdinal && candidate - m.lastOrdinal > 4097;
    }
    m.lastCandidate = candidate;
    const uint32_t previous = m.lastCollectivePosition;
    m.lastCollectivePosition = position;
    if (m.anyCollective && candidate != m.lastOrdinal + 1) {
      // A gap or a repeat (seen whether plain or not): plain again once the call before it,
      // which it does not follow, left the window.
      dropAligned(m, previous);
    } else if (m.alignedPlain) {
      if (m.alignedPositions.size() == m.alignedPositions.capacity()) {
        // A quarter more, not twice: the lists follow a window that is trimmed back to its size
        // (a 4096-rank collector holds 8 K of them).
        size_t more = m.alignedPositions.size() + m.alignedPositions.size() / 4 + 8;
        m.alignedPositions.reserve(more);
        m.alignedKeys.reserve(more);
      }
      m.alignedPositions.push_back(position);
      m.alignedKeys.push_back(internal::alignKey(r));
      m.splits += r.op == OpKind::kSplit ? 1 : 0;
    }
    if (!m.anyCollective) {
      m.anyCollective = true;
      m.base = m.lastOrdinal = candidate;
      ordinal = candidate;
    } else if (candidate >= m.base) {
      uint64_t pos = candidate - m.base, size = m.lastOrdinal - m.base + 1;
      // align.cc drops a record this far ahead by the window's size at the pass, which may have
      // grown since: the pass must align this member to know.
      if (pos >= size && pos - size > 4 * windowSize + 4096) {
        m.irregular = true;
      } else {
        ordinal = candidate;
        m.lastOrdinal = std::max(m.lastOrdinal, candidate);
      }
    }
    if (ordinal != 0 && r.state == trace::RecordState::kCompleted && trace::isCollective(r.op)) {
      m.maxCompletedOrdinal = std::max(m.maxCompletedOrdinal, ordinal);
    }
  }
  if (pending) {
    if (m.pendingCount == 0) {
      m.completedSeq = seqBefore;
      m.headRingIndex = r.ringIndex;
      m.pending.clear();  // only finished ones were left
      m.pendingFront = 0;
    }
    m.pending.push_back({r.ringIndex, seqBefore, ordinal, false});
    ++m.pendingCount;
  } else if (m.pendingCount == 0) {
    m.completedSeq = r.seq;
  }
}

void ProcessProgress::replaced(const trace::TraceFile& file, const CallRecord& before,
                               const CallRecord& after) {
  // What the alignment reads of a record other than its state: the same call or a rebuild.
  bool sameCall = before.ringIndex == after.ringIndex && before.commHash == after.commHash &&
                  before.seq == after.seq && before.op == after.op &&
                  before.p2pSeq == after.p2pSeq && before.rootOrPeer == after.rootOrPeer &&
                  before.fingerprint == after.fingerprint;  // the kept alignKey
  int64_t latestBefore = latestOf(before), latestAfter = latestOf(after);
  // A latest time that went down (a resend carrying the ring's times then) may have held the
  // process's or its member's maximum: rare, from scratch.
  if (!built_ || !sameCall || latestAfter < latestBefore) {
    rebuild(file);
    return;
  }
  const bool wasPending = isPending(before), nowPending = isPending(after);
  if (wasPending != nowPending && (!wasPending || !finishPending(after.ringIndex))) {
    rebuild(file);  // a finished call pending again, or one this state does not know
    return;
  }
  countFacts(before, wasPending, -1);
  countFacts(after, nowPending, +1);
  latestRecordNs_ = std::max(latestRecordNs_, latestAfter);
  if (!isSequenced(after)) return;
  int slot = slotOf(after.commHash);
  if (slot < 0) return;
  MemberProgress& m = members_[static_cast<size_t>(slot)];
  m.lastActivityNs = std::max(m.lastActivityNs, latestAfter);
  bool nowCompleted = after.state == trace::RecordState::kCompleted &&
                      before.state != trace::RecordState::kCompleted &&
                      trace::isCollective(after.op);
  if (wasPending == nowPending) {
    // Still pending (started, say), or never was: only a completion outside the pending list
    // (a call without completion tracking whose kernel events saw it end) raises the completed
    // ordinal, which needs its ordinal: rare, from scratch.
    if (nowCompleted && !nowPending) rebuild(file);
    return;
  }
  // Here it was pending and is no longer (the other way round rebuilt above).
  auto begin = m.pending.begin() + static_cast<std::ptrdiff_t>(m.pendingFront);
  auto at = std::lower_bound(
      begin, m.pending.end(), after.ringIndex,
      [](const MemberProgress::Pending& p, uint64_t ringIndex) { return p.ringIndex < ringIndex; });
  if (at == m.pending.end() || at->ringIndex != after.ringIndex || at->finished) {
    rebuild(file);
    return;
  }
  if (nowCompleted && at->ordinal != 0) {
    m.maxCompletedOrdinal = std::max(m.maxCompletedOrdinal, at->ordinal);
  }
  at->finished = true;
  --m.pendingCount;
  if (at == begin) {
    // The head finished: the calls up to the next pending one (or the last one) are complete.
    while (m.pendingFront < m.pending.size() && m.pending[m.pendingFront].finished) {
      ++m.pendingFront;
    }
    if (m.pendingCount == 0) {
      m.completedSeq = m.lastSeq;
      m.pending.clear();
      m.pendingFront = 0;
    } else {
      m.completedSeq = m.pending[m.pendingFront].seqBefore;
      m.headRingIndex = m.pending[m.pendingFront].ringIndex;
    }
  }
  // Compacted once the finished ones outnumber the pending ones: each moves once.
  if (m.pending.size() > 2 * m.pendingCount + 16) {
    std::erase_if(m.pending, [](const MemberProgress::Pending& p) { return p.finished; });
    m.pendingFront = 0;
  }
}

bool ProcessProgress::finishPending(uint64_t ringIndex) {
  auto begin = pendingAll_.begin() + static_cast<std::ptrdiff_t>(pendingAllFront_);
  auto at = pendingAll_.end();
  if (ascending_) {
    at = std::lower_bound(begin, pendingAll_.end(), ringIndex,
                          [](const PendingCall& p, uint64_t ring) { return p.ringIndex < ring; });
  } else {
    at = std::find_if(begin, pendingAll_.end(), [ringIndex](const PendingCall& p) {
      return p.ringIndex == ringIndex && !p.finished;
    });
  }
  if (at == pendingAll_.end() || at->ringIndex != ringIndex || at->finished) return false;
  at->finished = true;
  while (pendingAllFront_ < pendingAll_.size() && pendingAll_[pendingAllFront_].finished) {
    ++pendingAllFront_;
  }
  size_t live = pendingAll_.size() - pendingAllFront_;
  if (live == 0) {
    pendingAll_.clear();
    pendingAllFront_ = 0;
  } else if (pendingAll_.size() > 2 * live + 16) {
    std::erase_if(pendingAll_, [](const PendingCall& p) { return p.finished; });
    pendingAllFront_ = 0;
  }
  return true;
}

void CommProgress::add(const MemberProgress& m, bool first) {
  if (first) {
    done = true;
    countsDiffer = false;
    maxCompletedOrdinal = 0;
    completedByAll = m.maxCompletedOrdinal;
  }
  done &= m.pendingCount == 0 && !m.irregular;
  maxCompletedOrdinal = std::max(maxCompletedOrdinal, m.maxCompletedOrdinal);
  completedByAll = std::min(completedByAll, m.maxCompletedOrdinal);
  // Compared with the first member's: CommProgress keeps no member list.
  if (first) {
    firstMaxSeq_ = m.maxSeq;
    firstLastOrdinal_ = m.lastOrdinal;
  } else {
    countsDiffer |= m.maxSeq != firstMaxSeq_;
    done &= m.lastOrdinal == firstLastOrdinal_;
  }
  done &= !countsDiffer;
}

}  // namespace ncclwatch::analysis
