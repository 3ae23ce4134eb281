// The collector's connections and framing (docs/protocol.md): the listening socket and the
// agents' connections, served by reader threads, each with its own epoll set over a share of the
// connections (bounded input and output buffers, frames decoded with each connection's or relay
// channel's delta bases). What they decode reaches the thread that owns the FrameSink (the
// triage, collect_triage.h) through one bounded queue per reader, in each connection's order:
// decoding, a third of the collector's work per record, then runs beside the triage instead of
// before it (docs/scale.md, "Session 15"). Nothing here knows about ranks, verdicts or analysis
// passes.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "collect.h"
#include "frame_queue.h"
#include "trace/wire.h"

namespace ncclwatch::collect {

// What the connections report to the side that understands the frames. Called only from the
// thread that calls Connections::poll.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // HELLO, the first frame of a connection: the process it speaks for, or -1 to reject it (wrong
  // secret, one connection per process, too many processes). `connection` is what send() takes:
  // an agent's own connection, or its channel on a relay link.
  virtual int hello(size_t connection, const trace::wire::Hello& hello) = 0;
  // A later frame of an accepted connection; false rejects the connection.
  virtual bool frame(int process, trace::wire::Frame& frame) = 0;
  // An accepted connection ended (its last frames were handed over first).
  virtual void closed(int process) = 0;
};

class Connections {
 public:
  // `log`: where the one line about agents of another protocol version goes (written from the
  // sink's thread).
  Connections(Counters& counters, FrameSink& sink, std::ostream& log);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Binds `address` (host:port), retrying a port in use for `listenWaitMs`, and starts `readers`
  // reader threads (1 to 64); false with a one-line `error`.
  bool listen(const std::string& address, int listenWaitMs, size_t maxAgents, int readers,
              std::string* error);
  int port() const { return port_; }
  // The sink's side of one round: hands what the readers decoded to the sink, waiting up to
  // `timeoutMs` for the first of it. Returns how many frames and ends it handed over.
  int poll(int timeoutMs);
  // Interrupts a poll() or a linger() from another thread.
  void wake();
  // Waits up to `ms` for wake() alone: after a round that handed over only a few frames, the
  // next round then takes many with one wake-up.
  void linger(int ms);
  // Drops connections that sent no HELLO within the HELLO timeout (as of `nowNs`) and have
  // nothing unread: every reader does so by itself each 100 ms; this makes them do it now, and
  // returns once they did (or after a second).
  void dropSilent(int64_t nowNs);
  // Whether any connection is open, or what the readers decoded is not all handed over.
  bool anyOpen() const;
  // At the end: asks every reader for a round that finds nothing more to read (the connections
  // still in the listen queue accepted, what the sockets hold decoded); caughtUp() says when
  // each one has had it since the ask whose number askToCatchUp() returned.
  uint64_t askToCatchUp();
  bool caughtUp(uint64_t asked) const;
  // Queues frames (whole ones) for an agent, by the `connection` its HELLO came with: on a relay
  // link they go stamped with its channel. Dropped when the agent (or its relay) does not read:
  // bounded.
  void send(size_t connection, std::span<const std::byte> frame);
  // Relay links open now (each one host's agents, docs/protocol.md "Relays").
  size_t relayLinks() const { return relayLinks_.load(std::memory_order_relaxed); }
  // Stops the readers and closes every descriptor.
  void closeAll();

 private:
  struct Reader;  // collect_connections.cc

  // The sink's side.
  int handOver(size_t limit);
  void handOver(QueuedFrame& queued);
  void reject(uint64_t endpoint);
  void sayVersion(uint16_t version);
  // The readers' side: wakes a poll() that waits.
  void notify();

  Counters& counters_;
  FrameSink& sink_;
  std::ostream& log_;
  size_t maxAgents_ = 0;
  int listenFd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<Reader>> readers_;
  std::atomic<size_t> open_{0};  // connections open, every reader's
  std::atomic<size_t> relayLinks_{0};
  // The sink's thread sleeps in poll() on readyFd_ (an eventfd the readers write when they
  // queued frames while it slept: sleeping_) and stopPipe_ (wake(), never drained).
  int readyFd_ = -1;
  int stopPipe_[2] = {-1, -1};
  std::atomic<bool> sleeping_{false};
  // The sink's thread alone: the process of each accepted endpoint, and the endpoints it
  // rejected whose reader has not said they ended yet (their frames in flight are ignored).
  std::unordered_map<uint64_t, int> processOf_;
  std::unordered_set<uint64_t> rejected_;
  std::set<uint16_t> versionsSaid_;  // protocol versions of refused agents, said once each
  uint64_t catchUpAsks_ = 0;
};

// A round (a reader's, or the sink's in Collector::State::run) that found fewer than kFewReady
// connections ready, or frames to hand over, is followed by a linger of kLingerMs: agents send a
// frame each per poll interval (thousands of frames a second from a large job), and a round per
// frame or two costs an epoll_wait, a wake-up and their kernel work each. A linger lets a few ms
// of frames gather, which one round then takes. No frame, verdict, DUMP or abort waits longer
// than kLingerMs for it; a command to a reader, or stopping, ends it.
inline constexpr int kFewReady = 64;
inline constexpr int kLingerMs = 4;

// Monotonic time of the collector (std::chrono::steady_clock), in ns.
int64_t steadyNs();
inline constexpr int64_t kMs = 1'000'000;  // in steadyNs's unit

}  // namespace ncclwatch::collect
