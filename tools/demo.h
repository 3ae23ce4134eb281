// `ncclwatch demo`: the whole tool in one command, without a GPU. Runs N ranks of
// examples/train_loop on the sim with an injected bug, under libncclwatch.so with short
// thresholds, so that the live watchdog blocks appear within about two seconds of the hang; once
// every rank has dumped it stops the job and prints the cross-rank diagnosis (inspect), then
// writes the Perfetto timeline and the HTML report next to the traces.
#pragma once
#include <ostream>
#include <string>

namespace ncclwatch::demo {

struct Options {
  int ranks = 8;
  std::string bug = "skip:rank=3,step=5";  // train_loop --bug; a kind alone gets defaults
  int steps = 10;
  std::string directory;  // empty: a fresh folder under ./ncclwatch-demo
  double timeoutSeconds = 45;
  int colour = -1;  // -1: when stdout is a terminal (and NO_COLOR is unset), 0 never, 1 always
};

// "skip" → "skip:rank=3,step=5" (rank and step kept inside the job); a full spec is kept.
std::string completeBug(const std::string& bug, int ranks, int steps);

// Returns the exit code: inspect's (0 nothing found, 1 findings), 2 usage or set-up errors.
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::demo
