// Continuous mode (NCCLWATCH_TRACE=full): a persisting thread appends ring segments to the file,
// so that the whole run is kept; what falls behind is counted exactly; truncated and corrupted
// segments are salvaged with exact problem reports.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>
#include <vector>

#include "trace/ring_reader.h"
#include "trace/ring_writer.h"
#include "trace_files.h"

namespace {

using namespace ncclwatch::trace;

constexpr RingOptions kFull64{64, TraceMode::kFull};
constexpr uint64_t kRingEnd64 = kRingHeaderBytes + 64 * sizeof(CallRecord);

std::string tempPath(const std::string& name) {
  return tracetest::tempPath("continuous-test", name);
}

using tracetest::fileBytes;
using tracetest::makeRecord;

uint64_t segmentBytes(uint64_t records) {
  return sizeof(SegmentHeader) + records * sizeof(CallRecord);
}

// Appends `count` records (seq from `firstSeq`), each completed at once.
void appendCompleted(RingWriter& writer, uint64_t firstSeq, uint64_t count) {
  for (uint64_t seq = firstSeq; seq < firstSeq + count; ++seq) {
    uint64_t index = writer.append(makeRecord(seq));
    writer.updateState(index, RecordState::kCompleted, 1, 2);
  }
}

void expectConsecutive(const TraceFile& file, uint64_t firstIndex) {
  for (size_t i = 0; i < file.records.size(); ++i) {
    ASSERT_EQ(file.records[i].ringIndex, firstIndex + i);
    ASSERT_EQ(file.records[i].seq, firstIndex + i + 1);
  }
}

TEST(Continuous, RingModeWritesNoSegments) {
  std::string path = tempPath("ringmode");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, 16, {}, nullptr));
  EXPECT_FALSE(writer.continuous());
  appendCompleted(writer, 1, 40);
  EXPECT_EQ(writer.persistSegments(true), 0u);
  writer.close();
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(static_cast<uint64_t>(info.st_size), kRingHeaderBytes + 16 * sizeof(CallRecord));
  TraceFile file = readTraceFile(path);
  EXPECT_FALSE(file.continuous);
  EXPECT_EQ(file.header.traceMode, 0u);
  EXPECT_EQ(file.records.size(), 16u);
  EXPECT_EQ(file.lostRecords, 0u);
  unlink(path.c_str());
}

// 100k records through a 64-slot ring: the appender waits whenever it gets 48 records ahead of
// the persisting thread, so nothing is dropped and every record is kept in its final state.
TEST(Continuous, KeepsEveryRecordOfARunInOrder) {
  std::string path = tempPath("all");
  RingWriter writer;
  std::string error;
  ASSERT_TRUE(writer.open(path, kFull64, {0, 1, 0, "h", "j"}, &error)) << error;
  EXPECT_TRUE(writer.continuous());
  constexpr uint64_t kRecords = 100000;
  std::atomic<bool> done{false};
  std::thread persister([&] {
    while (!done.load()) {
      if (writer.persistSegments() == 0) std::this_thread::yield();
    }
  });
  for (uint64_t seq = 1; seq <= kRecords; ++seq) {
    while (seq - 1 - writer.persistedRecords() >= 48) std::this_thread::yield();
    uint64_t index = writer.append(makeRecord(seq));
    writer.updateState(index, seq % 3 ? RecordState::kCompleted : RecordState::kFailed,
                       static_cast<int64_t>(seq) * 1000 + 1, static_cast<int64_t>(seq) * 1000 + 2);
  }
  done.store(true);
  persister.join();
  writer.close();

  TraceFile file = readTraceFile(path);
  ASSERT_TRUE(file.usable);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_TRUE(file.continuous);
  EXPECT_EQ(file.header.droppedRecords, 0u);
  EXPECT_EQ(file.header.persistedRecords, kRecords);
  EXPECT_EQ(file.lostRecords, 0u);
  EXPECT_EQ(file.ringRecords, 64u);
  EXPECT_EQ(file.segmentRecords, kRecords);
  ASSERT_EQ(file.records.size(), kRecords);
  expectConsecutive(file, 0);
  for (const CallRecord& record : file.records) {
    ASSERT_EQ(record.state, record.seq % 3 ? RecordState::kCompleted : RecordState::kFailed);
    ASSERT_EQ(record.completeNs, static_cast<int64_t>(record.seq) * 1000 + 2);
    ASSERT_EQ(record.count, record.seq * 10);
  }
  unlink(path.c_str());
}

TEST(Continuous, PersisterNeverCalledCountsExactDrops) {
  std::string path = tempPath("drops");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, kFull64, {}, nullptr));
  appendCompleted(writer, 1, 1000);
  EXPECT_EQ(writer.persistSegments(), 64u);  // the ring's records, all final
  EXPECT_EQ(writer.persistedRecords(), 1000u);
  appendCompleted(writer, 1001, 10);
  writer.close();  // persists the last ten
  TraceFile file = readTraceFile(path);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.droppedRecords, 936u);
  EXPECT_EQ(file.lostRecords, 936u);
  EXPECT_EQ(file.segments, 2u);
  ASSERT_EQ(file.records.size(), 74u);
  expectConsecutive(file, 936);
  unlink(path.c_str());
}

TEST(Continuous, SlowPersisterCountsExactDrops) {
  std::string path = tempPath("slow");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, kFull64, {}, nullptr));
  // Five rounds of 200 records, one persist each: 136 of every 200 are overwritten first.
  for (uint64_t round = 0; round < 5; ++round) {
    appendCompleted(writer, round * 200 + 1, 200);
    EXPECT_EQ(writer.persistSegments(), 64u);
  }
  writer.close();
  TraceFile file = readTraceFile(path);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.droppedRecords, 5 * 136u);
  EXPECT_EQ(file.lostRecords, 5 * 136u);
  ASSERT_EQ(file.records.size(), 5 * 64u);
  for (uint64_t round = 0; round < 5; ++round) {
    EXPECT_EQ(file.records[round * 64].ringIndex, round * 200 + 136);
  }
  unlink(path.c_str());
}

// Unfinished records wait in the ring until it is more than half a capacity ahead of them; the
// ring's newer copy wins over a persisted one; an overwritten record keeps its persisted copy.
TEST(Continuous, UnfinishedRecordsArePersistedOnlyWhenTheRingRunsAhead) {
  std::string path = tempPath("unfinished");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, kFull64, {}, nullptr));
  for (uint64_t seq = 1; seq <= 40; ++seq) writer.append(makeRecord(seq));
  EXPECT_EQ(writer.persistSegments(), 8u);  // indices 0..7 are more than 32 behind
  EXPECT_EQ(writer.persistedRecords(), 8u);
  EXPECT_EQ(writer.persistSegments(), 0u);  // index 8 is still issued
  EXPECT_TRUE(writer.updateState(0, RecordState::kCompleted, 5, 6));
  EXPECT_TRUE(writer.updateState(8, RecordState::kCompleted, 5, 6));
  EXPECT_EQ(writer.persistSegments(), 1u);  // 8 is final now; 9 is not

  TraceFile live = readTraceFile(path);
  EXPECT_TRUE(live.problems.empty()) << live.problems[0].what;
  ASSERT_EQ(live.records.size(), 40u);
  EXPECT_EQ(live.records[0].state, RecordState::kCompleted);  // the ring's copy
  EXPECT_EQ(live.segmentRecords, 9u);

  // A record issued without events is final only after the grace period.
  CallRecord noEvents = makeRecord(41);
  noEvents.flags = kRecordNoEvents;
  noEvents.issueNs = std::numeric_limits<int64_t>::max() / 2;  // "just now", far ahead
  for (uint64_t index = 9; index < 40; ++index) {
    writer.updateState(index, RecordState::kAborted, 0, 0);
  }
  writer.append(noEvents);
  EXPECT_EQ(writer.persistSegments(), 31u);  // 9..39, not the fresh one

  for (uint64_t seq = 42; seq <= 140; ++seq) {
    writer.append(makeRecord(seq));
    writer.persistSegments();  // takes what falls more than 32 behind
  }
  EXPECT_EQ(writer.persistedRecords(), 140u - 32u);
  writer.close();
  TraceFile file = readTraceFile(path);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.droppedRecords, 0u);
  ASSERT_EQ(file.records.size(), 140u);
  expectConsecutive(file, 0);
  EXPECT_EQ(file.records[0].state, RecordState::kIssued);  // persisted before it completed
  EXPECT_EQ(file.records[8].state, RecordState::kCompleted);
  EXPECT_EQ(file.records[20].state, RecordState::kAborted);
  EXPECT_EQ(file.records[40].flags, uint8_t{kRecordNoEvents});
  unlink(path.c_str());
}

TEST(Continuous, SigkilledWriterKeepsSegmentsAndRing) {
  std::string path = tempPath("killed");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    RingWriter writer;
    if (!writer.open(path, kFull64, {5, 8, 5, "h", "j"}, nullptr)) _exit(1);
    for (uint64_t round = 0; round < 10; ++round) {
      appendCompleted(writer, round * 50 + 1, 50);
      writer.persistSegments();
    }
    appendCompleted(writer, 501, 30);  // only in the ring
    char byte = 1;
    (void)!write(ready[1], &byte, 1);
    pause();
    _exit(0);
  }
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  TraceFile file = readTraceFile(path);
  ASSERT_TRUE(file.usable);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.cleanShutdown, 0u);
  EXPECT_EQ(file.segmentRecords, 500u);
  EXPECT_EQ(file.lostRecords, 0u);
  ASSERT_EQ(file.records.size(), 530u);
  expectConsecutive(file, 0);
  unlink(path.c_str());
}

// A file of 300 records: segments of 50 (indices 0..299), the ring holding 236..299.
class SegmentSalvage : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tempPath("salvage");
    RingWriter writer;
    ASSERT_TRUE(writer.open(path_, kFull64, {1, 2, 1, "h", "j"}, nullptr));
    for (uint64_t round = 0; round < 6; ++round) {
      appendCompleted(writer, round * 50 + 1, 50);
      ASSERT_EQ(writer.persistSegments(), 50u);
    }
    writer.close();
    bytes_ = fileBytes(path_);
    unlink(path_.c_str());
    ASSERT_EQ(bytes_.size(), kRingEnd64 + 6 * segmentBytes(50));
  }
  uint64_t segmentAt(uint64_t k) const { return kRingEnd64 + k * segmentBytes(50); }
  std::string path_;
  std::vector<std::byte> bytes_;
};

TEST_F(SegmentSalvage, IntactFileReadsWhole) {
  TraceFile file = parseTrace(bytes_, "t");
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.segments, 6u);
  EXPECT_EQ(file.header.persistedBytes, bytes_.size());
  ASSERT_EQ(file.records.size(), 300u);
  expectConsecutive(file, 0);
}

TEST_F(SegmentSalvage, TruncatedMidSegmentKeepsItsWholeRecords) {
  // Cut inside segment 2 after 10.5 records: 0..99 from segments, 100..109 salvaged, 236..299
  // from the ring.
  size_t keep = segmentAt(2) + sizeof(SegmentHeader) + 10 * sizeof(CallRecord) + 64;
  TraceFile file = parseTrace(std::span(bytes_.data(), keep), "t");
  ASSERT_TRUE(file.usable);
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].offset, segmentAt(2));
  EXPECT_EQ(file.problems[0].what, "segment at offset " + std::to_string(segmentAt(2)) +
                                       " truncated: 10 of 50 records present");
  EXPECT_EQ(file.segments, 3u);
  EXPECT_EQ(file.segmentRecords, 110u);
  ASSERT_EQ(file.records.size(), 110u + 64u);
  EXPECT_EQ(file.records[109].ringIndex, 109u);
  EXPECT_EQ(file.records[110].ringIndex, 236u);
  EXPECT_EQ(file.lostRecords, 126u);

  // Inside a segment header.
  keep = segmentAt(4) + 20;
  file = parseTrace(std::span(bytes_.data(), keep), "t");
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "segment at offset " + std::to_string(segmentAt(4)) +
                                       " truncated: 20 of 32 header bytes present");
  EXPECT_EQ(file.records.size(), 200u + 64u);

  // At a segment boundary: only the header knows.
  keep = segmentAt(5);
  file = parseTrace(std::span(bytes_.data(), keep), "t");
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].offset, keep);
  EXPECT_EQ(file.problems[0].what, "file truncated: it ends at offset " + std::to_string(keep) +
                                       ", the header says segments end at " +
                                       std::to_string(bytes_.size()));
  EXPECT_EQ(file.records.size(), 250u + 50u);  // 236..249 are in both
  EXPECT_EQ(file.lostRecords, 0u);
}

TEST_F(SegmentSalvage, CorruptSegmentsAreNamedAndSkipped) {
  // A flipped byte in a record of segment 1, a wrong magic on segment 3.
  bytes_[segmentAt(1) + sizeof(SegmentHeader) + 7 * sizeof(CallRecord) + 40] ^= std::byte{0x10};
  bytes_[segmentAt(3)] = std::byte{'X'};
  TraceFile file = parseTrace(bytes_, "t");
  ASSERT_TRUE(file.usable);
  ASSERT_EQ(file.problems.size(), 2u);
  EXPECT_EQ(file.problems[0].offset, segmentAt(1));
  EXPECT_EQ(file.problems[0].what, "segment at offset " + std::to_string(segmentAt(1)) +
                                       ": checksum mismatch, its 50 records skipped");
  EXPECT_EQ(file.problems[1].offset, segmentAt(3));
  EXPECT_EQ(file.problems[1].what, "segment at offset " + std::to_string(segmentAt(3)) +
                                       ": bad magic, skipped to offset " +
                                       std::to_string(segmentAt(4)));
  EXPECT_EQ(file.segments, 4u);
  EXPECT_EQ(file.records.size(), 200u);
  EXPECT_EQ(file.lostRecords, 100u);
  EXPECT_EQ(file.records[50].ringIndex, 100u);

  // A corrupt record count: the reader resynchronizes on the next segment.
  std::vector<std::byte> badCount = bytes_;
  auto* header = reinterpret_cast<SegmentHeader*>(badCount.data() + segmentAt(0));
  header->recordCount = kMaxSegmentRecords + 1;
  file = parseTrace(badCount, "t");
  ASSERT_GE(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "segment at offset " + std::to_string(segmentAt(0)) +
                                       ": record count 65537 out of range, skipped to offset " +
                                       std::to_string(segmentAt(1)));
}

TEST_F(SegmentSalvage, TrailingGarbageAfterTheLastSegment) {
  // A process killed inside pwrite: a segment header and a partial record past persistedBytes.
  std::vector<std::byte> longer = bytes_;
  longer.insert(longer.end(), bytes_.begin() + static_cast<long>(segmentAt(0)),
                bytes_.begin() + static_cast<long>(segmentAt(0) + sizeof(SegmentHeader) + 100));
  TraceFile file = parseTrace(longer, "t");
  ASSERT_EQ(file.problems.size(), 1u);
  EXPECT_EQ(file.problems[0].what, "segment at offset " + std::to_string(bytes_.size()) +
                                       " truncated: 0 of 50 records present");
  EXPECT_EQ(file.records.size(), 300u);
}

// One appender (with state and result updates) and one persister running freely: whatever is
// not kept is counted, nothing is torn. Run under -DNCCLWATCH_SANITIZE=thread as well.
TEST(Continuous, ConcurrentAppenderAndPersister) {
  std::string path = tempPath("concurrent");
  RingWriter writer;
  ASSERT_TRUE(writer.open(path, kFull64, {}, nullptr));
  std::atomic<bool> done{false};
  size_t persisted = 0;
  std::thread persister([&] {
    while (!done.load()) persisted += writer.persistSegments();
  });
  std::thread appender([&] {
    for (uint64_t seq = 1; seq <= 20000; ++seq) {
      CallRecord record = makeRecord(seq);
      if (seq % 2) record.flags = kRecordNoEvents;
      uint64_t index = writer.append(record);
      if (seq % 5 == 0) writer.updateResult(index, 3);
      if (seq % 2 == 0) writer.updateState(index, RecordState::kCompleted, 1, 2);
      if (seq % 16 == 0) std::this_thread::yield();  // let the persister in now and then
    }
  });
  appender.join();
  done.store(true);
  persister.join();
  writer.close();
  TraceFile file = readTraceFile(path);
  EXPECT_TRUE(file.problems.empty()) << file.problems[0].what;
  EXPECT_EQ(file.header.nextIndex, 20000u);
  EXPECT_EQ(file.lostRecords, file.header.droppedRecords);
  EXPECT_EQ(file.records.size() + file.lostRecords, 20000u);
  EXPECT_GE(file.segmentRecords, persisted);
  for (const CallRecord& record : file.records) {
    ASSERT_EQ(record.count, record.seq * 10);
    ASSERT_EQ(record.ringIndex + 1, record.seq);
  }
  EXPECT_EQ(file.records.back().seq, 20000u);
  std::printf("kept %zu of 20000 (%zu by the running persister), dropped %llu\n",
              file.records.size(), persisted,
              static_cast<unsigned long long>(file.header.droppedRecords));
  unlink(path.c_str());
}

}  // namespace
