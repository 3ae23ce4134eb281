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
  // reject it (wrong secret, one connection per process, too many processes).
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
  // Interrupts a poll() from another thread.
  void wake();
  // Drops connections that did not authenticate within the HELLO timeout.
  void dropSilent(int64_t nowNs);
  // Whether any connection is open.
  bool anyOpen() const;
  // Queues a frame for a connection (dropped when the agent does not read: bounded).
  void send(size_t connection, std::span<const std::byte> frame);
  // Closes every descriptor.
  void closeAll();

 private:
  // One agent connection, in a slot of connections_ (the slot is its epoll tag).
  struct Connection {
    int fd = -1;
    bool authenticated = false;
    bool wantsWrite = false;  // EPOLLOUT is in its interest set
    int64_t acceptedNs = 0;
    int process = -1;  // the sink's process once HELLO arrived
    std::vector<std::byte> incoming;
    std::vector<std::byte> outgoing;
    trace::wire::RecordDecoder records;  // the delta bases of this connection's RECORDS frames
  };
  void accept();
  void read(Connection& connection);
  bool handle(Connection& connection, trace::wire::Frame& frame);
  void drop(Connection& connection, bool rejected);
  void write(Connection& connection);
  void watchWrites(Connection& connection, bool on);
  void refuse(Connection& connection, uint16_t version);

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
};

// Monotonic time of the collector (std::chrono::steady_clock), in ns.
int64_t steadyNs();

}  // namespace ncclwatch::collect
