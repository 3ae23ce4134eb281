// Runs the scenario corpus (nccl_scenarios, expected.tsv) the way a user would: each scenario as
// a job of `ncclwatch launch` on the sim with libncclwatch.so preloaded (rank 0's sidecar
// collector) or under `ncclwatch run`, its live verdicts read from verdicts.jsonl while it runs,
// then `ncclwatch inspect` on the same traces. Shared by the ctest (tests/scenarios) and the
// benches (bench/scenario_corpus).
#pragma once
#include <set>
#include <string>
#include <vector>

namespace corpus {

struct Expectation {
  std::string name;
  int ranks = 4;
  bool hangs = false;  // the job hangs until stopped (else it ends by itself)
  std::set<std::string> kinds;
  std::set<int> culprits;
  std::string what;
};

// Reads expected.tsv; false with a one-line error naming the line.
bool readTable(const std::string& path, std::vector<Expectation>* rows, std::string* error);

// The primary verdicts, stragglers left out: their kinds and the union of their culprits.
struct Findings {
  std::set<std::string> kinds;
  std::set<int> culprits;
  bool operator==(const Findings&) const = default;
  std::string text() const;  // "mismatch 3", "missing 1,4", "none"
};
Findings expected(const Expectation& row);

enum class Mode { kSidecar, kRun };
const char* modeName(Mode mode);

struct Outcome {
  Findings live;
  Findings offline;
  double latencyMs = -1;    // first live verdict: its detection minus its divergence time
  double toVerdictS = -1;   // from the job's start to the first live verdict on disk
  int exitStatus = -1;      // the job's (launcher's) exit status; -1: stopped by the test
  bool stuck = false;       // a job expected to end did not, or a hang never spoke in time
  std::string diagnostics;  // the job's output and both verdict lists, for failure messages
  bool agrees(const Expectation& row) const {
    return live == expected(row) && offline == expected(row) && !stuck;
  }
};

// Paths baked in at build time (the ncclwatch CLI, nccl_scenarios, expected.tsv).
std::string tablePath();

// Runs one scenario in `directory` (emptied first) and waits for its verdicts; the job and its
// collector are gone when it returns.
Outcome runScenario(const Expectation& row, Mode mode, const std::string& directory);

// Runs tasks (row index, mode) `jobs` at a time; outcomes in task order.
struct Task {
  size_t row;
  Mode mode;
  int repetition;
};
std::vector<Outcome> runAll(const std::vector<Expectation>& rows, const std::vector<Task>& tasks,
                            int jobs, const std::string& directory);

}  // namespace corpus
