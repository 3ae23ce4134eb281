// The ring file: what a writer appends can be read back exactly, wrap-around keeps the newest
// records, concurrent writers never tear a record, a SIGKILLed writer's file still reads, and
// damaged files are salvaged with exact problem reports. Storage cannot fault: blocks are
// reserved, a ring without a file lives in memory, and a file truncated under the writer
// faults into memory instead of killing the process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "trace/ring_reader.h"
#include "trace/ring_writer.h"
#include "trace_files.h"

namespace {

using namespace ncclwatch::trace;

std::string tempPath(const std::string& name) {
  return tracetest::tempPath("ring-test", name);
}

using tracetest::fileBytes;
using tracetest::makeRecord;

TEST(Ring, AppendUpdateAndReadBack) {
  std::string path = tempPath("basic");
  RingWriter writer;
  std::string error;
  ASSERT_TRUE(writer.open(path, 100, {3, 8, 3, "hostA", "job1"}, &error)) << error;
  EXPECT_EQ(writer.capacity(), 128u);
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  CommInfo comm{};
  comm.commHash = 0xabcdef;
  comm.nranks = 8;
  comm.rank = 3;
  writer.addComm(comm);
  uint64_t first = writer.append(makeRecord(1));
  writer.append(makeRecord(2, OpKind::kSend));
  EXPECT_TRUE(writer.updateState(first, RecordState::kCompleted, 1500, 2500));
  writer.setNcclLibrary(22809, "/usr/lib/libnccl.so.2");

  TraceFile file = readTraceFile(path);
  ASSERT_TRUE(file.usable);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.rank, 3);
  EXPECT_EQ(file.header.world, 8);
  EXPECT_STREQ(file.header.host, "hostA");
  EXPECT_EQ(file.header.ncclVersion, 22809);
  EXPECT_EQ(file.header.cleanShutdown, 0u);
  ASSERT_EQ(file.comms.size(), 1u);
  ASSERT_EQ(file.records.size(), 2u);
  EXPECT_EQ(file.records[0].seq, 1u);
  EXPECT_EQ(file.records[0].state, RecordState::kCompleted);
  EXPECT_EQ(file.records[0].startNs, 1500);
  EXPECT_EQ(file.records[0].completeNs, 2500);
  EXPECT_EQ(file.records[1].op, OpKind::kSend);
  EXPECT_EQ(file.emptySlots, 126u);
  writer.markCleanShutdown();
  EXPECT_EQ(readTraceFile(path).header.cleanShutdown, 1u);
  unlink(path.c_str());
}

TEST(Ring, WrapAroundKeepsTheNewestAndRefusesStaleUpdates) {
  std::string path = tempPath("wrap");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, 16, {}, nullptr));
  uint64_t oldest = writer.append(makeRecord(1));
  for (uint64_t seq = 2; seq <= 50; ++seq) writer.append(makeRecord(seq));
  EXPECT_FALSE(writer.updateState(oldest, RecordState::kCompleted, 1, 2));
  TraceFile file = readTraceFile(path);
  ASSERT_EQ(file.records.size(), 16u);
  EXPECT_EQ(file.records.front().seq, 35u);
  EXPECT_EQ(file.records.back().seq, 50u);
  EXPECT_EQ(file.header.nextIndex, 50u);
  unlink(path.c_str());
}

TEST(Ring, ConcurrentWritersNeverTearARecord) {
  std::string path = tempPath("threads");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, 4096, {}, nullptr));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&writer, t] {
      for (uint64_t i = 0; i < 1000; ++i) {
        CallRecord record = makeRecord(i + 1);
        record.threadId = t;
        record.count = record.seq * 10;  // a per-record invariant a torn copy would break
        writer.append(record);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  TraceFile file = readTraceFile(path);
  EXPECT_TRUE(file.problems.empty());
  ASSERT_EQ(file.records.size(), 4000u);
  std::vector<int> perThread(4, 0);
  for (const CallRecord& record : file.records) {
    EXPECT_EQ(record.count, record.seq * 10);
    ++perThread.at(record.threadId);
  }
  EXPECT_EQ(perThread, (std::vector<int>{1000, 1000, 1000, 1000}));
  unlink(path.c_str());
}

TEST(Ring, SurvivesSigkillOfTheWriter) {
  std::string path = tempPath("killed");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    RingWriter writer;
    if (!writer.open(path, 64, {5, 8, 5, "h", "j"}, nullptr)) _exit(1);
    for (uint64_t seq = 1; seq <= 20; ++seq) writer.append(makeRecord(seq));
    char byte = 1;
    (void)!write(ready[1], &byte, 1);
    pause();  // killed here, never shutting down cleanly
    _exit(0);
  }
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  TraceFile file = readTraceFile(path);
  ASSERT_TRUE(file.usable);
  EXPECT_EQ(file.header.cleanShutdown, 0u);
  EXPECT_EQ(file.header.rank, 5);
  ASSERT_EQ(file.records.size(), 20u);
  EXPECT_EQ(file.records.back().seq, 20u);
  unlink(path.c_str());
}

TEST(Ring, ForkChildNeverWritesIntoTheParentsRing) {
  std::string path = tempPath("fork");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, 32, {}, nullptr));
  writer.append(makeRecord(1));
  pid_t child = fork();
  if (child == 0) {
    writer.forgetAfterFork();
    _exit(writer.isOpen() ? 1 : 0);
  }
  int status;
  waitpid(child, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  writer.append(makeRecord(2));
  EXPECT_EQ(readTraceFile(path).records.size(), 2u);
  unlink(path.c_str());
}

class Salvage : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tempPath("salvage");
    RingWriter writer;
    ASSERT_TRUE(writer.open(path_, 32, {1, 2, 1, "h", "j"}, nullptr));
    for (uint64_t seq = 1; seq <= 10; ++seq) writer.append(makeRecord(seq));
    writer.close();
    bytes_ = fileBytes(path_);
    unlink(path_.c_str());
  }
  std::string path_;
  std::vector<std::byte> bytes_;
};

TEST_F(Salvage, TruncatedFileKeepsTheSlotsItHolds) {
  size_t keep = kRingHeaderBytes + 6 * sizeof(CallRecord) + 17;  // a partial 7th slot
  TraceFile file = parseTrace(std::span(bytes_.data(), keep), "t");
  ASSERT_TRUE(file.usable);
  EXPECT_EQ(file.records.size(), 6u);
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "file truncated: 6 of 32 record slots present");
  EXPECT_EQ(file.problems[0].offset, kRingHeaderBytes + 6 * sizeof(CallRecord));
}

TEST_F(Salvage, CorruptRecordsAreNamedAndSkipped) {
  auto* slot3 = reinterpret_cast<CallRecord*>(bytes_.data() + kRingHeaderBytes) + 3;
  slot3->op = static_cast<OpKind>(200);
  auto* slot5 = reinterpret_cast<CallRecord*>(bytes_.data() + kRingHeaderBytes) + 5;
  slot5->slotVersion = 7;  // odd: its writer died inside
  TraceFile file = parseTrace(bytes_, "t");
  EXPECT_EQ(file.records.size(), 8u);
  ASSERT_EQ(file.problems.size(), 2u);
  EXPECT_EQ(file.problems[0].what, "slot 3: op out of range");
  EXPECT_EQ(file.problems[0].offset, kRingHeaderBytes + 3 * sizeof(CallRecord));
  EXPECT_EQ(file.problems[1].what, "slot 5 torn: its writer was inside it");
}

TEST_F(Salvage, BadHeadersAreRejectedWithTheField) {
  std::vector<std::byte> wrongMagic = bytes_;
  wrongMagic[0] = std::byte{'X'};
  TraceFile file = parseTrace(wrongMagic, "t");
  EXPECT_FALSE(file.usable);
  EXPECT_EQ(file.problems.at(0).what, "magic is not NCCLWTCH: not an ncclwatch trace");
  std::vector<std::byte> badCapacity = bytes_;
  reinterpret_cast<RingHeader*>(badCapacity.data())->capacity = 33;
  file = parseTrace(badCapacity, "t");
  ASSERT_TRUE(file.usable);
  EXPECT_EQ(file.problems.at(0).what, "capacity 33 is not a power of two in range");
  EXPECT_EQ(file.records.size(), 10u);  // the records still come back
  file = parseTrace(std::span(bytes_.data(), 100), "t");
  EXPECT_FALSE(file.usable);
  EXPECT_EQ(readTraceFile("/nonexistent/x.ncclwatch").problems.at(0).what,
            "cannot open: No such file or directory");
}

// ---- Storage that cannot fault ----

// The header's wait notes: the watchdog rewrites only the entries that change, each with its
// check, so that a process ending inside a rewrite loses at most the entry it was writing.
class WaitNotes : public ::testing::Test {
 protected:
  static WaitNote note(uint64_t seq, int64_t updatedNs) {
    WaitNote note{};
    note.commHash = 0xc0ffee;
    note.seq = seq;
    note.updatedNs = updatedNs;
    note.sinceNs = 5;
    note.step = 3;
    note.stepState = 20;
    return note;
  }
  void write(std::initializer_list<WaitNote> notes) {
    std::vector<WaitNote> table(notes);
    writer_.writeWaits(table);
  }
  void SetUp() override {
    path_ = tempPath("waits");
    ASSERT_TRUE(writer_.open(path_, 32, {1, 2, 1, "h", "j"}, nullptr));
  }
  void TearDown() override {
    writer_.close();
    unlink(path_.c_str());
  }
  // The file as a reader finds it, with `change` applied to its header first.
  TraceFile readWith(const std::function<void(RingHeader&)>& change) {
    std::vector<std::byte> bytes = fileBytes(path_);
    change(*reinterpret_cast<RingHeader*>(bytes.data()));
    return parseTrace(bytes, "t");
  }
  std::string path_;
  RingWriter writer_;
};

TEST_F(WaitNotes, ReadBackAsWrittenAndOnlyChangesAreRewritten) {
  write({note(1, 100), note(2, 100)});
  uint32_t version = writer_.header()->waitsVersion;
  EXPECT_EQ(version % 2, 0u);
  write({note(1, 100), note(2, 100)});
  EXPECT_EQ(writer_.header()->waitsVersion, version);  // nothing changed: nothing written
  write({note(2, 200)});
  EXPECT_EQ(writer_.header()->waitsVersion, version + 2);
  TraceFile file = readTraceFile(path_);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  ASSERT_EQ(file.waits.size(), 1u);
  EXPECT_EQ(file.waits[0].seq, 2u);
  EXPECT_EQ(file.waits[0].updatedNs, 200);
  EXPECT_EQ(file.waits[0].step, 3);
}

TEST_F(WaitNotes, ATableItsWriterEndedInsideKeepsItsWholeEntries) {
  write({note(1, 100), note(2, 100), note(3, 100)});
  TraceFile file = readWith([](RingHeader& header) {
    header.waitsVersion |= 1u;          // the writer ended inside a rewrite ...
    header.waits[0] = header.waits[1];  // ... having moved call 2 up to entry 0 (newer) ...
    header.waits[0].updatedNs = 200;
    header.waits[0].check = 0;
    header.waits[0].check = waitNoteCheck(header.waits[0]);
    header.waits[1].seq = 4;  // ... and written half of entry 1
  });
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "1 wait note torn: its writer ended inside it");
  ASSERT_EQ(file.waits.size(), 2u);
  EXPECT_EQ(file.waits[0].seq, 2u);
  EXPECT_EQ(file.waits[0].updatedNs, 200);
  EXPECT_EQ(file.waits[1].seq, 3u);
}

TEST_F(WaitNotes, ASettledEntryFailingItsCheckIsDroppedAndUncheckedOnesKept) {
  write({note(1, 100), note(2, 100)});
  TraceFile file = readWith([](RingHeader& header) {
    header.waits[0].peer = 7;   // damaged after it was written
    header.waits[1].check = 0;  // as a file before the checks holds it
  });
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "1 wait note fails its check: dropped");
  ASSERT_EQ(file.waits.size(), 1u);
  EXPECT_EQ(file.waits[0].seq, 2u);
}

// NCCL's message for the newest failed call: kept with that call's ring index; one caught being
// written is dropped, not read torn.
TEST(Ring, TheLastNcclErrorIsKeptWithItsCall) {
  std::string path = tempPath("last-error");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, 32, {1, 2, 1, "h", "j"}, nullptr));
  writer.append(makeRecord(1));
  uint64_t failed = writer.append(makeRecord(2));
  writer.noteLastError(failed,
                       "Duplicate GPU detected : rank 1 and rank 2 both on CUDA device 1000");
  TraceFile file = readTraceFile(path);
  EXPECT_EQ(file.lastNcclError,
            "Duplicate GPU detected : rank 1 and rank 2 both on CUDA device 1000");
  EXPECT_EQ(file.lastNcclErrorIndex, failed);
  // A later failure NCCL gave no message of its own: the thread's old one stays with its call.
  uint64_t later = writer.append(makeRecord(3));
  writer.noteLastError(later,
                       "Duplicate GPU detected : rank 1 and rank 2 both on CUDA device 1000");
  EXPECT_EQ(readTraceFile(path).lastNcclErrorIndex, failed);
  std::vector<std::byte> bytes = fileBytes(path);
  reinterpret_cast<RingHeader*>(bytes.data())->lastErrorIndex = kLastErrorWriting;
  file = parseTrace(bytes, "t");
  EXPECT_TRUE(file.lastNcclError.empty());
  writer.close();
  unlink(path.c_str());
}

TEST(RingStorage, ReservesEveryBlockOfTheFile) {
  std::string path = tempPath("reserved");
  RingWriter writer;
  std::string error;
  ASSERT_TRUE(writer.open(path, 1024, {0, 1, 0, "h", "j"}, &error)) << error;
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  // Not sparse: the blocks behind every byte of the mapping exist before the first store.
  EXPECT_GE(static_cast<uint64_t>(info.st_blocks) * 512, static_cast<uint64_t>(info.st_size));
  EXPECT_FALSE(writer.memoryOnly());
}

TEST(RingStorage, InMemoryRingWorksWithoutAFile) {
  RingWriter writer;
  writer.openInMemory(RingOptions{64, TraceMode::kFull}, {2, 4, 2, "h", "j"});
  ASSERT_TRUE(writer.isOpen());
  EXPECT_TRUE(writer.memoryOnly());
  EXPECT_TRUE(writer.path().empty());
  uint64_t index = writer.append(makeRecord(7));
  EXPECT_TRUE(writer.updateState(index, RecordState::kCompleted, 1, 2));
  CallRecord back{};
  ASSERT_TRUE(writer.read(index, &back));
  EXPECT_EQ(back.state, RecordState::kCompleted);
  EXPECT_EQ(writer.persistSegments(true), 0u);
  // A dump has nowhere to go: refused and counted.
  EXPECT_FALSE(writer.appendDump("a dump"));
  EXPECT_EQ(writer.losses().unwrittenBlocks, 1u);
  EXPECT_EQ(writer.header()->unwrittenBlocks, 1u);
}

TEST(RingStorage, TruncatedFileFaultsIntoMemoryNotSigbus) {
  std::string path = tempPath("truncated-under");
  // In a child: a SIGBUS that escaped would end it with the signal.
  pid_t child = fork();
  if (child == 0) {
    RingWriter writer;
    if (!writer.open(path, 64, {1, 2, 1, "h", "j"}, nullptr)) _exit(2);
    uint64_t before = 0;
    for (int i = 0; i < 100; ++i) before = writer.append(makeRecord(i));
    before = writer.nextIndex();
    if (truncate(path.c_str(), 0) != 0) _exit(3);
    uint64_t index = writer.append(makeRecord(1000));  // faults, repaired, retried
    CallRecord back{};
    if (!writer.read(index, &back) || back.seq != makeRecord(1000).seq) _exit(4);
    if (!writer.memoryOnly() || writer.losses().mappingFaults == 0) _exit(5);
    if (index <= before) _exit(6);  // indices never go backwards
    if (writer.header()->capacity != 64 || writer.header()->rank != 1) _exit(7);
    if (writer.appendDump("after")) _exit(8);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

sigjmp_buf g_otherFault;
void onOtherFault(int) {
  siglongjmp(g_otherFault, 1);
}

TEST(RingStorage, OtherSigbusStillReachesTheProgramsHandler) {
  std::string path = tempPath("other-sigbus");
  pid_t child = fork();
  if (child == 0) {
    signal(SIGBUS, onOtherFault);
    RingWriter writer;
    if (!writer.open(path, 64, {1, 2, 1, "h", "j"}, nullptr)) _exit(2);
    // A mapping of the program's own, past its file's end.
    std::string other = path + ".other";
    int fd = ::open(other.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) _exit(3);
    auto* bytes =
        static_cast<volatile char*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (sigsetjmp(g_otherFault, 1) == 0) {
      bytes[4096] = 1;  // the program's own SIGBUS
      _exit(4);
    }
    _exit(writer.losses().mappingFaults == 0 ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(RingStorage, FileSizeLimitRefusesWithoutSigxfsz) {
  std::string path = tempPath("fsize-limit");
  pid_t child = fork();
  if (child == 0) {
    rlimit limit{64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    RingWriter writer;
    std::string error;
    // 16 KiB of header and 1024 records of 128 bytes: past the limit.
    if (writer.open(path, 1024, {0, 1, 0, "h", "j"}, &error)) _exit(3);
    if (error.find("File too large") == std::string::npos) _exit(4);
    if (access(path.c_str(), F_OK) == 0) _exit(5);  // nothing half-made left behind
    // A ring that fits; a dump that would cross the limit is refused and counted.
    if (!writer.open(path, 256, {0, 1, 0, "h", "j"}, &error)) _exit(6);
    if (writer.appendDump(std::string(40 << 10, 'x'))) _exit(7);
    if (writer.losses().unwrittenBlocks != 1) _exit(8);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
