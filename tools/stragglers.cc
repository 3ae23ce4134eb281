#include "stragglers.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "analysis/describe.h"
#include "load.h"

namespace ncclwatch::stragglers {
namespace {

std::string signedMs(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.3f ms", static_cast<double>(ns) / 1e6);
  return text;
}

std::string padLeft(const std::string& text, size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

}  // namespace

void printText(const analysis::StragglerReport& report, std::span<const trace::TraceFile> files,
               const Options& options, bool colour, std::ostream& out) {
  const char* bold = colour ? "\033[1m" : "";
  const char* yellow = colour ? "\033[1;33m" : "";
  const char* reset = colour ? "\033[0m" : "";
  size_t hosts = report.clocks.hosts.size();
  out << bold << "Arrival lateness" << reset << ": " << report.ranks << " rank"
      << (report.ranks == 1 ? "" : "s") << " on " << hosts << " host" << (hosts == 1 ? "" : "s")
      << ", " << report.comms.size() << " communicator" << (report.comms.size() == 1 ? "" : "s")
      << " with shared collectives (a rank's lateness: its issue time minus the earliest "
         "rank's)\n";
  if (hosts > 1) {
    const analysis::HostClock* reference = nullptr;
    for (const analysis::HostClock& h : report.clocks.hosts) {
      if (h.reference) reference = &h;
    }
    for (size_t i = 0; i < hosts; ++i) {
      const analysis::HostClock& h = report.clocks.hosts[i];
      if (h.reference) continue;
      out << "Clock of host " << h.host << ": ";
      if (h.collectives == 0) {
        out << "no collective shared with other hosts completed; wall clock used\n";
      } else {
        out << signedMs(report.clocks.correctionNs(i)) << " from its wall clock, aligned to host "
            << (reference != nullptr ? reference->host : "?") << " on " << h.collectives
            << " collective completions\n";
      }
    }
  }
  out << "\n";
  if (report.stragglers.empty()) {
    char share[16];
    std::snprintf(share, sizeof share, "%.0f%%", 100.0 * options.thresholds.minLastShare);
    out << bold << "No straggler" << reset << ": no rank is the last to arrive in " << share
        << " or more of a communicator's collectives while "
        << analysis::durationText(options.thresholds.minMedianNs)
        << " or more late at the median.\n";
  } else {
    out << bold << "Stragglers" << reset << " (the others wait for them):\n";
    for (const analysis::Straggler& s : report.stragglers) {
      out << "  " << yellow << s.reading << reset << "\n";
    }
  }
  std::set<int> flagged;
  for (const analysis::Straggler& s : report.stragglers) flagged.insert(s.rank);
  for (const analysis::CommLateness& comm : report.comms) {
    out << "\ncomm " << analysis::commText(comm.comm) << ": " << comm.collectives << " "
        << comm.what << "\n";
    std::vector<analysis::RankLateness> ranks = comm.ranks;
    std::stable_sort(ranks.begin(), ranks.end(),
                     [](const analysis::RankLateness& a, const analysis::RankLateness& b) {
                       if (a.medianNs != b.medianNs) return a.medianNs > b.medianNs;
                       return a.last > b.last;
                     });
    size_t shown =
        options.top > 0 ? std::min(ranks.size(), static_cast<size_t>(options.top)) : ranks.size();
    out << "  " << padLeft("rank", 6) << padLeft("calls", 8) << padLeft("last", 7)
        << padLeft("median", 11) << padLeft("p95", 11) << padLeft("max", 11) << "\n";
    for (size_t i = 0; i < shown; ++i) {
      const analysis::RankLateness& r = ranks[i];
      char share[16];
      std::snprintf(share, sizeof share, "%.0f%%", 100.0 * r.lastShare());
      bool mark = flagged.count(r.rank) != 0 && r.lastShare() >= options.thresholds.minLastShare;
      out << "  " << (mark ? yellow : "") << padLeft(std::to_string(r.rank), 6)
          << padLeft(std::to_string(r.calls), 8) << padLeft(share, 7)
          << padLeft(analysis::durationText(r.medianNs), 11)
          << padLeft(analysis::durationText(r.p95Ns), 11)
          << padLeft(analysis::durationText(r.maxNs), 11) << (mark ? reset : "") << "\n";
    }
    if (shown < ranks.size()) {
      out << "  ... " << ranks.size() - shown << " more (--top 0 shows every rank)\n";
    }
  }
  (void)files;
}

int run(const Options& options, std::ostream& out, std::ostream& err) {
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "stragglers", err, &loaded)) return 2;
  analysis::StragglerReport report = analysis::computeStragglers(loaded.files, options.thresholds);
  if (report.comms.empty()) {
    err << "ncclwatch stragglers: no collective was issued by every member of a communicator of "
           "2 ranks or more; nothing to compare\n";
  }
  printText(report, loaded.files, options, cli::useColour(options.colour, STDOUT_FILENO), out);
  return report.stragglers.empty() ? 0 : 1;
}

}  // namespace ncclwatch::stragglers
