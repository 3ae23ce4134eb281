// Structural checks that need no timing: members of a communicator that disagree at one
// ordinal (op, count, dtype, reduction, root), and split colours that break a regular layout.
#include "analysis/job_state.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"
#include "analysis/parallel.h"
#include "trace/python_sites.h"

namespace ncclwatch::analysis::internal {

namespace {

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

}  // namespace

int64_t JobAnalysis::siteDelta(const Comm& comm, int a, int b, uint64_t before) const {
  const Member& ma = comm.members[a];
  const Member& mb = comm.members[b];
  std::map<int64_t, int> votes;
  uint64_t from = std::max(ma.base, mb.base);
  uint64_t to = std::min({before, ma.lastOrdinal() + 1, mb.lastOrdinal() + 1});
  for (uint64_t k = from; k < to; ++k) {
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

bool JobAnalysis::madeBefore(const Comm& comm, uint64_t key, std::initializer_list<int> members,
                             uint64_t before) const {
  for (int mi : members) {
    const Member& m = comm.members[mi];
    for (uint64_t k = m.base; k < before && k < m.base + m.coll.size(); ++k) {
      uint32_t i = m.coll[k - m.base];
      if (i != kNone && alignKey(procs_[m.proc].rec(i)) == key) return true;
    }
  }
  return false;
}

// Per communicator; a partial pass keeps the verdicts of those it does not redo.
void JobAnalysis::checkMismatches() {
  for (Comm& comm : comms_) {
    if (!redo(comm)) {
      const CommCache& kept = cache_->comms[comm.hash];
      verdicts_.insert(verdicts_.end(), kept.structural.begin(), kept.structural.end());
      continue;
    }
    size_t before = verdicts_.size();
    readsOtherComms_ = false;
    checkMismatches(comm);
    if (cache_ == nullptr) continue;
    CommCache& kept = cache_->comms[comm.hash];
    kept.structural.assign(verdicts_.begin() + static_cast<std::ptrdiff_t>(before),
                           verdicts_.end());
    kept.readsOtherComms = readsOtherComms_;
    // A partial pass cannot say where absent members are on communicators it did not align.
    if (partial_ && readsOtherComms_) abandoned_ = true;
  }
}

// The first ordinal where the members present disagree with the first of them (0: none). Read
// member by member, each one's window in order: one record of every member per ordinal missed
// the cache on nearly every record at 4096 members.
uint64_t JobAnalysis::firstDivergentOrdinal(const Comm& comm, uint64_t lo, uint64_t hi) const {
  // Each ordinal's slot in the per-ordinal state: its offset from `lo`, or, when the ordinals are
  // far apart (a member far behind the others, or a damaged trace's seq), its place among the
  // ordinals some member issued, so that the state does not grow with the span between them.
  size_t held = 0;
  for (const Member& m : comm.members) held = std::max(held, m.coll.size());
  bool dense = hi - lo < 4 * held + 1024;
  std::vector<uint64_t> issued;
  if (!dense) {
    for (const Member& m : comm.members) {
      for (size_t pos = 0; pos < m.coll.size(); ++pos) {
        if (m.coll[pos] != kNone) issued.push_back(m.base + pos);
      }
    }
    std::sort(issued.begin(), issued.end());
    issued.erase(std::unique(issued.begin(), issued.end()), issued.end());
  }
  auto slotOf = [&](uint64_t k) -> size_t {
    if (dense) return static_cast<size_t>(k - lo);
    return static_cast<size_t>(std::lower_bound(issued.begin(), issued.end(), k) - issued.begin());
  };
  size_t slots = dense ? static_cast<size_t>(hi - lo + 1) : issued.size();
  // Members split over Options::threads: each chunk finds its own first key per slot and its
  // own earliest divergence; then the chunks' first keys are compared slot by slot, in order.
  struct Chunk {
    std::vector<uint64_t> firstKey;
    std::vector<char> seen;
    uint64_t earliest = UINT64_MAX;
  };
  std::vector<Chunk> chunks(chunkCount(comm.members.size(), options_.threads));
  parallelChunks(comm.members.size(), options_.threads,
                 [&](size_t chunkIndex, size_t begin, size_t end) {
                   Chunk& chunk = chunks[chunkIndex];
                   chunk.firstKey.assign(slots, 0);
                   chunk.seen.assign(slots, 0);
                   uint64_t* firstKey = chunk.firstKey.data();
                   char* seen = chunk.seen.data();
                   for (size_t mi = begin; mi < end; ++mi) {
                     const Member& m = comm.members[mi];
                     // Calls at or past the earliest divergence so far cannot make it earlier.
                     size_t stop = m.coll.size();
                     if (chunk.earliest <= m.base) continue;
                     if (chunk.earliest - m.base < stop) stop = chunk.earliest - m.base;
                     const uint32_t* coll = m.coll.data();
                     const uint64_t* keys = m.keys.data();
                     // The dense case, each member's ordinals at a fixed offset into the slots,
                     // is the common one (this loop is a quarter of a divergence's pass at
                     // 32,768 ranks): no per-call branch on the layout.
                     size_t offset = dense ? static_cast<size_t>(m.base - lo) : 0;
                     for (size_t pos = 0; pos < stop; ++pos) {
                       if (coll[pos] == kNone) continue;
                       uint64_t key = keys[pos];
                       size_t slot = dense ? offset + pos : slotOf(m.base + pos);
                       if (!seen[slot]) {
                         seen[slot] = 1;
                         firstKey[slot] = key;
                       } else if (key != firstKey[slot]) {
                         chunk.earliest = m.base + pos;
                         break;
                       }
                     }
                   }
                 });
  uint64_t earliest = UINT64_MAX;
  for (const Chunk& chunk : chunks) earliest = std::min(earliest, chunk.earliest);
  if (chunks.size() > 1) {
    // Below every chunk's own earliest, each chunk saw all its members' keys: two chunks that
    // disagree at a slot diverge there.
    for (size_t slot = 0; slot < slots; ++slot) {
      uint64_t k = dense ? lo + slot : issued[slot];
      if (k >= earliest) break;
      const uint64_t* key = nullptr;
      for (const Chunk& chunk : chunks) {
        if (!chunk.seen[slot]) continue;
        if (key == nullptr) {
          key = &chunk.firstKey[slot];
        } else if (*key != chunk.firstKey[slot]) {
          earliest = k;
          break;
        }
      }
    }
  }
  return earliest == UINT64_MAX ? 0 : earliest;
}

void JobAnalysis::noteColours(const Comm& comm, const std::vector<int>& members, uint64_t ordinal,
                              CallDesc& call) const {
  std::vector<int> colours;
  for (int mi : members) {
    const Member& m = comm.members[mi];
    uint32_t i = m.at(ordinal);
    if (i != kNone) colours.push_back(procs_[m.proc].rec(i).rootOrPeer);
  }
  // Ascending, NCCL_SPLIT_NOCOLOR (-1) last: "colors 0 and NOCOLOR".
  std::sort(colours.begin(), colours.end(),
            [](int a, int b) { return (a == -1) != (b == -1) ? b == -1 : a < b; });
  colours.erase(std::unique(colours.begin(), colours.end()), colours.end());
  if (colours.size() > 1) call.colours = std::move(colours);
}

void JobAnalysis::checkMismatches(Comm& comm) {
  if (comm.members.size() < 2) return;
  if (comm.hasSplits) {
    const std::vector<SplitColours> splits = splitsHeldByAll(comm);
    if (!checkGroupSplits(comm, splits)) checkColours(comm, splits);
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const Member& m : comm.members) {
    if (m.coll.empty()) continue;
    lo = std::min(lo, m.base);
    hi = std::max(hi, m.lastOrdinal());
  }
  if (lo == UINT64_MAX) return;
  uint64_t divergent = firstDivergentOrdinal(comm, lo, hi);
  if (divergent == 0) return;
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
  std::string undecidedWhy, tieDoubt;
  // Three or more ranks and no two of them agree (exp26's reduce_dst: each rank passed itself
  // as the root): there is no majority to quote against, so every rank is named with its call.
  // (Not where a rank is at teardown: that one left early, said below.)
  const bool noneAgree =
      classes.size() >= 3 && absent.empty() &&
      std::all_of(classes.begin(), classes.end(), [&](const auto& c) {
        const Member& m = comm.members[c.second[0]];
        return c.second.size() == 1 && !isTeardown(procs_[m.proc].rec(m.at(divergent)).op);
      });
  uint64_t aheadCalls = 0;      // a tie decided by a side n calls ahead (2 or 3), else 0
  bool aheadIsCulprit = false;  // ... and whether that side made them (else the other skipped)
  if (classes.size() >= 2 && classes[0].second.size() == classes[1].second.size()) {
    int c0 = classes[0].second[0], c1 = classes[1].second[0];
    bool t0 = isTeardown(procs_[comm.members[c0].proc].rec(comm.members[c0].at(divergent)).op);
    bool t1 = isTeardown(procs_[comm.members[c1].proc].rec(comm.members[c1].at(divergent)).op);
    bool skip0 = shift(c0, c1) == -1, skip1 = shift(c1, c0) == -1;
    bool bothByCalls = skip0 && skip1;
    // Only where both windows hold the communicator's whole history: calls a window dropped
    // or a relay folded (the live collector behind relays never sees a host's settled calls)
    // would read as never made, and a skip as an extra call (two_rank_skip behind relays).
    auto wholeHistory = [&](int mi) {
      const Member& m = comm.members[mi];
      return m.base <= 1 && procs_[m.proc].file->foldedLatestNs == 0;
    };
    // How many calls (2 or 3) `ahead` is ahead of `other`: its call that many calls on is the
    // other's call here, and the next ones agree where both windows hold them; 0 if none.
    auto callsAhead = [&](int ahead, int other) -> uint64_t {
      const uint64_t theirs = keyAt(other, divergent);
      if (theirs == 0) return 0;
      for (uint64_t n = 2; n <= 3; ++n) {
        const uint64_t mine = keyAt(ahead, divergent + n);
        if (mine == 0) return 0;  // not in its window (yet)
        if (mine != theirs) continue;
        const uint64_t nextMine = keyAt(ahead, divergent + n + 1),
                       nextTheirs = keyAt(other, divergent + 1);
        return nextMine == 0 || nextTheirs == 0 || nextMine == nextTheirs ? n : 0;
      }
      return 0;
    };
    const uint64_t ahead0 = callsAhead(c0, c1), ahead1 = callsAhead(c1, c0);
    if (bothByCalls) {
      skip0 = sameSite(comm, c0, divergent, c1, divergent + 1, divergent);
      skip1 = sameSite(comm, c1, divergent, c0, divergent + 1, divergent);
    }
    if (t0 != t1) {
      majorityIdx = t0 ? 1 : 0;
    } else if (skip0 != skip1) {
      // One side reads as having skipped the other side's call here, which is the same fact as
      // the other side having made an extra call. A call no member made before here is new code
      // on a rank-dependent path (`if loss > x: all_reduce(...)` taken on half the ranks): the
      // extra call, and its side the culprits; a call made before is one a side skipped.
      int skipper = skip0 ? c0 : c1, caller = skip0 ? c1 : c0;
      // Only where both windows hold the communicator's whole history: calls a window dropped
      // or a relay folded (the live collector behind relays never sees a host's settled calls)
      // would read as never made, and a skip as an extra call (two_rank_skip behind relays).
      bool extra = shift(caller, skipper) == 1 && wholeHistory(skipper) && wholeHistory(caller) &&
                   !madeBefore(comm, keyAt(caller, divergent), {skipper, caller}, divergent);
      majorityIdx = (skipper == c0) != extra ? 1 : 0;
      tieDoubt = std::to_string(classes[0].second.size()) + " ranks on each side, no majority: " +
                 (extra ? "the side whose call here no rank made before is taken to have made "
                          "an extra call"
                        : "the side whose call here is the other side's next call is taken to "
                          "have skipped one");
    } else if (shift(c0, c1) == 2) {
      majorityIdx = 1;  // a swap: either side could be "the" wrong one; name the first
    } else if ((ahead0 != 0) != (ahead1 != 0)) {
      // Several calls ahead: one Python call is often several NCCL calls (broadcast_object_list
      // broadcasts a size, then the data), so a side whose call n calls on is the other side's
      // call here made n calls the other did not (exp25's bcast_obj_subset: "cannot be
      // decided", ranks 0-3 named). As above: calls no rank made before are the extra ones,
      // else the other side skipped them.
      const int ahead = ahead0 != 0 ? c0 : c1, behind = ahead0 != 0 ? c1 : c0;
      const uint64_t n = std::max(ahead0, ahead1);
      const bool extra = wholeHistory(ahead) && wholeHistory(behind) &&
                         !madeBefore(comm, keyAt(ahead, divergent), {ahead, behind}, divergent);
      majorityIdx = (extra ? ahead : behind) == c0 ? 1 : 0;
      tieDoubt = std::to_string(classes[0].second.size()) + " ranks on each side, no majority: " +
                 (extra ? "the side whose " + std::to_string(n) +
                              " calls here no rank made before is taken to have made them extra"
                        : "the side whose call here is the other side's call " + std::to_string(n) +
                              " calls on is taken to have skipped " + std::to_string(n));
      aheadCalls = n;
      aheadIsCulprit = extra;
    } else {
      undecided = classes.size() == 2;
      undecidedWhy = bothByCalls ? "each side's call here is the other's next call, from "
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
  if (!tieDoubt.empty()) {
    v.confidence *= 0.75;
    v.doubts.push_back(std::move(tieDoubt));
  }
  std::vector<CallDesc> calls;
  std::string culpritText;
  int64_t divergence = INT64_MAX;
  bool teardown = false;
  OpKind teardownOp = OpKind::kDestroy;
  bool ourAbort = false;  // the teardown is ncclwatch's own abort (trace::kRecordByNcclwatch)
  int shiftKind = 0;
  for (int c = 0; c < static_cast<int>(classes.size()); ++c) {
    RankClass rc;
    const Member& m0 = comm.members[classes[c].second[0]];
    rc.call = describe(procs_[m0.proc], m0.at(divergent));
    for (int mi : classes[c].second) rc.ranks.push_back(procs_[comm.members[mi].proc].rank);
    if (rc.call.op == OpKind::kSplit) noteColours(comm, classes[c].second, divergent, rc.call);
    calls.push_back(rc.call);
    if (c != majorityIdx || undecided || noneAgree) {
      for (int mi : classes[c].second) {
        const Member& m = comm.members[mi];
        v.culprits.push_back(procs_[m.proc].rank);
        divergence =
            std::min(divergence, procs_[m.proc].wall(procs_[m.proc].rec(m.at(divergent)).issueNs));
      }
      if (isTeardown(rc.call.op) && !isTeardown(majorityCall.op)) {
        teardown = true;
        teardownOp = rc.call.op;
        const CallRecord& record = procs_[m0.proc].rec(m0.at(divergent));
        ourAbort |= trace::madeByNcclwatch(record);
      }
      int s = c == majorityIdx ? 0 : shift(classes[c].second[0], rep);
      if (s != 0) shiftKind = s;
    }
    v.classes.push_back(std::move(rc));
  }
  // Absent members grouped by where they are (as the missing-rank verdict does): at thousands of
  // ranks, a class per absent rank made a verdict of hundreds of identical lines.
  std::map<std::tuple<uint64_t, uint64_t, int, std::string>, size_t> absentClass;
  for (int mi : absent) {
    CallDesc where = whereIs(comm.members[mi].proc);
    auto key = std::make_tuple(where.commHash, where.seq, static_cast<int>(where.op), where.note);
    auto [at, added] = absentClass.try_emplace(key, v.classes.size());
    if (added) {
      RankClass rc;
      rc.call = std::move(where);
      rc.call.note = "never issued call #" + std::to_string(majorityCall.seq) + "; " + rc.call.note;
      v.classes.push_back(std::move(rc));
    }
    v.classes[at->second].ranks.push_back(procs_[comm.members[mi].proc].rank);
  }
  if (majorityIdx != 0) std::swap(v.classes[0], v.classes[majorityIdx]);
  // The odd class the texts quote: the last class of callers (absent members' classes follow
  // them; quoting one of those said "rank 2 called -").
  const CallDesc culpritCall = v.classes[classes.size() - 1].call;
  std::sort(v.culprits.begin(), v.culprits.end());
  v.fields = differingFields(calls);
  v.divergenceNs = divergence == INT64_MAX ? 0 : divergence;
  std::string who = namedRanks(v.culprits);
  std::string others = namedRanks(v.classes[0].ranks);
  std::string seqText = "#" + std::to_string(majorityCall.seq);
  // A member of the last class outside the majority (-1: none), the one the texts compare.
  int culpritMember = -1;
  for (int c = 0; c < static_cast<int>(classes.size()); ++c) {
    if (c != majorityIdx) culpritMember = classes[c].second[0];
  }
  // Calls the culprit made fewer (or more) of than the majority: names the skipped call even
  // when identical calls hid the shift.
  auto countDifference = [&]() -> std::string {
    if (culpritMember < 0) return "";
    std::map<uint64_t, std::pair<int64_t, uint32_t>> tally;  // key -> (majority - culprit, record)
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
  // A rank at teardown is missing from the call, not a call with another op: no fields differ
  // (docs/verdicts.md: fields are a mismatch's), and "(op differ)" in its headline misled.
  if (teardown) v.fields.clear();
  if (teardown && teardownOp == OpKind::kAbort && ourAbort) {
    // What an abort ncclwatch was asked for left behind, never a cause of its own.
    v.kind = VerdictKind::kMissing;
    v.primary = false;
    v.explanation = "ncclwatch aborted the communicator on " + who +
                    " (run --abort or NCCLWATCH_ON_HANG=abort, for a verdict) where " + others +
                    " wait in " + callText(majorityCall) + " " + seqText +
                    ": the job is being torn down; the verdict that asked for the abort is the "
                    "cause";
  } else if (teardown && teardownOp == OpKind::kAbort) {
    v.kind = VerdictKind::kMissing;
    v.explanation = who + " aborted the communicator (ncclCommAbort) where " + others +
                    " wait in " + callText(majorityCall) + " " + seqText +
                    ": an abort is local; the others are never told, so every rank must abort "
                    "it (or none)";
  } else if (teardown) {
    v.kind = VerdictKind::kMissing;
    std::string fewer = countDifference();
    v.explanation = who + " reached teardown (" + trace::opName(teardownOp) + ") where " + others +
                    " wait in " + callText(majorityCall) + " " + seqText +
                    (fewer.empty() ? "" : ": it issued " + fewer) +
                    "; it left before the others were done (an early return, or identical "
                    "calls hid a skipped one): look for rank-dependent control flow";
  } else if (noneAgree) {
    std::string each, f;
    bool ownRank = true;  // every rank passed its own rank as the root or peer
    size_t listed = 0;
    for (const RankClass& rc : v.classes) {
      if (listed++ < 4) {
        each += (each.empty() ? "" : ", ") + std::string("rank ") + formatRanks(rc.ranks) + " " +
                callText(rc.call);
      }
      ownRank &= rc.call.rootOrPeer >= 0 && rc.ranks.size() == 1 &&
                 globalRank(comm, rc.call.rootOrPeer) == rc.ranks.front();
    }
    if (listed > 4) each += " and " + std::to_string(listed - 4) + " more";
    for (const std::string& field : v.fields) f += (f.empty() ? "" : ", ") + field;
    v.explanation =
        "no two ranks agree at " + seqText + " (" + f + " differ): " + each +
        (ownRank && std::find(v.fields.begin(), v.fields.end(), "root") != v.fields.end()
             ? "; each rank passes itself as the root: the root is computed from the "
               "rank (dst=rank, src=rank) where one fixed rank was meant"
             : "; every rank must issue the same collective with the same arguments");
  } else if (undecided) {
    std::string f;
    for (const std::string& field : v.fields) f += (f.empty() ? "" : ", ") + field;
    if (corrupts(calls)) {
      v.effect = Effect::kSilentDataCorruption;
      f += ", the same bytes: NCCL completes it with wrong results, silent data corruption";
    }
    v.explanation = "ranks " + formatRanks(v.culprits) + " disagree at " + seqText + " (" +
                    callText(v.classes[0].call) + " against " + callText(v.classes[1].call) + ", " +
                    f + " differ); with " + std::to_string(classes[0].second.size()) +
                    (classes[0].second.size() == 1 ? " rank" : " ranks") +
                    " on each side there is no majority, and " + undecidedWhy +
                    ": which side is wrong cannot be decided from the records; compare both "
                    "sides' code at these calls";
  } else if (aheadCalls != 0) {
    const bool culpritsAhead = aheadIsCulprit;
    const std::string n = std::to_string(aheadCalls);
    const CallDesc& aheadCall = culpritsAhead ? culpritCall : majorityCall;
    const std::string& aheadWho = culpritsAhead ? who : others;
    const std::string& behindWho = culpritsAhead ? others : who;
    v.explanation =
        aheadWho + " made " + n + " calls from " + seqText + " on (the first " +
        callText(aheadCall) + ") that " + behindWho + " did not: " +
        (culpritsAhead ? "no rank made such a call before, so they are taken as extra calls on a "
                         "rank-dependent path; issue them on every rank or none"
                       : behindWho + " skipped them; look for rank-dependent control flow") +
        " (one Python call may be several NCCL calls)";
  } else if (shiftKind == 2) {
    v.explanation = who + " issued " + callText(culpritCall) + " and " + callText(majorityCall) +
                    " in the opposite order of " + others + " (at " + seqText +
                    "): issue collectives in the same order on every rank";
    // Two threads of the culprit's process issued the two calls (a metrics thread beside the
    // training loop): their order is the timing's, on every rank, and no line of either is wrong.
    if (culpritMember >= 0) {
      const Member& m = comm.members[culpritMember];
      uint32_t first = m.at(divergent), second = m.at(divergent + 1);
      if (first != kNone && second != kNone) {
        int32_t a = procs_[m.proc].rec(first).threadId, b = procs_[m.proc].rec(second).threadId;
        if (a != 0 && b != 0 && a != b) {
          v.explanation += "; the two come from two threads of its process (threads " +
                           std::to_string(a) + " and " + std::to_string(b) +
                           "), whose order on the communicator is the timing's: issue them from "
                           "one thread, or give each thread its own communicator";
        }
      }
    }
  } else if (shiftKind < 0) {
    v.explanation = who + " skipped " + callText(majorityCall) + ": its call " + seqText + " (" +
                    callText(culpritCall) +
                    ") is the one the others issue next; look for rank-dependent control flow";
  } else if (shiftKind > 0) {
    v.explanation = who + " issued an extra " + callText(culpritCall) + " at " + seqText +
                    "; its next call is the one the others issue here: remove it or "
                    "issue it on every rank";
  } else {
    std::string f;
    for (const std::string& field : v.fields) f += (f.empty() ? "" : ", ") + field;
    if (corrupts(calls)) {
      v.effect = Effect::kSilentDataCorruption;
      // Nothing hangs, so the job goes on, mostly repeating it each step: said, so that no one
      // takes one step for the only one hurt.
      std::vector<uint64_t> again;
      size_t repeats = 0;
      if (culpritMember >= 0) {
        // Over the culprit's window only: ordinals far past it (a damaged trace's seq) hold
        // nothing to compare.
        const Member& m = comm.members[culpritMember];
        for (uint64_t k = std::max(divergent + 1, m.base); k < m.base + m.coll.size(); ++k) {
          uint64_t mine = keyAt(culpritMember, k), theirs = keyAt(rep, k);
          if (mine == 0 || theirs == 0 || mine == theirs) continue;
          ++repeats;
          if (again.size() < 3) again.push_back(procs_[m.proc].rec(m.coll[k - m.base]).seq);
        }
      }
      std::string repeated;
      if (repeats > 0) {
        repeated = "; it differs again at " + std::to_string(repeats) +
                   (repeats == 1 ? " later call (" : " later calls (");
        for (size_t i = 0; i < again.size(); ++i) {
          repeated += (i ? ", #" : "#") + std::to_string(again[i]);
        }
        repeated += repeats > again.size() ? ", ...)" : ")";
      }
      v.explanation = who + " called " + callText(culpritCall) + " where " + others + " called " +
                      callText(v.classes[0].call) + " (" + f +
                      " differ, the same bytes): NCCL does not notice and completes it with "
                      "wrong results on every rank: silent data corruption, not a hang" +
                      repeated + "; every rank must pass the same dtype and reduction";
    } else {
      v.explanation = who + " called " + callText(culpritCall) + " where " + others + " called " +
                      callText(v.classes[0].call) + " (" + f +
                      " differ): every rank must issue the same collective with the same "
                      "arguments";
    }
  }
  verdicts_.push_back(std::move(v));
}

// A split whose colours group ranks into children of unequal sizes, where a regular layout
// (blocks of consecutive ranks, or strided) explains all but a few ranks: those chose a wrong
// colour.
void JobAnalysis::nameCulpritsAt(const Comm& comm, const std::vector<int>& commRanks,
                                 uint64_t ordinal, Verdict& v) const {
  int64_t divergence = INT64_MAX;
  for (int r : commRanks) {
    v.culprits.push_back(globalRank(comm, r));
    const Member& m = comm.members[comm.byCommRank.find(r)];
    divergence =
        std::min(divergence, procs_[m.proc].wall(procs_[m.proc].rec(m.at(ordinal)).issueNs));
  }
  v.divergenceNs = divergence;
}

std::vector<JobAnalysis::SplitColours> JobAnalysis::splitsHeldByAll(const Comm& comm) const {
  std::vector<SplitColours> splits;
  if (!comm.hasSplits || comm.members.empty()) return splits;  // spares a scan of their calls
  // A split is judged only where every member's window holds it, so the first member's window
  // names every ordinal worth a look: scanning each member's (it was, each pass) cost 8% of the
  // collector's triage thread at 2048 ranks, for ordinals the others' windows had long dropped.
  const Member& first = comm.members.front();
  for (uint32_t idx = 0; idx < first.coll.size(); ++idx) {
    uint32_t fi = first.coll[idx];
    if (fi == kNone || procs_[first.proc].rec(fi).op != OpKind::kSplit) continue;
    SplitColours split;
    split.ordinal = first.base + idx;
    split.seq = procs_[first.proc].rec(fi).seq;
    bool all = true;
    for (const Member& m : comm.members) {
      uint32_t i = m.at(split.ordinal);
      if (i == kNone || procs_[m.proc].rec(i).op != OpKind::kSplit) {
        all = false;
        break;
      }
      int colour = procs_[m.proc].rec(i).rootOrPeer;
      if (colour >= 0) split.colourOf[m.commRank] = colour;
    }
    if (all) splits.push_back(std::move(split));
  }
  return splits;
}

void JobAnalysis::addColourClasses(const Comm& comm, const SplitColours& split, Verdict& v) const {
  std::map<int, std::vector<int>> commRanksOf;  // colour -> its members, ascending comm ranks
  for (const auto& [commRank, colour] : split.colourOf) commRanksOf[colour].push_back(commRank);
  for (const auto& [colour, commRanks] : commRanksOf) {
    RankClass rc;
    for (int commRank : commRanks) rc.ranks.push_back(globalRank(comm, commRank));
    const Member& m = comm.members[comm.byCommRank.find(commRanks.front())];
    rc.call = describe(procs_[m.proc], m.at(split.ordinal));
    v.classes.push_back(std::move(rc));
  }
}

void JobAnalysis::checkColours(Comm& comm, const std::vector<SplitColours>& splits) {
  for (const SplitColours& split : splits) {
    const uint64_t k = split.ordinal;
    const std::map<int, int>& colourOf = split.colourOf;  // comm rank -> colour
    if (colourOf.size() < 3) continue;
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
    Verdict v = make(VerdictKind::kMismatch, &comm, split.seq);
    v.fields = {"color"};
    // Ranks in the wrong child combine the wrong ranks' data (or hang later, which the job's
    // own state says): nothing hangs at the split itself.
    v.effect = Effect::kSilentDataCorruption;
    addColourClasses(comm, split, v);
    nameCulpritsAt(comm, best, k, v);
    std::string sizesText;
    for (const RankClass& rc : v.classes) {
      sizesText += (sizesText.empty() ? "" : ", ") + std::to_string(rc.ranks.size());
    }
    std::string who = namedRanks(v.culprits);
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

std::string JobAnalysis::pythonApiAt(const Proc& proc, uint32_t index) const {
  uint64_t site = proc.rec(index).callSite;
  if (!trace::isPythonSite(site)) return {};
  uint32_t number = trace::pythonSiteNumber(site);
  for (const trace::PythonSite& known : proc.file->pythonSites) {
    if (known.number == number) return trace::pythonApiOf(known);
  }
  return {};  // the site's frames have not arrived (live) or were not kept
}

// PyTorch's new_group() makes one group per call on every rank of the parent: its members pass
// one split colour (derived from the rank list), the others NCCL_SPLIT_NOCOLOR. Two colours at
// one such split mean the ranks disagree on the group being made: they create their groups in
// another order, or from other rank lists. Each colour then gets a communicator of its own, and
// the collectives on it combine the wrong ranks, or none, without an error (exp24's grouporder:
// rank 3 made its data-parallel groups before its tensor-parallel ones; no verdict before). Only
// new_group(): split_group(), a device mesh or plain NCCL make several groups in one split.
bool JobAnalysis::checkGroupSplits(Comm& comm, const std::vector<SplitColours>& splits) {
  struct Disagreement {
    const SplitColours* split = nullptr;
    std::map<int, std::vector<int>> commRanksByColour;
  };
  std::vector<Disagreement> found;
  for (const SplitColours& split : splits) {
    Disagreement d{&split, {}};
    for (const auto& [commRank, colour] : split.colourOf) {
      d.commRanksByColour[colour].push_back(commRank);
    }
    if (d.commRanksByColour.size() < 2) continue;
    bool byNewGroup = true;
    for (const auto& [commRank, colour] : split.colourOf) {
      const Member& m = comm.members[comm.byCommRank.find(commRank)];
      byNewGroup &= pythonApiAt(procs_[m.proc], m.at(split.ordinal)) == "new_group";
    }
    if (byNewGroup) found.push_back(std::move(d));
  }
  if (found.empty()) return false;

  // Suspects of one split: the ranks outside its one largest colour, or every coloured rank
  // when no colour is the largest alone. The culprits: the suspects of every such split (rank 3
  // in each of grouporder's two), else the first split's.
  auto suspectsOf = [](const Disagreement& d) {
    size_t largest = 0, ties = 0;
    for (const auto& [colour, ranks] : d.commRanksByColour) {
      if (ranks.size() > largest) {
        largest = ranks.size();
        ties = 1;
      } else if (ranks.size() == largest) {
        ++ties;
      }
    }
    std::vector<int> suspects;
    for (const auto& [colour, ranks] : d.commRanksByColour) {
      if (ties > 1 || ranks.size() < largest)
        suspects.insert(suspects.end(), ranks.begin(), ranks.end());
    }
    std::sort(suspects.begin(), suspects.end());
    return suspects;
  };
  std::vector<int> culprits = suspectsOf(found.front());
  for (size_t i = 1; i < found.size(); ++i) {
    std::vector<int> next = suspectsOf(found[i]), both;
    std::set_intersection(culprits.begin(), culprits.end(), next.begin(), next.end(),
                          std::back_inserter(both));
    if (!both.empty()) culprits = std::move(both);
  }

  const SplitColours& first = *found.front().split;
  Verdict v = make(VerdictKind::kMismatch, &comm, first.seq);
  v.fields = {"color"};
  v.effect = Effect::kSilentDataCorruption;
  addColourClasses(comm, first, v);
  std::string sizes, colours;
  for (RankClass& rc : v.classes) {
    std::sort(rc.ranks.begin(), rc.ranks.end());
    colours += (colours.empty() ? "" : ", ") + namedRanks(rc.ranks) + " colour " +
               std::to_string(rc.call.rootOrPeer);
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(rc.ranks.size());
  }
  nameCulpritsAt(comm, culprits, first.ordinal, v);
  std::sort(v.culprits.begin(), v.culprits.end());
  std::string calls;
  for (const Disagreement& each : found) {
    calls += (calls.empty() ? "#" : ", #") + std::to_string(each.split->seq);
  }
  std::string who = namedRanks(v.culprits);
  v.explanation =
      "the ranks disagree on the group that one new_group() call makes (" + colours +
      "): new_group() makes one group, whose members all pass the same colour, so each colour "
      "made a communicator of its own (sizes " +
      sizes + ") and the collectives on them combine the wrong ranks; " + who +
      (found.size() > 1 ? " disagrees at every such call (" + calls + ")" : " differs") +
      ": check the order in which " + who + " creates its groups and the rank lists it passes";
  verdicts_.push_back(std::move(v));
  return true;
}

}  // namespace ncclwatch::analysis::internal
