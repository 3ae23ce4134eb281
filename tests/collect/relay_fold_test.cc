// The relay's folding (tools/relay_fold.h): fake agents' frames through a Folder, what comes
// out decoded as the collector decodes it. What the collector must still get is asserted
// record by record: every call of a communicator not all on the host, everything from the first
// call the relay cannot judge on (each member's last folded call first), and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "collect_triage.h"
#include "relay_fold.h"
#include "trace/fingerprint.h"
#include "trace/wire.h"

namespace {

namespace wire = ncclwatch::trace::wire;
using ncclwatch::relay::Folder;
using ncclwatch::relay::FoldOptions;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::CommInfo;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;

constexpr uint64_t kLocal = 0x7e57000000000001ull;  // all its members on this relay's host
constexpr uint64_t kWorld = 0x7e57000000000002ull;  // members on other hosts too
constexpr int64_t kMs = 1'000'000;

struct FakeAgent {
  uint32_t channel = 0;
  wire::RecordEncoder encoder;
  uint64_t ring = 0;
};

class FoldTest : public testing::Test {
 protected:
  FoldTest() : folder_(options()) {}
  static FoldOptions options() {
    FoldOptions options;
    options.holdNs = 500 * kMs;
    options.noteEveryNs = 100 * kMs;
    return options;
  }

  // `ranks` agents on channels 1.., each a member of kLocal (that size) and, with `worldSize`,
  // of kWorld (its rank there 8 above: members 0-7 are elsewhere).
  void start(int ranks, int worldSize = 0) {
    agents_.resize(static_cast<size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) {
      FakeAgent& agent = agents_[static_cast<size_t>(rank)];
      agent.channel = static_cast<uint32_t>(rank + 1);
      std::vector<std::byte> bytes;
      wire::Hello hello{};
      hello.rank = rank;
      wire::encodeHello(hello, bytes);
      std::vector<CommInfo> comms(1);
      comms[0].commHash = kLocal;
      comms[0].nranks = ranks;
      comms[0].rank = rank;
      if (worldSize > 0) {
        comms.push_back(comms[0]);
        comms[1].commHash = kWorld;
        comms[1].nranks = worldSize;
        comms[1].rank = rank + 8;
      }
      wire::encodeComms(comms, bytes);
      feed(agent, bytes);
    }
  }

  // A collective at `ordinal` (seq ordinal + 1 on a communicator of collectives only).
  static CallRecord call(FakeAgent& agent, uint64_t comm, uint64_t ordinal, uint64_t count = 1024,
                         RecordState state = RecordState::kCompleted) {
    CallRecord r{};
    r.commHash = comm;
    r.seq = ordinal + 1;
    r.ncclSeqNumber = ordinal;
    r.op = OpKind::kAllReduce;
    r.count = count;
    r.dtype = 7;
    r.rootOrPeer = -1;
    r.state = state;
    r.issueNs = 1'000 * kMs + static_cast<int64_t>(ordinal) * kMs;
    r.startNs = r.issueNs + 1000;
    if (state == RecordState::kCompleted) r.completeNs = r.startNs + 1000;
    r.slotVersion = 2;
    r.ringIndex = agent.ring++;
    r.fingerprint = ncclwatch::trace::fingerprint({r.op, count, 7, 0, -1});
    return r;
  }

  // One RECORDS frame of `agent` with `records` (kept while not final, as an agent does).
  void send(FakeAgent& agent, const std::vector<CallRecord>& records, int64_t nowNs = 0) {
    std::vector<std::byte> bytes;
    wire::encodeRecords(nowNs, records, agent.encoder, bytes, true);
    feed(agent, bytes, nowNs);
  }

  void feed(FakeAgent& agent, const std::vector<std::byte>& frames, int64_t nowNs = 0) {
    std::span<const std::byte> rest(frames);
    while (!rest.empty()) {
      size_t bytes = 0;
      uint32_t channel = 0;
      uint16_t type = 0;
      ASSERT_EQ(wire::splitFrame(rest, &bytes, &channel, &type), wire::SplitStatus::kFrame);
      ASSERT_TRUE(folder_.agentFrame(agent.channel, rest.first(bytes), nowNs, out_));
      rest = rest.subspan(bytes);
    }
    drain();
  }

  // What the collector would read: each channel's frames decoded with that channel's bases.
  void drain() {
    std::span<std::byte> rest(out_);
    while (!rest.empty()) {
      size_t bytes = 0;
      uint32_t channel = 0;
      uint16_t type = 0;
      ASSERT_EQ(wire::splitFrame(rest, &bytes, &channel, &type), wire::SplitStatus::kFrame);
      ASSERT_NE(channel, 0u);
      wire::setChannel(rest.data(), 0);
      wire::Frame frame;
      size_t consumed = 0;
      std::string error;
      ASSERT_EQ(
          wire::decodeFrame(rest.first(bytes), &frame, &consumed, &error, &decoders_[channel]),
          wire::DecodeStatus::kFrame)
          << error;
      types_[channel].push_back(frame.type);
      for (const CallRecord& record : frame.records) received_[channel].push_back(record);
      for (const wire::FoldedNote& note : frame.folded) notes_[channel].push_back(note);
      rest = rest.subspan(bytes);
    }
    out_.clear();
  }

  void tick(int64_t nowNs) {
    folder_.tick(nowNs, out_);
    drain();
  }

  // The ordinals of `comm` the collector got on `channel`, in arrival order.
  std::vector<uint64_t> ordinals(uint32_t channel, uint64_t comm) {
    std::vector<uint64_t> found;
    for (const CallRecord& record : received_[channel]) {
      if (record.commHash == comm) found.push_back(record.ncclSeqNumber);
    }
    return found;
  }

  uint64_t foldedCalls(uint32_t channel, uint64_t comm) {
    uint64_t calls = 0;
    for (const wire::FoldedNote& note : notes_[channel]) {
      if (note.commHash == comm) calls += note.calls;
    }
    return calls;
  }

  Folder folder_;
  std::vector<FakeAgent> agents_;
  std::vector<std::byte> out_;
  std::map<uint32_t, wire::RecordDecoder> decoders_;
  std::map<uint32_t, std::vector<CallRecord>> received_;
  std::map<uint32_t, std::vector<wire::FoldedNote>> notes_;
  std::map<uint32_t, std::vector<wire::FrameType>> types_;
};

// A healthy host-local communicator: nothing of it reaches the collector but the notes, which
// count every call and say the latest time; its HELLO and COMMS go on as they came.
TEST_F(FoldTest, MatchedCallsOfAHostLocalCommunicatorAreFolded) {
  start(4);
  for (uint64_t ordinal = 0; ordinal < 10; ++ordinal) {
    for (FakeAgent& agent : agents_) send(agent, {call(agent, kLocal, ordinal)});
  }
  tick(200 * kMs);
  for (FakeAgent& agent : agents_) {
    EXPECT_TRUE(ordinals(agent.channel, kLocal).empty()) << "channel " << agent.channel;
    EXPECT_EQ(foldedCalls(agent.channel, kLocal), 10u);
    ASSERT_FALSE(notes_[agent.channel].empty());
    EXPECT_EQ(notes_[agent.channel].back().lastOrdinal, 9u);
    EXPECT_EQ(notes_[agent.channel].back().latestNs, call(agent, kLocal, 9).completeNs);
    EXPECT_EQ(types_[agent.channel][0], wire::FrameType::kHello);
    EXPECT_EQ(types_[agent.channel][1], wire::FrameType::kComms);
  }
  EXPECT_EQ(folder_.stats().recordsFolded, 40u);
  EXPECT_EQ(folder_.heldRecords(), 0u);
}

// A call still running is held, not forwarded, and folded once every member completed it.
TEST_F(FoldTest, ACallIsHeldUntilEveryMemberCompletedIt) {
  start(2);
  std::vector<CallRecord> running;
  for (FakeAgent& agent : agents_) {
    running.push_back(call(agent, kLocal, 0, 1024, RecordState::kStarted));
    send(agent, {running.back()});
  }
  EXPECT_EQ(folder_.heldRecords(), 2u);
  for (size_t rank = 0; rank < 2; ++rank) {
    CallRecord done = running[rank];
    done.state = RecordState::kCompleted;
    done.completeNs = done.startNs + 5000;
    send(agents_[rank], {done});  // an UPDATE on the agent's stream
  }
  EXPECT_EQ(folder_.heldRecords(), 0u);
  EXPECT_EQ(folder_.stats().recordsFolded, 2u);
  EXPECT_TRUE(ordinals(1, kLocal).empty());
}

// Members that disagree: the collector gets the call of every member, each member's last folded
// call before it (the window then shows where each was), and every later call as it comes.
TEST_F(FoldTest, AMismatchForwardsTheCallWithEachMembersLastFoldedCall) {
  start(4);
  for (uint64_t ordinal = 0; ordinal < 5; ++ordinal) {
    for (FakeAgent& agent : agents_) send(agent, {call(agent, kLocal, ordinal)});
  }
  for (FakeAgent& agent : agents_) {
    send(agent, {call(agent, kLocal, 5, agent.channel == 3 ? 512 : 1024, RecordState::kStarted)});
  }
  for (FakeAgent& agent : agents_) {
    EXPECT_EQ(ordinals(agent.channel, kLocal), (std::vector<uint64_t>{4, 5}))
        << "channel " << agent.channel;
  }
  EXPECT_EQ(received_[3].back().count, 512u);
  // The records come through the relay's own encoding unchanged.
  CallRecord expected = call(agents_[0], kLocal, 4);
  expected.ringIndex = 4;
  EXPECT_EQ(std::memcmp(&received_[1][0], &expected, sizeof expected), 0);
  send(agents_[0], {call(agents_[0], kLocal, 6)});
  EXPECT_EQ(ordinals(1, kLocal), (std::vector<uint64_t>{4, 5, 6}));
  tick(200 * kMs);
  EXPECT_EQ(foldedCalls(1, kLocal), 5u);
}

// A member that never issues the call (a hang): the others' copies wait at most the hold, then
// go with every member's last folded call, the missing member's included.
TEST_F(FoldTest, ACallAMemberNeverIssuedGoesOnAfterTheHold) {
  start(3);
  for (uint64_t ordinal = 0; ordinal < 3; ++ordinal) {
    for (FakeAgent& agent : agents_) send(agent, {call(agent, kLocal, ordinal)}, 10 * kMs);
  }
  send(agents_[0], {call(agents_[0], kLocal, 3, 1024, RecordState::kStarted)}, 20 * kMs);
  send(agents_[1], {call(agents_[1], kLocal, 3, 1024, RecordState::kStarted)}, 30 * kMs);
  tick(400 * kMs);
  EXPECT_TRUE(ordinals(1, kLocal).empty());
  tick(600 * kMs);
  EXPECT_EQ(ordinals(1, kLocal), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(ordinals(2, kLocal), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(ordinals(3, kLocal), (std::vector<uint64_t>{2}));
  EXPECT_EQ(folder_.stats().commsForwarded, 1u);
}

// A communicator with members elsewhere: its calls go on at once (the relay cannot know yet
// whether the rest of its members will come), in each agent's ring order, interleaved with a
// host-local communicator's folded calls; the relay gives up watching it after the hold.
TEST_F(FoldTest, ACommunicatorWithMembersElsewhereIsForwardedWhole) {
  start(2, 16);
  for (uint64_t ordinal = 0; ordinal < 3; ++ordinal) {
    for (FakeAgent& agent : agents_) {
      send(agent, {call(agent, kLocal, ordinal), call(agent, kWorld, ordinal)}, 10 * kMs);
    }
  }
  tick(600 * kMs);
  for (FakeAgent& agent : agents_) {
    EXPECT_EQ(ordinals(agent.channel, kWorld), (std::vector<uint64_t>{0, 1, 2}));
    EXPECT_TRUE(ordinals(agent.channel, kLocal).empty());
    std::vector<uint64_t> rings;
    for (const CallRecord& record : received_[agent.channel]) rings.push_back(record.ringIndex);
    EXPECT_EQ(rings, (std::vector<uint64_t>{1, 3, 5}));
  }
  send(agents_[0], {call(agents_[0], kWorld, 3)});
  EXPECT_EQ(ordinals(1, kWorld), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(folder_.heldRecords(), 0u);
}

// Calls made before every member's table reached the relay go on at once; once every member is
// known and those calls were matched, the communicator folds, and its note tells the collector
// to drop what it got of it (else its windows would hold those calls, then a gap).
TEST_F(FoldTest, CallsBeforeEveryMemberIsKnownGoOnAndAreDroppedOnceMatched) {
  agents_.resize(2);
  agents_[0].channel = 1;
  agents_[1].channel = 2;
  auto table = [&](FakeAgent& agent, int rank) {
    std::vector<std::byte> bytes;
    std::vector<CommInfo> comms(1);
    comms[0].commHash = kLocal;
    comms[0].nranks = 2;
    comms[0].rank = rank;
    wire::encodeComms(comms, bytes);
    feed(agent, bytes);
  };
  table(agents_[0], 0);
  send(agents_[0], {call(agents_[0], kLocal, 0), call(agents_[0], kLocal, 1)});
  EXPECT_EQ(ordinals(1, kLocal), (std::vector<uint64_t>{0, 1}));  // at once
  table(agents_[1], 1);
  send(agents_[1],
       {call(agents_[1], kLocal, 0), call(agents_[1], kLocal, 1), call(agents_[1], kLocal, 2)});
  EXPECT_EQ(ordinals(2, kLocal), (std::vector<uint64_t>{0, 1}));  // its sent calls' copies too
  send(agents_[0], {call(agents_[0], kLocal, 2)});
  tick(200 * kMs);
  for (uint32_t channel : {1u, 2u}) {
    ASSERT_EQ(notes_[channel].size(), 1u);
    EXPECT_EQ(notes_[channel][0].flags, wire::kFoldedDropsSent);
    EXPECT_EQ(notes_[channel][0].lastOrdinal, 2u);
    EXPECT_EQ(notes_[channel][0].calls, 1u);  // the third, folded; the first two sent
  }
  EXPECT_EQ(ordinals(1, kLocal), (std::vector<uint64_t>{0, 1}));
}

// A send, receive, split or destroy on a folding communicator is not the relay's to judge: it
// goes on, after what was held, and so does everything later.
TEST_F(FoldTest, ASendOnAFoldingCommunicatorForwardsItFromThere) {
  start(2);
  for (FakeAgent& agent : agents_) send(agent, {call(agent, kLocal, 0)});
  CallRecord held = call(agents_[0], kLocal, 1);
  send(agents_[0], {held});
  CallRecord sendCall = call(agents_[0], kLocal, 0);
  sendCall.op = OpKind::kSend;
  sendCall.seq = 3;
  sendCall.rootOrPeer = 1;
  sendCall.p2pSeq = 1;
  sendCall.fingerprint = ncclwatch::trace::fingerprint({OpKind::kSend, 1024, 7, 0, 1});
  send(agents_[0], {sendCall});
  ASSERT_EQ(received_[1].size(), 3u);
  EXPECT_EQ(received_[1][0].ncclSeqNumber, 0u);  // its last folded call
  EXPECT_EQ(received_[1][1].seq, held.seq);
  EXPECT_EQ(received_[1][2].op, OpKind::kSend);
  EXPECT_EQ(ordinals(2, kLocal), (std::vector<uint64_t>{0}));
}

// An agent that ends (BYE) has its note and what its communicators held go first (the note
// before the records: what it settles must not take them), then BYE.
TEST_F(FoldTest, AnAgentThatEndsLetsWhatWasHeldGoFirst) {
  start(2);
  for (FakeAgent& agent : agents_) send(agent, {call(agent, kLocal, 0)});
  send(agents_[1], {call(agents_[1], kLocal, 1)});
  std::vector<std::byte> bye;
  wire::encodeBye(bye, 0);
  feed(agents_[0], bye);
  EXPECT_EQ(ordinals(2, kLocal), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(ordinals(1, kLocal), (std::vector<uint64_t>{0}));
  ASSERT_GE(types_[1].size(), 3u);
  std::vector<wire::FrameType> last(types_[1].end() - 3, types_[1].end());
  EXPECT_EQ(last, (std::vector<wire::FrameType>{wire::FrameType::kFolded, wire::FrameType::kRecords,
                                                wire::FrameType::kBye}));
  EXPECT_EQ(foldedCalls(1, kLocal), 1u);
}

// Tables that disagree on a communicator (its size, or two agents for one rank): not the
// relay's to judge; its calls go on as they come.
TEST_F(FoldTest, TablesThatDisagreeOnACommunicatorForwardIt) {
  start(2);
  FakeAgent& late = agents_.emplace_back();
  late.channel = 3;
  std::vector<std::byte> bytes;
  std::vector<CommInfo> comms(1);
  comms[0].commHash = kLocal;
  comms[0].nranks = 5;  // the others said 2
  comms[0].rank = 4;
  wire::encodeComms(comms, bytes);
  feed(late, bytes);
  for (size_t rank = 0; rank < 2; ++rank) {
    send(agents_[rank], {call(agents_[rank], kLocal, 0)});
    EXPECT_EQ(ordinals(agents_[rank].channel, kLocal), (std::vector<uint64_t>{0}));
  }
  EXPECT_EQ(folder_.stats().recordsFolded, 0u);
}

// A frame that does not decode, and a relay's own frames from an agent, end that agent.
TEST_F(FoldTest, FramesThatAreNotAnAgentsEndIt) {
  start(1);
  std::vector<std::byte> folded;
  wire::encodeFolded(0, std::vector<wire::FoldedNote>{{kLocal, 1, 0, 0, 0}}, folded);
  EXPECT_FALSE(folder_.agentFrame(1, folded, 0, out_));
  std::vector<std::byte> records;
  size_t frame = wire::beginRecords(0, records);
  records.push_back(std::byte{0x03});  // an UPDATE of a record never kept
  records.push_back(std::byte{0x00});
  wire::endRecords(frame, records);
  EXPECT_FALSE(folder_.agentFrame(1, records, 0, out_));
}

}  // namespace

namespace {
// Behind a relay that folds, a rank's window keeps the share of its calls that reach the
// collector: the same span of calls as without folding (a quarter of the floor at least).
TEST(FoldedWindow, KeepsTheShareOfCallsThatReachTheCollector) {
  using ncclwatch::collect::foldedWindow;
  using ncclwatch::collect::kMinWindow;
  EXPECT_EQ(foldedWindow(128, 500, 0), 128u);
  EXPECT_EQ(foldedWindow(128, 500, 500), 64u);
  EXPECT_EQ(foldedWindow(128, 1, 10'000), kMinWindow / 4);
  EXPECT_EQ(foldedWindow(65536, 100, 300), 16384u);
  EXPECT_EQ(foldedWindow(16, 1, 1000), 16u);  // never past the full window
}
}  // namespace

namespace {
// Two pairs that each send first on one communicator deadlock apart, at the same call: two
// verdicts to say (they shared one key, took turns as the candidate, and one was never said).
// Other verdicts keep one key while their culprits settle.
TEST(VerdictKey, DeadlocksOfOtherRanksAtOneCallAreTwoVerdicts) {
  using ncclwatch::analysis::Verdict;
  using ncclwatch::analysis::VerdictKind;
  ncclwatch::analysis::JobReport job;
  job.jobId = "job";
  Verdict first;
  first.kind = VerdictKind::kDeadlock;
  first.comm.hash = 0x38b7;
  first.seq = 2;
  first.culprits = {0, 1};
  Verdict second = first;
  second.culprits = {2, 3};
  EXPECT_NE(ncclwatch::collect::verdictKey(job, first),
            ncclwatch::collect::verdictKey(job, second));
  first.kind = second.kind = VerdictKind::kMismatch;
  EXPECT_EQ(ncclwatch::collect::verdictKey(job, first),
            ncclwatch::collect::verdictKey(job, second));
}
}  // namespace
