// Records the collector tests send as synthetic agents.
#pragma once
#include <cstdint>

#include "trace/fingerprint.h"
#include "trace/record.h"

namespace collecttest {

// A started allreduce of `count` f32 (dtype 7) at `seq` on `comm`, issued seq ms after 1 s.
inline ncclwatch::trace::CallRecord allReduce(uint64_t comm, uint64_t seq, uint64_t count) {
  ncclwatch::trace::CallRecord record{};
  record.commHash = comm;
  record.seq = seq;
  record.op = ncclwatch::trace::OpKind::kAllReduce;
  record.count = count;
  record.dtype = 7;
  record.state = ncclwatch::trace::RecordState::kStarted;
  record.issueNs = 1'000'000'000 + static_cast<int64_t>(seq) * 1'000'000;
  record.startNs = record.issueNs + 1000;
  record.rootOrPeer = -1;
  record.ringIndex = seq;
  record.slotVersion = 2;
  record.fingerprint = ncclwatch::trace::fingerprint({record.op, count, 7, 0, -1});
  return record;
}

}  // namespace collecttest
