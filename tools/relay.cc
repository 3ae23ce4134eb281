#include "relay.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "trace/abstract_socket.h"
#include "trace/wire.h"

namespace ncclwatch::relay {
namespace wire = trace::wire;
namespace {

constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kUpstreamTag = ~0ull - 1;
// Bytes waiting for the collector: above the high mark the agents are not read (their frames
// wait in their own buffers), below the low mark they are again.
constexpr size_t kHighMark = 16u << 20;
constexpr size_t kLowMark = 4u << 20;
constexpr size_t kMaxIncoming = 2 * wire::kMaxPayload + sizeof(wire::FrameHeader);
constexpr size_t kMaxToAgent = 1u << 20;  // the collector's requests an agent has not read
constexpr int64_t kRetryNs = 200'000'000;
constexpr int64_t kFoldTickNs = 50'000'000;  // held calls past their time, due notes

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct AgentConnection {
  int fd = -1;
  std::vector<std::byte> incoming;
  std::vector<std::byte> outgoing;
  bool wantsWrite = false;
};

class Relay {
 public:
  Relay(const Options& options, std::ostream& log) : options_(options), log_(log) {}
  ~Relay();
  int run();

 private:
  void accept();
  void readAgent(uint32_t channel);
  void writeAgent(uint32_t channel);
  void closeAgent(uint32_t channel, bool tellCollector);
  void interest(int fd, uint64_t tag, bool in, bool out, bool add = false);
  void pauseAgents(bool paused);
  bool connectUpstream(int64_t now);
  bool finishConnect();
  bool flushUpstream();
  // How long the next epoll_wait may sleep: until the gathered bytes are due, at most 100 ms.
  int waitMs(int64_t now) const {
    if (gatheringSinceNs_ < 0 || !connected_) return 100;
    int64_t left = gatheringSinceNs_ + kGatherNs - now;
    return left <= 0 ? 0 : static_cast<int>((left + 999'999) / 1'000'000);
  }
  bool readUpstream();
  // Says why the collector link ended and gives the relay's exit code for it (3).
  int lostCollector() {
    log_ << "[ncclwatch] relay: lost the collector at " << where() << " (" << lastError_
         << "); this host's agents connect to it directly\n"
         << std::flush;
    return 3;
  }
  std::string where() const {
    return options_.collectorHost + ":" + std::to_string(options_.collectorPort);
  }

  Options options_;
  std::ostream& log_;
  Folder folder_{options_.folding};
  int epoll_ = -1;
  int listen_ = -1;
  std::vector<AgentConnection> agents_ = std::vector<AgentConnection>(wire::kMaxChannel + 1);
  size_t agentsNow_ = 0;
  bool agentsCame_ = false;
  uint32_t nextChannel_ = 1;
  bool paused_ = false;
  // The link to the collector.
  int upstream_ = -1;
  bool connecting_ = false;
  bool connected_ = false;
  bool upstreamWantsWrite_ = false;
  int64_t neededSinceNs_ = -1;  // the first agent frame waits for the collector since then
  // Since when bytes wait to be gathered into one write (-1: none wait, or a write began and
  // what the socket did not take goes as soon as it can).
  int64_t gatheringSinceNs_ = -1;
  int64_t nextAttemptNs_ = 0;
  std::string lastError_;
  std::vector<std::byte> toCollector_;
  size_t toCollectorSent_ = 0;
  std::vector<std::byte> fromCollector_;
};

Relay::~Relay() {
  for (AgentConnection& agent : agents_) {
    if (agent.fd >= 0) close(agent.fd);
  }
  for (int fd : {upstream_, listen_, epoll_}) {
    if (fd >= 0) close(fd);
  }
}

void Relay::interest(int fd, uint64_t tag, bool in, bool out, bool add) {
  epoll_event event{};
  event.events = (in ? static_cast<uint32_t>(EPOLLIN) : 0u) | (out ? EPOLLOUT : 0u);
  event.data.u64 = tag;
  epoll_ctl(epoll_, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event);
}

void Relay::pauseAgents(bool paused) {
  if (paused == paused_) return;
  paused_ = paused;
  for (uint32_t channel = 1; channel <= wire::kMaxChannel; ++channel) {
    AgentConnection& agent = agents_[channel];
    if (agent.fd >= 0) interest(agent.fd, channel, !paused, agent.wantsWrite);
  }
}

void Relay::accept() {
  for (;;) {
    int fd = accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (agentsNow_ >= wire::kMaxChannelsPerLink) {
      close(fd);  // it goes to the collector directly
      continue;
    }
    // Channels are handed out round robin: a number comes back only long after its agent left,
    // so that a late answer for the old agent cannot reach a new one.
    while (agents_[nextChannel_].fd >= 0) {
      nextChannel_ = nextChannel_ % wire::kMaxChannel + 1;
    }
    uint32_t channel = nextChannel_;
    nextChannel_ = nextChannel_ % wire::kMaxChannel + 1;
    agents_[channel] = AgentConnection{};
    agents_[channel].fd = fd;
    ++agentsNow_;
    agentsCame_ = true;
    interest(fd, channel, !paused_, false, true);
  }
}

void Relay::closeAgent(uint32_t channel, bool tellCollector) {
  AgentConnection& agent = agents_[channel];
  if (agent.fd < 0) return;
  close(agent.fd);
  agent = AgentConnection{};
  --agentsNow_;
  // What the folder holds of its communicators goes first: the channel's end follows its calls.
  if (options_.fold) folder_.agentEnded(channel, toCollector_);
  if (tellCollector) wire::encodeClosed(channel, toCollector_);
}

// The agent's frames go on whole, stamped with its channel, or through the folder; a byte stream
// that is not frames (or, folding, frames that do not decode) ends the agent's connection (it
// reconnects, directly).
void Relay::readAgent(uint32_t channel) {
  AgentConnection& agent = agents_[channel];
  std::byte buffer[65536];
  bool ended = false;
  while (agent.incoming.size() < wire::kMaxPayload + sizeof(wire::FrameHeader)) {
    ssize_t got = recv(agent.fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) {
      ended = true;
      break;
    }
    agent.incoming.insert(agent.incoming.end(), buffer, buffer + got);
    if (static_cast<size_t>(got) < sizeof buffer) break;
  }
  size_t offset = 0;
  for (;;) {
    size_t bytes = 0;
    uint32_t stamped = 0;
    uint16_t type = 0;
    auto status =
        wire::splitFrame(std::span(agent.incoming).subspan(offset), &bytes, &stamped, &type);
    if (status == wire::SplitStatus::kNeedMore) break;
    if (status == wire::SplitStatus::kInvalid || stamped != 0 ||
        type == static_cast<uint16_t>(wire::FrameType::kClosed)) {
      // What came before it was passed on; the collector drops its half of the channel.
      closeAgent(channel, true);
      return;
    }
    std::span<const std::byte> frame = std::span(agent.incoming).subspan(offset, bytes);
    if (!options_.fold) {
      wire::appendWithChannel(frame, channel, toCollector_);
    } else if (!folder_.agentFrame(channel, frame, nowNs(), toCollector_)) {
      closeAgent(channel, true);
      return;
    }
    offset += bytes;
  }
  agent.incoming.erase(agent.incoming.begin(),
                       agent.incoming.begin() + static_cast<std::ptrdiff_t>(offset));
  if (ended) closeAgent(channel, true);
}

void Relay::writeAgent(uint32_t channel) {
  AgentConnection& agent = agents_[channel];
  while (!agent.outgoing.empty()) {
    ssize_t sent =
        send(agent.fd, agent.outgoing.data(), agent.outgoing.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) break;
    agent.outgoing.erase(agent.outgoing.begin(), agent.outgoing.begin() + sent);
  }
  bool wants = !agent.outgoing.empty();
  if (wants != agent.wantsWrite) {
    agent.wantsWrite = wants;
    interest(agent.fd, channel, !paused_, wants);
  }
}

bool Relay::connectUpstream(int64_t now) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  hints.ai_family = AF_INET;  // as the agents: IPv4 first, then anything
  addrinfo* found = nullptr;
  std::string port = std::to_string(options_.collectorPort);
  int lookup = getaddrinfo(options_.collectorHost.c_str(), port.c_str(), &hints, &found);
  if (lookup != 0) {
    hints.ai_family = AF_UNSPEC;
    lookup = getaddrinfo(options_.collectorHost.c_str(), port.c_str(), &hints, &found);
  }
  nextAttemptNs_ = now + kRetryNs;
  if (lookup != 0 || found == nullptr) {
    lastError_ = std::string("cannot resolve the host: ") + gai_strerror(lookup);
    return false;
  }
  upstream_ = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (upstream_ >= 0) {
    int one = 1;
    setsockopt(upstream_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int result = connect(upstream_, found->ai_addr, found->ai_addrlen);
    if (result != 0 && errno != EINPROGRESS) {
      lastError_ = std::strerror(errno);
      close(upstream_);
      upstream_ = -1;
    } else {
      connecting_ = result != 0;
      connected_ = result == 0;
      interest(upstream_, kUpstreamTag, true, true, true);
      upstreamWantsWrite_ = true;
    }
  }
  freeaddrinfo(found);
  return upstream_ >= 0;
}

bool Relay::finishConnect() {
  int error = 0;
  socklen_t length = sizeof error;
  getsockopt(upstream_, SOL_SOCKET, SO_ERROR, &error, &length);
  connecting_ = false;
  if (error != 0) {
    lastError_ = std::strerror(error);
    close(upstream_);
    upstream_ = -1;
    upstreamWantsWrite_ = false;
    return false;
  }
  connected_ = true;
  return true;
}

bool Relay::flushUpstream() {
  while (toCollectorSent_ < toCollector_.size()) {
    ssize_t sent = send(upstream_, toCollector_.data() + toCollectorSent_,
                        toCollector_.size() - toCollectorSent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (sent <= 0) {
      lastError_ = std::strerror(errno);
      return false;
    }
    toCollectorSent_ += static_cast<size_t>(sent);
  }
  if (toCollectorSent_ == toCollector_.size()) {
    toCollector_.clear();
    toCollectorSent_ = 0;
  } else if (toCollectorSent_ > kLowMark) {
    toCollector_.erase(toCollector_.begin(),
                       toCollector_.begin() + static_cast<std::ptrdiff_t>(toCollectorSent_));
    toCollectorSent_ = 0;
  }
  bool wants = toCollector_.size() > toCollectorSent_;
  if (wants != upstreamWantsWrite_) {
    upstreamWantsWrite_ = wants;
    interest(upstream_, kUpstreamTag, true, wants);
  }
  return true;
}

// The collector's answers, each to the agent its channel names (a CLOSED one ends it).
bool Relay::readUpstream() {
  std::byte buffer[65536];
  bool ended = false;
  for (;;) {
    ssize_t got = recv(upstream_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) {
      ended = true;
      lastError_ = got == 0 ? "it closed the connection" : std::strerror(errno);
      break;
    }
    fromCollector_.insert(fromCollector_.end(), buffer, buffer + got);
    if (fromCollector_.size() > kMaxIncoming) {
      lastError_ = "it sent more than a frame's bound";
      return false;
    }
  }
  size_t offset = 0;
  for (;;) {
    size_t bytes = 0;
    uint32_t channel = 0;
    uint16_t type = 0;
    auto status =
        wire::splitFrame(std::span(fromCollector_).subspan(offset), &bytes, &channel, &type);
    if (status == wire::SplitStatus::kNeedMore) break;
    if (status == wire::SplitStatus::kInvalid) {
      lastError_ = "it sent bytes that are not frames";
      return false;
    }
    std::span<std::byte> frame = std::span(fromCollector_).subspan(offset, bytes);
    offset += bytes;
    if (channel == 0 || channel > wire::kMaxChannel || agents_[channel].fd < 0) continue;
    if (type == static_cast<uint16_t>(wire::FrameType::kClosed)) {
      closeAgent(channel, true);  // the collector rejected it: dropped, and CLOSED as answer
      continue;
    }
    AgentConnection& agent = agents_[channel];
    if (agent.outgoing.size() + bytes > kMaxToAgent) continue;  // an agent that does not read
    size_t start = agent.outgoing.size();
    agent.outgoing.insert(agent.outgoing.end(), frame.begin(), frame.end());
    wire::setChannel(agent.outgoing.data() + start, 0);
    writeAgent(channel);
  }
  fromCollector_.erase(fromCollector_.begin(),
                       fromCollector_.begin() + static_cast<std::ptrdiff_t>(offset));
  return !ended;
}

int Relay::run() {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (options_.listenFd >= 0) {
    listen_ = options_.listenFd;
  } else {
    listen_ = trace::listenOnAbstractName(options_.listenName);
    if (listen_ < 0) {
      log_ << "[ncclwatch] relay: cannot listen on @" << options_.listenName << ": "
           << std::strerror(errno) << "\n"
           << std::flush;
      return 2;
    }
  }
  int flags = fcntl(listen_, F_GETFL);
  fcntl(listen_, F_SETFL, flags | O_NONBLOCK);
  fcntl(listen_, F_SETFD, FD_CLOEXEC);
  interest(listen_, kListenTag, true, false, true);
  int64_t start = nowNs();
  int64_t idleSince = -1;
  int64_t nextFoldTickNs = 0;
  for (;;) {
    epoll_event events[256];
    int ready = epoll_wait(epoll_, events, 256, waitMs(nowNs()));
    for (int i = 0; i < ready; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        accept();
      } else if (tag == kUpstreamTag) {
        if (upstream_ < 0) continue;
        if (connecting_ && (events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
          if (!finishConnect()) continue;
        }
        if (connected_ && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !readUpstream()) {
          return lostCollector();
        }
      } else if (tag <= wire::kMaxChannel && agents_[tag].fd >= 0) {
        auto channel = static_cast<uint32_t>(tag);
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readAgent(channel);
        if (agents_[channel].fd >= 0 && (events[i].events & EPOLLOUT)) writeAgent(channel);
      }
    }
    int64_t now = nowNs();
    if (options_.fold && now >= nextFoldTickNs) {
      folder_.tick(now, toCollector_);
      nextFoldTickNs = now + kFoldTickNs;
    }
    bool waiting = toCollector_.size() > toCollectorSent_;
    if (waiting && neededSinceNs_ < 0) neededSinceNs_ = now;
    if (waiting && gatheringSinceNs_ < 0 && toCollectorSent_ == 0) gatheringSinceNs_ = now;
    if (!connected_) {
      if (waiting && upstream_ < 0 && now >= nextAttemptNs_) connectUpstream(now);
      if (neededSinceNs_ >= 0 && now - neededSinceNs_ > int64_t{options_.upstreamMs} * 1'000'000) {
        log_ << "[ncclwatch] relay: the collector at " << where() << " is not reachable ("
             << (lastError_.empty() ? "no answer" : lastError_)
             << "); this host's agents connect to it directly\n"
             << std::flush;
        return 3;
      }
    } else if (gatheringSinceNs_ < 0 ||
               writeDue(toCollector_.size() - toCollectorSent_, now - gatheringSinceNs_)) {
      gatheringSinceNs_ = -1;
      if (!flushUpstream()) return lostCollector();
    }
    size_t backlog = toCollector_.size() - toCollectorSent_;
    if (backlog > kHighMark) pauseAgents(true);
    if (backlog < kLowMark) pauseAgents(false);
    // Idle: every agent left and what they sent went out.
    if (agentsCame_ && agentsNow_ == 0 && backlog == 0) {
      if (idleSince < 0) idleSince = now;
      if (now - idleSince >= int64_t{options_.idleMs} * 1'000'000) return 0;
    } else {
      idleSince = -1;
    }
    if (!agentsCame_ && now - start >= int64_t{options_.firstAgentMs} * 1'000'000) return 0;
  }
}

}  // namespace

int runRelay(const Options& options, std::ostream& log) {
  if (options.collectorHost.empty() || options.collectorPort <= 0 ||
      (options.listenFd < 0 && options.listenName.empty())) {
    log << "[ncclwatch] relay: give --collector HOST:PORT and --listen-fd or --listen-name\n";
    return 2;
  }
  Relay relay(options, log);
  return relay.run();
}

}  // namespace ncclwatch::relay
