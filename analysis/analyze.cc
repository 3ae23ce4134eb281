// The cross-rank analysis. Outline (docs/verdicts.md has the rules as users see them):
//  1. Files are grouped into jobs: job id, then attempt (the k-th process of a rank is attempt k).
//  2. Each communicator's members are aligned on their non-p2p calls: a call's ordinal is its seq
//     minus the p2p calls before it (p2p patterns need not be symmetric); p2p calls pair on
//     (sender, receiver, p2pSeq).
//  3. Structural checks need no timing: fingerprint mismatches, split colours, p2p mismatches.
//  4. Hang checks run only when the job stopped making progress: every process ended with a call
//     pending, or none recorded anything for `quietNs`. They use a wait-for graph whose nodes are
//     ranks and whose arcs come from the head of each stream (a call cannot start before the
//     earlier calls on its stream complete): cycles are deadlocks, fully present heads are stuck,
//     ranks the others wait for are missing or dead.
#include "analysis/analyze.h"
#include "analysis/in_nccl.h"
#include "analysis/issued_at.h"
#include "analysis/stack_tree.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "analysis/describe.h"
#include "trace/fingerprint.h"

namespace ncclwatch::analysis {
namespace {

using trace::CallRecord;
using trace::OpKind;
using trace::RecordState;

constexpr uint32_t kNone = UINT32_MAX;

bool isTeardown(OpKind op) {
  return op == OpKind::kDestroy || op == OpKind::kFinalize || op == OpKind::kAbort ||
         op == OpKind::kRevoke;
}
bool isTracked(const CallRecord& r) {
  return (r.flags & (trace::kRecordCaptured | trace::kRecordNoEvents)) == 0;
}
// Issued (or started) and not finished. Lifecycle calls are host-synchronous: one still
// "issued" never returned. Untracked collectives never leave "issued": they are not pending.
bool isPending(const CallRecord& r) {
  if (r.state != RecordState::kIssued && r.state != RecordState::kStarted) return false;
  if (trace::isLifecycle(r.op)) return r.state == RecordState::kIssued;
  return isTracked(r);
}
// A call NCCL refused or reported failed (not "in progress").
bool isFailed(const CallRecord& r) {
  return r.state == RecordState::kFailed && r.result != 0 && r.result != 7;
}
bool isSequenced(const CallRecord& r) {
  return r.seq > 0 && r.op != OpKind::kInit && r.op != OpKind::kGroupStart &&
         r.op != OpKind::kGroupEnd;
}
// What two ranks must agree on at the same ordinal. Splits agree on the op only (their colours
// legitimately differ; the colour check looks at them).
uint64_t alignKey(const CallRecord& r) {
  if (r.op == OpKind::kSplit || r.op == OpKind::kShrink || trace::isLifecycle(r.op)) {
    return static_cast<uint64_t>(r.op);
  }
  return r.fingerprint ^ (static_cast<uint64_t>(r.op) << 56);
}

struct Proc {
  const trace::TraceFile* file = nullptr;
  int rank = -1;
  int64_t toWall = 0;  // add to a record time (CLOCK_MONOTONIC) for CLOCK_REALTIME
  bool alive = false;
  bool clean = false;
  int64_t lastActivity = 0;  // wall
  bool pending = false;      // has a pending call
  const CallRecord& rec(uint32_t i) const { return file->records[i]; }
  int64_t wall(int64_t t) const { return t == 0 ? 0 : t + toWall; }
};

struct Member {
  int proc = 0;
  int commRank = -1;
  uint64_t base = 0;           // ordinal of coll[0]
  std::vector<uint32_t> coll;  // record index by ordinal - base, kNone for a gap
  std::vector<uint32_t> p2p;   // record indices of sends and receives, in issue order
  uint64_t maxSeq = 0;
  uint64_t completedSeq = 0;
  uint64_t pendingCount = 0;
  bool prefixBroken = false;
  uint64_t lastOrdinal() const { return coll.empty() ? 0 : base + coll.size() - 1; }
  uint32_t at(uint64_t ordinal) const {
    if (ordinal < base || ordinal >= base + coll.size()) return kNone;
    return coll[ordinal - base];
  }
};

struct Comm {
  uint64_t hash = 0;
  CommDesc desc;
  int kind = 0;
  std::vector<Member> members;
  std::unordered_map<int, int> byCommRank;  // comm rank -> member index
  uint64_t maxCompletedOrdinal = 0;         // a collective at or below it finished everywhere
};

class JobAnalysis {
 public:
  JobAnalysis(std::vector<Proc> procs, const Options& options, int64_t now)
      : procs_(std::move(procs)), options_(options), now_(now) {}

  JobReport run(const std::string& jobId, int attempt);

 private:
  void buildComms();
  void decideStalled();
  void checkMismatches();
  void checkColours(Comm& comm);
  void checkP2p();
  void checkDeadAndMissing();
  void checkGraph();
  void checkStuckP2p(const std::vector<std::unordered_set<uint32_t>>& heads);
  void checkInit();
  void checkErrors();
  void checkStragglers();
  void excludeShrunkMembers();
  void assessConfidence();
  void noteEvidenceGaps(JobReport& report) const;
  void restsOnTiming(Verdict& v) const;
  // Whether some other member of `hash` waits there (a pending call not done elsewhere).
  bool othersWaitOn(uint64_t hash, int except) const;
  // The first collective ordinal past `gone`'s last on `comm` in which another member waits
  // (pending, not done elsewhere); 0 when none waits for what `gone` never issued.
  uint64_t leftBehind(const Comm& comm, const Member& gone) const;
  // The most common difference between two members' call sites over the calls before
  // `before` on which they agree: the load-address offset between their processes; 0 unknown.
  int64_t siteDelta(const Comm& comm, int a, int b, uint64_t before) const;
  // Whether the calls of two members at two ordinals came from the same line of code (true
  // when their sites cannot tell).
  bool sameSite(const Comm& comm, int a, uint64_t ka, int b, uint64_t kb, uint64_t before) const;
  void finishVerdicts();
  void breakMissingCycles();
  bool heldBehindAnEarlierCall(int proc, uint32_t index) const;
  bool cycleThroughAHeldHost(const Comm& comm, const RankClass& waiting,
                             const std::vector<int>& missing);
  bool brokeItsOwnOrder(int proc) const;
  void addStackTops();
  void summarize(JobReport& report);

  Verdict make(VerdictKind kind, const Comm* comm, uint64_t seq) const {
    Verdict v;
    v.kind = kind;
    if (comm != nullptr) v.comm = comm->desc;
    v.seq = seq;
    v.detectionNs = now_;
    return v;
  }
  CallDesc describe(const Proc& proc, uint32_t index) const {
    return describeCall(proc.rec(index));
  }
  int globalRank(const Comm& comm, int commRank) const {
    auto it = comm.byCommRank.find(commRank);
    return it == comm.byCommRank.end() ? -1 : procs_[comm.members[it->second].proc].rank;
  }
  // The earliest pending call of a process (by issue time): where it waits.
  uint32_t waitPoint(int proc) const;
  // A pending collective whose ordinal finished on some rank: its state here is stale.
  bool impliedDone(int proc, uint32_t index) const;
  uint64_t ordinalOf(int proc, uint32_t index) const {
    auto it = pendingOrdinal_[proc].find(index);
    return it == pendingOrdinal_[proc].end() ? 0 : it->second;
  }
  CallDesc whereIs(int proc) const;

  std::vector<Proc> procs_;
  const Options& options_;
  int64_t now_;
  std::vector<Comm> comms_;
  std::unordered_map<uint64_t, int> commIndex_;
  std::vector<std::unordered_map<uint32_t, uint64_t>>
      pendingOrdinal_;  // per proc: pending record -> ordinal
  // Sends and receives by (comm, sender, receiver, p2pSeq) in comm ranks.
  struct TransferKey {
    uint64_t comm;
    int sender;
    int receiver;
    uint64_t p2pSeq;
    bool operator==(const TransferKey&) const = default;
  };
  struct TransferHash {
    size_t operator()(const TransferKey& k) const {
      uint64_t ranks = static_cast<uint64_t>(static_cast<uint32_t>(k.sender)) << 32 |
                       static_cast<uint32_t>(k.receiver);
      return static_cast<size_t>(
          trace::mix64(k.comm ^ trace::mix64(ranks ^ trace::mix64(k.p2pSeq))));
    }
  };
  std::unordered_set<TransferKey, TransferHash> pendingP2p_;    // pending on some side
  std::unordered_set<TransferKey, TransferHash> completedP2p_;  // ... and completed on another
  // The comm rank of proc `p` on the communicator `hash`, -1 if it is not a member.
  int memberRank(int p, uint64_t hash) const {
    auto c = commIndex_.find(hash);
    if (c == commIndex_.end()) return -1;
    for (const Member& m : comms_[c->second].members) {
      if (m.proc == p) return m.commRank;
    }
    return -1;
  }
  bool stalled_ = false;
  bool stalledByQuiet_ = false;  // stalled only because nothing moved for quietNs
  bool ended_ = false;
  int64_t jobLastActivity_ = 0;
  std::vector<Verdict> verdicts_;
  std::set<int> deadRanks_;  // proc indices judged dead
};

uint32_t JobAnalysis::waitPoint(int p) const {
  const Proc& proc = procs_[p];
  for (uint32_t i = 0; i < proc.file->records.size(); ++i) {
    if (isPending(proc.rec(i)) && !impliedDone(p, i)) return i;
  }
  return kNone;
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
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    const Proc& proc = procs_[p];
    // this process's members, by comm hash; usually a handful, so a small vector
    std::vector<std::pair<uint64_t, std::pair<int, int>>> mine;  // hash -> (comm, member)
    auto memberOf = [&](uint64_t hash) -> std::pair<int, int> {
      for (auto& [h, cm] : mine) {
        if (h == hash) return cm;
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
        comms_.push_back(std::move(comm));
      }
      Comm& comm = comms_[it->second];
      Member m;
      m.proc = p;
      m.commRank = info.rank;
      comm.byCommRank[info.rank] = static_cast<int>(comm.members.size());
      mine.push_back({info.commHash, {it->second, static_cast<int>(comm.members.size())}});
      comm.members.push_back(std::move(m));
    }
    // p2p calls seen so far per (comm, peer, direction): their highest p2pSeq
    std::vector<std::unordered_map<int64_t, uint64_t>> p2pMax(mine.size());
    std::vector<uint64_t> p2pSum(mine.size(), 0);
    uint64_t lastHash = 0;
    int lastSlot = -1;
    const auto& records = proc.file->records;
    for (uint32_t i = 0; i < records.size(); ++i) {
      const CallRecord& r = records[i];
      if (!isSequenced(r)) continue;
      int slot = -1;
      if (r.commHash == lastHash && lastSlot >= 0) {
        slot = lastSlot;
      } else {
        for (int s = 0; s < static_cast<int>(mine.size()); ++s) {
          if (mine[s].first == r.commHash) slot = s;
        }
        lastHash = r.commHash;
        lastSlot = slot;
      }
      if (slot < 0) continue;  // a comm missing from the table (table full)
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
          pendingP2p_.insert({r.commHash, send ? m.commRank : r.rootOrPeer,
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
      if (m.coll.empty()) m.base = ordinal;
      if (ordinal < m.base) continue;
      uint64_t pos = ordinal - m.base;
      if (pos >= m.coll.size()) m.coll.resize(pos + 1, kNone);
      m.coll[pos] = i;
      if (pending) pendingOrdinal_[p][i] = ordinal;
      if (r.state == RecordState::kCompleted && trace::isCollective(r.op)) {
        comm.maxCompletedOrdinal = std::max(comm.maxCompletedOrdinal, ordinal);
      }
    }
  }
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
  // Names: a root comm spanning every process of the job is the world.
  for (Comm& comm : comms_) {
    if (comm.desc.name.empty() && comm.desc.parent == 0 &&
        comm.desc.size == static_cast<int>(procs_.size()) && procs_.size() > 0) {
      comm.desc.name = "world";
    }
  }
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
      m.coll.resize(shrinkOrdinal > m.base ? shrinkOrdinal - m.base : 0);
    }
  }
}

void JobAnalysis::decideStalled() {
  bool anyAlive = false, anyUnclean = false, anyPending = false;
  for (Proc& proc : procs_) {
    jobLastActivity_ = std::max(jobLastActivity_, proc.lastActivity);
    anyAlive |= proc.alive;
    anyUnclean |= !proc.clean && !proc.alive;
    for (const CallRecord& r : proc.file->records) {
      if (isPending(r)) {
        proc.pending = true;
        break;
      }
    }
    anyPending |= proc.pending;
  }
  ended_ = !anyAlive;
  bool countsDiffer = false;
  for (const Comm& comm : comms_) {
    for (const Member& m : comm.members) countsDiffer |= m.maxSeq != comm.members[0].maxSeq;
  }
  if (anyAlive) {
    stalled_ = (anyPending || countsDiffer) && now_ - jobLastActivity_ >= options_.quietNs;
    stalledByQuiet_ = stalled_;
  } else {
    stalled_ = anyUnclean && (anyPending || countsDiffer);
  }
}

// ----- mismatches -----

std::vector<std::string> differingFields(const std::vector<CallDesc>& calls) {
  std::vector<std::string> fields;
  auto differs = [&](auto get) {
    for (const CallDesc& c : calls) {
      if (get(c) != get(calls[0])) return true;
    }
    return false;
  };
  if (differs([](const CallDesc& c) { return static_cast<int>(c.op); })) {
    fields.push_back("op");
    return fields;
  }
  if (differs([](const CallDesc& c) { return c.count; })) fields.push_back("count");
  if (differs([](const CallDesc& c) { return c.dtype; })) fields.push_back("dtype");
  if (trace::hasReduction(calls[0].op) && differs([](const CallDesc& c) { return c.redop; })) {
    fields.push_back("redop");
  }
  if ((trace::hasRoot(calls[0].op) || trace::isPointToPoint(calls[0].op)) &&
      differs([](const CallDesc& c) { return c.rootOrPeer; })) {
    fields.push_back(trace::hasRoot(calls[0].op) ? "root" : "peer");
  }
  return fields;
}

int64_t JobAnalysis::siteDelta(const Comm& comm, int a, int b, uint64_t before) const {
  const Member& ma = comm.members[a];
  const Member& mb = comm.members[b];
  std::map<int64_t, int> votes;
  uint64_t from = std::max(ma.base, mb.base);
  for (uint64_t k = from; k < before; ++k) {
    uint32_t i = ma.at(k), j = mb.at(k);
    if (i == kNone || j == kNone) continue;
    const CallRecord& x = procs_[ma.proc].rec(i);
    const CallRecord& y = procs_[mb.proc].rec(j);
    if (x.callSite == 0 || y.callSite == 0 || alignKey(x) != alignKey(y)) continue;
    ++votes[static_cast<int64_t>(x.callSite - y.callSite)];
  }
  if (votes.empty()) return 0;
  auto best = std::max_element(votes.begin(), votes.end(),
                               [](const auto& l, const auto& r) { return l.second < r.second; });
  return best->first == 0 ? INT64_MIN : best->first;  // INT64_MIN: known, and zero
}

bool JobAnalysis::sameSite(const Comm& comm, int a, uint64_t ka, int b, uint64_t kb,
                           uint64_t before) const {
  uint32_t i = comm.members[a].at(ka), j = comm.members[b].at(kb);
  if (i == kNone || j == kNone) return true;
  uint64_t x = procs_[comm.members[a].proc].rec(i).callSite;
  uint64_t y = procs_[comm.members[b].proc].rec(j).callSite;
  int64_t delta = siteDelta(comm, a, b, before);
  if (x == 0 || y == 0 || delta == 0) return true;  // nothing to compare with
  return static_cast<int64_t>(x - y) == (delta == INT64_MIN ? 0 : delta);
}

// Whether NCCL completes a collective on which the ranks made these calls, with wrong data:
// the same operation, root and byte size, different only in element type or reduction (NCCL
// moves bytes and checks neither).
bool corrupts(const std::vector<CallDesc>& calls) {
  if (calls.size() < 2 || !trace::isCollective(calls[0].op)) return false;
  bool typeOrReduction = false;
  for (const CallDesc& c : calls) {
    if (c.op != calls[0].op || c.rootOrPeer != calls[0].rootOrPeer) return false;
    int bytes = trace::dtypeBytes(c.dtype), firstBytes = trace::dtypeBytes(calls[0].dtype);
    if (bytes == 0 || c.count * bytes != calls[0].count * firstBytes) return false;
    typeOrReduction |= c.dtype != calls[0].dtype || c.redop != calls[0].redop;
  }
  return typeOrReduction;
}

void JobAnalysis::checkMismatches() {
  for (Comm& comm : comms_) {
    if (comm.members.size() < 2) continue;
    checkColours(comm);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Member& m : comm.members) {
      if (m.coll.empty()) continue;
      lo = std::min(lo, m.base);
      hi = std::max(hi, m.lastOrdinal());
    }
    if (lo == UINT64_MAX) continue;
    uint64_t divergent = 0;
    for (uint64_t k = lo; k <= hi && divergent == 0; ++k) {
      uint64_t key = 0;
      bool have = false;
      for (const Member& m : comm.members) {
        uint32_t i = m.at(k);
        if (i == kNone) continue;
        uint64_t kk = alignKey(procs_[m.proc].rec(i));
        if (!have) {
          key = kk;
          have = true;
        } else if (kk != key) {
          divergent = k;
          break;
        }
      }
    }
    if (divergent == 0) continue;
    // Classes at the divergent ordinal.
    std::map<uint64_t, std::vector<int>> byKey;  // key -> member indices
    std::vector<int> absent;
    for (int mi = 0; mi < static_cast<int>(comm.members.size()); ++mi) {
      uint32_t i = comm.members[mi].at(divergent);
      if (i == kNone) {
        absent.push_back(mi);
      } else {
        byKey[alignKey(procs_[comm.members[mi].proc].rec(i))].push_back(mi);
      }
    }
    std::vector<std::pair<uint64_t, std::vector<int>>> classes(byKey.begin(), byKey.end());
    auto keyAt = [&](int mi, uint64_t k) -> uint64_t {
      uint32_t i = comm.members[mi].at(k);
      return i == kNone ? 0 : alignKey(procs_[comm.members[mi].proc].rec(i));
    };
    auto lastOf = [&](int mi) { return static_cast<int64_t>(comm.members[mi].lastOrdinal()); };
    // A class that matches the others one call later skipped a call; one call earlier: it made
    // an extra one. That makes it the culprit even when it is not the smaller class. When the
    // calls around are identical, a shift and a plain substitution both fit: the substitution,
    // which leaves the rest of both sequences aligned, wins unless the call counts differ by
    // the one call the shift needs.
    auto shift = [&](int minority, int majority) -> int {
      uint64_t m0 = keyAt(minority, divergent), m1 = keyAt(minority, divergent + 1);
      uint64_t j0 = keyAt(majority, divergent), j1 = keyAt(majority, divergent + 1);
      uint64_t m2 = keyAt(minority, divergent + 2), j2 = keyAt(majority, divergent + 2);
      if (m1 != 0 && j1 != 0 && m0 == j1 && m1 == j0 && (m2 == 0 || j2 == 0 || m2 == j2)) {
        return 2;  // two calls swapped
      }
      bool skipped = true, extra = true, aligned = true;
      int checked = 0, alignedChecked = 0;
      for (uint64_t d = 0; d < 3; ++d) {
        uint64_t a = keyAt(minority, divergent + d), b = keyAt(majority, divergent + d + 1);
        uint64_t c = keyAt(minority, divergent + d + 1), e = keyAt(majority, divergent + d);
        if (a != 0 && b != 0) {
          skipped &= a == b;
          ++checked;
        }
        if (c != 0 && e != 0) extra &= c == e;
        uint64_t x = keyAt(minority, divergent + d + 1), y = keyAt(majority, divergent + d + 1);
        if (x != 0 && y != 0) {
          aligned &= x == y;
          ++alignedChecked;
        }
      }
      if (checked == 0) skipped = false;
      if (keyAt(minority, divergent + 1) == 0 || keyAt(majority, divergent) == 0) extra = false;
      if (alignedChecked > 0 && aligned && (skipped || extra)) {
        int64_t more = lastOf(minority) - lastOf(majority);
        if (!(skipped && more < 0) && !(extra && more > 0)) return 0;
      }
      return skipped ? -1 : extra ? 1 : 0;
    };
    std::sort(classes.begin(), classes.end(), [&](const auto& a, const auto& b) {
      if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
      return a.second.front() < b.second.front();
    });
    int majorityIdx = 0;
    // A tie (two ranks of a 2-rank communicator, or two halves) has no majority. A class at
    // teardown where the other makes a collective stopped early; otherwise the class whose call
    // is the other's next call skipped one. When both fit (a repeating pattern), the call sites
    // decide: the skipper's call came from the same code as the other's next call (compilers
    // duplicate code, so differing sites alone do not overrule the calls). When still neither
    // or both fit, nothing in the records decides it, and the verdict says so.
    bool undecided = false;
    std::string undecidedWhy;
    if (classes.size() >= 2 && classes[0].second.size() == classes[1].second.size()) {
      int c0 = classes[0].second[0], c1 = classes[1].second[0];
      bool t0 = isTeardown(procs_[comm.members[c0].proc].rec(comm.members[c0].at(divergent)).op);
      bool t1 = isTeardown(procs_[comm.members[c1].proc].rec(comm.members[c1].at(divergent)).op);
      bool skip0 = shift(c0, c1) == -1, skip1 = shift(c1, c0) == -1;
      bool bothByCalls = skip0 && skip1;
      if (bothByCalls) {
        skip0 = sameSite(comm, c0, divergent, c1, divergent + 1, divergent);
        skip1 = sameSite(comm, c1, divergent, c0, divergent + 1, divergent);
      }
      if (t0 != t1) {
        majorityIdx = t0 ? 1 : 0;
      } else if (skip0 != skip1) {
        majorityIdx = skip0 ? 1 : 0;
      } else if (shift(c0, c1) == 2) {
        majorityIdx = 1;  // a swap: either side could be "the" wrong one; name the first
      } else {
        undecided = classes.size() == 2;
        undecidedWhy = bothByCalls
                           ? "each side's call here is the other's next call, from "
                             "the same code (a repeating pattern)"
                           : "neither side's call here is the other's next call, so neither "
                             "skipped a call";
      }
    }
    int rep = classes[majorityIdx].second[0];
    const Member& repM = comm.members[rep];
    const Proc& repP = procs_[repM.proc];
    CallDesc majorityCall = describe(repP, repM.at(divergent));
    Verdict v = make(VerdictKind::kMismatch, &comm, majorityCall.seq);
    std::vector<CallDesc> calls;
    std::string culpritText;
    int64_t divergence = INT64_MAX;
    bool teardown = false;
    OpKind teardownOp = OpKind::kDestroy;
    int shiftKind = 0;
    for (int c = 0; c < static_cast<int>(classes.size()); ++c) {
      RankClass rc;
      const Member& m0 = comm.members[classes[c].second[0]];
      rc.call = describe(procs_[m0.proc], m0.at(divergent));
      for (int mi : classes[c].second) rc.ranks.push_back(procs_[comm.members[mi].proc].rank);
      calls.push_back(rc.call);
      if (c != majorityIdx || undecided) {
        for (int mi : classes[c].second) {
          const Member& m = comm.members[mi];
          v.culprits.push_back(procs_[m.proc].rank);
          divergence = std::min(divergence,
                                procs_[m.proc].wall(procs_[m.proc].rec(m.at(divergent)).issueNs));
        }
        if (isTeardown(rc.call.op) && !isTeardown(majorityCall.op)) {
          teardown = true;
          teardownOp = rc.call.op;
        }
        int s = c == majorityIdx ? 0 : shift(classes[c].second[0], rep);
        if (s != 0) shiftKind = s;
      }
      v.classes.push_back(std::move(rc));
    }
    for (int mi : absent) {
      RankClass rc;
      rc.ranks.push_back(procs_[comm.members[mi].proc].rank);
      rc.call = whereIs(comm.members[mi].proc);
      rc.call.note = "never issued call #" + std::to_string(majorityCall.seq) + "; " + rc.call.note;
      v.classes.push_back(std::move(rc));
    }
    if (majorityIdx != 0) std::swap(v.classes[0], v.classes[majorityIdx]);
    std::sort(v.culprits.begin(), v.culprits.end());
    v.fields = differingFields(calls);
    v.divergenceNs = divergence == INT64_MAX ? 0 : divergence;
    std::string culprits = formatRanks(v.culprits);
    std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + culprits;
    std::string others =
        (v.classes[0].ranks.size() == 1 ? "rank " : "ranks ") + formatRanks(v.classes[0].ranks);
    std::string seqText = "#" + std::to_string(majorityCall.seq);
    // Calls the culprit made fewer (or more) of than the majority: names the skipped call even
    // when identical calls hid the shift.
    auto countDifference = [&]() -> std::string {
      int culpritMember = -1;
      for (int c = 0; c < static_cast<int>(classes.size()); ++c) {
        if (c != majorityIdx) culpritMember = classes[c].second[0];
      }
      if (culpritMember < 0) return "";
      std::map<uint64_t, std::pair<int64_t, uint32_t>>
          tally;  // key -> (majority - culprit, record)
      auto add = [&](int mi, int sign) {
        const Member& m = comm.members[mi];
        for (uint32_t i : m.coll) {
          if (i == kNone) continue;
          const CallRecord& r = procs_[m.proc].rec(i);
          if (isTeardown(r.op)) continue;
          auto& t = tally[alignKey(r)];
          t.first += sign;
          if (sign > 0) t.second = i;
        }
      };
      add(rep, 1);
      add(culpritMember, -1);
      for (auto& [key, t] : tally) {
        if (t.first > 0 && t.first < 4) {
          CallDesc d = describe(repP, t.second);
          return std::to_string(t.first) + " " + callText(d) + " fewer than " + others;
        }
      }
      return "";
    };
    if (teardown && teardownOp == OpKind::kAbort) {
      v.kind = VerdictKind::kMissing;
      v.explanation = who + " aborted the communicator (ncclCommAbort) where " + others +
                      " wait in " + callText(majorityCall) + " " + seqText +
                      ": an abort is local; the others are never told, so every rank must abort "
                      "it (or none)";
    } else if (teardown) {
      v.kind = VerdictKind::kMissing;
      std::string fewer = countDifference();
      v.explanation = who + " reached teardown (" + trace::opName(teardownOp) + ") where " +
                      others + " wait in " + callText(majorityCall) + " " + seqText +
                      (fewer.empty() ? "" : ": it issued " + fewer) +
                      "; it left before the others were done (an early return, or identical "
                      "calls hid a skipped one): look for rank-dependent control flow";
    } else if (undecided) {
      std::string f;
      for (const std::string& field : v.fields) f += (f.empty() ? "" : ", ") + field;
      if (corrupts(calls)) {
        v.effect = Effect::kSilentDataCorruption;
        f += ", the same bytes: NCCL completes it with wrong results, silent data corruption";
      }
      v.explanation = "ranks " + formatRanks(v.culprits) + " disagree at " + seqText + " (" +
                      callText(v.classes[0].call) + " against " + callText(v.classes[1].call) +
                      ", " + f + " differ); with " + std::to_string(classes[0].second.size()) +
                      (classes[0].second.size() == 1 ? " rank" : " ranks") +
                      " on each side there is no majority, and " + undecidedWhy +
                      ": which side is wrong cannot be decided from the records; compare both "
                      "sides' code at these calls";
    } else if (shiftKind == 2) {
      v.explanation = who + " issued " + callText(v.classes.back().call) + " and " +
                      callText(majorityCall) + " in the opposite order of " + others + " (at " +
                      seqText + "): issue collectives in the same order on every rank";
    } else if (shiftKind < 0) {
      v.explanation = who + " skipped " + callText(majorityCall) + ": its call " + seqText + " (" +
                      callText(v.classes.back().call) +
                      ") is the one the others issue next; look for rank-dependent control flow";
    } else if (shiftKind > 0) {
      v.explanation = who + " issued an extra " + callText(v.classes.back().call) + " at " +
                      seqText +
                      "; its next call is the one the others issue here: remove it or "
                      "issue it on every rank";
    } else {
      std::string f;
      for (const std::string& field : v.fields) f += (f.empty() ? "" : ", ") + field;
      if (corrupts(calls)) {
        v.effect = Effect::kSilentDataCorruption;
        v.explanation = who + " called " + callText(v.classes.back().call) + " where " + others +
                        " called " + callText(v.classes[0].call) + " (" + f +
                        " differ, the same bytes): NCCL does not notice and completes it with "
                        "wrong results on every rank: silent data corruption, not a hang; every "
                        "rank must pass the same dtype and reduction";
      } else {
        v.explanation = who + " called " + callText(v.classes.back().call) + " where " + others +
                        " called " + callText(v.classes[0].call) + " (" + f +
                        " differ): every rank must issue the same collective with the same "
                        "arguments";
      }
    }
    verdicts_.push_back(std::move(v));
  }
}

// A split whose colours group ranks into children of unequal sizes, where a regular layout
// (blocks of consecutive ranks, or strided) explains all but a few ranks: those chose a wrong
// colour.
void JobAnalysis::checkColours(Comm& comm) {
  uint64_t hi = 0;
  for (const Member& m : comm.members) hi = std::max(hi, m.lastOrdinal());
  for (const Member& first : comm.members) {
    for (uint32_t idx = 0; idx < first.coll.size(); ++idx) {
      uint32_t fi = first.coll[idx];
      if (fi == kNone || procs_[first.proc].rec(fi).op != OpKind::kSplit) continue;
      uint64_t k = first.base + idx;
      std::map<int, int> colourOf;  // comm rank -> colour
      bool all = true;
      for (const Member& m : comm.members) {
        uint32_t i = m.at(k);
        if (i == kNone || procs_[m.proc].rec(i).op != OpKind::kSplit) {
          all = false;
          break;
        }
        int colour = procs_[m.proc].rec(i).rootOrPeer;
        if (colour >= 0) colourOf[m.commRank] = colour;
      }
      if (!all || colourOf.size() < 3) continue;
      std::map<int, int> sizes;
      for (auto& [r, c] : colourOf) ++sizes[c];
      std::map<int, int> sizeVotes;
      for (auto& [c, s] : sizes) sizeVotes[s] += s;
      if (sizeVotes.size() < 2) continue;  // every child the same size: deliberate
      int n = static_cast<int>(colourOf.size());
      int groupSize = std::max_element(sizeVotes.begin(), sizeVotes.end(), [](auto& a, auto& b) {
                        return a.second < b.second;
                      })->first;
      if (groupSize <= 0 || n % groupSize != 0) continue;
      std::vector<int> best;
      bool found = false;
      for (int pattern = 0; pattern < 2; ++pattern) {
        auto group = [&](int r) { return pattern == 0 ? r / groupSize : r % (n / groupSize); };
        std::map<int, std::map<int, int>> votes;  // expected group -> colour -> count
        for (auto& [r, c] : colourOf) ++votes[group(r)][c];
        std::vector<int> deviants;
        for (auto& [r, c] : colourOf) {
          auto& v = votes[group(r)];
          int top = std::max_element(v.begin(), v.end(), [](auto& a, auto& b) {
                      return a.second < b.second;
                    })->first;
          if (c != top) deviants.push_back(r);
        }
        if (!found || deviants.size() < best.size()) {
          best = deviants;
          found = true;
        }
      }
      if (best.empty() || static_cast<int>(best.size()) * 2 >= n) continue;
      Verdict v = make(VerdictKind::kMismatch, &comm, procs_[first.proc].rec(fi).seq);
      v.fields = {"color"};
      // Ranks in the wrong child combine the wrong ranks' data (or hang later, which the job's
      // own state says): nothing hangs at the split itself.
      v.effect = Effect::kSilentDataCorruption;
      std::map<int, std::vector<int>> byColour;
      for (auto& [r, c] : colourOf) byColour[c].push_back(globalRank(comm, r));
      for (auto& [c, ranks] : byColour) {
        RankClass rc;
        rc.ranks = ranks;
        for (auto& [r, cc] : colourOf) {
          if (cc != c) continue;
          const Member& mm = comm.members[comm.byCommRank[r]];
          rc.call = describe(procs_[mm.proc], mm.at(k));
          break;
        }
        v.classes.push_back(std::move(rc));
      }
      int64_t divergence = INT64_MAX;
      for (int r : best) {
        v.culprits.push_back(globalRank(comm, r));
        const Member& mm = comm.members[comm.byCommRank[r]];
        divergence =
            std::min(divergence, procs_[mm.proc].wall(procs_[mm.proc].rec(mm.at(k)).issueNs));
      }
      v.divergenceNs = divergence;
      std::string sizesText;
      for (auto& [c, ranks] : byColour) {
        sizesText += (sizesText.empty() ? "" : ", ") + std::to_string(ranks.size());
      }
      std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(v.culprits);
      v.explanation = who +
                      " passed a split colour that breaks the layout of the others: the "
                      "children have sizes " +
                      sizesText + " instead of " + std::to_string(groupSize) +
                      " each, so their collectives combine the wrong ranks; check how " + who +
                      " computes its colour";
      verdicts_.push_back(std::move(v));
      return;
    }
  }
  (void)hi;
}

// ----- point-to-point -----

void JobAnalysis::checkP2p() {
  for (Comm& comm : comms_) {
    // (sender comm rank, receiver comm rank, p2pSeq) -> record, per direction
    struct Side {
      int member;
      uint32_t index;
    };
    size_t total = 0;
    for (const Member& m : comm.members) total += m.p2p.size();
    if (total == 0) continue;
    // Per member: its sends to each peer and receives from each peer, in p2pSeq order.
    int count = static_cast<int>(comm.members.size());
    std::vector<std::unordered_map<int, std::vector<uint32_t>>> sendsTo(count), recvsFrom(count);
    for (int mi = 0; mi < count; ++mi) {
      const Member& m = comm.members[mi];
      int lastPeer = INT32_MIN;
      std::vector<uint32_t>* lastList = nullptr;
      bool lastSend = false;
      for (uint32_t i : m.p2p) {
        const CallRecord& r = procs_[m.proc].rec(i);
        if (r.p2pSeq == 0) continue;
        bool send = r.op == OpKind::kSend;
        if (lastList == nullptr || r.rootOrPeer != lastPeer || send != lastSend) {
          lastList = &(send ? sendsTo : recvsFrom)[mi][r.rootOrPeer];
          lastPeer = r.rootOrPeer;
          lastSend = send;
        }
        lastList->push_back(i);
      }
    }
    struct Item {
      Side side;
      std::string what;
      bool novel;
      std::string field;
      int absentPeer = -1;  // global rank of the peer that never posted the other side
    };
    std::vector<Item> items;
    auto novel = [&](const Side& s) {
      return procs_[comm.members[s.member].proc].rec(s.index).p2pSeq == 1;
    };
    auto deadPeer = [&](int commRank) {
      auto it = comm.byCommRank.find(commRank);
      return it == comm.byCommRank.end() || deadRanks_.count(comm.members[it->second].proc) > 0;
    };
    static const std::vector<uint32_t> kEmpty;
    for (int mi = 0; mi < count; ++mi) {
      const Member& sender = comm.members[mi];
      for (auto& [peer, sendList] : sendsTo[mi]) {
        auto pm = comm.byCommRank.find(peer);
        const std::vector<uint32_t>* recvList = &kEmpty;
        int rj = -1;
        if (pm != comm.byCommRank.end()) {
          rj = pm->second;
          auto it = recvsFrom[rj].find(sender.commRank);
          if (it != recvsFrom[rj].end()) recvList = &it->second;
        }
        // both lists ascend in p2pSeq: walk them together
        size_t a = 0, b = 0;
        while (a < sendList.size() || b < recvList->size()) {
          const CallRecord* sr =
              a < sendList.size() ? &procs_[sender.proc].rec(sendList[a]) : nullptr;
          const CallRecord* rr =
              b < recvList->size() ? &procs_[comm.members[rj].proc].rec((*recvList)[b]) : nullptr;
          if (sr && rr && sr->p2pSeq == rr->p2pSeq) {
            if (rr->count != sr->count || rr->dtype != sr->dtype) {
              std::string field = rr->count != sr->count ? "count" : "dtype";
              items.push_back(
                  {{mi, sendList[a]},
                   "its receiver posted " +
                       callText(describe(procs_[comm.members[rj].proc], (*recvList)[b])),
                   false,
                   field});
              items.push_back({{rj, (*recvList)[b]}, "does not match the send", false, field});
            }
            ++a;
            ++b;
          } else if (sr && (!rr || sr->p2pSeq < rr->p2pSeq)) {
            if (stalled_ && isPending(*sr) && rj >= 0 && !deadPeer(peer)) {
              Side side{mi, sendList[a]};
              items.push_back({side,
                               "rank " + std::to_string(globalRank(comm, peer)) +
                                   " never posts the matching Recv",
                               novel(side), "", globalRank(comm, peer)});
            }
            ++a;
          } else {
            if (stalled_ && isPending(*rr) && !deadPeer(sender.commRank)) {
              Side side{rj, (*recvList)[b]};
              items.push_back(
                  {side, "rank " + std::to_string(procs_[sender.proc].rank) + " never sends it",
                   novel(side), "", procs_[sender.proc].rank});
            }
            ++b;
          }
        }
      }
    }
    // receives from a peer that never sent to this rank at all
    for (int mi = 0; mi < count; ++mi) {
      const Member& receiver = comm.members[mi];
      for (auto& [peer, recvList] : recvsFrom[mi]) {
        auto pm = comm.byCommRank.find(peer);
        if (pm == comm.byCommRank.end()) continue;
        if (sendsTo[pm->second].count(receiver.commRank)) continue;  // walked above
        for (uint32_t i : recvList) {
          const CallRecord& rr = procs_[receiver.proc].rec(i);
          if (stalled_ && isPending(rr) && !deadPeer(peer)) {
            Side side{mi, i};
            items.push_back({side,
                             "rank " + std::to_string(globalRank(comm, peer)) + " never sends it",
                             novel(side), "", globalRank(comm, peer)});
          }
        }
      }
    }
    if (items.empty()) continue;
    std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
      const Proc& pa = procs_[comm.members[a.side.member].proc];
      const Proc& pb = procs_[comm.members[b.side.member].proc];
      return std::make_tuple(pa.rec(a.side.index).op, pa.rank, pa.rec(a.side.index).seq) <
             std::make_tuple(pb.rec(b.side.index).op, pb.rank, pb.rec(b.side.index).seq);
    });
    // The fewest ranks that explain every unmatched call: each unmatched call is a pair (its
    // rank, the peer that never posted the other side), and a rank in every pair (a wrong peer
    // leaves both the peer it used and the one it should have used waiting) explains them all.
    // A greedy cover; a tie goes to the rank that never posted its side.
    auto p2pCoverCulprits = [&](const std::vector<Item>& list) {
      std::vector<std::pair<int, int>> pairs;  // (rank with the call, absent peer)
      for (const Item& item : list) {
        if (item.field.empty() && item.absentPeer >= 0) {
          pairs.push_back({procs_[comm.members[item.side.member].proc].rank, item.absentPeer});
        }
      }
      std::set<int> chosen;
      std::vector<bool> covered(pairs.size(), false);
      for (;;) {
        std::map<int, std::pair<int, int>> score;  // rank -> (pairs it covers, pairs absent)
        for (size_t i = 0; i < pairs.size(); ++i) {
          if (covered[i]) continue;
          ++score[pairs[i].first].first;
          ++score[pairs[i].second].first;
          ++score[pairs[i].second].second;
        }
        if (score.empty()) break;
        auto best = score.begin();
        for (auto it = score.begin(); it != score.end(); ++it) {
          if (it->second > best->second) best = it;
        }
        chosen.insert(best->first);
        for (size_t i = 0; i < pairs.size(); ++i) {
          covered[i] =
              covered[i] || pairs[i].first == best->first || pairs[i].second == best->first;
        }
      }
      return chosen;
    };
    // A send and receive of different sizes: the side whose size no other transfer on the
    // communicator uses is the odd one; when that does not tell, both.
    auto p2pSizeCulprits = [&](const Comm& c, const std::vector<Item>& list) {
      std::map<uint64_t, int> sizes;  // bytes -> transfers of that size
      for (const Member& m : c.members) {
        for (uint32_t i : m.p2p) {
          const CallRecord& r = procs_[m.proc].rec(i);
          ++sizes[r.count * static_cast<uint64_t>(trace::dtypeBytes(r.dtype))];
        }
      }
      uint64_t usual = std::max_element(sizes.begin(), sizes.end(), [](auto& a, auto& b) {
                         return a.second < b.second;
                       })->first;
      std::set<int> odd, all;
      for (const Item& item : list) {
        if (item.field.empty()) continue;
        const Proc& proc = procs_[c.members[item.side.member].proc];
        const CallRecord& r = proc.rec(item.side.index);
        all.insert(proc.rank);
        if (r.count * static_cast<uint64_t>(trace::dtypeBytes(r.dtype)) != usual) {
          odd.insert(proc.rank);
        }
      }
      return odd.empty() || odd == all ? all : odd;
    };
    uint64_t seq = UINT64_MAX;
    Verdict v = make(VerdictKind::kUnmatchedP2p, &comm, 0);
    std::set<std::string> fields;
    for (const Item& item : items) {
      if (!item.field.empty()) fields.insert(item.field);
    }
    std::set<int> culprits =
        fields.empty() ? p2pCoverCulprits(items) : p2pSizeCulprits(comm, items);
    int64_t divergence = INT64_MAX;
    for (const Item& item : items) {
      const Proc& proc = procs_[comm.members[item.side.member].proc];
      RankClass rc;
      rc.ranks = {proc.rank};
      rc.call = describe(proc, item.side.index);
      // the peer as a global rank, so users read one numbering
      rc.call.rootOrPeer = globalRank(comm, rc.call.rootOrPeer);
      rc.call.note = item.what;
      seq = std::min(seq, rc.call.seq);
      bool involvesCulprit = culprits.count(proc.rank) || culprits.count(item.absentPeer);
      if (involvesCulprit) {
        divergence = std::min(divergence, proc.wall(proc.rec(item.side.index).issueNs));
      }
      if (v.classes.size() < 16) v.classes.push_back(std::move(rc));
    }
    v.seq = seq;
    v.fields.assign(fields.begin(), fields.end());
    v.culprits.assign(culprits.begin(), culprits.end());
    v.divergenceNs = divergence == INT64_MAX ? 0 : divergence;
    std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(v.culprits);
    size_t unmatched = 0;
    bool culpritAbsentEverywhere = v.culprits.size() == 1;
    for (const Item& item : items) {
      if (!item.field.empty()) continue;
      ++unmatched;
      culpritAbsentEverywhere &= item.absentPeer == v.culprits.front();
    }
    if (!fields.empty()) {
      v.explanation = "a send and its receive disagree on " + *fields.begin() + "; " + who +
                      (v.culprits.size() == 1 ? " passes" : " pass") +
                      " a size the others do not use: sender and receiver must pass the same "
                      "count and dtype";
    } else if (v.culprits.size() == 1 && culpritAbsentEverywhere) {
      v.explanation =
          who + " never posts its side of " +
          (unmatched == 1 ? std::string("a transfer its peer waits in")
                          : std::to_string(unmatched) + " transfers its peers wait in") +
          " (rank i's k-th send to j needs j's k-th receive from i): look for the "
          "send or receive " +
          who + " skips";
    } else if (v.culprits.size() == 1) {
      v.explanation = "every one of the " + std::to_string(unmatched) +
                      " unmatched sends and receives involves " + who +
                      ": it talks to a peer "
                      "that does not expect it, so the peer it should have talked to waits in "
                      "vain; check how " +
                      who + " computes its peers";
    } else {
      v.explanation =
          "sends and receives do not pair up (rank i's k-th send to j needs j's k-th "
          "receive from i), and no one rank is in all of them: check the peers of " +
          who;
    }
    if (v.fields.empty()) restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
}

// ----- hangs: dead ranks and missing ones -----

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
    if (trace::isLifecycle(waiting.call.op)) v.kind = VerdictKind::kInitHang;
    RankClass dead;
    dead.ranks = {proc.rank};
    dead.call.note = proc.alive   ? "alive but silent: no NCCL call for a while"
                     : proc.clean ? "process exited normally (returned from main or called exit) "
                                    "without issuing it, its communicator never destroyed"
                                  : "process ended without a clean shutdown (crashed or exited)";
    v.classes.push_back(std::move(waiting));
    v.classes.push_back(std::move(dead));
    v.culprits = {proc.rank};
    v.divergenceNs = proc.lastActivity;
    if (proc.clean && !proc.alive) {
      v.explanation = "rank " + std::to_string(proc.rank) +
                      " ended normally while the others wait for it in #" + std::to_string(v.seq) +
                      ": it left the job early (an early return or exit on a rank-dependent "
                      "path); every rank must make the same collectives before it leaves";
    } else {
      v.explanation = "rank " + std::to_string(proc.rank) +
                      (proc.alive ? " stopped issuing NCCL calls" : " is gone") +
                      " while the others wait for it in #" + std::to_string(v.seq) +
                      ": look at its exit status, core dump or log";
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
    std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(v.culprits);
    if (lifecycle) {
      v.explanation = "ranks " + formatRanks(v.classes[0].ranks) + " wait in " +
                      trace::opName(v.classes[0].call.op) + " #" + std::to_string(v.seq) +
                      ", which " + who + " never called: every member must call it";
    } else {
      v.explanation = "ranks " + formatRanks(v.classes[0].ranks) + " wait in " +
                      callText(v.classes[0].call) + " #" + std::to_string(v.seq) + " for " + who +
                      ", which never issued it and " +
                      (where.size() == 1 && where.begin()->second.size() == v.culprits.size() &&
                               whereCall.begin()->second.op != OpKind::kUnknown
                           ? "wait elsewhere (see their line)"
                           : "are elsewhere") +
                      ": find what holds " + who + " (see the other verdicts)";
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
  if (r.state != RecordState::kIssued || !isPending(r)) return false;
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
    // Finished there, or started and waiting in it as x is: not what holds x.
    if (!isPending(theirs) || theirs.state == RecordState::kStarted) continue;
    if (!heldBehindAnEarlierCall(m.proc, i)) return false;
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
  queuedClass.call.note = "issued, never started: queued behind its #" +
                          std::to_string(waiting.call.seq) + " on comm " + hashText(comm.hash);
  RankClass waitingClass = waiting;
  waitingClass.call.note = "waits here for rank " + std::to_string(procs_[x].rank);
  v.classes = {std::move(heldClass), std::move(queuedClass), std::move(waitingClass)};
  std::sort(v.classes.begin(), v.classes.end(),
            [](const RankClass& a, const RankClass& b) { return a.ranks < b.ranks; });
  v.culprits = culprits;
  v.divergenceNs = procs_[x].wall(held.issueNs);
  const std::string xText = "rank " + std::to_string(procs_[x].rank);
  const std::string qText =
      (queuedRanks.size() == 1 ? "rank " : "ranks ") + formatRanks(queuedRanks);
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

// ----- wait-for graph: deadlocks and stuck calls -----

void JobAnalysis::checkGraph() {
  if (!stalled_) return;
  int n = static_cast<int>(procs_.size());
  // Heads: per process and stream, the first pending collective or p2p call (and the rest of
  // its group). A collective at an ordinal some rank completed is not pending (stale state).
  std::vector<std::unordered_set<uint32_t>> heads(n);
  std::vector<std::vector<uint32_t>> headList(n);
  for (int p = 0; p < n; ++p) {
    const auto& records = procs_[p].file->records;
    std::unordered_map<uint64_t, bool> streamDone;  // stream -> head found
    std::unordered_map<uint64_t, bool> inGroupHead;
    for (uint32_t i = 0; i < records.size(); ++i) {
      const CallRecord& r = records[i];
      if (!(trace::isCollective(r.op) || trace::isPointToPoint(r.op)) || !isPending(r)) continue;
      if (impliedDone(p, i)) continue;
      {
        auto found = streamDone.find(r.stream);
        if (found == streamDone.end()) {
          streamDone[r.stream] = true;
          inGroupHead[r.stream] = (r.flags & trace::kRecordInGroup) != 0;
          heads[p].insert(i);
          headList[p].push_back(i);
        } else if (inGroupHead[r.stream] && (r.flags & trace::kRecordInGroup) &&
                   !headList[p].empty() && records[headList[p].back()].stream == r.stream &&
                   headList[p].back() + 1 == i) {
          heads[p].insert(i);
          headList[p].push_back(i);
        } else {
          inGroupHead[r.stream] = false;
        }
      }
    }
  }
  // Arcs: p waits for q. Only "behind" arcs (q issued the awaited call but its stream holds it
  // behind q's own head) can close an ordering cycle; a call q never issued is missing, not a
  // deadlock.
  std::vector<std::set<int>> arcs(n);
  struct HeadInfo {
    const Comm* comm = nullptr;
    uint64_t ordinal = 0;
    int present = 0;
  };
  std::vector<std::vector<HeadInfo>> info(n);
  std::map<std::pair<const Comm*, uint64_t>, std::vector<int>> fullyPresent;
  for (int p = 0; p < n; ++p) {
    for (uint32_t h : headList[p]) {
      const CallRecord& r = procs_[p].rec(h);
      auto it = commIndex_.find(r.commHash);
      if (it == commIndex_.end()) continue;
      const Comm& comm = comms_[it->second];
      const Member* me = nullptr;
      for (const Member& m : comm.members) {
        if (m.proc == p) me = &m;
      }
      if (me == nullptr) continue;
      if (trace::isCollective(r.op)) {
        uint64_t ordinal = ordinalOf(p, h);
        if (ordinal == 0) continue;
        int present = 1;
        for (const Member& m : comm.members) {
          if (m.proc == p) continue;
          uint32_t i = m.at(ordinal);
          if (i != kNone && heads[m.proc].count(i)) {
            ++present;
          } else if (i != kNone && !isPending(procs_[m.proc].rec(i))) {
            ++present;  // finished there: not what holds us
          } else if (i != kNone) {
            arcs[p].insert(m.proc);
          }
        }
        info[p].push_back({&comm, ordinal, present});
        if (present == static_cast<int>(comm.members.size()) &&
            present >= std::max(1, comm.desc.size)) {
          fullyPresent[{&comm, ordinal}].push_back(p);
        }
      } else {
        int peer = r.rootOrPeer;
        auto pm = comm.byCommRank.find(peer);
        if (pm == comm.byCommRank.end()) continue;
        const Member& other = comm.members[pm->second];
        bool behind = false;
        for (uint32_t i : other.p2p) {
          const CallRecord& o = procs_[other.proc].rec(i);
          if (o.op != r.op && o.rootOrPeer == me->commRank && o.p2pSeq == r.p2pSeq) {
            behind = heads[other.proc].count(i) == 0 && isPending(o);
          }
        }
        if (behind) arcs[p].insert(other.proc);
      }
    }
  }
  // Tarjan's strongly connected components.
  std::vector<int> index(n, -1), low(n, 0), stack;
  std::vector<bool> onStack(n, false);
  int counter = 0;
  std::vector<std::vector<int>> sccs;
  std::function<void(int)> connect = [&](int v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    onStack[v] = true;
    for (int w : arcs[v]) {
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
    std::sort(culprits.begin(), culprits.end());
    v.culprits = culprits;
    v.divergenceNs = divergence;
    // classes in rank order, so that the text does not depend on hash values
    std::sort(v.classes.begin(), v.classes.end(),
              [](const RankClass& a, const RankClass& b) { return a.ranks < b.ranks; });
    std::string cycle;
    for (const RankClass& rc : v.classes) {
      cycle += (cycle.empty() ? "" : ", ") +
               std::string(rc.ranks.size() == 1 ? "rank " : "ranks ") + formatRanks(rc.ranks) +
               " in " + trace::opName(rc.call.op) + " #" + std::to_string(rc.call.seq) + " on " +
               shortHash(rc.call.commHash);
    }
    std::string who = (culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(culprits);
    v.explanation = "a wait-for cycle across communicators (" + cycle +
                    "): each waits for a call the other has queued behind its own on one "
                    "stream; " +
                    who +
                    " issued its calls in a different order than its peers: "
                    "issue them in the same order on every rank";
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
    bool same = true, anyStarted = false, allStarted = true;
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
    all.call.note = allStarted ? "started, never completed" : "issued";
    v.classes.push_back(std::move(all));
    v.divergenceNs = since;
    if (allStarted) {
      v.explanation = "every rank issued and started " + callText(call) + " #" +
                      std::to_string(call.seq) +
                      " and none completed it: the network or a GPU "
                      "stalled (check NCCL_DEBUG=INFO logs, link errors, Xid messages)";
    } else {
      v.culprits = notStarted;
      v.explanation = "every rank issued " + callText(call) + " #" + std::to_string(call.seq) +
                      " and none completed it; it never started on " +
                      (notStarted.size() == 1 ? "rank " : "ranks ") + formatRanks(notStarted) +
                      ": GPU work queued before it on that stream never finished";
    }
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
  if (reported.empty()) checkStuckP2p(heads);
}

// Stuck sends and receives: both sides of a pair at the heads of their streams, neither
// completed. When several such pairs share one rank, that rank is where the transfer stalls.
void JobAnalysis::checkStuckP2p(const std::vector<std::unordered_set<uint32_t>>& heads) {
  for (const Comm& comm : comms_) {
    // A communicator another verdict already explains (a mismatch, an unmatched send) is stuck
    // because of it: saying so again would only be noise.
    bool explained = false;
    for (const Verdict& v : verdicts_) explained |= v.comm.hash == comm.hash;
    if (explained) continue;
    std::vector<std::pair<int, uint32_t>> sides;  // (proc, record) of every stuck pair
    std::map<int, int> pairsOf;                   // proc -> stuck pairs it is in
    int pairs = 0;
    bool anyStarted = false;
    for (const Member& m : comm.members) {
      for (uint32_t i : m.p2p) {
        const CallRecord& send = procs_[m.proc].rec(i);
        if (send.op != OpKind::kSend || !heads[m.proc].count(i)) continue;
        auto pm = comm.byCommRank.find(send.rootOrPeer);
        if (pm == comm.byCommRank.end()) continue;
        const Member& other = comm.members[pm->second];
        for (uint32_t j : other.p2p) {
          const CallRecord& recv = procs_[other.proc].rec(j);
          if (recv.op != OpKind::kRecv || recv.rootOrPeer != m.commRank ||
              recv.p2pSeq != send.p2pSeq || !heads[other.proc].count(j)) {
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
    if (pairs == 0) continue;
    if (!anyStarted && comm.maxCompletedOrdinal == 0) continue;  // no completion info at all
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
      rc.call.note = started ? "started, never completed" : "issued, never started";
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
      v.explanation =
          pairText + " issued on both sides and never completed; they never started on " +
          std::string(notStarted.size() == 1 ? "rank " : "ranks ") + formatRanks(notStarted) +
          ": GPU work queued before them on that stream never finished";
    } else if (!inEvery.empty()) {
      v.culprits = inEvery;
      std::string who = (inEvery.size() == 1 ? "rank " : "ranks ") + formatRanks(inEvery);
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
}

// ----- init and split hangs -----

void JobAnalysis::checkInit() {
  // Processes that never finished creating any communicator while others did.
  std::vector<int> none;
  const Comm* root = nullptr;
  for (const Comm& comm : comms_) {
    if (comm.desc.parent == 0 && (root == nullptr || comm.members.size() > root->members.size())) {
      root = &comm;
    }
  }
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    if (procs_[p].file->comms.empty() && procs_[p].file->header.world != 1) none.push_back(p);
  }
  bool hung = stalled_ || (!ended_ && now_ - jobLastActivity_ >= options_.quietNs) ||
              (ended_ && !none.empty());
  for (int p : none) hung &= !procs_[p].clean;
  if (!none.empty() && hung) {
    Verdict v = make(VerdictKind::kInitHang, root, 0);
    RankClass waiting;
    if (root != nullptr) {
      for (const Member& m : root->members) waiting.ranks.push_back(procs_[m.proc].rank);
      waiting.call.op = OpKind::kInit;
      waiting.call.note = "created the communicator";
      v.classes.push_back(waiting);
    }
    RankClass absent;
    for (int p : none) {
      absent.ranks.push_back(procs_[p].rank);
      v.culprits.push_back(procs_[p].rank);
    }
    absent.call.op = OpKind::kInit;
    absent.call.note = "no communicator: still in ncclCommInit*, or never called it";
    v.classes.push_back(absent);
    std::sort(v.culprits.begin(), v.culprits.end());
    std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(v.culprits);
    v.explanation = root == nullptr
                        ? "no rank finished creating a communicator: ncclCommInitRank waits for "
                          "ranks that never joined (check the unique id exchange, world size, "
                          "ranks)"
                        : who + " never finished ncclCommInit* while the others did: check that " +
                              who + " reaches the init with the same unique id and world size";
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
  // Child communicators some of whose ranks never appeared.
  if (!stalled_) return;
  int world = 0;
  for (const Proc& proc : procs_) world = std::max(world, proc.file->header.world);
  if (world > 0 && static_cast<int>(procs_.size()) < world) return;  // files missing: unknowable
  for (const Comm& comm : comms_) {
    if (comm.desc.parent == 0 || comm.desc.size <= static_cast<int>(comm.members.size())) continue;
    Verdict v = make(VerdictKind::kInitHang, &comm, 0);
    RankClass joined;
    for (const Member& m : comm.members) joined.ranks.push_back(procs_[m.proc].rank);
    joined.call.op = OpKind::kInit;
    joined.call.note = "joined";
    v.classes.push_back(std::move(joined));
    v.explanation = std::to_string(comm.desc.size - comm.members.size()) + " of the " +
                    std::to_string(comm.desc.size) +
                    " ranks of this split never created it: they called the split with another "
                    "colour, or never called it";
    restsOnTiming(v);
    verdicts_.push_back(std::move(v));
  }
}

// ----- errors -----

bool JobAnalysis::othersWaitOn(uint64_t hash, int except) const {
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    if (p == except) continue;
    const auto& records = procs_[p].file->records;
    for (uint32_t i = 0; i < records.size(); ++i) {
      if (records[i].commHash == hash && isPending(records[i]) && !impliedDone(p, i)) return true;
    }
  }
  return false;
}

// An NCCL call that returned an error on some rank, from which that rank never recovered on the
// communicator (no later call on it completed), is a finding once it matters: the rank ended or
// stopped, the job stalled, or other members wait on that communicator. NCCL's error does not
// reach the other ranks: they wait for the failed rank's part for ever.
void JobAnalysis::checkErrors() {
  struct Failure {
    int proc;
    uint32_t index;
  };
  std::map<uint64_t, std::vector<Failure>> byComm;  // comm hash -> unrecovered failures
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    const auto& records = procs_[p].file->records;
    std::unordered_map<uint64_t, uint32_t> failed;  // comm -> first unrecovered failure
    for (uint32_t i = 0; i < records.size(); ++i) {
      const CallRecord& r = records[i];
      if (r.commHash == 0) continue;
      if (isFailed(r)) {
        failed.try_emplace(r.commHash, i);
      } else if (r.state == RecordState::kCompleted && !isTeardown(r.op) && r.op != OpKind::kInit) {
        failed.erase(r.commHash);  // a later call on it worked: the rank went on
      }
    }
    for (auto [hash, index] : failed) byComm[hash].push_back({p, index});
  }
  for (auto& [hash, failures] : byComm) {
    bool matters = stalled_;
    for (const Failure& f : failures) {
      const Proc& proc = procs_[f.proc];
      matters |= !proc.alive || now_ - proc.lastActivity >= options_.quietNs;
      matters |= othersWaitOn(hash, f.proc);
    }
    if (!matters) continue;
    std::sort(failures.begin(), failures.end(), [&](const Failure& a, const Failure& b) {
      return procs_[a.proc].wall(procs_[a.proc].rec(a.index).issueNs) <
             procs_[b.proc].wall(procs_[b.proc].rec(b.index).issueNs);
    });
    const CallRecord& first = procs_[failures[0].proc].rec(failures[0].index);
    auto known = commIndex_.find(hash);
    const Comm* comm = known == commIndex_.end() ? nullptr : &comms_[known->second];
    Verdict v = make(VerdictKind::kError, comm, first.op == OpKind::kInit ? 0 : first.seq);
    v.effect = Effect::kError;
    if (comm == nullptr) {
      v.comm.hash = hash;
      v.comm.size = first.op == OpKind::kInit ? static_cast<int>(first.count) : 0;
    }
    // Who failed, by call and error; a remote error is what a peer's failure looks like from
    // here, so ranks with another error are the culprits when there are any.
    std::map<std::tuple<int, int, uint64_t>, RankClass> failing;
    std::set<int> failedProcs;
    bool anyLocal = false;
    for (const Failure& f : failures) anyLocal |= procs_[f.proc].rec(f.index).result != 6;
    for (const Failure& f : failures) {
      const Proc& proc = procs_[f.proc];
      const CallRecord& r = proc.rec(f.index);
      failedProcs.insert(f.proc);
      RankClass& rc = failing[{static_cast<int>(r.op), r.result, r.seq}];
      if (rc.ranks.empty()) {
        rc.call = describe(proc, f.index);
        if (trace::isPointToPoint(r.op) && comm != nullptr) {
          rc.call.rootOrPeer = globalRank(*comm, rc.call.rootOrPeer);
        }
        rc.call.note = std::string("returned ") + ncclResultName(r.result) + " (" +
                       ncclResultText(r.result) + ")";
      }
      rc.ranks.push_back(proc.rank);
      if (!anyLocal || r.result != 6) v.culprits.push_back(proc.rank);
    }
    for (auto& [key, rc] : failing) v.classes.push_back(std::move(rc));
    // The others: where each member (or, for a communicator never created, each rank) is.
    std::map<std::tuple<uint64_t, uint64_t, int, std::string>, RankClass> others;
    auto addOther = [&](int p) {
      if (failedProcs.count(p)) return;
      uint32_t w = kNone;
      const auto& records = procs_[p].file->records;
      for (uint32_t i = 0; i < records.size() && w == kNone; ++i) {
        if (records[i].commHash == hash && isPending(records[i]) && !impliedDone(p, i)) w = i;
      }
      CallDesc d;
      if (w != kNone) {
        d = describe(procs_[p], w);
        d.note = "waits here";
      } else if (comm == nullptr || first.op == OpKind::kInit) {
        d = whereIs(p);
        if (d.op == OpKind::kUnknown) {
          d.note =
              "never finished creating this communicator (still inside its ncclCommInit*, "
              "or never called it)";
        }
      } else {
        d = whereIs(p);
      }
      RankClass& rc = others[{d.commHash, d.seq, static_cast<int>(d.op), d.note}];
      if (rc.ranks.empty()) rc.call = d;
      rc.ranks.push_back(procs_[p].rank);
    };
    if (comm != nullptr && first.op != OpKind::kInit) {
      for (const Member& m : comm->members) addOther(m.proc);
    } else {
      for (int p = 0; p < static_cast<int>(procs_.size()); ++p) addOther(p);
    }
    std::vector<int> waiting;
    for (auto& [key, rc] : others) {
      waiting.insert(waiting.end(), rc.ranks.begin(), rc.ranks.end());
      v.classes.push_back(std::move(rc));
    }
    std::sort(v.culprits.begin(), v.culprits.end());
    v.divergenceNs = procs_[failures[0].proc].wall(first.issueNs);
    const Proc& firstProc = procs_[failures[0].proc];
    std::string who = (v.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(v.culprits);
    std::string call = first.op == OpKind::kInit
                           ? std::string("ncclCommInit* of comm ") + shortHash(hash) + " (" +
                                 std::to_string(first.count) + " ranks)"
                           : callText(describeCall(first)) + " #" + std::to_string(first.seq);
    std::string after = !firstProc.alive ? ", and it then exited"
                        : now_ - firstProc.lastActivity >= options_.quietNs
                            ? ", and it then stopped calling NCCL"
                            : "";
    std::string stale;
    if (first.op == OpKind::kInit && memberRank(failures[0].proc, hash) >= 0) {
      stale =
          " It passed the unique id of a communicator it had already created: each id makes "
          "one communicator (a stale id).";
    }
    std::string othersText =
        waiting.empty()
            ? ""
            : "; " + std::string(waiting.size() == 1 ? "rank " : "ranks ") + formatRanks(waiting) +
                  (first.op == OpKind::kInit ? " never finished creating that communicator"
                                             : " wait for its part there");
    v.explanation = who + "'s " + call + " returned " + ncclResultName(first.result) + " (" +
                    ncclResultText(first.result) + ")" + after + othersText + "." + stale +
                    " NCCL tells no other rank: see " + who +
                    "'s log for NCCL's message, fix the call, and on an error abort the "
                    "communicator on every rank (ncclCommAbort) so that none waits for ever";
    verdicts_.push_back(std::move(v));
  }
}

// ----- stragglers -----

void JobAnalysis::checkStragglers() {
  int n = static_cast<int>(procs_.size());
  std::vector<int> joined(n, 0), last(n, 0);
  std::vector<std::vector<int64_t>> lags(n);
  std::vector<const Comm*> lastComm(n, nullptr);
  std::vector<uint64_t> lastSeq(n, 0);
  std::vector<int64_t> firstLate(n, 0);
  for (const Comm& comm : comms_) {
    if (comm.members.size() < 3) continue;
    uint64_t lo = 0, hi = UINT64_MAX;
    for (const Member& m : comm.members) {
      if (m.coll.empty()) {
        hi = 0;
        break;
      }
      lo = std::max(lo, m.base);
      hi = std::min(hi, m.lastOrdinal());
    }
    for (uint64_t k = lo; hi != 0 && k <= hi; ++k) {
      int64_t first = INT64_MIN, second = INT64_MIN;
      int who = -1;
      bool ok = true;
      for (const Member& m : comm.members) {
        uint32_t i = m.at(k);
        if (i == kNone) {
          ok = false;
          break;
        }
        const CallRecord& r = procs_[m.proc].rec(i);
        if (!trace::isCollective(r.op)) {
          ok = false;
          break;
        }
        int64_t t = procs_[m.proc].wall(r.issueNs);
        if (t > first) {
          second = first;
          first = t;
          who = m.proc;
        } else if (t > second) {
          second = t;
        }
      }
      if (!ok) continue;
      for (const Member& m : comm.members) ++joined[m.proc];
      if (first - second >= options_.stragglerLagNs) {
        ++last[who];
        if (firstLate[who] == 0 || first < firstLate[who]) firstLate[who] = first;
        lags[who].push_back(first - second);
        lastComm[who] = &comm;
        const Member* wm = nullptr;
        for (const Member& m : comm.members) {
          if (m.proc == who) wm = &m;
        }
        lastSeq[who] = procs_[who].rec(wm->at(k)).seq;
      }
    }
  }
  for (int p = 0; p < n; ++p) {
    if (joined[p] == 0 || last[p] < options_.stragglerMinCalls ||
        last[p] < options_.stragglerShare * joined[p]) {
      continue;
    }
    std::sort(lags[p].begin(), lags[p].end());
    int64_t median = lags[p][lags[p].size() / 2];
    Verdict v = make(VerdictKind::kStraggler, lastComm[p], lastSeq[p]);
    v.effect = Effect::kInformation;
    RankClass slow;
    slow.ranks = {procs_[p].rank};
    char text[160];
    std::snprintf(text, sizeof text, "last to arrive in %d of %d collectives, by %.1f ms (median)",
                  last[p], joined[p], median / 1e6);
    slow.call.note = text;
    v.classes.push_back(std::move(slow));
    v.culprits = {procs_[p].rank};
    v.divergenceNs = firstLate[p];
    v.explanation = "rank " + std::to_string(procs_[p].rank) + " is consistently the last to " +
                    "arrive (" + text +
                    "): the others wait for it; look at its input pipeline, "
                    "host load or GPU clocks (information, not an error)";
    verdicts_.push_back(std::move(v));
  }
}

int priority(const Verdict& v) {
  switch (v.kind) {
    case VerdictKind::kError:
      return -1;
    case VerdictKind::kInitHang:
      return 0;
    case VerdictKind::kMismatch:
      return v.fields.size() == 1 && v.fields[0] == "color" ? 1 : 3;
    case VerdictKind::kDeadlock:
      return 2;
    case VerdictKind::kDeadRank:
      return 4;
    case VerdictKind::kUnmatchedP2p:
      return 5;
    case VerdictKind::kStuck:
      return 6;
    case VerdictKind::kMissing:
      return 7;
    case VerdictKind::kStraggler:
      return 9;
  }
  return 8;
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
      if (aNovel == bNovel) continue;
      Verdict& cause = aNovel ? a : b;
      Verdict& consequence = aNovel ? b : a;
      const std::string who =
          (cause.culprits.size() == 1 ? "rank " : "ranks ") + formatRanks(cause.culprits);
      cause.explanation += "; " + who +
                           " broke the order of calls it kept until here (it went on to a call "
                           "it never made at this point before), so it is the side that skipped";
      consequence.primary = false;
      consequence.explanation +=
          " (a consequence: " + std::string(consequence.culprits.size() == 1 ? "rank " : "ranks ") +
          formatRanks(consequence.culprits) + " wait in #" + std::to_string(cause.seq) +
          " on comm " + hashText(cause.comm.hash) + ", which " + who + " skipped)";
    }
  }
}

void JobAnalysis::finishVerdicts() {
  breakMissingCycles();
  // Consequences: a missing verdict whose absent ranks are all held by another verdict; p2p
  // and later verdicts after a wrong split colour.
  auto involves = [](const Verdict& v, int rank) {
    for (const RankClass& rc : v.classes) {
      if (std::find(rc.ranks.begin(), rc.ranks.end(), rank) != rc.ranks.end()) return true;
    }
    return false;
  };
  bool colour = false;
  for (const Verdict& v : verdicts_) {
    colour |= v.kind == VerdictKind::kMismatch && v.fields == std::vector<std::string>{"color"};
  }
  for (Verdict& v : verdicts_) {
    if (v.kind == VerdictKind::kMissing && !v.culprits.empty()) {
      const Verdict* holder = nullptr;
      bool all = true;
      for (int rank : v.culprits) {
        bool held = false;
        for (const Verdict& o : verdicts_) {
          if (&o == &v || o.kind == VerdictKind::kStraggler || o.kind == VerdictKind::kMissing ||
              o.comm.hash == v.comm.hash) {
            continue;
          }
          if (involves(o, rank)) {
            held = true;
            holder = &o;
          }
        }
        all &= held;
      }
      if (all && holder != nullptr) {
        v.primary = false;
        v.explanation += " (a consequence: they are held by the " +
                         std::string(kindName(holder->kind)) + " on comm " +
                         hashText(holder->comm.hash) + ")";
      }
    }
    // What a failed call leaves behind (the others waiting, a mismatch or a missing call where
    // the failed rank stopped) is a consequence of the error.
    if (v.kind != VerdictKind::kError && v.kind != VerdictKind::kStraggler && !v.culprits.empty()) {
      for (const Verdict& error : verdicts_) {
        if (error.kind != VerdictKind::kError) continue;
        bool held = std::all_of(v.culprits.begin(), v.culprits.end(), [&](int rank) {
          return std::find(error.culprits.begin(), error.culprits.end(), rank) !=
                 error.culprits.end();
        });
        if (held && v.primary) {
          v.primary = false;
          v.explanation += " (a consequence of the failed call of " +
                           std::string(error.culprits.size() == 1 ? "rank " : "ranks ") +
                           formatRanks(error.culprits) + ")";
        }
      }
    }
    if (colour && v.kind != VerdictKind::kStraggler &&
        !(v.kind == VerdictKind::kMismatch && v.fields == std::vector<std::string>{"color"})) {
      v.primary = false;
    }
  }
  std::stable_sort(verdicts_.begin(), verdicts_.end(), [](const Verdict& a, const Verdict& b) {
    if (a.primary != b.primary) return a.primary;
    return priority(a) < priority(b);
  });
}

void JobAnalysis::summarize(JobReport& report) {
  for (const Comm& comm : comms_) {
    CommSummary s;
    s.comm = comm.desc;
    std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::vector<int>> groups;
    for (const Member& m : comm.members) {
      s.ranks.push_back(procs_[m.proc].rank);
      s.calls = std::max(s.calls, m.maxSeq);
      groups[{m.maxSeq, m.completedSeq, m.pendingCount}].push_back(procs_[m.proc].rank);
    }
    std::sort(s.ranks.begin(), s.ranks.end());
    for (auto& [key, ranks] : groups) {
      CommSummary::Progress pr;
      pr.ranks = ranks;
      std::sort(pr.ranks.begin(), pr.ranks.end());
      std::tie(pr.issuedSeq, pr.completedSeq, pr.pending) = key;
      s.progress.push_back(std::move(pr));
    }
    report.comms.push_back(std::move(s));
  }
  std::sort(report.comms.begin(), report.comms.end(),
            [](const CommSummary& a, const CommSummary& b) {
              if (a.comm.parent == 0 && b.comm.parent != 0) return true;
              if (a.comm.parent != 0 && b.comm.parent == 0) return false;
              if (a.ranks != b.ranks) return a.ranks < b.ranks;
              return a.comm.hash < b.comm.hash;
            });
}

// How sure each verdict is. Timing-only doubts are added where the verdicts are made; here the
// evidence itself: ranks without a trace, lost records, calls whose completion nobody tracked.
void JobAnalysis::assessConfidence() {
  int world = 0;
  std::set<int> present;
  for (const Proc& proc : procs_) {
    world = std::max(world, proc.file->header.world);
    present.insert(proc.rank);
  }
  std::vector<int> untraced;
  for (int r = 0; r < world; ++r) {
    if (!present.count(r)) untraced.push_back(r);
  }
  std::unordered_map<int, const Proc*> byRank;
  for (const Proc& proc : procs_) byRank[proc.rank] = &proc;
  for (Verdict& v : verdicts_) {
    if (v.kind == VerdictKind::kStraggler) continue;
    auto doubt = [&v](double factor, std::string why) {
      v.confidence *= factor;
      v.doubts.push_back(std::move(why));
    };
    auto known = commIndex_.find(v.comm.hash);
    int members =
        known == commIndex_.end() ? 0 : static_cast<int>(comms_[known->second].members.size());
    if (known != commIndex_.end() && members < v.comm.size) {
      doubt(0.5, std::to_string(v.comm.size - members) + " of the communicator's " +
                     std::to_string(v.comm.size) + " ranks have no trace (" +
                     (untraced.empty() ? std::string("not recorded")
                                       : "ranks " + formatRanks(untraced)) +
                     "): what they did is unknown");
    } else if (!untraced.empty()) {
      doubt(0.8, "ranks " + formatRanks(untraced) + " of the job have no trace");
    }
    std::set<int> involved(v.culprits.begin(), v.culprits.end());
    for (const RankClass& rc : v.classes) involved.insert(rc.ranks.begin(), rc.ranks.end());
    std::vector<int> lossy, untracked;
    uint64_t lost = 0;
    for (int rank : involved) {
      auto found = byRank.find(rank);
      if (found == byRank.end()) continue;
      const trace::TraceFile& file = *found->second->file;
      uint64_t missing = file.lostRecords + file.header.droppedRecords;
      if (missing > 0) {
        lossy.push_back(rank);
        lost += missing;
      }
    }
    if (!lossy.empty()) {
      doubt(0.6, std::to_string(lost) + " records of ranks " + formatRanks(lossy) +
                     " were lost: calls between the ones kept are unknown");
    }
    // Completion tracking: each class's first rank's record of its call stands for the class.
    for (const RankClass& rc : v.classes) {
      if (rc.ranks.empty() || rc.call.seq == 0 || rc.call.commHash == 0) continue;
      auto found = byRank.find(rc.ranks.front());
      if (found == byRank.end()) continue;
      const auto& records = found->second->file->records;
      for (size_t i = records.size(); i-- > 0;) {
        const CallRecord& r = records[i];
        if (r.commHash != rc.call.commHash || r.seq != rc.call.seq || !isSequenced(r)) continue;
        bool tracked = isTracked(r) || (r.flags & trace::kRecordKernelTracked) != 0;
        if (!tracked && (trace::isCollective(r.op) || trace::isPointToPoint(r.op))) {
          untracked.insert(untracked.end(), rc.ranks.begin(), rc.ranks.end());
        }
        break;
      }
    }
    if (!untracked.empty()) {
      doubt(0.75, "completion was not tracked for the calls of " +
                      std::string(untracked.size() == 1 ? "rank " : "ranks ") +
                      formatRanks(untracked) +
                      " (captured in a CUDA graph, or events off): whether they ran and finished "
                      "is unknown");
    }
  }
}

void JobAnalysis::noteEvidenceGaps(JobReport& report) const {
  int world = report.world;
  std::set<int> present;
  for (const Proc& proc : procs_) present.insert(proc.rank);
  std::vector<int> untraced, noEvents, wrapped;
  for (int r = 0; r < world; ++r) {
    if (!present.count(r)) untraced.push_back(r);
  }
  if (!untraced.empty()) {
    report.evidenceGaps.push_back((untraced.size() == 1 ? "rank " : "ranks ") +
                                  formatRanks(untraced) + " left no trace");
  }
  for (const Proc& proc : procs_) {
    const trace::TraceFile& file = *proc.file;
    uint64_t lost = file.lostRecords + file.header.droppedRecords;
    if (lost > 0) {
      report.evidenceGaps.push_back("rank " + std::to_string(proc.rank) + " lost " +
                                    std::to_string(lost) + " records");
    }
    bool anyTracked = false, anyCall = false;
    uint64_t shed = 0, calls = 0;
    for (const CallRecord& r : file.records) {
      if (!trace::isCollective(r.op) && !trace::isPointToPoint(r.op)) continue;
      anyCall = true;
      ++calls;
      anyTracked |= isTracked(r) || (r.flags & trace::kRecordKernelTracked) != 0;
      shed += (r.flags & trace::kRecordShed) != 0;
    }
    if (anyCall && !anyTracked) noEvents.push_back(proc.rank);
    if (shed > 0 && anyTracked) {
      report.evidenceGaps.push_back(
          "rank " + std::to_string(proc.rank) + " left " + std::to_string(shed) + " of " +
          std::to_string(calls) +
          " calls untracked (no free CUDA event: its calls outran the watchdog)");
    }
    if (!file.continuous && file.header.nextIndex > file.header.capacity) {
      wrapped.push_back(proc.rank);
    }
  }
  if (!noEvents.empty()) {
    report.evidenceGaps.push_back("completion was not tracked on " +
                                  std::string(noEvents.size() == 1 ? "rank " : "ranks ") +
                                  formatRanks(noEvents) + " (events off or unavailable)");
  }
  if (!wrapped.empty()) {
    report.evidenceGaps.push_back(
        "the rings of " + std::string(wrapped.size() == 1 ? "rank " : "ranks ") +
        formatRanks(wrapped) + " overwrote their oldest calls (NCCLWATCH_TRACE=full keeps all)");
  }
}

// Timing alone: nothing moved for the quiet time while calls were pending. A rank slower than
// that, still alive, looks the same.
void JobAnalysis::restsOnTiming(Verdict& v) const {
  if (!stalledByQuiet_) return;
  bool anyCulpritAlive = v.culprits.empty();
  for (int rank : v.culprits) {
    for (const Proc& proc : procs_) anyCulpritAlive |= proc.rank == rank && proc.alive;
  }
  if (!anyCulpritAlive) return;
  char text[200];
  std::snprintf(text, sizeof text,
                "rests on timing alone: no NCCL progress for %.1f s while calls were pending; "
                "a rank slower than that would look the same",
                (now_ - jobLastActivity_) / 1e9);
  v.confidence *= 0.75;
  v.doubts.push_back(text);
}

// Each class's first rank with a dump says where it was: the frames, in its dump taken on the
// hang (hangDumpOf: not a later SIGABRT/SIGTERM dump of its teardown), of the thread
// that issued the class's call (ranks of one class made the same call, so one speaks for all).
void JobAnalysis::addStackTops() {
  std::unordered_map<int, const Proc*> withDump;  // rank -> its process, when it has a dump
  for (const Proc& proc : procs_) {
    if (!proc.file->dumps.empty()) withDump[proc.rank] = &proc;
  }
  if (withDump.empty()) return;
  for (Verdict& verdict : verdicts_) {
    for (RankClass& rankClass : verdict.classes) {
      for (int rank : rankClass.ranks) {
        auto found = withDump.find(rank);
        if (found == withDump.end()) continue;
        const Proc& proc = *found->second;
        rankClass.stackTop =
            stackTop(*hangDumpOf(*proc.file), rankClass.call.threadId, proc.file->header.pid);
        if (!rankClass.stackTop.empty()) break;
      }
    }
  }
}

JobReport JobAnalysis::run(const std::string& jobId, int attempt) {
  JobReport report;
  report.jobId = jobId;
  report.attempt = attempt;
  std::sort(procs_.begin(), procs_.end(),
            [](const Proc& a, const Proc& b) { return a.rank < b.rank; });
  for (const Proc& proc : procs_) report.world = std::max(report.world, proc.file->header.world);
  buildComms();
  excludeShrunkMembers();
  decideStalled();
  checkErrors();
  checkInit();
  checkMismatches();
  checkDeadAndMissing();
  checkP2p();
  checkGraph();
  checkStragglers();
  finishVerdicts();
  assessConfidence();
  addStackTops();
  report.stalled = stalled_;
  report.ended = ended_;
  for (const Proc& proc : procs_) {
    ProcessSummary ps;
    ps.path = proc.file->path;
    ps.rank = proc.rank;
    ps.world = proc.file->header.world;
    ps.host.assign(proc.file->header.host,
                   strnlen(proc.file->header.host, sizeof proc.file->header.host));
    ps.pid = proc.file->header.pid;
    ps.cleanShutdown = proc.clean;
    ps.alive = proc.alive;
    ps.records = proc.file->records.size();
    ps.lastActivityNs = proc.lastActivity;
    report.processes.push_back(std::move(ps));
  }
  report.verdicts = std::move(verdicts_);
  summarize(report);
  noteEvidenceGaps(report);
  report.summary = whatHappened(report, now_, jobLastActivity_);
  return report;
}

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// Whether `pid` on this host still maps the trace file (pids are reused; the mapping is not).
bool stillRunning(const trace::TraceFile& file) {
  std::ifstream maps("/proc/" + std::to_string(file.header.pid) + "/maps");
  if (!maps) return false;
  std::string base = file.path.substr(file.path.find_last_of('/') + 1);
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() >= base.size() &&
        line.compare(line.size() - base.size(), base.size(), base) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

CallDesc describeCall(const CallRecord& r) {
  CallDesc d;
  d.op = r.op;
  d.seq = r.seq;
  d.count = r.count;
  d.dtype = r.dtype;
  d.redop = trace::hasReduction(r.op) ? r.redop : -1;
  d.rootOrPeer = r.rootOrPeer;
  d.p2pSeq = r.p2pSeq;
  d.state = r.state;
  d.callSite = r.callSite;
  d.threadId = r.threadId;
  d.commHash = r.commHash;
  return d;
}

bool runningHere(const trace::TraceFile& file) {
  return onThisHost(file) && stillRunning(file);
}

bool onThisHost(const trace::TraceFile& file) {
  return std::string(file.header.host, strnlen(file.header.host, sizeof file.header.host)) ==
         hostName();
}

const char* kindName(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kMismatch:
      return "mismatch";
    case VerdictKind::kMissing:
      return "missing";
    case VerdictKind::kUnmatchedP2p:
      return "unmatched_p2p";
    case VerdictKind::kStuck:
      return "stuck";
    case VerdictKind::kDeadlock:
      return "deadlock";
    case VerdictKind::kDeadRank:
      return "dead_rank";
    case VerdictKind::kInitHang:
      return "init_hang";
    case VerdictKind::kStraggler:
      return "straggler";
    case VerdictKind::kError:
      return "error";
  }
  return "unknown";
}

const char* effectName(Effect effect) {
  switch (effect) {
    case Effect::kHang:
      return "hang";
    case Effect::kSilentDataCorruption:
      return "silent_data_corruption";
    case Effect::kError:
      return "error";
    case Effect::kInformation:
      return "information";
  }
  return "unknown";
}

const char* confidenceLevel(double confidence) {
  return confidence >= 0.9 ? "high" : confidence >= 0.6 ? "medium" : "low";
}

// The names and texts of nccl.h's ncclResult_t values (NCCL's ncclGetErrorString wording).
const char* ncclResultName(int result) {
  static const char* const kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return result >= 0 && result < 8 ? kNames[result] : "ncclResult?";
}

const char* ncclResultText(int result) {
  static const char* const kTexts[] = {"no error",
                                       "unhandled cuda error",
                                       "unhandled system error",
                                       "internal error",
                                       "invalid argument",
                                       "invalid usage",
                                       "remote process exited or there was a network error",
                                       "NCCL operation in progress"};
  return result >= 0 && result < 8 ? kTexts[result] : "unknown result";
}

bool Report::hasFindings() const {
  for (const JobReport& job : jobs) {
    for (const Verdict& v : job.verdicts) {
      if (v.kind != VerdictKind::kStraggler) return true;
    }
  }
  return false;
}

std::string formatRanks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

Report analyze(std::span<const trace::TraceFile> files, const Options& options) {
  int64_t now = options.nowNs;
  if (now == 0) {
    now = std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count();
  }
  std::string host = options.probeProcesses ? hostName() : "";
  // job id -> its processes in start order
  std::map<std::string, std::vector<const trace::TraceFile*>> byJob;
  for (const trace::TraceFile& file : files) {
    if (!file.usable) continue;
    std::string job(file.header.jobId, strnlen(file.header.jobId, sizeof file.header.jobId));
    byJob[job].push_back(&file);
  }
  Report report;
  for (auto& [job, list] : byJob) {
    std::stable_sort(list.begin(), list.end(), [](auto* a, auto* b) {
      return a->header.anchorRealtimeNs < b->header.anchorRealtimeNs;
    });
    std::map<int, int> seen;  // rank -> processes so far
    std::map<int, std::vector<Proc>> attempts;
    for (const trace::TraceFile* file : list) {
      Proc proc;
      proc.file = file;
      proc.rank = file->header.rank;
      int attempt = proc.rank >= 0 ? seen[proc.rank]++ : 0;
      proc.toWall = file->header.anchorRealtimeNs - file->header.anchorMonotonicNs;
      proc.clean = file->header.cleanShutdown != 0;
      std::string fileHost(file->header.host, strnlen(file->header.host, sizeof file->header.host));
      if (options.probeProcesses) {
        proc.alive = !proc.clean && fileHost == host && stillRunning(*file);
      } else {
        proc.alive = std::find(options.aliveRanks.begin(), options.aliveRanks.end(), proc.rank) !=
                     options.aliveRanks.end();
      }
      int64_t last = file->header.anchorMonotonicNs;
      for (const CallRecord& r : file->records) {
        last = std::max({last, r.issueNs, r.startNs, r.completeNs});
      }
      for (const trace::CommInfo& c : file->comms) last = std::max(last, c.createdNs);
      proc.lastActivity = proc.wall(last);
      attempts[attempt].push_back(proc);
    }
    for (auto& [attempt, procs] : attempts) {
      JobAnalysis analysis(std::move(procs), options, now);
      report.jobs.push_back(analysis.run(job, attempt));
    }
  }
  annotateInNccl(report, files);
  annotateIssuedAt(report, files);
  return report;
}

}  // namespace ncclwatch::analysis
