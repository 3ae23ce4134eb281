#include "inspect.h"

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/before_aborts.h"
#include "analysis/describe.h"
#include "load.h"
#include "source_lines.h"
#include "trace/ring_reader.h"

namespace ncclwatch::inspect {
namespace {

// One line per verdict the collector said while the job ran (verdicts.jsonl in the folder, as
// `ncclwatch run` and the sidecar write it). After `run --abort` the trace files hold the
// aborted state, so these are the record of the hang itself.
void printLiveVerdicts(const std::string& directory, std::ostream& out) {
  std::ifstream in(std::filesystem::path(directory) / "verdicts.jsonl");
  if (!in) return;
  struct Line {
    std::string kind, hash;
    int64_t seq = 0;
    std::string text;
  };
  std::vector<Line> lines;
  int unreadable = 0;
  simdjson::dom::parser parser;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    simdjson::dom::element verdict;
    if (parser.parse(line).get(verdict) != simdjson::SUCCESS) {
      ++unreadable;
      continue;
    }
    std::string_view kind, hash, explanation;
    int64_t seq = 0, size = 0;
    if (verdict["kind"].get(kind) || verdict["seq"].get(seq) ||
        verdict["explanation"].get(explanation)) {
      ++unreadable;
      continue;
    }
    // A verdict on no communicator (an init nobody finished) has "comm": null.
    const bool onComm = !verdict["comm"]["hash"].get(hash);
    // A withdrawal marks the verdict it withdraws (a rank alive but silent that resumed).
    std::string_view withdraws;
    if (kind == "withdrawn" && !verdict["withdraws"].get(withdraws)) {
      auto said = std::find_if(lines.rbegin(), lines.rend(), [&](const Line& line) {
        return line.kind == withdraws && line.hash == hash && line.seq == seq;
      });
      if (said != lines.rend()) {
        said->text += " [withdrawn: " + std::string(explanation) + "]";
        continue;
      }
    }
    if (verdict["comm"]["size"].get(size)) size = 0;
    std::string culprits;
    simdjson::dom::array list;
    if (!verdict["culprits"].get(list)) {
      for (simdjson::dom::element rank : list) {
        int64_t value = 0;
        if (rank.get(value)) continue;
        culprits += (culprits.empty() ? "" : ",") + std::to_string(value);
      }
    }
    bool primary = true;
    if (verdict["primary"].get(primary)) primary = true;  // older lines have no such field
    lines.push_back(
        {std::string(kind), std::string(onComm ? hash : std::string_view()), seq,
         "  " + analysis::upperCase(kind) +
             (onComm ? " on comm " + std::string(hash.substr(0, 4)) + "\u2026(" +
                           std::to_string(size) + " ranks) at call #" + std::to_string(seq)
                     : std::string()) +
             (culprits.empty() ? "" : ", culprit " + culprits) + (primary ? "" : " [consequence]") +
             ": " + std::string(explanation)});
  }
  if (lines.empty() && unreadable == 0) return;
  out << "Live verdicts, said while the job ran ("
      << (std::filesystem::path(directory) / "verdicts.jsonl").string()
      << "): the traces below may show what came after them (an abort, a teardown).\n";
  for (const Line& line : lines) out << line.text << "\n";
  if (unreadable > 0) out << "  (" << unreadable << " unreadable lines skipped)\n";
  out << "\n";
}

}  // namespace

int run(const Options& options, std::ostream& out, std::ostream& err) {
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "inspect", err, &loaded)) return 2;
  std::vector<trace::TraceFile>& files = loaded.files;
  analysis::Options analysisOptions;
  analysisOptions.threads = analysis::defaultAnalysisThreads();
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  cli::SourceLines lines(cli::SourceLines::workingDirectory());
  lines.annotateDumps(files);
  // A hang that an abort ended is analysed as it was before the abort (before_aborts.h).
  std::vector<analysis::RolledBack> rolledBack = analysis::rollBackToBeforeAborts(files);
  analysis::Report report = analysis::analyze(files, analysisOptions);
  lines.annotateCallSites(report, files);
  lines.printNotes("inspect", err);
  if (options.reportJson || options.json) {
    // The JSON on stdout stays as its readers parse it; what it was read as goes to stderr.
    for (const analysis::RolledBack& rolled : rolledBack) {
      err << "ncclwatch inspect: " << analysis::rolledBackText(rolled) << "\n";
    }
  }
  if (options.reportJson) {
    analysis::printJson(report, out);
  } else if (options.json) {
    for (const analysis::JobReport& job : report.jobs) {
      for (const analysis::Verdict& v : job.verdicts) {
        out << analysis::verdictJson(v, job.jobId, job.attempt) << "\n";
      }
    }
  } else {
    analysis::TextStyle style;
    style.colour = cli::useColour(options.colour, STDOUT_FILENO);
    printLiveVerdicts(options.directory, out);
    for (const analysis::RolledBack& rolled : rolledBack) {
      out << analysis::rolledBackText(rolled) << "\n\n";
    }
    analysis::printText(report, out, style);
  }
  return report.hasFindings() ? 1 : 0;
}

}  // namespace ncclwatch::inspect
