// `ncclwatch stragglers DIR`: how late each rank arrives at the collectives of each
// communicator (clocks aligned across hosts on collective completion), and which ranks the
// others keep waiting for, in plain words.
#pragma once
#include <ostream>
#include <span>
#include <string>

#include "analysis/timing.h"
#include "trace/ring_reader.h"

namespace ncclwatch::stragglers {

struct Options {
  std::string directory;
  int top = 5;      // ranks shown per communicator (0: all)
  int colour = -1;  // -1: when stdout is a terminal (and NO_COLOR is unset), 0 never, 1 always
  analysis::StragglerOptions thresholds;
};

// The text report of `report` (computed from `files`).
void printText(const analysis::StragglerReport& report, std::span<const trace::TraceFile> files,
               const Options& options, bool colour, std::ostream& out);

// Returns the exit code: 0 no straggler, 1 stragglers found, 2 usage or I/O error.
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::stragglers
