// The relay framing (docs/protocol.md, "Relays"): frames split by their header alone and stamped
// with a channel; the collector serving a relay link's agents as if each had its own connection
// (HELLO per channel, one rejected without the others, answers back on the right channel); and
// `ncclwatch relay` between fake agents on a host-local socket and a real collector.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/tcp.h>  // tcp_info's tcpi_data_segs_in (glibc's netinet/tcp.h lacks it)
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "collect.h"
#include "command.h"
#include "harness.h"
#include "relay.h"
#include "trace/fingerprint.h"
#include "trace/wire.h"
#include "watchdog/poll_beat.h"

namespace {

using namespace std::chrono_literals;
namespace wire = ncclwatch::trace::wire;
using ncclwatch::collect::Collector;
using namespace collecttest;
using ncclwatch::trace::CallRecord;

constexpr char kSecret[] = "relay-test-secret";
constexpr uint64_t kComm = 0x5eed5eed00112233ull;
constexpr char kRelayFolder[] = "nw-relay";
using RelayLinkTest = CollectorFixture<kSecret, kRelayFolder>;

int connectAbstract(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  for (int tries = 0; tries < 200; ++tries) {
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0) return fd;
    std::this_thread::sleep_for(10ms);
  }
  ADD_FAILURE() << "no relay listens on @" << name;
  return fd;
}

// Frames from `fd` until one decodes (its channel in `channel`), within the timeout.
bool receiveFrame(int fd, std::vector<std::byte>& buffer, wire::Frame* frame, uint32_t* channel,
                  std::chrono::milliseconds timeout = 5000ms) {
  return eventually(
      [&] {
        std::byte bytes[4096];
        ssize_t n = recv(fd, bytes, sizeof bytes, MSG_DONTWAIT);
        if (n > 0) buffer.insert(buffer.end(), bytes, bytes + n);
        size_t size = 0;
        uint16_t type = 0;
        if (wire::splitFrame(buffer, &size, channel, &type) != wire::SplitStatus::kFrame) {
          return false;
        }
        std::vector<std::byte> one(buffer.begin(), buffer.begin() + static_cast<ptrdiff_t>(size));
        buffer.erase(buffer.begin(), buffer.begin() + static_cast<ptrdiff_t>(size));
        wire::setChannel(one.data(), 0);
        size_t consumed = 0;
        std::string error;
        return wire::decodeFrame(one, frame, &consumed, &error) == wire::DecodeStatus::kFrame;
      },
      timeout);
}

CallRecord allReduce(uint64_t seq, uint64_t count) {
  return collecttest::allReduce(kComm, seq, count);
}

// What one agent of a 2-rank job sends first: HELLO, COMMS, two allreduces, the second of which
// diverges on rank 1.
std::vector<std::byte> agentOpening(int rank, const char* secret = kSecret) {
  std::vector<std::byte> bytes;
  wire::Hello opening = hello(secret, rank);
  opening.pid = 4000 + rank;
  std::strcpy(opening.host, "relayhost");
  std::strcpy(opening.jobId, "relay-job");
  opening.tracePath[0] = '\0';
  wire::encodeHello(opening, bytes);
  ncclwatch::trace::CommInfo comm{};
  comm.commHash = kComm;
  comm.nranks = 2;
  comm.rank = rank;
  comm.color = -1;
  std::vector<ncclwatch::trace::CommInfo> comms{comm};
  wire::encodeComms(comms, bytes);
  std::vector<CallRecord> records{allReduce(1, 1024), allReduce(2, rank ? 512 : 1024)};
  records[0].state = ncclwatch::trace::RecordState::kCompleted;
  records[0].completeNs = records[0].startNs + 1000;
  wire::RecordEncoder encoder;
  wire::encodeRecords(2'000'000'000, records, encoder, bytes);
  return bytes;
}

TEST(RelayFraming, FramesSplitByTheirHeaderAndCarryTheirChannel) {
  std::vector<std::byte> frames;
  wire::encodeDump("why", frames);
  size_t firstSize = frames.size();
  wire::encodeAbort(0xabc, frames);
  wire::encodeBye(frames);
  // Each prefix of the first frame needs more; the whole frame splits off with channel 0.
  size_t bytes = 0;
  uint32_t channel = 99;
  uint16_t type = 0;
  for (size_t cut = 0; cut < firstSize; ++cut) {
    EXPECT_EQ(wire::splitFrame(std::span(frames.data(), cut), &bytes, &channel, &type),
              wire::SplitStatus::kNeedMore);
  }
  ASSERT_EQ(wire::splitFrame(frames, &bytes, &channel, &type), wire::SplitStatus::kFrame);
  EXPECT_EQ(bytes, firstSize);
  EXPECT_EQ(channel, 0u);
  EXPECT_EQ(type, static_cast<uint16_t>(wire::FrameType::kDump));
  // Stamping reaches every frame of a batch, and only the reserved field.
  std::vector<std::byte> stamped;
  wire::appendWithChannel(frames, 4242, stamped);
  ASSERT_EQ(stamped.size(), frames.size());
  std::span<const std::byte> rest(stamped);
  int count = 0;
  while (!rest.empty()) {
    ASSERT_EQ(wire::splitFrame(rest, &bytes, &channel, &type), wire::SplitStatus::kFrame);
    EXPECT_EQ(channel, 4242u);
    // A stamped frame is no direct frame: the plain decoder refuses it.
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    EXPECT_EQ(wire::decodeFrame(rest, &frame, &consumed, &error), wire::DecodeStatus::kInvalid);
    std::vector<std::byte> copy(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(bytes));
    wire::setChannel(copy.data(), 0);
    EXPECT_EQ(wire::decodeFrame(copy, &frame, &consumed, &error), wire::DecodeStatus::kFrame)
        << error;
    rest = rest.subspan(bytes);
    ++count;
  }
  EXPECT_EQ(count, 3);
  // CLOSED: empty, its channel in the header.
  std::vector<std::byte> closed;
  wire::encodeClosed(7, closed);
  ASSERT_EQ(wire::splitFrame(closed, &bytes, &channel, &type), wire::SplitStatus::kFrame);
  EXPECT_EQ(channel, 7u);
  EXPECT_EQ(type, static_cast<uint16_t>(wire::FrameType::kClosed));
  EXPECT_EQ(bytes, sizeof(wire::FrameHeader));
  // Bad magic or a length over the bound cannot start a frame.
  std::vector<std::byte> garbage(32, std::byte{0x41});
  EXPECT_EQ(wire::splitFrame(garbage, &bytes, &channel, &type), wire::SplitStatus::kInvalid);
  wire::FrameHeader huge{wire::kMagic, 3, wire::kVersion, wire::kMaxPayload + 1, 5};
  std::vector<std::byte> header(sizeof huge);
  std::memcpy(header.data(), &huge, sizeof huge);
  EXPECT_EQ(wire::splitFrame(header, &bytes, &channel, &type), wire::SplitStatus::kInvalid);
}

// Two ranks behind one relay link: the collector takes each channel as an agent, finds their
// mismatch and asks each to dump on its own channel; a third channel with a wrong secret is
// closed alone.
TEST_F(RelayLinkTest, ChannelsOfOneLinkAreAgentsOfTheirOwn) {
  int link = connectTo(collector_.port());
  std::vector<std::byte> bytes;
  wire::appendWithChannel(agentOpening(0), 3, bytes);
  wire::appendWithChannel(agentOpening(1, "wrong-secret"), 9, bytes);
  wire::appendWithChannel(agentOpening(1), 5, bytes);
  sendAll(link, bytes);
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  EXPECT_EQ(collector_.counters().agents.load(), 2u);
  EXPECT_EQ(collector_.counters().connected.load(), 2u);
  EXPECT_EQ(collector_.counters().rejected.load(), 1u);
  EXPECT_NE(out_.str().find("MISMATCH"), std::string::npos) << out_.str();
  // Back on the link: CLOSED for the intruder's channel, DUMP for each rank's.
  std::vector<std::byte> buffer;
  std::set<uint32_t> dumped;
  bool intruderClosed = false;
  for (int frames = 0; frames < 3; ++frames) {
    wire::Frame frame;
    uint32_t channel = 0;
    ASSERT_TRUE(receiveFrame(link, buffer, &frame, &channel)) << "frame " << frames;
    if (frame.type == wire::FrameType::kClosed) {
      EXPECT_EQ(channel, 9u);
      intruderClosed = true;
    } else {
      EXPECT_EQ(frame.type, wire::FrameType::kDump);
      dumped.insert(channel);
    }
  }
  EXPECT_TRUE(intruderClosed);
  EXPECT_EQ(dumped, (std::set<uint32_t>{3, 5}));
  // The relay says one agent left: only that one is gone.
  std::vector<std::byte> closed;
  wire::encodeClosed(3, closed);
  sendAll(link, closed);
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 1; }));
  // The link ends: its remaining agent ended with it.
  close(link);
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 0; }));
}

// A direct connection that sends a stamped frame, or a relay link a frame without a channel,
// breaks the framing: dropped.
TEST_F(RelayLinkTest, MixedFramingIsRejected) {
  int direct = connectTo(collector_.port());
  std::vector<std::byte> bytes = agentOpening(0);
  sendAll(direct, bytes);
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 1; }));
  std::vector<std::byte> stamped;
  wire::encodeBye(stamped);
  wire::setChannel(stamped.data(), 2);
  sendAll(direct, stamped);
  EXPECT_TRUE(closedByPeer(direct, 3000ms));

  int link = connectTo(collector_.port());
  std::vector<std::byte> relayed;
  wire::appendWithChannel(agentOpening(1), 1, relayed);
  wire::encodeBye(relayed);  // channel 0 on a relay link
  sendAll(link, relayed);
  EXPECT_TRUE(closedByPeer(link, 3000ms));
  close(direct);
  close(link);
}

// A relay that folds sends a call it held after later calls of other communicators (tools/
// relay_fold.h): the collector takes such a record as new, where it used to take every record
// below the newest ring index as a newer copy: its live triage sees the divergence at once and a
// pass over that communicator says it.
TEST_F(RelayLinkTest, ACallThatComesAfterLaterCallsIsTakenAsNew) {
  constexpr uint64_t kOther = 0x5eed5eed00445566ull;
  int link = connectTo(collector_.port());
  std::vector<std::byte> bytes;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::byte> agent;
    wire::Hello opening = hello(kSecret, rank);
    opening.tracePath[0] = '\0';
    wire::encodeHello(opening, agent);
    std::vector<ncclwatch::trace::CommInfo> comms(2);
    for (size_t i = 0; i < 2; ++i) {
      comms[i].commHash = i == 0 ? kComm : kOther;
      comms[i].nranks = 2;
      comms[i].rank = rank;
      comms[i].color = -1;
    }
    wire::encodeComms(comms, agent);
    CallRecord late = completedAllReduce(kComm, 1, rank == 1 ? 512 : 1024);
    late.ringIndex = 0;
    CallRecord other = completedAllReduce(kOther, 1, 1024);
    other.ringIndex = 1;
    wire::RecordEncoder encoder;
    std::vector<CallRecord> first{other}, second{late};
    wire::encodeRecords(2'000'000'000, first, encoder, agent);
    wire::encodeRecords(2'000'000'000, second, encoder, agent);
    wire::appendWithChannel(agent, static_cast<uint32_t>(rank + 1), bytes);
  }
  sendAll(link, bytes);
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  EXPECT_NE(out_.str().find("MISMATCH"), std::string::npos) << out_.str();
  // Counted once the pass that said the verdict returns: after the verdict, not with it.
  EXPECT_TRUE(eventually([&] { return collector_.counters().divergencePasses.load() >= 1; }))
      << "no pass over the divergence: the late record was not taken as new";
  close(link);
}

// `ncclwatch relay` on the abstract name `name`, for the collector at `port`, on a thread of
// the test; it ends 200 ms after its last agent left. The future holds its exit code.
std::future<int> startRelay(const std::string& name, int port, std::ostringstream& log) {
  ncclwatch::relay::Options options;
  options.listenName = name;
  options.collectorHost = "127.0.0.1";
  options.collectorPort = port;
  options.idleMs = 200;
  return std::async(std::launch::async,
                    [options, &log] { return ncclwatch::relay::runRelay(options, log); });
}

// `ncclwatch relay` between two fake agents and the collector: their frames arrive as two
// agents over one connection, each gets its DUMP back without a channel, and when the relay's
// collector goes away the relay ends (3) and closes its agents, which then go direct.
TEST_F(RelayLinkTest, TheRelayCarriesAHostsAgentsOverOneConnection) {
  std::string name = "ncclwatch-relay-test-" + std::to_string(getpid());
  std::ostringstream relayLog;
  auto relay = startRelay(name, collector_.port(), relayLog);
  int agents[2];
  for (int rank = 0; rank < 2; ++rank) {
    agents[rank] = connectAbstract(name);
    sendAll(agents[rank], agentOpening(rank));
  }
  ASSERT_TRUE(eventually([&] { return collector_.counters().verdicts.load() >= 1; })) << out_.str();
  EXPECT_EQ(collector_.counters().agents.load(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::byte> buffer;
    wire::Frame frame;
    uint32_t channel = 99;
    ASSERT_TRUE(receiveFrame(agents[rank], buffer, &frame, &channel)) << "rank " << rank;
    EXPECT_EQ(frame.type, wire::FrameType::kDump);
    EXPECT_EQ(channel, 0u);  // the agent sees the frame as a direct collector sends it
  }
  // A normal end through the relay: BYE, then the agent's connection closes.
  std::vector<std::byte> bye;
  wire::encodeBye(bye);
  sendAll(agents[0], bye);
  close(agents[0]);
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 1; }));
  // The collector goes away: the relay says so and ends, closing its other agent.
  collector_.stop();
  EXPECT_TRUE(closedByPeer(agents[1], 5000ms));
  ASSERT_EQ(relay.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(relay.get(), 3);
  EXPECT_NE(relayLog.str().find("lost the collector"), std::string::npos) << relayLog.str();
  close(agents[1]);
}

// Once every agent left (and what they sent went out) the relay ends by itself.
TEST_F(RelayLinkTest, AnIdleRelayEnds) {
  std::string name = "ncclwatch-relay-idle-" + std::to_string(getpid());
  std::ostringstream relayLog;
  auto relay = startRelay(name, collector_.port(), relayLog);
  int agent = connectAbstract(name);
  sendAll(agent, agentOpening(0));
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 1; }));
  close(agent);
  ASSERT_EQ(relay.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(relay.get(), 0);
  EXPECT_TRUE(eventually([&] { return collector_.counters().connected.load() == 0; }));
  EXPECT_EQ(relayLog.str(), "");
}

// A host's agents poll on one beat and the relay gathers what they send within kGatherNs into one
// write: the collector reads a host's frames of a poll as one TCP segment, not one per agent.
// A fake collector (a plain socket) counts the data segments its end of the link received.
TEST(RelayGathering, AHostsFramesOfOnePollReachTheCollectorInOneWrite) {
  int port = 0;
  int listener = testsupport::listenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  std::string name = "ncclwatch-relay-gather-" + std::to_string(getpid());
  std::ostringstream relayLog;
  auto relay = startRelay(name, port, relayLog);
  constexpr int kAgents = 8;
  int agents[kAgents];
  for (int& agent : agents) agent = connectAbstract(name);
  std::vector<std::vector<std::byte>> hellos(kAgents);
  for (int rank = 0; rank < kAgents; ++rank) {
    wire::encodeHello(hello(kSecret, rank), hellos[static_cast<size_t>(rank)]);
  }
  // The link is up first (the relay connects when its first frame must go, and sends what
  // gathered until then at once).
  sendAll(agents[0], hellos[0]);
  int link = accept(listener, nullptr, nullptr);
  ASSERT_GE(link, 0);
  size_t received = 0;
  auto receiveUpTo = [&](size_t bytes) {
    return eventually([&] {
      std::byte buffer[8192];
      ssize_t got = recv(link, buffer, sizeof buffer, MSG_DONTWAIT);
      if (got > 0) received += static_cast<size_t>(got);
      return received >= bytes;
    });
  };
  ASSERT_TRUE(receiveUpTo(hellos[0].size()));
  auto dataSegments = [&] {
    tcp_info info{};
    socklen_t size = sizeof info;
    getsockopt(link, IPPROTO_TCP, TCP_INFO, &info, &size);
    return info.tcpi_data_segs_in;
  };
  uint32_t before = dataSegments();
  // One poll of the other seven agents, a little apart as their watchdogs wake on one beat.
  size_t expected = received;
  for (int rank = 1; rank < kAgents; ++rank) {
    sendAll(agents[rank], hellos[static_cast<size_t>(rank)]);
    expected += hellos[static_cast<size_t>(rank)].size();
    std::this_thread::sleep_for(200us);
  }
  ASSERT_TRUE(receiveUpTo(expected));
  uint32_t segments = dataSegments() - before;
  // One write; two or three on a machine busy enough to hold the test thread back for the
  // gathering window. Sent as they came (before session 21): seven.
  EXPECT_LE(segments, 3u) << "the relay wrote its agents' frames one by one";
  EXPECT_GE(segments, 1u);
  for (int agent : agents) close(agent);
  ASSERT_EQ(relay.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(relay.get(), 0);
  close(link);
  close(listener);
}

// The beat: the next multiple of the poll interval on the host's clock, never zero.
TEST(RelayGathering, AgentsPollOnTheHostsBeat) {
  using ncclwatch::watchdog::msToNextBeat;
  constexpr int64_t kMsNs = 1'000'000;
  EXPECT_EQ(msToNextBeat(1000 * kMsNs, 100), 100);  // on a beat: the next one
  EXPECT_EQ(msToNextBeat(1000 * kMsNs + 1, 100), 100);
  EXPECT_EQ(msToNextBeat(1042 * kMsNs, 100), 58);
  EXPECT_EQ(msToNextBeat(1099 * kMsNs + 500'000, 100), 1);  // half a ms left: one
  EXPECT_EQ(msToNextBeat(5 * kMsNs, 10), 5);
  EXPECT_EQ(msToNextBeat(123 * kMsNs, 1), 1);
  EXPECT_EQ(msToNextBeat(123 * kMsNs, 0), 1);
  // Two agents that polled at different moments wake on the same beat.
  int64_t a = 7'777 * kMsNs + 3 * kMsNs / 10, b = 7'731 * kMsNs;
  EXPECT_EQ(a + msToNextBeat(a, 100) * kMsNs - (b + msToNextBeat(b, 100) * kMsNs), 3 * kMsNs / 10);
}

}  // namespace
