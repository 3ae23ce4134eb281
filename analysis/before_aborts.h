// The trace files of a hang that an abort ended, put back as they were just before that abort.
//
// Aborting the communicator a job hangs in is how hangs end: `ncclwatch run --abort` (and
// NCCLWATCH_ON_HANG=abort), PyTorch's watchdog at its collective timeout, an application's own
// error path. The files then hold what the abort left: the hung calls "aborted" (or a split in
// flight failed), calls on other communicators completed because the abort freed the streams
// they waited behind, and the teardown after it (each rank's ncclCommAbort, later at a different
// call on each rank). Read as they are, the hang is gone and its teardown reads as the bug
// ("rank 1 is gone while the others wait for it", "ranks 0,3 aborted the communicator"), or
// nothing at all is found. The offline commands (inspect, report, stacks) analyse the files as
// they were at the first such abort instead: the state every record had then (from its issue,
// start and completion times), without the records issued from then on.
//
// An abort ends a hang when ncclwatch made it (kRecordByNcclwatch: it aborts only to end a hang
// it judged), or when the aborting process had a call of its own on that communicator
// still unfinished (a call it aborted, a split in flight, a call that failed only after it)
// that no other rank completed: a rank that aborts a communicator it has nothing pending on, or
// whose aborted calls its peers went on to complete, while the others wait, is the local-abort
// bug the teardown verdict names, and is left as it is.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

struct RolledBack {
  std::string jobId;
  int64_t atNs = 0;          // wall clock of the first abort that ended a hang
  int rank = -1;             // the rank that issued it
  uint64_t comm = 0;         // the communicator it aborted
  bool byNcclwatch = false;  // ncclwatch made that abort (trace::kRecordByNcclwatch)
  uint64_t left = 0;         // records issued from then on, left out
  uint64_t undone = 0;       // records whose later start, completion, failure or abort was undone
};

// Per job id: puts the files of each job whose hang an abort ended back as they were just
// before the first such abort. Files of a process started after it (a restart) are left alone.
std::vector<RolledBack> rollBackToBeforeAborts(std::vector<trace::TraceFile>& files);

// One line for the text outputs: what was rolled back, and why.
std::string rolledBackText(const RolledBack& rolled);

}  // namespace ncclwatch::analysis
