// Init and split hangs: processes that never finished creating a communicator others created.
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
  if (!none.empty() && hung && root == nullptr && checkRootInitWait(none)) return;
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
    std::string who = namedRanks(v.culprits);
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

// Processes held inside a root init (their Init record pending: recorded before NCCL runs, since
// session 22) wait for the comm ranks that never joined it: those are the cause. Named by what
// their traces show: none (it never called NCCL), the init of another unique id, or elsewhere.
// False when no such wait is recorded (traces of before session 22, or inits not pending).
bool JobAnalysis::checkRootInitWait(const std::vector<int>& none) {
  struct Waited {
    int nranks = 0;
    std::vector<int> waiting;           // procs with the init pending
    std::map<int, int> commRankOfProc;  // every proc with an Init record on it
    uint32_t anyIndex = 0;              // a waiting proc's record, for the call's description
    int anyProc = -1;
    int64_t lastArrival = 0;  // the latest issue (wall) of a pending Init on it
  };
  std::map<uint64_t, Waited> byHash;
  std::map<int, uint64_t> pendingHashOf;  // proc -> the root init it waits in
  for (int p = 0; p < static_cast<int>(procs_.size()); ++p) {
    const Proc& proc = procs_[p];
    for (uint32_t i = 0; i < proc.records.size(); ++i) {
      const CallRecord& r = proc.rec(i);
      if (r.op != OpKind::kInit || r.commHash == 0 || r.count == 0) continue;
      Waited& w = byHash[r.commHash];
      w.nranks = static_cast<int>(r.count);
      w.commRankOfProc[p] = r.rootOrPeer;
      if (isPending(r) && std::find(none.begin(), none.end(), p) != none.end()) {
        w.waiting.push_back(p);
        pendingHashOf[p] = r.commHash;
        w.anyIndex = i;
        w.anyProc = p;
        w.lastArrival = std::max(w.lastArrival, proc.wall(r.issueNs));
      }
    }
  }
  auto most = byHash.end();
  for (auto it = byHash.begin(); it != byHash.end(); ++it) {
    if (!it->second.waiting.empty() &&
        (most == byHash.end() || it->second.waiting.size() > most->second.waiting.size())) {
      most = it;
    }
  }
  if (most == byHash.end()) return false;
  const uint64_t hash = most->first;
  Waited& w = most->second;
  if (!ended_ && now_ - w.lastArrival < options_.initPatienceNs) return true;  // not yet
  std::set<int> joined;
  bool identity = true;  // every joined process's comm rank is its job rank
  for (auto& [p, commRank] : w.commRankOfProc) {
    joined.insert(commRank);
    identity &= commRank == procs_[p].rank;
  }
  std::vector<int> missing;
  for (int r = 0; r < w.nranks; ++r) {
    if (joined.count(r) == 0) missing.push_back(r);
  }
  if (missing.empty()) return false;  // everyone is inside: a hang in NCCL's init itself
  Verdict v = make(VerdictKind::kInitHang, nullptr, 0);
  v.comm.hash = hash;
  v.comm.size = w.nranks;
  RankClass waiting;
  for (int p : w.waiting) waiting.ranks.push_back(procs_[p].rank);
  std::sort(waiting.ranks.begin(), waiting.ranks.end());
  waiting.call = describe(procs_[w.anyProc], w.anyIndex);
  waiting.call.note = "waits in the init for " +
                      std::string(missing.size() == 1 ? "comm rank " : "comm ranks ") +
                      formatRanks(missing);
  v.classes.push_back(std::move(waiting));
  std::string why;
  if (identity) {
    // Comm ranks are job ranks: say what each absent rank's trace shows.
    std::vector<int> untraced, elsewhere, otherInit;
    for (int r : missing) {
      const Proc* proc = procOfRank(r);
      if (proc == nullptr) {
        untraced.push_back(r);
      } else if (pendingHashOf.count(static_cast<int>(proc - procs_.data())) != 0) {
        otherInit.push_back(r);
      } else {
        elsewhere.push_back(r);
      }
    }
    auto addClass = [&](const std::vector<int>& ranks, const std::string& note) {
      if (ranks.empty()) return;
      RankClass absent;
      absent.ranks = ranks;
      absent.call.op = OpKind::kInit;
      absent.call.note = note;
      v.classes.push_back(std::move(absent));
    };
    addClass(untraced, "no trace: never called NCCL (or ran without ncclwatch)");
    addClass(otherInit, "waits in the init of another communicator (another unique id)");
    addClass(elsewhere, "never called this init (its stack says where it is)");
    v.culprits = missing;
    const bool one = missing.size() == 1;
    why = !untraced.empty()
              ? (untraced.size() == missing.size() ? std::string(one ? "it has" : "they have")
                                                   : "ranks " + formatRanks(untraced) + " have") +
                    " no trace, so never called NCCL: held before the init (a download, a data "
                    "loader, a lock: the rank's own log or stack says where), or run without "
                    "ncclwatch"
          : !otherInit.empty()
              ? std::string(one ? "it waits" : "they wait") +
                    " in the init of another communicator: the unique id did not reach every "
                    "rank alike (check how the id is shared: a store key, a file, MPI)"
              : std::string(one ? "it never called" : "they never called") +
                    " this init: the stack says where";
    why = namedRanks(missing) + ", which never joined: " + why;
  } else {
    why = std::string(missing.size() == 1 ? "comm rank " : "comm ranks ") + formatRanks(missing) +
          ", which never joined (the joined processes' comm ranks are not their job ranks, so "
          "which job ranks those are is not known)";
  }
  const std::vector<int>& held = v.classes.front().ranks;
  v.explanation = namedRanks(held) + (held.size() == 1 ? " waits" : " wait") +
                  " in the init of a " + std::to_string(w.nranks) + "-rank communicator for " + why;
  restsOnTiming(v);
  verdicts_.push_back(std::move(v));
  return true;
}

}  // namespace ncclwatch::analysis::internal
