// The collector's connections on their own (tools/collect_connections.h), with a sink that
// only records what it is handed: what happens to a connection before its HELLO is taken, and
// what the reader threads promise the sink (each connection's frames in order, its end after
// them, rejections and answers by endpoint).
#include "collect_connections.h"

#include <map>
#include <sstream>

#include "harness.h"

namespace {

using namespace collecttest;
using ncclwatch::collect::Connections;
using ncclwatch::collect::Counters;
using ncclwatch::collect::steadyNs;
namespace wire = ncclwatch::trace::wire;

class RecordingSink : public ncclwatch::collect::FrameSink {
 public:
  int hello(size_t connection, const wire::Hello&) override {
    if (rejectHellos) return -1;
    endpoints.push_back(connection);
    return hellos++;
  }
  bool frame(int process, wire::Frame& frame) override {
    texts[process].push_back(frame.reason);
    return frame.reason != "reject me";
  }
  void closed(int process) override { ended.push_back(process); }
  bool rejectHellos = false;
  int hellos = 0;
  std::vector<size_t> endpoints;                  // by process
  std::map<int, std::vector<std::string>> texts;  // SITES texts, by process
  std::vector<int> ended;
};

constexpr int64_t kPastTheHelloTimeoutNs = 6'000'000'000;  // the timeout is 5 s

std::vector<std::byte> sites(const std::string& text) {
  std::vector<std::byte> frame;
  wire::encodeSites(text, frame);
  return frame;
}

std::vector<std::byte> helloFrame(int rank) {
  std::vector<std::byte> frame;
  wire::encodeHello(hello("s3cret", rank), frame);
  return frame;
}

class ConnectionsTest : public testing::Test {
 protected:
  void listen(int readers) {
    std::string error;
    ASSERT_TRUE(connections_.listen("127.0.0.1:0", 0, 64, readers, &error)) << error;
  }
  // Polls (the sink's side) until `done`, at most 5 s.
  template <typename Predicate>
  bool pollUntil(Predicate done) {
    return eventually([&] {
      connections_.poll(10);
      return done();
    });
  }
  void TearDown() override { connections_.closeAll(); }
  Counters counters_;
  RecordingSink sink_;
  std::ostringstream log_;
  Connections connections_{counters_, sink_, log_};
};

// A collector busy for longer than the HELLO timeout (a pass over 32,768 ranks, thousands of
// links connecting at once) must not drop the agents whose HELLO it has not taken yet: that
// would lose a host's ranks for the collector's own delay.
TEST_F(ConnectionsTest, AHelloNotTakenYetIsNotTakenForSilence) {
  listen(1);
  int agent = connectTo(connections_.port());
  ASSERT_TRUE(eventually([&] { return connections_.anyOpen(); }));
  sendAll(agent, helloFrame(3));
  std::this_thread::sleep_for(50ms);  // read by the reader, or in the socket; not handed over
  connections_.dropSilent(steadyNs() + kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 0u);
  EXPECT_TRUE(connections_.anyOpen());
  EXPECT_TRUE(pollUntil([&] { return sink_.hellos == 1; }));
  close(agent);
}

// A connection that sends nothing is dropped once the timeout has passed, not before.
TEST_F(ConnectionsTest, ASilentConnectionIsDroppedAfterTheTimeout) {
  listen(1);
  int agent = connectTo(connections_.port());
  ASSERT_TRUE(eventually([&] { return connections_.anyOpen(); }));
  connections_.dropSilent(steadyNs());
  EXPECT_TRUE(connections_.anyOpen());
  connections_.dropSilent(steadyNs() + kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 1u);
  EXPECT_FALSE(connections_.anyOpen());
  EXPECT_TRUE(closedByPeer(agent, 2000ms));
  close(agent);
}

// dropSilent returns once its own sweep ran, whatever time earlier sweeps were asked to judge
// by (a later one may judge by an earlier time).
TEST_F(ConnectionsTest, EachSweepIsWaitedFor) {
  listen(2);
  int first = connectTo(connections_.port());
  ASSERT_TRUE(eventually([&] { return connections_.anyOpen(); }));
  connections_.dropSilent(steadyNs() + 10 * kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 1u);
  int second = connectTo(connections_.port());
  ASSERT_TRUE(eventually([&] { return connections_.anyOpen(); }));
  connections_.dropSilent(steadyNs() + kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 2u);
  EXPECT_FALSE(connections_.anyOpen());
  close(first);
  close(second);
}

// Agents spread over four readers: each one's frames reach the sink whole and in the order it
// sent them, and its end after its last frame.
TEST_F(ConnectionsTest, EachConnectionsFramesComeInOrderAndItsEndAfterThem) {
  listen(4);
  constexpr int kAgents = 12, kFrames = 200;
  std::vector<int> agents;
  for (int rank = 0; rank < kAgents; ++rank) agents.push_back(connectTo(connections_.port()));
  for (int rank = 0; rank < kAgents; ++rank) sendAll(agents[rank], helloFrame(rank));
  for (int n = 0; n < kFrames; ++n) {
    for (int rank = 0; rank < kAgents; ++rank) {
      sendAll(agents[rank], sites(std::to_string(rank) + ":" + std::to_string(n)));
    }
  }
  for (int fd : agents) close(fd);
  ASSERT_TRUE(pollUntil([&] { return sink_.ended.size() == kAgents; }))
      << sink_.ended.size() << " ended";
  ASSERT_EQ(sink_.hellos, kAgents);
  std::set<size_t> readersUsed;
  for (int process = 0; process < kAgents; ++process) {
    const std::vector<std::string>& got = sink_.texts[process];
    ASSERT_EQ(got.size(), size_t{kFrames}) << "process " << process;
    std::string rank = got[0].substr(0, got[0].find(':'));
    for (int n = 0; n < kFrames; ++n) EXPECT_EQ(got[n], rank + ":" + std::to_string(n));
    readersUsed.insert(sink_.endpoints[process] & 0xff);
  }
  EXPECT_EQ(readersUsed.size(), 4u);  // round robin: every reader served some
  EXPECT_EQ(counters_.frames.load(), uint64_t{kAgents * (kFrames + 1)});
  EXPECT_FALSE(connections_.anyOpen());
}

// A reader whose queue is full (256 frames) stops reading and waits for room: nothing is lost,
// and the frames still come in order once the sink takes them.
TEST_F(ConnectionsTest, AFullQueueHoldsTheReaderBackAndLosesNothing) {
  listen(1);
  constexpr int kFrames = 2000;
  int agent = connectTo(connections_.port());
  sendAll(agent, helloFrame(0));
  std::vector<std::byte> all;
  for (int n = 0; n < kFrames; ++n) {
    std::vector<std::byte> frame = sites(std::to_string(n));
    all.insert(all.end(), frame.begin(), frame.end());
  }
  sendAll(agent, all);
  std::this_thread::sleep_for(200ms);  // the reader fills its queue and waits
  EXPECT_TRUE(connections_.anyOpen());
  ASSERT_TRUE(pollUntil([&] { return sink_.texts[0].size() == size_t{kFrames}; }))
      << sink_.texts[0].size() << " of " << kFrames;
  for (int n = 0; n < kFrames; ++n) ASSERT_EQ(sink_.texts[0][n], std::to_string(n));
  close(agent);
  ASSERT_TRUE(pollUntil([&] { return sink_.ended.size() == 1; }));
}

// The reader lets no frame but a HELLO be first: such a connection is dropped before the sink
// hears of it.
TEST_F(ConnectionsTest, AFrameBeforeHelloDropsTheConnection) {
  listen(2);
  int agent = connectTo(connections_.port());
  sendAll(agent, sites("too early"));
  EXPECT_TRUE(closedByPeer(agent, 2000ms));
  connections_.poll(10);
  EXPECT_EQ(sink_.hellos, 0);
  EXPECT_TRUE(sink_.texts.empty());
  EXPECT_EQ(counters_.rejected.load(), 1u);
  close(agent);
}

// A HELLO the sink refuses closes the connection, and what the agent sent after it never
// reaches the sink; a frame the sink refuses ends the process (closed) and the connection.
TEST_F(ConnectionsTest, WhatTheSinkRefusesEndsTheConnection) {
  listen(2);
  sink_.rejectHellos = true;
  int refused = connectTo(connections_.port());
  std::vector<std::byte> bytes = helloFrame(0), more = sites("after a refused hello");
  bytes.insert(bytes.end(), more.begin(), more.end());
  sendAll(refused, bytes);
  EXPECT_TRUE(pollUntil([&] { return closedByPeer(refused, 20ms); }));
  EXPECT_TRUE(sink_.texts.empty());
  sink_.rejectHellos = false;
  int agent = connectTo(connections_.port());
  sendAll(agent, helloFrame(1));
  sendAll(agent, sites("reject me"));
  sendAll(agent, sites("never handed over"));
  ASSERT_TRUE(pollUntil([&] { return !sink_.ended.empty(); }));
  EXPECT_EQ(sink_.ended, std::vector<int>{0});
  EXPECT_TRUE(closedByPeer(agent, 2000ms));
  connections_.poll(10);
  EXPECT_EQ(sink_.texts[0], std::vector<std::string>{"reject me"});
  EXPECT_EQ(counters_.rejected.load(), 2u);
  close(refused);
  close(agent);
}

// What the sink sends by an endpoint reaches that agent (its reader writes it); an endpoint that
// ended takes nothing.
TEST_F(ConnectionsTest, SendReachesTheAgentOfTheEndpoint) {
  listen(3);
  std::vector<int> agents;
  for (int rank = 0; rank < 3; ++rank) {
    agents.push_back(connectTo(connections_.port()));
    sendAll(agents.back(), helloFrame(rank));
  }
  ASSERT_TRUE(pollUntil([&] { return sink_.hellos == 3; }));
  std::vector<std::byte> dump;
  wire::encodeDump("look at rank 1", dump);
  connections_.send(sink_.endpoints[1], dump);
  // The process the sink numbered 1 is one of the three agents: the one that gets the DUMP.
  int got = -1;
  ASSERT_TRUE(eventually([&] {
    for (size_t i = 0; i < agents.size(); ++i) {
      pollfd ready{agents[i], POLLIN, 0};
      if (poll(&ready, 1, 0) > 0) got = static_cast<int>(i);
    }
    return got >= 0;
  }));
  std::vector<std::byte> received(dump.size());
  ASSERT_EQ(recv(agents[got], received.data(), received.size(), MSG_WAITALL),
            static_cast<ssize_t>(dump.size()));
  wire::Frame frame;
  size_t consumed = 0;
  std::string error;
  ASSERT_EQ(wire::decodeFrame(received, &frame, &consumed, &error), wire::DecodeStatus::kFrame)
      << error;
  EXPECT_EQ(frame.type, wire::FrameType::kDump);
  EXPECT_EQ(frame.reason, "look at rank 1");
  for (size_t i = 0; i < agents.size(); ++i) {
    pollfd ready{agents[i], POLLIN, 0};
    EXPECT_EQ(poll(&ready, 1, 50), 0) << "agent " << i << " got a frame not meant for it";
  }
  close(agents[got]);
  ASSERT_TRUE(pollUntil([&] { return sink_.ended.size() == 1; }));
  connections_.send(sink_.endpoints[1], dump);  // ended: dropped, nothing breaks
  for (int fd : agents) close(fd);
}

}  // namespace
