// IncrementalAnalysis: analysis::analyze's own code (analyzeJobs) with the kept state of the
// passes before. The rules of a partial pass are in analyze.cc (JobAnalysis::run).
#include "analysis/incremental.h"

#include "analysis/job_state.h"

namespace ncclwatch::analysis {

IncrementalAnalysis::IncrementalAnalysis()
    : state_(std::make_unique<internal::IncrementalState>()) {}
IncrementalAnalysis::~IncrementalAnalysis() = default;

void IncrementalAnalysis::touch(uint64_t commHash) {
  uint64_t& recent = state_->recentlyDirty[trace::mix64(commHash) % state_->recentlyDirty.size()];
  if (recent == commHash && commHash != 0) return;
  recent = commHash;
  state_->dirty.insert(commHash);
}
void IncrementalAnalysis::touchAll() {
  state_->all = true;
}

namespace {
ProcessProgress& progressOf(internal::IncrementalState& state, size_t file) {
  if (state.progress.size() <= file) {
    state.progress.resize(file + 1);
    state.fed.resize(file + 1, 0);
  }
  state.fed[file] = 1;
  return state.progress[file];
}
}  // namespace

void IncrementalAnalysis::appended(size_t file, const trace::TraceFile& window) {
  progressOf(*state_, file).appended(window);
}
void IncrementalAnalysis::replaced(size_t file, const trace::TraceFile& window,
                                   const trace::CallRecord& before,
                                   const trace::CallRecord& after) {
  progressOf(*state_, file).replaced(window, before, after);
}
void IncrementalAnalysis::trimming(size_t file, const trace::TraceFile& window, size_t count) {
  bool dropped = progressOf(*state_, file).droppingFront(window, count);
  ++(dropped ? state_->stats.progressTrims : state_->stats.progressTrimRebuilds);
}
void IncrementalAnalysis::reshaped(size_t file, const trace::TraceFile& window) {
  progressOf(*state_, file).rebuild(window);
}

const IncrementalAnalysis::Stats& IncrementalAnalysis::stats() const {
  return state_->stats;
}

Report IncrementalAnalysis::analyze(std::span<const trace::TraceFile> files,
                                    const Options& options) {
  Report report = internal::analyzeJobs(files, options, state_.get());
  state_->dirty.clear();
  state_->recentlyDirty.fill(0);
  state_->all = false;
  return report;
}

Report IncrementalAnalysis::analyzeFirst(std::span<const trace::TraceFile> files,
                                         const Options& options, const std::set<uint64_t>& first) {
  if (state_->all) return analyze(files, options);
  std::unordered_set<uint64_t> later;
  for (uint64_t hash : state_->dirty) {
    if (!first.count(hash)) later.insert(hash);
  }
  for (uint64_t hash : later) state_->dirty.erase(hash);
  state_->recentlyDirty.fill(0);
  state_->divergencePass = true;
  state_->talliesDeferred.clear();
  Report report = internal::analyzeJobs(files, options, state_.get());
  state_->divergencePass = false;
  // The others are left for the next pass (after a full pass, redoing them is merely redundant),
  // and so are the straggler tallies this pass kept (JobAnalysis::deferStragglerTallies).
  later.insert(state_->talliesDeferred.begin(), state_->talliesDeferred.end());
  state_->dirty = std::move(later);
  state_->all = false;
  return report;
}

}  // namespace ncclwatch::analysis
