// The trace files a test job left behind, for tests that run jobs under libncclwatch.so.
#pragma once
#include <string>
#include <vector>

#include "trace/ring_reader.h"

namespace testsupport {

// A folder for one test's trace files, emptied: $TMPDIR (or /tmp)/nw-<name>-<pid>. Created when
// `create`, else left for the library to create (as NCCLWATCH_DIR).
std::string freshDirectory(const std::string& name, bool create = false);

// The whole text of a file (verdicts.jsonl, a captured output); empty when it cannot be read.
std::string readFile(const std::string& path);

// The first verdict in `logs`/verdicts.jsonl that is not information: on a loaded machine a
// straggler note can come before the error a test waits for. Empty when there is none yet.
std::string firstErrorVerdict(const std::string& logs);
// A shell condition, true once `logs`/verdicts.jsonl holds such a verdict (for wait loops).
std::string hasErrorVerdictCondition(const std::string& logs);

// Every *.ncclwatch file in `directory`, read, ordered by rank; none when it does not exist.
std::vector<ncclwatch::trace::TraceFile> readTraceFiles(const std::string& directory);

}  // namespace testsupport
