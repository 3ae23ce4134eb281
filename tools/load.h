// Reading a job's trace files for the offline subcommands, as users expect of a CLI: every
// .ncclwatch file under a folder, unreadable or corrupt files named on stderr while the rest is
// still used, and a progress line on stderr when reading takes a while on a terminal.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "trace/ring_reader.h"

namespace ncclwatch::cli {

struct Loaded {
  std::vector<trace::TraceFile> files;  // the usable ones, in path order
  int found = 0;                        // .ncclwatch files found
  int unusable = 0;                     // not traces (nothing salvaged)
  int damaged = 0;                      // usable, with problems (valid records kept)
};

// Reads every .ncclwatch file under `directory` (recursively). Problems go to `err`, each line
// prefixed "ncclwatch COMMAND: ". Returns false (after saying why) when nothing usable was found:
// the caller exits with code 2.
bool loadTraces(const std::string& directory, const std::string& command, std::ostream& err,
                Loaded* loaded);

// Whether to colour output to `fd`: `choice` 1 always, 0 never, -1 when `fd` is a terminal and
// NO_COLOR is unset.
bool useColour(int choice, int fd);

}  // namespace ncclwatch::cli
