// ncclwatch launch: the pieces (line prefixing, exit-code choice, port choice) and whole runs
// of small shell jobs through the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "launch.h"

namespace {

using ncclwatch::launch::RankExit;

struct CommandResult {
  int exitCode;
  std::string output;
};

CommandResult runCommand(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

const std::string kLaunch = std::string(NCCLWATCH_BINARY) + " launch";

TEST(LaunchLines, PrefixesCompleteLinesAndKeepsTheRest) {
  std::string pending = "first\nsecond\npart";
  EXPECT_EQ(ncclwatch::launch::takeCompleteLines(pending, "[rank 2] "),
            "[rank 2] first\n[rank 2] second\n");
  EXPECT_EQ(pending, "part");
  pending += "ial\n";
  EXPECT_EQ(ncclwatch::launch::takeCompleteLines(pending, "> "), "> partial\n");
  EXPECT_EQ(pending, "");
}

TEST(LaunchExit, FirstNonZeroInTimeOrderWins) {
  EXPECT_EQ(ncclwatch::launch::jobExitCode({{0, 0, false}, {1, 0, false}}), 0);
  EXPECT_EQ(ncclwatch::launch::jobExitCode({{2, 0, false}, {1, 139, true}, {0, 3, false}}), 139);
  EXPECT_EQ(ncclwatch::launch::describeExit({3, 139, true}),
            "rank 3 was killed by SIGSEGV (exit code 139)");
  EXPECT_EQ(ncclwatch::launch::describeExit({1, 2, false}), "rank 1 exited with code 2");
}

TEST(LaunchPorts, PairIsFree) {
  int port = ncclwatch::launch::findFreePortPair();
  EXPECT_GE(port, 1024);
  EXPECT_LT(port, 65535);
}

// The job's ports (MASTER_PORT, the one beside it, the collector's 17 above) lie outside the
// range the kernel hands to outgoing connections, where any connect() could take them before
// the job binds them (scenarios_repeat's sidecar failed with "Address already in use").
TEST(LaunchPorts, StayOutOfTheEphemeralRange) {
  auto [low, high] = ncclwatch::launch::ephemeralPorts();
  ASSERT_LE(low, high);
  for (int i = 0; i < 50; ++i) {
    int port = ncclwatch::launch::findFreePortPair();
    ASSERT_GT(port, 0);
    bool below = port + 17 < low, above = port > high;
    EXPECT_TRUE(below || above) << port << " in " << low << "-" << high;
  }
}

TEST(LaunchRun, SetsTorchrunVariablesAndPrefixesOutput) {
  CommandResult result =
      runCommand(kLaunch +
                 " -n 3 -- sh -c 'echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK "
                 "addr=$MASTER_ADDR job=${NCCLWATCH_JOB:+set}'");
  EXPECT_EQ(result.exitCode, 0) << result.output;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "] rank=" + std::to_string(rank) +
                       " world=3 local=" + std::to_string(rank) + " addr=127.0.0.1 job=set";
    EXPECT_NE(result.output.find(line), std::string::npos) << result.output;
  }
}

TEST(LaunchRun, FirstFailureStopsTheOthersWithinTheGrace) {
  auto start = std::chrono::steady_clock::now();
  CommandResult result = runCommand(
      kLaunch + " -n 3 --grace 1 -- sh -c 'if [ $RANK = 1 ]; then exit 5; fi; exec sleep 60'");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exitCode, 5) << result.output;
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(result.output.find("[ncclwatch] rank 1 exited with code 5; stopping the other ranks"),
            std::string::npos)
      << result.output;
}

TEST(LaunchRun, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  CommandResult result = runCommand(
      kLaunch +
      " -n 2 --grace 0.5 -- sh -c 'trap \"\" TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 3; fi; "
      "while true; do sleep 0.1; done'");
  EXPECT_EQ(result.exitCode, 3) << result.output;
  EXPECT_NE(result.output.find("rank 1 was killed by SIGKILL"), std::string::npos) << result.output;
}

TEST(LaunchRun, UsageErrorsAreOneLineAndExitTwo) {
  for (const char* arguments : {"", " -n 0 -- true", " -n 2", " -n two -- true"}) {
    CommandResult result = runCommand(kLaunch + arguments);
    EXPECT_EQ(result.exitCode, 2) << arguments;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1)
        << arguments << ": " << result.output;
  }
  CommandResult missing = runCommand(kLaunch + " -n 1 -- /nonexistent/program");
  EXPECT_EQ(missing.exitCode, 127) << missing.output;
  EXPECT_NE(missing.output.find("cannot run /nonexistent/program"), std::string::npos);
}

}  // namespace
