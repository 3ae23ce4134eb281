#include "analysis/live_triage.h"

#include <algorithm>

namespace ncclwatch::analysis {

int64_t latestTime(const trace::CallRecord& record) {
  return std::max({record.issueNs, record.startNs, record.completeNs});
}

void LiveTriage::addComm(const trace::CommInfo& comm) {
  if (comm.commHash == 0 || comm.nranks <= 0) return;
  comms_[comm.commHash].size = comm.nranks;
}

LiveTriage::Comm* LiveTriage::find(uint64_t commHash) {
  if (Comm* const* kept = recentComms_.find(commHash)) return *kept;
  auto found = comms_.find(commHash);
  if (found == comms_.end()) return nullptr;  // not remembered: its COMMS frame may come later
  recentComms_.remember(commHash, &found->second);
  return &found->second;
}

bool LiveTriage::observe(const trace::CallRecord& record, int64_t wallNs) {
  observeUpdate(wallNs);
  lastJoinedDivergence_ = false;
  if (!trace::isCollective(record.op)) return false;
  Comm* found = find(record.commHash);
  if (found == nullptr) return false;  // its COMMS frame has not arrived: nothing to align
  Comm& comm = *found;
  // NCCL's collective counter is the ordinal the analysis aligns on: sends and receives, which
  // legitimately differ between ranks, do not shift it.
  auto [slot, added] = comm.open.try_emplace(record.ncclSeqNumber);
  Open& open = slot->second;
  if (added) open.fingerprint = record.fingerprint;
  bool diverges = open.fingerprint != record.fingerprint;
  open.diverged |= diverges;
  if (++open.reported >= comm.size) {
    // Every member has spoken. Where they diverged, the collector looks again at once: the
    // mismatch's classes are now complete, and it can be said without waiting to settle.
    bool completesDivergence = open.diverged;
    comm.open.erase(slot);
    comm.completedOne = true;
    lastCompleted_ = completesDivergence;
    return diverges || completesDivergence;
  }
  lastJoinedDivergence_ = open.diverged;  // before the bound below may forget this very ordinal
  if (comm.open.size() > maxOpen_) {
    comm.open.erase(comm.open.begin());
    ++forgotten_;
  }
  lastCompleted_ = false;
  return diverges;
}

void LiveTriage::observeUpdate(int64_t wallNs) {
  lastActivityNs_ = std::max(lastActivityNs_, wallNs);
}

void LiveTriage::settled(uint64_t commHash, uint64_t ordinal) {
  Comm* comm = find(commHash);
  if (comm == nullptr) return;
  for (auto it = comm->open.begin(); it != comm->open.end() && it->first <= ordinal;) {
    it = it->second.diverged ? std::next(it) : comm->open.erase(it);
  }
}

uint64_t LiveTriage::oldestOpenOrdinal(uint64_t commHash, int largestHeld) {
  Comm* comm = find(commHash);
  if (comm == nullptr || !comm->completedOne || comm->open.empty() || comm->size > largestHeld) {
    return UINT64_MAX;
  }
  return comm->open.begin()->first;
}

size_t LiveTriage::openOrdinals() const {
  size_t total = 0;
  for (const auto& [hash, comm] : comms_) total += comm.open.size();
  return total;
}

}  // namespace ncclwatch::analysis
