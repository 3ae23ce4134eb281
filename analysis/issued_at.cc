#include "analysis/issued_at.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ncclwatch::analysis {
namespace {

// The newest trace of `rank` within the job, or null.
const trace::TraceFile* newestOf(std::span<const trace::TraceFile> files, const std::string& job,
                                 int rank) {
  const trace::TraceFile* newest = nullptr;
  for (const trace::TraceFile& file : files) {
    if (!file.usable || file.header.rank != rank || trace::jobIdOf(file.header) != job) continue;
    if (newest == nullptr || file.header.anchorRealtimeNs > newest->header.anchorRealtimeNs) {
      newest = &file;
    }
  }
  return newest;
}

// The site `number` in the newest trace of `rank` within the job, or null.
const trace::PythonSite* siteOf(std::span<const trace::TraceFile> files, const std::string& job,
                                int rank, uint32_t number) {
  const trace::TraceFile* newest = newestOf(files, job, rank);
  if (newest == nullptr) return nullptr;
  for (const trace::PythonSite& site : newest->pythonSites) {
    if (site.number == number) return &site;
  }
  return nullptr;
}

std::string baseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

void annotateIssuedAt(Report& report, std::span<const trace::TraceFile> files) {
  for (JobReport& job : report.jobs) {
    for (Verdict& verdict : job.verdicts) {
      for (RankClass& rankClass : verdict.classes) {
        CallDesc& call = rankClass.call;
        if (call.callSite == 0 || rankClass.ranks.empty()) continue;
        // The rank the call's record came from first: its site means something there only.
        std::vector<int> ranks = rankClass.ranks;
        if (call.callRank >= 0) ranks.insert(ranks.begin(), call.callRank);
        if (!trace::isPythonSite(call.callSite)) {
          std::string module;
          uint64_t offset = 0;
          const trace::TraceFile* file =
              traceDescribing(files, job.jobId, ranks, call.callSite, &module, &offset);
          if (file != nullptr) {
            char text[32];
            std::snprintf(text, sizeof text, "+0x%" PRIx64, offset);
            // In a Python process, say why there is no line (a C++ thread of the framework).
            bool python = std::any_of(file->pythonSites.begin(), file->pythonSites.end(),
                                      [](const trace::PythonSite& site) {
                                        return site.number != trace::kNativeSiteNumber;
                                      });
            call.issuedAt =
                baseName(module) + text + (python ? " (no Python frame on its thread)" : "");
          }
          continue;
        }
        const trace::PythonSite* site =
            siteOf(files, job.jobId, ranks.front(), trace::pythonSiteNumber(call.callSite));
        if (site != nullptr) call.issuedAt = trace::issuedAtText(*site);
      }
    }
  }
}

const trace::TraceFile* traceDescribing(std::span<const trace::TraceFile> files,
                                        const std::string& job, const std::vector<int>& ranks,
                                        uint64_t callSite, std::string* module, uint64_t* offset) {
  constexpr size_t kRanksSearched = 64;
  for (size_t i = 0; i < ranks.size() && i < kRanksSearched; ++i) {
    const trace::TraceFile* file = newestOf(files, job, ranks[i]);
    if (file != nullptr && nativeSiteOf(*file, callSite, module, offset)) return file;
  }
  return nullptr;
}

bool nativeSiteOf(const trace::TraceFile& file, uint64_t callSite, std::string* module,
                  uint64_t* offset) {
  for (const trace::PythonSite& site : file.pythonSites) {
    if (site.number != trace::kNativeSiteNumber || site.nativeSite != callSite ||
        site.frames.empty()) {
      continue;
    }
    const std::string& text = site.frames.front();
    size_t plus = text.rfind("+0x");
    if (plus == std::string::npos || plus == 0) return false;
    char* end = nullptr;
    *offset = std::strtoull(text.c_str() + plus + 3, &end, 16);
    if (end == text.c_str() + plus + 3 || *end != '\0') return false;
    *module = text.substr(0, plus);
    return true;
  }
  return false;
}

}  // namespace ncclwatch::analysis
