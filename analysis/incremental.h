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
// When the cross-communicator checks may fire (the job quiet, a process gone, a failed call, a
// process without a communicator) but the kept state still holds (the same processes and
// memberships, no shrink, no kept verdict about ranks on other communicators), the pass is still
// partial: it aligns the touched communicators and those not "done" by the progress kept on
// arrival (comm_progress.h: some member pending, or members at different issued counts or last
// ordinals), and runs the hang families over them. The hang families read the alignment of
// pending calls' communicators and of members behind others only; a done communicator has
// neither, so they find what a full pass finds (job_state.h, JobAnalysis::chooseRedo).
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
#include "trace/ring_reader.h"

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

  // What changed in the window of the file at index `file` of the span the passes read (the
  // live collector says so per record): the per-communicator progress (comm_progress.h) follows
  // it at once instead of a scan of the window per pass. `appended`: window.records.back() was
  // added at its end; `replaced`: a record was replaced in place by a newer copy (before ->
  // after); `trimming`: the first `count` records of `window` are about to leave it (the caller
  // erases them right after, before anything else reads the progress); `reshaped`: anything else
  // (one was inserted in the middle). A changed communicator table is seen by the pass itself. A
  // file the caller never reports is rescanned at each pass.
  void appended(size_t file, const trace::TraceFile& window);
  void replaced(size_t file, const trace::TraceFile& window, const trace::CallRecord& before,
                const trace::CallRecord& after);
  // (Stats::progressTrims and progressTrimRebuilds count the two ways a trim went.)
  void trimming(size_t file, const trace::TraceFile& window, size_t count);
  void reshaped(size_t file, const trace::TraceFile& window);

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
    // Partial passes that ran the hang families (over the touched communicators and those not
    // done), by why they had to run: "quiet", "gone", "failed", "no_comm".
    uint64_t hangPasses = 0;
    std::map<std::string, uint64_t> hangBecause;
    // Per-process progress the caller reports changes of, rebuilt by a pass because it no longer
    // followed its file's window (a communicator table that changed, a change not reported).
    uint64_t progressRebuilds = 0;
    // Trims (`trimming`) whose records left the progress without a rebuild, and those that
    // rebuilt it from the records left (comm_progress.h, droppingFront).
    uint64_t progressTrims = 0;
    uint64_t progressTrimRebuilds = 0;
    // Aligned members whose kept progress differed from what their alignment says: a bug (the
    // tests assert none).
    uint64_t progressDisagreements = 0;
    // Aligned members that took their calls from their kept progress (Options::keptAlignment),
    // and those aligned from their window's records.
    uint64_t membersFromKept = 0;
    uint64_t membersFromRecords = 0;
    // Why passes were full, by reason: "first" (nothing kept, or touchAll), "changed" (processes,
    // liveness or communicator tables), "shrink", "absent" (a kept mismatch describes absent
    // members elsewhere).
    std::map<std::string, uint64_t> fullBecause;
  };
  const Stats& stats() const;

 private:
  std::unique_ptr<internal::IncrementalState> state_;
};

}  // namespace ncclwatch::analysis
