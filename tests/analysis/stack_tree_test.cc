// The STAT-style stack merge on synthetic dumps: prefix tree with rank sets on every edge,
// equivalence classes with representatives, the thread that matters, function versus
// module+offset keys, ranks without dumps, Python trees, JSON, and the HTML page's escaping.
#include "analysis/stack_tree.h"

#include <gtest/gtest.h>
#include <simdjson.h>

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

}  // namespace
