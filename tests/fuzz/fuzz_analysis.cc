// libFuzzer target: the cross-rank analysis (`ncclwatch inspect`, the live collector) must take
// any trace the reader accepts without crashing, throwing, or growing without bound. One input
// makes a job of three ranks: the file as read, and two copies whose calls the input's last bytes
// change (a count, a seq, a state, a communicator), so that the checks see ranks agree and
// disagree. Then the report in text and JSON, and an incremental pass as the collector runs it.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/describe.h"
#include "analysis/incremental.h"
#include "trace/ring_reader.h"

namespace {

using ncclwatch::trace::CallRecord;
using ncclwatch::trace::RecordState;

// The input's last bytes, read backwards; zeros once they run out.
struct Tail {
  const uint8_t* data;
  size_t left;
  uint8_t next() { return left > 0 ? data[--left] : 0; }
};

void perturb(ncclwatch::trace::RecordWindow& records, Tail& tail) {
  if (records.empty()) return;
  CallRecord& r = records[tail.next() % records.size()];
  switch (tail.next() % 5) {
    case 0:
      r.count ^= uint64_t{1} << (tail.next() % 64);
      r.fingerprint ^= r.count;
      break;
    case 1:
      r.seq += tail.next();
      break;
    case 2:
      r.state = static_cast<RecordState>(1 + tail.next() % 5);  // issued .. aborted
      break;
    case 3:
      r.commHash ^= tail.next();
      break;
    default:
      r.seq = uint64_t{tail.next()} << (tail.next() % 64);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ncclwatch;
  trace::TraceFile file =
      trace::parseTrace(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz/r0");
  if (!file.usable) return 0;
  Tail tail{data, size < 16 ? size : 16};
  tail.data = data + size - tail.left;
  std::vector<trace::TraceFile> files(3, file);
  for (int r = 0; r < 3; ++r) {
    files[r].header.rank = r;
    files[r].header.world = 3;
    files[r].header.pid = file.header.pid + r;
    files[r].path = "fuzz/r" + std::to_string(r);
  }
  perturb(files[1].records, tail);
  perturb(files[2].records, tail);
  analysis::Options options;
  options.probeProcesses = false;
  options.nowNs = file.header.anchorRealtimeNs + 60'000'000'000;
  uint8_t alive = tail.next();
  for (int r = 0; r < 3; ++r) {
    if (alive & (1u << r)) options.aliveRanks.push_back(r);
  }
  analysis::Report report = analysis::analyze(files, options);
  std::ostringstream text, json;
  analysis::printText(report, text);
  analysis::printJson(report, json);
  for (const analysis::JobReport& job : report.jobs) {
    for (const analysis::Verdict& verdict : job.verdicts) {
      json << analysis::verdictJson(verdict, job.jobId, job.attempt);
    }
  }
  analysis::IncrementalAnalysis incremental;
  incremental.analyze(files, options);
  for (const trace::CallRecord& record : files[1].records) incremental.touch(record.commHash);
  incremental.analyzeFirst(files, options,
                           {files[1].records.empty() ? 0 : files[1].records[0].commHash});
  return 0;
}
