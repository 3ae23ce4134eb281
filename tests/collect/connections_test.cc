// The collector's connections on their own (tools/collect_connections.h), with a sink that
// only counts: what happens to a connection before its HELLO is read.
#include "collect_connections.h"

#include <sstream>

#include "harness.h"

namespace {

using namespace collecttest;
using ncclwatch::collect::Connections;
using ncclwatch::collect::Counters;
using ncclwatch::collect::steadyNs;

class CountingSink : public ncclwatch::collect::FrameSink {
 public:
  int hello(size_t, const ncclwatch::trace::wire::Hello&) override { return hellos++; }
  bool frame(int, ncclwatch::trace::wire::Frame&) override { return true; }
  void closed(int) override {}
  int hellos = 0;
};

constexpr int64_t kPastTheHelloTimeoutNs = 6'000'000'000;  // the timeout is 5 s

class ConnectionsTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(connections_.listen("127.0.0.1:0", 0, 16, 1, &error)) << error;
    agent_ = connectTo(connections_.port());
    // Accepted, nothing read yet.
    ASSERT_TRUE(eventually([&] {
      connections_.poll(10);
      return connections_.anyOpen();
    }));
  }
  void TearDown() override {
    close(agent_);
    connections_.closeAll();
  }
  Counters counters_;
  CountingSink sink_;
  std::ostringstream log_;
  Connections connections_{counters_, sink_, log_};
  int agent_ = -1;
};

// A collector busy for longer than the HELLO timeout (a pass over 32,768 ranks, thousands of
// links connecting at once) must not drop the agents whose HELLO it has not taken yet: that
// would lose a host's ranks for the collector's own delay.
TEST_F(ConnectionsTest, AHelloNotTakenYetIsNotTakenForSilence) {
  std::vector<std::byte> frame;
  ncclwatch::trace::wire::encodeHello(hello("s3cret", 3), frame);
  sendAll(agent_, frame);
  std::this_thread::sleep_for(50ms);  // read by the reader, or in the socket; not handed over
  connections_.dropSilent(steadyNs() + kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 0u);
  EXPECT_TRUE(connections_.anyOpen());
  EXPECT_TRUE(eventually([&] {
    connections_.poll(10);
    return sink_.hellos == 1;
  }));
}

// A connection that sends nothing is dropped once the timeout has passed, not before.
TEST_F(ConnectionsTest, ASilentConnectionIsDroppedAfterTheTimeout) {
  connections_.dropSilent(steadyNs());
  EXPECT_TRUE(connections_.anyOpen());
  connections_.dropSilent(steadyNs() + kPastTheHelloTimeoutNs);
  EXPECT_EQ(counters_.rejected.load(), 1u);
  EXPECT_FALSE(connections_.anyOpen());
  EXPECT_TRUE(closedByPeer(agent_, 2000ms));
}

}  // namespace
