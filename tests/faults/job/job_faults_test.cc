// The job's own faults and habits (docs/reliability.md, "The job's own faults and habits"): each
// runs a sim job with and without libncclwatch.so and asserts the same exit code, what the user
// sees, and that nothing is lost beyond what the row names.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "job.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::TraceFile;
using testsupport::Job;
using testsupport::JobSpec;

const std::string kPreload = testsupport::buildDir() + "/lib/libncclwatch.so";

using Env = std::vector<std::pair<std::string, std::string>>;

JobSpec probe(std::vector<std::string> args, const std::string& logs, bool watched,
              Env extra = {}) {
  JobSpec spec;
  spec.program = PROBE_BINARY;
  spec.args = std::move(args);
  if (watched) {
    spec.env = {{"LD_PRELOAD", kPreload},
                {"NCCLWATCH_DIR", logs},
                {"NCCLWATCH_COLLECTOR", "off"},
                {"NCCLWATCH_POLL_MS", "20"},
                {"ASAN_OPTIONS", "verify_asan_link_order=0"}};
  }
  spec.env.insert(spec.env.end(), extra.begin(), extra.end());
  return spec;
}

int count(const std::string& text, const std::string& needle) {
  int found = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++found;
  }
  return found;
}

int dumpsWithTrigger(const TraceFile& file, const std::string& trigger) {
  int found = 0;
  for (const auto& dump : file.dumps) found += dump.trigger == trigger;
  return found;
}

int opCount(const TraceFile& file, ncclwatch::trace::OpKind op) {
  int found = 0;
  for (const CallRecord& record : file.records) found += record.op == op;
  return found;
}

struct SignalRun {
  int status = -1;
  std::string output;
  std::vector<TraceFile> files;
  double secondsAfterFirstTerm = 0;
};

// The probe with its handlers placed as `handler` says, sent `terms` SIGTERMs 150 ms apart.
SignalRun runSignals(const std::string& name, const std::string& handler, int terms, int segvs,
                     bool watched) {
  std::string logs = testsupport::freshDirectory(name);
  Job job(probe({"signals", "--handler", handler, "--terms", std::to_string(terms), "--segv",
                 std::to_string(segvs)},
                logs, watched));
  SignalRun run;
  EXPECT_TRUE(job.waitForOutput(0, "ready", 20s)) << job.output(0);
  auto first = std::chrono::steady_clock::now();
  for (int i = 0; i < terms; ++i) {
    if (i > 0) std::this_thread::sleep_for(150ms);
    job.signalAll(SIGTERM);
  }
  EXPECT_TRUE(job.waitExit(20s)) << job.output(0);
  run.secondsAfterFirstTerm =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
  run.status = job.exitStatus(0);
  run.output = job.output(0);
  if (watched) run.files = testsupport::readTraceFiles(logs);
  return run;
}

// Repeated SIGTERM (a launcher that repeats it, a user's impatient ^C ^C): one dump, then the
// process ends exactly as without ncclwatch (143), within the dump's bound.
TEST(JobFaults, RepeatedSigtermDumpsOnceAndEndsAsWithout) {
  SignalRun bare = runSignals("sigterm-bare", "none", 3, 0, false);
  SignalRun watched = runSignals("sigterm-watched", "none", 3, 0, true);
  EXPECT_EQ(bare.status, 143) << bare.output;
  EXPECT_EQ(watched.status, bare.status) << watched.output;
  ASSERT_EQ(watched.files.size(), 1u) << watched.output;
  EXPECT_EQ(dumpsWithTrigger(watched.files[0], "sigterm"), 1) << watched.output;
  EXPECT_EQ(count(watched.output, "dump (sigterm)"), 1) << watched.output;
  EXPECT_LT(watched.secondsAfterFirstTerm, 4.0);
}

// The program's own SIGTERM and SIGSEGV handlers, installed before our first NCCL call (we chain
// to them) or after it (they replace ours). Its SIGTERM handler runs for every signal and
// decides the exit (7 at the third); its SIGSEGV handler opens a guard page 50 times, as a
// garbage collector does, and the program goes on.
class OwnHandlers : public testing::TestWithParam<std::string> {};

TEST_P(OwnHandlers, TheProgramsHandlersRunAsWithout) {
  std::string placement = GetParam();
  SignalRun bare = runSignals("handlers-bare-" + placement, placement, 3, 50, false);
  SignalRun watched = runSignals("handlers-watched-" + placement, placement, 3, 50, true);
  EXPECT_EQ(bare.status, 7) << bare.output;
  EXPECT_EQ(watched.status, bare.status) << watched.output;
  EXPECT_EQ(count(watched.output, "own SIGTERM handler"), 3) << watched.output;
  EXPECT_NE(watched.output.find("guard-page faults handled: 50"), std::string::npos)
      << watched.output;
  ASSERT_EQ(watched.files.size(), 1u) << watched.output;
  const TraceFile& file = watched.files[0];
  // The process lived through its faults: its trace must not say it died of one.
  EXPECT_EQ(file.header.fatalSignal, 0) << watched.output;
  if (placement == "before") {
    // Ours run first and chain: one dump for the first SIGTERM and one for the first fault.
    EXPECT_EQ(dumpsWithTrigger(file, "sigterm"), 1) << watched.output;
    EXPECT_EQ(dumpsWithTrigger(file, "fatal-signal"), 1) << watched.output;
  } else {
    // The program replaced our handlers: we see nothing, and change nothing.
    EXPECT_EQ(file.dumps.size(), 0u) << watched.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Placement, OwnHandlers, testing::Values("before", "after"));

// DataLoader-style workers: fork without exec (one leaves through exit(), one through _exit())
// and fork+exec. The workers and the parent end as without us; only the parent records.
TEST(JobFaults, ForkedWorkersChangeNothing) {
  std::string logs = testsupport::freshDirectory("fork");
  Job bare(probe({"fork"}, logs, false));
  Job watched(probe({"fork"}, logs, true));
  ASSERT_TRUE(bare.waitExit(30s)) << bare.output(0);
  ASSERT_TRUE(watched.waitExit(30s)) << watched.output(0);
  EXPECT_EQ(bare.exitStatus(0), 0) << bare.output(0);
  EXPECT_EQ(watched.exitStatus(0), bare.exitStatus(0)) << watched.output(0);
  EXPECT_NE(watched.output(0).find("workers failed: 0"), std::string::npos) << watched.output(0);
  EXPECT_EQ(watched.output(0).find("[ncclwatch]"), std::string::npos) << watched.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);  // the parent's; the workers made no NCCL call
  EXPECT_TRUE(files[0].problems.empty()) << files[0].problems[0].what;
  EXPECT_EQ(opCount(files[0], ncclwatch::trace::OpKind::kAllReduce), 60);
}

// 10,000 communicators created and destroyed in one process: the comm table stays bounded, the
// last communicator is still tracked (its calls carry its hash and their own sequence), and
// the trace counts the communicators its header table left out.
TEST(JobFaults, TenThousandCommunicatorsStayBounded) {
  constexpr int kComms = 10000;
  std::string logs = testsupport::freshDirectory("comms");
  Job watched(probe({"comms", "--count", std::to_string(kComms)}, logs, true));
  ASSERT_TRUE(watched.waitExit(120s)) << watched.output(0);
  EXPECT_EQ(watched.exitStatus(0), 0) << watched.output(0);
  EXPECT_EQ(watched.output(0).find("[ncclwatch]"), std::string::npos) << watched.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  const TraceFile& file = files[0];
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.commCount + file.header.droppedComms, uint64_t{kComms + 1});
  EXPECT_GT(file.header.droppedComms, 0u);
  // The last communicator's ten allreduces: one hash, consecutive sequence numbers.
  std::vector<CallRecord> last;
  for (const CallRecord& record : file.records) {
    if (record.op == ncclwatch::trace::OpKind::kAllReduce) last.push_back(record);
  }
  ASSERT_GE(last.size(), 11u);
  last.erase(last.begin(), last.end() - 10);
  for (const CallRecord& record : last) {
    EXPECT_NE(record.commHash, 0u);
    EXPECT_EQ(record.commHash, last[0].commHash);
    EXPECT_EQ(record.seq, last[0].seq + static_cast<uint64_t>(&record - last.data()));
  }
  // What was left out is said where a user looks.
  testsupport::Output shown =
      testsupport::command(std::string(NCCLWATCH_BINARY) + " show " + file.path);
  EXPECT_NE(shown.text.find(std::to_string(file.header.droppedComms)), std::string::npos)
      << shown.text;
}

// A wall-clock step of an hour, back and forward, in the middle of a 2-rank job: no false hang,
// every duration in the trace is the monotonic one.
class ClockStep : public testing::TestWithParam<int> {};

TEST_P(ClockStep, DurationsUseTheMonotonicClock) {
  int stepSeconds = GetParam();
  std::string logs = testsupport::freshDirectory("clock" + std::to_string(stepSeconds > 0));
  JobSpec spec;
  spec.program = testsupport::buildDir() + "/examples/train_loop";
  spec.args = {"--steps", "40", "--step-ms", "20", "--quiet"};
  spec.ranks = 2;
  spec.env = {{"LD_PRELOAD", std::string(CLOCK_SHIM) + ":" + kPreload},
              {"NCCLWATCH_DIR", logs},
              {"NCCLWATCH_COLLECTOR", "off"},
              {"NCCLWATCH_HANG_MS", "1000"},
              {"NCCLWATCH_POLL_MS", "20"},
              {"CLOCK_STEP_S", std::to_string(stepSeconds)},
              {"CLOCK_STEP_AFTER_MS", "300"}};
  Job job(spec);
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    std::string output = job.output(rank);
    EXPECT_EQ(job.exitStatus(rank), 0) << output;
    EXPECT_NE(output.find("realtime stepped by " + std::to_string(stepSeconds)),
              std::string::npos)
        << output;  // the step happened inside the run
    EXPECT_EQ(output.find("[ncclwatch]"), std::string::npos) << output;  // no false hang
    int completed = 0;
    for (const CallRecord& record : files[rank].records) {
      if (record.completeNs == 0) continue;
      ++completed;
      EXPECT_GE(record.completeNs, record.issueNs);
      EXPECT_LT(record.completeNs - record.issueNs, 5'000'000'000);
    }
    EXPECT_GT(completed, 40);
    EXPECT_TRUE(files[rank].dumps.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(BackAndForward, ClockStep, testing::Values(-3600, 3600));

// SIGKILL while the process takes and writes dumps, at random moments: the file stays readable
// with every record, and a dump cut short is read and named partial, never mistaken for whole.
TEST(JobFaults, SigkillDuringADumpLeavesAReadableFile) {
  std::mt19937 random(12345);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::string logs = testsupport::freshDirectory("killdump" + std::to_string(attempt));
    Job job(probe({"dumps", "--threads", "16"}, logs, true));
    ASSERT_TRUE(job.waitForOutput(0, "dumping", 20s)) << job.output(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + random() % 400));
    job.signalAll(SIGKILL);
    ASSERT_TRUE(job.waitExit(10s));
    EXPECT_EQ(job.exitStatus(0), 128 + SIGKILL);
    std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
    ASSERT_EQ(files.size(), 1u);
    const TraceFile& file = files[0];
    EXPECT_TRUE(file.usable);
    EXPECT_GE(opCount(file, ncclwatch::trace::OpKind::kAllReduce), 1);
    EXPECT_GE(file.dumps.size(), 1u);
    for (const auto& problem : file.problems) {
      EXPECT_NE(problem.what.find("is partial"), std::string::npos) << problem.what;
    }
  }
}

// The same cut made exactly: a file whose last dump lost its second half reads with that dump
// named partial and its first lines kept; zeros where its text should go on are the same.
TEST(JobFaults, APartialDumpIsNamedPartial) {
  std::string logs = testsupport::freshDirectory("partial");
  Job job(probe({"dumps", "--threads", "2"}, logs, true));
  ASSERT_TRUE(job.waitForOutput(0, "dumping", 20s)) << job.output(0);
  std::this_thread::sleep_for(300ms);
  job.signalAll(SIGKILL);
  ASSERT_TRUE(job.waitExit(10s));
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  std::string path = files[0].path;
  size_t whole = files[0].dumps.size();
  ASSERT_GE(whole, 2u);
  // The last block starts at the previous end: cut its text in half.
  uint64_t end = files[0].header.persistedBytes;
  ASSERT_GT(end, 0u);
  auto size = std::filesystem::file_size(path);
  ASSERT_GE(size, end);
  std::string bytes = testsupport::readFile(path);
  size_t lastBlock = bytes.rfind("NWDUMP", end);
  ASSERT_NE(lastBlock, std::string::npos);
  uint64_t textBytes = 0;
  std::memcpy(&textBytes, bytes.data() + lastBlock + 8, sizeof textBytes);
  std::string cutPath = logs + "/cut.bin";
  std::string zeroPath = logs + "/zeroed.bin";
  std::string cut = bytes.substr(0, lastBlock + 32 + textBytes / 2);
  std::string zeroed = bytes;
  std::fill(zeroed.begin() + static_cast<long>(lastBlock + 32 + textBytes / 2),
            zeroed.begin() + static_cast<long>(lastBlock + 32 + textBytes), '\0');
  for (const auto& [file, content] : {std::pair{cutPath, cut}, std::pair{zeroPath, zeroed}}) {
    FILE* out = std::fopen(file.c_str(), "w");
    ASSERT_NE(out, nullptr);
    std::fwrite(content.data(), 1, content.size(), out);
    std::fclose(out);
    TraceFile read = ncclwatch::trace::readTraceFile(file);
    ASSERT_EQ(read.dumps.size(), whole) << file;
    EXPECT_TRUE(read.dumps.back().partial) << file;
    EXPECT_FALSE(read.dumps.front().partial) << file;
    EXPECT_EQ(read.dumps.back().trigger, "request") << file;
    EXPECT_EQ(read.records.size(), files[0].records.size()) << file;
    ASSERT_EQ(read.problems.size(), 1u) << file;
    EXPECT_NE(read.problems[0].what.find("is partial"), std::string::npos) << read.problems[0].what;
    testsupport::Output shown =
        testsupport::command(std::string(NCCLWATCH_BINARY) + " show " + file);
    EXPECT_NE(shown.text.find("PARTIAL: the process ended while writing this dump"),
              std::string::npos)
        << shown.text;
  }
}

}  // namespace
