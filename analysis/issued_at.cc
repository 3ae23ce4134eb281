#include "analysis/issued_at.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "analysis/describe.h"

namespace ncclwatch::analysis {

namespace {

// Keeps the classes' torch.distributed functions where they differ, and says so in a mismatch's
// or an unmatched transfer's explanation: rank 0's dist.barrier() against the others' all_reduce()
// reads as an AllReduce whose count differs, which points the user at the wrong tensor.
void nameDifferentApis(Verdict& verdict) {
  std::vector<std::pair<std::string, std::vector<int>>> ranksByApi;  // in class order
  for (const RankClass& rankClass : verdict.classes) {
    const std::string& api = rankClass.call.pythonApi;
    if (api.empty()) continue;
    auto same = std::find_if(ranksByApi.begin(), ranksByApi.end(),
                             [&](const auto& entry) { return entry.first == api; });
    if (same == ranksByApi.end()) same = ranksByApi.insert(ranksByApi.end(), {api, {}});
    same->second.insert(same->second.end(), rankClass.ranks.begin(), rankClass.ranks.end());
  }
  if (ranksByApi.size() < 2) {
    for (RankClass& rankClass : verdict.classes) rankClass.call.pythonApi.clear();
    return;
  }
  constexpr std::string_view kSaid = " (in Python: ";
  // A rank that never posts its side of a transfer is often in another function altogether
  // (exp24's gathermix: rank 0 in all_gather() where ranks 1-3 send to it in gather()).
  if ((verdict.kind != VerdictKind::kMismatch && verdict.kind != VerdictKind::kUnmatchedP2p) ||
      verdict.explanation.find(kSaid) != std::string::npos) {
    return;
  }
  // The culprits' function first, as the explanation names the culprits' call first.
  std::stable_partition(ranksByApi.begin(), ranksByApi.end(), [&](const auto& entry) {
    return std::any_of(entry.second.begin(), entry.second.end(), [&](int rank) {
      return std::find(verdict.culprits.begin(), verdict.culprits.end(), rank) !=
             verdict.culprits.end();
    });
  });
  std::string said;
  for (auto& [api, ranks] : ranksByApi) {
    std::sort(ranks.begin(), ranks.end());
    said += (said.empty() ? "" : ", ") + namedRanks(ranks) + " " + api + "()";
  }
  verdict.explanation += std::string(kSaid) + said + ")";
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
              call.issuedAt += " (no Python frame " +
                               (thread.empty() ? std::string("on its thread")
                                               : issuingThreadText(thread, "on its thread ")) +
                               ")";
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
            call.pythonApi = trace::pythonApiOf(site);
            break;
          }
        }
      }
      nameDifferentApis(verdict);
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

std::string issuingThreadText(const std::string& thread, std::string_view plain) {
  if (thread.starts_with("pt_autograd")) {
    return "on PyTorch's autograd thread " + thread +
           ", a gradient hook during backward() such as DDP's bucket all-reduce";
  }
  return std::string(plain) + thread;
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
