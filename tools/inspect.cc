#include "inspect.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/describe.h"
#include "trace/ring_reader.h"

namespace ncclwatch::inspect {

int run(const Options& options, std::ostream& out, std::ostream& err) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(options.directory, ec)) {
    err << "ncclwatch inspect: " << options.directory << " is not a readable folder\n";
    return 2;
  }
  std::vector<std::string> paths;
  fs::recursive_directory_iterator it(options.directory,
                                      fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    err << "ncclwatch inspect: cannot read " << options.directory << ": " << ec.message() << "\n";
    return 2;
  }
  for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
    if (ec) {
      err << "ncclwatch inspect: " << ec.message() << "\n";
      break;
    }
    if (it->is_regular_file(ec) && it->path().extension() == ".ncclwatch") {
      paths.push_back(it->path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) {
    err << "ncclwatch inspect: no .ncclwatch files under " << options.directory << "\n";
    return 2;
  }
  std::vector<trace::TraceFile> files;
  files.reserve(paths.size());
  int unusable = 0;
  for (const std::string& path : paths) {
    trace::TraceFile file = trace::readTraceFile(path);
    if (!file.usable) {
      ++unusable;
      err << "ncclwatch inspect: " << path << ": not usable";
      if (!file.problems.empty()) err << " (" << file.problems.front().what << ")";
      err << "\n";
      continue;
    }
    if (!file.problems.empty()) {
      err << "ncclwatch inspect: " << path << ": " << file.problems.size()
          << " problem(s), first: " << file.problems.front().what << "; using what is valid\n";
    }
    files.push_back(std::move(file));
  }
  if (files.empty()) {
    err << "ncclwatch inspect: none of the " << paths.size() << " files is a usable trace\n";
    return 2;
  }
  analysis::Options analysisOptions;
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  analysis::Report report = analysis::analyze(files, analysisOptions);
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
    style.colour = options.colour == 1 || (options.colour < 0 && isatty(STDOUT_FILENO) &&
                                           std::getenv("NO_COLOR") == nullptr);
    analysis::printText(report, out, style);
  }
  (void)unusable;
  return report.hasFindings() ? 1 : 0;
}

}  // namespace ncclwatch::inspect
