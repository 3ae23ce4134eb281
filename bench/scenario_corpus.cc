// The scenario corpus (tests/scenarios) as a bench: each scenario REPEAT times, live (rank 0's
// sidecar, `ncclwatch run`, or both) and offline. Prints the confusion table (expected, what
// live and offline said, how often each agreed with the table) and the detection latency per
// row (the first live verdict's detection minus divergence time: median and worst), then the
// number of rows that were stable (every run agreed).
//
//   scenario_corpus [--repeat N] [--mode sidecar|run|both] [--jobs J] [--only a,b,...]
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "corpus.h"

namespace {

struct Arguments {
  int repeat = 10;
  std::vector<corpus::Mode> modes = {corpus::Mode::kSidecar};
  int jobs = 3;
  std::string only;
};

bool parse(int argc, char** argv, Arguments* args) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    std::string value = argv[++i];
    if (arg == "--repeat") {
      args->repeat = std::max(1, std::atoi(value.c_str()));
    } else if (arg == "--jobs") {
      args->jobs = std::max(1, std::atoi(value.c_str()));
    } else if (arg == "--only") {
      args->only = "," + value + ",";
    } else if (arg == "--mode" && (value == "sidecar" || value == "run" || value == "both")) {
      args->modes.clear();
      if (value != "run") args->modes.push_back(corpus::Mode::kSidecar);
      if (value != "sidecar") args->modes.push_back(corpus::Mode::kRun);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  if (!parse(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: scenario_corpus [--repeat N] [--mode sidecar|run|both] [--jobs J] "
                 "[--only a,b,...]\n");
    return 2;
  }
  std::vector<corpus::Expectation> rows;
  std::string error;
  if (!corpus::readTable(corpus::tablePath(), &rows, &error)) {
    std::fprintf(stderr, "scenario_corpus: %s\n", error.c_str());
    return 2;
  }
  std::vector<corpus::Task> tasks;
  for (corpus::Mode mode : args.modes) {
    for (int r = 0; r < args.repeat; ++r) {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (args.only.empty() || args.only.find("," + rows[i].name + ",") != std::string::npos) {
          tasks.push_back({i, mode, r});
        }
      }
    }
  }
  const char* base = std::getenv("TMPDIR");
  std::string directory = std::string(base != nullptr && *base ? base : "/tmp") +
                          "/nw-scenario-bench-" + std::to_string(getpid());
  std::vector<corpus::Outcome> outcomes = corpus::runAll(rows, tasks, args.jobs, directory);

  std::printf("%-24s %-7s %-20s %-22s %-22s %6s %6s %9s %9s\n", "scenario", "mode", "expected",
              "live (runs)", "offline (runs)", "live", "both", "lat p50", "lat max");
  int stable = 0, lines = 0;
  for (corpus::Mode mode : args.modes) {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::map<std::string, int> liveSeen, offlineSeen;
      int liveOk = 0, bothOk = 0, runs = 0;
      std::vector<double> latencies;
      for (size_t t = 0; t < tasks.size(); ++t) {
        if (tasks[t].row != i || tasks[t].mode != mode) continue;
        const corpus::Outcome& outcome = outcomes[t];
        ++runs;
        ++liveSeen[outcome.live.text()];
        ++offlineSeen[outcome.offline.text()];
        liveOk += outcome.live == corpus::expected(rows[i]) && !outcome.stuck;
        bothOk += outcome.agrees(rows[i]);
        if (outcome.latencyMs >= 0) latencies.push_back(outcome.latencyMs);
      }
      if (runs == 0) continue;
      auto summary = [](const std::map<std::string, int>& seen) {
        std::string text;
        for (const auto& [what, count] : seen) {
          text += (text.empty() ? "" : " | ") + what +
                  (seen.size() > 1 ? " x" + std::to_string(count) : "");
        }
        return text;
      };
      std::sort(latencies.begin(), latencies.end());
      char p50[16] = "-", worst[16] = "-";
      if (!latencies.empty()) {
        std::snprintf(p50, sizeof p50, "%.0f ms", latencies[latencies.size() / 2]);
        std::snprintf(worst, sizeof worst, "%.0f ms", latencies.back());
      }
      std::printf("%-24s %-7s %-20s %-22s %-22s %3d/%-2d %3d/%-2d %9s %9s\n", rows[i].name.c_str(),
                  corpus::modeName(mode), corpus::expected(rows[i]).text().c_str(),
                  summary(liveSeen).c_str(), summary(offlineSeen).c_str(), liveOk, runs, bothOk,
                  runs, p50, worst);
      ++lines;
      stable += bothOk == runs;
    }
  }
  std::printf("\n%d of %d rows stable (live and offline as expected in every run)\n", stable,
              lines);
  return stable == lines ? 0 : 1;
}
