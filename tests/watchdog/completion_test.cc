// The completion tracker against a scripted driver: events complete when the test says so, so
// every state change of a record (issued → started → completed, failed, aborted) and the reuse
// of pooled event pairs can be checked exactly.
#include "watchdog/completion.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "trace/ring_reader.h"
#include "watchdog/bounded_queue.h"

namespace {

using ncclwatch::trace::CallRecord;
using ncclwatch::trace::RecordState;
using ncclwatch::watchdog::BoundedQueue;
using ncclwatch::watchdog::CompletionTracker;
using ncclwatch::watchdog::DriverApi;
using ncclwatch::watchdog::EventMode;
using ncclwatch::watchdog::kNoTicket;
using ncclwatch::watchdog::StreamCheck;
using ncclwatch::watchdog::Ticket;

// The scripted driver: an event is an index into `events`; recording makes it pending on its
// stream, and the test completes a stream's work up to a point by "draining" it.
struct FakeDriver {
  struct Event {
    bool done = true;
    uint64_t stream = 0;
  };
  std::vector<Event> events{1};  // index 0 unused: a null CUevent
  std::map<uint64_t, CUstreamCaptureStatus> capture;
  CUcontext context = reinterpret_cast<CUcontext>(0x1000);
  CUstreamCaptureMode threadMode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  int failRecords = 0;
};
FakeDriver* g_fake = nullptr;

CUevent asEvent(size_t index) {
  return reinterpret_cast<CUevent>(index);
}
size_t asIndex(CUevent event) {
  return reinterpret_cast<size_t>(event);
}

DriverApi fakeApi() {
  DriverApi api;
  api.ctxGetCurrent = [](CUcontext* context) {
    *context = g_fake->context;
    return CUDA_SUCCESS;
  };
  api.ctxSetCurrent = [](CUcontext) { return CUDA_SUCCESS; };
  api.eventCreate = [](CUevent* event, unsigned) {
    g_fake->events.push_back({});
    *event = asEvent(g_fake->events.size() - 1);
    return CUDA_SUCCESS;
  };
  api.eventRecord = [](CUevent event, CUstream stream) {
    if (g_fake->failRecords > 0) {
      --g_fake->failRecords;
      return CUDA_ERROR_INVALID_HANDLE;
    }
    g_fake->events[asIndex(event)] = {false, reinterpret_cast<uint64_t>(stream)};
    return CUDA_SUCCESS;
  };
  api.eventQuery = [](CUevent event) {
    return g_fake->events[asIndex(event)].done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  };
  api.eventDestroy = [](CUevent) { return CUDA_SUCCESS; };
  api.streamIsCapturing = [](CUstream stream, CUstreamCaptureStatus* status) {
    auto found = g_fake->capture.find(reinterpret_cast<uint64_t>(stream));
    *status = found == g_fake->capture.end() ? CU_STREAM_CAPTURE_STATUS_NONE : found->second;
    return CUDA_SUCCESS;
  };
  api.threadExchangeStreamCaptureMode = [](CUstreamCaptureMode* mode) {
    std::swap(*mode, g_fake->threadMode);
    return CUDA_SUCCESS;
  };
  return api;
}

class CompletionTest : public testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake_;
    path_ = std::string(testing::TempDir()) + "/completion-" + std::to_string(getpid()) + "-" +
            testing::UnitTest::GetInstance()->current_test_info()->name() + ".ncclwatch";
    std::string error;
    ASSERT_TRUE(writer_.open(path_, 1024, {}, &error)) << error;
    tracker_ = std::make_unique<CompletionTracker>(api_, writer_, mode());
    tracker_->prepareCurrentContext();
  }
  // The tests of this fixture watch both events of a pair (NCCLWATCH_EVENTS=full); the default
  // one-event mode has its own fixture below.
  virtual EventMode mode() const { return EventMode::kFull; }
  void TearDown() override {
    tracker_.reset();
    writer_.close();
    std::filesystem::remove(path_);
    g_fake = nullptr;
  }
  uint64_t appendIssued() {
    CallRecord record{};
    record.op = ncclwatch::trace::OpKind::kAllReduce;
    record.state = RecordState::kIssued;
    record.issueNs = 1;
    return writer_.append(record);
  }
  // Completes every event recorded on `stream` so far (the GPU caught up with it).
  void drain(uint64_t stream) {
    for (auto& event : fake_.events) {
      if (event.stream == stream) event.done = true;
    }
  }
  void completeBeforeOnly(Ticket ticket, uint64_t stream) {
    (void)ticket;
    // The "before" event is the older of the stream's two pending events.
    for (auto& event : fake_.events) {
      if (event.stream == stream && !event.done) {
        event.done = true;
        return;
      }
    }
  }
  // Every record of the trace file, by ring index: one read of the file for many checks.
  std::map<uint64_t, CallRecord> snapshot() {
    std::map<uint64_t, CallRecord> records;
    for (const CallRecord& record : ncclwatch::trace::readTraceFile(path_).records) {
      records[record.ringIndex] = record;
    }
    return records;
  }
  CallRecord read(uint64_t index) {
    ncclwatch::trace::TraceFile file = ncclwatch::trace::readTraceFile(path_);
    for (const CallRecord& record : file.records) {
      if (record.ringIndex == index) return record;
    }
    ADD_FAILURE() << "record " << index << " not in the trace";
    return {};
  }
  // One call on `stream`: before event, the call, after event, submitted.
  uint64_t trackedCall(uint64_t stream) {
    uint64_t index = appendIssued();
    Ticket ticket = tracker_->recordBefore(stream);
    EXPECT_NE(ticket, kNoTicket);
    EXPECT_TRUE(tracker_->recordAfter(ticket, stream));
    tracker_->submit(ticket, std::span<const uint64_t>(&index, 1), 42, stream, true);
    return index;
  }

  FakeDriver fake_;
  DriverApi api_ = fakeApi();
  ncclwatch::trace::RingWriter writer_;
  std::unique_ptr<CompletionTracker> tracker_;
  std::string path_;
};

TEST_F(CompletionTest, RecordGoesIssuedStartedCompleted) {
  uint64_t index = trackedCall(7);
  EXPECT_EQ(tracker_->poll(), 1u);
  EXPECT_EQ(read(index).state, RecordState::kIssued);
  completeBeforeOnly(0, 7);
  EXPECT_EQ(tracker_->poll(), 1u);
  CallRecord started = read(index);
  EXPECT_EQ(started.state, RecordState::kStarted);
  EXPECT_GT(started.startNs, 0);
  EXPECT_EQ(started.completeNs, 0);
  drain(7);
  EXPECT_EQ(tracker_->poll(), 0u);
  CallRecord completed = read(index);
  EXPECT_EQ(completed.state, RecordState::kCompleted);
  EXPECT_EQ(completed.startNs, started.startNs);  // the first sighting is kept
  EXPECT_GE(completed.completeNs, completed.startNs);
}

// The hang thresholds are 10 times a communicator's recent latency. Its first call waits for
// the ranks' start skew and NCCL's connection set-up: it does not count; the next ones do.
TEST_F(CompletionTest, ACommunicatorsFirstCallDoesNotSetItsRecentLatency) {
  uint64_t first = trackedCall(7);  // issued at 1 ns: "completes" decades late
  drain(7);
  tracker_->poll();
  ASSERT_EQ(read(first).state, RecordState::kCompleted);
  ASSERT_EQ(tracker_->progress().size(), 1u);
  EXPECT_EQ(tracker_->progress()[0].recentLatencyNs, 0);
  uint64_t second = trackedCall(7);
  drain(7);
  tracker_->poll();
  ASSERT_EQ(read(second).state, RecordState::kCompleted);
  EXPECT_GT(tracker_->progress()[0].recentLatencyNs, 0);
}

TEST_F(CompletionTest, GroupRecordsSharingOnePairCompleteTogether) {
  uint64_t indices[3] = {appendIssued(), appendIssued(), appendIssued()};
  Ticket ticket = tracker_->recordBefore(9);
  ASSERT_TRUE(tracker_->recordAfter(ticket, 9));
  tracker_->submit(ticket, indices, 42, 9, true);
  EXPECT_EQ(tracker_->poll(), 3u);
  drain(9);
  EXPECT_EQ(tracker_->poll(), 0u);
  auto records = snapshot();
  for (uint64_t index : indices) EXPECT_EQ(records[index].state, RecordState::kCompleted);
}

TEST_F(CompletionTest, PairsAreReusedAndAReusedPairForgetsItsOldState) {
  // Far more calls than the initial pool: every pair comes back and is reused, and a reused
  // pair's new call does not inherit the completion of its previous use.
  for (int round = 0; round < 5; ++round) {
    std::vector<uint64_t> indices;
    for (uint32_t i = 0; i < CompletionTracker::kInitialPairs; ++i) {
      indices.push_back(trackedCall(3));
    }
    tracker_->poll();
    auto issued = snapshot();
    for (uint64_t index : indices) EXPECT_EQ(issued[index].state, RecordState::kIssued);
    drain(3);
    EXPECT_EQ(tracker_->poll(), 0u);
    auto completed = snapshot();
    for (uint64_t index : indices) EXPECT_EQ(completed[index].state, RecordState::kCompleted);
  }
  EXPECT_EQ(tracker_->counters().noPair.load(), 0u);
}

TEST_F(CompletionTest, AnEmptyPoolIsCountedAndGrownByThePoller) {
  std::vector<Ticket> held;
  for (uint32_t i = 0; i < CompletionTracker::kInitialPairs; ++i) {
    held.push_back(tracker_->recordBefore(5));
  }
  EXPECT_EQ(tracker_->recordBefore(5), kNoTicket);
  EXPECT_EQ(tracker_->counters().noPair.load(), 1u);
  // Every pair is back by the time the watchdog polls, as when calls complete quickly between
  // polls: the pool still grows, because calls found it empty.
  for (Ticket ticket : held) tracker_->abandon(ticket);
  tracker_->poll();
  for (uint32_t i = 0; i <= CompletionTracker::kInitialPairs + CompletionTracker::kGrowPairs / 2;
       ++i) {
    EXPECT_NE(tracker_->recordBefore(5), kNoTicket) << i;
  }
  EXPECT_EQ(tracker_->counters().noPair.load(), 1u);
}

// A new pool is topped up in the background: after the watchdog's next pass, a burst of
// kWarmPairs calls finds an event each with none shed, though none has completed yet.
TEST_F(CompletionTest, TheWatchdogTopsANewPoolUpBeforeABurst) {
  tracker_->poll();
  for (uint32_t i = 0; i < CompletionTracker::kWarmPairs; ++i) {
    ASSERT_NE(tracker_->recordBefore(8), kNoTicket) << i;
  }
  EXPECT_EQ(tracker_->counters().noPair.load(), 0u);
}

// Back-to-back calls: more in flight than the whole first pool. The calls that found it empty
// are counted and said to be shed (the poller was woken for them), the pool quadruples at the
// next poll, and the poller asks to come back within a millisecond while the pressure lasts.
TEST_F(CompletionTest, ACallThatFindsThePoolEmptyIsShedCountedAndThePoolQuadruples) {
  std::vector<uint64_t> indices;
  for (uint32_t i = 0; i < CompletionTracker::kInitialPairs; ++i) indices.push_back(trackedCall(6));
  bool shed = false;
  EXPECT_EQ(tracker_->recordBefore(6, &shed), kNoTicket);
  EXPECT_TRUE(shed);
  EXPECT_TRUE(tracker_->underPressure());
  tracker_->poll();  // nothing finished yet: the pool grows by at least 3 x its size
  for (uint32_t i = 0; i < 3 * CompletionTracker::kInitialPairs; ++i) {
    EXPECT_NE(tracker_->recordBefore(6), kNoTicket) << i;
  }
  drain(6);
  tracker_->poll();
  auto records = snapshot();  // one read of the file: a read per record is slow under TSan
  for (uint64_t index : indices) EXPECT_EQ(records[index].state, RecordState::kCompleted);
}

// A stream's calls finish in order: a pass that finds one unfinished leaves the later ones on
// that stream unqueried, and still completes another stream's.
TEST_F(CompletionTest, ALaterCallOnABlockedStreamWaitsAndAnotherStreamCompletes) {
  uint64_t first = trackedCall(11);
  uint64_t second = trackedCall(11);
  uint64_t other = trackedCall(12);
  drain(12);
  EXPECT_EQ(tracker_->poll(), 2u);
  EXPECT_EQ(read(other).state, RecordState::kCompleted);
  EXPECT_EQ(read(first).state, RecordState::kIssued);
  EXPECT_EQ(read(second).state, RecordState::kIssued);
  drain(11);
  EXPECT_EQ(tracker_->poll(), 0u);
  EXPECT_EQ(read(second).state, RecordState::kCompleted);
}

TEST_F(CompletionTest, FailedCallKeepsItsStateAndAbortedCommEndsAborted) {
  uint64_t failed = appendIssued();
  writer_.updateState(failed, RecordState::kFailed, 0, 0);
  Ticket ticket = tracker_->recordBefore(4);
  ASSERT_TRUE(tracker_->recordAfter(ticket, 4));
  tracker_->submit(ticket, std::span<const uint64_t>(&failed, 1), 42, 4, false);
  uint64_t hung = trackedCall(4);
  tracker_->markAborted(42);
  EXPECT_EQ(tracker_->poll(), 0u);
  EXPECT_EQ(read(failed).state, RecordState::kFailed);
  EXPECT_EQ(read(hung).state, RecordState::kAborted);
}

TEST_F(CompletionTest, CapturedStreamsAreReportedAndRecordErrorsCounted) {
  fake_.capture[11] = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  EXPECT_EQ(tracker_->checkStream(11), StreamCheck::kCaptured);
  EXPECT_EQ(tracker_->checkStream(12), StreamCheck::kTrackable);
  fake_.failRecords = 1;
  EXPECT_EQ(tracker_->recordBefore(12), kNoTicket);
  EXPECT_EQ(tracker_->counters().recordErrors.load(), 1u);
}

TEST_F(CompletionTest, PollingThreadUsesThreadLocalCaptureMode) {
  tracker_->enterPollingThread();
  EXPECT_EQ(fake_.threadMode, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
}

// One event per call (the default): no start event is recorded; a call is "started" (flagged
// inferred) once every earlier tracked call on its stream completed.
class OneEventCompletionTest : public CompletionTest {
 protected:
  EventMode mode() const override { return EventMode::kEnd; }
};

TEST_F(OneEventCompletionTest, OneDriverRecordPerCallAndStartInferredFromStreamOrder) {
  size_t eventsBefore = 0;
  for (const auto& event : fake_.events) eventsBefore += event.done ? 0 : 1;
  EXPECT_EQ(eventsBefore, 0u);
  uint64_t first = trackedCall(21);
  uint64_t second = trackedCall(21);
  size_t pending = 0;
  for (const auto& event : fake_.events) pending += event.done ? 0 : 1;
  EXPECT_EQ(pending, 2u) << "one event per call, not two";

  EXPECT_EQ(tracker_->poll(), 2u);
  // The first call heads its stream: reached, flagged inferred. The second waits behind it.
  CallRecord head = read(first);
  EXPECT_EQ(head.state, RecordState::kStarted);
  EXPECT_NE(head.flags & ncclwatch::trace::kRecordStartInferred, 0);
  EXPECT_EQ(read(second).state, RecordState::kIssued);

  // The first completes (its event is the stream's older one): the second now heads the stream.
  completeBeforeOnly(0, 21);
  EXPECT_EQ(tracker_->poll(), 1u);
  EXPECT_EQ(read(first).state, RecordState::kCompleted);
  CallRecord next = read(second);
  EXPECT_EQ(next.state, RecordState::kStarted);
  EXPECT_NE(next.flags & ncclwatch::trace::kRecordStartInferred, 0);
  drain(21);
  EXPECT_EQ(tracker_->poll(), 0u);
  EXPECT_EQ(read(second).state, RecordState::kCompleted);
}

// A call stuck on one stream leaves another stream's calls free to head theirs; a group's calls
// that share one event on a stream head it together.
TEST_F(OneEventCompletionTest, StreamsAreIndependentAndAGroupHeadsItsStreamTogether) {
  uint64_t stuck = trackedCall(31);
  uint64_t behind = trackedCall(31);
  uint64_t group[2] = {appendIssued(), appendIssued()};
  Ticket ticket = tracker_->recordBefore(32);
  ASSERT_NE(ticket, kNoTicket);
  ASSERT_TRUE(tracker_->recordAfter(ticket, 32));
  tracker_->submit(ticket, group, 42, 32, true);
  EXPECT_EQ(tracker_->poll(), 4u);
  auto records = snapshot();
  EXPECT_EQ(records[stuck].state, RecordState::kStarted);
  EXPECT_EQ(records[behind].state, RecordState::kIssued);
  for (uint64_t index : group) {
    EXPECT_EQ(records[index].state, RecordState::kStarted) << index;
    EXPECT_NE(records[index].flags & ncclwatch::trace::kRecordStartInferred, 0);
  }
}

// Full mode never flags a start as inferred: it saw it.
TEST_F(CompletionTest, FullModeStartsAreSeenNotInferred) {
  uint64_t index = trackedCall(41);
  completeBeforeOnly(0, 41);
  tracker_->poll();
  CallRecord started = read(index);
  EXPECT_EQ(started.state, RecordState::kStarted);
  EXPECT_EQ(started.flags & ncclwatch::trace::kRecordStartInferred, 0);
}

// A record failure in one-event mode comes at the one record, after the call.
TEST_F(OneEventCompletionTest, ARecordErrorGivesThePairBack) {
  Ticket ticket = tracker_->recordBefore(12);
  ASSERT_NE(ticket, kNoTicket);
  fake_.failRecords = 1;
  EXPECT_FALSE(tracker_->recordAfter(ticket, 12));
  EXPECT_EQ(tracker_->counters().recordErrors.load(), 1u);
}

// A thread keeps a stash of free pairs (one locked instruction per chunk of them): the pairs
// of a thread that exits go back to the pool, so that threads coming and going never drain it.
TEST_F(CompletionTest, AThreadsStashOfPairsGoesBackWhenItExits) {
  for (int round = 0; round < 3; ++round) {
    std::thread caller([&] { EXPECT_NE(tracker_->recordBefore(5), kNoTicket); });
    caller.join();
  }
  // Three pairs are taken (never submitted); every other pair can be taken from this thread.
  std::vector<Ticket> held;
  for (uint32_t i = 0; i + 3 < CompletionTracker::kInitialPairs; ++i) {
    held.push_back(tracker_->recordBefore(5));
    ASSERT_NE(held.back(), kNoTicket) << i;
  }
  EXPECT_EQ(tracker_->recordBefore(5), kNoTicket);
  EXPECT_EQ(tracker_->counters().noPair.load(), 1u);
}

// Pairs taken from a stash and given back with abandon() are taken again: none is lost in a
// stash of a thread that moved on.
TEST_F(CompletionTest, StashedPairsAreNotLostWhenGivenBack) {
  for (int round = 0; round < 3; ++round) {
    std::vector<Ticket> held;
    for (uint32_t i = 0; i < CompletionTracker::kInitialPairs; ++i) {
      held.push_back(tracker_->recordBefore(7));
      ASSERT_NE(held.back(), kNoTicket) << round << " " << i;
    }
    for (Ticket ticket : held) tracker_->abandon(ticket);
  }
  EXPECT_EQ(tracker_->counters().noPair.load(), 0u);
}

TEST(BoundedQueue, PopManyTakesAChunkInOrder) {
  BoundedQueue<int, 8> queue;
  int values[8] = {};
  EXPECT_EQ(queue.popMany(values, 4), 0u);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(queue.push(i));
  ASSERT_EQ(queue.popMany(values, 4), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(values[i], i);
  for (int i = 6; i < 12; ++i) EXPECT_TRUE(queue.push(i));  // wraps around
  EXPECT_FALSE(queue.push(12));
  ASSERT_EQ(queue.popMany(values, 3), 3u);
  EXPECT_EQ(values[0], 4);
  EXPECT_EQ(values[2], 6);
  ASSERT_EQ(queue.popMany(values, 8), 5u);
  EXPECT_EQ(values[4], 11);
  EXPECT_EQ(queue.popMany(values, 8), 0u);
}

TEST(BoundedQueue, ChunkConsumersAndProducersLoseAndDuplicateNothing) {
  constexpr int kProducers = 2, kEach = 30000;
  BoundedQueue<int, 256> queue;
  std::vector<std::atomic<int>> seen(kProducers * kEach);
  std::atomic<int> received{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&queue, p] {
      for (int i = 0; i < kEach; ++i) {
        while (!queue.push(p * kEach + i)) std::this_thread::yield();
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      int chunk[16];
      while (received.load() < kProducers * kEach) {
        size_t got = queue.popMany(chunk, 16);
        if (got == 0) std::this_thread::yield();
        for (size_t i = 0; i < got; ++i) seen[chunk[i]].fetch_add(1);
        received.fetch_add(static_cast<int>(got));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(received.load(), kProducers * kEach);
  int wrong = 0;
  for (auto& count : seen) wrong += count.load() != 1;
  EXPECT_EQ(wrong, 0);
}

TEST(BoundedQueue, FullAndEmptyAreReportedNotWaitedOn) {
  BoundedQueue<int, 4> queue;
  int value = 0;
  EXPECT_FALSE(queue.pop(&value));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(queue.push(i));
  EXPECT_FALSE(queue.push(4));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(queue.pop(&value));
    EXPECT_EQ(value, i);
  }
}

TEST(BoundedQueue, ManyProducersOneConsumerLoseNothing) {
  constexpr int kProducers = 3, kEach = 20000;
  BoundedQueue<int, 1024> queue;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&queue, p] {
      for (int i = 0; i < kEach; ++i) {
        while (!queue.push(p * kEach + i)) std::this_thread::yield();
      }
    });
  }
  std::vector<int> lastSeen(kProducers, -1);
  int received = 0;
  while (received < kProducers * kEach) {
    int value;
    if (!queue.pop(&value)) {
      std::this_thread::yield();
      continue;
    }
    int producer = value / kEach;
    EXPECT_GT(value % kEach, lastSeen[producer]);  // each producer's order is kept
    lastSeen[producer] = value % kEach;
    ++received;
  }
  for (auto& producer : producers) producer.join();
  EXPECT_EQ(received, kProducers * kEach);
}

}  // namespace
