// The collector against agents it cannot trust and agents it can: garbage, oversized frames and
// wrong secrets are dropped and counted without disturbing anyone; two honest fake ranks whose
// calls diverge get a mismatch verdict, written to verdicts.jsonl, and both are asked to dump.
#include "collect.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "harness.h"
#include "trace/fingerprint.h"
#include "trace/python_sites.h"
#include "trace/ring_writer.h"
#include "trace/wire.h"

namespace {

using namespace std::chrono_literals;
namespace wire = ncclwatch::trace::wire;
using ncclwatch::collect::Collector;
using namespace collecttest;
constexpr char kCollectorSecret[] = "s3cret-for-tests";
constexpr char kCollectorFolder[] = "nw-collect";
using CollectorTest = CollectorFixture<kCollectorSecret, kCollectorFolder>;

// A fake agent: connects, says HELLO (job `job`, `world` ranks) and COMMS (one communicator of
// `world` ranks), then sends `records` on it. Returns the connection.
// Joins as `rank` of `world`, a member of one communicator: the world's size and rank, or
// commSize and commRank when given.
int joinAgent(int port, const std::string& secret, int rank, int world, const std::string& job,
              uint64_t commHash, std::vector<ncclwatch::trace::CallRecord> records,
              int commSize = -1, int commRank = -1) {
  int fd = connectTo(port);
  std::vector<std::byte> frame;
  wire::Hello h = hello(secret, rank);
  h.world = world;
  std::snprintf(h.jobId, sizeof h.jobId, "%s", job.c_str());
  wire::encodeHello(h, frame);
  ncclwatch::trace::CommInfo comm{};
  comm.commHash = commHash;
  comm.nranks = commSize > 0 ? commSize : world;
  comm.rank = commSize > 0 ? commRank : rank;
  comm.color = -1;
  std::vector<ncclwatch::trace::CommInfo> comms{comm};
  wire::encodeComms(comms, frame);
  for (ncclwatch::trace::CallRecord& record : records) record.commHash = commHash;
  wire::RecordEncoder encoder;  // a new connection's
  if (!records.empty()) wire::encodeRecords(2'000'000'000, records, encoder, frame);
  sendAll(fd, frame);
  return fd;
}

TEST_F(CollectorTest, GarbageOversizedAndWrongSecretsAreDroppedAndCounted) {
  int garbage = connectTo(collector_.port());
  sendAll(garbage, std::vector<std::byte>(64, std::byte{0x41}));
  EXPECT_TRUE(closedByPeer(garbage, 2000ms));

  int oversized = connectTo(collector_.port());
  wire::FrameHeader header{wire::kMagic, 3, wire::kVersion, wire::kMaxPayload + 1, 0};
  std::vector<std::byte> bytes(sizeof header);
  std::memcpy(bytes.data(), &header, sizeof header);
  sendAll(oversized, bytes);
  EXPECT_TRUE(closedByPeer(oversized, 2000ms));

  int intruder = connectTo(collector_.port());
  std::vector<std::byte> frame;
  wire::encodeHello(hello("not-the-secret", 0), frame);
  sendAll(intruder, frame);
  EXPECT_TRUE(closedByPeer(intruder, 2000ms));

  // Records before any HELLO: not authenticated either.
  int eager = connectTo(collector_.port());
  frame.clear();
  std::vector<ncclwatch::trace::CallRecord> records{allReduce(7, 1, 16)};
  wire::RecordEncoder encoder;
  wire::encodeRecords(5, records, encoder, frame);
  sendAll(eager, frame);
  EXPECT_TRUE(closedByPeer(eager, 2000ms));

  EXPECT_TRUE(eventually([&] { return collector_.counters().rejected.load() == 4; }));
  EXPECT_EQ(collector_.counters().agents.load(), 0u);
  for (int fd : {garbage, oversized, intruder, eager}) close(fd);
}

// An agent of another ncclwatch release (protocol version 1, whole records): told REFUSED, which
// every version reads, and dropped; the collector says so in one line however many such agents
// come, and goes on with its own.
TEST_F(CollectorTest, AgentsOfAnotherVersionAreRefusedInOneLine) {
  for (int rank = 0; rank < 2; ++rank) {
    int old = connectTo(collector_.port());
    std::vector<std::byte> frame;
    wire::encodeHello(hello("s3cret-for-tests", rank), frame);
    uint16_t one = 1;
    std::memcpy(frame.data() + offsetof(wire::FrameHeader, version), &one, sizeof one);
    sendAll(old, frame);
    std::vector<std::byte> received;
    wire::Frame answer;
    size_t consumed = 0;
    std::string error;
    ASSERT_TRUE(eventually([&] {
      std::byte buffer[256];
      ssize_t n = recv(old, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) received.insert(received.end(), buffer, buffer + n);
      return wire::decodeFrame(received, &answer, &consumed, &error) == wire::DecodeStatus::kFrame;
    }));
    EXPECT_EQ(answer.type, wire::FrameType::kRefused);
    EXPECT_EQ(answer.version, wire::kVersion);
    EXPECT_TRUE(closedByPeer(old, 2000ms));
    close(old);
  }
  EXPECT_TRUE(eventually([&] { return collector_.counters().rejected.load() == 2; }));
  EXPECT_EQ(collector_.counters().agents.load(), 0u);
  std::string said = out_.str();
  EXPECT_NE(said.find("refused an agent that speaks protocol version 1 (this collector speaks "
                      "version 2)"),
            std::string::npos)
      << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  // An agent of this version is welcome afterwards.
  int agent = joinAgent(collector_.port(), "s3cret-for-tests", 0, 2, "fake-job", 0x99,
                        {allReduce(0x99, 1, 8)});
  EXPECT_TRUE(eventually([&] { return collector_.counters().records.load() == 1; }));
  close(agent);
}

TEST_F(CollectorTest, TwoRanksThatDivergeGetAMismatchAndAreAskedToDump) {
  constexpr uint64_t kComm = 0x1234abcd5678ef00ull;
  int agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    // Both make call 1 alike; at call 2 rank 1 uses another count.
    std::vector<ncclwatch::trace::CallRecord> records{allReduce(kComm, 1, 1024),
                                                      allReduce(kComm, 2, rank ? 512 : 1024)};
    records[0].state = ncclwatch::trace::RecordState::kCompleted;
    records[0].completeNs = records[0].startNs + 1000;
    agents[rank] =
        joinAgent(collector_.port(), "s3cret-for-tests", rank, 2, "fake-job", kComm, records);
  }
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  EXPECT_EQ(collector_.counters().agents.load(), 2u);
  EXPECT_EQ(collector_.counters().rejected.load(), 0u);
  // Both ranks are asked to dump.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::byte> received;
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    ASSERT_TRUE(eventually([&] {
      std::byte buffer[4096];
      ssize_t n = recv(agents[rank], buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) received.insert(received.end(), buffer, buffer + n);
      return wire::decodeFrame(received, &frame, &consumed, &error) == wire::DecodeStatus::kFrame;
    })) << "rank "
        << rank;
    EXPECT_EQ(frame.type, wire::FrameType::kDump);
    EXPECT_NE(frame.reason.find("mismatch"), std::string::npos) << frame.reason;
  }
  std::string line = stopAndReadFirstVerdict();
  ASSERT_FALSE(line.empty());
  EXPECT_NE(line.find("\"kind\":\"mismatch\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"seq\":2"), std::string::npos) << line;
  EXPECT_NE(out_.str().find("MISMATCH"), std::string::npos) << out_.str();
  for (int fd : agents) close(fd);
}

// Rank 1's divergent call comes from a Python line it never ran before: its record reaches the
// collector one exchange ahead of the line's text. The verdict waits for the text (a little),
// so that it names the line, instead of going out without it.
TEST_F(CollectorTest, AMismatchWaitsForTheDivergentCallsPythonLine) {
  constexpr uint64_t kComm = 0x5eed5eed5eed5eedull;
  namespace trace = ncclwatch::trace;
  auto sites = [](uint32_t number, const std::string& frame) {
    std::vector<std::byte> bytes;
    trace::PythonSite site;
    site.number = number;
    site.nativeSite = 0x1000;
    site.frames = {frame};
    wire::encodeSites(trace::formatPythonSites({site}), bytes);
    return bytes;
  };
  int agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<trace::CallRecord> records{completedAllReduce(kComm, 1, 1024),
                                           allReduce(kComm, 2, rank ? 512 : 1024)};
    for (trace::CallRecord& record : records) record.callSite = trace::kPythonSiteTag | 1;
    if (rank == 1) records[1].callSite = trace::kPythonSiteTag | 2;  // not sent yet
    agents[rank] =
        joinAgent(collector_.port(), "s3cret-for-tests", rank, 2, "fake-job", kComm, records);
    sendAll(agents[rank], sites(1, "train.py:10 train"));
  }
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(collector_.counters().verdicts.load(), 0u) << out_.str();
  sendAll(agents[1], sites(2, "train.py:20 train"));
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  std::string line = stopAndReadFirstVerdict();
  ASSERT_FALSE(line.empty());
  EXPECT_NE(line.find("\"kind\":\"mismatch\""), std::string::npos) << line;
  EXPECT_NE(line.find("train.py:20 train"), std::string::npos) << line;
  EXPECT_NE(line.find("train.py:10 train"), std::string::npos) << line;
  for (int fd : agents) close(fd);
}

TEST(WireFrames, RoundTripAndBounds) {
  std::vector<std::byte> bytes;
  wire::encodeHello(hello("abc", 3), bytes);
  std::vector<ncclwatch::trace::CallRecord> records{allReduce(9, 1, 8), allReduce(9, 2, 8)};
  wire::RecordEncoder encoder;
  wire::encodeRecords(77, records, encoder, bytes);
  wire::encodeDump("why", bytes);
  wire::encodeAbort(0xfeed, bytes);
  wire::encodeBye(bytes);
  std::span<const std::byte> rest(bytes);
  std::vector<wire::FrameType> types;
  wire::Frame frame;
  size_t consumed = 0;
  std::string error;
  wire::RecordDecoder decoder;
  while (!rest.empty()) {
    ASSERT_EQ(wire::decodeFrame(rest, &frame, &consumed, &error, &decoder),
              wire::DecodeStatus::kFrame)
        << error;
    types.push_back(frame.type);
    if (frame.type == wire::FrameType::kRecords) {
      EXPECT_EQ(frame.nowNs, 77);
      ASSERT_EQ(frame.records.size(), 2u);
      EXPECT_EQ(std::memcmp(&frame.records[1], &records[1], sizeof records[1]), 0);
    }
    if (frame.type == wire::FrameType::kHello) {
      EXPECT_EQ(frame.hello.rank, 3);
    }
    if (frame.type == wire::FrameType::kAbort) {
      EXPECT_EQ(frame.commHash, 0xfeedu);
    }
    if (frame.type == wire::FrameType::kDump) {
      EXPECT_EQ(frame.reason, "why");
    }
    rest = rest.subspan(consumed);
  }
  EXPECT_EQ(types.size(), 5u);
  // Every prefix of a frame is "need more", never a misread.
  std::vector<std::byte> one;
  wire::RecordEncoder fresh;
  wire::encodeRecords(1, records, fresh, one);
  for (size_t cut = 0; cut < one.size(); ++cut) {
    wire::RecordDecoder again;
    EXPECT_EQ(wire::decodeFrame(std::span(one.data(), cut), &frame, &consumed, &error, &again),
              wire::DecodeStatus::kNeedMore);
  }
  // Every message cut short is invalid (the frame's length says where the messages end).
  for (size_t cut = sizeof(wire::FrameHeader) + 9; cut < one.size(); ++cut) {
    std::vector<std::byte> shorter(one.begin(), one.begin() + static_cast<std::ptrdiff_t>(cut));
    uint32_t length = static_cast<uint32_t>(cut - sizeof(wire::FrameHeader));
    std::memcpy(shorter.data() + offsetof(wire::FrameHeader, length), &length, sizeof length);
    wire::RecordDecoder again;
    error.clear();
    auto status = wire::decodeFrame(shorter, &frame, &consumed, &error, &again);
    if (status == wire::DecodeStatus::kFrame) {
      EXPECT_LT(frame.records.size(), records.size()) << "cut at " << cut;  // a whole message
    } else {
      EXPECT_EQ(status, wire::DecodeStatus::kInvalid) << "cut at " << cut;
      EXPECT_FALSE(error.empty());
    }
  }
  // A record of a communicator the connection never defined is invalid.
  std::vector<std::byte> undefined;
  wire::beginRecords(1, undefined);
  undefined.push_back(std::byte{0 | 5 << 2});  // RECORD of slot 5
  undefined.push_back(std::byte{0});
  undefined.push_back(std::byte{0});
  wire::endRecords(0, undefined);
  wire::RecordDecoder again;
  EXPECT_EQ(wire::decodeFrame(undefined, &frame, &consumed, &error, &again),
            wire::DecodeStatus::kInvalid);
  EXPECT_NE(error.find("slot"), std::string::npos) << error;
  // RECORDS where none are expected (the agent decodes only the collector's frames): invalid.
  EXPECT_EQ(wire::decodeFrame(one, &frame, &consumed, &error), wire::DecodeStatus::kInvalid);
}

TEST(WireFrames, SecretsCompareExactly) {
  wire::Hello h = hello("right", 0);
  EXPECT_TRUE(wire::secretMatches(h.secret, "right"));
  EXPECT_FALSE(wire::secretMatches(h.secret, "righ"));
  EXPECT_FALSE(wire::secretMatches(h.secret, "right!"));
  EXPECT_FALSE(wire::secretMatches(h.secret, ""));
}

// A rank of a 4096-rank job keeps only its share of the collector's record budget, however
// long it runs: the collector's memory is bounded by the budget, not by the job's length.
TEST_F(CollectorTest, EachRankKeepsABoundedWindowOfItsCalls) {
  constexpr uint64_t kComm = 0x77ull;
  // The default budget (512 Ki records) gives each rank of 4096 the floor's window, 128 calls.
  int agent = joinAgent(collector_.port(), "s3cret-for-tests", 5, 4096, "fake-job", kComm, {});
  std::vector<std::byte> frame;
  wire::RecordEncoder encoder;
  constexpr uint64_t kCalls = 5000;
  for (uint64_t first = 1; first <= kCalls; first += 1000) {
    std::vector<ncclwatch::trace::CallRecord> records;
    for (uint64_t seq = first; seq < first + 1000; ++seq) {
      records.push_back(completedAllReduce(kComm, seq, 1024));  // nothing pending
    }
    frame.clear();
    wire::encodeRecords(2'000'000'000, records, encoder, frame);
    sendAll(agent, frame);
  }
  ASSERT_TRUE(eventually([&] { return collector_.counters().records.load() == kCalls; }));
  EXPECT_GE(collector_.counters().recordsHeld.load(), 128u);
  EXPECT_LE(collector_.counters().recordsHeld.load(), 160u);  // the window and its trim slack
  close(agent);
  // Each trim dropped its records from the progress kept on arrival, none rebuilt it: a trim
  // at the 161st call (window 128, slack a quarter of it) and every 33 calls after (counted as
  // they happen; stopped, all are in).
  collector_.stop();
  EXPECT_EQ(collector_.counters().progressTrims.load(), 1 + (kCalls - 161) / 33);
  EXPECT_EQ(collector_.counters().progressTrimRebuilds.load(), 0u);
}

// Four ranks, one of which calls with another count: the verdict names that rank alone, and
// comes without the settling wait since every member has issued the call.
TEST_F(CollectorTest, TheOddRankOutOfFourIsTheCulprit) {
  constexpr uint64_t kComm = 0x4242ull;
  std::vector<int> agents;
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<ncclwatch::trace::CallRecord> records{allReduce(kComm, 1, 1024),
                                                      allReduce(kComm, 2, rank == 2 ? 96 : 1024)};
    records[1].ncclSeqNumber = 1;
    agents.push_back(
        joinAgent(collector_.port(), "s3cret-for-tests", rank, 4, "fake-job", kComm, records));
  }
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  std::string line = stopAndReadFirstVerdict();
  ASSERT_FALSE(line.empty());
  EXPECT_NE(line.find("\"kind\":\"mismatch\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"culprits\":[2]"), std::string::npos) << line;
  for (int fd : agents) close(fd);
}

// A collector behind its agents still says the mismatch: ranks 0, 1 and 3 of a 4-rank communicator
// report 300 calls (more than twice their 128-call windows) before rank 2's, whose 11th call has
// another count, reaches it. The others' records of that call are older than their windows by
// then; a window keeps a collective that not every member has reported (and a divergence until
// its pass), so the verdict names the call and its culprit instead of being lost with them.
TEST(CollectorWindows, ALaggingCollectorKeepsTheDivergentCallUntilItsVerdict) {
  constexpr uint64_t kComm = 0x1a66edull;
  constexpr uint64_t kCalls = 300, kAlike = 6, kDivergentSeq = 11;
  std::string directory =
      std::string(testing::TempDir()) + "/nw-collect-lag-" + std::to_string(getpid());
  std::filesystem::remove_all(directory);
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "lagging";
  options.directory = directory;
  options.maxRecords = 4 * 128;  // 128-call windows for 4 ranks, as 4096 ranks get by default
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  struct FakeRank {
    int fd = -1;
    wire::RecordEncoder encoder;
  };
  FakeRank ranks[4];
  auto send = [&](int rank, uint64_t firstSeq, uint64_t lastSeq) {
    std::vector<ncclwatch::trace::CallRecord> records;
    for (uint64_t seq = firstSeq; seq <= lastSeq; ++seq) {
      records.push_back(
          completedAllReduce(kComm, seq, rank == 2 && seq == kDivergentSeq ? 96 : 1024));
    }
    std::vector<std::byte> frame;
    wire::encodeRecords(2'000'000'000, records, ranks[rank].encoder, frame);
    sendAll(ranks[rank].fd, frame);
  };
  for (int rank = 0; rank < 4; ++rank) {
    ranks[rank].fd = joinAgent(collector.port(), "lagging", rank, 4, "fake-job", kComm, {});
    send(rank, 1, kAlike);  // calls 1-6 alike
  }
  // Every member seen: a communicator whose members never all reported keeps nothing (one that
  // never will would hold its windows at the cap).
  ASSERT_TRUE(eventually([&] { return collector.counters().records.load() == 4 * kAlike; }));
  for (int rank : {0, 1, 3}) send(rank, kAlike + 1, kCalls);
  ASSERT_TRUE(eventually([&] {
    return collector.counters().records.load() == 4 * kAlike + 3 * (kCalls - kAlike);
  })) << out.str();
  send(2, kAlike + 1, kCalls);
  ASSERT_TRUE(eventually([&] { return collector.counters().verdicts.load() >= 1; })) << out.str();
  // The windows come back to their size (and trim slack) once the verdict is said.
  for (int rank = 0; rank < 4; ++rank) send(rank, kCalls + 1, kCalls + 100);
  ASSERT_TRUE(
      eventually([&] { return collector.counters().records.load() == 4 * (kCalls + 100); }));
  EXPECT_LE(collector.counters().recordsHeld.load(), 4u * 192u);
  collector.stop();
  std::ifstream jsonl(directory + "/verdicts.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(jsonl, line)) << out.str();
  EXPECT_NE(line.find("\"kind\":\"mismatch\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"seq\":" + std::to_string(kDivergentSeq)), std::string::npos) << line;
  EXPECT_NE(line.find("\"culprits\":[2]"), std::string::npos) << line;
  for (FakeRank& rank : ranks) close(rank.fd);
  std::filesystem::remove_all(directory);
}

// A member that stops reporting (dead, or its agent gone) leaves every later call open: the
// others' windows hold them up to the cap (three windows), then are trimmed all the same, counted,
// so that the collector's memory stays bounded.
TEST(CollectorWindows, AWindowHeldForASilentMemberStopsAtItsCap) {
  constexpr uint64_t kComm = 0x5113ull;
  constexpr uint64_t kCalls = 1000;
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "silent-member";
  options.maxRecords = 2 * 128;  // 128-call windows
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  auto calls = [&](uint64_t firstSeq, uint64_t lastSeq) {
    std::vector<ncclwatch::trace::CallRecord> records;
    for (uint64_t seq = firstSeq; seq <= lastSeq; ++seq) {
      records.push_back(completedAllReduce(kComm, seq, 1024));
    }
    return records;
  };
  int silent = joinAgent(collector.port(), "silent-member", 1, 2, "fake-job", kComm, calls(1, 2));
  ASSERT_TRUE(eventually([&] { return collector.counters().records.load() == 2; }));
  int goesOn =
      joinAgent(collector.port(), "silent-member", 0, 2, "fake-job", kComm, calls(1, kCalls));
  ASSERT_TRUE(eventually([&] { return collector.counters().records.load() == 2 + kCalls; }));
  collector.stop();
  EXPECT_GE(collector.counters().windowHolds.load(), 1u);
  EXPECT_GE(collector.counters().windowHoldsBroken.load(), 1u);
  EXPECT_LE(collector.counters().recordsHeld.load(), 2u + 3u * 128u + 1u);
  close(silent);
  close(goesOn);
}

// Fake ranks of one job, each a member of one communicator, that send their calls (completed
// allreduces) on their own connection.
class FakeJob {
 public:
  // Rank r is member r % commSize of communicator commOfRank[r].
  FakeJob(int port, const std::string& secret, int commSize, std::vector<uint64_t> commOfRank)
      : ranks_(commOfRank.size()), commOfRank_(std::move(commOfRank)) {
    int world = static_cast<int>(ranks_.size());
    for (int rank = 0; rank < world; ++rank) {
      ranks_[static_cast<size_t>(rank)].fd =
          joinAgent(port, secret, rank, world, "fake-job", commOfRank_[static_cast<size_t>(rank)],
                    {}, commSize, rank % commSize);
    }
  }
  ~FakeJob() {
    for (Rank& rank : ranks_) close(rank.fd);
  }
  void send(int rank, uint64_t firstSeq, uint64_t lastSeq) {
    std::vector<ncclwatch::trace::CallRecord> records;
    for (uint64_t seq = firstSeq; seq <= lastSeq; ++seq) {
      records.push_back(completedAllReduce(commOfRank_[static_cast<size_t>(rank)], seq, 1024));
    }
    std::vector<std::byte> frame;
    wire::encodeRecords(2'000'000'000, records, ranks_[static_cast<size_t>(rank)].encoder, frame);
    sendAll(ranks_[static_cast<size_t>(rank)].fd, frame);
  }

 private:
  struct Rank {
    int fd = -1;
    wire::RecordEncoder encoder;
  };
  std::vector<Rank> ranks_;
  std::vector<uint64_t> commOfRank_;
};

// A collector that falls behind makes the members of many communicators hold at once. Together
// the held windows take at most twice the job's window budget (maxRecords records) beyond their
// reserves, which binds where the window floor (128 calls) gives a job more than maxRecords:
// here 4 pairs of ranks, one of each silent, whose talking members' windows would each grow by
// 208 records, share 512; the holds past it are broken, counted.
TEST(CollectorWindows, HeldWindowsTogetherStayWithinTheirBudget) {
  constexpr uint64_t kCalls = 1000, kStep = 50;
  constexpr int kRanks = 8;
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "held-budget";
  options.maxRecords = 2 * 128;  // 128-call windows all the same: the floor
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  std::vector<uint64_t> pairs;
  for (int rank = 0; rank < kRanks; ++rank) pairs.push_back(0xb0d9e700ull + rank / 2);
  FakeJob job(collector.port(), "held-budget", 2, pairs);
  // Every member reports the first calls (so that each pair has completed one), then the odd
  // ranks fall silent and the even ones go on, in step: every window holds at once.
  for (int rank = 0; rank < kRanks; ++rank) job.send(rank, 1, 2);
  ASSERT_TRUE(eventually([&] { return collector.counters().records.load() == 2 * kRanks; }));
  for (uint64_t first = 3; first <= kCalls; first += kStep) {
    uint64_t last = std::min(first + kStep - 1, kCalls);
    for (int rank = 0; rank < kRanks; rank += 2) job.send(rank, first, last);
    ASSERT_TRUE(eventually([&] {
      return collector.counters().records.load() == 2 * kRanks + kRanks / 2 * (last - 2);
    })) << out.str();
  }
  collector.stop();
  EXPECT_GE(collector.counters().windowHolds.load(), 1u);
  EXPECT_GE(collector.counters().windowHoldsOverBudget.load(), 1u);
  EXPECT_GT(collector.counters().heldRecordsPeak.load(), 0u);
  EXPECT_LE(collector.counters().heldRecordsPeak.load(), 2 * options.maxRecords);
}

// A communicator whose members could not all hold to the cap within that budget (here 5 ranks,
// where 512 records hold 2 windows' growth) is not held for its open collectives: at 32,768
// ranks a world held on a lagging collector made the holds take turns at the budget, which cost
// more memory than it bounded.
TEST(CollectorWindows, ACommunicatorTooLargeForTheBudgetIsNotHeld) {
  constexpr uint64_t kComm = 0x1a29e5ull, kCalls = 1000;
  constexpr int kRanks = 5;
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "too-large";
  options.maxRecords = 2 * 128;
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  FakeJob job(collector.port(), "too-large", kRanks, std::vector<uint64_t>(kRanks, kComm));
  for (int rank = 0; rank < kRanks; ++rank) job.send(rank, 1, 2);
  ASSERT_TRUE(eventually([&] { return collector.counters().records.load() == 2 * kRanks; }));
  for (int rank = 0; rank + 1 < kRanks; ++rank) job.send(rank, 3, kCalls);
  ASSERT_TRUE(eventually([&] {
    return collector.counters().records.load() == 2 * kRanks + (kRanks - 1) * (kCalls - 2);
  })) << out.str();
  collector.stop();
  EXPECT_EQ(collector.counters().windowHolds.load(), 0u);
  EXPECT_LE(collector.counters().recordsHeld.load(), 2u + (kRanks - 1) * (128u + 64u + 1u));
}

// Agents that come and go: a rank that finishes its calls and says BYE is not a dead rank while
// its peer lingers; a rank whose connection drops without BYE while its peer waits for it is one
// (after the reconnect grace and the quiet time: its process is not on this host to check).
TEST(CollectorAgents, ARankThatEndsNormallyIsNotDeadOneThatVanishesIs) {
  constexpr uint64_t kComm = 0x5150ull;
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "come-and-go";
  options.quietMs = 300;
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  auto join = [&](int rank, const std::string& job,
                  std::vector<ncclwatch::trace::CallRecord> calls) {
    return joinAgent(collector.port(), "come-and-go", rank, 2, job, kComm + job.size(), calls);
  };
  auto completed = [](uint64_t seq) {
    ncclwatch::trace::CallRecord call = allReduce(0, seq, 64);
    call.ncclSeqNumber = seq - 1;
    call.state = ncclwatch::trace::RecordState::kCompleted;
    call.completeNs = call.startNs + 1000;
    return call;
  };
  // Job "ends": both ranks complete two calls; rank 1 says BYE and leaves, rank 0 stays on.
  int stays = join(0, "ends", {completed(1), completed(2)});
  int leaves = join(1, "ends", {completed(1), completed(2)});
  std::vector<std::byte> bye;
  wire::encodeBye(bye);
  sendAll(leaves, bye);
  close(leaves);
  // Job "vanishes": rank 0 waits in call 2, which rank 1 never issues; rank 1's connection drops.
  ncclwatch::trace::CallRecord waiting = allReduce(0, 2, 64);
  waiting.ncclSeqNumber = 1;
  int waits = join(0, "vanishes", {completed(1), waiting});
  int vanishes = join(1, "vanishes", {completed(1)});
  std::this_thread::sleep_for(100ms);
  close(vanishes);
  ASSERT_TRUE(eventually([&] { return collector.counters().verdicts.load() >= 1; }, 8000ms))
      << out.str();
  std::this_thread::sleep_for(500ms);  // room for a wrong verdict on the other job
  collector.stop();
  std::string text = out.str();
  EXPECT_NE(text.find("DEAD_RANK"), std::string::npos) << text;
  EXPECT_NE(text.find("culprit 1"), std::string::npos) << text;
  EXPECT_EQ(collector.counters().verdicts.load(), 1u) << text;  // nothing about job "ends"
  close(stays);
  close(waits);
}

// A collector under --abort (a quiet time of 300 ms), for the tests of what aborts reach.
bool startAborting(Collector& collector, std::ostringstream& out, const std::string& secret) {
  ncclwatch::collect::Options options;
  options.secret = secret;
  options.quietMs = 300;
  options.abortOnVerdict = true;
  std::string error;
  bool started = collector.start(options, out, &error);
  EXPECT_TRUE(started) << error;
  return started;
}

// A rank's two allreduces on `comm`, the first completed; rank 1's second has another count.
std::vector<ncclwatch::trace::CallRecord> secondCallDiffers(uint64_t comm, int rank) {
  std::vector<ncclwatch::trace::CallRecord> records{allReduce(comm, 1, 1024),
                                                    allReduce(comm, 2, rank ? 512 : 1024)};
  records[0].state = ncclwatch::trace::RecordState::kCompleted;
  records[0].completeNs = records[0].startNs + 1000;
  return records;
}

// Under --abort, what the job does once aborted (here a call that then fails on the rank the
// abort left alone in the communicator) is said as what the abort set off, not headed as a
// finding of its own.
TEST(CollectorAgents, AVerdictAfterTheAbortIsSaidAsItsConsequence) {
  constexpr uint64_t kComm = 0xab0127ull;
  std::ostringstream out;
  Collector collector;
  ASSERT_TRUE(startAborting(collector, out, "abort-then"));
  std::string error;
  int agents[2];
  wire::RecordEncoder encoders[2];
  std::vector<std::byte> frame;
  for (int rank = 0; rank < 2; ++rank) {
    agents[rank] = joinAgent(collector.port(), "abort-then", rank, 2, "aborted-job", kComm, {});
    std::vector<ncclwatch::trace::CallRecord> records = secondCallDiffers(kComm, rank);
    frame.clear();
    wire::encodeRecords(2'000'000'000, records, encoders[rank], frame);
    sendAll(agents[rank], frame);
  }
  ASSERT_TRUE(eventually([&] { return collector.counters().abortsSent.load() >= 2; }, 8000ms))
      << out.str();
  // Rank 0 goes on: its next call fails (its communicator was aborted under it).
  ncclwatch::trace::CallRecord failed = allReduce(kComm, 3, 1024);
  failed.state = ncclwatch::trace::RecordState::kFailed;
  failed.result = 5;  // ncclInvalidUsage
  frame.clear();
  wire::encodeRecords(2'000'000'000, std::span(&failed, 1), encoders[0], frame);
  sendAll(agents[0], frame);
  ASSERT_TRUE(eventually([&] { return collector.counters().verdicts.load() >= 2; }, 8000ms))
      << out.str();
  collector.stop();
  std::string text = out.str();
  size_t mismatch = text.find("[ncclwatch] MISMATCH");
  size_t after = text.find("[ncclwatch] ERROR");
  ASSERT_NE(mismatch, std::string::npos) << text;
  ASSERT_NE(after, std::string::npos) << text;
  // The mismatch is a finding; the error that followed the abort is its consequence.
  EXPECT_EQ(text.substr(mismatch, text.find('\n', mismatch) - mismatch).find("[consequence]"),
            std::string::npos)
      << text;
  EXPECT_NE(text.substr(after, text.find('\n', after) - after).find("[consequence]"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("after ncclwatch aborted the job's communicators for the MISMATCH on comm ", after),
      std::string::npos)
      << text;
  EXPECT_EQ(collector.counters().verdictsAfterAbort.load(), 1u) << text;
  // Rank 0 was asked to dump for the mismatch only: a dump of its teardown would have become its
  // newest, the one the offline stacks read.
  int dumps = 0;
  std::vector<std::byte> received;
  for (std::byte buffer[4096];;) {
    ssize_t n = recv(agents[0], buffer, sizeof buffer, MSG_DONTWAIT);
    if (n <= 0) break;
    received.insert(received.end(), buffer, buffer + n);
  }
  std::span<const std::byte> rest(received);
  wire::Frame decoded;
  size_t consumed = 0;
  while (wire::decodeFrame(rest, &decoded, &consumed, &error) == wire::DecodeStatus::kFrame) {
    dumps += decoded.type == wire::FrameType::kDump ? 1 : 0;
    rest = rest.subspan(consumed);
  }
  EXPECT_EQ(dumps, 1) << text;
  for (int fd : agents) close(fd);
}

// Under --abort, a rank whose agent was not connected when the aborts went out (it came late, or
// its connection was lost before it read them) is aborted once it connects: every connection
// starts with COMMS, and a communicator a verdict aborted is aborted there too. Before, such a
// rank waited in it for ever (pytorch_hangs/skip once, its ranks 2 and 3 under a loaded CI).
TEST(CollectorAgents, ARankConnectingAfterTheAbortsIsAbortedToo) {
  constexpr uint64_t kComm = 0xab0128ull;
  std::ostringstream out;
  Collector collector;
  ASSERT_TRUE(startAborting(collector, out, "abort-late"));
  std::string error;
  int agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    agents[rank] = joinAgent(collector.port(), "abort-late", rank, 2, "late-job", kComm,
                             secondCallDiffers(kComm, rank));
  }
  ASSERT_TRUE(eventually([&] { return collector.counters().abortsSent.load() >= 2; }, 8000ms))
      << out.str();
  // Rank 1's connection is lost before it read anything; it connects again.
  close(agents[1]);
  ASSERT_TRUE(eventually([&] { return collector.counters().connected.load() == 1; })) << out.str();
  agents[1] = joinAgent(collector.port(), "abort-late", 1, 2, "late-job", kComm, {});
  wire::Frame frame;
  std::vector<std::byte> received;
  bool aborted = eventually([&] {
    std::byte buffer[4096];
    ssize_t n = recv(agents[1], buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) received.insert(received.end(), buffer, buffer + n);
    std::span<const std::byte> rest(received);
    size_t consumed = 0;
    while (wire::decodeFrame(rest, &frame, &consumed, &error) == wire::DecodeStatus::kFrame) {
      if (frame.type == wire::FrameType::kAbort && frame.commHash == kComm) return true;
      rest = rest.subspan(consumed);
    }
    return false;
  });
  EXPECT_TRUE(aborted) << out.str();
  EXPECT_EQ(collector.counters().abortsSent.load(), 3u) << out.str();
  collector.stop();
  for (int fd : agents) close(fd);
}

// A job that ends normally (every rank said BYE) is analysed to its last record before the
// collector exits: ranks whose calls disagree only in dtype complete them (silent corruption),
// end at once, and the collector is stopped right away; the verdict is still said.
TEST(CollectorEnd, AJobThatEndsNormallyIsAnalysedToItsLastRecord) {
  constexpr uint64_t kComm = 0x600dull;
  std::string directory =
      std::string(testing::TempDir()) + "/nw-collect-end-" + std::to_string(getpid());
  std::filesystem::remove_all(directory);
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "ends-normally";
  options.directory = directory;
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  std::vector<int> agents;
  for (int rank = 0; rank < 3; ++rank) {
    ncclwatch::trace::CallRecord call = allReduce(kComm, 1, 1024);
    call.dtype = rank == 1 ? 2 : 7;  // int32 against float32: the same bytes
    call.fingerprint = ncclwatch::trace::fingerprint({call.op, 1024, call.dtype, 0, -1});
    call.state = ncclwatch::trace::RecordState::kCompleted;
    call.completeNs = call.startNs + 1000;
    int fd = joinAgent(collector.port(), "ends-normally", rank, 3, "fake-job", kComm, {call});
    std::vector<std::byte> bye;
    wire::encodeBye(bye);
    sendAll(fd, bye);
    agents.push_back(fd);
  }
  for (int fd : agents) close(fd);
  collector.stop();  // at once: the frames may still be unread
  std::ifstream jsonl(directory + "/verdicts.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(jsonl, line)) << out.str();
  EXPECT_NE(line.find("\"kind\":\"mismatch\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"effect\":\"silent_data_corruption\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"culprits\":[1]"), std::string::npos) << line;
  EXPECT_NE(out.str().find("MISMATCH (silent data corruption)"), std::string::npos) << out.str();
  std::filesystem::remove_all(directory);
}

// A rank that crashed before it ever reached the collector is no blind spot: its trace file in
// the collector's folder says where it stopped, and with the others waiting it is a dead rank.
TEST(CollectorEnd, ARankThatNeverConnectedIsReadFromItsTraceFile) {
  constexpr uint64_t kComm = 0xdeadull;
  std::string directory =
      std::string(testing::TempDir()) + "/nw-collect-adopt-" + std::to_string(getpid());
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  {
    // Rank 3's trace: the communicator and its first call, then nothing (it crashed).
    ncclwatch::trace::RingWriter writer;
    ncclwatch::trace::ProcessInfo info{3, 4, 3, host, "fake-job"};
    std::string error;
    // Named as the library names it: <host>-<pid>.ncclwatch.
    ASSERT_TRUE(writer.open(directory + "/" + host + "-" + std::to_string(getpid()) + ".ncclwatch",
                            1024, info, &error))
        << error;
    ncclwatch::trace::CommInfo comm{};
    comm.commHash = kComm;
    comm.nranks = 4;
    comm.rank = 3;
    comm.color = -1;
    writer.addComm(comm);
    ncclwatch::trace::CallRecord call = allReduce(kComm, 1, 1024);
    call.state = ncclwatch::trace::RecordState::kCompleted;
    call.completeNs = call.startNs + 1000;
    writer.append(call);
  }  // closed: no process maps it any more
  std::ostringstream out;
  Collector collector;
  ncclwatch::collect::Options options;
  options.secret = "adopts";
  options.directory = directory;
  std::string error;
  ASSERT_TRUE(collector.start(options, out, &error)) << error;
  std::vector<int> agents;
  for (int rank = 0; rank < 3; ++rank) {
    ncclwatch::trace::CallRecord done = allReduce(kComm, 1, 1024);
    done.state = ncclwatch::trace::RecordState::kCompleted;
    done.completeNs = done.startNs + 1000;
    agents.push_back(joinAgent(collector.port(), "adopts", rank, 4, "fake-job", kComm,
                               {done, allReduce(kComm, 2, 1024)}));
  }
  ASSERT_TRUE(eventually([&] { return collector.counters().verdicts.load() >= 1; }, 8000ms))
      << out.str();
  collector.stop();
  EXPECT_NE(out.str().find("DEAD_RANK"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("culprit 3"), std::string::npos) << out.str();
  for (int fd : agents) close(fd);
  std::filesystem::remove_all(directory);
}

}  // namespace
