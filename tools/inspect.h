// `ncclwatch inspect DIR`: reads every ring file under DIR, runs the cross-rank analysis and
// prints what happened, the verdicts and a per-communicator summary (or JSON lines).
#pragma once
#include <ostream>
#include <string>

namespace ncclwatch::inspect {

struct Options {
  std::string directory;
  bool json = false;        // verdicts as JSON lines (docs/verdicts.md)
  bool reportJson = false;  // the whole report as one JSON document
  double quietSeconds = 10;
  int colour = -1;  // -1: when stdout is a terminal (and NO_COLOR is unset), 0 never, 1 always
};

// Returns the exit code: 0 no finding, 1 findings, 2 usage or I/O errors (nothing readable).
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::inspect
