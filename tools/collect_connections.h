// The collector's connections and framing (docs/protocol.md): the listening socket, one epoll
// set over every agent's connection, bounded input and output buffers, frames decoded from the
// byte stream and handed to a FrameSink (the triage, collect_triage.h), which says who an agent
// is and what its frames mean. Nothing here knows about ranks, verdicts or analysis passes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "collect.h"
#include "trace/wire.h"

namespace ncclwatch::collect {

// What the connections report to the side that understands the frames.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // HELLO on a connection that has not authenticated yet: the process it speaks for, or -1 to
  // reject it (wrong secret, one connection per process, too many processes). `connection` is
  // what send() takes: an agent's own connection, or its channel on a relay link.
  virtual int hello(size_t connection, const trace::wire::Hello& hello) = 0;
  // A frame of an authenticated connection; false rejects the connection.
  virtual bool frame(int process, trace::wire::Frame& frame) = 0;
  // An authenticated connection ended (its last frames were handed over first).
  virtual void closed(int process) = 0;
};

class Connections {
 public:
  // `log`: where the one line about agents of another protocol version goes.
  Connections(Counters& counters, FrameSink& sink, std::ostream& log)
      : counters_(counters), sink_(sink), log_(log) {}
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Binds `address` (host:port), retrying a port in use for `listenWaitMs`, and sets up the
  // epoll set; false with a one-line `error`.
  bool listen(const std::string& address, int listenWaitMs, size_t maxAgents, std::string* error);
  int port() const { return port_; }
  // One round: waits up to `timeoutMs` for events, accepts, reads (frames go to the sink) and,
  // with `writes`, sends what waits. Returns how many events were not wake() calls.
  int poll(int timeoutMs, bool writes);
  // Interrupts a poll() or a linger() from another thread.
  void wake();
  // Waits up to `ms` for wake() alone, not for the agents: after a round that found only a few
  // connections ready, the next round then reads many with one epoll_wait and one wake-up.
  void linger(int ms);
  // Drops connections that did not authenticate within the HELLO timeout and have nothing
  // unread (a HELLO still in the socket buffer is the collector's delay, not the agent's).
  void dropSilent(int64_t nowNs);
  // Whether any connection is open.
  bool anyOpen() const;
  // Queues frames (whole ones) for an agent, by the `connection` its HELLO came with: on a relay
  // link they go stamped with its channel. Dropped when the agent (or its relay) does not read:
  // bounded.
  void send(size_t connection, std::span<const std::byte> frame);
  // Relay links open now (each one host's agents, docs/protocol.md "Relays").
  size_t relayLinks() const { return relayLinks_; }
  // What the sink's `connection` says: a connection slot, and a channel on it (0: direct).
  static size_t endpoint(size_t slot, uint32_t channel) { return slot | (size_t{channel} << 16); }
  // Closes every descriptor.
  void closeAll();

 private:
  // One agent behind a relay link.
  struct Channel {
    bool authenticated = false;
    // Closed by the collector: what the relay had in flight for it is ignored until the relay
    // answers CLOSED (then the channel number may name a new agent).
    bool rejected = false;
    int process = -1;
    trace::wire::RecordDecoder records;
  };
  // One agent connection, or one relay's link, in a slot of connections_ (the slot is its epoll
  // tag).
  struct Connection {
    int fd = -1;
    bool authenticated = false;
    bool wantsWrite = false;  // EPOLLOUT is in its interest set
    int64_t acceptedNs = 0;
    int process = -1;  // the sink's process once HELLO arrived
    std::vector<std::byte> incoming;
    std::vector<std::byte> outgoing;
    trace::wire::RecordDecoder records;  // the delta bases of this connection's RECORDS frames
    // A relay link (its first frame came with a channel): its agents by channel, the channel
    // numbers ascending in channelIds and each one's agent at the same index in channels. A
    // lookup per frame reads one short array (a host's 8 or so channels: one cache line) where
    // a hash map's buckets and nodes took a few misses (3.6% of the collector's time at 2048
    // ranks on 256 links). It counts as authenticated once one of them did.
    bool relay = false;
    std::vector<uint32_t> channelIds;
    std::vector<Channel> channels;
    Channel* findChannel(uint32_t channel);
    Channel& addChannel(uint32_t channel);
    void eraseChannel(const Channel& agent);  // one of `channels`
  };
  void accept();
  void read(Connection& connection);
  bool handle(Connection& connection, trace::wire::Frame& frame);
  // One agent's decoded frame, on its own connection or a relay link's channel (`endpoint`):
  // HELLO first, which makes it the sink's process, then frames for that process. False rejects
  // the agent.
  bool agentFrame(bool& authenticated, int& process, size_t endpoint, trace::wire::Frame& frame);
  void drop(Connection& connection, bool rejected);
  void write(Connection& connection);
  void watchWrites(Connection& connection, bool on);
  void refuse(Connection& connection, uint16_t version);
  // A relay link's frame for `channel`; false drops the whole link.
  bool handleChannel(Connection& connection, uint32_t channel, uint16_t type,
                     std::span<std::byte> bytes);
  void closeChannel(Connection& connection, uint32_t channel, bool rejected);
  void sayVersion(uint16_t version);
  size_t slotOf(const Connection& connection) const {
    return static_cast<size_t>(&connection - connections_.data());
  }

  Counters& counters_;
  FrameSink& sink_;
  std::ostream& log_;
  std::set<uint16_t> versionsSaid_;  // protocol versions of refused agents, said once each
  size_t maxAgents_ = 0;
  int listenFd_ = -1;
  int epollFd_ = -1;
  int port_ = 0;
  int wakePipe_[2] = {-1, -1};
  std::vector<Connection> connections_;  // slots; fd < 0: free
  std::vector<size_t> freeSlots_;
  size_t relayLinks_ = 0;
  // Every frame is decoded into this one, which keeps its vectors' room (decodeFrame).
  trace::wire::Frame frame_;
};

// Monotonic time of the collector (std::chrono::steady_clock), in ns.
int64_t steadyNs();
inline constexpr int64_t kMs = 1'000'000;  // in steadyNs's unit

}  // namespace ncclwatch::collect
