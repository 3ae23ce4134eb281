#include "analysis/in_nccl.h"

#include <algorithm>
#include <set>

namespace ncclwatch::analysis {
namespace {

std::set<int> ranksOf(const Verdict& verdict) {
  std::set<int> ranks(verdict.culprits.begin(), verdict.culprits.end());
  for (const RankClass& rankClass : verdict.classes) {
    ranks.insert(rankClass.ranks.begin(), rankClass.ranks.end());
  }
  return ranks;
}

}  // namespace

std::vector<std::string> inNcclLines(const Verdict& verdict,
                                     std::span<const trace::TraceFile* const> files) {
  std::vector<std::string> lines;
  for (int rank : ranksOf(verdict)) {
    const trace::WaitNote* oldest = nullptr;
    for (const trace::TraceFile* file : files) {
      if (file->header.rank != rank) continue;
      for (const trace::WaitNote& note : file->waits) {
        if (note.commHash != verdict.comm.hash) continue;
        // The wait that says most (a cause rather than a consequence), the oldest call among
        // equals.
        int weight = trace::proxyWaitWeight(note.stepState);
        int best = oldest == nullptr ? -1 : trace::proxyWaitWeight(oldest->stepState);
        if (oldest == nullptr || weight > best || (weight == best && note.seq < oldest->seq)) {
          oldest = &note;
        }
      }
    }
    if (oldest == nullptr) continue;
    lines.push_back("rank " + std::to_string(rank) + " #" + std::to_string(oldest->seq) + ": " +
                    trace::describeWait(*oldest, oldest->updatedNs));
  }
  return lines;
}

void annotateInNccl(Report& report, std::span<const trace::TraceFile> files) {
  for (JobReport& job : report.jobs) {
    // The newest process of each rank in this job: the one the verdicts speak of.
    std::vector<const trace::TraceFile*> mine;
    for (const trace::TraceFile& file : files) {
      if (file.usable && trace::jobIdOf(file.header) == job.jobId && !file.waits.empty())
        mine.push_back(&file);
    }
    if (mine.empty()) continue;
    std::stable_sort(mine.begin(), mine.end(), [](auto* a, auto* b) {
      return a->header.anchorRealtimeNs > b->header.anchorRealtimeNs;
    });
    for (Verdict& verdict : job.verdicts) verdict.inNccl = inNcclLines(verdict, mine);
  }
}

}  // namespace ncclwatch::analysis
