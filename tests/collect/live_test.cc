// The collector live, on the sim: `ncclwatch run` names the skipping rank of an 8-rank job while
// it hangs (and --abort ends the job), says nothing about a clean job, and a collector that dies
// mid-run leaves the training untouched with local detection still working.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "command.h"
#include "job.h"
#include "traces.h"

extern char** environ;

namespace {

using namespace std::chrono_literals;

const std::string kCli = NCCLWATCH_BINARY;

std::string build(const std::string& path) {
  return testsupport::buildDir() + "/" + path;
}

// Runs a shell command with the sim on the library path; returns its output and exit status.
std::pair<std::string, int> shell(const std::string& command) {
  testsupport::Output out =
      testsupport::command("LD_LIBRARY_PATH=" + testsupport::simLibDir() + " " + command);
  return {out.text, out.status};
}

using testsupport::readFile;

TEST(LiveCollector, SkipBugIsNamedWhileTheJobHangsAndAbortEndsIt) {
  std::string logs = testsupport::freshDirectory("live-skip");
  auto [out, status] = shell("timeout 120 " + kCli + " run --abort --dir " + logs + " -- " + kCli +
                             " launch -n 8 -- " + build("examples/train_loop") +
                             " --steps 8 --bug skip:rank=3,step=5 --quiet");
  EXPECT_NE(status, 124) << "still hanging when the test's bound ran out\n" << out;
  EXPECT_NE(status, 0) << out;  // aborted, so the job failed instead of hanging
  EXPECT_NE(out.find("MISMATCH"), std::string::npos) << out;
  EXPECT_NE(out.find("culprit 3"), std::string::npos) << out;
  EXPECT_NE(out.find("aborting comm"), std::string::npos) << out;
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  EXPECT_NE(verdicts.find("\"kind\":\"mismatch\""), std::string::npos) << verdicts;
  EXPECT_NE(verdicts.find("\"culprits\":[3]"), std::string::npos) << verdicts;
  // The involved ranks dumped where they were, as the collector asked.
  int collectorDumps = 0;
  for (const auto& file : testsupport::readTraceFiles(logs)) {
    for (const auto& dump : file.dumps) collectorDumps += dump.trigger == "collector";
  }
  EXPECT_GE(collectorDumps, 2);
}

// Under --abort, one rank that stops issuing NCCL calls while the others wait (a dead_rank on
// timing alone: it is alive) is given --silent-rank-abort-ms more before the job is aborted for
// it: a rank saving a checkpoint looks the same for a while. Before, the job was aborted as
// soon as the quiet time ran out, a healthy job killed at its first long checkpoint.
TEST(LiveCollector, ASilentRankIsAbortedOnlyIfItStaysSilent) {
  auto runWithPause = [](const std::string& logs, int pauseMs, int holdMs, bool abort = true) {
    return shell("timeout 120 " + kCli + " run " + (abort ? "--abort " : "") +
                 "--quiet-ms 500 --silent-rank-abort-ms " + std::to_string(holdMs) + " --dir " +
                 logs + " -- " + kCli + " launch -n 4 -- " + build("examples/train_loop") +
                 " --steps 12 --step-ms 20 --quiet --bug " +
                 "pause:rank=0,step=3,ms=" + std::to_string(pauseMs));
  };
  // The verdict said at the quiet time is withdrawn once the rank issues calls again, live, in
  // verdicts.jsonl and in inspect, so that a checkpoint does not stand as the finding of a job
  // that ended well (exp25's ckpt_pause).
  auto expectWithdrawn = [](const std::string& logs, const std::string& out) {
    EXPECT_NE(out.find("withdrawn: rank 0 issued NCCL calls again"), std::string::npos) << out;
    EXPECT_NE(out.find("[ncclwatch] 0 verdicts (and 1 withdrawn"), std::string::npos) << out;
    std::string verdicts = readFile(logs + "/verdicts.jsonl");
    EXPECT_NE(verdicts.find("\"kind\":\"withdrawn\",\"withdraws\":\"dead_rank\""),
              std::string::npos)
        << verdicts;
    testsupport::Output inspect = testsupport::command(kCli + " inspect " + logs, "2>&1");
    EXPECT_NE(inspect.text.find("[withdrawn: rank 0 issued NCCL calls again"), std::string::npos)
        << inspect.text;
  };
  {
    SCOPED_TRACE("a 2.5 s pause, 20 s allowed");
    std::string logs = testsupport::freshDirectory("live-silent-resumes");
    auto [out, status] = runWithPause(logs, 2500, 20'000);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("DEAD_RANK"), std::string::npos) << out;  // the others did wait for it
    EXPECT_NE(
        out.find("rank 0 alive; the job is aborted if no NCCL call comes from it within 20 s"),
        std::string::npos)
        << out;
    EXPECT_NE(out.find("not a hang; no abort for it"), std::string::npos) << out;
    EXPECT_EQ(out.find("aborting comm"), std::string::npos) << out;
    expectWithdrawn(logs, out);
  }
  {
    // A job that came back from one long host step is not told of the next as long (exp26's
    // straggler_long: a DEAD_RANK and its withdrawal every step): twice the silence it showed.
    SCOPED_TRACE("two 2.5 s pauses: the second is not said");
    std::string logs = testsupport::freshDirectory("live-silent-twice");
    auto [out, status] =
        shell("timeout 120 " + kCli + " run --quiet-ms 500 --dir " + logs + " -- " + kCli +
              " launch -n 4 -- " + build("examples/train_loop") +
              " --steps 14 --step-ms 20 --quiet --bug pause:rank=0,step=3,ms=2500 --bug "
              "pause:rank=0,step=9,ms=2500");
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("verdicts on timing alone now wait"), std::string::npos) << out;
    size_t said = 0;
    for (size_t at = out.find("DEAD_RANK (alive but silent)"); at != std::string::npos;
         at = out.find("DEAD_RANK (alive but silent)", at + 1)) {
      ++said;
    }
    EXPECT_EQ(said, 1u) << out;
  }
  {
    SCOPED_TRACE("a 2.5 s pause, without --abort");
    std::string logs = testsupport::freshDirectory("live-silent-resumes-watched");
    auto [out, status] = runWithPause(logs, 2500, 20'000, false);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("DEAD_RANK"), std::string::npos) << out;
    expectWithdrawn(logs, out);
  }
  {
    SCOPED_TRACE("a 60 s pause, 1 s allowed");
    std::string logs = testsupport::freshDirectory("live-silent-stays");
    auto start = std::chrono::steady_clock::now();
    auto [out, status] = runWithPause(logs, 60'000, 1000);
    EXPECT_NE(status, 0) << out;
    EXPECT_NE(status, 124) << "still running when the test's bound ran out\n" << out;
    EXPECT_NE(out.find("aborting comm"), std::string::npos) << out;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << out;
  }
}

TEST(LiveCollector, CleanJobGetsNoVerdict) {
  std::string logs = testsupport::freshDirectory("live-clean");
  auto [out, status] =
      shell("timeout 120 " + kCli + " run --dir " + logs + " -- " + kCli + " launch -n 4 -- " +
            build("examples/train_loop") + " --steps 3 --quiet");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("0 verdicts"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(logs + "/verdicts.jsonl"));
}

// A collector process killed mid-run: the job finishes as if nothing happened, and a hang is
// still reported by the ranks' own watchdogs.
TEST(LiveCollector, CollectorKilledMidRunLeavesTrainingAlone) {
  std::string logs = testsupport::freshDirectory("live-killed");
  std::filesystem::create_directories(logs);
  std::string secretFile = logs + "/secret";
  std::ofstream(secretFile) << "killed-collector-secret\n";
  std::string collectorOut = logs + "/collector.out";
  pid_t collector = fork();
  if (collector == 0) {
    freopen(collectorOut.c_str(), "w", stdout);
    execl(kCli.c_str(), kCli.c_str(), "collect", "--listen", "127.0.0.1:0", "--secret-file",
          secretFile.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::smatch port;
  std::string text;
  for (int waited = 0; waited < 100; ++waited) {
    text = readFile(collectorOut);
    if (std::regex_search(text, port, std::regex("listening on port ([0-9]+)"))) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(port.empty()) << text;
  auto job = [&](const std::string& dir, std::vector<std::string> args) {
    testsupport::JobSpec spec;
    spec.program = build("examples/train_loop");
    spec.args = std::move(args);
    spec.ranks = 4;
    spec.env = {{"LD_PRELOAD", build("lib/libncclwatch.so")},
                {"NCCLWATCH_DIR", dir},
                {"NCCLWATCH_COLLECTOR", "127.0.0.1:" + port[1].str()},
                {"NCCLWATCH_SECRET", "killed-collector-secret"},
                {"NCCLWATCH_HANG_MS", "1500"},
                {"NCCLWATCH_POLL_MS", "50"}};
    return spec;
  };
  testsupport::Job clean(job(logs + "/clean", {"--steps", "60", "--quiet"}));
  std::this_thread::sleep_for(300ms);
  kill(collector, SIGKILL);
  waitpid(collector, nullptr, 0);
  // The dead collector's port stays taken (bound, not listening: connections are refused), so
  // that no collector of a test running beside this one gets it and the agents' reconnects.
  int portHolder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(port[1].str())));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int reuse = 1;
  setsockopt(portHolder, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
  bool portHeld = bind(portHolder, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ASSERT_TRUE(clean.waitExit(120s));
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(clean.exitStatus(rank), 0) << clean.output(rank);

  // No collector any more: a hang is still found and dumped by every rank itself.
  testsupport::Job hung(
      job(logs + "/hung", {"--steps", "8", "--tp", "1", "--bug", "skip:rank=1,step=2", "--quiet"}));
  bool dumped = false;
  std::string seen;  // what the trace files said at the last look
  for (int waited = 0; waited < 300 && !dumped; ++waited) {
    std::this_thread::sleep_for(100ms);
    auto files = testsupport::readTraceFiles(logs + "/hung");
    int withHangDump = 0;
    seen = std::to_string(files.size()) + " trace files;";
    for (const auto& file : files) {
      seen += " rank " + std::to_string(file.header.rank) + ":";
      for (const auto& dump : file.dumps) {
        withHangDump += dump.trigger == "hang";
        seen += " " + dump.trigger;
      }
    }
    dumped = files.size() == 4 && withHangDump == 4;
  }
  std::string outputs;
  for (int rank = 0; rank < 4; ++rank) outputs += hung.output(rank);
  EXPECT_TRUE(dumped) << seen << (portHeld ? "" : " (the dead collector's port was taken)") << "\n"
                      << outputs;
  hung.signalAll(SIGKILL);
  close(portHolder);
}

}  // namespace
