// The profiler-plugin door end to end on the sim, whose libnccl emits profiler events through
// the real ABI:
// - plugin only: `train_loop_static` (the sim's NCCL linked into the program, so LD_PRELOAD
//   would see nothing) under `ncclwatch run --plugin-only`: every train_loop bug class gets the
//   first verdict kind and culprit that preload mode gets on `train_loop`
//   (tests/collect/live_bugs_test.cc), and a clean run gets none;
// - under LD_PRELOAD the same static program is noticed, said once, and recorded by the plugin;
// - combined (LD_PRELOAD with the plugin offered automatically): a stalled transfer's verdict
//   says where each rank waits inside NCCL: kernel channel, proxy step, its state and peer.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "command.h"
#include "job.h"
#include "traces.h"

namespace {

const std::string kCli = NCCLWATCH_BINARY;
using testsupport::readFile;

struct Expect {
  const char* bug;  // train_loop --bug KIND (rank 3, step 2)
  const char* kind;
  const char* culprits;
  bool exact = true;  // false: the culprits include these (and others)
};

void PrintTo(const Expect& e, std::ostream* out) {
  *out << e.bug;
}

// Runs train_loop_static on 8 ranks under `ncclwatch run --plugin-only`. The plugin door cannot
// abort a communicator (it never sees one), so a hung job is ended by this test: 2 s after the
// first error verdict (not a straggler note), or after 60 s, `run` gets SIGTERM (which it forwards;
// the ranks dump and end).
testsupport::Output runStatic(const std::string& logs, const std::string& loopArgs,
                              const std::string& launchFlags) {
  std::string job = "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " " + kCli +
                    " run --abort --plugin-only --dir " + logs + " -- " + kCli + " launch " +
                    launchFlags + " -n 8 -- " + NCCLWATCH_STATIC_LOOP + " " + loopArgs;
  return testsupport::command(
      job + " 2>&1 & job=$!; for i in $(seq 600); do kill -0 $job 2>/dev/null || break; " +
      testsupport::hasErrorVerdictCondition(logs) +
      " && { sleep 2; kill -TERM $job; break; }; sleep 0.1; done; " +
      "kill -0 $job 2>/dev/null && kill -TERM $job; wait $job");
}

class PluginOnlyBug : public ::testing::TestWithParam<Expect> {};

TEST_P(PluginOnlyBug, FirstVerdictHasPreloadModesKindAndCulprit) {
  const Expect& e = GetParam();
  std::string name = e.bug;
  std::string logs = testsupport::freshDirectory("plugin-bug-" + name);
  bool dies = name == "exit" || name == "crash";
  testsupport::Output out = runStatic(logs, "--steps 4 --quiet --bug " + name + ":rank=3,step=2",
                                      dies ? "--keep-going" : "");
  std::string first = testsupport::firstErrorVerdict(logs);
  ASSERT_FALSE(first.empty()) << out.text;
  EXPECT_NE(first.find(std::string("\"kind\":\"") + e.kind + "\""), std::string::npos) << first;
  if (e.exact) {
    EXPECT_NE(first.find(std::string("\"culprits\":[") + e.culprits + "]"), std::string::npos)
        << first;
  } else {
    std::string culprits = first.substr(first.find("\"culprits\":["));
    culprits = culprits.substr(0, culprits.find(']') + 1);
    EXPECT_NE(culprits.find(std::string(e.culprits)), std::string::npos) << first;
  }
  // --abort could not abort, and says so instead of claiming it did (before, the agent called
  // ncclCommAbort on NCCL's profiler context, not a communicator).
  EXPECT_NE(out.text.find("--abort with --plugin-only: verdicts are said"), std::string::npos)
      << out.text;
  if (!dies) {
    EXPECT_NE(out.text.find("not aborted: this process holds no handle to it"), std::string::npos)
        << out.text;
  }
  // Every record came from the plugin: LD_PRELOAD was not used.
  for (const auto& file : testsupport::readTraceFiles(logs)) {
    EXPECT_EQ(file.header.recordingSources, ncclwatch::trace::kSourcePlugin) << file.path;
  }
  std::filesystem::remove_all(logs);
}

// As tests/collect/live_bugs_test.cc expects of preload mode on train_loop, with one difference:
// the colour bug. Preload mode sees the disagreeing colours in the ncclCommSplit records; NCCL's
// profiler has no event for a split (a child is just a new communicator), so plugin-only mode
// first sees the consequence: the pipeline sends and receives that the wrong tensor-parallel
// group makes, an unmatched_p2p whose culprits include rank 3 among the ranks its wrong group
// drags along (docs/plugin.md).
INSTANTIATE_TEST_SUITE_P(
    Bugs, PluginOnlyBug,
    ::testing::Values(Expect{"skip", "mismatch", "3"}, Expect{"op", "mismatch", "3"},
                      Expect{"count", "mismatch", "3"}, Expect{"dtype", "mismatch", "3"},
                      Expect{"root", "mismatch", "3"}, Expect{"extra", "mismatch", "3"},
                      Expect{"peer", "unmatched_p2p", "3"},
                      Expect{"color", "unmatched_p2p", "3", false},
                      Expect{"order", "mismatch", "3"}, Expect{"exit", "dead_rank", "3"},
                      Expect{"crash", "dead_rank", "3"}),
    [](const ::testing::TestParamInfo<Expect>& info) { return std::string(info.param.bug); });

TEST(PluginOnly, ACleanRunHasNoErrorVerdict) {
  std::string logs = testsupport::freshDirectory("plugin-clean");
  testsupport::Output out = runStatic(logs, "--steps 3 --quiet", "");
  EXPECT_EQ(out.status, 0) << out.text;
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  EXPECT_EQ(verdicts.find("\"kind\":\"mismatch\""), std::string::npos) << verdicts;
  EXPECT_EQ(verdicts.find("\"kind\":\"missing\""), std::string::npos) << verdicts;
  auto files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 8u);
  for (const auto& file : files) {
    size_t completed = 0;
    for (const auto& record : file.records) {
      completed += record.state == ncclwatch::trace::RecordState::kCompleted;
    }
    // Every operation completed through its KernelCh events.
    EXPECT_EQ(completed, file.records.size()) << file.path;
  }
  std::filesystem::remove_all(logs);
}

// LD_PRELOAD on a program whose NCCL is inside it: the wrappers never run; the library notices
// through the plugin it offered NCCL, says so once per process, and records anyway.
TEST(PluginUnderPreload, AStaticNcclIsNoticedAndRecorded) {
  std::string logs = testsupport::freshDirectory("plugin-static-preload");
  testsupport::Output out = testsupport::command(
      "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " NCCLWATCH_DIR=" + logs +
      " NCCLWATCH_COLLECTOR=off LD_PRELOAD=" + testsupport::buildDir() +
      "/lib/libncclwatch.so timeout 60 " + kCli + " launch -n 2 -- " + NCCLWATCH_STATIC_LOOP +
      " --steps 2 --quiet");
  EXPECT_EQ(out.status, 0) << out.text;
  size_t said = 0;
  for (size_t at = 0;
       (at = out.text.find("do not reach the LD_PRELOAD wrappers", at)) != std::string::npos;
       ++at) {
    ++said;
  }
  EXPECT_EQ(said, 2u) << out.text;  // once per rank
  auto files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (const auto& file : files) EXPECT_GT(file.records.size(), 10u) << file.path;
  std::filesystem::remove_all(logs);
}

// Combined mode on the sim's stall fault (rank 3's call #8 of the world never finishes on its
// stream): the stuck verdict names rank 3, and says for rank 3 that its kernel started and its
// send waits on the GPU, for its peers that they wait to receive from rank 3.
TEST(PluginCombined, AStallSaysWhereEachRankWaitsInNccl) {
  std::string logs = testsupport::freshDirectory("plugin-stall");
  testsupport::Output out = testsupport::command(
      "NCCLSIM_FAULT=stall:rank=3,seq=8 LD_LIBRARY_PATH=" + testsupport::simLibDir() +
      " timeout 120 " + kCli + " run --abort --dir " + logs + " -- " + kCli + " launch -n 8 -- " +
      testsupport::buildDir() + "/examples/train_loop --steps 4 --quiet");
  EXPECT_NE(out.status, 124) << out.text;
  std::string first = testsupport::firstErrorVerdict(logs);
  EXPECT_NE(first.find("\"kind\":\"stuck\""), std::string::npos) << first << out.text;
  EXPECT_NE(first.find("\"culprits\":[3]"), std::string::npos) << first;
  EXPECT_NE(first.find("\"in_nccl\":[\"rank"), std::string::npos) << first;
  EXPECT_NE(first.find("rank 3 #8: kernel running"), std::string::npos) << first;
  EXPECT_NE(first.find("SendGPUWait"), std::string::npos) << first;
  EXPECT_NE(first.find("RecvWait from peer 3"), std::string::npos) << first;
  EXPECT_NE(out.text.find("in NCCL: rank 3 #8"), std::string::npos) << out.text;
  std::filesystem::remove_all(logs);
}

// Combined mode, one CUDA event per call (the default): the ranks left waiting by a skipped
// allreduce reached it by stream order, and NCCL's kernel events then saw it start. The start
// is seen, not inferred, so the analysis does not suspect GPU work outside NCCL ahead of it.
TEST(PluginCombined, NcclsKernelEventsMakeAnInferredStartSeen) {
  std::string logs = testsupport::freshDirectory("plugin-seen-start");
  testsupport::Output out = testsupport::command(
      "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " timeout 120 " + kCli +
      " run --abort --dir " + logs + " -- " + kCli + " launch -n 2 -- " + testsupport::buildDir() +
      "/examples/train_loop --steps 4 --tp 1 --quiet" + " --bug skip:rank=1,step=2");
  EXPECT_NE(out.status, 124) << out.text;
  int startedWaits = 0;
  for (const ncclwatch::trace::TraceFile& file : testsupport::readTraceFiles(logs)) {
    for (const ncclwatch::trace::CallRecord& r : file.records) {
      if (r.op != ncclwatch::trace::OpKind::kAllReduce || r.startNs == 0 ||
          r.state == ncclwatch::trace::RecordState::kCompleted) {
        continue;
      }
      ++startedWaits;
      EXPECT_EQ(r.flags & ncclwatch::trace::kRecordStartInferred, 0)
          << "rank " << file.header.rank << " seq " << r.seq;
    }
  }
  EXPECT_GE(startedWaits, 1) << out.text;
  std::filesystem::remove_all(logs);
}

}  // namespace
