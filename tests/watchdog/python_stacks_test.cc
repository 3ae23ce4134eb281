// watchdog/python_stacks.h: the traceback parser (golden CPython output, garbage), the
// non-Python behaviour of this test process, and real CPython runs: every interpreter found
// (python3 on PATH, /usr/bin/python3, pyenv versions >= 3.8) runs pystack_script.py, which loads
// the probe module with ctypes and dumps the stacks of its threads through each route.
#include "watchdog/python_stacks.h"

#include <glob.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace nw = ncclwatch::watchdog;

namespace {

// Captured from CPython 3.8.18: faulthandler.dump_traceback(all_threads=True), then
// faulthandler.dump_traceback(all_threads=False).
constexpr const char* kGolden38 =
    "Thread 0x00007faf21d586c0 (most recent call first):\n"
    "  File \"/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py\", line 302 in wait\n"
    "  File \"/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py\", line 558 in wait\n"
    "  File \"gold.py\", line 4 in sleeper_one\n"
    "  File \"/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py\", line 870 in run\n"
    "  File \"/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py\", line 932 in "
    "_bootstrap_inner\n"
    "  File \"/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py\", line 890 in _bootstrap\n"
    "\n"
    "Current thread 0x00007faf225d5b80 (most recent call first):\n"
    "  File \"gold.py\", line 8 in dumper\n"
    "  File \"gold.py\", line 10 in <module>\n"
    "Stack (most recent call first):\n"
    "  File \"gold.py\", line 9 in dumper\n"
    "  File \"gold.py\", line 10 in <module>\n";

// Captured from Debian's CPython 3.11.2 through faulthandler.register(..., all_threads=True).
constexpr const char* kGolden311 =
    "Thread 0x00007f1bcc74c6c0 (most recent call first):\n"
    "  File \"/tmp/pyst/chain.py\", line 5 in worker\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 975 in run\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 1038 in _bootstrap_inner\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f1bcca07040 (most recent call first):\n"
    "  File \"/tmp/pyst/chain.py\", line 7 in <module>\n";

TEST(PythonTraceback, ParsesGolden38) {
  const auto threads = nw::parsePythonTraceback(kGolden38);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[0].threadId, 0x00007faf21d586c0u);
  EXPECT_FALSE(threads[0].current);
  ASSERT_EQ(threads[0].frames.size(), 6u);
  EXPECT_EQ(threads[0].frames[0].file, "/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py");
  EXPECT_EQ(threads[0].frames[0].line, 302);
  EXPECT_EQ(threads[0].frames[0].function, "wait");
  EXPECT_EQ(threads[0].frames[2].file, "gold.py");
  EXPECT_EQ(threads[0].frames[2].line, 4);
  EXPECT_EQ(threads[0].frames[2].function, "sleeper_one");
  EXPECT_EQ(threads[0].frames[4].function, "_bootstrap_inner");
  EXPECT_EQ(threads[1].threadId, 0x00007faf225d5b80u);
  EXPECT_TRUE(threads[1].current);
  ASSERT_EQ(threads[1].frames.size(), 2u);
  EXPECT_EQ(threads[1].frames[1].function, "<module>");
  EXPECT_EQ(threads[1].frames[1].line, 10);
  EXPECT_EQ(threads[2].threadId, 0u);  // "Stack (most recent call first):"
  EXPECT_TRUE(threads[2].current);
  ASSERT_EQ(threads[2].frames.size(), 2u);
  EXPECT_EQ(threads[2].frames[0].line, 9);
}

TEST(PythonTraceback, ParsesGolden311WithCrlf) {
  std::string text = kGolden311;
  std::string crlf;
  for (char c : text) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  for (const std::string& input : {text, crlf}) {
    const auto threads = nw::parsePythonTraceback(input);
    ASSERT_EQ(threads.size(), 2u);
    ASSERT_EQ(threads[0].frames.size(), 4u);
    EXPECT_EQ(threads[0].frames[0].file, "/tmp/pyst/chain.py");
    EXPECT_EQ(threads[0].frames[0].line, 5);
    EXPECT_EQ(threads[0].frames[0].function, "worker");
    EXPECT_EQ(threads[0].frames[3].function, "_bootstrap");
    EXPECT_TRUE(threads[1].current);
    ASSERT_EQ(threads[1].frames.size(), 1u);
    EXPECT_EQ(threads[1].frames[0].function, "<module>");
  }
}

TEST(PythonTraceback, EdgeForms) {
  // CPython's placeholders, truncation marks, a thread name (3.14 style), "???" values, a quote
  // inside a file name, notes of our own; none of it may confuse the parser.
  const char* text =
      "Python stacks not available on this Python (3.13.0): whatever\n"
      "  File \"orphan.py\", line 1 in before_any_header\n"
      "Thread 0xABCDEF [worker-1] (most recent call first):\n"
      "  <no Python frame>\n"
      "  File \"???\", line ??? in ???\n"
      "  File \"we\"ird.py\", line 7 in f\n"
      "  File \"t.py\", line 99999999999 in big\n"
      "  File \"t.py\", line 12\n"
      "  File \"t.py\", line x in bad\n"
      "  ...\n"
      "Current thread 0x0 (most recent call first):\n"
      "  Garbage-collecting\n"
      "  File \"t.py\", line 3 in \n"
      "Thread 0x12345678901234567 (most recent call first):\n"
      "Thread 0xzz (most recent call first):\n"
      "Thread 0x12\n"
      "(incomplete: timeout)\n";
  const auto threads = nw::parsePythonTraceback(text);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].threadId, 0xABCDEFu);
  ASSERT_EQ(threads[0].frames.size(), 3u);
  EXPECT_EQ(threads[0].frames[0].file, "???");
  EXPECT_EQ(threads[0].frames[0].line, -1);
  EXPECT_EQ(threads[0].frames[0].function, "???");
  EXPECT_EQ(threads[0].frames[1].file, "we\"ird.py");
  EXPECT_EQ(threads[0].frames[1].line, 7);
  EXPECT_EQ(threads[0].frames[2].line, -1);  // overflow
  EXPECT_EQ(threads[0].frames[2].function, "big");
  EXPECT_TRUE(threads[1].current);
  EXPECT_EQ(threads[1].threadId, 0u);
  ASSERT_EQ(threads[1].frames.size(), 1u);
  EXPECT_EQ(threads[1].frames[0].function, "");
}

TEST(PythonTraceback, Garbage) {
  EXPECT_TRUE(nw::parsePythonTraceback("").empty());
  EXPECT_TRUE(nw::parsePythonTraceback("\n\n\n").empty());
  EXPECT_TRUE(nw::parsePythonTraceback(std::string_view("\0\0\xff\x80", 4)).empty());
  EXPECT_TRUE(nw::parsePythonTraceback("Thread 0x").empty());
  EXPECT_TRUE(nw::parsePythonTraceback("Current thread 0x").empty());
  std::string noise;
  unsigned seed = 12345;
  for (int i = 0; i < 200000; ++i) {
    seed = seed * 1103515245u + 12345u;
    noise.push_back("Thread 0x\"File, line in\n ?(most recent call first):"[(seed >> 16) % 49]);
  }
  const auto threads = nw::parsePythonTraceback(noise);  // must simply not crash
  for (const auto& t : threads) {
    for (const auto& f : t.frames) EXPECT_LT(f.file.size(), noise.size());
  }
  // Truncated in the middle of a frame line: the partial line is dropped.
  const std::string golden = kGolden311;
  const auto cut = nw::parsePythonTraceback(golden.substr(0, golden.find("line 975")));
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(cut[0].frames.size(), 1u);
}

TEST(PythonStacks, NotPythonProcess) {
  // This test program has no CPython in it.
  std::string out = "junk";
  EXPECT_EQ(nw::preparePythonStacks(0), nw::PythonStackRoute::kNotPython);
  EXPECT_EQ(nw::preparePythonStacks(0), nw::PythonStackRoute::kNotPython);  // idempotent
  EXPECT_EQ(nw::dumpPythonStacks(&out, 4096, std::chrono::milliseconds(100)),
            nw::PythonStackRoute::kNotPython);
  EXPECT_TRUE(out.empty());
}

// ---- real CPython ----

std::string runCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  pclose(pipe);
  return output;
}

struct Interpreter {
  std::string path;
  std::string version;  // "3.11"
};

// python3 on PATH, /usr/bin/python3 and pyenv's versions, >= 3.8, deduplicated by executable.
std::vector<Interpreter> findInterpreters() {
  std::vector<std::string> candidates = {"python3", "/usr/bin/python3"};
  std::string pyenvRoot;
  if (const char* root = std::getenv("PYENV_ROOT")) {
    pyenvRoot = root;
  } else if (const char* home = std::getenv("HOME")) {
    pyenvRoot = std::string(home) + "/.pyenv";
  }
  if (!pyenvRoot.empty()) {
    glob_t found{};
    if (glob((pyenvRoot + "/versions/3.*/bin/python3").c_str(), 0, nullptr, &found) == 0) {
      for (size_t i = 0; i < found.gl_pathc; ++i) candidates.push_back(found.gl_pathv[i]);
    }
    globfree(&found);
  }
  std::vector<Interpreter> result;
  std::set<std::string> seen;
  for (const std::string& candidate : candidates) {
    const std::string answer = runCommand(
        candidate +
        " -c \"import os, sys; print('%d.%d %d %s' % (sys.version_info[0], sys.version_info[1], "
        "sys.version_info >= (3, 8), os.path.realpath(sys.executable)))\" 2>/dev/null");
    std::istringstream in(answer);
    std::string version, executable;
    int recentEnough = 0;
    if (!(in >> version >> recentEnough >> executable) || recentEnough != 1) continue;
    if (!seen.insert(executable).second) continue;
    result.push_back({candidate, version});
  }
  return result;
}

// 1-based line of the script that holds "# mark:<name>".
int markLine(const std::string& name) {
  std::ifstream script(NW_PYSTACK_SCRIPT);
  std::string line;
  for (int number = 1; std::getline(script, line); ++number) {
    if (line.find("# mark:" + name) != std::string::npos) return number;
  }
  return -1;
}

struct ScriptRun {
  int route = -1;
  int exported = -1;
  std::string dump;
  std::string raw;
};

// mode "": plain; "gil": the main thread keeps the GIL during the dump (ctypes.PyDLL), as a hung
// thread may; "blocked": see pystack_script.py.
ScriptRun runScript(const Interpreter& python, const std::string& forcedRoute,
                    const std::string& mode) {
  std::string command = "NW_PROBE_TIMEOUT_MS=" + std::string(mode == "blocked" ? "300" : "2000");
  if (!forcedRoute.empty()) command += " NCCLWATCH_PY_ROUTE=" + forcedRoute;
  command += " " + python.path + " " NW_PYSTACK_SCRIPT " " NW_PYSTACK_PROBE " " + mode + " 2>&1";
  ScriptRun run;
  run.raw = runCommand(command);
  std::istringstream in(run.raw);
  std::string line;
  bool inDump = false;
  while (std::getline(in, line)) {
    if (line == "END-DUMP") inDump = false;
    if (inDump) run.dump += line + "\n";
    if (line == "BEGIN-DUMP") inDump = true;
    if (line.rfind("ROUTE ", 0) == 0) run.route = std::atoi(line.c_str() + 6);
    if (line.rfind("EXPORTED ", 0) == 0) run.exported = std::atoi(line.c_str() + 9);
  }
  return run;
}

const nw::PythonFrame* findFrame(const std::vector<nw::PythonThreadStack>& threads,
                                 const std::string& function, bool* current) {
  for (const auto& thread : threads) {
    for (const auto& frame : thread.frames) {
      if (frame.function == function) {
        *current = thread.current;
        return &frame;
      }
    }
  }
  return nullptr;
}

void checkDump(const ScriptRun& run) {
  const auto threads = nw::parsePythonTraceback(run.dump);
  EXPECT_GE(threads.size(), 3u) << run.raw;
  struct Expected {
    const char* function;
    const char* mark;
  };
  for (const Expected& expected :
       {Expected{"worker_alpha", "alpha"}, Expected{"worker_beta", "beta"},
        Expected{"main_waits_here", "main"}}) {
    bool current = false;
    const nw::PythonFrame* frame = findFrame(threads, expected.function, &current);
    ASSERT_NE(frame, nullptr) << expected.function << " missing in:\n" << run.raw;
    EXPECT_EQ(frame->file, NW_PYSTACK_SCRIPT);
    EXPECT_EQ(frame->line, markLine(expected.mark)) << expected.function;
  }
}

TEST(PythonStacks, RealCPythonEveryRoute) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the probe module cannot load into an uninstrumented python";
#endif
  const std::vector<Interpreter> interpreters = findInterpreters();
  if (interpreters.empty()) GTEST_SKIP() << "no CPython >= 3.8 found";
  ASSERT_GT(markLine("alpha"), 0);
  for (const Interpreter& python : interpreters) {
    SCOPED_TRACE(python.path + " (" + python.version + ")");
    for (bool holdGil : {false, true}) {
      SCOPED_TRACE(holdGil ? "GIL held by the main thread" : "GIL released");
      // Automatic: the best route this Python offers.
      const ScriptRun automatic = runScript(python, "", holdGil ? "gil" : "");
      ASSERT_NE(automatic.exported, -1) << automatic.raw;
      if (automatic.exported != 1) {
        // No exported dumper: one clear line pointing at the opt-in faulthandler route.
        EXPECT_EQ(automatic.route, static_cast<int>(nw::PythonStackRoute::kUnavailable))
            << automatic.raw;
        EXPECT_NE(automatic.dump.find("NCCLWATCH_PY_ROUTE=faulthandler"), std::string::npos)
            << automatic.raw;
        continue;
      }
      EXPECT_EQ(automatic.route, static_cast<int>(nw::PythonStackRoute::kDumpTracebackThreads))
          << automatic.raw;
      checkDump(automatic);
      std::printf("%s %s%s: automatic route %d\n", python.path.c_str(), python.version.c_str(),
                  holdGil ? " (GIL held)" : "", automatic.route);
      // The opt-in faulthandler route, where the dumper route works too.
      {
        const ScriptRun forced = runScript(python, "faulthandler", holdGil ? "gil" : "");
        EXPECT_EQ(forced.route, static_cast<int>(nw::PythonStackRoute::kFaulthandler))
            << forced.raw;
        checkDump(forced);
        std::printf("%s %s%s: forced faulthandler route %d\n", python.path.c_str(),
                    python.version.c_str(), holdGil ? " (GIL held)" : "", forced.route);
      }
    }
    // Disabled: one clear line.
    const ScriptRun off = runScript(python, "off", "");
    EXPECT_EQ(off.route, static_cast<int>(nw::PythonStackRoute::kUnavailable)) << off.raw;
    EXPECT_NE(off.dump.find("Python stacks not available on this Python (" + python.version),
              std::string::npos)
        << off.raw;
  }
}

// The main thread blocks the faulthandler signal: the dump gives up after its timeout, the next
// one refuses to send again while the first is outstanding, and once the main thread unblocks
// the signal, dumps work again.
TEST(PythonStacks, FaulthandlerMainThreadBlocksSignal) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the probe module cannot load into an uninstrumented python";
#endif
  const std::vector<Interpreter> interpreters = findInterpreters();
  if (interpreters.empty()) GTEST_SKIP() << "no CPython >= 3.8 found";
  const ScriptRun run = runScript(interpreters.front(), "faulthandler", "blocked");
  EXPECT_NE(run.raw.find("BLOCKED 3 Python stacks not available on this Python"), std::string::npos)
      << run.raw;
  EXPECT_NE(run.raw.find("did not finish the faulthandler dump within 300 ms"), std::string::npos)
      << run.raw;
  EXPECT_NE(run.raw.find("has not run the previous faulthandler dump"), std::string::npos)
      << run.raw;
  EXPECT_EQ(run.route, static_cast<int>(nw::PythonStackRoute::kFaulthandler)) << run.raw;
  checkDump(run);
}

}  // namespace
