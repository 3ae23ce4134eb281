#include "analysis/issued_at.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "analysis/describe.h"

namespace ncclwatch::analysis {

NewestTraces newestTraces(std::span<const trace::TraceFile> files, const std::string& job) {
  NewestTraces newest;
  for (const trace::TraceFile& file : files) {
    if (!file.usable || trace::jobIdOf(file.header) != job) continue;
    const trace::TraceFile*& kept = newest[file.header.rank];
    if (kept == nullptr || file.header.anchorRealtimeNs > kept->header.anchorRealtimeNs) {
      kept = &file;
    }
  }
  return newest;
}

void annotateIssuedAt(Report& report, std::span<const trace::TraceFile> files) {
  for (JobReport& job : report.jobs) {
    NewestTraces newest;  // built once a class of this job needs it
    for (Verdict& verdict : job.verdicts) {
      for (RankClass& rankClass : verdict.classes) {
        CallDesc& call = rankClass.call;
        if (call.callSite == 0 || rankClass.ranks.empty()) continue;
        if (newest.empty()) newest = newestTraces(files, job.jobId);
        std::vector<int> ranks = siteRanks(rankClass);
        if (!trace::isPythonSite(call.callSite)) {
          std::string module, thread;
          uint64_t offset = 0;
          const trace::TraceFile* file =
              traceDescribing(newest, ranks, call.callSite, &module, &offset, &thread);
          if (file != nullptr) {
            char text[32];
            std::snprintf(text, sizeof text, "+0x%" PRIx64, offset);
            call.issuedAt = std::string(baseName(module)) + text;
            // In a Python process, say why there is no line (a C++ thread of the framework).
            if (runsPython(*file)) {
              call.issuedAt += " (no Python frame on its thread" +
                               (thread.empty() ? std::string() : " " + thread) + ")";
            }
          }
          continue;
        }
        auto found = newest.find(ranks.front());
        if (found == newest.end()) continue;
        uint32_t number = trace::pythonSiteNumber(call.callSite);
        for (const trace::PythonSite& site : found->second->pythonSites) {
          if (site.number == number) {
            call.issuedAt = trace::issuedAtText(site);
            break;
          }
        }
      }
    }
  }
}

std::vector<int> siteRanks(const RankClass& rankClass) {
  constexpr size_t kRanksSearched = 64;
  std::vector<int> ranks;
  if (rankClass.call.callRank >= 0) ranks.push_back(rankClass.call.callRank);
  for (size_t i = 0; i < rankClass.ranks.size() && ranks.size() < kRanksSearched; ++i) {
    ranks.push_back(rankClass.ranks[i]);
  }
  return ranks;
}

const trace::TraceFile* traceDescribing(const NewestTraces& newest, const std::vector<int>& ranks,
                                        uint64_t callSite, std::string* module, uint64_t* offset,
                                        std::string* thread) {
  for (int rank : ranks) {
    auto found = newest.find(rank);
    if (found != newest.end() && nativeSiteOf(*found->second, callSite, module, offset, thread)) {
      return found->second;
    }
  }
  return nullptr;
}

bool runsPython(const trace::TraceFile& file) {
  return std::any_of(
      file.pythonSites.begin(), file.pythonSites.end(),
      [](const trace::PythonSite& site) { return site.number != trace::kNativeSiteNumber; });
}

bool nativeSiteOf(const trace::TraceFile& file, uint64_t callSite, std::string* module,
                  uint64_t* offset, std::string* thread) {
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
    if (thread != nullptr) {
      thread->clear();
      if (site.frames.size() > 1 && site.frames[1].starts_with(trace::kNativeSiteThreadPrefix)) {
        *thread = site.frames[1].substr(trace::kNativeSiteThreadPrefix.size());
      }
    }
    return true;
  }
  return false;
}

}  // namespace ncclwatch::analysis
