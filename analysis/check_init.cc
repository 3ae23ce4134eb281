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

}  // namespace ncclwatch::analysis::internal
