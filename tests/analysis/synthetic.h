// Builds TraceFiles in memory, as the reader would return them, for analysis tests and the bench.
#pragma once
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "trace/fingerprint.h"
#include "trace/ring_reader.h"

namespace synthetic {

using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;
using ncclwatch::trace::TraceFile;

constexpr int kF32 = 7, kF16 = 6, kI64 = 4, kSum = 0, kMax = 2;
constexpr int64_t kAnchorWall = 1'800'000'000'000'000'000;  // wall clock at monotonic 0

class Rank {
 public:
  Rank(int rank, int world, const std::string& job = "job-1", int pid = 0) {
    file_.usable = true;
    file_.path = "/logs/h-" + std::to_string(pid ? pid : 1000 + rank) + ".ncclwatch";
    auto& h = file_.header;
    std::memcpy(h.magic, "NCCLWTCH", 8);
    h.formatVersion = 1;
    h.pid = pid ? pid : 1000 + rank;
    h.rank = rank;
    h.world = world;
    h.anchorMonotonicNs = 0;
    h.anchorRealtimeNs = kAnchorWall;
    std::strncpy(h.host, "h", sizeof h.host - 1);
    std::strncpy(h.jobId, job.c_str(), sizeof h.jobId - 1);
  }
  Rank& comm(uint64_t hash, int nranks, int rank, uint64_t parent = 0, int color = -1) {
    ncclwatch::trace::CommInfo info{};
    info.commHash = hash;
    info.parentHash = parent;
    info.nranks = nranks;
    info.rank = rank;
    info.color = color;
    info.kind = static_cast<uint8_t>(parent ? OpKind::kSplit : OpKind::kInit);
    file_.comms.push_back(info);
    return *this;
  }
  // A collective (or send/recv with peer = comm rank) at the next seq of `hash`.
  CallRecord& call(uint64_t hash, OpKind op, uint64_t count, RecordState state, int64_t issueNs,
                   int dtype = kF32, int redop = kSum, int rootOrPeer = -1, uint64_t stream = 1) {
    CallRecord r{};
    r.commHash = hash;
    r.seq = ++seq_[hash];
    r.op = op;
    r.count = count;
    r.dtype = static_cast<uint8_t>(dtype);
    r.redop = static_cast<uint8_t>(redop);
    r.rootOrPeer = rootOrPeer;
    r.stream = stream;
    r.issueNs = issueNs;
    r.state = state;
    if (state == RecordState::kStarted || state == RecordState::kCompleted)
      r.startNs = issueNs + 1000;
    if (state == RecordState::kCompleted) r.completeNs = issueNs + 2000;
    if (op == OpKind::kSend || op == OpKind::kRecv) {
      r.p2pSeq = ++p2p_[{hash, rootOrPeer, op == OpKind::kSend}];
    }
    if (ncclwatch::trace::isCollective(op) || ncclwatch::trace::isPointToPoint(op)) {
      r.fingerprint = ncclwatch::trace::fingerprint({op, count, r.dtype, r.redop, rootOrPeer});
      rolling_[hash] = ncclwatch::trace::rollingHash(
          rolling_.count(hash) ? rolling_[hash] : ncclwatch::trace::kRollingSeed, r.fingerprint);
      r.rollingHash = rolling_[hash];
    } else {
      r.flags = ncclwatch::trace::kRecordNoEvents;
      if (state == RecordState::kCompleted) r.startNs = r.completeNs = issueNs;
    }
    r.ringIndex = file_.records.size();
    file_.records.push_back(r);
    return file_.records.back();
  }
  Rank& clean() {
    file_.header.cleanShutdown = 1;
    return *this;
  }
  // Ended through exit(status): what the agent's exit handler writes into the header.
  Rank& exited(int status) {
    file_.header.cleanShutdown = 1;
    file_.header.exitStatus = status;
    file_.header.exitStatusKnown = 1;
    return *this;
  }
  TraceFile& file() { return file_; }
  TraceFile take() { return std::move(file_); }

 private:
  TraceFile file_;
  std::map<uint64_t, uint64_t> seq_;
  std::map<uint64_t, uint64_t> rolling_;
  std::map<std::tuple<uint64_t, int, bool>, uint64_t> p2p_;
};

}  // namespace synthetic
