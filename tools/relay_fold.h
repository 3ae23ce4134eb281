// The relay's folding (docs/protocol.md, "Folding"): a host's relay sees every member of a
// communicator whose ranks are all on its host (a tensor-parallel group of eight GPUs, a node's
// sharding group), and so can judge its collectives itself: a call every member completed with
// the same fingerprint is matched, and nothing the collector could say needs its records. Such
// calls are folded (never sent to the collector; a FOLDED note per agent tells how many, and their
// latest time, for the collector's view of activity), so that the collector's ingest, its one
// thread's cost at tens of thousands of ranks, drops by the share of host-local calls
// (docs/scale.md, session 20).
//
// What stays exact: per communicator only a prefix of its calls is folded. The first call that is
// not matched at once (members disagree, a call failed, a member has not completed it within
// FoldOptions::holdNs, a send, receive, split or destroy on it, a member leaving) turns the
// communicator to forwarding for good: its held calls go to the collector, each member's last
// folded call first (so its window shows where the member was), and every later call as it comes.
// The collector then sees, for every member, the same contiguous run of the communicator's calls
// it would have kept of a window trimmed at its front, which its analysis already reads; a
// communicator not known to be all on this host (fewer members seen than its size within
// holdNs) is forwarded the same way. Records may reach the collector out of ring order (a held
// call after later calls of other communicators): the collector takes a record it has not seen,
// inside its window, as new (collect_triage.cc, Triage::store).
//
// CLI side only (the relay process): it decodes and re-encodes each agent's RECORDS with its
// own delta bases per channel, so the collector's decoder follows the relay's stream, not the
// agent's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trace/wire.h"

namespace ncclwatch::relay {

struct FoldOptions {
  // How long a communicator's oldest held call may wait for every member's completed copy
  // before the communicator is forwarded for good. Long enough for the host's agents to report
  // (each every poll, 100 ms) and for a slow collective to end; short against the collector's
  // quiet time (3 s), after which a hang is judged: a hang on a host-local communicator reaches
  // the collector this late at most.
  int64_t holdNs = 1'000'000'000;
  // How often an agent's folded calls are told (FOLDED) while it folds: its activity for the
  // collector's quiet and silent-rank checks (3 s), at one frame a second an agent (a note each
  // 500 ms added 20% to the collector's frames at 100 ms polls).
  int64_t noteEveryNs = 1'000'000'000;
};

struct FoldStats {
  uint64_t recordsIn = 0;         // records decoded from the agents (updates included)
  uint64_t recordsFolded = 0;     // calls folded (one per member)
  uint64_t recordsForwarded = 0;  // records re-encoded to the collector
  uint64_t commsFolding = 0;      // communicators found all on this host
  uint64_t commsForwarded = 0;    // communicators turned to forwarding (for good)
};

class Folder {
 public:
  explicit Folder(FoldOptions options = {});
  ~Folder();
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;

  // One whole frame the agent of `channel` (1 to kMaxChannel) sent, its header's channel 0. What
  // goes to the collector for it is appended to `out`, stamped with the channel: the frame as it
  // came, or for RECORDS the records neither folded nor held, re-encoded (and records of other
  // agents that this one's released). False when the frame does not decode: the caller ends the
  // agent's connection (its channel then ends with agentEnded).
  bool agentFrame(uint32_t channel, std::span<const std::byte> frame, int64_t nowNs,
                  std::vector<std::byte>& out);
  // The agent's connection ended: its communicators are forwarded from now on (their held
  // calls go out), then its note of folded calls. Call before telling the collector (CLOSED).
  void agentEnded(uint32_t channel, std::vector<std::byte>& out);
  // Communicators whose oldest held call waited past holdNs are forwarded; notes that are due go
  // out. Call every 100 ms or so.
  void tick(int64_t nowNs, std::vector<std::byte>& out);

  const FoldStats& stats() const { return stats_; }
  size_t heldRecords() const { return heldRecords_; }

 private:
  struct Agent;
  struct Comm;
  Agent& agent(uint32_t channel);
  void take(uint32_t channel, Agent& from, const trace::CallRecord& record, int64_t nowNs);
  void tableOf(uint32_t channel, Agent& from, std::span<const trace::CommInfo> comms);
  // Folds the communicator's oldest held calls while every member completed them alike.
  void settle(uint64_t commHash, Comm& comm);
  void forwardForGood(Comm& comm);
  void forward(uint32_t channel, const trace::CallRecord& record);
  // `frame`: a RECORDS frame goes at the flush (its records, or an empty one: a heartbeat).
  void queue(uint32_t channel, Agent& to, bool frame);
  // Every agent's records queued by forward(), as RECORDS frames on its channel.
  void flushRecords(std::vector<std::byte>& out);
  void flushNotes(uint32_t channel, Agent& agent, std::vector<std::byte>& out);

  FoldOptions options_;
  FoldStats stats_;
  std::unordered_map<uint32_t, std::unique_ptr<Agent>> agents_;
  std::unordered_map<uint64_t, std::unique_ptr<Comm>> comms_;
  std::vector<uint32_t> toFlush_;  // channels with records queued
  std::vector<std::byte> scratch_;
  size_t heldRecords_ = 0;
};

}  // namespace ncclwatch::relay
