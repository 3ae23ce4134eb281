#include "analysis/issued_at.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ncclwatch::analysis {
namespace {

std::string baseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

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
        // The rank the call's record came from first: its site means something there only.
        std::vector<int> ranks = {call.callRank >= 0 ? call.callRank : rankClass.ranks.front()};
        if (!trace::isPythonSite(call.callSite)) {
          ranks.insert(ranks.end(), rankClass.ranks.begin(),
                       rankClass.ranks.begin() + static_cast<std::ptrdiff_t>(
                                                     std::min<size_t>(rankClass.ranks.size(), 64)));
          std::string module;
          uint64_t offset = 0;
          const trace::TraceFile* file =
              traceDescribing(newest, ranks, call.callSite, &module, &offset);
          if (file != nullptr) {
            char text[32];
            std::snprintf(text, sizeof text, "+0x%" PRIx64, offset);
            // In a Python process, say why there is no line (a C++ thread of the framework).
            bool python = runsPython(*file);
            std::string thread;
            nativeSiteOf(*file, call.callSite, &module, &offset, &thread);
            call.issuedAt = baseName(module) + text;
            if (python) {
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

const trace::TraceFile* traceDescribing(const NewestTraces& newest, const std::vector<int>& ranks,
                                        uint64_t callSite, std::string* module, uint64_t* offset) {
  constexpr size_t kRanksSearched = 64;
  for (size_t i = 0; i < ranks.size() && i < kRanksSearched; ++i) {
    auto found = newest.find(ranks[i]);
    if (found != newest.end() && nativeSiteOf(*found->second, callSite, module, offset)) {
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
