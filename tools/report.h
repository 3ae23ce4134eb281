// `ncclwatch report DIR -o FILE.html`: one self-contained HTML page (inline CSS and SVG, no
// script, no external resource): the verdicts as inspect prints them with the culprit
// highlighted, an SVG timeline of the divergent communicator around the divergence, the merged
// stack tree and a table per rank.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/stack_tree.h"
#include "trace/ring_reader.h"

namespace ncclwatch::report {

struct Options {
  std::string directory;
  std::string output;  // the .html file to write
  double quietSeconds = 10;
};

// Escapes text for HTML element content and attribute values.
std::string escapeHtml(std::string_view text);

// The page for analysed files.
void writeHtml(std::span<const trace::TraceFile> files, const analysis::Report& report,
               const analysis::StackReport& stacks, std::ostream& out);

// Returns the exit code: 0 written (whatever the verdicts), 2 usage or I/O error.
int run(const Options& options, std::ostream& err);

}  // namespace ncclwatch::report
