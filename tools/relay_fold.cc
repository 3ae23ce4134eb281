#include "relay_fold.h"

#include <algorithm>
#include <string>

namespace ncclwatch::relay {
namespace wire = trace::wire;
using trace::CallRecord;

namespace {

// A call every member may fold: its completion seen (a call whose completion is not tracked,
// final when issued, is not known to have completed), and no error.
bool completedWell(const CallRecord& record) {
  return record.state == trace::RecordState::kCompleted && record.result == 0;
}

bool endedBadly(const CallRecord& record) {
  return record.state == trace::RecordState::kFailed ||
         record.state == trace::RecordState::kAborted || record.result != 0;
}

int64_t latestOf(const CallRecord& record) {
  return std::max({record.issueNs, record.startNs, record.completeNs});
}

}  // namespace

struct Folder::Agent {
  wire::RecordDecoder decoder;
  wire::RecordEncoder encoder;
  wire::Frame frame;                            // decoding scratch, its vectors' room kept
  int64_t agentNs = 0;                          // the agent's clock at its last RECORDS
  std::vector<std::pair<uint64_t, int>> ranks;  // (commHash, its rank there), its COMMS
  std::vector<CallRecord> outgoing;             // to the collector at the next flush
  bool queued = false;                          // in toFlush_
  bool frameDue = false;                        // a RECORDS frame at the flush (maybe empty)
  std::vector<wire::FoldedNote> notes;          // settled since its last FOLDED
  bool notesDue = false;                        // FOLDED at the flush, before its records
  int64_t nextNoteNs = 0;

  int rankIn(uint64_t commHash) const {
    for (const auto& [hash, rank] : ranks) {
      if (hash == commHash) return rank;
    }
    return -1;
  }
};

struct Folder::Comm {
  enum class Mode { kUndecided, kFolding, kForwarding };
  Mode mode = Mode::kUndecided;
  int nranks = 0;
  int known = 0;
  std::vector<uint32_t> channelOf;  // by comm rank; 0: not seen on this host
  // While folding: each member's last folded call, the context forwardForGood sends first.
  std::vector<CallRecord> lastFolded;
  bool foldedAny = false;
  uint64_t foldedThrough = 0;  // the last ordinal folded
  struct Held {
    int64_t sinceNs = 0;                             // when its first copy came
    std::vector<std::pair<int, CallRecord>> copies;  // (comm rank, record)
    // Its copies went to the collector as they came (the communicator was undecided then): kept
    // here only to judge whether the communicator may fold after it.
    bool sent = false;
  };
  std::map<uint64_t, Held> held;  // by collective ordinal
};

Folder::Folder(FoldOptions options) : options_(options) {}
Folder::~Folder() = default;

Folder::Agent& Folder::agent(uint32_t channel) {
  std::unique_ptr<Agent>& slot = agents_[channel];
  if (!slot) slot = std::make_unique<Agent>();
  return *slot;
}

bool Folder::agentFrame(uint32_t channel, std::span<const std::byte> frame, int64_t nowNs,
                        std::vector<std::byte>& out) {
  Agent& from = agent(channel);
  size_t consumed = 0;
  std::string error;
  wire::DecodeStatus status =
      wire::decodeFrame(frame, &from.frame, &consumed, &error, &from.decoder);
  if (status == wire::DecodeStatus::kOtherVersion) {
    // Passed on as it came: the collector answers REFUSED on the channel.
    wire::appendWithChannel(frame, channel, out);
    return true;
  }
  if (status != wire::DecodeStatus::kFrame || consumed != frame.size()) return false;
  switch (from.frame.type) {
    case wire::FrameType::kRecords: {
      from.agentNs = from.frame.nowNs;
      stats_.recordsIn += from.frame.records.size();
      for (const CallRecord& record : from.frame.records) take(channel, from, record, nowNs);
      // An empty frame is the agent's heartbeat, and goes on as one (flushRecords writes a
      // frame for every channel queued, its records or none).
      if (from.frame.records.empty()) queue(channel, from, true);
      flushRecords(out);
      return true;
    }
    case wire::FrameType::kComms:
      wire::appendWithChannel(frame, channel, out);
      tableOf(channel, from, from.frame.comms);
      flushRecords(out);
      return true;
    case wire::FrameType::kBye:
      // Its last calls and notes go before the BYE that ends it.
      agentEnded(channel, out);
      wire::appendWithChannel(frame, channel, out);
      return true;
    case wire::FrameType::kFolded:
    case wire::FrameType::kClosed:
      return false;  // a relay's own frames: not an agent's
    default:
      wire::appendWithChannel(frame, channel, out);  // HELLO, WAITS, SITES
      return true;
  }
}

void Folder::tableOf(uint32_t channel, Agent& from, std::span<const trace::CommInfo> comms) {
  from.ranks.clear();
  for (const trace::CommInfo& info : comms) {
    if (info.commHash == 0 || info.nranks <= 0 || info.rank < 0 || info.rank >= info.nranks) {
      continue;
    }
    from.ranks.emplace_back(info.commHash, info.rank);
    std::unique_ptr<Comm>& slot = comms_[info.commHash];
    if (!slot) {
      slot = std::make_unique<Comm>();
      slot->nranks = info.nranks;
      // A communicator larger than the agents a relay serves is never all on this host.
      if (static_cast<size_t>(info.nranks) > wire::kMaxChannelsPerLink) {
        slot->mode = Comm::Mode::kForwarding;
        continue;
      }
      slot->channelOf.assign(static_cast<size_t>(info.nranks), 0);
    }
    Comm& comm = *slot;
    if (comm.mode == Comm::Mode::kForwarding) continue;
    if (comm.nranks != info.nranks) {
      forwardForGood(comm);  // sizes that disagree: not judged here
      continue;
    }
    uint32_t& seen = comm.channelOf[static_cast<size_t>(info.rank)];
    if (seen != 0 && seen != channel) {
      forwardForGood(comm);  // two agents for one rank: not judged here
      continue;
    }
    if (seen == 0) {
      seen = channel;
      ++comm.known;
    }
    if (comm.mode == Comm::Mode::kUndecided && comm.known == comm.nranks) {
      comm.mode = Comm::Mode::kFolding;
      comm.lastFolded.assign(static_cast<size_t>(comm.nranks), CallRecord{});
      ++stats_.commsFolding;
      settle(info.commHash, comm);
    }
  }
}

void Folder::take(uint32_t channel, Agent& from, const CallRecord& record, int64_t nowNs) {
  auto found = comms_.find(record.commHash);
  int rank = from.rankIn(record.commHash);
  if (found == comms_.end() || rank < 0) {
    // A communicator its table does not hold (yet, or any more): not this agent's to fold, and
    // one the others fold goes on for good first, so that its members' calls stay alike.
    if (found != comms_.end()) forwardForGood(*found->second);
    forward(channel, record);
    return;
  }
  Comm& comm = *found->second;
  // Outside the sequence (init, group marks): passed on as it comes.
  if (comm.mode == Comm::Mode::kForwarding || !trace::isSequenced(record)) {
    forward(channel, record);
    return;
  }
  if (!trace::isCollective(record.op)) {
    // A send, receive, split, destroy...: sequenced calls the relay does not judge. Its
    // communicator's calls go on as they come from here on, after what was held.
    forwardForGood(comm);
    forward(channel, record);
    return;
  }
  uint64_t ordinal = record.ncclSeqNumber;
  if (comm.foldedAny && ordinal <= comm.foldedThrough) return;  // a later copy of a settled call
  auto [at, added] = comm.held.try_emplace(ordinal);
  Comm::Held& held = at->second;
  if (added) {
    held.sinceNs = nowNs;
    // Undecided, a call goes on at once: the collector must not wait on a relay that may never
    // judge it (a member not on this host, or one that reaches the collector another way). It
    // is watched all the same: the communicator folds from the next call only if each one so
    // far was matched.
    held.sent = comm.mode == Comm::Mode::kUndecided;
  }
  auto copy = std::find_if(held.copies.begin(), held.copies.end(),
                           [&](const auto& entry) { return entry.first == rank; });
  if (copy == held.copies.end()) {
    held.copies.emplace_back(rank, record);
    ++heldRecords_;
  } else if (copy->second.ringIndex == record.ringIndex) {
    copy->second = record;  // its newer state
  } else {
    // Two calls of one member at one ordinal: nothing a relay can judge.
    forwardForGood(comm);
    forward(channel, record);
    return;
  }
  if (held.sent) forward(channel, record);
  if (comm.mode == Comm::Mode::kFolding) settle(record.commHash, comm);
}

void Folder::settle(uint64_t commHash, Comm& comm) {
  while (comm.mode == Comm::Mode::kFolding && !comm.held.empty()) {
    auto oldest = comm.held.begin();
    Comm::Held& held = oldest->second;
    bool bad = false, done = true;
    for (const auto& [rank, record] : held.copies) {
      bad |= endedBadly(record) || record.fingerprint != held.copies.front().second.fingerprint;
      done &= completedWell(record);
    }
    if (bad) {
      forwardForGood(comm);  // members disagree, or a call failed: the collector's to judge
      return;
    }
    if (!done || held.copies.size() < static_cast<size_t>(comm.nranks)) return;  // wait
    for (const auto& [rank, record] : held.copies) {
      Agent& member = agent(comm.channelOf[static_cast<size_t>(rank)]);
      auto note = std::find_if(member.notes.begin(), member.notes.end(),
                               [&](const wire::FoldedNote& n) { return n.commHash == commHash; });
      if (note == member.notes.end()) {
        member.notes.push_back(wire::FoldedNote{commHash, 0, 0, 0, 0});
        note = member.notes.end() - 1;
      }
      if (held.sent) {
        note->flags |= wire::kFoldedDropsSent;
      } else {
        note->calls++;
      }
      note->lastOrdinal = oldest->first;
      note->latestNs = std::max(note->latestNs, latestOf(record));
      comm.lastFolded[static_cast<size_t>(rank)] = record;
    }
    if (!held.sent) stats_.recordsFolded += held.copies.size();
    heldRecords_ -= held.copies.size();
    comm.foldedAny = true;
    comm.foldedThrough = oldest->first;
    comm.held.erase(oldest);
  }
}

void Folder::forwardForGood(Comm& comm) {
  if (comm.mode == Comm::Mode::kForwarding) return;
  bool folding = comm.mode == Comm::Mode::kFolding;
  comm.mode = Comm::Mode::kForwarding;
  ++stats_.commsForwarded;
  // Per member, in its ring's order: its last settled call (where it was), then what was held
  // and not sent yet. Its note goes first: what it settles (and, for calls sent before, drops)
  // must not take the records that follow.
  std::vector<std::vector<CallRecord>> byRank(comm.channelOf.size());
  if (folding && comm.foldedAny) {
    for (size_t rank = 0; rank < comm.lastFolded.size(); ++rank) {
      byRank[rank].push_back(comm.lastFolded[rank]);
    }
  }
  for (auto& [ordinal, held] : comm.held) {
    if (!held.sent) {
      for (auto& [rank, record] : held.copies) byRank[static_cast<size_t>(rank)].push_back(record);
    }
    heldRecords_ -= held.copies.size();
  }
  comm.held.clear();
  comm.lastFolded = {};
  for (size_t rank = 0; rank < byRank.size(); ++rank) {
    std::vector<CallRecord>& records = byRank[rank];
    uint32_t channel = comm.channelOf.empty() ? 0 : comm.channelOf[rank];
    auto member = agents_.find(channel);
    if (channel == 0 || member == agents_.end()) continue;
    if (!member->second->notes.empty()) {
      member->second->notesDue = true;
      queue(channel, *member->second, false);
    }
    std::sort(records.begin(), records.end(),
              [](const CallRecord& a, const CallRecord& b) { return a.ringIndex < b.ringIndex; });
    for (const CallRecord& record : records) forward(channel, record);
  }
}

void Folder::queue(uint32_t channel, Agent& to, bool frame) {
  if (!to.queued) toFlush_.push_back(channel);
  to.queued = true;
  to.frameDue |= frame;
}

void Folder::forward(uint32_t channel, const CallRecord& record) {
  Agent& to = agent(channel);
  queue(channel, to, true);
  to.outgoing.push_back(record);
}

void Folder::flushRecords(std::vector<std::byte>& out) {
  for (uint32_t channel : toFlush_) {
    Agent& to = agent(channel);
    if (to.notesDue) flushNotes(channel, to, out);
    if (to.frameDue) {
      scratch_.clear();
      // Kept while not final, as the agent keeps them: its UPDATE messages stay UPDATEs.
      wire::encodeRecords(to.agentNs, to.outgoing, to.encoder, scratch_, true);
      wire::appendWithChannel(scratch_, channel, out);
    }
    stats_.recordsForwarded += to.outgoing.size();
    to.outgoing.clear();
    to.queued = to.frameDue = false;
  }
  toFlush_.clear();
}

void Folder::flushNotes(uint32_t channel, Agent& agent, std::vector<std::byte>& out) {
  agent.notesDue = false;
  if (agent.notes.empty()) return;
  scratch_.clear();
  wire::encodeFolded(agent.agentNs, agent.notes, scratch_);
  wire::appendWithChannel(scratch_, channel, out);
  agent.notes.clear();
}

void Folder::agentEnded(uint32_t channel, std::vector<std::byte>& out) {
  auto found = agents_.find(channel);
  if (found == agents_.end()) return;
  Agent& ended = *found->second;
  for (const auto& [hash, rank] : ended.ranks) {
    auto comm = comms_.find(hash);
    if (comm != comms_.end()) forwardForGood(*comm->second);
  }
  flushRecords(out);
  flushNotes(channel, ended, out);
  // The channel may come back for another agent, long after: it starts from nothing.
  agents_.erase(channel);
}

void Folder::tick(int64_t nowNs, std::vector<std::byte>& out) {
  for (auto& [hash, comm] : comms_) {
    if (comm->mode != Comm::Mode::kForwarding && !comm->held.empty() &&
        nowNs - comm->held.begin()->second.sinceNs > options_.holdNs) {
      forwardForGood(*comm);
    }
  }
  flushRecords(out);
  for (auto& [channel, agent] : agents_) {
    if (!agent->notes.empty() && nowNs >= agent->nextNoteNs) {
      agent->nextNoteNs = nowNs + options_.noteEveryNs;
      flushNotes(channel, *agent, out);
    }
  }
}

}  // namespace ncclwatch::relay
