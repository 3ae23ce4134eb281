// `ncclwatch stacks DIR`: each rank's dump taken on the hang (else its newest) merged into one
// STAT-style tree (analysis/stack_tree.h): equivalence classes with representative ranks first,
// suspects by how far behind they are, then the tree of the thread that matters (mixed Python
// and native frames where a thread runs Python) and the Python tree. Text or JSON.
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
  bool noMixed = false;      // native and Python stacks apart (analysis::StackOptions::mixed)
  double quietSeconds = 10;  // as inspect's --quiet, for the verdicts that order suspects
};

// Returns the exit code: 0 printed, 1 printed but no rank has a dump, 2 usage or I/O error.
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::stacks
