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

bool LiveTriage::observe(const trace::CallRecord& record, int64_t wallNs) {
  observeUpdate(wallNs);
  if (!trace::isCollective(record.op)) return false;
  auto found = comms_.find(record.commHash);
  if (found == comms_.end()) return false;  // its COMMS frame has not arrived: nothing to align
  Comm& comm = found->second;
  // NCCL's collective counter is the ordinal the analysis aligns on: sends and receives, which
  // legitimately differ between ranks, do not shift it.
  auto [slot, added] = comm.open.try_emplace(record.ncclSeqNumber);
  Open& open = slot->second;
  if (added) open.fingerprint = record.fingerprint;
  bool diverges = open.fingerprint != record.fingerprint;
  if (++open.reported >= comm.size) {
    comm.open.erase(slot);  // every member agreed (or the divergence is already noted)
  } else if (comm.open.size() > maxOpen_) {
    comm.open.erase(comm.open.begin());
    ++forgotten_;
  }
  return diverges;
}

void LiveTriage::observeUpdate(int64_t wallNs) {
  lastActivityNs_ = std::max(lastActivityNs_, wallNs);
}

size_t LiveTriage::openOrdinals() const {
  size_t total = 0;
  for (const auto& [hash, comm] : comms_) total += comm.open.size();
  return total;
}

}  // namespace ncclwatch::analysis
