// The RECORDS encoding (docs/protocol.md): every record an agent encodes decodes to the same
// CallRecord on the collector's side of the connection, whatever its fields, over interleaved
// communicators, state updates, evicted delta bases and reconnects; a training loop's calls take
// a few bytes each; a peer of another protocol version is told apart from garbage.
#include "trace/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "trace/fingerprint.h"

namespace {

namespace wire = ncclwatch::trace::wire;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;

// One connection: what the agent encodes, as the collector decodes it.
struct Link {
  wire::RecordEncoder encoder;
  wire::RecordDecoder decoder;
  size_t bytes = 0;  // message bytes so far

  // Encodes one record and decodes it back; the decoded record, or a default one on failure.
  CallRecord roundTrip(const CallRecord& record, bool keep, size_t* messageBytes = nullptr) {
    std::byte message[wire::kMaxRecordBytes];
    size_t written = encoder.encode(record, keep, message);
    EXPECT_LE(written, sizeof message);
    bytes += written;
    if (messageBytes != nullptr) *messageBytes = written;
    std::vector<CallRecord> decoded;
    std::string error;
    EXPECT_TRUE(decoder.decode(std::span(message, written), &decoded, &error)) << error;
    return decoded.size() == 1 ? decoded[0] : CallRecord{};
  }
};

bool same(const CallRecord& a, const CallRecord& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// A record whose every byte is random (but a valid op and state).
CallRecord randomRecord(std::mt19937_64& random) {
  CallRecord record;
  auto* bytes = reinterpret_cast<unsigned char*>(&record);
  for (size_t i = 0; i < sizeof record; ++i) bytes[i] = static_cast<unsigned char>(random());
  record.op = static_cast<OpKind>(random() % static_cast<uint64_t>(OpKind::kCount));
  record.state = static_cast<RecordState>(random() % 6);
  return record;
}

// What the interposer writes for one allreduce of a training loop.
struct Loop {
  uint64_t commHash;
  uint64_t seq = 0;
  uint64_t rolling = ncclwatch::trace::kRollingSeed;
  CallRecord next(uint64_t ringIndex, int64_t issueNs, uint64_t count, uint64_t callSite) {
    CallRecord record{};
    record.commHash = commHash;
    record.seq = ++seq;
    record.ncclSeqNumber = seq - 1;
    record.op = OpKind::kAllReduce;
    record.count = count;
    record.dtype = 9;
    record.rootOrPeer = -1;
    record.fingerprint = ncclwatch::trace::fingerprint({record.op, count, 9, 0, -1});
    rolling = ncclwatch::trace::rollingHash(rolling, record.fingerprint);
    record.rollingHash = rolling;
    record.stream = 0x5600000a0000ull;
    record.issueNs = issueNs;
    record.callSite = callSite;
    record.threadId = 4242;
    record.state = RecordState::kIssued;
    record.slotVersion = 2;
    record.ringIndex = ringIndex;
    return record;
  }
};

TEST(WireRecords, RandomRecordsOverManyCommunicatorsComeBackTheSame) {
  std::mt19937_64 random(15);
  Link link;
  // More communicators than slots: their delta bases are evicted and defined again.
  std::vector<uint64_t> comms;
  for (size_t i = 0; i < wire::kMaxCommSlots + 16; ++i) comms.push_back(random());
  comms.push_back(0);  // group calls have no communicator
  uint64_t ring = 1000;
  for (int i = 0; i < 20000; ++i) {
    CallRecord record = randomRecord(random);
    record.commHash = comms[random() % (i < 5000 ? 4 : comms.size())];
    ring += random() % 8 == 0 ? random() % 1000 : 1;  // gaps: calls the ring overwrote
    record.ringIndex = i % 97 == 0 ? random() : ring;
    CallRecord back = link.roundTrip(record, random() % 3 == 0);
    ASSERT_TRUE(same(back, record)) << "record " << i;
  }
}

// Varints of every length, 1 to 10 bytes, at each length's bounds, with more fields after
// them (where ten bytes remain the decoder checks no bound per byte) and at a message's end.
TEST(WireRecords, CountsOfEveryVarintLengthComeBackTheSame) {
  std::mt19937_64 random(11);
  Link link;
  std::vector<uint64_t> counts = {0, UINT64_MAX};
  for (int bits = 7; bits < 64; bits += 7) {
    counts.push_back((uint64_t{1} << bits) - 1);  // the largest of a length
    counts.push_back(uint64_t{1} << bits);        // the smallest of the next
    counts.push_back((uint64_t{1} << bits) | (random() & ((uint64_t{1} << bits) - 1)));
  }
  for (uint64_t count : counts) {
    CallRecord record = randomRecord(random);  // random fields after the count: long varints
    record.count = count;
    EXPECT_TRUE(same(link.roundTrip(record, false), record)) << count;
    Loop loop{0x77};  // a small record whose count ends the message or nearly
    CallRecord last = loop.next(record.ringIndex + 1, 1000, count, 0x4000);
    EXPECT_TRUE(same(link.roundTrip(last, false), last)) << count;
  }
}

TEST(WireRecords, StateUpdatesOfKeptRecordsAreSmallAndExact) {
  Link link;
  Loop loop{0xabcdef};
  std::vector<CallRecord> issued;
  for (uint64_t i = 0; i < 40; ++i) {
    CallRecord record =
        loop.next(i, 1'000'000'000 + static_cast<int64_t>(i) * 10'000'000, 1 << 20, 0x401000);
    ASSERT_TRUE(same(link.roundTrip(record, true), record));
    issued.push_back(record);
  }
  for (CallRecord& record : issued) {
    record.state = RecordState::kStarted;
    record.startNs = record.issueNs + 7'000;
    record.slotVersion += 2;
    size_t bytes = 0;
    ASSERT_TRUE(same(link.roundTrip(record, true, &bytes), record));
    EXPECT_LE(bytes, 8u);  // kind, ring index, state, start, version
    record.state = RecordState::kCompleted;
    record.completeNs = record.startNs + 3'000'000;
    record.slotVersion += 2;
    ASSERT_TRUE(same(link.roundTrip(record, false, &bytes), record));
    EXPECT_LE(bytes, 10u);  // kind, ring index, state, completion, version
  }
  // Released: a further change of the same record is a whole RECORD message, still exact.
  issued[5].result = 3;
  ASSERT_TRUE(same(link.roundTrip(issued[5], false), issued[5]));
  // An UPDATE of a record the collector does not keep breaks the format.
  std::vector<std::byte> update = {std::byte{1 | 1 << 2}, std::byte{0}, std::byte{3}};
  std::vector<CallRecord> decoded;
  std::string error;
  wire::RecordDecoder fresh;
  EXPECT_FALSE(fresh.decode(update, &decoded, &error));
  EXPECT_NE(error.find("not kept"), std::string::npos) << error;
}

TEST(WireRecords, ChangesBeyondStateAndTimesAreWholeRecords) {
  Link link;
  Loop loop{0x77};
  CallRecord record = loop.next(1, 5'000'000, 64, 0x401000);
  ASSERT_TRUE(same(link.roundTrip(record, true), record));
  record.count = 128;  // not an update any more: a record message with the new count
  record.state = RecordState::kStarted;
  record.startNs = 5'000'100;
  size_t bytes = 0;
  ASSERT_TRUE(same(link.roundTrip(record, true, &bytes), record));
  EXPECT_GT(bytes, 8u);
  record.state = RecordState::kCompleted;  // kept again: an update
  ASSERT_TRUE(same(link.roundTrip(record, true, &bytes), record));
  EXPECT_LE(bytes, 4u);
  record.startNs = 0;  // a start time that went away: a whole record again
  ASSERT_TRUE(same(link.roundTrip(record, false), record));
}

// Records kept beyond the kept slots (ring index modulo kPendingSlots) lose their slot: their
// later updates are whole records, still exact.
TEST(WireRecords, UpdatesOfEvictedRecordsStayExact) {
  Link link;
  Loop loop{0x99};
  std::vector<CallRecord> issued;
  for (uint64_t i = 0; i < 3 * wire::kPendingSlots; ++i) {
    issued.push_back(loop.next(i, static_cast<int64_t>(i) * 1000, 8, 0x1000));
    ASSERT_TRUE(same(link.roundTrip(issued.back(), true), issued.back()));
  }
  for (CallRecord& record : issued) {
    record.state = RecordState::kCompleted;
    record.completeNs = record.issueNs + 500;
    ASSERT_TRUE(same(link.roundTrip(record, false), record));
  }
}

// The typical shape: a training loop's allreduces on a tensor-parallel and a data-parallel
// communicator, interleaved, each sent once completed (bench/collector_load's calls).
TEST(WireRecords, ATrainingLoopTakesAFewBytesACall) {
  Link link;
  Loop tensor{0x1111}, data{0x2222};
  constexpr uint64_t kCounts[] = {4u << 20, 4u << 20, 16u << 20, 1u << 20};
  size_t steady = 0, most = 0;
  for (uint64_t call = 0; call < 2000; ++call) {
    bool world = call % 2 == 1;
    int64_t issue = 3'000'000'000 + static_cast<int64_t>(call) * 10'000'000 + 37'000;
    CallRecord record = world ? data.next(call, issue, 25u << 20, 0x55555555a000)
                              : tensor.next(call, issue, kCounts[tensor.seq % 4],
                                            0x555555559000 + (tensor.seq % 4) * 0x40);
    record.state = RecordState::kCompleted;
    record.startNs = record.issueNs + 5'000;
    record.completeNs = record.issueNs + 4'987'000;
    record.flags = 0;
    size_t bytes = 0;
    ASSERT_TRUE(same(link.roundTrip(record, false, &bytes), record));
    if (call >= 4) {
      steady += bytes;
      most = std::max(most, bytes);
    }
  }
  double average = static_cast<double>(steady) / 1996.0;
  EXPECT_LE(most, 24u);
  EXPECT_LE(average, 20.0);
  std::printf("training loop: %.1f bytes per record on average, %zu at most\n", average, most);
}

TEST(WireRecords, AReconnectStartsOverOnBothSides) {
  Link link;
  Loop loop{0x5};
  for (uint64_t i = 0; i < 10; ++i) {
    CallRecord record = loop.next(i, static_cast<int64_t>(i) * 100, 8, 0x1000);
    ASSERT_TRUE(same(link.roundTrip(record, i % 2 == 0), record));
  }
  // A new connection: the agent resets its encoder, the collector has a new decoder.
  link.encoder.reset();
  link.decoder = wire::RecordDecoder{};
  for (uint64_t i = 5; i < 20; ++i) {  // the ring's window again, and new calls
    CallRecord record = loop.next(i, static_cast<int64_t>(i) * 100, 8, 0x1000);
    ASSERT_TRUE(same(link.roundTrip(record, true), record));
  }
  // An encoder that went on with the old connection's bases: a new collector cannot read it.
  wire::RecordDecoder newCollector;
  std::byte message[wire::kMaxRecordBytes];
  CallRecord record = loop.next(20, 2100, 8, 0x1000);
  size_t bytes = link.encoder.encode(record, false, message);
  std::vector<CallRecord> decoded;
  std::string error;
  EXPECT_FALSE(newCollector.decode(std::span(message, bytes), &decoded, &error));
}

TEST(WireRecords, FramesCarryManyRecordsWithinTheirBounds) {
  std::vector<CallRecord> records;
  Loop loop{0x42};
  for (uint64_t i = 0; i < wire::kMaxRecordsPerFrame + 10; ++i) {
    records.push_back(loop.next(i, static_cast<int64_t>(i), 8, 0x1000));
  }
  wire::RecordEncoder encoder;
  std::vector<std::byte> bytes;
  wire::encodeRecords(9, records, encoder, bytes);
  wire::RecordDecoder decoder;
  std::span<const std::byte> rest(bytes);
  std::vector<CallRecord> decoded;
  int frames = 0;
  while (!rest.empty()) {
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    ASSERT_EQ(wire::decodeFrame(rest, &frame, &consumed, &error, &decoder),
              wire::DecodeStatus::kFrame)
        << error;
    EXPECT_EQ(frame.nowNs, 9);
    EXPECT_LE(frame.records.size(), wire::kMaxRecordsPerFrame);
    decoded.insert(decoded.end(), frame.records.begin(), frame.records.end());
    rest = rest.subspan(consumed);
    ++frames;
  }
  EXPECT_EQ(frames, 2);
  ASSERT_EQ(decoded.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) ASSERT_TRUE(same(decoded[i], records[i])) << i;
}

// The decoder takes a same-shape record's fingerprint from the record before it only when that
// one's was the fingerprint its shape implies: after a record that carried its own, the next one
// gets the implied fingerprint again.
TEST(WireRecords, AFingerprintOfItsOwnIsNotPassedOnToTheNextRecord) {
  Link link;
  Loop loop{0x77};
  for (uint64_t i = 0; i < 12; ++i) {
    CallRecord record = loop.next(i, 1000 + static_cast<int64_t>(i) * 50, 256, 0x2000);
    if (i % 4 == 1) record.fingerprint ^= 0x5a5a;  // not what its shape implies: sent whole
    CallRecord back = link.roundTrip(record, false);
    ASSERT_TRUE(same(back, record)) << "record " << i;
    EXPECT_EQ(back.fingerprint,
              i % 4 == 1
                  ? ncclwatch::trace::fingerprint({OpKind::kAllReduce, 256, 9, 0, -1}) ^ 0x5a5a
                  : ncclwatch::trace::fingerprint({OpKind::kAllReduce, 256, 9, 0, -1}));
  }
}

TEST(WireRecords, MalformedMessagesAreRejected) {
  Link link;
  Loop loop{0x3};
  std::byte message[wire::kMaxRecordBytes];
  size_t bytes = link.encoder.encode(loop.next(0, 100, 8, 0x1000), false, message);
  std::vector<CallRecord> decoded;
  std::string error;
  ASSERT_TRUE(link.decoder.decode(std::span(message, bytes), &decoded, &error)) << error;
  auto rejects = [&](std::vector<std::byte> bytes) {
    wire::RecordDecoder decoder = link.decoder;
    std::vector<CallRecord> out;
    std::string why;
    return !decoder.decode(bytes, &out, &why) && !why.empty();
  };
  EXPECT_TRUE(rejects({std::byte{0}, std::byte{0x80}}));  // a varint cut short
  // Bits no version defines.
  EXPECT_TRUE(rejects({std::byte{0}, std::byte{0x80}, std::byte{0x80}, std::byte{0x80},
                       std::byte{0x01}, std::byte{0}}));
  // An op beyond the known ones.
  EXPECT_TRUE(rejects({std::byte{0}, std::byte{0x80}, std::byte{0x08}, std::byte{0}, std::byte{99},
                       std::byte{0}, std::byte{0}}));
  // A varint of more than 64 bits.
  std::vector<std::byte> overlong = {std::byte{0}, std::byte{0}};
  for (int i = 0; i < 10; ++i) overlong.push_back(std::byte{0xff});
  overlong.push_back(std::byte{1});
  EXPECT_TRUE(rejects(overlong));
  // A communicator slot defined out of order.
  std::vector<std::byte> comm = {std::byte{2 | 9 << 2}};
  for (int i = 0; i < 8; ++i) comm.push_back(std::byte{1});
  EXPECT_TRUE(rejects(comm));
}

// BYE carries the status the process passed to exit() when the agent knows it; an empty BYE
// (an agent that did not) still decodes, with no status; any other payload is rejected.
TEST(WireBye, CarriesTheExitStatusWhenKnown) {
  wire::Frame frame;
  size_t consumed = 0;
  std::string error;
  std::vector<std::byte> failed;
  wire::encodeBye(failed, 1);
  ASSERT_EQ(wire::decodeFrame(failed, &frame, &consumed, &error), wire::DecodeStatus::kFrame);
  EXPECT_EQ(frame.type, wire::FrameType::kBye);
  ASSERT_TRUE(frame.exitStatus.has_value());
  EXPECT_EQ(*frame.exitStatus, 1);
  std::vector<std::byte> empty;
  wire::encodeBye(empty);
  ASSERT_EQ(wire::decodeFrame(empty, &frame, &consumed, &error), wire::DecodeStatus::kFrame);
  EXPECT_FALSE(frame.exitStatus.has_value());  // not left from the frame before
  std::vector<std::byte> odd = empty;
  uint32_t two = 2;
  std::memcpy(odd.data() + offsetof(wire::FrameHeader, length), &two, sizeof two);
  odd.resize(odd.size() + 2);
  EXPECT_EQ(wire::decodeFrame(odd, &frame, &consumed, &error), wire::DecodeStatus::kInvalid);
  EXPECT_NE(error.find("BYE"), std::string::npos) << error;
}

TEST(WireVersions, AnotherVersionIsToldApartAndRefusedIsReadInEveryVersion) {
  std::vector<std::byte> bytes;
  wire::Hello hello{};
  wire::encodeHello(hello, bytes);
  uint16_t one = 1;
  std::memcpy(bytes.data() + offsetof(wire::FrameHeader, version), &one, sizeof one);
  wire::Frame frame;
  size_t consumed = 0;
  std::string error;
  EXPECT_EQ(wire::decodeFrame(bytes, &frame, &consumed, &error), wire::DecodeStatus::kOtherVersion);
  EXPECT_EQ(frame.version, 1);
  EXPECT_NE(error.find("version 1"), std::string::npos) << error;
  // REFUSED from a collector of a later version still reads as REFUSED.
  std::vector<std::byte> refused;
  wire::encodeRefused(refused);
  uint16_t later = wire::kVersion + 1;
  std::memcpy(refused.data() + offsetof(wire::FrameHeader, version), &later, sizeof later);
  std::memcpy(refused.data() + sizeof(wire::FrameHeader), &later, sizeof later);
  ASSERT_EQ(wire::decodeFrame(refused, &frame, &consumed, &error), wire::DecodeStatus::kFrame);
  EXPECT_EQ(frame.type, wire::FrameType::kRefused);
  EXPECT_EQ(frame.version, later);
  EXPECT_EQ(consumed, refused.size());
  // Bad magic stays garbage, not another version.
  bytes[0] = std::byte{0};
  EXPECT_EQ(wire::decodeFrame(bytes, &frame, &consumed, &error), wire::DecodeStatus::kInvalid);
}

}  // namespace
