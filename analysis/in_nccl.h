// What the profiler plugin saw inside NCCL for a verdict's ranks: whether each one's kernel
// started, and the proxy step (channel, peer, state) it waits on. Taken from the wait notes
// each rank's watchdog published (trace file header, or the collector's WAITS frames).
#pragma once
#include <span>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// "rank 3: kernel running (1 of 2 channels started); channel 0 proxy step 2 SendGPUWait toward
// peer 0 for 2.1 s" for each of the verdict's ranks that has a note on the verdict's comm (the
// call whose wait says most, trace::proxyWaitWeight, the oldest among equals), in rank order.
// Empty when no rank has one.
std::vector<std::string> inNcclLines(const Verdict& verdict,
                                     std::span<const trace::TraceFile* const> files);

// Fills Verdict::inNccl of every verdict of every job from `files`.
void annotateInNccl(Report& report, std::span<const trace::TraceFile> files);

}  // namespace ncclwatch::analysis
