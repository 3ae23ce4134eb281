#include "analysis/issued_at.h"

namespace ncclwatch::analysis {
namespace {

// The site `number` in the newest trace of `rank` within the job, or null.
const trace::PythonSite* siteOf(std::span<const trace::TraceFile> files, const std::string& job,
                                int rank, uint32_t number) {
  const trace::TraceFile* newest = nullptr;
  for (const trace::TraceFile& file : files) {
    if (!file.usable || file.header.rank != rank || trace::jobIdOf(file.header) != job) continue;
    if (newest == nullptr || file.header.anchorRealtimeNs > newest->header.anchorRealtimeNs) {
      newest = &file;
    }
  }
  if (newest == nullptr) return nullptr;
  for (const trace::PythonSite& site : newest->pythonSites) {
    if (site.number == number) return &site;
  }
  return nullptr;
}

}  // namespace

void annotateIssuedAt(Report& report, std::span<const trace::TraceFile> files) {
  for (JobReport& job : report.jobs) {
    for (Verdict& verdict : job.verdicts) {
      for (RankClass& rankClass : verdict.classes) {
        CallDesc& call = rankClass.call;
        if (!trace::isPythonSite(call.callSite) || rankClass.ranks.empty()) continue;
        const trace::PythonSite* site = siteOf(files, job.jobId, rankClass.ranks.front(),
                                               trace::pythonSiteNumber(call.callSite));
        if (site != nullptr) call.issuedAt = trace::issuedAtText(*site);
      }
    }
  }
}

}  // namespace ncclwatch::analysis
