// Dump blocks: the text round-trips, bad text is named by line, and the reader finds dumps after
// the ring in both trace modes, salvaging around truncated or corrupted ones.
#include "trace/dump.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "trace/ring_reader.h"
#include "trace/ring_writer.h"

namespace {

using namespace ncclwatch::trace;

Dump sampleDump() {
  Dump dump;
  dump.trigger = "hang";
  dump.reason = "calls pending\tpast\nthe threshold";  // separators inside values
  dump.timeNs = 5'000'000'000;
  dump.tookNs = 21'000'000;
  dump.stackRoute = "signal SIGRTMIN+3 (fallback: ptrace refused)";
  dump.findings.push_back({0xabcdef0123456789ull, 26, "AllReduce", "started", 2003, 4242,
                           "AllReduce 4096 x float pending 2.0 s"});
  DumpThread thread;
  thread.tid = 4242;
  thread.name = "train_loop";
  thread.answered = true;
  thread.pthreadId = 0x7f1122334455;
  thread.frames.push_back(
      {0x7f0000001000, "runStep(int)", 0x1f, "/bin/train", 0x6109, "be11", "", 0, false, ""});
  thread.frames.push_back({0x7f0000002000, "", 0, "", 0, "", "", 0, false, ""});
  dump.threads.push_back(thread);
  DumpThread silent;
  silent.tid = 4243;
  silent.name = "worker";
  silent.wchan = "futex_do_wait";
  silent.syscall = "blocks signal; 202";
  dump.threads.push_back(silent);
  dump.pythonNote = "CPython's _Py_DumpTracebackThreads";
  dump.pythonThreads.push_back(
      {0x7f1122334455, true, {{"/x/train.py", 48, "train_step"}, {"/x/train.py", -1, "<module>"}}});
  return dump;
}

TEST(DumpText, RoundTripsEveryField) {
  Dump original = sampleDump();
  Dump parsed;
  std::string problem;
  ASSERT_TRUE(parseDump(formatDump(original), &parsed, &problem)) << problem;
  EXPECT_EQ(parsed.trigger, "hang");
  EXPECT_EQ(parsed.reason, "calls pending past the threshold");  // sanitized, not split
  EXPECT_EQ(parsed.timeNs, original.timeNs);
  EXPECT_EQ(parsed.tookNs, original.tookNs);
  EXPECT_EQ(parsed.stackRoute, "signal SIGRTMIN+3 (fallback: ptrace refused)");
  ASSERT_EQ(parsed.findings.size(), 1u);
  EXPECT_EQ(parsed.findings[0].commHash, 0xabcdef0123456789ull);
  EXPECT_EQ(parsed.findings[0].seq, 26u);
  EXPECT_EQ(parsed.findings[0].threadId, 4242);
  ASSERT_EQ(parsed.threads.size(), 2u);
  ASSERT_EQ(parsed.threads[0].frames.size(), 2u);
  EXPECT_EQ(parsed.threads[0].frames[0].function, "runStep(int)");
  EXPECT_EQ(parsed.threads[0].frames[0].moduleOffset, 0x6109u);
  EXPECT_EQ(parsed.threads[0].frames[0].buildId, "be11");
  EXPECT_EQ(parsed.threads[0].pthreadId, 0x7f1122334455u);
  EXPECT_FALSE(parsed.threads[1].answered);
  EXPECT_EQ(parsed.threads[1].wchan, "futex_do_wait");
  EXPECT_EQ(parsed.threads[1].pthreadId, 0u);  // unknown: the field is left out
  ASSERT_EQ(parsed.pythonThreads.size(), 1u);
  // The join: the native thread's pthread id is the Python thread's id.
  EXPECT_EQ(parsed.pythonThreads[0].threadId, parsed.threads[0].pthreadId);
  EXPECT_TRUE(parsed.pythonThreads[0].current);
  EXPECT_EQ(parsed.pythonThreads[0].frames[1].line, -1);
  EXPECT_EQ(parsed.pythonThreads[0].frames[0].function, "train_step");
}

// Dumps written before the stack_route line existed still read; the route is then unknown.
TEST(DumpText, ADumpWithoutAStackRouteReads) {
  Dump original = sampleDump();
  original.stackRoute.clear();
  std::string text = formatDump(original);
  EXPECT_EQ(text.find("stack_route"), std::string::npos);
  Dump parsed;
  std::string problem;
  ASSERT_TRUE(parseDump(text, &parsed, &problem)) << problem;
  EXPECT_TRUE(parsed.stackRoute.empty());
  EXPECT_EQ(parsed.threads.size(), 2u);
}

// Dumps written before thread lines carried the pthread id (6 fields) still read, with the id
// unknown; a malformed id is named.
TEST(DumpText, ThreadLinesWithoutAPthreadIdRead) {
  std::string text =
      "ncclwatch-dump 1\ntrigger\thang\nthread\t4242\t1\ttrain\t\t\n"
      "frame\t7f00\tf\t0\t/bin/x\t10\tbe11\npython\tnone\nend\n";
  Dump parsed;
  std::string problem;
  ASSERT_TRUE(parseDump(text, &parsed, &problem)) << problem;
  ASSERT_EQ(parsed.threads.size(), 1u);
  EXPECT_EQ(parsed.threads[0].tid, 4242);
  EXPECT_EQ(parsed.threads[0].pthreadId, 0u);
  EXPECT_EQ(parsed.threads[0].frames.size(), 1u);
  std::string withId = "ncclwatch-dump 1\nthread\t4242\t1\ttrain\t\t\t7f00aa\nend\n";
  ASSERT_TRUE(parseDump(withId, &parsed, &problem)) << problem;
  EXPECT_EQ(parsed.threads[0].pthreadId, 0x7f00aau);
  EXPECT_FALSE(
      parseDump("ncclwatch-dump 1\nthread\t4242\t1\ttrain\t\t\tzz\nend\n", &parsed, &problem));
}

TEST(DumpText, BadTextIsNamedByLine) {
  Dump parsed;
  std::string problem;
  EXPECT_FALSE(parseDump("something else\n", &parsed, &problem));
  EXPECT_NE(problem.find("line 1"), std::string::npos) << problem;
  std::string text = formatDump(sampleDump());
  EXPECT_FALSE(parseDump(text.substr(0, text.size() / 2), &parsed, &problem));
  std::string badFrame = "ncclwatch-dump 1\nframe\tzz\tf\t0\tm\t0\tb\nend\n";
  EXPECT_FALSE(parseDump(badFrame, &parsed, &problem));
  EXPECT_NE(problem.find("line 2"), std::string::npos) << problem;
}

class DumpFile : public testing::TestWithParam<TraceMode> {
 protected:
  std::string path_ = std::string(testing::TempDir()) + "/dump-" + std::to_string(getpid()) +
                      (GetParam() == TraceMode::kFull ? "-full" : "-ring") + ".ncclwatch";
  void TearDown() override { std::filesystem::remove(path_); }
  // A file with records, a dump, more records (and segments in full mode), a second dump.
  void write() {
    RingWriter writer;
    std::string error;
    ASSERT_TRUE(writer.open(path_, RingOptions{16, GetParam()}, {}, &error)) << error;
    for (int i = 0; i < 40; ++i) {
      CallRecord record{};
      record.op = OpKind::kAllReduce;
      record.seq = static_cast<uint64_t>(i + 1);
      record.state = RecordState::kCompleted;
      writer.append(record);
      if (i == 10) {
        ASSERT_TRUE(writer.appendDump(formatDump(sampleDump())));
      }
      if (i % 8 == 7) writer.persistSegments();
    }
    Dump second = sampleDump();
    second.trigger = "sigterm";
    ASSERT_TRUE(writer.appendDump(formatDump(second)));
    writer.close();
  }
  std::vector<char> bytes() {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  TraceFile parse(const std::vector<char>& content) {
    return parseTrace(std::as_bytes(std::span<const char>(content)), path_);
  }
};

TEST_P(DumpFile, DumpsAreReadAfterTheRing) {
  write();
  TraceFile file = readTraceFile(path_);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  ASSERT_EQ(file.dumps.size(), 2u);
  EXPECT_EQ(file.dumps[0].trigger, "hang");
  EXPECT_EQ(file.dumps[1].trigger, "sigterm");
  EXPECT_EQ(file.dumps[0].threads[0].frames[0].function, "runStep(int)");
  if (GetParam() == TraceMode::kFull) {
    EXPECT_EQ(file.records.size(), 40u);
  }
}

TEST_P(DumpFile, CorruptAndTruncatedDumpsAreNamedAndTheRestKept) {
  write();
  std::vector<char> content = bytes();
  // Flip a byte inside the last dump's text: its checksum no longer matches.
  std::vector<char> corrupt = content;
  corrupt[corrupt.size() - 100] ^= 0x5a;
  TraceFile file = parse(corrupt);
  ASSERT_EQ(file.dumps.size(), 1u);
  EXPECT_EQ(file.dumps[0].trigger, "hang");
  bool named = false;
  for (const TraceProblem& problem : file.problems) {
    named |= problem.what.find("checksum mismatch") != std::string::npos;
  }
  EXPECT_TRUE(named);
  // Cut inside the last dump (a process killed while writing it): the first one and the
  // records are still there, and the last one's whole lines are read and named partial.
  content.resize(content.size() - 40);
  file = parse(content);
  ASSERT_EQ(file.dumps.size(), 2u);
  EXPECT_FALSE(file.dumps[0].partial);
  EXPECT_TRUE(file.dumps[1].partial);
  EXPECT_EQ(file.dumps[1].trigger, "sigterm");
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_NE(file.problems[0].what.find("is partial"), std::string::npos) << file.problems[0].what;
  EXPECT_FALSE(file.records.empty());
}

INSTANTIATE_TEST_SUITE_P(Modes, DumpFile, testing::Values(TraceMode::kRing, TraceMode::kFull),
                         [](const auto& info) {
                           return info.param == TraceMode::kFull ? "full" : "ring";
                         });

}  // namespace
