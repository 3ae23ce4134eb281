// `ncclwatch stacks DIR`: the newest dump of every rank's trace merged into one STAT-style tree
// (analysis/stack_tree.h): equivalence classes with representative ranks first, suspects by how
// far behind they are, then the native and Python trees. Text or JSON.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "trace/ring_reader.h"

namespace ncclwatch::stacks {

struct Options {
  std::string directory;
  std::string by = "function";  // "function" or "module" (module+offset)
  bool json = false;
  bool allThreads = false;
  double quietSeconds = 10;  // as inspect's --quiet, for the verdicts that order suspects
};

// Reads every .ncclwatch file under `directory` (recursively, sorted by path); unusable or
// damaged files are named on `err` prefixed by "ncclwatch <command>: ". False, with a message,
// when the folder is unreadable or holds no usable trace.
bool loadTraces(const std::string& directory, const std::string& command,
                std::vector<trace::TraceFile>* files, std::ostream& err);

// Returns the exit code: 0 printed, 1 printed but no rank has a dump, 2 usage or I/O error.
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::stacks
