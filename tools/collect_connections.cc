#include "collect_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <mutex>
#include <thread>

namespace ncclwatch::collect {
namespace wire = trace::wire;

namespace {

constexpr size_t kMaxIncoming = 2 * wire::kMaxPayload + sizeof(wire::FrameHeader);
constexpr size_t kMaxOutgoing = 1u << 20;
constexpr int64_t kHelloTimeoutNs = 5'000'000'000;
constexpr int64_t kSweepEveryNs = 100'000'000;
// epoll tags of the two descriptors that are not connections (connections use their slot).
constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kWakeTag = ~0ull - 1;
// Frames a reader may have decoded and not yet handed over: at ~10 records a frame, about a
// millisecond of a 32,768-rank job's records (a thousand slots cost a 4096-rank collector 16 MiB
// more peak RSS on the host, past its 150 MiB budget). A full queue stops the reader reading: the
// kernel's buffers and then the agents' own bounded queues hold the rest, as when the collector
// falls behind.
constexpr size_t kQueueSlots = 256;
// A queue slot's records vector is let go past this room (a frame of tens of thousands of
// records, after a reconnect's resend), so that a thousand slots never each keep megabytes.
constexpr size_t kSlotRecordsKept = 8192;
// How many frames one poll() hands over at most, so that the sink's housekeeping (analysis
// passes, aborts) still runs while the readers keep it busy.
constexpr size_t kHandOverPerPoll = 16384;

// An eventfd's wake-up (one more count), and taking all of its counts (it is non-blocking).
void signalEventFd(int fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof one);
  (void)ignored;
}
void drainEventFd(int fd) {
  uint64_t count = 0;
  ssize_t ignored = ::read(fd, &count, sizeof count);
  (void)ignored;
}

// The sink's name for an endpoint: the reader's own number for it, and the reader's index.
uint64_t sinkEndpoint(uint32_t number, uint8_t reader) {
  return uint64_t{number} << 8 | reader;
}
uint32_t numberOf(uint64_t endpoint) {
  return static_cast<uint32_t>(endpoint >> 8);
}
size_t readerOf(uint64_t endpoint) {
  return endpoint & 0xff;
}

// Whether the socket holds bytes not read yet.
bool bytesWaiting(int fd) {
  int waiting = 0;
  return ioctl(fd, FIONREAD, &waiting) == 0 && waiting > 0;
}

// host:port → a bound, listening, non-blocking socket.
int listenOn(const std::string& address, std::string* error) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "--listen " + address + " is not host:port";
    return -1;
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    *error = "--listen " + address + ": cannot resolve";
    return -1;
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) {
    int why = errno;
    *error = "--listen " + address + ": " + std::strerror(why);
    if (fd >= 0) close(fd);
    freeaddrinfo(found);
    errno = why;  // the caller may wait for a port in use to free up
    return -1;
  }
  freeaddrinfo(found);
  return fd;
}

// Thousands of agents need thousands of descriptors: take what the hard limit allows.
void raiseDescriptorLimit(size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, wanted);
  setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One reader thread: a share of the connections (assigned round robin as reader 0 accepts
// them), its own epoll set, their frames decoded into its queue. An endpoint (a direct
// connection, or one agent's channel on a relay link) has a number of its own that is never
// reused while the collector runs, so that a late command for an endpoint that ended finds
// nothing rather than its slot's next tenant; the sink knows it as (number << 8 | reader).
struct Connections::Reader {
  // One agent behind a relay link.
  struct Channel {
    uint32_t endpoint = 0;
    bool helloSeen = false;  // its first frame, a HELLO, was handed over
    // Closed by the collector: what the relay had in flight for it is ignored until the relay
    // answers CLOSED (then the channel number may name a new agent).
    bool rejected = false;
    wire::RecordDecoder records;
  };
  // One agent connection, or one relay's link, in a slot of `connections` (its epoll tag).
  struct Connection {
    int fd = -1;
    uint32_t endpoint = 0;    // a direct connection's (none on a relay link)
    bool helloSeen = false;   // a HELLO was handed over (on a link: one of its channels')
    bool wantsWrite = false;  // EPOLLOUT is in its interest set
    int64_t acceptedNs = 0;
    std::vector<std::byte> incoming;
    std::vector<std::byte> outgoing;
    wire::RecordDecoder records;  // the delta bases of a direct connection's RECORDS frames
    // A relay link (its first frame came with a channel): its agents by channel, the channel
    // numbers ascending in channelIds and each one's agent at the same index in channels. A
    // lookup per frame reads one short array (a host's 8 or so channels: one cache line) where
    // a hash map's buckets and nodes took a few misses (3.6% of the collector's time at 2048
    // ranks on 256 links).
    bool relay = false;
    std::vector<uint32_t> channelIds;
    std::vector<Channel> channels;
    Channel* findChannel(uint32_t channel);
    Channel& addChannel(uint32_t channel);
    void eraseChannel(const Channel& agent);  // one of `channels`
  };
  // What the other threads ask of a reader.
  struct Command {
    enum class Kind { kAdopt, kSend, kReject, kSweep, kCatchUp };
    Kind kind = Kind::kSend;
    int fd = -1;                   // kAdopt: an accepted connection
    uint32_t endpoint = 0;         // kSend, kReject
    int64_t nowNs = 0;             // kAdopt: when accepted; kSweep: the time to judge silence by
    uint64_t ask = 0;              // kSweep, kCatchUp: its number
    std::vector<std::byte> bytes;  // kSend: whole frames
  };
  struct Where {
    uint32_t slot = 0;
    uint32_t channel = 0;  // 0: the direct connection
  };

  Reader(Connections& owner, uint8_t index) : owner_(owner), index_(index) {}
  ~Reader() { stop(); }
  bool open(std::string* error);
  void watchListening(int fd);
  void start();
  void stop();
  void post(Command command);
  // Waits (at most a second) until the reader has swept its connections as of `nowNs`.
  void sweepNow(int64_t nowNs);
  bool idle() const { return queue_.empty(); }
  // The sink's side, after taking from the queue: wakes the reader if it waits for room.
  void roomMade();
  uint64_t caughtUp() const { return caughtUp_.load(); }
  FrameQueue& queue() { return queue_; }

 private:
  void run();
  void runCommands();
  void runCommand(Command& command);
  void linger(int ms);
  void accept();
  void adopt(int fd, int64_t acceptedNs);
  void read(Connection& connection);
  bool handleChannel(Connection& connection, uint32_t channel, uint16_t type,
                     std::span<std::byte> bytes);
  // `counted`: whether a rejection counts now (a refused version counts where it is said).
  void closeChannel(Connection& connection, uint32_t channel, bool rejected, bool counted = true);
  void drop(Connection& connection, bool rejected);
  void refuse(Connection& connection, QueuedFrame* slot);
  void queueOut(Connection& connection, uint32_t channel, std::span<const std::byte> frames);
  void write(Connection& connection);
  void watchWrites(Connection& connection, bool on);
  void sweep(int64_t nowNs);
  uint32_t newEndpoint(Connection& connection, uint32_t channel);
  size_t slotOf(const Connection& connection) const {
    return static_cast<size_t>(&connection - connections_.data());
  }
  // A queue slot to decode into, waiting while the queue is full; a scratch slot, never handed
  // over, once the reader is stopping.
  QueuedFrame* claim();
  void publish(QueuedFrame* slot);
  void publishClosed(uint32_t endpoint);
  // Wakes the sink's thread for what this reader queued since the last time.
  void flush();

  Connections& owner_;
  const uint8_t index_;
  int epollFd_ = -1;
  int wakeFd_ = -1;  // eventfd: commands, stop
  // A reader whose queue is full waits on roomFd_ (an eventfd) with waitingForRoom_ set; the
  // sink, having taken from the queue, swaps the flag and writes the eventfd if it was set. The
  // two exchanges are ordered: either the sink sees the flag, or the reader's look at the queue
  // after its own exchange sees what the sink took.
  int roomFd_ = -1;
  std::atomic<bool> waitingForRoom_{false};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::vector<Connection> connections_;  // slots; fd < 0: free
  std::vector<size_t> freeSlots_;
  std::unordered_map<uint32_t, Where> endpoints_;
  uint32_t nextEndpoint_ = 0;
  size_t nextTarget_ = 0;  // the reader the next accepted connection goes to (reader 0's)
  FrameQueue queue_{kQueueSlots};
  QueuedFrame discard_;
  bool queuedSinceFlush_ = false;
  std::mutex commandsMutex_;
  std::vector<Command> commands_;  // guarded by commandsMutex_
  std::atomic<bool> hasCommands_{false};
  std::vector<Command> running_;
  // kSweep asks (sweepNow, from the sink's thread) and the last one done.
  uint64_t sweepsAsked_ = 0;
  std::atomic<uint64_t> sweepsDone_{0};
  // kCatchUp: the latest ask run and not yet answered, and the last ask answered by a round that
  // found nothing to read.
  uint64_t catchUpAsked_ = 0;
  std::atomic<uint64_t> caughtUp_{0};
};

bool Connections::Reader::open(std::string* error) {
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  roomFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wakeFd_ < 0 || roomFd_ < 0 || epollFd_ < 0) {
    *error = std::string("epoll: ") + std::strerror(errno);
    return false;
  }
  epoll_event wakeEvent{};
  wakeEvent.events = EPOLLIN;
  wakeEvent.data.u64 = kWakeTag;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &wakeEvent);
  return true;
}

void Connections::Reader::watchListening(int fd) {
  epoll_event listenEvent{};
  listenEvent.events = EPOLLIN;
  listenEvent.data.u64 = kListenTag;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &listenEvent);
}

void Connections::Reader::start() {
  thread_ = std::thread([this] { run(); });
  std::string name = "nw-reader-" + std::to_string(index_);
  pthread_setname_np(thread_.native_handle(), name.c_str());
}

void Connections::Reader::stop() {
  if (thread_.joinable()) {
    stopping_.store(true);
    signalEventFd(wakeFd_);
    thread_.join();
  }
  // What the sink asked for last (a final verdict's DUMP and ABORT requests) still goes out,
  // as far as the sockets take it at once; connections handed over by reader 0 (stopped first)
  // are adopted and closed with the rest. Nothing posts any more.
  runCommands();
  for (Connection& connection : connections_) {
    if (connection.fd >= 0) close(connection.fd);
  }
  connections_.clear();
  for (int* fd : {&epollFd_, &wakeFd_, &roomFd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void Connections::Reader::post(Command command) {
  {
    std::lock_guard lock(commandsMutex_);
    commands_.push_back(std::move(command));
  }
  // One wake-up for a burst of commands (a verdict's DUMP to thousands of ranks).
  if (!hasCommands_.exchange(true)) signalEventFd(wakeFd_);
}

void Connections::Reader::sweepNow(int64_t nowNs) {
  Command command;
  command.kind = Command::Kind::kSweep;
  command.nowNs = nowNs;
  command.ask = ++sweepsAsked_;
  post(std::move(command));
  for (int waited = 0; waited < 1000 && sweepsDone_.load() < sweepsAsked_; ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Connections::Reader::run() {
  int64_t nextSweepNs = steadyNs() + kSweepEveryNs;
  epoll_event events[1024];
  while (!stopping_.load(std::memory_order_relaxed)) {
    // A catch-up ask run in an earlier round is answered by this one, whose epoll_wait begins
    // after the ask was posted: with nothing ready, the reader has read all there was then.
    uint64_t answering = catchUpAsked_;
    catchUpAsked_ = 0;
    int ready =
        epoll_wait(epollFd_, events, static_cast<int>(std::size(events)), answering != 0 ? 0 : 100);
    int news = 0;
    for (int i = 0; i < ready && !stopping_.load(std::memory_order_relaxed); ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) continue;  // commands, below
      ++news;
      if (tag == kListenTag) {
        accept();
        continue;
      }
      if (tag >= connections_.size()) continue;
      Connection& connection = connections_[tag];
      if (connection.fd < 0) continue;  // dropped earlier in this batch
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read(connection);
      if (connection.fd >= 0 && (events[i].events & EPOLLOUT)) write(connection);
      flush();  // the sink starts on this connection's frames while the others are read
    }
    runCommands();
    if (answering != 0 && news == 0) {
      caughtUp_.store(answering);
    } else if (answering != 0) {
      catchUpAsked_ = std::max(catchUpAsked_, answering);  // the next round answers it
    }
    int64_t now = steadyNs();
    if (now >= nextSweepNs) {
      nextSweepNs = now + kSweepEveryNs;
      sweep(now);
    }
    flush();
    if (news > 0 && news < kFewReady && catchUpAsked_ == 0) linger(kLingerMs);
  }
}

void Connections::Reader::linger(int ms) {
  pollfd wakeOnly{wakeFd_, POLLIN, 0};
  while (::poll(&wakeOnly, 1, ms) < 0 && errno == EINTR) {
  }
}

void Connections::Reader::runCommands() {
  if (!hasCommands_.load()) return;
  drainEventFd(wakeFd_);  // level-triggered: epoll would report it again
  hasCommands_.store(false);
  {
    std::lock_guard lock(commandsMutex_);
    running_.swap(commands_);
  }
  for (Command& command : running_) runCommand(command);
  running_.clear();
}

void Connections::Reader::runCommand(Command& command) {
  switch (command.kind) {
    case Command::Kind::kAdopt:
      adopt(command.fd, command.nowNs);
      return;
    case Command::Kind::kSweep:
      sweep(command.nowNs);
      sweepsDone_.store(command.ask);
      return;
    case Command::Kind::kCatchUp:
      catchUpAsked_ = command.ask;
      return;
    case Command::Kind::kSend:
    case Command::Kind::kReject:
      break;
  }
  auto found = endpoints_.find(command.endpoint);
  if (found == endpoints_.end()) return;  // it ended meanwhile
  Where where = found->second;
  Connection& connection = connections_[where.slot];
  if (command.kind == Command::Kind::kSend) {
    queueOut(connection, where.channel, command.bytes);
  } else if (where.channel == 0) {
    drop(connection, true);
  } else {
    closeChannel(connection, where.channel, true);
  }
}

void Connections::Reader::accept() {
  for (;;) {
    int fd = ::accept4(owner_.listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    // Connections, not agents, are what this bounds: a relay link carries a host's agents
    // (their number is bounded by the sink, and per link by kMaxChannelsPerLink).
    if (owner_.open_.load() >= owner_.maxAgents_) {
      close(fd);
      owner_.counters_.rejected++;
      continue;
    }
    owner_.open_++;
    Reader& target = *owner_.readers_[nextTarget_++ % owner_.readers_.size()];
    if (&target == this) {
      adopt(fd, steadyNs());
      continue;
    }
    Command command;
    command.kind = Command::Kind::kAdopt;
    command.fd = fd;
    command.nowNs = steadyNs();
    target.post(std::move(command));
  }
}

void Connections::Reader::adopt(int fd, int64_t acceptedNs) {
  size_t slot = connections_.size();
  if (!freeSlots_.empty()) {
    slot = freeSlots_.back();
    freeSlots_.pop_back();
  } else {
    connections_.emplace_back();
  }
  Connection& connection = connections_[slot];
  connection = Connection{};
  connection.fd = fd;
  connection.acceptedNs = acceptedNs;
  connection.endpoint = newEndpoint(connection, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = slot;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &event);
}

uint32_t Connections::Reader::newEndpoint(Connection& connection, uint32_t channel) {
  if (++nextEndpoint_ == 0) ++nextEndpoint_;  // 0 names none
  endpoints_[nextEndpoint_] = Where{static_cast<uint32_t>(slotOf(connection)), channel};
  return nextEndpoint_;
}

QueuedFrame* Connections::Reader::claim() {
  for (;;) {
    if (QueuedFrame* slot = queue_.claim()) {
      if (slot->frame.records.capacity() > kSlotRecordsKept) {
        std::vector<trace::CallRecord>().swap(slot->frame.records);
      }
      return slot;
    }
    if (stopping_.load(std::memory_order_relaxed)) return &discard_;
    flush();  // the sink may be asleep with all of it queued
    waitingForRoom_.exchange(true, std::memory_order_acq_rel);
    if (QueuedFrame* slot = queue_.claim()) {
      waitingForRoom_.store(false, std::memory_order_relaxed);
      return slot;
    }
    // Bounded, so that a stop (which writes wakeFd_ alone) is seen within 10 ms.
    pollfd room{roomFd_, POLLIN, 0};
    if (::poll(&room, 1, 10) > 0) drainEventFd(roomFd_);
  }
}

void Connections::Reader::roomMade() {
  if (waitingForRoom_.exchange(false, std::memory_order_acq_rel)) signalEventFd(roomFd_);
}

void Connections::Reader::publish(QueuedFrame* slot) {
  if (slot == &discard_) return;
  queue_.publish();
  queuedSinceFlush_ = true;
}

void Connections::Reader::publishClosed(uint32_t endpoint) {
  QueuedFrame* slot = claim();
  slot->kind = QueuedFrame::Kind::kClosed;
  slot->endpoint = sinkEndpoint(endpoint, index_);
  publish(slot);
}

void Connections::Reader::flush() {
  if (!queuedSinceFlush_) return;
  queuedSinceFlush_ = false;
  owner_.notify();
}

void Connections::Reader::drop(Connection& connection, bool rejected) {
  if (rejected) owner_.counters_.rejected++;
  // The sink learns that each endpoint it heard from ended, after its last frames. A relay link
  // that ends (the relay died, or its host) ends each of its agents; they reconnect straight to
  // the collector (docs/protocol.md, "Relays").
  if (connection.endpoint != 0) {
    if (connection.helloSeen) publishClosed(connection.endpoint);
    endpoints_.erase(connection.endpoint);
  }
  for (Channel& agent : connection.channels) {
    if (agent.helloSeen) publishClosed(agent.endpoint);
    if (agent.endpoint != 0) endpoints_.erase(agent.endpoint);
  }
  if (connection.relay) owner_.relayLinks_--;
  close(connection.fd);  // also leaves the epoll set
  size_t slot = slotOf(connection);
  connection = Connection{};
  freeSlots_.push_back(slot);
  owner_.open_--;  // after the last publish: anyOpen() sees it or the queued end
}

void Connections::Reader::read(Connection& connection) {
  std::byte buffer[65536];
  bool ended = false;
  for (;;) {
    // A whole frame fits in what is buffered by now: decode before reading on (a relay link
    // may have much more waiting; level-triggered epoll comes back for it).
    if (connection.incoming.size() >= wire::kMaxPayload + sizeof(wire::FrameHeader)) break;
    ssize_t got = recv(connection.fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) {
      ended = true;  // the frames received before the end still count (the last is BYE)
      break;
    }
    owner_.counters_.reads.fetch_add(1, std::memory_order_relaxed);
    connection.incoming.insert(connection.incoming.end(), buffer, buffer + got);
    if (connection.incoming.size() > kMaxIncoming) {
      drop(connection, true);
      return;
    }
    if (static_cast<size_t>(got) < sizeof buffer) break;  // drained: spare the EAGAIN call
  }
  // An agent's frame is one small segment every poll interval, with nothing to answer: left in
  // quick-ack mode, the kernel acknowledges each one inside this receive (on loopback the
  // agent's side of the ACK runs here too). Delayed, the ACK goes with the delayed-ACK timer
  // (agents set TCP_NODELAY, so nothing waits for it). The kernel leaves the mode when the
  // timer fires, so it is asked again after each read.
  int quickAck = 0;
  setsockopt(connection.fd, IPPROTO_TCP, TCP_QUICKACK, &quickAck, sizeof quickAck);
  size_t offset = 0;
  for (;;) {
    std::span<std::byte> rest = std::span(connection.incoming).subspan(offset);
    size_t frameBytes = 0;
    uint32_t channel = 0;
    uint16_t type = 0;
    auto split = wire::splitFrame(rest, &frameBytes, &channel, &type);
    if (split == wire::SplitStatus::kNeedMore) break;
    // The first frame says what the connection is: one agent's, or a relay's link with its
    // host's agents on channels.
    if (split == wire::SplitStatus::kFrame && channel != 0 && !connection.helloSeen &&
        !connection.relay) {
      connection.relay = true;
      endpoints_.erase(connection.endpoint);
      connection.endpoint = 0;
      owner_.relayLinks_++;
      owner_.counters_.relayLinks++;
    }
    if (connection.relay) {
      if (split != wire::SplitStatus::kFrame || channel == 0 || channel > wire::kMaxChannel ||
          !handleChannel(connection, channel, type, rest.first(frameBytes))) {
        drop(connection, true);
        return;
      }
      offset += frameBytes;
      continue;
    }
    QueuedFrame* slot = claim();
    size_t consumed = 0;
    std::string error;
    auto status = wire::decodeFrame(rest, &slot->frame, &consumed, &error, &connection.records);
    if (status == wire::DecodeStatus::kNeedMore) break;
    if (status == wire::DecodeStatus::kOtherVersion) {
      refuse(connection, slot);
      return;
    }
    // HELLO first; CLOSED and FOLDED are a relay link's alone.
    if (status == wire::DecodeStatus::kInvalid || slot->frame.type == wire::FrameType::kClosed ||
        slot->frame.type == wire::FrameType::kFolded ||
        (!connection.helloSeen && slot->frame.type != wire::FrameType::kHello)) {
      drop(connection, true);
      return;
    }
    connection.helloSeen = true;
    slot->kind = QueuedFrame::Kind::kFrame;
    slot->endpoint = sinkEndpoint(connection.endpoint, index_);
    publish(slot);
    offset += consumed;
  }
  connection.incoming.erase(connection.incoming.begin(),
                            connection.incoming.begin() + static_cast<std::ptrdiff_t>(offset));
  if (ended) drop(connection, false);
}

// One frame of a relay link, its channel stamped in the header. Each channel is an agent
// connection of its own: HELLO first, its own delta bases, rejected alone (CLOSED goes back and
// the relay drops that agent). Only a frame that breaks the framing drops the whole link.
bool Connections::Reader::handleChannel(Connection& connection, uint32_t channel, uint16_t type,
                                        std::span<std::byte> bytes) {
  Channel* found = connection.findChannel(channel);
  if (type == static_cast<uint16_t>(wire::FrameType::kClosed)) {
    // The agent's connection at the relay ended (or the relay dropped one this side closed):
    // the end of that agent's connection here.
    if (found != nullptr) closeChannel(connection, channel, false);
    return true;
  }
  if (found == nullptr) {
    bool full = connection.channels.size() >= wire::kMaxChannelsPerLink;
    uint32_t endpoint = newEndpoint(connection, channel);
    found = &connection.addChannel(channel);
    found->endpoint = endpoint;
    if (full) {
      closeChannel(connection, channel, true);
      return true;
    }
  }
  Channel& agent = *found;
  if (agent.rejected) return true;    // in flight before the relay dropped it
  wire::setChannel(bytes.data(), 0);  // the agent's frame as it sent it
  QueuedFrame* slot = claim();
  size_t consumed = 0;
  std::string error;
  auto status = wire::decodeFrame(bytes, &slot->frame, &consumed, &error, &agent.records);
  if (status == wire::DecodeStatus::kOtherVersion) {
    slot->kind = QueuedFrame::Kind::kRefused;
    publish(slot);
    std::vector<std::byte> refused;
    wire::encodeRefused(refused);
    queueOut(connection, channel, refused);
    closeChannel(connection, channel, true, false);  // counted where the line is said
    return true;
  }
  if (status != wire::DecodeStatus::kFrame || slot->frame.type == wire::FrameType::kClosed ||
      (!agent.helloSeen && slot->frame.type != wire::FrameType::kHello)) {
    closeChannel(connection, channel, true);
    return true;
  }
  agent.helloSeen = connection.helloSeen = true;
  slot->kind = QueuedFrame::Kind::kFrame;
  slot->endpoint = sinkEndpoint(agent.endpoint, index_);
  publish(slot);
  return true;
}

Connections::Reader::Channel* Connections::Reader::Connection::findChannel(uint32_t channel) {
  auto at = std::lower_bound(channelIds.begin(), channelIds.end(), channel);
  if (at == channelIds.end() || *at != channel) return nullptr;
  return &channels[static_cast<size_t>(at - channelIds.begin())];
}

Connections::Reader::Channel& Connections::Reader::Connection::addChannel(uint32_t channel) {
  auto at = std::lower_bound(channelIds.begin(), channelIds.end(), channel);
  auto index = at - channelIds.begin();
  channelIds.insert(at, channel);
  return *channels.emplace(channels.begin() + index);
}

void Connections::Reader::Connection::eraseChannel(const Channel& agent) {
  auto index = &agent - channels.data();
  channels.erase(channels.begin() + index);
  channelIds.erase(channelIds.begin() + index);
}

// The channel's agent is gone from this link: told to the sink, and, when the collector ends
// it, to the relay (which then drops the agent's connection).
void Connections::Reader::closeChannel(Connection& connection, uint32_t channel, bool rejected,
                                       bool counted) {
  Channel* found = connection.findChannel(channel);
  if (found == nullptr) return;
  if (found->helloSeen) publishClosed(found->endpoint);
  if (found->endpoint != 0) endpoints_.erase(found->endpoint);
  if (!rejected) {
    connection.eraseChannel(*found);
    return;
  }
  *found = Channel{};
  found->rejected = true;
  if (counted) owner_.counters_.rejected++;
  std::vector<std::byte> closed;
  wire::encodeClosed(channel, closed);
  queueOut(connection, 0, closed);
}

// An agent of another ncclwatch release: nothing it sends can be read. It is told so (REFUSED,
// which every version decodes; an agent that knows it goes on with local detection only) and
// dropped; the sink's side says it once per version (`slot` holds the version) and counts the
// rejection after the line, so that whoever sees the count sees the line.
void Connections::Reader::refuse(Connection& connection, QueuedFrame* slot) {
  slot->kind = QueuedFrame::Kind::kRefused;
  publish(slot);
  std::vector<std::byte> frame;
  wire::encodeRefused(frame);
  ssize_t ignored = ::send(connection.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
  drop(connection, false);  // counted where the line is said
}

void Connections::Reader::sweep(int64_t nowNs) {
  // A connection that never proves it belongs to the job is dropped. One whose HELLO waits
  // unread in its socket is not silent: the reader was held back by a full queue (the sink
  // busy with an analysis pass at tens of thousands of ranks while thousands of links connect
  // at once), and dropping it would cost a host's ranks for the collector's own delay.
  for (Connection& connection : connections_) {
    if (connection.fd >= 0 && !connection.helloSeen &&
        nowNs - connection.acceptedNs > kHelloTimeoutNs && !bytesWaiting(connection.fd)) {
      drop(connection, true);
    }
  }
}

void Connections::Reader::watchWrites(Connection& connection, bool on) {
  if (connection.wantsWrite == on) return;
  connection.wantsWrite = on;
  epoll_event event{};
  event.events = EPOLLIN | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  event.data.u64 = slotOf(connection);
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, connection.fd, &event);
}

void Connections::Reader::write(Connection& connection) {
  while (!connection.outgoing.empty()) {
    ssize_t sent = ::send(connection.fd, connection.outgoing.data(), connection.outgoing.size(),
                          MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) break;  // a slow agent keeps its backlog (bounded when queued)
    connection.outgoing.erase(connection.outgoing.begin(), connection.outgoing.begin() + sent);
  }
  watchWrites(connection, !connection.outgoing.empty());
}

void Connections::Reader::queueOut(Connection& connection, uint32_t channel,
                                   std::span<const std::byte> frames) {
  if (connection.fd < 0) return;
  if (connection.outgoing.size() + frames.size() > kMaxOutgoing) return;  // a stuck agent
  if (channel == 0) {
    connection.outgoing.insert(connection.outgoing.end(), frames.begin(), frames.end());
  } else {
    wire::appendWithChannel(frames, channel, connection.outgoing);
  }
  write(connection);
}

// The sink's side.

Connections::Connections(Counters& counters, FrameSink& sink, std::ostream& log)
    : counters_(counters), sink_(sink), log_(log) {}

Connections::~Connections() {
  closeAll();
}

bool Connections::listen(const std::string& address, int listenWaitMs, size_t maxAgents,
                         int readers, std::string* error) {
  maxAgents_ = maxAgents;
  listenFd_ = listenOn(address, error);
  for (int waited = 0; listenFd_ < 0 && errno == EADDRINUSE && waited < listenWaitMs;
       waited += 100) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    listenFd_ = listenOn(address, error);
  }
  if (listenFd_ < 0) return false;
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(listenFd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  readyFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (readyFd_ < 0 || pipe2(stopPipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  raiseDescriptorLimit(maxAgents + 64);
  int count = std::clamp(readers, 1, 64);
  for (int i = 0; i < count; ++i) {
    readers_.push_back(std::make_unique<Reader>(*this, static_cast<uint8_t>(i)));
    if (!readers_.back()->open(error)) return false;
  }
  readers_.front()->watchListening(listenFd_);
  for (auto& reader : readers_) reader->start();
  return true;
}

int Connections::poll(int timeoutMs) {
  int handed = handOver(kHandOverPerPoll);
  if (handed > 0 || timeoutMs <= 0) return handed;
  // Asleep only after a last look at the queues, and the readers swap sleeping_ after they
  // publish: the two exchanges are ordered, so either the reader's sees this one (and wakes this
  // side) or this side's comes after the reader's, whose publish it then sees.
  sleeping_.exchange(true, std::memory_order_acq_rel);
  handed = handOver(kHandOverPerPoll);
  if (handed == 0) {
    pollfd fds[2] = {{readyFd_, POLLIN, 0}, {stopPipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, timeoutMs) > 0 && (fds[0].revents & POLLIN)) drainEventFd(readyFd_);
  }
  sleeping_.store(false, std::memory_order_relaxed);
  return handed > 0 ? handed : handOver(kHandOverPerPoll);
}

void Connections::notify() {
  if (sleeping_.exchange(false, std::memory_order_acq_rel)) signalEventFd(readyFd_);
}

int Connections::handOver(size_t limit) {
  size_t handed = 0;
  for (bool more = true; more && handed < limit;) {
    more = false;
    // A batch from each reader in turn: no reader's connections wait behind another's.
    for (auto& reader : readers_) {
      FrameQueue& queue = reader->queue();
      int taken = 0;
      for (; taken < 64; ++taken) {
        QueuedFrame* queued = queue.front();
        if (queued == nullptr) break;
        handOver(*queued);
        queue.pop();
      }
      if (taken > 0) reader->roomMade();
      handed += static_cast<size_t>(taken);
      more |= taken > 0;
    }
  }
  return static_cast<int>(handed);
}

void Connections::handOver(QueuedFrame& queued) {
  uint64_t endpoint = queued.endpoint;
  switch (queued.kind) {
    case QueuedFrame::Kind::kRefused:
      sayVersion(queued.frame.version);
      counters_.rejected++;
      return;
    case QueuedFrame::Kind::kClosed: {
      rejected_.erase(endpoint);
      auto found = processOf_.find(endpoint);
      if (found == processOf_.end()) return;
      int process = found->second;
      processOf_.erase(found);
      sink_.closed(process);
      return;
    }
    case QueuedFrame::Kind::kFrame:
      break;
  }
  auto found = processOf_.find(endpoint);
  if (found != processOf_.end()) {
    if (sink_.frame(found->second, queued.frame)) {
      counters_.frames++;
      return;
    }
    int process = found->second;
    processOf_.erase(found);
    sink_.closed(process);
    reject(endpoint);
    return;
  }
  if (rejected_.count(endpoint) != 0) return;  // in flight before its reader dropped it
  // An endpoint's first frame: its reader hands over no other first frame than a HELLO.
  int process = queued.frame.type == wire::FrameType::kHello
                    ? sink_.hello(static_cast<size_t>(endpoint), queued.frame.hello)
                    : -1;
  if (process < 0) {
    reject(endpoint);
    return;
  }
  processOf_.emplace(endpoint, process);
  counters_.frames++;
}

void Connections::reject(uint64_t endpoint) {
  rejected_.insert(endpoint);
  Reader::Command command;
  command.kind = Reader::Command::Kind::kReject;
  command.endpoint = numberOf(endpoint);
  readers_[readerOf(endpoint)]->post(std::move(command));
}

void Connections::send(size_t connection, std::span<const std::byte> frame) {
  uint64_t endpoint = connection;
  if (processOf_.count(endpoint) == 0 || readerOf(endpoint) >= readers_.size()) return;
  Reader::Command command;
  command.kind = Reader::Command::Kind::kSend;
  command.endpoint = numberOf(endpoint);
  command.bytes.assign(frame.begin(), frame.end());
  readers_[readerOf(endpoint)]->post(std::move(command));
}

void Connections::sayVersion(uint16_t version) {
  if (!versionsSaid_.insert(version).second) return;
  log_ << "[ncclwatch] collector: refused an agent that speaks protocol version " << version
       << " (this collector speaks version " << wire::kVersion
       << "): agents and collector must come from the same ncclwatch release; its rank keeps "
          "local detection only\n"
       << std::flush;
}

void Connections::wake() {
  char byte = 1;
  ssize_t ignored = ::write(stopPipe_[1], &byte, 1);
  (void)ignored;
}

void Connections::linger(int ms) {
  // The stop pipe is never drained (stop() is its only writer): once woken, this returns at once.
  pollfd wakeOnly{stopPipe_[0], POLLIN, 0};
  while (::poll(&wakeOnly, 1, ms) < 0 && errno == EINTR) {
  }
}

void Connections::dropSilent(int64_t nowNs) {
  for (auto& reader : readers_) reader->sweepNow(nowNs);
}

bool Connections::anyOpen() const {
  if (open_.load() > 0) return true;
  for (const auto& reader : readers_) {
    if (!reader->idle()) return true;
  }
  return false;
}

uint64_t Connections::askToCatchUp() {
  ++catchUpAsks_;
  for (auto& reader : readers_) {
    Reader::Command command;
    command.kind = Reader::Command::Kind::kCatchUp;
    command.ask = catchUpAsks_;
    reader->post(std::move(command));
  }
  return catchUpAsks_;
}

bool Connections::caughtUp(uint64_t asked) const {
  for (const auto& reader : readers_) {
    if (reader->caughtUp() < asked) return false;
  }
  return true;
}

void Connections::closeAll() {
  for (auto& reader : readers_) reader->stop();
  readers_.clear();
  processOf_.clear();
  rejected_.clear();
  open_.store(0);
  relayLinks_.store(0);
  for (int* fd : {&listenFd_, &readyFd_, &stopPipe_[0], &stopPipe_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

}  // namespace ncclwatch::collect
