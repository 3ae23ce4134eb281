// Dumps that do not change the program (issue 13): an NCCL program on the sim sleeps 5 s in one
// call while another of its threads asks for three dumps. With the ptrace route the sleep lasts
// its whole length without EINTR and every dump holds the sleeping thread's stack; where ptrace
// is impossible the dump falls back to the stack signal, says so and why, and still has native
// stacks (and the signal is what cuts the sleep short: the reason the ptrace route exists).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "job.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using ncclwatch::trace::Dump;
using ncclwatch::trace::TraceFile;
using testsupport::Job;
using testsupport::JobSpec;

constexpr char kPtraceRoute[] = "ptrace (no signal sent)";

struct ProbeRun {
  int status = -1;
  std::string output;
  std::vector<Dump> dumps;  // the "request" dumps of the one trace file
};

ProbeRun runProbe(const std::string& name, const std::string& wait,
                  std::vector<std::pair<std::string, std::string>> env = {},
                  std::vector<std::string> extraArgs = {}) {
  std::string logs = testsupport::freshDirectory(name);
  JobSpec spec;
  spec.program = PROBE_BINARY;
  spec.args = {"--wait", wait, "--ms", "5000", "--dumps", "3", "--threads", "8"};
  spec.args.insert(spec.args.end(), extraArgs.begin(), extraArgs.end());
  spec.env = {{"LD_PRELOAD", testsupport::buildDir() + "/lib/libncclwatch.so"},
              {"NCCLWATCH_DIR", logs},
              {"NCCLWATCH_COLLECTOR", "off"},
              {"NCCLWATCH_POLL_MS", "20"},
              // Sanitizer builds: the preloaded library comes before the probe's runtime.
              {"ASAN_OPTIONS", "verify_asan_link_order=0"}};
  spec.env.insert(spec.env.end(), env.begin(), env.end());
  Job job(spec);
  ProbeRun run;
  EXPECT_TRUE(job.waitExit(40s)) << job.output(0);
  run.status = job.exitStatus(0);
  run.output = job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  EXPECT_EQ(files.size(), 1u) << run.output;
  if (files.size() == 1) {
    for (const Dump& dump : files[0].dumps) {
      if (dump.trigger == "request") run.dumps.push_back(dump);
    }
  }
  return run;
}

// The thread whose frames name `function`, or nullptr.
const ncclwatch::trace::DumpThread* threadIn(const Dump& dump, const std::string& function) {
  for (const auto& thread : dump.threads) {
    for (const auto& frame : thread.frames) {
      if (frame.function.find(function) != std::string::npos) return &thread;
    }
  }
  return nullptr;
}

void expectWholeSleepWithPtraceDumps(const std::string& wait, const std::string& function) {
  ProbeRun run = runProbe("quiet-" + wait, wait);
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("in " + wait + ": no EINTR; dumps 3/3"), std::string::npos)
      << run.output;
  // The stderr block says how the stacks were taken.
  EXPECT_NE(run.output.find(std::string("with native stacks by ") + kPtraceRoute),
            std::string::npos)
      << run.output;
  ASSERT_EQ(run.dumps.size(), 3u) << run.output;
  for (const Dump& dump : run.dumps) {
    EXPECT_EQ(dump.stackRoute, kPtraceRoute);
    const auto* sleeper = threadIn(dump, function);
    ASSERT_NE(sleeper, nullptr) << "no thread in " << function << "\n" << run.output;
    EXPECT_TRUE(sleeper->answered);
    EXPECT_NE(threadIn(dump, "main"), nullptr);
    // Every thread of the process, each with frames: 8 idle threads, main, the requester,
    // the watchdog (and the sim's own).
    EXPECT_GE(dump.threads.size(), 11u);
    for (const auto& thread : dump.threads) {
      EXPECT_TRUE(thread.answered) << thread.tid << " " << thread.name << ": " << thread.syscall;
      EXPECT_FALSE(thread.frames.empty()) << thread.tid;
    }
    // Frames carry what offline symbolization needs, as the in-process route's do.
    const auto& top = sleeper->frames.back();
    EXPECT_FALSE(top.module.empty());
  }
}

TEST(QuietDumps, NanosleepLastsItsWholeLengthThroughThreePtraceDumps) {
  expectWholeSleepWithPtraceDumps("nanosleep", "quietSleepInNanosleep");
}

TEST(QuietDumps, PollLastsItsWholeLengthThroughThreePtraceDumps) {
  expectWholeSleepWithPtraceDumps("poll", "quietSleepInPoll");
}

// epoll_wait ends with EINTR after any stop, PTRACE_INTERRUPT's included (signal(7)): the helper
// unwinds a thread blocked in it where it sleeps, without stopping it.
TEST(QuietDumps, EpollWaitLastsItsWholeLengthThroughThreePtraceDumps) {
  expectWholeSleepWithPtraceDumps("epoll", "quietSleepInEpoll");
}

// Signal route fallback: the helper is missing. The dump says so, and its native stacks come
// from the signal, which cuts the program's nanosleep short (the harm the ptrace route avoids).
TEST(QuietDumps, MissingHelperFallsBackToTheSignalAndSaysWhy) {
  ProbeRun run =
      runProbe("quiet-nohelper", "nanosleep", {{"NCCLWATCH_CLI", "/nonexistent/ncclwatch"}});
  ASSERT_EQ(run.dumps.size(), 3u) << run.output;
  for (const Dump& dump : run.dumps) {
    EXPECT_EQ(dump.stackRoute,
              "signal SIGRTMIN+3 (fallback: cannot run /nonexistent/ncclwatch: No such file or "
              "directory (NCCLWATCH_CLI names the ncclwatch binary))");
    const auto* main = threadIn(dump, "main");
    ASSERT_NE(main, nullptr) << run.output;
    EXPECT_TRUE(main->answered);
  }
  EXPECT_NE(run.output.find("with native stacks by signal SIGRTMIN+3 (fallback: cannot run"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.status, 1) << "the signal no longer interrupts nanosleep?\n" << run.output;
  EXPECT_NE(run.output.find("Interrupted system call"), std::string::npos) << run.output;
}

TEST(QuietDumps, SignalRouteOnRequest) {
  ProbeRun run = runProbe("quiet-signal", "poll", {{"NCCLWATCH_STACK_ROUTE", "signal"}});
  ASSERT_EQ(run.dumps.size(), 3u) << run.output;
  for (const Dump& dump : run.dumps) {
    EXPECT_EQ(dump.stackRoute, "signal SIGRTMIN+3 (NCCLWATCH_STACK_ROUTE=signal)");
  }
  // The first dump's signal found the main thread in poll, and cut the poll short.
  EXPECT_NE(threadIn(run.dumps[0], "quietSleepInPoll"), nullptr) << run.output;
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_NE(run.output.find("in poll: Interrupted system call"), std::string::npos) << run.output;
}

// ptrace refused: the program made itself undumpable (and, run as root, dropped CAP_SYS_PTRACE
// from what its children may get). The helper is refused; the dump falls back with its reason.
TEST(QuietDumps, PtraceRefusedFallsBackToTheSignalWithTheHelpersReason) {
  ProbeRun run = runProbe("quiet-refused", "nanosleep", {}, {"--not-dumpable", "1"});
  ASSERT_EQ(run.dumps.size(), 3u) << run.output;
  for (const Dump& dump : run.dumps) {
    EXPECT_EQ(dump.stackRoute.rfind("signal SIGRTMIN+3 (fallback: ", 0), 0u) << dump.stackRoute;
    EXPECT_NE(dump.stackRoute.find("Operation not permitted"), std::string::npos)
        << dump.stackRoute;
    EXPECT_NE(threadIn(dump, "main"), nullptr) << run.output;
  }
}

}  // namespace
