// Errors: NCCL calls that failed on some rank, which never recovered on that communicator.
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

namespace ncclwatch::analysis::internal {
namespace {

// NCCL's message for a failed record, when its process wrote one for that very call (the
// header keeps the newest failure's).
std::string ncclMessageFor(const Proc& proc, const CallRecord& record) {
  const trace::TraceFile& file = *proc.file;
  if (file.lastNcclError.empty() || file.lastNcclErrorIndex != record.ringIndex) return {};
  return file.lastNcclError;
}

}  // namespace

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
    if (!procs_[p].failed) continue;  // no failed call at all (analyzeJobs' scan): nothing here
    const auto& records = procs_[p].file->records;
    std::unordered_map<uint64_t, uint32_t> failed;  // comm -> first unrecovered failure
    for (uint32_t i = 0; i < records.size(); ++i) {
      const CallRecord& r = records[i];
      if (r.commHash == 0) continue;
      if (isFailed(r)) {
        failed.try_emplace(r.commHash, i);
      } else if (r.state == RecordState::kCompleted && !isTeardown(r.op) && r.op != OpKind::kInit) {
        // A later call on it worked: the rank went on. Most ranks never fail: skip the lookup.
        if (!failed.empty()) failed.erase(r.commHash);
      }
    }
    for (auto [hash, index] : failed) byComm[hash].push_back({p, index});
  }
  for (auto& [failedHash, failures] : byComm) {
    const uint64_t hash = failedHash;  // a plain local: lambdas below capture it (clang 14)
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
        if (std::string said = ncclMessageFor(proc, r); !said.empty()) {
          rc.call.note += ": NCCL said \"" + said + "\"";
        }
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
    std::string who = namedRanks(v.culprits);
    std::string call = first.op == OpKind::kInit
                           ? std::string("ncclCommInit* of comm ") + shortHash(hash) + " (" +
                                 std::to_string(first.count) + " ranks)"
                           : callText(describeCall(first)) + " #" + std::to_string(first.seq);
    // The first failing rank's fate; "it", or "the first" of several.
    const char* subject = v.culprits.size() == 1 ? "it" : "the first";
    std::string after = !firstProc.alive ? std::string(", and ") + subject + " then exited"
                        : now_ - firstProc.lastActivity >= options_.quietNs
                            ? std::string(", and ") + subject + " then stopped calling NCCL"
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
            : "; " + namedRanks(waiting) +
                  (first.op == OpKind::kInit ? " never finished creating that communicator"
                   : waiting.size() == 1     ? " waits for its part there"
                                             : " wait for its part there");
    const std::string said = ncclMessageFor(firstProc, first);
    v.explanation = who + "'s " + call + " returned " + ncclResultName(first.result) + " (" +
                    ncclResultText(first.result) + ")" +
                    (said.empty() ? "" : ": NCCL said \"" + said + "\"") + after + othersText +
                    "." + stale + " NCCL tells no other rank: " +
                    (said.empty() ? "see " + who + "'s log for NCCL's message, fix" : "fix") +
                    " the call, and on an error abort the communicator on every rank "
                    "(ncclCommAbort) so that none waits for ever";
    verdicts_.push_back(std::move(v));
  }
}

}  // namespace ncclwatch::analysis::internal
