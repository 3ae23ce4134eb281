// `ncclwatch stacks-of PID` (the ptrace route of dumps) on a real CPython process: every thread
// it stops carries its pthread id, and that id is the one CPython names the thread by
// (threading.get_ident(), the id a Python stack in a dump carries), so a dump joins the two
// stacks. Skipped, saying why, where there is no python3 or ptrace is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "command.h"
#include "trace/dump.h"

namespace {

// Prints "<native id> <ident>" for the main thread and a second thread, then both wait.
constexpr char kScript[] = R"(
import sys, threading
ready = threading.Event()
stop = threading.Event()
def worker():
    print(threading.get_native_id(), threading.get_ident(), flush=True)
    ready.set()
    stop.wait()
t = threading.Thread(target=worker, daemon=True)
t.start()
ready.wait()
print(threading.get_native_id(), threading.get_ident(), flush=True)
sys.stdin.read()
)";

TEST(StacksOf, EveryStoppedThreadCarriesThePthreadIdCPythonNamesItBy) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the ptrace route reads pthread ids on x86-64 only";
#endif
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  int toChild[2], fromChild[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(fromChild), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(toChild[0], 0);
    dup2(fromChild[1], 1);
    close(toChild[1]);
    close(fromChild[0]);
    execl("/usr/bin/python3", "python3", "-c", kScript, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(toChild[0]);
  close(fromChild[1]);
  FILE* lines = fdopen(fromChild[0], "r");
  std::map<int, uint64_t> identOfTid;
  for (int i = 0; i < 2; ++i) {
    unsigned long long tid = 0, ident = 0;
    ASSERT_EQ(std::fscanf(lines, "%llu %llu", &tid, &ident), 2);
    identOfTid[static_cast<int>(tid)] = ident;
  }
  testsupport::Output out = testsupport::command(
      std::string(NCCLWATCH_BINARY) + " stacks-of " + std::to_string(pid), "2>/dev/null");
  close(toChild[1]);  // ends sys.stdin.read(): the script exits
  int status = 0;
  waitpid(pid, &status, 0);
  std::fclose(lines);
  if (out.status == 3) GTEST_SKIP() << "ptrace refused here";
  ASSERT_EQ(out.status, 0) << out.text;
  ncclwatch::trace::Dump dump;
  std::string problem;
  ASSERT_TRUE(ncclwatch::trace::parseDump(out.text, &dump, &problem)) << problem << "\n"
                                                                      << out.text;
  for (const auto& [tid, ident] : identOfTid) {
    const ncclwatch::trace::DumpThread* thread = nullptr;
    for (const auto& candidate : dump.threads) {
      if (candidate.tid == tid) thread = &candidate;
    }
    ASSERT_NE(thread, nullptr) << "tid " << tid << "\n" << out.text;
    EXPECT_EQ(thread->pthreadId, ident) << "tid " << tid << "\n" << out.text;
  }
}

}  // namespace
