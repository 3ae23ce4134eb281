#include "stacks.h"

#include <algorithm>
#include <filesystem>

#include "analysis/analyze.h"
#include "analysis/stack_tree.h"

namespace ncclwatch::stacks {

bool loadTraces(const std::string& directory, const std::string& command,
                std::vector<trace::TraceFile>* files, std::ostream& err) {
  namespace fs = std::filesystem;
  const std::string prefix = "ncclwatch " + command + ": ";
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    err << prefix << directory << " is not a readable folder\n";
    return false;
  }
  fs::recursive_directory_iterator it(directory, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    err << prefix << "cannot read " << directory << ": " << ec.message() << "\n";
    return false;
  }
  std::vector<std::string> paths;
  for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
    if (ec) {
      err << prefix << ec.message() << "\n";
      break;
    }
    if (it->is_regular_file(ec) && it->path().extension() == ".ncclwatch") {
      paths.push_back(it->path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) {
    err << prefix << "no .ncclwatch files under " << directory << "\n";
    return false;
  }
  for (const std::string& path : paths) {
    trace::TraceFile file = trace::readTraceFile(path);
    if (!file.usable) {
      err << prefix << path << ": not usable";
      if (!file.problems.empty()) err << " (" << file.problems.front().what << ")";
      err << "\n";
      continue;
    }
    if (!file.problems.empty()) {
      err << prefix << path << ": " << file.problems.size()
          << " problem(s), first: " << file.problems.front().what << "; using what is valid\n";
    }
    files->push_back(std::move(file));
  }
  if (files->empty()) {
    err << prefix << "none of the " << paths.size() << " files is a usable trace\n";
    return false;
  }
  return true;
}

int run(const Options& options, std::ostream& out, std::ostream& err) {
  analysis::StackOptions stackOptions;
  if (options.by == "module") {
    stackOptions.by = analysis::FrameKey::kModule;
  } else if (options.by != "function") {
    err << "ncclwatch stacks: --by must be function or module, not " << options.by << "\n";
    return 2;
  }
  stackOptions.allThreads = options.allThreads;
  std::vector<trace::TraceFile> files;
  if (!loadTraces(options.directory, "stacks", &files, err)) return 2;
  analysis::Options analysisOptions;
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
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
