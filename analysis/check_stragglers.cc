// Stragglers: a rank that arrives last at collectives again and again (information).
#include "analysis/job_state.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"
#include "analysis/parallel.h"

namespace ncclwatch::analysis::internal {

// One communicator's collectives that every member joined, and who arrived last in each.
StragglerTally JobAnalysis::tallyStragglers(const Comm& comm) const {
  StragglerTally tally;
  if (comm.members.size() < 3) return tally;
  uint64_t lo = 0, hi = UINT64_MAX;
  for (const Member& m : comm.members) {
    if (m.coll.empty()) return tally;
    lo = std::max(lo, m.base);
    hi = std::min(hi, m.lastOrdinal());
  }
  if (lo > hi) return tally;
  // The latest and second latest arrival at each ordinal, member by member (each one's window
  // read in order: one record of every member per ordinal missed the cache on nearly every
  // record at 4096 members). An ordinal some member lacks, or where it made no collective, is
  // not one every member joined.
  struct Arrivals {
    int64_t first = INT64_MIN;
    int64_t second = INT64_MIN;
    const Member* who = nullptr;
    bool ok = true;
  };
  // Members split over Options::threads, each chunk with its own arrivals; merged in chunk
  // order, which keeps the first member to arrive latest (ties) as one thread does.
  std::vector<std::vector<Arrivals>> chunks(chunkCount(comm.members.size(), options_.threads));
  parallelChunks(comm.members.size(), options_.threads,
                 [&](size_t chunk, size_t begin, size_t end) {
                   std::vector<Arrivals>& arrivals = chunks[chunk];
                   arrivals.assign(hi - lo + 1, Arrivals{});
                   for (size_t mi = begin; mi < end; ++mi) {
                     const Member& m = comm.members[mi];
                     // Read once a member: the stores into `arrivals` below would otherwise
                     // make the compiler reload them at every ordinal.
                     const Proc& proc = procs_[m.proc];
                     const trace::RecordRange records = proc.records;
                     for (uint64_t k = lo; k <= hi; ++k) {
                       Arrivals& a = arrivals[k - lo];
                       if (!a.ok) continue;
                       uint32_t i = m.at(k);
                       const CallRecord* r = i == kNone ? nullptr : &records[i];
                       if (r == nullptr || !trace::isCollective(r->op)) {
                         a.ok = false;
                         continue;
                       }
                       int64_t t = proc.wall(r->issueNs);
                       if (t > a.first) {
                         a.second = a.first;
                         a.first = t;
                         a.who = &m;
                       } else if (t > a.second) {
                         a.second = t;
                       }
                     }
                   }
                 });
  std::vector<Arrivals>& arrivals = chunks[0];
  for (size_t chunk = 1; chunk < chunks.size(); ++chunk) {
    for (size_t k = 0; k < arrivals.size(); ++k) {
      Arrivals& a = arrivals[k];
      const Arrivals& b = chunks[chunk][k];
      if (!b.ok) a.ok = false;
      if (!a.ok) continue;
      if (b.first > a.first) {
        a.second = std::max(a.first, b.second);
        a.first = b.first;
        a.who = b.who;
      } else {
        a.second = std::max(a.second, b.first);
      }
    }
  }
  std::unordered_map<int, size_t> lateAt;  // proc -> index in tally.late
  for (uint64_t k = lo; k <= hi; ++k) {
    const Arrivals& a = arrivals[k - lo];
    if (!a.ok) continue;
    int64_t first = a.first, second = a.second;
    const Member* who = a.who;
    ++tally.joinedEach;
    if (first - second < options_.stragglerLagNs) continue;
    auto [at, added] = lateAt.try_emplace(who->proc, tally.late.size());
    if (added) tally.late.push_back({who->proc, 0, {}, 0, 0});
    StragglerTally::Late& late = tally.late[at->second];
    ++late.count;
    if (late.first == 0 || first < late.first) late.first = first;
    late.lags.push_back(first - second);
    late.lastSeq = procs_[who->proc].rec(who->at(k)).seq;
  }
  return tally;
}

// Tallied per communicator (a partial pass keeps the tallies of the ones it does not redo), then
// summed over the communicators in order: the last one where a rank was late names its verdict.
void JobAnalysis::checkStragglers() {
  int n = static_cast<int>(procs_.size());
  std::vector<int> joined(n, 0), last(n, 0);
  std::vector<std::vector<int64_t>> lags(n);
  std::vector<const Comm*> lastComm(n, nullptr);
  std::vector<uint64_t> lastSeq(n, 0);
  std::vector<int64_t> firstLate(n, 0);
  for (const Comm& comm : comms_) {
    StragglerTally fresh;
    const StragglerTally* tally = &fresh;
    if (redo(comm) && partial_ && talliesDeferred_ != nullptr) {
      tally = &cache_->comms[comm.hash].tally;  // the last pass's (empty for a new comm)
      talliesDeferred_->push_back(comm.hash);
    } else if (redo(comm)) {
      fresh = tallyStragglers(comm);
      if (cache_ != nullptr) cache_->comms[comm.hash].tally = fresh;
    } else {
      tally = &cache_->comms[comm.hash].tally;
    }
    if (tally->joinedEach > 0) {
      for (const Member& m : comm.members) joined[m.proc] += tally->joinedEach;
    }
    for (const StragglerTally::Late& late : tally->late) {
      int who = late.proc;
      last[who] += late.count;
      if (firstLate[who] == 0 || late.first < firstLate[who]) firstLate[who] = late.first;
      lags[who].insert(lags[who].end(), late.lags.begin(), late.lags.end());
      lastComm[who] = &comm;
      lastSeq[who] = late.lastSeq;
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

}  // namespace ncclwatch::analysis::internal
