// "Issued at": the Python line that made a verdict's call, from the Python site its record names
// (trace/python_sites.h), looked up in the trace (sites blocks) or the collector's copy (SITES
// frames) of the class's first rank.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// Fills CallDesc::issuedAt of every verdict class whose call carries a Python site, and of those
// whose native call site the rank described (a site line numbered 0): "libtorch_cuda.so+0x1a2b
// (no Python frame on its thread)", which the offline commands turn into a function and line
// (tools/source_lines.h).
void annotateIssuedAt(Report& report, std::span<const trace::TraceFile> files);

// Whether the process ran Python (its trace has Python sites).
bool runsPython(const trace::TraceFile& file);
// How a verdict names the thread, without a Python frame, that issued a call in a Python process:
// `plain` and its name ("on thread NAME"), and for PyTorch's autograd threads what runs there
// (DDP's and FSDP's gradient hooks, during backward()), which a user would not guess from
// "pt_autograd_0".
std::string issuingThreadText(const std::string& thread, std::string_view plain = "on thread ");
// The module path and offset of the native site line for `callSite` in `file`; false when it
// has none. `thread`, when given: the name of the thread of the site's first call ("" when
// unknown).
bool nativeSiteOf(const trace::TraceFile& file, uint64_t callSite, std::string* module,
                  uint64_t* offset, std::string* thread = nullptr);
// The newest trace of each rank of `job` (a job's ranks, restarted, leave several).
using NewestTraces = std::unordered_map<int, const trace::TraceFile*>;
NewestTraces newestTraces(std::span<const trace::TraceFile> files, const std::string& job);
// Where a class's call site is looked up, in order: the rank its record came from (a return
// address or a Python site number means something in its own process only), then the class's
// ranks; 64 at most.
std::vector<int> siteRanks(const RankClass& rankClass);
// The trace among the newest of `ranks` that describes the native `callSite`, with its module,
// offset and (when given) thread, as nativeSiteOf. Null when none does.
const trace::TraceFile* traceDescribing(const NewestTraces& newest, const std::vector<int>& ranks,
                                        uint64_t callSite, std::string* module, uint64_t* offset,
                                        std::string* thread = nullptr);

}  // namespace ncclwatch::analysis
