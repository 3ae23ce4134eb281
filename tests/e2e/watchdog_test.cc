// The watchdog as a user meets it in a hung job: every rank dumps soon after the hang threshold
// (stacks show the step function and the sim's wait, the skipping rank shows where it really
// is), SIGTERM and crashes dump and then behave exactly as before, a Python program's dump names
// its own functions and lines, NCCLWATCH_ON_HANG=abort makes the job fail fast, and a dump
// signal dumps without disturbing the job.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "job.h"
#include "trace/ring_reader.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using ncclwatch::trace::Dump;
using ncclwatch::trace::TraceFile;
using testsupport::Job;
using testsupport::JobSpec;

constexpr int kHangMs = 1500;
constexpr int kPollMs = 50;

JobSpec watched(const std::string& program, int ranks, const std::string& logs,
                std::vector<std::string> args, const std::string& onHang = "dump") {
  JobSpec spec;
  spec.program = program;
  spec.args = std::move(args);
  spec.ranks = ranks;
  spec.env = {{"LD_PRELOAD", testsupport::buildDir() + "/lib/libncclwatch.so"},
              {"NCCLWATCH_DIR", logs},
              {"NCCLWATCH_HANG_MS", std::to_string(kHangMs)},
              {"NCCLWATCH_WARN_MS", std::to_string(kHangMs / 2)},
              {"NCCLWATCH_POLL_MS", std::to_string(kPollMs)},
              {"NCCLWATCH_ON_HANG", onHang}};
  return spec;
}

std::string trainLoop() {
  return testsupport::buildDir() + "/examples/train_loop";
}

const Dump* findDump(const TraceFile& file, const std::string& trigger) {
  for (const Dump& dump : file.dumps) {
    if (dump.trigger == trigger) return &dump;
  }
  return nullptr;
}

// Waits until `count` files each hold a dump with `trigger`; returns them.
std::vector<TraceFile> waitForDumps(const std::string& logs, size_t count,
                                    const std::string& trigger, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<TraceFile> files;
  while (std::chrono::steady_clock::now() < deadline) {
    files = testsupport::readTraceFiles(logs);
    size_t dumped = 0;
    for (const TraceFile& file : files) dumped += findDump(file, trigger) != nullptr;
    if (files.size() == count && dumped == count) return files;
    std::this_thread::sleep_for(100ms);
  }
  return files;
}

bool hasFrame(const Dump& dump, const std::string& function) {
  for (const auto& thread : dump.threads) {
    for (const auto& frame : thread.frames) {
      if (frame.function.find(function) != std::string::npos) return true;
    }
  }
  return false;
}

// The record a finding names.
const ncclwatch::trace::CallRecord* pendingCall(const TraceFile& file,
                                                const ncclwatch::trace::DumpFinding& finding) {
  for (const auto& record : file.records) {
    if (record.commHash == finding.commHash && record.seq == finding.seq) return &record;
  }
  return nullptr;
}

// The skip bug on 8 ranks (default --tp 2): rank 3 skips one DP bucket allreduce. Every rank
// dumps within the hard threshold plus one poll of its oldest pending call's issue; the stacks
// show the step function and the sim's wait; rank 3's finding names the call it really waits
// in, a smaller bucket than its DP peers' (ranks 1, 5, 7).
TEST(Watchdog, SkipBugEveryRankDumpsWithinTheThreshold) {
  constexpr int kRanks = 8;
  std::string logs = testsupport::freshDirectory("wd-skip");
  Job job(watched(trainLoop(), kRanks, logs,
                  {"--steps", "8", "--bug", "skip:rank=3,step=5", "--quiet"}));
  std::vector<TraceFile> files = waitForDumps(logs, kRanks, "hang", 30s);
  ASSERT_EQ(files.size(), static_cast<size_t>(kRanks));
  std::map<int, std::string> dpCall;
  for (const TraceFile& file : files) {
    SCOPED_TRACE("rank " + std::to_string(file.header.rank));
    const Dump* dump = findDump(file, "hang");
    ASSERT_NE(dump, nullptr);
    ASSERT_FALSE(dump->findings.empty());
    // Onset: the oldest pending call's issue. The dump comes once it is kHangMs old, at the
    // next poll; taking it lasts a few tens of ms.
    int64_t onset = INT64_MAX;
    for (const auto& finding : dump->findings) {
      if (finding.state == "idle") continue;
      const auto* call = pendingCall(file, finding);
      ASSERT_NE(call, nullptr);
      onset = std::min(onset, call->issueNs);
      if (finding.commHash == file.comms[2].commHash)
        dpCall[file.header.rank] = finding.explanation;
    }
    int64_t delayMs = (dump->timeNs - onset) / 1'000'000;
    EXPECT_GE(delayMs, kHangMs);
    EXPECT_LE(delayMs, kHangMs + kPollMs + 250) << "dump came late";
    EXPECT_TRUE(hasFrame(*dump, "runStep")) << "train_loop's step function";
    EXPECT_TRUE(hasFrame(*dump, "cudasim::waitFor")) << "the sim's wait";
    EXPECT_EQ(dump->pythonNote, "not a Python process");
  }
  // Rank 3 skipped the 4096-element bucket: it waits in the 2048 one while its peers wait in
  // the 4096 one.
  EXPECT_NE(dpCall[3].find("AllReduce 2048 x float"), std::string::npos) << dpCall[3];
  for (int peer : {1, 5, 7}) {
    EXPECT_NE(dpCall[peer].find("AllReduce 4096 x float"), std::string::npos) << dpCall[peer];
  }
  job.signalAll(SIGKILL);
}

// SIGTERM, as torchrun sends it to survivors: a dump, then the default action, so the rank
// still dies of SIGTERM.
TEST(Watchdog, SigtermDumpsThenTerminatesAsBefore) {
  std::string logs = testsupport::freshDirectory("wd-sigterm");
  JobSpec spec =
      watched(trainLoop(), 2, logs, {"--steps", "8", "--tp", "1", "--bug", "skip:rank=1,step=2"});
  spec.env.push_back({"NCCLWATCH_HANG_MS", "600000"});  // no hang dump: only SIGTERM's
  Job job(spec);
  ASSERT_TRUE(job.waitUntilQuiet(1500ms, 30s));
  job.signalAll(SIGTERM);
  ASSERT_TRUE(job.waitExit(20s));
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(job.exitStatus(rank), 128 + SIGTERM);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (const TraceFile& file : files) {
    const Dump* dump = findDump(file, "sigterm");
    ASSERT_NE(dump, nullptr) << file.path;
    EXPECT_TRUE(hasFrame(*dump, "runStep"));
    EXPECT_EQ(file.header.cleanShutdown, 0u);
  }
}

// A crash in the application: a dump from the fatal-signal handler, then the signal's default
// action, so the exit status (and a core, where enabled) is what it would have been.
TEST(Watchdog, CrashDumpsAndKeepsTheSignal) {
  std::string logs = testsupport::freshDirectory("wd-crash");
  Job job(
      watched(trainLoop(), 2, logs, {"--steps", "4", "--tp", "1", "--bug", "crash:rank=1,step=2"}));
  // Rank 0 then waits for the crashed peer forever; rank 1's own end is what counts.
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (job.alive(1) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(job.alive(1)) << job.output(1);
  EXPECT_EQ(job.exitStatus(1), 128 + SIGSEGV) << job.output(1);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  const TraceFile& crashed = files[1];
  EXPECT_EQ(crashed.header.fatalSignal, SIGSEGV);
  const Dump* dump = findDump(crashed, "fatal-signal");
  ASSERT_NE(dump, nullptr);
  EXPECT_TRUE(hasFrame(*dump, "runStep"));
  job.signalAll(SIGKILL);
}

// NCCLWATCH_ON_HANG=abort: the hung communicators are aborted, so the job fails within the
// threshold and a few seconds instead of hanging.
TEST(Watchdog, AbortOnHangMakesTheJobFailFast) {
  std::string logs = testsupport::freshDirectory("wd-abort");
  Job job(watched(trainLoop(), 4, logs,
                  {"--steps", "6", "--tp", "1", "--bug", "skip:rank=1,step=2"}, "abort"));
  ASSERT_TRUE(job.waitExit(30s)) << "still hanging";
  int failed = 0;
  std::string output;
  for (int rank = 0; rank < 4; ++rank) {
    failed += job.exitStatus(rank) != 0;
    output += job.output(rank);
  }
  EXPECT_GT(failed, 0);
  EXPECT_NE(output.find("aborting comm"), std::string::npos) << output;
}

// A dump signal (NCCLWATCH_DUMP_SIGNAL) dumps a healthy job without disturbing it.
TEST(Watchdog, DumpSignalDumpsWithoutDisturbingTheJob) {
  std::string logs = testsupport::freshDirectory("wd-signal");
  JobSpec spec = watched(testsupport::buildDir() + "/examples/allreduce_loop", 1, logs,
                         {"--iters", "50000000", "--count", "16"});
  spec.env.push_back({"NCCLWATCH_DUMP_SIGNAL", "SIGUSR1"});
  spec.env.push_back({"NCCLSIM_INSTANT", "1"});
  Job job(spec);
  std::this_thread::sleep_for(700ms);
  job.signalAll(SIGUSR1);
  std::vector<TraceFile> files = waitForDumps(logs, 1, "signal", 10s);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(findDump(files[0], "signal"), nullptr);
  EXPECT_TRUE(job.alive(0)) << job.output(0);
  job.signalAll(SIGKILL);
}

// Debian's python3 drives the sim's NCCL through ctypes into a hang: the dump names the
// script's function and line, and the other Python thread.
TEST(Watchdog, PythonHangNamesTheScriptsFunctionAndLine) {
  std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::string script = NCCLWATCH_PYTHON_HANG_SCRIPT;
  std::string logs = testsupport::freshDirectory("wd-python");
  JobSpec spec = watched(python, 1, logs, {script});
  spec.env.push_back({"NCCLSIM_FAULT", "stall:rank=0,seq=3"});
  Job job(spec);
  std::vector<TraceFile> files = waitForDumps(logs, 1, "hang", 30s);
  ASSERT_EQ(files.size(), 1u) << job.output(0);
  const Dump* dump = findDump(files[0], "hang");
  ASSERT_NE(dump, nullptr) << job.output(0);
  int hangLine = 0, lineNumber = 0;
  std::ifstream source(script);
  for (std::string line; std::getline(source, line);) {
    ++lineNumber;
    if (line.find("# HANG LINE") != std::string::npos) hangLine = lineNumber;
  }
  bool trainStep = false, loader = false;
  for (const auto& thread : dump->pythonThreads) {
    for (const auto& frame : thread.frames) {
      if (frame.function == "train_step" && frame.line == hangLine && frame.file == script) {
        trainStep = true;
      }
      loader |= frame.function == "data_loader";
    }
  }
  EXPECT_TRUE(trainStep) << "python: " << dump->pythonNote;
  EXPECT_TRUE(loader);
  job.signalAll(SIGKILL);
}

}  // namespace
