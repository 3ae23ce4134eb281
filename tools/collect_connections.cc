#include "collect_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
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
#include <thread>

namespace ncclwatch::collect {
namespace wire = trace::wire;

namespace {

constexpr size_t kMaxIncoming = 2 * wire::kMaxPayload + sizeof(wire::FrameHeader);
constexpr size_t kMaxOutgoing = 1u << 20;
constexpr int64_t kHelloTimeoutNs = 5'000'000'000;
// epoll tags of the two descriptors that are not connections (connections use their slot).
constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kWakeTag = ~0ull - 1;

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

Connections::~Connections() {
  closeAll();
}

bool Connections::listen(const std::string& address, int listenWaitMs, size_t maxAgents,
                         std::string* error) {
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
  if (pipe2(wakePipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) {
    *error = std::string("epoll: ") + std::strerror(errno);
    return false;
  }
  epoll_event listenEvent{};
  listenEvent.events = EPOLLIN;
  listenEvent.data.u64 = kListenTag;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, listenFd_, &listenEvent);
  epoll_event wakeEvent{};
  wakeEvent.events = EPOLLIN;
  wakeEvent.data.u64 = kWakeTag;
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakePipe_[0], &wakeEvent);
  raiseDescriptorLimit(maxAgents + 64);
  return true;
}

int Connections::poll(int timeoutMs, bool writes) {
  // Enough for a lingered round (Collector::State::run) at thousands of agents in one call.
  epoll_event events[1024];
  int ready = epoll_wait(epollFd_, events, static_cast<int>(std::size(events)), timeoutMs);
  int news = 0;
  for (int i = 0; i < ready; ++i) {
    uint64_t tag = events[i].data.u64;
    if (tag == kWakeTag) continue;  // wake() wrote it; the caller's loop sees why
    ++news;
    if (tag == kListenTag) {
      accept();
      continue;
    }
    if (tag >= connections_.size()) continue;
    Connection& connection = connections_[tag];
    if (connection.fd < 0) continue;  // dropped earlier in this batch
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read(connection);
    if (writes && connection.fd >= 0 && (events[i].events & EPOLLOUT)) write(connection);
  }
  return news;
}

void Connections::wake() {
  char byte = 1;
  ssize_t ignored = ::write(wakePipe_[1], &byte, 1);
  (void)ignored;
}

void Connections::linger(int ms) {
  // The wake pipe is never drained (stop() is its only writer): once woken, this returns at once.
  pollfd wakeOnly{wakePipe_[0], POLLIN, 0};
  while (::poll(&wakeOnly, 1, ms) < 0 && errno == EINTR) {
  }
}

void Connections::dropSilent(int64_t nowNs) {
  // A connection that never proves it belongs to the job is dropped. One whose HELLO waits
  // unread in its socket is not silent: the collector was busy (an analysis pass at tens of
  // thousands of ranks takes seconds, while thousands of links connect at once), and dropping
  // it would cost a host's ranks for the collector's own delay. It is read on the next poll.
  for (Connection& connection : connections_) {
    if (connection.fd >= 0 && !connection.authenticated &&
        nowNs - connection.acceptedNs > kHelloTimeoutNs && !bytesWaiting(connection.fd)) {
      drop(connection, true);
    }
  }
}

bool Connections::anyOpen() const {
  for (const Connection& connection : connections_) {
    if (connection.fd >= 0) return true;
  }
  return false;
}

void Connections::closeAll() {
  for (Connection& connection : connections_) {
    if (connection.fd >= 0) close(connection.fd);
  }
  connections_.clear();
  freeSlots_.clear();
  for (int* fd : {&epollFd_, &listenFd_, &wakePipe_[0], &wakePipe_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void Connections::accept() {
  for (;;) {
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    // Connections, not agents, are what this bounds: a relay link carries a host's agents
    // (their number is bounded by the sink, and per link by kMaxChannelsPerLink).
    if (connections_.size() - freeSlots_.size() >= maxAgents_) {
      close(fd);
      counters_.rejected++;
      continue;
    }
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
    connection.acceptedNs = steadyNs();
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = slot;
    epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &event);
  }
}

void Connections::drop(Connection& connection, bool rejected) {
  if (rejected) counters_.rejected++;
  if (connection.process >= 0) sink_.closed(connection.process);
  // A relay link that ends (the relay died, or its host): each of its agents ended. They
  // reconnect straight to the collector (docs/protocol.md, "Relays").
  for (Channel& agent : connection.channels) {
    if (agent.authenticated) sink_.closed(agent.process);
  }
  if (connection.relay) --relayLinks_;
  close(connection.fd);  // also leaves the epoll set
  size_t slot = static_cast<size_t>(&connection - connections_.data());
  connection = Connection{};
  freeSlots_.push_back(slot);
}

bool Connections::handle(Connection& connection, wire::Frame& frame) {
  if (frame.type == wire::FrameType::kClosed) return false;  // relay links only
  return agentFrame(connection.authenticated, connection.process, slotOf(connection), frame);
}

bool Connections::agentFrame(bool& authenticated, int& process, size_t endpoint,
                             wire::Frame& frame) {
  if (authenticated) return sink_.frame(process, frame);
  if (frame.type != wire::FrameType::kHello) return false;
  int helloProcess = sink_.hello(endpoint, frame.hello);
  if (helloProcess < 0) return false;
  authenticated = true;
  process = helloProcess;
  return true;
}

void Connections::read(Connection& connection) {
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
    connection.incoming.insert(connection.incoming.end(), buffer, buffer + got);
    if (connection.incoming.size() > kMaxIncoming) {
      drop(connection, true);
      return;
    }
    if (static_cast<size_t>(got) < sizeof buffer) break;  // drained: spare the EAGAIN call
  }
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
    if (split == wire::SplitStatus::kFrame && channel != 0 && !connection.authenticated &&
        !connection.relay) {
      connection.relay = true;
      ++relayLinks_;
      counters_.relayLinks++;
    }
    if (connection.relay) {
      if (split != wire::SplitStatus::kFrame || channel == 0 || channel > wire::kMaxChannel ||
          !handleChannel(connection, channel, type, rest.first(frameBytes))) {
        drop(connection, true);
        return;
      }
      counters_.frames++;
      offset += frameBytes;
      continue;
    }
    wire::Frame& frame = frame_;
    size_t consumed = 0;
    std::string error;
    auto status = wire::decodeFrame(rest, &frame, &consumed, &error, &connection.records);
    if (status == wire::DecodeStatus::kNeedMore) break;
    if (status == wire::DecodeStatus::kOtherVersion) {
      refuse(connection, frame.version);
      return;
    }
    if (status == wire::DecodeStatus::kInvalid || !handle(connection, frame)) {
      drop(connection, true);
      return;
    }
    counters_.frames++;
    offset += consumed;
  }
  connection.incoming.erase(connection.incoming.begin(),
                            connection.incoming.begin() + static_cast<std::ptrdiff_t>(offset));
  if (ended) drop(connection, false);
}

// One frame of a relay link, its channel stamped in the header. Each channel is an agent
// connection of its own: HELLO first, its own delta bases, rejected alone (CLOSED goes back and
// the relay drops that agent). Only a frame that breaks the framing drops the whole link.
bool Connections::handleChannel(Connection& connection, uint32_t channel, uint16_t type,
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
    found = &connection.addChannel(channel);
    if (full) {
      closeChannel(connection, channel, true);
      return true;
    }
  }
  Channel& agent = *found;
  if (agent.rejected) return true;    // in flight before the relay dropped it
  wire::setChannel(bytes.data(), 0);  // the agent's frame as it sent it
  wire::Frame& frame = frame_;
  size_t consumed = 0;
  std::string error;
  auto status = wire::decodeFrame(bytes, &frame, &consumed, &error, &agent.records);
  if (status == wire::DecodeStatus::kOtherVersion) {
    sayVersion(frame.version);
    std::vector<std::byte> refused;
    wire::encodeRefused(refused);
    send(endpoint(slotOf(connection), channel), refused);
    closeChannel(connection, channel, true);
    return true;
  }
  bool ok =
      status == wire::DecodeStatus::kFrame && frame.type != wire::FrameType::kClosed &&
      agentFrame(agent.authenticated, agent.process, endpoint(slotOf(connection), channel), frame);
  connection.authenticated |= agent.authenticated;  // the link, once one of its agents is
  if (!ok) closeChannel(connection, channel, true);
  return true;
}

Connections::Channel* Connections::Connection::findChannel(uint32_t channel) {
  auto at = std::lower_bound(channelIds.begin(), channelIds.end(), channel);
  if (at == channelIds.end() || *at != channel) return nullptr;
  return &channels[static_cast<size_t>(at - channelIds.begin())];
}

Connections::Channel& Connections::Connection::addChannel(uint32_t channel) {
  auto at = std::lower_bound(channelIds.begin(), channelIds.end(), channel);
  auto index = at - channelIds.begin();
  channelIds.insert(at, channel);
  return *channels.emplace(channels.begin() + index);
}

void Connections::Connection::eraseChannel(const Channel& agent) {
  auto index = &agent - channels.data();
  channels.erase(channels.begin() + index);
  channelIds.erase(channelIds.begin() + index);
}

// The channel's agent is gone from this link: told to the sink, and, when the collector ends
// it, to the relay (which then drops the agent's connection).
void Connections::closeChannel(Connection& connection, uint32_t channel, bool rejected) {
  Channel* found = connection.findChannel(channel);
  if (found == nullptr) return;
  if (found->authenticated) sink_.closed(found->process);
  if (!rejected) {
    connection.eraseChannel(*found);
    return;
  }
  *found = Channel{};
  found->rejected = true;
  counters_.rejected++;
  std::vector<std::byte> closed;
  wire::encodeClosed(channel, closed);
  send(slotOf(connection), closed);
}

void Connections::sayVersion(uint16_t version) {
  if (!versionsSaid_.insert(version).second) return;
  log_ << "[ncclwatch] collector: refused an agent that speaks protocol version " << version
       << " (this collector speaks version " << wire::kVersion
       << "): agents and collector must come from the same ncclwatch release; its rank keeps "
          "local detection only\n"
       << std::flush;
}

// An agent of another ncclwatch release: nothing it sends can be read. It is told so (REFUSED,
// which every version decodes; an agent that knows it goes on with local detection only) and
// dropped; the collector says it once per version.
void Connections::refuse(Connection& connection, uint16_t version) {
  sayVersion(version);
  std::vector<std::byte> frame;
  wire::encodeRefused(frame);
  ssize_t ignored = ::send(connection.fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
  drop(connection, true);
}

void Connections::watchWrites(Connection& connection, bool on) {
  if (connection.wantsWrite == on) return;
  connection.wantsWrite = on;
  epoll_event event{};
  event.events = EPOLLIN | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  event.data.u64 = static_cast<uint64_t>(&connection - connections_.data());
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, connection.fd, &event);
}

void Connections::write(Connection& connection) {
  while (!connection.outgoing.empty()) {
    ssize_t sent = ::send(connection.fd, connection.outgoing.data(), connection.outgoing.size(),
                          MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) break;  // a slow agent keeps its backlog (bounded when queued)
    connection.outgoing.erase(connection.outgoing.begin(), connection.outgoing.begin() + sent);
  }
  watchWrites(connection, !connection.outgoing.empty());
}

void Connections::send(size_t target, std::span<const std::byte> frame) {
  size_t slot = target & 0xffff;
  auto channel = static_cast<uint32_t>(target >> 16);
  if (slot >= connections_.size()) return;
  Connection& connection = connections_[slot];
  if (connection.fd < 0) return;
  if (connection.outgoing.size() + frame.size() > kMaxOutgoing) return;  // a stuck agent
  if (channel == 0) {
    connection.outgoing.insert(connection.outgoing.end(), frame.begin(), frame.end());
  } else {
    wire::appendWithChannel(frame, channel, connection.outgoing);
  }
  write(connection);
}

}  // namespace ncclwatch::collect
