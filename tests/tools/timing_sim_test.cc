// End to end on the sim: `ncclwatch demo` as a user runs it (the skipping rank named, the
// verdict and the timeline's path printed, the timeline valid and, where PyPI's perfetto package
// is installed, loaded by Perfetto's trace processor), and `ncclwatch stragglers` on a job whose
// rank 3 is slow.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/timing.h"
#include "command.h"
#include "job.h"
#include "trace/ring_reader.h"
#include "trace_event_check.h"

namespace {

using namespace std::chrono_literals;

using testsupport::command;
using testsupport::Output;

std::string freshDirectory(const std::string& name) {
  std::string directory = (std::filesystem::path(testing::TempDir()) /
                           ("nw-tl-" + name + "-" + std::to_string(getpid())))
                              .lexically_normal()
                              .string();
  std::filesystem::remove_all(directory);
  return directory;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string g_demoTimeline;  // kept for the Perfetto test
size_t g_demoEvents = 0;

TEST(Demo, FourRanksNameTheSkippingRankAndWriteTheTimeline) {
  std::string dir = freshDirectory("demo");
  auto start = std::chrono::steady_clock::now();
  Output out = command(std::string(NCCLWATCH_BINARY) + " demo --ranks 4 --no-color --dir " + dir);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(out.status, 1) << out.text;  // findings: the injected bug
  EXPECT_LT(seconds, 60) << out.text;
  EXPECT_NE(out.text.find("injected bug: rank 3 skips one data-parallel allreduce at step 5"),
            std::string::npos)
      << out.text;
  EXPECT_NE(out.text.find("dump (hang)"), std::string::npos) << "live watchdog blocks\n"
                                                             << out.text;
  EXPECT_NE(out.text.find("MISMATCH on comm"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("culprit 3"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("rank 3 skipped AllReduce"), std::string::npos) << out.text;
  std::string timeline = dir + "/timeline.json";
  EXPECT_NE(out.text.find("timeline: " + timeline), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("report:   "), std::string::npos) << out.text;

  std::string json = readAll(timeline);
  tracecheck::Summary summary = tracecheck::check(json);
  ASSERT_EQ(summary.error, "");
  EXPECT_EQ(summary.processNames.size(), 4u);
  EXPECT_EQ(summary.processNames[3].rfind("rank 3 (", 0), 0u) << summary.processNames[3];
  EXPECT_GE(summary.byCategory["dump"], 4u);
  EXPECT_GT(summary.byCategory["verdict"], 0u);
  EXPECT_GT(summary.byCategory["running"], 40u);

  g_demoTimeline = timeline;
  g_demoEvents = summary.slices + summary.instants;
}

// Perfetto's own importer, when the perfetto package is installed (not part of CI: its trace
// processor fetches a binary at first use, which needs the internet).
TEST(Demo, PerfettoTraceProcessorLoadsTheTimeline) {
  if (g_demoTimeline.empty()) GTEST_SKIP() << "the demo test did not run";
  std::string dir = std::filesystem::path(g_demoTimeline).parent_path().string();
  std::string timeline = g_demoTimeline;
  std::string script = dir + "/count_slices.py";
  std::ofstream(script) << "import sys\n"
                           "try:\n"
                           "    from perfetto.trace_processor import TraceProcessor\n"
                           "except ImportError:\n"
                           "    sys.exit(3)\n"
                           "try:\n"
                           "    tp = TraceProcessor(trace=sys.argv[1])\n"
                           "except Exception as e:\n"
                           "    print(e)\n"
                           "    sys.exit(4)\n"
                           "n = next(iter(tp.query('select count(*) as n from slice'))).n\n"
                           "p = next(iter(tp.query(\"select count(*) as n from process where name "
                           "like 'rank %'\"))).n\n"
                           "print(n, p)\n";
  Output perfetto = command("python3 " + script + " " + timeline);
  if (perfetto.status == 3 || perfetto.status == 4) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "perfetto's trace processor is not available: " << perfetto.text;
  }
  ASSERT_EQ(perfetto.status, 0) << perfetto.text;
  size_t slices = 0, processes = 0;
  std::istringstream(perfetto.text) >> slices >> processes;
  EXPECT_EQ(slices, g_demoEvents) << perfetto.text;
  EXPECT_EQ(processes, 4u);
  std::filesystem::remove_all(dir);
}

TEST(Stragglers, SlowRank3IsTheTopStraggler) {
  std::string logs = freshDirectory("slow");
  testsupport::JobSpec spec;
  spec.program = testsupport::buildDir() + "/examples/train_loop";
  spec.args = {"--steps", "4", "--quiet", "--bug", "slow:rank=3,step=0,ms=20"};
  spec.ranks = 4;
  spec.env = {{"LD_PRELOAD", NCCLWATCH_PRELOAD}, {"NCCLWATCH_DIR", logs}};
  {
    testsupport::Job job(spec);
    ASSERT_TRUE(job.waitExit(120s)) << job.output(0);
    for (int rank = 0; rank < 4; ++rank) ASSERT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  }
  Output out = command(std::string(NCCLWATCH_BINARY) + " stragglers --no-color " + logs);
  EXPECT_EQ(out.status, 1) << out.text;
  size_t first = out.text.find("Stragglers (the others wait for them):\n  rank ");
  ASSERT_NE(first, std::string::npos) << out.text;
  EXPECT_EQ(out.text.substr(first + 41, 20), "rank 3 arrives last ") << out.text;
  EXPECT_NE(out.text.find("it is the straggler the others wait for"), std::string::npos);

  std::vector<ncclwatch::trace::TraceFile> files;
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    files.push_back(ncclwatch::trace::readTraceFile(entry.path().string()));
  }
  ncclwatch::analysis::StragglerReport report = ncclwatch::analysis::computeStragglers(files);
  ASSERT_FALSE(report.stragglers.empty());
  EXPECT_EQ(report.stragglers[0].rank, 3);
  EXPECT_GT(report.stragglers[0].medianNs, 10'000'000) << out.text;
  for (const auto& s : report.stragglers) EXPECT_EQ(s.rank, 3) << s.reading;
  std::filesystem::remove_all(logs);
}

}  // namespace
