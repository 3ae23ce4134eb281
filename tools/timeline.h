// `ncclwatch timeline DIR -o FILE.json`: the job as a Chrome/Perfetto trace-event JSON file for
// ui.perfetto.dev. One process per rank ("rank 3 (host:pid)"); per communicator and stream a
// track of the calls as they ran (start→complete) and tracks of the calls as they waited in the
// stream's queue (issue→start; as many as the queue was deep, since those overlap); a track of
// the host calls (init, split, destroy) per thread; instants for dumps and for the verdicts of
// the analysis on the ranks they concern. Clocks are aligned across hosts on collective
// completion (analysis/timing.h), not on wall clocks.
#pragma once
#include <cstddef>
#include <ostream>
#include <span>
#include <string>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::timeline {

struct Options {
  std::string directory;
  std::string output;        // "-": stdout
  double quietSeconds = 10;  // as inspect's --quiet, for the verdicts
};

struct Stats {
  size_t processes = 0;
  size_t tracks = 0;    // threads named
  size_t slices = 0;    // complete ("X") events
  size_t instants = 0;  // instant ("i") events
  size_t verdictMarks = 0;
  size_t dumpMarks = 0;
};

// Writes the trace-event JSON of `files` (the usable ones) to `out`; `report`, when given, adds
// its verdicts as instants on the ranks they concern.
Stats write(std::span<const trace::TraceFile> files, const analysis::Report* report,
            std::ostream& out);

// Returns the exit code: 0 written, 2 usage or I/O error (nothing readable, cannot write).
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::timeline
