// ncclwatch under the launchers users run: OpenMPI's mpirun, torchrun (native ranks; its
// crash handling and elastic restarts), plain LD_PRELOAD with the rank-0 sidecar, and a job on
// two (simulated) hosts with one collector. Each names the rank a user would blame.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "command.h"
#include "job.h"
#include "launch.h"
#include "traces.h"

namespace {

const std::string kCli = NCCLWATCH_BINARY;
const std::string kTorchrun = std::string(NCCLWATCH_TORCH_VENV) + "/bin/torchrun";

std::string loop() {
  return testsupport::buildDir() + "/examples/train_loop";
}
std::string preload() {
  return testsupport::buildDir() + "/lib/libncclwatch.so";
}
std::string sim() {
  return "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " ";
}

bool haveTorchrun() {
  return access(kTorchrun.c_str(), X_OK) == 0;
}

TEST(Mpirun, RanksFromOpenMpiAndOneJobId) {
  if (testsupport::command("command -v mpirun").status != 0) {
    GTEST_SKIP() << "no mpirun (Debian's openmpi-bin; scripts/setup.sh installs it)";
  }
  std::string logs = testsupport::freshDirectory("launch-mpirun");
  testsupport::Output out = testsupport::command(
      sim() + "timeout 120 " + kCli + " run --abort --dir " + logs +
      " -- mpirun --allow-run-as-root --oversubscribe -np 8 -x LD_PRELOAD -x LD_LIBRARY_PATH"
      " -x NCCLWATCH_COLLECTOR -x NCCLWATCH_SECRET -x NCCLWATCH_DIR " +
      loop() + " --steps 4 --quiet --bug skip:rank=3,step=2");
  std::string first = testsupport::firstErrorVerdict(logs);
  EXPECT_NE(first.find("\"kind\":\"mismatch\""), std::string::npos) << first << out.text;
  EXPECT_NE(first.find("\"culprits\":[3]"), std::string::npos) << first;
  // One job: OpenMPI's job id names it (each rank would otherwise be a job of its own).
  EXPECT_NE(first.find("\"job\":\"mpi-"), std::string::npos) << first;
  std::filesystem::remove_all(logs);
}

TEST(TwoHosts, OneCollectorNamesTheRankOnTheOtherHost) {
  if (testsupport::command("unshare --uts true").status != 0) {
    GTEST_SKIP() << "unshare --uts is not permitted here (needs root or user namespaces)";
  }
  std::string logs = testsupport::freshDirectory("launch-two-hosts");
  testsupport::Output out =
      testsupport::command(sim() + "timeout 120 " + kCli + " run --abort --dir " + logs + " -- " +
                           kCli + " launch -n 8 -- " NCCLWATCH_TWO_HOSTS " " + loop() +
                           " --steps 4 --quiet --bug skip:rank=5,step=2");
  std::string first = testsupport::firstErrorVerdict(logs);
  EXPECT_NE(first.find("\"culprits\":[5]"), std::string::npos) << first << out.text;
  std::set<std::string> hosts;
  for (const auto& file : testsupport::readTraceFiles(logs)) hosts.insert(file.header.host);
  EXPECT_EQ(hosts, (std::set<std::string>{"nodeA", "nodeB"}));
  testsupport::Output inspect = testsupport::command(kCli + " inspect " + logs);
  EXPECT_NE(inspect.text.find("8 of 8 ranks traced on 2 hosts"), std::string::npos) << inspect.text;
  std::filesystem::remove_all(logs);
}

class Torchrun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!haveTorchrun()) {
      GTEST_SKIP() << "no torchrun in " << NCCLWATCH_TORCH_VENV
                   << " (scripts/torch_venv.sh installs it; needs PyPI)";
    }
  }
  // torchrun with native ranks (--no-python) and its static rendezvous on a port that `ncclwatch
  // launch` would choose: outside the ephemeral range, with the port beside it (the examples'
  // NCCL id) and the sidecar's free. --standalone's store takes an ephemeral port, and the one
  // beside it was once taken by another test's connection ("Address already in use").
  std::string torchrun(const std::string& flags, const std::string& loopArgs) {
    masterPort = ncclwatch::launch::findFreePortPair();
    return kTorchrun + " --nnodes=1 --node-rank=0 --master-addr=127.0.0.1 --master-port=" +
           std::to_string(masterPort) + " --nproc_per_node=4 " + flags + " --no-python " + loop() +
           " " + loopArgs;
  }
  int masterPort = 0;
};

TEST_F(Torchrun, UnderRunAndWithTheSidecarAlone) {
  std::string logs = testsupport::freshDirectory("launch-torchrun-run");
  testsupport::Output out =
      testsupport::command(sim() + "timeout 120 " + kCli + " run --abort --dir " + logs + " -- " +
                           torchrun("", "--steps 4 --quiet --tp 1 --bug skip:rank=1,step=2"));
  std::string first = testsupport::firstErrorVerdict(logs);
  EXPECT_NE(first.find("\"culprits\":[1]"), std::string::npos) << first << out.text;
  std::filesystem::remove_all(logs);

  // No `ncclwatch run`: rank 0's sidecar collector at MASTER_ADDR:MASTER_PORT+17.
  logs = testsupport::freshDirectory("launch-torchrun-sidecar");
  out = testsupport::command(
      sim() + "LD_PRELOAD=" + preload() + " NCCLWATCH_DIR=" + logs + " timeout 60 " +
      torchrun("", "--steps 4 --quiet --tp 1 --bug skip:rank=1,step=2") +
      " 2>&1 & job=$!; for i in $(seq 300); do " + testsupport::hasErrorVerdictCondition(logs) +
      " && break; sleep 0.1; done; sleep 1; kill -TERM "
      "$job; wait $job");
  first = testsupport::firstErrorVerdict(logs);
  EXPECT_NE(first.find("\"culprits\":[1]"), std::string::npos) << first << out.text;
  EXPECT_NE(out.text.find("[ncclwatch] MISMATCH"), std::string::npos) << out.text;
  std::filesystem::remove_all(logs);
}

// A rank crashes; torchrun stops the others with SIGTERM: every rank's trace holds a dump (the
// crash's own, the others' SIGTERM ones) telling where it was.
TEST_F(Torchrun, ACrashLeavesEveryRanksDump) {
  std::string logs = testsupport::freshDirectory("launch-torchrun-crash");
  testsupport::Output out =
      testsupport::command(sim() + "LD_PRELOAD=" + preload() + " NCCLWATCH_DIR=" + logs +
                           " NCCLWATCH_COLLECTOR=off timeout 120 " +
                           torchrun("", "--steps 6 --quiet --tp 1 --bug crash:rank=2,step=2"));
  EXPECT_NE(out.status, 0) << out.text;
  auto files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 4u) << out.text;
  for (const auto& file : files) {
    ASSERT_FALSE(file.dumps.empty()) << "rank " << file.header.rank << "\n" << out.text;
    const std::string& trigger = file.dumps.back().trigger;
    if (file.header.rank == 2) {
      EXPECT_EQ(trigger, "fatal-signal") << trigger;
    } else {
      EXPECT_EQ(trigger, "sigterm") << "rank " << file.header.rank;
    }
  }
  std::filesystem::remove_all(logs);
}

// --max-restarts=1: the crash repeats in the second attempt; each attempt is a job of its own,
// and inspect reports them apart.
TEST_F(Torchrun, MaxRestartsKeepsAttemptsApart) {
  std::string logs = testsupport::freshDirectory("launch-torchrun-restart");
  testsupport::Output out = testsupport::command(
      sim() + "LD_PRELOAD=" + preload() + " NCCLWATCH_DIR=" + logs +
      " NCCLWATCH_COLLECTOR=off timeout 180 " +
      torchrun("--max-restarts=1", "--steps 6 --quiet --tp 1 --bug crash:rank=2,step=2"));
  EXPECT_NE(out.status, 0) << out.text;
  auto files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 8u) << out.text;
  std::set<std::string> jobs;
  for (const auto& file : files) jobs.insert(file.header.jobId);
  // The static rendezvous names every run "none": the job is named after its store instead.
  std::string job = "torchrun-127.0.0.1-" + std::to_string(masterPort);
  EXPECT_EQ(jobs, (std::set<std::string>{job, job + ".attempt1"}));
  testsupport::Output inspect = testsupport::command(kCli + " inspect " + logs);
  std::regex attemptLine("Job [^:]+: 4 of 4 ranks traced.*");
  std::istringstream lines(inspect.text);
  int reported = 0;
  for (std::string line; std::getline(lines, line);)
    reported += std::regex_match(line, attemptLine);
  EXPECT_EQ(reported, 2) << inspect.text;
  std::filesystem::remove_all(logs);
}

}  // namespace
