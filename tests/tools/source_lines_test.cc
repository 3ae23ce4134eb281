// The offline symbolizer (tools/source_lines.h) on this test binary, built with -g: a known
// function's call gives its file:line, a call inside an always_inline function gives the
// inlined frame and its caller's line, a stripped copy gives no line and no error, a binary
// whose build id is not the dump's says it changed, a missing one gives no line.
#include "source_lines.h"

#include <elf.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "analysis/stack_tree.h"

namespace {

using ncclwatch::cli::SourceLines;
using ncclwatch::cli::SourceLookup;
using ncclwatch::cli::SourceStatus;

volatile uintptr_t sink = 0;
int lineOfKnownCall = 0;
int lineInInlined = 0;
int lineOfInlinedCall = 0;

__attribute__((noinline)) uintptr_t returnAddress() {
  return reinterpret_cast<uintptr_t>(__builtin_return_address(0));
}

__attribute__((noinline)) uintptr_t knownFunction() {
  lineOfKnownCall = __LINE__ + 1;
  uintptr_t pc = returnAddress();
  sink = pc;  // keeps the call from becoming a tail call
  return pc;
}

inline __attribute__((always_inline)) uintptr_t inlinedHelper() {
  lineInInlined = __LINE__ + 1;
  uintptr_t pc = returnAddress();
  sink = pc;
  return pc;
}

__attribute__((noinline)) uintptr_t callsInlined() {
  lineOfInlinedCall = __LINE__ + 1;
  uintptr_t pc = inlinedHelper();
  sink = pc + 1;
  return pc;
}

struct Self {
  std::string path;
  uintptr_t bias = 0;
  std::string buildId;
};

// The main program's load bias and build id, as the watchdog records them.
Self self() {
  Self s;
  s.path = std::filesystem::read_symlink("/proc/self/exe").string();
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<Self*>(data);
        out->bias = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_NOTE) continue;
          auto* at = reinterpret_cast<const char*>(info->dlpi_addr + segment.p_vaddr);
          const char* end = at + segment.p_memsz;
          while (at + sizeof(ElfW(Nhdr)) <= end) {
            auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
            const char* name = at + sizeof(ElfW(Nhdr));
            const auto* desc =
                reinterpret_cast<const unsigned char*>(name + ((note->n_namesz + 3) & ~3u));
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4) {
              for (unsigned k = 0; k < note->n_descsz; ++k) {
                char hex[3];
                std::snprintf(hex, sizeof hex, "%02x", desc[k]);
                out->buildId += hex;
              }
            }
            at = reinterpret_cast<const char*>(desc) + ((note->n_descsz + 3) & ~3u);
          }
        }
        return 1;  // the first entry is the main program
      },
      &s);
  return s;
}

// A frame as a dump holds it: no source line yet.
ncclwatch::trace::DumpFrame dumpFrame(uint64_t pc, const std::string& function,
                                      const std::string& module, uint64_t offset,
                                      const std::string& buildId) {
  ncclwatch::trace::DumpFrame frame;
  frame.pc = pc;
  frame.function = function;
  frame.module = module;
  frame.moduleOffset = offset;
  frame.buildId = buildId;
  return frame;
}

const std::string kThisFile = "tests/tools/source_lines_test.cc";

TEST(SourceLines, KnownFunctionHasItsFileAndLine) {
  Self s = self();
  ASSERT_FALSE(s.buildId.empty());
  uintptr_t pc = knownFunction();
  SourceLines lines(NCCLWATCH_SOURCE_DIR);
  SourceLookup found = lines.lookup(s.path, s.buildId, pc - s.bias, false);
  ASSERT_EQ(found.status, SourceStatus::kFound);
  ASSERT_EQ(found.frames.size(), 1u);
  EXPECT_EQ(found.frames[0].file, kThisFile);
  EXPECT_EQ(found.frames[0].line, lineOfKnownCall);
  EXPECT_FALSE(found.frames[0].inlined);
}

TEST(SourceLines, InlinedFunctionIsAFrameOfItsOwn) {
  Self s = self();
  uintptr_t pc = callsInlined();
  SourceLines lines(NCCLWATCH_SOURCE_DIR);
  SourceLookup found = lines.lookup(s.path, s.buildId, pc - s.bias, false);
  ASSERT_EQ(found.status, SourceStatus::kFound);
  ASSERT_EQ(found.frames.size(), 2u);
  EXPECT_TRUE(found.frames[0].inlined);
  EXPECT_NE(found.frames[0].function.find("(anonymous namespace)::inlinedHelper"),
            std::string::npos)
      << found.frames[0].function;
  EXPECT_EQ(found.frames[0].file, kThisFile);
  EXPECT_EQ(found.frames[0].line, lineInInlined);
  EXPECT_FALSE(found.frames[1].inlined);
  EXPECT_EQ(found.frames[1].file, kThisFile);
  EXPECT_EQ(found.frames[1].line, lineOfInlinedCall);
}

// A dump's frames: the inlined call becomes two frames, labelled as the stacks tree shows them.
TEST(SourceLines, DumpFramesGetLinesAndInlinedFrames) {
  Self s = self();
  uintptr_t known = knownFunction();
  uintptr_t inlined = callsInlined();
  ncclwatch::trace::TraceFile file;
  ncclwatch::trace::Dump dump;
  ncclwatch::trace::DumpThread thread;
  thread.tid = 1;
  thread.frames.push_back(dumpFrame(1, "returnAddress()", "/nowhere/libgone.so", 0x10, "ab"));
  thread.frames.push_back(dumpFrame(known, "knownFunction()", s.path, known - s.bias, s.buildId));
  thread.frames.push_back(
      dumpFrame(inlined, "callsInlined()", s.path, inlined - s.bias, s.buildId));
  dump.threads.push_back(thread);
  file.dumps.push_back(dump);
  SourceLines lines(NCCLWATCH_SOURCE_DIR);
  lines.annotateDumps(std::span(&file, 1));
  const auto& frames = file.dumps[0].threads[0].frames;
  ASSERT_EQ(frames.size(), 4u);
  using ncclwatch::analysis::FrameKey;
  using ncclwatch::analysis::frameLabel;
  EXPECT_EQ(frameLabel(frames[0], FrameKey::kFunction), "returnAddress()");  // no binary
  EXPECT_EQ(frameLabel(frames[1], FrameKey::kFunction),
            "knownFunction() at " + kThisFile + ":" + std::to_string(lineOfKnownCall));
  EXPECT_EQ(frameLabel(frames[2], FrameKey::kFunction),
            "(anonymous namespace)::inlinedHelper at " + kThisFile + ":" +
                std::to_string(lineInInlined) + " (inlined)");
  EXPECT_EQ(frameLabel(frames[3], FrameKey::kFunction),
            "callsInlined() at " + kThisFile + ":" + std::to_string(lineOfInlinedCall));
  EXPECT_EQ(lines.stats().frames, 3u);
  EXPECT_EQ(lines.stats().withLine, 2u);
  EXPECT_EQ(lines.stats().inlined, 1u);
  lines.annotateDumps(std::span(&file, 1));  // a second pass adds no frame
  EXPECT_EQ(file.dumps[0].threads[0].frames.size(), 4u);
  EXPECT_EQ(lines.stats().inlined, 1u);
  std::ostringstream notes;
  lines.printNotes("stacks", notes);
  EXPECT_EQ(notes.str(), "");
}

// Without DWARF (PyTorch's wheels are built so) the function still comes from the symbol table,
// with no file or line.
TEST(SourceLines, StrippedBinaryHasNoLineButItsFunctionAndNoError) {
  Self s = self();
  uintptr_t pc = knownFunction();
  std::string stripped = testing::TempDir() + "/source_lines_stripped";
  ASSERT_EQ(std::system(("objcopy --strip-debug '" + s.path + "' '" + stripped + "'").c_str()), 0);
  SourceLines lines;
  SourceLookup found = lines.lookup(stripped, s.buildId, pc - s.bias, false);
  EXPECT_EQ(found.status, SourceStatus::kNoLine);
  ASSERT_EQ(found.frames.size(), 1u);
  EXPECT_NE(found.frames[0].function.find("knownFunction"), std::string::npos)
      << found.frames[0].function;
  EXPECT_TRUE(found.frames[0].file.empty());
  EXPECT_EQ(found.frames[0].line, 0);
  std::filesystem::remove(stripped);
}

TEST(SourceLines, ChangedBinarySaysSoAndShowsNoLine) {
  Self s = self();
  uintptr_t pc = knownFunction();
  SourceLines lines;
  EXPECT_EQ(lines.lookup(s.path, "00ff00ff", pc - s.bias, false).status, SourceStatus::kChanged);
  ncclwatch::trace::TraceFile file;
  ncclwatch::trace::Dump dump;
  ncclwatch::trace::DumpThread thread;
  thread.frames.push_back(dumpFrame(pc, "knownFunction()", s.path, pc - s.bias, "00ff00ff"));
  dump.threads.push_back(thread);
  file.dumps.push_back(dump);
  lines.annotateDumps(std::span(&file, 1));
  const auto& frame = file.dumps[0].threads[0].frames.at(0);
  EXPECT_EQ(ncclwatch::analysis::frameLabel(frame, ncclwatch::analysis::FrameKey::kFunction),
            "knownFunction() (binary changed)");
  std::ostringstream notes;
  lines.printNotes("stacks", notes);
  EXPECT_EQ(notes.str(), "ncclwatch stacks: " + s.path +
                             " changed since the dump (build id 00ff00ff in the dump, another on "
                             "disk): its frames have no source lines\n");
}

// A verdict's call read from rank 1, whose trace has no site line for it: its line comes from
// rank 1's own load address of the binary, not from the class's first rank's, where the same
// binary loaded elsewhere (ASLR: the return address means nothing in rank 0's process).
TEST(SourceLines, ACallSiteIsLookedUpInTheProcessItCameFrom) {
  Self s = self();
  ASSERT_FALSE(s.buildId.empty());
  uintptr_t pc = knownFunction();
  auto traceOf = [&](int rank, uint64_t bias) {
    ncclwatch::trace::TraceFile file;
    file.path = "/traces/rank" + std::to_string(rank);
    file.header.rank = rank;
    ncclwatch::trace::DumpThread thread;
    thread.tid = 1;
    // The dump's frame of main() in that process: its pc and module offset give the bias.
    thread.frames.push_back(dumpFrame(bias + 0x1000, "main", s.path, 0x1000, s.buildId));
    ncclwatch::trace::Dump dump;
    dump.threads.push_back(thread);
    file.dumps.push_back(dump);
    return file;
  };
  std::vector<ncclwatch::trace::TraceFile> files{traceOf(0, s.bias + 0x7000000),
                                                 traceOf(1, s.bias)};
  ncclwatch::analysis::Report report;
  ncclwatch::analysis::JobReport& job = report.jobs.emplace_back();
  for (const auto& file : files) {
    ncclwatch::analysis::ProcessSummary& process = job.processes.emplace_back();
    process.path = file.path;
    process.rank = file.header.rank;
  }
  ncclwatch::analysis::RankClass& both = job.verdicts.emplace_back().classes.emplace_back();
  both.ranks = {0, 1};
  both.call.callSite = pc;
  both.call.callRank = 1;
  SourceLines lines(NCCLWATCH_SOURCE_DIR);
  lines.annotateCallSites(report, files);
  EXPECT_NE(both.call.issuedAt.find(kThisFile + ":" + std::to_string(lineOfKnownCall)),
            std::string::npos)
      << both.call.issuedAt;
}

TEST(SourceLines, MissingOrPseudoModuleHasNoLine) {
  SourceLines lines;
  std::string garbage = testing::TempDir() + "/source_lines_not_elf";
  std::ofstream(garbage) << "not an ELF file\n" << std::string(4096, 'x');
  EXPECT_EQ(lines.lookup(garbage, "", 0x10, false).status, SourceStatus::kMissing);
  std::filesystem::remove(garbage);
  EXPECT_EQ(lines.lookup("/nonexistent/libx.so", "ab", 0x1000, false).status,
            SourceStatus::kMissing);
  EXPECT_EQ(lines.lookup("[vdso]", "", 0x1000, false).status, SourceStatus::kMissing);
  EXPECT_EQ(lines.lookup("", "", 0, true).status, SourceStatus::kMissing);
}

// Offsets outside the module or garbage in a damaged dump: no line, no crash.
TEST(SourceLines, OffsetsOutsideTheBinaryHaveNoLine) {
  Self s = self();
  SourceLines lines;
  for (uint64_t offset : {uint64_t{0}, uint64_t{1} << 40, ~uint64_t{0}}) {
    SourceLookup found = lines.lookup(s.path, s.buildId, offset, false);
    EXPECT_EQ(found.status, SourceStatus::kNoLine) << offset;
  }
  EXPECT_FALSE(lines.contains(s.path, s.buildId, uint64_t{1} << 40));
  EXPECT_FALSE(lines.contains(s.path, "00ff", 0x1000));
  uintptr_t pc = knownFunction();
  EXPECT_TRUE(lines.contains(s.path, s.buildId, pc - s.bias));
}

}  // namespace
