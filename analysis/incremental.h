// Incremental analysis for the live collector: the same analysis as analysis::analyze, over the
// same files, redoing per pass only the communicators whose records changed since the last one.
// The caller says what changed (`touch` per communicator, `touchAll` for anything else); the
// verdicts of untouched communicators carry over from their last pass.
//
// A pass is partial (only touched communicators re-aligned and re-checked) when nothing the
// cross-communicator checks look at can fire: every process alive, none with a failed call, the
// job not quiet, no shrunk communicator, no kept verdict that describes ranks on other
// communicators, and the same processes and memberships as the last pass. Then the hang families
// (dead and missing ranks, the wait-for graph, init hangs, errors) say nothing in a full pass
// either, and the structural checks (mismatches, split colours, p2p pairing) and the straggler
// tallies are per communicator. Otherwise the pass is a full one, which refills the kept state
// (a partial pass that meets a mismatch with absent members, whose classes say where those are
// on their other communicators, aligns the rest and becomes a full one midway).
// Either way the verdicts equal those of analysis::analyze on the same files (but for a kept
// verdict's detection time, which stays that of the pass that found it).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "analysis/analyze.h"

namespace ncclwatch::analysis {

namespace internal {
struct IncrementalState;
}

class IncrementalAnalysis {
 public:
  IncrementalAnalysis();
  ~IncrementalAnalysis();
  IncrementalAnalysis(const IncrementalAnalysis&) = delete;
  IncrementalAnalysis& operator=(const IncrementalAnalysis&) = delete;

  // Records on `commHash` arrived, changed or left the window since the last pass.
  void touch(uint64_t commHash);
  // Something else changed (a communicator table, a process joining or ending): the next pass
  // is a full one. (A pass also sees changed processes and tables by itself.)
  void touchAll();

  Report analyze(std::span<const trace::TraceFile> files, const Options& options = {});
  // A pass that redoes only the touched communicators among `first` (a divergence the live
  // triage saw there), when a partial pass is allowed; the other touched ones stay touched, and
  // their verdicts and summaries in this report are those of their last pass. When a partial
  // pass is not allowed, a full one.
  Report analyzeFirst(std::span<const trace::TraceFile> files, const Options& options,
                      const std::set<uint64_t>& first);

  struct Stats {
    uint64_t fullPasses = 0;
    uint64_t partialPasses = 0;
    uint64_t commsReanalysed = 0;  // in partial passes
    uint64_t commsCarried = 0;     // in partial passes: verdicts and summaries kept
    // Why passes were full, by reason: "first" (nothing kept, or touchAll), "changed" (processes,
    // liveness or communicator tables), "gone" (a process not alive), "no_comm" (a process
    // without a communicator), "shrink", "quiet", "failed" (a failed call), "absent" (a kept
    // mismatch describes absent members elsewhere).
    std::map<std::string, uint64_t> fullBecause;
  };
  const Stats& stats() const;

 private:
  std::unique_ptr<internal::IncrementalState> state_;
};

}  // namespace ncclwatch::analysis
