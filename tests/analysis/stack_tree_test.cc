// The STAT-style stack merge on synthetic dumps: prefix tree with rank sets on every edge,
// equivalence classes with representatives, the thread that matters, function versus
// module+offset keys, ranks without dumps, Python trees, mixed Python/native stacks (one
// against golden/stacks_mixed.txt), JSON, and the HTML page's escaping.
#include "analysis/stack_tree.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "report.h"

namespace {

using ncclwatch::analysis::FrameKey;
using ncclwatch::analysis::RankDump;
using ncclwatch::analysis::StackOptions;
using ncclwatch::analysis::StackReport;
using ncclwatch::trace::Dump;
using ncclwatch::trace::DumpFrame;
using ncclwatch::trace::DumpThread;

DumpFrame frame(const std::string& function, uint64_t offset = 0x10,
                const std::string& module = "/usr/lib/libx.so") {
  DumpFrame f;
  f.function = function;
  f.module = module;
  f.moduleOffset = offset;
  f.buildId = "abcd";
  return f;
}

// Frames outermost first (as a reader thinks of them); dumps hold them innermost first.
DumpThread thread(int tid, const std::string& name, std::vector<DumpFrame> outermostFirst) {
  DumpThread t;
  t.tid = tid;
  t.name = name;
  t.answered = true;
  t.frames.assign(outermostFirst.rbegin(), outermostFirst.rend());
  return t;
}

Dump trainDump(int pid, bool skipped) {
  Dump d;
  d.trigger = "hang";
  d.pythonNote = "not a Python process";
  d.threads.push_back(thread(pid, "train",
                             {frame("main"), frame("runStep"),
                              frame(skipped ? "syncGrads" : "allReduceBucket"), frame("waitFor")}));
  d.threads.push_back(thread(pid + 1, "watchdog", {frame("start_thread"), frame("Agent::run")}));
  return d;
}

std::string treeText(const ncclwatch::analysis::StackTree& tree) {
  std::ostringstream out;
  ncclwatch::analysis::printStackTree(tree, out);
  return out.str();
}

TEST(StackTree, MergesIntoClassesWithRankSetsOnEveryEdge) {
  std::vector<Dump> dumps;
  for (int r = 0; r < 8; ++r) dumps.push_back(trainDump(100 + 10 * r, r == 5));
  std::vector<RankDump> ranks;
  for (int r = 7; r >= 0; --r) {  // any order
    ranks.push_back({r, &dumps[r], ncclwatch::analysis::keyThreadOf(dumps[r], 100 + 10 * r)});
  }
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, {});
  ASSERT_EQ(report.classes.size(), 2u);
  EXPECT_EQ(report.classes[0].ranks, (std::vector<int>{0, 1, 2, 3, 4, 6, 7}));
  EXPECT_EQ(report.classes[0].representative, 0);
  EXPECT_EQ(report.classes[1].ranks, (std::vector<int>{5}));
  EXPECT_EQ(report.classes[1].representative, 5);
  EXPECT_EQ(report.classes[1].path,
            (std::vector<std::string>{"main", "runStep", "syncGrads", "waitFor"}));
  EXPECT_EQ(treeText(report.native),
            "[0-7] main\n"
            "[0-7] runStep\n"
            "\u251c\u2500[0-4,6-7] allReduceBucket\n"
            "\u2502 [0-4,6-7] waitFor\n"
            "\u2514\u2500[5] syncGrads\n"
            "  [5] waitFor\n");
  EXPECT_TRUE(report.python.empty());
  EXPECT_EQ(report.pythonNote, "not a Python process");
  EXPECT_EQ(report.notes.size(), 8u);
  EXPECT_EQ(report.notes[5].thread, "train (tid 150)");
}

// A dump taken while a thread waits in ncclwatch's own SIGTERM handler (torchrun stopping the
// ranks during a collector's dump) shows the handler and the signal trampoline above where the
// signal found the program: those frames are cut, and the rank joins the class of the ranks
// waiting in the same place (it was one of its own, and pytorch_hangs flaked on it).
TEST(StackTree, OurSignalHandlersFramesAreNotWhereTheProgramIs) {
  const std::string lib = "/opt/ncclwatch/lib/libncclwatch.so";
  const std::string libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
  std::vector<Dump> dumps(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<DumpFrame> frames = {frame("main"), frame("runStep"),
                                     frame("cudaStreamSynchronize", 0x48, "/usr/lib/libcudart.so"),
                                     frame("pthread_cond_wait", 0x1e8, libc)};
    if (r == 1) {
      frames.push_back(frame("", 0x3c050, libc));  // the kernel's signal trampoline
      frames.push_back(
          frame("ncclwatch::watchdog::(anonymous namespace)::onSignal(int, "
                "siginfo_t*, void*)",
                0x186, lib));
      frames.push_back(frame(
          "ncclwatch::watchdog::(anonymous namespace)::waitFor(unsigned long, int)", 0x39, lib));
      frames.push_back(frame("__nanosleep", 0x13, libc));
    }
    dumps[r].trigger = "collector";
    dumps[r].threads.push_back(thread(100 + r, "train", frames));
  }
  std::vector<RankDump> ranks = {{0, &dumps[0], 100}, {1, &dumps[1], 101}};
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, {});
  ASSERT_EQ(report.classes.size(), 1u) << treeText(report.native);
  EXPECT_EQ(report.classes[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(report.classes[0].path.back(), "pthread_cond_wait");
  // The merged tree's label of a frame without a name is its module and offset; none is left.
  EXPECT_EQ(treeText(report.native).find("onSignal"), std::string::npos) << treeText(report.native);
  EXPECT_EQ(treeText(report.native).find("libc.so.6+0x3c050"), std::string::npos)
      << treeText(report.native);
}

TEST(StackTree, TheThreadThatIssuedTheHungCallMatters) {
  Dump d = trainDump(100, false);
  d.threads.push_back(thread(107, "worker", {frame("start_thread"), frame("issueLoop")}));
  ncclwatch::trace::DumpFinding idle;
  idle.state = "idle";
  idle.threadId = 101;
  d.findings.push_back(idle);
  EXPECT_EQ(ncclwatch::analysis::keyThreadOf(d, 100), 100) << "idle findings do not count";
  ncclwatch::trace::DumpFinding hung;
  hung.state = "started";
  hung.threadId = 107;
  hung.ageMs = 1600;
  d.findings.push_back(hung);
  EXPECT_EQ(ncclwatch::analysis::keyThreadOf(d, 100), 107);
  EXPECT_EQ(ncclwatch::analysis::keyThreadOf(trainDump(100, false), 999), 100)
      << "no main thread: the first";
  EXPECT_EQ(ncclwatch::analysis::keyThreadOf(Dump{}, 1), 0);
}

TEST(StackTree, AllThreadsMergesEveryThreadButClassesFollowTheThreadThatMatters) {
  std::vector<Dump> dumps = {trainDump(100, false), trainDump(200, true)};
  std::vector<RankDump> ranks = {{0, &dumps[0], 100}, {1, &dumps[1], 200}};
  StackOptions options;
  options.allThreads = true;
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, options);
  EXPECT_EQ(report.classes.size(), 2u);
  std::string text = treeText(report.native);
  EXPECT_NE(text.find("[0-1] start_thread\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[0-1] Agent::run\n"), std::string::npos) << text;
  EXPECT_EQ(report.native.nodes[0].threads, 4u);
  EXPECT_EQ(report.native.nodes[0].ranks, (std::vector<int>{0, 1}));
}

TEST(StackTree, ByModuleTellsOffsetsAndBuildsApart) {
  Dump a, b;
  a.threads.push_back(thread(1, "t", {frame("main", 0x100), frame("step", 0x200)}));
  b.threads.push_back(thread(2, "t", {frame("main", 0x100), frame("step", 0x208)}));
  std::vector<RankDump> ranks = {{0, &a, 1}, {1, &b, 2}};
  EXPECT_EQ(ncclwatch::analysis::mergeStacks(ranks, {}).classes.size(), 1u);
  StackOptions byModule;
  byModule.by = FrameKey::kModule;
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, byModule);
  EXPECT_EQ(report.classes.size(), 2u);
  EXPECT_EQ(treeText(report.native),
            "[0-1] libx.so+0x100 main\n"
            "\u251c\u2500[0] libx.so+0x200 step\n"
            "\u2514\u2500[1] libx.so+0x208 step\n");
  b.threads[0].frames[0] = frame("step", 0x200);
  b.threads[0].frames[1].buildId = "ef01";  // another build of the same module
  report = ncclwatch::analysis::mergeStacks(ranks, byModule);
  EXPECT_EQ(report.native.nodes[0].children.size(), 2u);
}

TEST(StackTree, UnknownFunctionsMergeByModuleOffsetAndSilentThreadsShowTheirWait) {
  Dump a;
  a.threads.push_back(thread(1, "t", {frame("main"), frame("", 0x85f14, "/lib/libc.so.6")}));
  DumpThread silent;
  silent.tid = 2;
  silent.name = "blocked";
  silent.wchan = "futex_wait_queue";
  a.threads.push_back(silent);
  std::vector<RankDump> ranks = {{0, &a, 1}};
  StackOptions all;
  all.allThreads = true;
  std::string text = treeText(ncclwatch::analysis::mergeStacks(ranks, all).native);
  EXPECT_NE(text.find("[0] libc.so.6+0x85f14\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[0] (no native stack; kernel wait futex_wait_queue)\n"), std::string::npos)
      << text;
}

TEST(StackTree, RanksWithoutDumpsAreNamedAndPythonStacksGetTheirOwnTree) {
  Dump d = trainDump(100, false);
  d.pythonNote = "faulthandler";
  ncclwatch::trace::DumpPythonThread py;
  py.frames = {{"train.py", 88, "step"}, {"train.py", 120, "main"}};  // innermost first
  d.pythonThreads.push_back(py);
  std::vector<RankDump> ranks = {{0, &d, 100}, {1, nullptr, 0}, {2, &d, 100}};
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, {});
  EXPECT_EQ(report.noDump, (std::vector<int>{1}));
  EXPECT_EQ(report.notes[1].note, "no dump");
  EXPECT_EQ(treeText(report.python), "[0,2] train.py:120 main\n[0,2] train.py:88 step\n");
  std::ostringstream text;
  ncclwatch::analysis::printStacksText(report, text);
  EXPECT_EQ(text.str().rfind("Stacks of 3 ranks", 0), 0u) << text.str();
  EXPECT_NE(text.str().find("1 class; representative ranks: 0\n"), std::string::npos);
  EXPECT_NE(text.str().find("No dump: rank 1 "), std::string::npos) << text.str();
  EXPECT_LT(text.str().find("class 1"), text.str().find("Native stacks")) << "classes first";

  std::ostringstream json;
  ncclwatch::analysis::printStacksJson(report, json);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(json.str());
  EXPECT_EQ(int64_t(doc["ranks"]), 3);
  EXPECT_EQ(std::string_view(doc["classes"].at(0)["ranks"]), "0,2");
  EXPECT_EQ(int64_t(doc["no_dump"].at(0)), 1);
  EXPECT_EQ(std::string_view(doc["python"]["children"].at(0)["label"]), "train.py:120 main");
  EXPECT_EQ(std::string_view(doc["native"]["children"].at(0)["ranks"]), "0,2");
}

TEST(StackTree, JsonEscapesHostileNames) {
  Dump d;
  d.threads.push_back(thread(1, "a\"b", {frame("f<\"\\\x01>")}));
  std::vector<RankDump> ranks = {{0, &d, 1}};
  std::ostringstream json;
  ncclwatch::analysis::printStacksJson(ncclwatch::analysis::mergeStacks(ranks, {}), json);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(json.str());
  EXPECT_EQ(std::string_view(doc["classes"].at(0)["path"].at(0)), "f<\"\\\x01>");
}

TEST(Report, EscapesEverythingItShows) {
  EXPECT_EQ(ncclwatch::report::escapeHtml("<script>a&'\"</script>"),
            "&lt;script&gt;a&amp;&#39;&quot;&lt;/script&gt;");
  ncclwatch::trace::TraceFile file;
  file.usable = true;
  file.header.rank = 0;
  file.header.world = 1;
  Dump d;
  d.trigger = "hang";
  d.reason = "<img src=x>";
  d.threads.push_back(thread(1, "t", {frame("main"), frame("<script>alert(1)</script>")}));
  file.dumps.push_back(d);
  std::vector<ncclwatch::trace::TraceFile> files = {file};
  ncclwatch::analysis::Options options;
  options.probeProcesses = false;
  auto report = ncclwatch::analysis::analyze(files, options);
  auto stacks = ncclwatch::analysis::stackReport(files, report, {});
  std::ostringstream page;
  ncclwatch::report::writeHtml(files, report, stacks, page);
  EXPECT_EQ(page.str().find("<script"), std::string::npos) << page.str();
  EXPECT_EQ(page.str().find("<img"), std::string::npos) << page.str();
  EXPECT_NE(page.str().find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
}

// A PyTorch rank blocked in a barrier: the stack top leads with the user's own Python line (not
// distributed_c10d.py's), and PyTorch's native frames fold into one item naming the innermost;
// the CUDA runtime's, libc's and the interpreter's frames are left out.
TEST(StackTop, LeadsWithTheUsersPythonLineAndFoldsPyTorchFrames) {
  Dump dump;
  dump.threads.push_back(thread(
      100, "python",
      {frame("main", 0x10, "/usr/bin/python3.11"),
       frame("c10d::ProcessGroupNCCL::barrier()", 0x20, "/venv/torch/lib/libtorch_cuda.so"),
       frame("c10d::WorkNCCL::synchronizeInternal()", 0x30, "/venv/torch/lib/libtorch_cuda.so"),
       frame("cudaStreamSynchronize", 0x40, "/usr/lib/libcudart.so.13"),
       frame("__futex_wait", 0x50, "/lib/x86_64-linux-gnu/libc.so.6")}));
  ncclwatch::trace::DumpPythonThread python;
  python.current = true;
  python.frames = {
      {"/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 6614, "barrier"},
      {"/home/me/train.py", 46, "train"},
      {"/home/me/train.py", 59, "main"}};
  dump.pythonThreads.push_back(python);
  EXPECT_EQ(ncclwatch::analysis::stackTop(dump, 100, 100),
            "py: /home/me/train.py:46 train (in distributed_c10d.py:6614 barrier) | "
            "[PyTorch: c10d::WorkNCCL::synchronizeInternal()]");
}

// A native program: its own frames, as before; a Python stack of library code only is shown
// after them.
TEST(StackTop, ANativeProgramShowsItsOwnFrames) {
  Dump dump;
  dump.threads.push_back(
      thread(7, "main",
             {frame("main", 0x10, "/app/train"), frame("Trainer::step", 0x20, "/app/train"),
              frame("ncclAllReduce", 0x30, "/usr/lib/libnccl.so.2")}));
  EXPECT_EQ(ncclwatch::analysis::stackTop(dump, 7, 7), "Trainer::step \u2190 main");
}

// ---------------------------------------------------------------------------------------------
// Mixed stacks: a PyTorch rank's main thread as the ptrace route dumps it (CPython 3.11: the
// script's frames call each other inside one eval loop; PyTorch's logging decorator calls
// all_reduce through C, hence a second loop), with its Python stack under the same pthread id.

constexpr uint64_t kMainPthread = 0x7f3a1c2b5740;
const std::string kPython = "/usr/bin/python3.11";
const std::string kLibPython = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
const std::string kLibc = "/lib/x86_64-linux-gnu/libc.so.6";
const std::string kTorchPython = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so";
const std::string kTorchCuda = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so";
const std::string kNccl = "/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2";
const std::string kC10d = "/venv/lib/python3.11/site-packages/torch/distributed/";

// Outermost first; `between` goes between the two eval loops (none: the interpreter's own).
std::vector<DumpFrame> torchNative(std::vector<DumpFrame> between, const std::string& wait) {
  std::vector<DumpFrame> frames = {frame("_start", 0x10, kPython),
                                   frame("__libc_start_main", 0x20, kLibc),
                                   frame("main", 0x30, kPython),
                                   frame("Py_RunMain", 0x40, kLibPython),
                                   frame("_PyRun_AnyFileObject", 0x50, kLibPython),
                                   frame("run_eval_code_obj", 0x60, kLibPython),
                                   frame("PyEval_EvalCode", 0x70, kLibPython),
                                   frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
                                   frame("PyObject_Call", 0x90, kLibPython)};
  frames.insert(frames.end(), between.begin(), between.end());
  std::vector<DumpFrame> inner = {
      frame("_PyFunction_Vectorcall", 0xa0, kLibPython),
      frame("_PyEval_Vector", 0xb0, kLibPython),
      frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
      frame("cfunction_call", 0xc0, kLibPython),
      frame("pybind11::cpp_function::dispatcher(_object*, _object*, _object*)", 0xd0, kTorchPython),
      frame("c10d::ProcessGroupNCCL::allreduce(std::vector<at::Tensor, std::allocator<at::Tensor> "
            ">&, c10d::AllreduceOptions const&)",
            0xe0, kTorchCuda),
      frame(
          "c10d::ProcessGroupNCCL::collective<c10d::ProcessGroupNCCL::allreduce_impl(at::Tensor&, "
          "char const*, c10d::AllreduceOptions const&)::{lambda()#1}>(...)",
          0xf0, kTorchCuda),
      frame("ncclAllReduce", 0x100, "/opt/ncclwatch/lib/libncclwatch.so"),
      frame("ncclAllReduce", 0x110, kNccl),
      frame(wait, 0x120, kNccl),
      frame("pthread_cond_wait", 0x130, kLibc),
      frame("__futex_abstimed_wait_common", 0x140, kLibc)};
  frames.insert(frames.end(), inner.begin(), inner.end());
  return frames;
}

ncclwatch::trace::DumpPythonThread torchPython(uint64_t id, int trainLine) {
  ncclwatch::trace::DumpPythonThread python;
  python.threadId = id;
  python.frames = {// innermost first, as CPython prints them
                   {kC10d + "distributed_c10d.py", 2501, "all_reduce"},
                   {kC10d + "c10d_logger.py", 83, "wrapper"},
                   {"/home/me/train.py", trainLine, "train"},
                   {"/home/me/train.py", 55, "main"},
                   {"/home/me/train.py", 60, "<module>"}};
  return python;
}

Dump torchDump(int pid, int trainLine, const std::string& wait) {
  Dump d;
  d.trigger = "hang";
  d.pythonNote = "CPython's _Py_DumpTracebackThreads";
  DumpThread main = thread(pid, "python", torchNative({}, wait));
  main.pthreadId = kMainPthread;
  d.threads.push_back(main);
  DumpThread loader = thread(pid + 1, "pt_data_worker", {frame("start_thread", 0x10, kLibc)});
  loader.pthreadId = 0x7f3a00001000;
  d.threads.push_back(loader);
  // A data loader's Python thread, listed as current: the join, not "current", picks the stack.
  ncclwatch::trace::DumpPythonThread other;
  other.threadId = 0x7f3a00001000;
  other.current = true;
  other.frames = {{"/home/me/data.py", 12, "prefetch"}};
  d.pythonThreads.push_back(other);
  d.pythonThreads.push_back(torchPython(kMainPthread, trainLine));
  return d;
}

std::string expectedGolden(const std::string& name, const std::string& got) {
  std::string path = std::string(NCCLWATCH_GOLDEN_DIR) + "/" + name;
  if (std::getenv("NCCLWATCH_UPDATE_GOLDEN") != nullptr) std::ofstream(path) << got;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Fewer eval loops than Python frames: the script's frames share the outer loop, the
// interpreter's frames are hidden, PyTorch's and the runtime's fold. Nothing visible lies
// between the loops, so nothing is a guess.
TEST(MixedStack, SplicesPythonFramesAtTheirEvalLoopsAndFolds) {
  Dump d = torchDump(100, 40, "ncclsim::waitForPeers(int)");
  const ncclwatch::trace::DumpPythonThread* own =
      ncclwatch::analysis::pythonThreadOf(d, d.threads[0]);
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(own->threadId, kMainPthread);
  ncclwatch::analysis::MixedStack mixed = ncclwatch::analysis::mixedStack(d.threads[0], *own);
  ASSERT_TRUE(mixed.spliced);
  EXPECT_EQ(mixed.evalFrames, 2);
  EXPECT_EQ(mixed.pythonFrames, 5);
  EXPECT_FALSE(mixed.exact);
  EXPECT_FALSE(mixed.guessed);
  EXPECT_EQ(mixed.userLine, "/home/me/train.py:40 train");  // not PyTorch's frames
  EXPECT_EQ(mixed.path,
            (std::vector<std::string>{
                "/home/me/train.py:60 <module>", "/home/me/train.py:55 main",
                "/home/me/train.py:40 train", kC10d + "c10d_logger.py:83 wrapper",
                kC10d + "distributed_c10d.py:2501 all_reduce",
                "[PyTorch, 3 frames: c10d::ProcessGroupNCCL::collective<\u2026>]", "ncclAllReduce",
                "[4 frames in libnccl, libc: ncclsim::waitForPeers]"}));
}

// A thread without a pthread id (an old dump), or whose Python stack is not in the dump, keeps
// its native path.
TEST(MixedStack, NoJoinNoSplice) {
  Dump d = torchDump(100, 40, "ncclsim::waitForPeers(int)");
  d.threads[0].pthreadId = 0;
  EXPECT_EQ(ncclwatch::analysis::pythonThreadOf(d, d.threads[0]), nullptr);
  std::vector<RankDump> ranks = {{0, &d, 100}};
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, {});
  EXPECT_TRUE(report.mixedRanks.empty());
  EXPECT_EQ(report.classes[0].path.front(), "_start");
  std::ostringstream text;
  ncclwatch::analysis::printStacksText(report, text);
  EXPECT_NE(text.str().find("\nNative stacks, outermost frame first"), std::string::npos);
}

// As many eval loops as Python frames (every call went through C): exact, and a native frame
// between loops (a C extension calling back into Python) sits between its two Python frames.
TEST(MixedStack, OneEvalLoopPerPythonFrameIsExact) {
  DumpThread native =
      thread(7, "main",
             {frame("main", 0x10, kPython), frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
              frame("callback_into_python", 0x30, "/app/ext.so"),
              frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
              frame("slow_native_work", 0x40, "/app/ext.so")});
  ncclwatch::trace::DumpPythonThread python;
  python.frames = {{"b.py", 2, "inner"}, {"a.py", 1, "outer"}};
  ncclwatch::analysis::MixedStack mixed = ncclwatch::analysis::mixedStack(native, python);
  EXPECT_TRUE(mixed.exact);
  EXPECT_FALSE(mixed.guessed);
  EXPECT_EQ(mixed.path, (std::vector<std::string>{"a.py:1 outer", "callback_into_python",
                                                  "b.py:2 inner", "slow_native_work"}));
}

// Fewer loops than frames with a native frame between the loops: where it sits among the Python
// frames is a guess, and the label says so.
TEST(MixedStack, ANativeFrameBetweenSharedLoopsIsMarkedAsAGuess) {
  DumpThread native = thread(
      7, "main",
      {frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
       frame("callback_into_python", 0x30, "/app/ext.so"),
       frame("_PyEval_EvalFrameDefault", 0x80, kLibPython), frame("work", 0x40, "/app/ext.so")});
  ncclwatch::trace::DumpPythonThread python;
  python.frames = {{"c.py", 3, "leaf"}, {"b.py", 2, "middle"}, {"a.py", 1, "outer"}};
  ncclwatch::analysis::MixedStack mixed = ncclwatch::analysis::mixedStack(native, python);
  EXPECT_FALSE(mixed.exact);
  EXPECT_TRUE(mixed.guessed);
  EXPECT_EQ(mixed.path, (std::vector<std::string>{"a.py:1 outer", "b.py:2 middle",
                                                  "callback_into_python (placed by guess)",
                                                  "c.py:3 leaf", "work"}));
}

// A thread waiting for the GIL: the interpreter's frames inside the innermost loop are where it
// is, so they show (folded).
TEST(MixedStack, AThreadInsideTheInterpreterShowsItsFrames) {
  DumpThread native =
      thread(7, "main",
             {frame("_PyEval_EvalFrameDefault", 0x80, kLibPython),
              frame("PyEval_RestoreThread", 0x10, kLibPython), frame("take_gil", 0x20, kLibPython),
              frame("pthread_cond_timedwait", 0x30, kLibc)});
  ncclwatch::trace::DumpPythonThread python;
  python.frames = {{"a.py", 1, "outer"}};
  EXPECT_EQ(ncclwatch::analysis::mixedStack(native, python).path,
            (std::vector<std::string>{"a.py:1 outer", "[Python, 2 frames: take_gil]",
                                      "[1 frame in libc: pthread_cond_timedwait]"}));
}

// The merged tree of four PyTorch ranks, rank 2 at another line of the script and waiting
// elsewhere in NCCL: one path from the script's line to the NCCL wait, against the golden text.
TEST(MixedStack, MergedTreeMatchesTheGolden) {
  std::vector<Dump> dumps;
  for (int r = 0; r < 4; ++r) {
    dumps.push_back(torchDump(100 + 10 * r, r == 2 ? 44 : 40,
                              r == 2 ? "ncclsim::waitForRoot(int)" : "ncclsim::waitForPeers(int)"));
  }
  std::vector<RankDump> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({r, &dumps[r], 100 + 10 * r});
  StackReport report = ncclwatch::analysis::mergeStacks(ranks, {});
  EXPECT_EQ(report.mixedRanks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(report.guessedRanks.empty());
  ASSERT_EQ(report.classes.size(), 2u);
  EXPECT_EQ(report.classes[1].ranks, (std::vector<int>{2}));
  std::ostringstream text;
  ncclwatch::analysis::printStacksText(report, text);
  EXPECT_EQ(text.str(), expectedGolden("stacks_mixed.txt", text.str()));

  // --no-mixed: the native tree as before, the Python tree beside it.
  StackOptions apart;
  apart.mixed = false;
  StackReport separate = ncclwatch::analysis::mergeStacks(ranks, apart);
  EXPECT_TRUE(separate.mixedRanks.empty());
  EXPECT_EQ(separate.classes[0].path.front(), "_start");
  EXPECT_NE(treeText(separate.python).find("[0-3] /home/me/data.py:12 prefetch\n"),
            std::string::npos)
      << treeText(separate.python);

  std::ostringstream json;
  ncclwatch::analysis::printStacksJson(report, json);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(json.str());
  EXPECT_EQ(int64_t(doc["mixed_ranks"].at(3)), 3);
  EXPECT_EQ(std::string_view(doc["native"]["children"].at(0)["label"]),
            "/home/me/train.py:60 <module>");
}

// After `run --abort` a rank dumps again on its SIGTERM, torn down: the stacks (and the HTML
// page's tree) come from its dump taken on the hang, mixed.
TEST(MixedStack, StacksUseTheDumpTakenOnTheHangAndThePageShowsTheMixedTree) {
  ncclwatch::trace::TraceFile file;
  file.usable = true;
  file.header.rank = 0;
  file.header.world = 1;
  file.header.pid = 100;
  Dump hang = torchDump(100, 40, "ncclsim::waitForPeers(int)");
  hang.trigger = "collector";
  Dump teardown;
  teardown.trigger = "sigterm";
  teardown.threads.push_back(thread(100, "python", {frame("main"), frame("Py_FinalizeEx")}));
  file.dumps = {hang, teardown};
  EXPECT_EQ(ncclwatch::analysis::hangDumpOf(file), &file.dumps[0]);
  std::vector<ncclwatch::trace::TraceFile> files = {file};
  ncclwatch::analysis::Options options;
  options.probeProcesses = false;
  auto report = ncclwatch::analysis::analyze(files, options);
  auto stacks = ncclwatch::analysis::stackReport(files, report, {});
  EXPECT_EQ(stacks.mixedRanks, (std::vector<int>{0}));
  EXPECT_EQ(stacks.notes[0].trigger, "collector");
  std::ostringstream page;
  ncclwatch::report::writeHtml(files, report, stacks, page);
  EXPECT_NE(page.str().find("Mixed stacks (ranks 0)"), std::string::npos) << page.str();
  EXPECT_NE(page.str().find("/home/me/train.py:40 train"), std::string::npos) << page.str();
  // Without a dump taken on the hang, the newest.
  file.dumps = {teardown};
  EXPECT_EQ(ncclwatch::analysis::hangDumpOf(file), &file.dumps[0]);
}

// The stack top names the thread's own Python stack (not the data loader's, listed as current)
// and the native frames inside its innermost loop.
TEST(StackTop, UsesTheThreadsOwnPythonStackWhenTheDumpJoinsThem) {
  Dump d = torchDump(100, 40, "ncclsim::waitForPeers(int)");
  EXPECT_EQ(ncclwatch::analysis::stackTop(d, 100, 100),
            "py: /home/me/train.py:40 train (in distributed_c10d.py:2501 all_reduce) | "
            "[PyTorch: c10d::ProcessGroupNCCL::collective<c10d::ProcessGroupNCCL::allreduce_impl("
            "at::Tensor&, char const*, c10d::AllreduceOptions const&)::{lambda()#1}>(...)]");
  d.threads[0].pthreadId = 0;  // no join: the current Python thread, as before
  EXPECT_EQ(ncclwatch::analysis::stackTop(d, 100, 100).rfind("py: /home/me/data.py:12 prefetch", 0),
            0u)
      << ncclwatch::analysis::stackTop(d, 100, 100);
}

}  // namespace
