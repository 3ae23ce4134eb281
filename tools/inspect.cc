#include "inspect.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/describe.h"
#include "load.h"
#include "source_lines.h"
#include "trace/ring_reader.h"

namespace ncclwatch::inspect {

int run(const Options& options, std::ostream& out, std::ostream& err) {
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "inspect", err, &loaded)) return 2;
  std::vector<trace::TraceFile>& files = loaded.files;
  analysis::Options analysisOptions;
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  cli::SourceLines lines(cli::SourceLines::workingDirectory());
  lines.annotateDumps(files);
  analysis::Report report = analysis::analyze(files, analysisOptions);
  lines.annotateCallSites(report, files);
  lines.printNotes("inspect", err);
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
    analysis::printText(report, out, style);
  }
  return report.hasFindings() ? 1 : 0;
}

}  // namespace ncclwatch::inspect
