#include "stacks.h"

#include <algorithm>
#include <filesystem>

#include "analysis/analyze.h"
#include "analysis/before_aborts.h"
#include "analysis/stack_tree.h"
#include "load.h"
#include "source_lines.h"

namespace ncclwatch::stacks {

int run(const Options& options, std::ostream& out, std::ostream& err) {
  analysis::StackOptions stackOptions;
  if (options.by == "module") {
    stackOptions.by = analysis::FrameKey::kModule;
  } else if (options.by != "function") {
    err << "ncclwatch stacks: --by must be function or module, not " << options.by << "\n";
    return 2;
  }
  stackOptions.allThreads = options.allThreads;
  stackOptions.mixed = !options.noMixed;
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "stacks", err, &loaded)) return 2;
  std::vector<trace::TraceFile>& files = loaded.files;
  cli::SourceLines lines(cli::SourceLines::workingDirectory());
  lines.annotateDumps(files);
  lines.printNotes("stacks", err);
  analysis::Options analysisOptions;
  analysisOptions.threads = analysis::defaultAnalysisThreads();
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  analysis::rollBackToBeforeAborts(files);  // the hang an abort ended, as it was (inspect's)
  analysis::Report report = analysis::analyze(files, analysisOptions);
  analysis::StackReport stacks = analysis::stackReport(files, report, stackOptions);
  if (options.json) {
    analysis::printStacksJson(stacks, out);
  } else {
    analysis::printStacksText(stacks, out);
  }
  return stacks.noDump.size() == static_cast<size_t>(stacks.ranks) ? 1 : 0;
}

}  // namespace ncclwatch::stacks
