// The sidecar collector on the sim: a job started with the preload under `ncclwatch launch`
// (torchrun's variables, MASTER_ADDR and MASTER_PORT) and no NCCLWATCH_COLLECTOR gets its
// collector from rank 0, which names the skipping rank while the job hangs; the collector
// ends by itself once the job is gone; NCCLWATCH_COLLECTOR=off starts none. With
// NCCLWATCH_RELAY=on the host's agents reach it through local rank 0's relay over one
// connection, and a relay killed mid-run leaves the job whole: its agents go direct.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child.h"
#include "job.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kCli = NCCLWATCH_BINARY;

using testsupport::readFile;

// `ncclwatch launch` in the background, its output (every rank's, unprefixed) in a file.
class Launch : public testsupport::Child {
 public:
  Launch(const std::string& logs, std::vector<std::string> program,
         std::vector<std::pair<std::string, std::string>> env)
      : output_(logs + ".out") {
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      setpgid(0, 0);
      for (const char* name : {"NCCLWATCH_COLLECTOR", "NCCLWATCH_SECRET", "NCCLWATCH_JOB",
                               "NCCLWATCH_COLLECTOR_PORT", "NCCLWATCH_CLI"}) {
        unsetenv(name);
      }
      const char* path = std::getenv("LD_LIBRARY_PATH");
      setenv("LD_LIBRARY_PATH",
             (testsupport::simLibDir() + (path ? std::string(":") + path : "")).c_str(), 1);
      setenv("LD_PRELOAD", (testsupport::buildDir() + "/lib/libncclwatch.so").c_str(), 1);
      setenv("NCCLWATCH_DIR", logs.c_str(), 1);
      for (auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      std::vector<std::string> words = {kCli,          "launch",  "-n", "4",
                                        "--no-prefix", "--grace", "3",  "--"};
      words.insert(words.end(), program.begin(), program.end());
      std::vector<char*> argv;
      for (std::string& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Launch() {
    if (status_ == -1) {
      kill(-pid_, SIGKILL);
      waitExit(10s);
    }
  }

  std::string output() const { return readFile(output_); }
  bool waitForOutput(const std::string& needle, std::chrono::seconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (output().find(needle) == std::string::npos) {
      if (Clock::now() >= deadline || !running()) return output().find(needle) != std::string::npos;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  }

 private:
  std::string output_;
};

// Live `ncclwatch collect` processes started for the job whose traces go to `logs`.
std::vector<pid_t> collectorsFor(const std::string& logs) {
  return testsupport::collectorsFor(logs, true);
}

bool collectorsGone(const std::string& logs, std::chrono::seconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!collectorsFor(logs).empty()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// Whether a rank's trace shows a dump the collector asked for, within `timeout`.
bool collectorDumpsAppear(const std::string& logs, std::chrono::seconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    for (const auto& file : testsupport::readTraceFiles(logs)) {
      for (const auto& dump : file.dumps) {
        if (dump.trigger == "collector") return true;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(100ms);
  }
}

// The lines of `text` that start with `prefix`.
std::vector<std::string> linesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  }
  return lines;
}

std::string trainLoop() {
  return testsupport::buildDir() + "/examples/train_loop";
}

TEST(SidecarCollector, RankZeroHostsTheCollectorThatNamesTheSkippingRank) {
  std::string logs = testsupport::freshDirectory("sidecar-skip", true);
  {
    // --tp 1: the skipped call is on the 4-rank world, where the odd one out is clear (in a
    // 2-rank group neither side is).
    Launch job(logs,
               {trainLoop(), "--steps", "8", "--tp", "1", "--bug", "skip:rank=3,step=5", "--quiet"},
               {});
    bool said = job.waitForOutput("[ncclwatch] MISMATCH", 90s);
    std::string out = job.output();
    ASSERT_TRUE(said) << out;
    EXPECT_TRUE(job.running()) << "the job should still hang: nothing aborts it\n" << out;
    // The collector asks the ranks it names to dump where they are; let them, then stop the job
    // as a user would.
    EXPECT_TRUE(collectorDumpsAppear(logs, 30s));
    job.signal(SIGTERM);
    EXPECT_TRUE(job.waitExit(30s)) << job.output();
    out = job.output();
    std::vector<std::string> verdicts = linesStartingWith(out, "[ncclwatch] MISMATCH");
    ASSERT_EQ(verdicts.size(), 1u) << out;  // said once, by the one collector
    EXPECT_NE(out.find("culprit 3"), std::string::npos) << out;
    EXPECT_NE(out.find("collector listening on port"), std::string::npos) << out;
    EXPECT_EQ(out.find("no sidecar collector"), std::string::npos) << out;
  }
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  EXPECT_NE(verdicts.find("\"kind\":\"mismatch\""), std::string::npos) << verdicts;
  EXPECT_NE(verdicts.find("\"culprits\":[3]"), std::string::npos) << verdicts;
  // --until-idle: the collector ends about a second after the last agent left.
  EXPECT_TRUE(collectorsGone(logs, 15s));
}

TEST(SidecarCollector, CleanJobEndsAndItsCollectorWithIt) {
  std::string logs = testsupport::freshDirectory("sidecar-clean", true);
  Launch job(logs, {trainLoop(), "--steps", "3", "--quiet"}, {});
  ASSERT_TRUE(job.waitExit(60s)) << job.output();
  EXPECT_EQ(job.status(), 0) << job.output();
  EXPECT_EQ(linesStartingWith(job.output(), "[ncclwatch] MISMATCH").size(), 0u) << job.output();
  EXPECT_TRUE(collectorsGone(logs, 15s));
  EXPECT_FALSE(std::filesystem::exists(logs + "/verdicts.jsonl"));
}

// A short job whose sidecar listens only after the job ended (its start slowed here by a
// wrapper that sleeps 2 s, as a loaded machine slows the CLI's start): no agent reaches it, but
// it finds the job's trace files by its secret and says their verdict, then ends by itself.
// Before, the ranks' exit stopped it and the silent corruption went unsaid.
TEST(SidecarCollector, AJobOverBeforeItsSidecarListenedStillGetsItsVerdict) {
  if (std::string(NCCLWATCH_SCENARIOS).empty()) GTEST_SKIP() << "no scenario programs here";
  std::string logs = testsupport::freshDirectory("sidecar-late", true);
  std::string slowCli = logs + ".slow-cli.sh";
  {
    std::ofstream script(slowCli);
    script << "#!/bin/sh\nsleep 2\nexec " << kCli << " \"$@\"\n";
  }
  chmod(slowCli.c_str(), 0700);
  // Rank 2 reduces int32 where the others reduce float32: the same bytes, so NCCL completes it.
  Launch job(logs, {NCCLWATCH_SCENARIOS, "dtype_equal_bytes"}, {{"NCCLWATCH_CLI", slowCli}});
  ASSERT_TRUE(job.waitExit(60s)) << job.output();
  EXPECT_EQ(job.status(), 0) << job.output();  // NCCL completes it: silent data corruption
  // The wrapper is still asleep when the job ends: the verdict comes a few seconds later.
  auto deadline = Clock::now() + 20s;
  while (readFile(logs + "/verdicts.jsonl").empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(collectorsGone(logs, 20s));
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  EXPECT_NE(verdicts.find("\"kind\":\"mismatch\""), std::string::npos) << verdicts << job.output();
  EXPECT_NE(verdicts.find("\"culprits\":[2]"), std::string::npos) << verdicts;
  EXPECT_NE(verdicts.find("silent_data_corruption"), std::string::npos) << verdicts;
  std::filesystem::remove(slowCli);
}

TEST(SidecarCollector, OffStartsNone) {
  std::string logs = testsupport::freshDirectory("sidecar-off", true);
  Launch job(logs, {trainLoop(), "--steps", "3", "--quiet"}, {{"NCCLWATCH_COLLECTOR", "off"}});
  ASSERT_TRUE(job.waitExit(60s)) << job.output();
  EXPECT_EQ(job.status(), 0) << job.output();
  EXPECT_EQ(job.output().find("collector listening"), std::string::npos) << job.output();
  EXPECT_TRUE(collectorsFor(logs).empty());
}

// Live `ncclwatch relay` processes of the job whose traces go to `logs` (their environment is
// the relay rank's).
std::vector<pid_t> relaysFor(const std::string& logs) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = std::atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    std::string cmdline = readFile(entry.path().string() + "/cmdline");
    std::string stat = readFile(entry.path().string() + "/stat");
    size_t close = stat.rfind(')');
    bool zombie = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
    if (zombie || cmdline.find(std::string("\0relay\0", 7)) == std::string::npos) continue;
    std::string environment = readFile(entry.path().string() + "/environ");
    if (environment.find("NCCLWATCH_DIR=" + logs + std::string(1, '\0')) != std::string::npos) {
      found.push_back(pid);
    }
  }
  return found;
}

std::vector<pid_t> waitForRelay(const std::string& logs, std::chrono::seconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<pid_t> relays;
  while ((relays = relaysFor(logs)).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  return relays;
}

// Connections established to local TCP port `port`, counted on the listening side.
int connectionsTo(int port) {
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(readFile(table));
    std::string line;
    std::getline(lines, line);  // the header
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      size_t colon = local.rfind(':');
      if (colon == std::string::npos || state != "01") continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) ++count;
    }
  }
  return count;
}

TEST(SidecarRelay, TheHostsAgentsReachTheCollectorOverOneConnection) {
  std::string logs = testsupport::freshDirectory("relay-skip", true);
  {
    Launch job(logs,
               {trainLoop(), "--steps", "8", "--tp", "1", "--bug", "skip:rank=3,step=5", "--quiet"},
               {{"NCCLWATCH_RELAY", "on"}});
    EXPECT_EQ(waitForRelay(logs, 60s).size(), 1u) << job.output();
    bool said = job.waitForOutput("[ncclwatch] MISMATCH", 90s);
    ASSERT_TRUE(said) << job.output();
    EXPECT_TRUE(collectorDumpsAppear(logs, 30s));  // DUMP requests went back through the relay
    // The collector holds one connection for the host's four agents: the relay's.
    std::string out = job.output();
    const std::string listening = "collector listening on port ";
    size_t at = out.find(listening);
    ASSERT_NE(at, std::string::npos) << out;
    int port = std::atoi(out.c_str() + at + listening.size());
    EXPECT_EQ(connectionsTo(port), 1) << out;
    job.signal(SIGTERM);
    EXPECT_TRUE(job.waitExit(30s)) << job.output();
  }
  // Both end by themselves once the agents are gone.
  EXPECT_TRUE(collectorsGone(logs, 15s));
  auto deadline = Clock::now() + 15s;
  while (!relaysFor(logs).empty() && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(relaysFor(logs).empty());
  std::string out = readFile(logs + ".out");
  EXPECT_NE(out.find("culprit 3"), std::string::npos) << out;
  EXPECT_EQ(out.find("relay of this host ended"), std::string::npos) << out;
}

// The relay killed while the job runs: every agent says once that it goes direct, the job
// finishes normally, and the verdict of a fault after the kill still arrives: rank 2 stops
// for 6 s before step 12's calls while the others wait in them (past the collector's 3 s of
// quiet), then goes on, so the job ends with exit 0.
TEST(SidecarRelay, KillingTheRelayMidRunLeavesTheJobWhole) {
  std::string logs = testsupport::freshDirectory("relay-kill", true);
  Launch job(logs,
             {trainLoop(), "--steps", "16", "--step-ms", "300", "--tp", "1", "--bug",
              "pause:rank=2,step=12,ms=6000", "--quiet"},
             {{"NCCLWATCH_RELAY", "on"}});
  std::vector<pid_t> relays = waitForRelay(logs, 60s);
  ASSERT_EQ(relays.size(), 1u) << job.output();
  std::this_thread::sleep_for(1500ms);  // every agent on it (they try every 100 ms)
  ASSERT_TRUE(job.running()) << "the job ended before the relay could be killed\n" << job.output();
  ASSERT_EQ(kill(relays[0], SIGKILL), 0);
  ASSERT_TRUE(job.waitExit(120s)) << job.output();
  EXPECT_EQ(job.status(), 0) << job.output();
  EXPECT_TRUE(collectorsGone(logs, 15s));
  std::string out = readFile(logs + ".out");
  for (int rank = 0; rank < 4; ++rank) {
    std::string said =
        "[ncclwatch] rank " + std::to_string(rank) + ": the relay of this host ended";
    size_t first = out.find(said);
    EXPECT_NE(first, std::string::npos) << said << "\n" << out;
    EXPECT_EQ(out.find(said, first + 1), std::string::npos) << "said twice: " << said;
  }
  EXPECT_EQ(out.find("not reachable"), std::string::npos) << out;
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  EXPECT_NE(verdicts.find("\"culprits\":[2]"), std::string::npos) << verdicts << out;
}

}  // namespace
