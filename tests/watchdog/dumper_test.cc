// Dumps taken the way the watchdog takes them: every thread's symbolized stack, even while other
// threads hammer malloc (a dump must never deadlock on a lock another thread holds), within the
// dump's bounds; and the stderr block a user reads.
#include "watchdog/dumper.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "watchdog/triggers.h"

namespace {

using namespace std::chrono_literals;
using ncclwatch::watchdog::DumpBounds;
using ncclwatch::watchdog::ProcessLabel;

std::atomic<bool> g_stop{false};

__attribute__((noinline)) void parkedInTheStep() {
  while (!g_stop.load()) std::this_thread::sleep_for(1ms);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void hammerMalloc() {
  std::vector<void*> blocks(64, nullptr);
  for (size_t i = 0; !g_stop.load(); ++i) {
    std::free(blocks[i % blocks.size()]);
    blocks[i % blocks.size()] = std::malloc(16 + (i * 7919) % 8192);
  }
  for (void* block : blocks) std::free(block);
}

bool hasFunction(const ncclwatch::trace::Dump& dump, const std::string& name) {
  for (const auto& thread : dump.threads) {
    for (const auto& frame : thread.frames) {
      if (frame.function.find(name) != std::string::npos) return true;
    }
  }
  return false;
}

TEST(Dumper, EveryThreadUnderMallocStressWithinBounds) {
  std::string error;
  ASSERT_TRUE(ncclwatch::watchdog::prepareDumps(3, &error)) << error;
  g_stop = false;
  std::vector<std::thread> threads;
  threads.emplace_back(parkedInTheStep);
  for (int i = 0; i < 3; ++i) threads.emplace_back(hammerMalloc);
  std::this_thread::sleep_for(20ms);
  constexpr int kDumps = 30;
  auto slowest = 0ms;
  for (int i = 0; i < kDumps; ++i) {
    auto start = std::chrono::steady_clock::now();
    ncclwatch::trace::Dump dump =
        ncclwatch::watchdog::takeDump("request", "stress", {}, DumpBounds{});
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    slowest = std::max(slowest, took);
    ASSERT_GE(dump.threads.size(), 5u);
    EXPECT_TRUE(hasFunction(dump, "parkedInTheStep")) << "dump " << i;
    EXPECT_EQ(dump.pythonNote, "not a Python process");
  }
  g_stop = true;
  for (auto& thread : threads) thread.join();
  // Each step is bounded: 200 ms per thread and 1.5 s of symbolizing at most.
  EXPECT_LT(slowest, 5000ms);
}

TEST(Dumper, StderrBlockSaysWhereAndWhy) {
  ncclwatch::trace::Dump dump;
  dump.trigger = "hang";
  dump.reason = "calls pending past the hang threshold";
  dump.findings.push_back({0x16b79a520202472aull, 26, "AllReduce", "started", 2003, 99,
                           "AllReduce 4096 x float pending 2.0 s"});
  dump.findings.push_back({0x24bf5918f20468fbull, 6, "-", "idle", 1900, 0, "nothing pending"});
  ncclwatch::trace::DumpThread thread;
  thread.tid = 99;
  thread.name = "train";
  thread.answered = true;
  thread.frames.push_back(
      {0x1000, "runStep(int)", 0x10, "/bin/train", 0x1000, "", "", 0, false, ""});
  dump.threads.push_back(thread);
  dump.pythonNote = "not a Python process";
  std::string block = ncclwatch::watchdog::describeDump(dump, ProcessLabel{3, 1234, "/t/x"}, true);
  EXPECT_NE(block.find("rank 3 (pid 1234)"), std::string::npos) << block;
  EXPECT_NE(block.find("comm 16b79a520202472a seq 26 AllReduce"), std::string::npos) << block;
  EXPECT_NE(block.find("waits inside the collective"), std::string::npos) << block;
  EXPECT_NE(block.find("issued by thread 99 (train)"), std::string::npos) << block;
  EXPECT_NE(block.find("runStep(int)"), std::string::npos) << block;
  EXPECT_NE(block.find("its next call is not issued"), std::string::npos) << block;
  EXPECT_NE(block.find("written to /t/x"), std::string::npos) << block;
}

// A Python thread with frames gets its line; those with none (a framework's C++ threads that
// once took the GIL) are counted on one.
TEST(Dumper, StderrBlockListsOnlyPythonThreadsWithFrames) {
  ncclwatch::trace::Dump dump;
  dump.trigger = "collector";
  dump.reason = "mismatch";
  ncclwatch::trace::DumpPythonThread main;
  main.threadId = 0x7f00;
  main.current = true;
  main.frames.push_back({"/job/train.py", 42, "step"});
  dump.pythonThreads.push_back(main);
  for (uint64_t id : {0x7f01, 0x7f02}) {
    ncclwatch::trace::DumpPythonThread empty;
    empty.threadId = id;
    dump.pythonThreads.push_back(empty);
  }
  dump.pythonNote = "CPython's _Py_DumpTracebackThreads";
  std::string block = ncclwatch::watchdog::describeDump(dump, ProcessLabel{0, 1, "/t/x"}, true);
  EXPECT_NE(block.find("python thread 7f00 (current): step (train.py:42)"), std::string::npos)
      << block;
  EXPECT_EQ(block.find("python thread 7f01"), std::string::npos) << block;
  EXPECT_NE(block.find("2 more Python threads with no Python frame"), std::string::npos) << block;
}

// A Python note that is a line of the dump (it ends with its newline) stays on the summary's
// one line.
TEST(Dumper, TheSummaryLineIsOneLineWhateverThePythonNote) {
  ncclwatch::trace::Dump dump;
  dump.trigger = "fatal-signal";
  dump.reason = "signal Aborted";
  dump.pythonNote =
      "Python stacks not available on this Python (3.11.7): the interpreter is "
      "finalized\n";
  std::string block = ncclwatch::watchdog::describeDump(dump, ProcessLabel{3, 9, "/t/x"}, true);
  EXPECT_NE(block.find("the interpreter is finalized; written to /t/x"), std::string::npos)
      << block;
}

TEST(Triggers, ARequestWithoutAWatchdogFailsAtOnce) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(ncclwatch::watchdog::Triggers::requestAndWait(2000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
}

}  // namespace
