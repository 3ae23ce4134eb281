// The collector's faults (docs/reliability.md, "The collector"): not reachable at start, killed
// mid-run, restarted, its port held by a failed attempt's sidecar, stopped (SIGSTOP). Each runs
// a sim job and asserts the job's exit code is the one without a collector, the one line the
// user sees, and what is lost (live verdicts for a while, never a training step or a trace).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "child.h"
#include "command.h"
#include "job.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ncclwatch::trace::TraceFile;
using testsupport::Job;
using testsupport::JobSpec;
using testsupport::readFile;

const std::string kCli = NCCLWATCH_BINARY;
const std::string kPreload = testsupport::buildDir() + "/lib/libncclwatch.so";
const std::string kSecret = "collector-faults-secret";

int count(const std::string& text, const std::string& needle) {
  int found = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++found;
  }
  return found;
}

// `ncclwatch collect` as a process of its own, its output in a file.
class CollectorProcess : public testsupport::Child {
 public:
  CollectorProcess(const std::string& logs, const std::string& name, int port,
                   std::vector<std::string> extra = {}, const std::string& secret = kSecret)
      : output_(logs + "/" + name + ".out") {
    std::filesystem::create_directories(logs);
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      setenv("NCCLWATCH_SECRET", secret.c_str(), 1);
      std::vector<std::string> words = {
          kCli,           "collect",          "--listen", "127.0.0.1:" + std::to_string(port),
          "--secret-env", "NCCLWATCH_SECRET", "--dir",    logs};
      words.insert(words.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~CollectorProcess() {
    if (running()) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      waitExit(5s);
    }
  }
  int port() {
    std::smatch found;
    for (int waited = 0; waited < 200; ++waited) {
      std::string text = output();
      if (std::regex_search(text, found, std::regex("listening on port ([0-9]+)"))) {
        return std::stoi(found[1]);
      }
      std::this_thread::sleep_for(50ms);
    }
    return 0;
  }
  std::string output() const { return readFile(output_); }

 private:
  std::string output_;
};

using Env = std::vector<std::pair<std::string, std::string>>;

JobSpec trainLoop(int ranks, std::vector<std::string> args, Env env) {
  JobSpec spec;
  spec.program = testsupport::buildDir() + "/examples/train_loop";
  spec.args = std::move(args);
  spec.args.push_back("--quiet");
  spec.ranks = ranks;
  spec.env = std::move(env);
  return spec;
}

Env watched(const std::string& logs, const std::string& collector) {
  return {{"LD_PRELOAD", kPreload},           {"NCCLWATCH_DIR", logs},
          {"NCCLWATCH_COLLECTOR", collector}, {"NCCLWATCH_SECRET", kSecret},
          {"NCCLWATCH_HANG_MS", "1500"},      {"NCCLWATCH_POLL_MS", "50"}};
}

int allReduces(const TraceFile& file) {
  int found = 0;
  for (const auto& record : file.records)
    found += record.op == ncclwatch::trace::OpKind::kAllReduce;
  return found;
}

// Every rank exited 0 and recorded as many allreduces as the run without a collector.
void expectCleanAndComplete(Job& job, const std::string& logs, int expectedAllReduces) {
  for (int rank = 0; rank < job.ranks(); ++rank) {
    EXPECT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  }
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(static_cast<int>(files.size()), job.ranks());
  for (const TraceFile& file : files) {
    EXPECT_EQ(allReduces(file), expectedAllReduces) << file.path;
    EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  }
}

// The allreduces a clean run of these arguments records, with no collector at all.
int baselineAllReduces(const std::string& name, int ranks, std::vector<std::string> args) {
  std::string logs = testsupport::freshDirectory(name);
  Env env = watched(logs, "off");
  Job job(trainLoop(ranks, std::move(args), env));
  EXPECT_TRUE(job.waitExit(60s));
  for (int rank = 0; rank < ranks; ++rank) EXPECT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  return files.empty() ? -1 : allReduces(files[0]);
}

// (a) Nothing listens where the collector should be: the job runs as without, and the first
// rank of the host says once, at exit, that it never reached it.
TEST(CollectorFaults, NotReachableAtStart) {
  std::vector<std::string> args = {"--steps", "30", "--step-ms", "10"};
  int expected = baselineAllReduces("unreachable-base", 2, args);
  std::string logs = testsupport::freshDirectory("unreachable");
  int port = testsupport::freeLoopbackPort();
  Job job(trainLoop(2, args, watched(logs, "127.0.0.1:" + std::to_string(port))));
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
  expectCleanAndComplete(job, logs, expected);
  std::string line = "the collector at 127.0.0.1:" + std::to_string(port) + " is not reachable";
  EXPECT_EQ(count(job.output(0), line), 1) << job.output(0);
  EXPECT_NE(job.output(0).find("Connection refused"), std::string::npos) << job.output(0);
  EXPECT_EQ(count(job.output(0), "[ncclwatch]"), 1) << job.output(0);
  EXPECT_EQ(job.output(1).find("[ncclwatch]"), std::string::npos) << job.output(1);
}

// (b) Killed mid-run: training goes on untouched, one line says the collector was lost.
TEST(CollectorFaults, KilledMidRun) {
  std::vector<std::string> args = {"--steps", "100", "--step-ms", "25"};
  int expected = baselineAllReduces("killed-base", 4, args);
  std::string logs = testsupport::freshDirectory("killed");
  CollectorProcess collector(logs, "collector", 0);
  int port = collector.port();
  ASSERT_GT(port, 0) << collector.output();
  Job job(trainLoop(4, args, watched(logs + "/job", "127.0.0.1:" + std::to_string(port))));
  std::this_thread::sleep_for(1800ms);  // a connection up for a second: the collector had it
  collector.signal(SIGKILL);
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
  expectCleanAndComplete(job, logs + "/job", expected);
  EXPECT_EQ(count(job.output(0), "lost the collector at 127.0.0.1:" + std::to_string(port)), 1)
      << job.output(0);
  EXPECT_EQ(count(job.output(0), "[ncclwatch]"), 1) << job.output(0);
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(job.output(rank).find("[ncclwatch]"), std::string::npos) << job.output(rank);
  }
}

// (c) Restarted on its port while the job runs: the agents reconnect with backoff and resend
// their rings, and the new collector names the skipping rank as the first would have.
TEST(CollectorFaults, RestartedCollectorGetsTheWindowAndTheVerdict) {
  std::string logs = testsupport::freshDirectory("restarted");
  auto first = std::make_unique<CollectorProcess>(logs, "first", 0);
  int port = first->port();
  ASSERT_GT(port, 0) << first->output();
  Job job(trainLoop(4, {"--steps", "160", "--step-ms", "25", "--bug", "skip:rank=3,step=140"},
                    watched(logs + "/job", "127.0.0.1:" + std::to_string(port))));
  std::this_thread::sleep_for(1800ms);  // a connection up for a second: the collector had it
  first->signal(SIGKILL);
  ASSERT_TRUE(first->waitExit(5s));
  CollectorProcess second(logs, "second", port, {"--listen-wait-ms", "5000"});
  ASSERT_EQ(second.port(), port) << second.output();
  auto deadline = Clock::now() + 30s;
  while (second.output().find("culprit") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  std::string verdict = second.output();
  EXPECT_NE(verdict.find("MISMATCH"), std::string::npos) << verdict;
  EXPECT_NE(verdict.find("culprit 3"), std::string::npos) << verdict;
  std::string said = job.output(0);
  EXPECT_EQ(count(said, "lost the collector at"), 1) << said;
  EXPECT_EQ(count(said, "reconnected to the collector at"), 1) << said;
  // The job hangs as it does without ncclwatch: nobody aborted it.
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(job.alive(rank)) << job.output(rank);
}

// (f) A collector of another ncclwatch release (a later protocol version): it answers HELLO with
// REFUSED, which every version reads. The job runs as without a collector, each agent tries once
// and goes on with local detection, and the first rank of the host says why in one line.
TEST(CollectorFaults, CollectorOfAnotherVersionRefusesOnce) {
  std::vector<std::string> args = {"--steps", "100", "--step-ms", "25"};
  int expected = baselineAllReduces("other-version-base", 2, args);
  std::string logs = testsupport::freshDirectory("other-version");
  int port = 0;
  int listener = testsupport::listenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  // REFUSED from version 3: magic "NWP1", type 18, version 3, length 2, reserved 0; version 3.
  const unsigned char refused[] = {0x4e, 0x57, 0x50, 0x31, 18, 0, 3, 0, 2,
                                   0,    0,    0,    0,    0,  0, 0, 3, 0};
  std::atomic<int> connections{0};
  std::atomic<bool> stop{false};
  std::thread server([&] {
    while (!stop.load()) {
      pollfd ready{listener, POLLIN, 0};
      if (poll(&ready, 1, 50) <= 0) continue;
      int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) continue;
      ++connections;
      ssize_t sent = send(fd, refused, sizeof refused, MSG_NOSIGNAL);
      (void)sent;
      // Until the agent closes: a reconnect would be a new connection.
      char buffer[4096];
      for (auto until = Clock::now() + 5s; Clock::now() < until && !stop.load();) {
        pollfd peer{fd, POLLIN, 0};
        if (poll(&peer, 1, 50) > 0 && recv(fd, buffer, sizeof buffer, 0) <= 0) break;
      }
      close(fd);
    }
  });
  Job job(trainLoop(2, args, watched(logs, "127.0.0.1:" + std::to_string(port))));
  bool exited = job.waitExit(60s);
  stop.store(true);
  server.join();
  close(listener);
  ASSERT_TRUE(exited) << job.output(0);
  expectCleanAndComplete(job, logs, expected);
  EXPECT_EQ(connections.load(), 2);  // one per rank, never again
  EXPECT_EQ(count(job.output(0), "the collector at 127.0.0.1:" + std::to_string(port) +
                                     " speaks protocol version 3, this agent version 2"),
            1)
      << job.output(0);
  EXPECT_EQ(count(job.output(0), "[ncclwatch]"), 1) << job.output(0);
  EXPECT_EQ(job.output(1).find("[ncclwatch]"), std::string::npos) << job.output(1);
}

// (d) An elastic restart: the failed attempt's sidecar still holds the port (its agents never
// came, so it would wait its full minute) when the new attempt's rank 0 starts its own, which
// waits up to 10 s for the port. The old one yields to the newer job's agents; the new attempt
// gets its collector and its verdict.
TEST(CollectorFaults, PortHeldByALingeringSidecar) {
  std::string logs = testsupport::freshDirectory("port-taken");
  int masterPort = 0, collectorPort = 0;
  for (int tries = 0; tries < 20 && collectorPort == 0; ++tries) {
    int port = testsupport::freeLoopbackPort();
    if (port > 1100 && port < 65000) {
      collectorPort = port;
      masterPort = port - 17;
    }
  }
  CollectorProcess old(logs, "old-sidecar", collectorPort, {"--until-idle"}, "old-attempt-secret");
  ASSERT_EQ(old.port(), collectorPort) << old.output();
  Env env = {{"LD_PRELOAD", kPreload},
             {"NCCLWATCH_DIR", logs + "/attempt1"},
             {"NCCLWATCH_HANG_MS", "60000"},
             {"NCCLWATCH_POLL_MS", "50"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(masterPort)},
             {"NCCLWATCH_JOB", "port-taken.attempt1"}};
  Job job(trainLoop(4, {"--steps", "80", "--step-ms", "25", "--bug", "skip:rank=3,step=40"}, env));
  auto deadline = Clock::now() + 30s;
  while (job.output(0).find("culprit") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(job.output(0).find("culprit 3"), std::string::npos)
      << job.output(0) << "\nrank 1:\n"
      << job.output(1) << "\nold sidecar:\n"
      << old.output();
  EXPECT_TRUE(old.waitExit(5s)) << old.output();
  EXPECT_EQ(count(old.output(), "leaving the port to the newer job's collector"), 1)
      << old.output();
  EXPECT_EQ(job.output(0).find("no sidecar collector"), std::string::npos) << job.output(0);
  job.signalAll(SIGKILL);
}

// (e) The collector stops reading (SIGSTOP) under a flood of calls: the job never blocks and
// finishes in about its own time, its memory stays bounded, what the collector missed is
// counted and said once at exit; the trace file has the calls.
TEST(CollectorFaults, StalledCollectorNeverBlocksTheJob) {
  // Enough calls to fill the agent's queue past its 4 MiB mark and the kernel's socket buffers:
  // records take about 15 bytes each on the wire (protocol version 2), 200,000 no longer do, and
  // 1,000,000 (15 MB) left the queue just short of the mark once the collector's reader threads
  // read faster than its one thread had (the receive buffer, autotuned by the reading rate,
  // grows larger before the stop).
  constexpr int kCalls = 1500000;
  std::string logs = testsupport::freshDirectory("stalled");
  JobSpec alone;
  alone.program = PROBE_BINARY;
  alone.args = {"calls", "--count", std::to_string(kCalls)};
  alone.env = watched(logs + "/alone", "off");
  auto started = Clock::now();
  {
    Job job(alone);
    ASSERT_TRUE(job.waitExit(120s));
    ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);
  }
  double aloneSeconds = std::chrono::duration<double>(Clock::now() - started).count();

  CollectorProcess collector(logs, "collector", 0);
  int port = collector.port();
  ASSERT_GT(port, 0) << collector.output();
  JobSpec spec = alone;
  spec.env = watched(logs + "/job", "127.0.0.1:" + std::to_string(port));
  started = Clock::now();
  Job job(spec);
  ASSERT_TRUE(job.waitForOutput(0, "calling", 20s)) << job.output(0);
  std::this_thread::sleep_for(200ms);
  collector.signal(SIGSTOP);
  ASSERT_TRUE(job.waitExit(120s)) << job.output(0);
  double stalledSeconds = std::chrono::duration<double>(Clock::now() - started).count();
  collector.signal(SIGCONT);
  std::string said = job.output(0);
  EXPECT_EQ(job.exitStatus(0), 0) << said;
  EXPECT_LT(stalledSeconds, 2 * aloneSeconds + 3) << "alone " << aloneSeconds << " s";
  EXPECT_EQ(count(said, "stopped reading"), 1) << said;
  std::smatch lost;
  ASSERT_TRUE(std::regex_search(said, lost, std::regex("\\(([0-9]+) records never sent"))) << said;
  EXPECT_GT(std::stoull(lost[1]), 0u) << said;
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs + "/job");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(files[0].problems.empty()) << files[0].problems[0].what;
  EXPECT_GT(allReduces(files[0]), 1000);  // the ring's newest calls
}

}  // namespace
