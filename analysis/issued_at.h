// "Issued at": the Python line that made a verdict's call, from the Python site its record names
// (trace/python_sites.h), looked up in the trace (sites blocks) or the collector's copy (SITES
// frames) of the class's first rank.
#pragma once
#include <span>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// Fills CallDesc::issuedAt of every verdict class whose call carries a Python site.
void annotateIssuedAt(Report& report, std::span<const trace::TraceFile> files);

}  // namespace ncclwatch::analysis
