// End-to-end sim jobs of examples/train_loop and allreduce_loop: clean runs verify their results,
// every injected bug but the slow rank produces a real hang (no progress, ranks alive, no CPU),
// 64 ranks fit on this machine, and the same binary runs against the real toolkit NCCL.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "job.h"

namespace {

using namespace std::chrono_literals;
using testsupport::Job;
using testsupport::JobSpec;

std::string example(const char* name) {
  return testsupport::buildDir() + "/examples/" + name;
}

JobSpec trainLoop(int ranks, std::vector<std::string> args) {
  JobSpec spec;
  spec.program = example("train_loop");
  spec.args = std::move(args);
  spec.ranks = ranks;
  return spec;
}

// The highest "step N ok" rank 0 printed, or -1.
int lastVerifiedStep(const std::string& output) {
  int last = -1;
  static const std::regex stepLine("step ([0-9]+) ok");
  for (std::sregex_iterator it(output.begin(), output.end(), stepLine), end; it != end; ++it) {
    last = std::max(last, std::stoi((*it)[1]));
  }
  return last;
}

std::string allOutput(const Job& job) {
  std::string text;
  for (int rank = 0; rank < job.ranks(); ++rank) {
    text += "--- rank " + std::to_string(rank) + " ---\n" + job.output(rank);
  }
  return text;
}

class CleanRun : public ::testing::TestWithParam<int> {};

TEST_P(CleanRun, EveryStepVerified) {
  int ranks = GetParam();
  Job job(trainLoop(ranks, {"--steps", "4"}));
  ASSERT_TRUE(job.waitExit(90s)) << allOutput(job);
  for (int rank = 0; rank < ranks; ++rank) EXPECT_EQ(job.exitStatus(rank), 0) << allOutput(job);
  EXPECT_NE(
      job.output(0).find("train_loop: 4 steps verified on " + std::to_string(ranks) + " ranks"),
      std::string::npos)
      << job.output(0);
  EXPECT_EQ(lastVerifiedStep(job.output(0)), 3);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CleanRun, ::testing::Values(2, 4, 8));

TEST(SlowRank, SlowerButCorrect) {
  Job job(trainLoop(4, {"--steps", "3", "--bug", "slow:rank=1,step=1,ms=30"}));
  ASSERT_TRUE(job.waitExit(90s)) << allOutput(job);
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(job.exitStatus(rank), 0) << allOutput(job);
  EXPECT_NE(job.output(0).find("3 steps verified"), std::string::npos);
}

struct HangCase {
  const char* kind;
  bool bugRankDies;  // exit and crash end the bug rank; the others hang
};

void PrintTo(const HangCase& hang, std::ostream* out) {
  *out << hang.kind;
}

class InjectedBug : public ::testing::TestWithParam<HangCase> {};

// 8 ranks, the bug on rank 3 at step 2: the job must stop making progress before step 2
// completes, keep every other rank alive and idle, and stay that way until we end it.
TEST_P(InjectedBug, HangsForReal) {
  const HangCase& hang = GetParam();
  constexpr int kRanks = 8, kBugRank = 3, kBugStep = 2;
  std::string bug = std::string(hang.kind) + ":rank=" + std::to_string(kBugRank) +
                    ",step=" + std::to_string(kBugStep);
  Job job(trainLoop(kRanks, {"--steps", "6", "--bug", bug}));
  ASSERT_TRUE(job.waitUntilQuiet(1500ms, 60s)) << allOutput(job);
  bool colorBug = std::string(hang.kind) == "color";  // wrong at the split: no step completes
  int last = lastVerifiedStep(job.output(0));
  EXPECT_LT(last, colorBug ? 0 : kBugStep) << allOutput(job);
  if (!colorBug) {
    EXPECT_EQ(last, kBugStep - 1) << allOutput(job);
  }
  // A crashing rank can be quiet and still alive: under ASan its report is symbolized before it
  // exits, seconds on a loaded machine.
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (hang.bugRankDies && job.alive(kBugRank) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    bool expectAlive = !(hang.bugRankDies && rank == kBugRank);
    EXPECT_EQ(job.alive(rank), expectAlive) << "rank " << rank << "\n" << allOutput(job);
  }
  double before = job.cpuSeconds();
  std::this_thread::sleep_for(2s);
  double used = job.cpuSeconds() - before;
  EXPECT_LT(used / 2.0, 0.05) << "hung ranks used " << used << " CPU seconds in 2 s";
  EXPECT_LT(lastVerifiedStep(job.output(0)), colorBug ? 0 : kBugStep);  // still no progress
  job.signalAll(SIGKILL);
  EXPECT_TRUE(job.waitExit(10s));
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, InjectedBug,
    ::testing::Values(HangCase{"skip", false}, HangCase{"op", false}, HangCase{"count", false},
                      HangCase{"dtype", false}, HangCase{"root", false}, HangCase{"extra", false},
                      HangCase{"peer", false}, HangCase{"color", false}, HangCase{"order", false},
                      HangCase{"exit", true}, HangCase{"crash", true}),
    [](const ::testing::TestParamInfo<HangCase>& info) { return std::string(info.param.kind); });

// The example: rank 3 skips an allreduce at step 5. Its DP group (ranks 1, 3, 5, 7) waits
// inside that collective, rank 3 in its next call (a bucket of another size: a mismatch), and
// the other ranks wait at the next world collective for the missing four.
TEST(SkipBug, EachRankWaitsWhereExpected) {
  JobSpec spec = trainLoop(8, {"--steps", "8", "--bug", "skip:rank=3,step=5"});
  spec.env = {{"NCCLSIM_DEBUG", "1"}, {"NCCLSIM_DEBUG_WAIT_MS", "500"}};
  Job job(spec);
  ASSERT_TRUE(job.waitForOutput(3, "waits: mismatch", 60s)) << allOutput(job);
  ASSERT_TRUE(job.waitForOutput(0, "missing ranks 1,3,5,7", 30s)) << allOutput(job);
  std::string rank3 = job.output(3);
  EXPECT_NE(rank3.find("AllReduce(2048 x float sum) waits: mismatch"), std::string::npos) << rank3;
  for (int peer : {1, 5, 7}) {
    EXPECT_TRUE(job.waitForOutput(peer, "AllReduce(4096 x float sum) waits: mismatch", 10s))
        << job.output(peer);
  }
  EXPECT_EQ(lastVerifiedStep(job.output(0)), 4);
  for (int rank = 0; rank < 8; ++rank) EXPECT_TRUE(job.alive(rank));
}

// The same bug with one data-parallel group spanning the world (--tp 1): the seven others wait
// inside the very collective rank 3 skipped, and rank 3 waits in its next call.
TEST(SkipBug, TheOtherSevenWaitInsideThatCollective) {
  JobSpec spec = trainLoop(8, {"--tp", "1", "--steps", "8", "--bug", "skip:rank=3,step=5"});
  spec.env = {{"NCCLSIM_DEBUG", "1"}, {"NCCLSIM_DEBUG_WAIT_MS", "500"}};
  Job job(spec);
  ASSERT_TRUE(job.waitForOutput(3, "AllReduce(2048 x float sum) waits: mismatch", 60s))
      << allOutput(job);
  for (int rank = 0; rank < 8; ++rank) {
    if (rank == 3) continue;
    EXPECT_TRUE(job.waitForOutput(
        rank, "AllReduce(4096 x float sum) waits: mismatch with rank 3 AllReduce(2048", 10s))
        << job.output(rank);
  }
  EXPECT_EQ(lastVerifiedStep(job.output(0)), 4);
  double before = job.cpuSeconds();
  std::this_thread::sleep_for(2s);
  EXPECT_LT((job.cpuSeconds() - before) / 2.0, 0.05);
  for (int rank = 0; rank < 8; ++rank) EXPECT_TRUE(job.alive(rank));
}

TEST(Scale, SixtyFourRankAllReduceLoop) {
  JobSpec spec;
  spec.program = example("allreduce_loop");
  spec.args = {"--iters", "20", "--count", "256"};
  spec.ranks = 64;
  Job job(spec);
  ASSERT_TRUE(job.waitExit(180s)) << job.output(0);
  for (int rank = 0; rank < 64; ++rank) ASSERT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  EXPECT_NE(job.output(0).find("allreduce_loop: 20 iterations on 64 ranks ok"), std::string::npos);
}

// The same binaries against the toolkit's real NCCL (no GPU driver here): the version, a
// working unique id, and an error from ncclCommInitRank.
TEST(RealNccl, SameBinaryRunsAgainstTheToolkit) {
  JobSpec spec;
  spec.program = example("nccl_probe");
  spec.useSim = false;
  spec.env = {{"LD_LIBRARY_PATH", NCCLWATCH_REAL_CUDA_LIB_DIR}};
  Job job(spec);
  ASSERT_TRUE(job.waitExit(60s));
  std::string out = job.output(0);
  EXPECT_EQ(job.exitStatus(0), 0) << out;
  EXPECT_NE(out.find("ncclGetVersion: no error, version 22809"), std::string::npos) << out;
  EXPECT_NE(out.find("ncclGetUniqueId: no error"), std::string::npos) << out;
  EXPECT_NE(out.find("ncclCommInitRank: 1 (unhandled cuda error"), std::string::npos) << out;
}

}  // namespace
