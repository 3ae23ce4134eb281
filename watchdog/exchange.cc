#include "watchdog/exchange.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "trace/abstract_socket.h"
#include "watchdog/relay_host.h"

namespace ncclwatch::watchdog {
namespace {

constexpr size_t kMaxOutgoing = 8u << 20;  // bytes queued for the collector at most
constexpr size_t kMaxWatched = 65536;      // records watched for state changes at most
constexpr int64_t kMaxBackoffNs = 5'000'000'000;
constexpr int64_t kHeartbeatNs = 1'000'000'000;
constexpr int64_t kUnreachableNs = 10'000'000'000;  // never reached for this long: say so
constexpr int64_t kUpNs = 1'000'000'000;  // a connection this old was taken by the collector
// The host's relay rank binds the relay's name at its first watchdog step once it knows the
// secret, about when the others do: an agent that finds no relay for this long goes direct.
constexpr int64_t kRelayWaitNs = 3'000'000'000;
constexpr int64_t kRelayRetryNs = 100'000'000;

// NUL-padded, as the wire format wants, and always terminated.
template <size_t N>
void copyText(char (&destination)[N], const char* text) {
  size_t length = strnlen(text, N - 1);
  std::memcpy(destination, text, length);
  std::memset(destination + length, 0, N - length);
}

}  // namespace

CollectorLink::CollectorLink(const CollectorAddress& address, trace::RingWriter& writer, int rank,
                             int world, int localRank)
    : address_(address), writer_(writer) {
  copyText(hello_.secret, address.secret.c_str());
  const trace::RingHeader* header = writer.header();
  hello_.pid = static_cast<int32_t>(getpid());
  hello_.rank = rank;
  hello_.world = world;
  hello_.localRank = localRank;
  if (header != nullptr) {
    copyText(hello_.host, header->host);
    copyText(hello_.jobId, header->jobId);
    hello_.anchorMonotonicNs = header->anchorMonotonicNs;
    hello_.anchorRealtimeNs = header->anchorRealtimeNs;
  }
  copyText(hello_.tracePath, writer.path().c_str());
  outgoing_.reserve(kMaxOutgoing + 2 * trace::wire::kMaxRecordBytes);
}

CollectorLink::~CollectorLink() {
  if (fd_ >= 0) ::close(fd_);
}

// The host's relay first, while one may still come (relay_host.h): true when connected to it
// (or waiting to try it again), false to go direct.
bool CollectorLink::connectRelay(int64_t nowNs) {
  if (relayName_.empty() || relayGivenUp_) return false;
  if (relayFirstTryNs_ < 0) relayFirstTryNs_ = nowNs;
  int fd = trace::connectToAbstractName(relayName_);
  if (fd >= 0) {
    // A unix socket connects at once (or not at all).
    fd_ = fd;
    onRelay_ = true;
    connecting_ = false;
    ++counters_.connects;
    ++counters_.established;
    establishedNs_ = nowNs;
    return true;
  }
  if (nowNs - relayFirstTryNs_ < kRelayWaitNs) {
    nextAttemptNs_ = nowNs + kRelayRetryNs;
    return true;
  }
  relayGivenUp_ = true;
  if (speaks()) {
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: no relay listens on this host (%s); its agents connect to "
                 "the collector at %s directly\n",
                 hello_.rank, std::strerror(errno), where().c_str());
  }
  return false;
}

void CollectorLink::connectNow(int64_t nowNs) {
  if (firstAttemptNs_ < 0) firstAttemptNs_ = nowNs;
  onRelay_ = false;
  if (connectRelay(nowNs)) {
    if (fd_ >= 0) startOver();
    return;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string port = std::to_string(address_.port);
  // The sidecar listens on IPv4 unless MASTER_ADDR is an IPv6 literal (sidecar.h), while a name
  // like localhost may resolve to ::1 first: ask for IPv4 first, then for anything.
  hints.ai_family = address_.fromMasterAddr ? AF_INET : AF_UNSPEC;
  int lookup = getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
  if (lookup != 0 && hints.ai_family != AF_UNSPEC) {
    hints.ai_family = AF_UNSPEC;
    lookup = getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
  }
  if (lookup != 0 || found == nullptr) {
    lastError_ = std::string("cannot resolve the host: ") + gai_strerror(lookup);
    disconnect(nowNs);
    return;
  }
  fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ >= 0) {
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int result = ::connect(fd_, found->ai_addr, found->ai_addrlen);
    connecting_ = result != 0 && errno == EINPROGRESS;
    if (result == 0) ++counters_.established;
    establishedNs_ = nowNs;
    if (result != 0 && !connecting_) {
      lastError_ = std::strerror(errno);
      freeaddrinfo(found);
      disconnect(nowNs);
      return;
    }
  }
  freeaddrinfo(found);
  if (fd_ < 0) {
    disconnect(nowNs);
    return;
  }
  ++counters_.connects;
  startOver();
}

// A fresh connection starts over: who we are, the table, every record the ring still holds.
void CollectorLink::startOver() {
  outgoing_.clear();
  outgoingSent_ = 0;
  queueEncoded([&](std::vector<std::byte>& frame) { trace::wire::encodeHello(hello_, frame); });
  commsSent_ = 0;
  waitsDirty_ = !waits_.empty();
  sitesSent_ = 0;
  uint64_t next = writer_.nextIndex();
  sentUpTo_ = next > writer_.capacity() ? next - writer_.capacity() : 0;
  watched_.clear();
  encoder_.reset();
}

void CollectorLink::useRelay(const std::string& name) {
  if (relayName_.empty()) relayName_ = name;
}

std::string CollectorLink::where() const {
  return address_.host + ":" + std::to_string(address_.port);
}

// Once per process, from the first rank of each host: a collector never reached.
void CollectorLink::sayUnreachable(const char* when) {
  if (saidUnreachable_ || reached_ || firstAttemptNs_ < 0) return;
  saidUnreachable_ = true;
  if (!speaks()) return;
  // Rank 0's sidecar that starts after the job ended reads its trace files instead
  // (Triage::adoptOrphanedJob): its verdicts still come, in verdicts.jsonl.
  bool sidecarReadsFiles = address_.fromMasterAddr && address_.secretFromUniqueId;
  std::fprintf(stderr, "[ncclwatch] rank %d: the collector at %s is not reachable %s (%s); %s\n",
               hello_.rank, where().c_str(), when,
               lastError_.empty() ? "no answer" : lastError_.c_str(),
               sidecarReadsFiles ? "local detection and trace files go on, and a sidecar "
                                   "collector that starts late reads the job's trace files"
                                 : "no live verdicts, local detection and trace files go on");
}

// An established connection ended: said once per loss, then reconnected with backoff (the
// new connection resends the ring's window).
void CollectorLink::lose(int64_t nowNs, const char* why) {
  if (onRelay_) {
    // The relay died or lost the collector (or the collector ended this agent's channel): from
    // now on this agent talks to the collector itself. Every agent of the host says so.
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: the relay of this host ended (%s); connecting to the "
                 "collector at %s directly\n",
                 hello_.rank, why, where().c_str());
    relayGivenUp_ = true;
    onRelay_ = false;
    disconnect(nowNs);
    nextAttemptNs_ = nowNs;
    backoffNs_ = 100'000'000;
    return;
  }
  if (nowNs - establishedNs_ < kUpNs) {
    // Closed at once: the collector there did not take us (another job's on that port, or a
    // wrong secret). Only the unreachable line says it, if it lasts.
    lastError_ =
        "it closes every connection at once: another job's collector on that port, a wrong "
        "secret, or a collector of an older ncclwatch";
    disconnect(nowNs);
    return;
  }
  if (speaks()) {
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: lost the collector at %s (%s); local detection goes on, "
                 "reconnecting\n",
                 hello_.rank, where().c_str(), why);
  }
  lostOnce_ = true;
  disconnect(nowNs);
}

void CollectorLink::disconnect(int64_t nowNs) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connecting_ = false;
  incoming_.clear();
  outgoing_.clear();
  outgoingSent_ = 0;
  nextAttemptNs_ = nowNs + backoffNs_;
  backoffNs_ = std::min(backoffNs_ * 2, kMaxBackoffNs);
}

// The collector speaks another protocol version: nothing this agent sends would be understood.
// Said once per host, as the other faults; the rank keeps its local detection and trace file.
void CollectorLink::refuse(uint16_t version) {
  if (speaks()) {
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: the collector at %s speaks protocol version %u, this agent "
                 "version %u (different ncclwatch releases); no live verdicts, local detection "
                 "and trace files go on\n",
                 hello_.rank, where().c_str(), static_cast<unsigned>(version),
                 static_cast<unsigned>(trace::wire::kVersion));
  }
  refused_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  outgoing_.clear();
  outgoingSent_ = 0;
}

// Forgets the bytes already sent, so that the queue's bound is its size and its reserved
// capacity suffices.
void CollectorLink::compact() {
  if (outgoingSent_ == 0) return;
  outgoing_.erase(outgoing_.begin(),
                  outgoing_.begin() + static_cast<std::ptrdiff_t>(outgoingSent_));
  outgoingSent_ = 0;
}

void CollectorLink::queue(const std::vector<std::byte>& frame) {
  compact();
  if (outgoing_.size() + frame.size() > kMaxOutgoing) {
    counters_.bytesDropped += frame.size();
    return;
  }
  outgoing_.insert(outgoing_.end(), frame.begin(), frame.end());
  ++counters_.framesSent;
}

void CollectorLink::publishWaits(const std::vector<trace::WaitNote>& waits) {
  waits_ = waits;
  waitsDirty_ = true;
}

void CollectorLink::publishSites(const std::string& text) {
  sites_ += text;
}

// After the records they refer to, the wait notes when they changed (or the link is new), and
// the Python sites not sent on this connection yet.
void CollectorLink::queueWaits(int64_t nowNs) {
  while (sitesSent_ < sites_.size()) {
    // Whole lines, within one frame's bound.
    size_t end = std::min(sites_.size(), sitesSent_ + trace::wire::kMaxPayload);
    if (end < sites_.size()) end = sites_.rfind('\n', end - 1) + 1;
    if (end <= sitesSent_) break;  // a line longer than a frame: never (lines are short)
    queueEncoded([&](std::vector<std::byte>& frame) {
      trace::wire::encodeSites(sites_.substr(sitesSent_, end - sitesSent_), frame);
    });
    sitesSent_ = end;
  }
  if (!waitsDirty_) return;
  queueEncoded(
      [&](std::vector<std::byte>& frame) { trace::wire::encodeWaits(nowNs, waits_, frame); });
  waitsDirty_ = false;
}

void CollectorLink::collectRecords(int64_t nowNs) {
  compact();
  // A collector that stopped reading (SIGSTOP, a stalled host): take nothing new while half the
  // queue waits. The records stay in the ring; those it overwrites meanwhile are counted.
  if (outgoing_.size() > kMaxOutgoing / 2) {
    ++counters_.fullSteps;
    if (!saidStalled_ && speaks()) {
      std::fprintf(stderr,
                   "[ncclwatch] rank %d: the collector at %s stopped reading; the job goes on, "
                   "records wait in the ring (those it overwrites are counted)\n",
                   hello_.rank, where().c_str());
    }
    saidStalled_ = true;
    return;
  }
  // The table is copied only when it grew: the watchdog must not allocate every poll (a fork
  // child of a process whose allocator has no fork handlers would inherit a held lock).
  if (writer_.commCount() != commsSent_) {
    std::vector<trace::CommInfo> comms = writer_.comms();
    queueEncoded([&](std::vector<std::byte>& frame) { trace::wire::encodeComms(comms, frame); });
    commsSent_ = comms.size();
  }
  // RECORDS frames are encoded in place at the end of the queue, as many as fit in it: what
  // does not fit waits in the ring for the next step.
  constexpr size_t kNoFrame = SIZE_MAX;
  size_t frame = kNoFrame;
  uint32_t inFrame = 0;
  auto closeFrame = [&] {
    trace::wire::endRecords(frame, outgoing_);
    ++counters_.framesSent;
    frame = kNoFrame;
  };
  auto openFrame = [&] {
    if (outgoing_.size() + sizeof(trace::wire::FrameHeader) + 8 + trace::wire::kMaxRecordBytes >
        kMaxOutgoing) {
      return false;
    }
    frame = trace::wire::beginRecords(nowNs, outgoing_);
    inFrame = 0;
    return true;
  };
  auto send = [&](const trace::CallRecord& record, bool keep) {
    if (frame != kNoFrame && !trace::wire::recordsFit(frame, inFrame, outgoing_)) closeFrame();
    if (frame == kNoFrame && !openFrame()) return false;
    if (outgoing_.size() + trace::wire::kMaxRecordBytes > kMaxOutgoing) return false;
    trace::wire::appendRecord(encoder_, record, keep, outgoing_);
    ++inFrame;
    ++counters_.recordsSent;
    return true;
  };
  // Records sent earlier whose state has moved on.
  bool full = false;
  size_t kept = 0;
  for (Watched& watched : watched_) {
    trace::CallRecord record;
    if (!writer_.read(watched.index, &record)) continue;  // overwritten: nothing more to say
    bool final = trace::wire::isFinal(record);
    if (record.state != watched.state) {
      full = full || !send(record, !final);
      if (full) {
        watched_[kept++] = watched;  // said at a later step
        continue;
      }
      watched.state = record.state;
    }
    if (!final) watched_[kept++] = watched;
  }
  watched_.resize(kept);
  uint64_t next = writer_.nextIndex();
  if (next - sentUpTo_ > writer_.capacity()) {
    counters_.recordsDropped += next - writer_.capacity() - sentUpTo_;
    sentUpTo_ = next - writer_.capacity();
  }
  for (; !full && sentUpTo_ < next; ++sentUpTo_) {
    trace::CallRecord record;
    if (!writer_.read(sentUpTo_, &record)) {
      if (next - sentUpTo_ < writer_.capacity()) break;  // still being written: next step
      ++counters_.recordsDropped;                        // overwritten before it was sent
      continue;
    }
    bool watch = !trace::wire::isFinal(record) && watched_.size() < kMaxWatched;
    if (!send(record, watch)) break;  // the queue is full: the rest waits in the ring
    if (watch) watched_.push_back({sentUpTo_, record.state});
  }
  // An empty RECORDS frame is the heartbeat: it tells the collector this rank is alive. Once a
  // second is enough (a collector of thousands of ranks pays for every frame); a connection
  // that ends is noticed at once anyway.
  if (frame == kNoFrame && nowNs - lastFrameNs_ >= kHeartbeatNs) openFrame();
  if (frame == kNoFrame) return;
  closeFrame();
  lastFrameNs_ = nowNs;
}

bool CollectorLink::flush() {
  while (outgoingSent_ < outgoing_.size()) {
    ssize_t sent = ::send(fd_, outgoing_.data() + outgoingSent_, outgoing_.size() - outgoingSent_,
                          MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (sent <= 0) return false;
    outgoingSent_ += static_cast<size_t>(sent);
  }
  outgoing_.clear();
  outgoingSent_ = 0;
  return true;
}

void CollectorLink::receive(std::vector<CollectorRequest>* requests, int64_t nowNs) {
  std::byte buffer[4096];
  // A connection that ended: the frames before its end are read first (a collector of another
  // version says REFUSED and closes).
  std::string ended;
  for (;;) {
    ssize_t got = ::recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) {
      ended = got == 0 ? "it closed the connection" : std::strerror(errno);
      break;
    }
    incoming_.insert(incoming_.end(), buffer, buffer + got);
    if (incoming_.size() > 2 * trace::wire::kMaxPayload) {
      lose(nowNs, "it sent more than a frame's bound");
      return;
    }
  }
  size_t offset = 0;
  for (;;) {
    trace::wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    auto status =
        trace::wire::decodeFrame(std::span(incoming_).subspan(offset), &frame, &consumed, &error);
    if (status == trace::wire::DecodeStatus::kNeedMore) break;
    if (status == trace::wire::DecodeStatus::kOtherVersion ||
        (status == trace::wire::DecodeStatus::kFrame &&
         frame.type == trace::wire::FrameType::kRefused)) {
      refuse(frame.version);
      return;
    }
    if (status == trace::wire::DecodeStatus::kInvalid) {
      lose(nowNs, "it sent a frame that does not decode");
      return;
    }
    offset += consumed;
    if (frame.type == trace::wire::FrameType::kDump) {
      requests->push_back({CollectorRequest::Kind::kDump, frame.reason, 0});
    } else if (frame.type == trace::wire::FrameType::kAbort) {
      requests->push_back({CollectorRequest::Kind::kAbort, "", frame.commHash});
    }
  }
  incoming_.erase(incoming_.begin(), incoming_.begin() + static_cast<std::ptrdiff_t>(offset));
  if (!ended.empty()) lose(nowNs, ended.c_str());
}

void CollectorLink::setSecret(const char* secret) {
  copyText(hello_.secret, secret);
}

void CollectorLink::step(int64_t nowNs, std::vector<CollectorRequest>* requests) {
  // A HELLO without the secret would only be rejected: wait until the secret is known.
  if (hello_.secret[0] == '\0' || refused_) return;
  if (firstAttemptNs_ >= 0 && nowNs - firstAttemptNs_ >= kUnreachableNs) {
    sayUnreachable("after 10 s");
  }
  if (fd_ < 0) {
    if (nowNs < nextAttemptNs_) return;
    connectNow(nowNs);
    if (fd_ < 0) return;
  }
  if (connecting_) {
    pollfd ready{fd_, POLLOUT, 0};
    if (poll(&ready, 1, 0) <= 0) return;
    int error = 0;
    socklen_t length = sizeof error;
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      lastError_ = std::strerror(error);
      disconnect(nowNs);
      return;
    }
    connecting_ = false;
    ++counters_.established;
    establishedNs_ = nowNs;
    backoffNs_ = 100'000'000;
    if (lostOnce_ && speaks()) {
      uint64_t next = writer_.nextIndex();
      std::fprintf(stderr,
                   "[ncclwatch] rank %d: reconnected to the collector at %s; resending the %" PRIu64
                   " calls the ring holds\n",
                   hello_.rank, where().c_str(), next - sentUpTo_);
    }
  }
  if (nowNs - establishedNs_ >= kUpNs) reached_ = true;
  collectRecords(nowNs);
  queueWaits(nowNs);
  if (!flush()) {
    lose(nowNs, std::strerror(errno));
    return;
  }
  receive(requests, nowNs);
}

// A process that ends before it ever reached the collector (a short job, or one still in its
// connection backoff) connects now, within `boundMs`: its calls and its BYE are what tells the
// collector that it left, and when.
bool CollectorLink::connectBeforeExit(int boundMs) {
  // Not on a relay by now: its bound is better spent on the collector itself.
  if (fd_ < 0) relayGivenUp_ = true;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  auto elapsedMs = [&start] {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1'000'000;
  };
  for (;;) {
    if (fd_ < 0) connectNow(0);
    if (fd_ >= 0 && !connecting_) return true;
    int left = boundMs - static_cast<int>(elapsedMs());
    if (left <= 0) return false;
    if (fd_ >= 0) {
      pollfd ready{fd_, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof error;
      if (poll(&ready, 1, std::min(left, 50)) > 0 &&
          getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0) {
        connecting_ = false;
        ++counters_.established;
        return true;
      }
      if (ready.revents == 0 && elapsedMs() < boundMs) continue;  // still connecting
      disconnect(0);
    }
    // Refused (the collector is not listening yet): try again shortly.
    pollfd none{-1, 0, 0};
    poll(&none, 0, std::min(20, std::max(1, boundMs - static_cast<int>(elapsedMs()))));
  }
}

void CollectorLink::finish(int boundMs, std::optional<int32_t> exitStatus) {
  if (hello_.secret[0] == '\0' || refused_) return;
  if (!connectBeforeExit(boundMs)) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    sayUnreachable("at exit");
    return;
  }
  collectRecords(0);
  queueEncoded([&](std::vector<std::byte>& frame) { trace::wire::encodeBye(frame, exitStatus); });
  for (int waited = 0; waited < boundMs && outgoingSent_ < outgoing_.size(); ++waited) {
    if (!flush()) break;
    if (outgoingSent_ < outgoing_.size()) {
      pollfd ready{fd_, POLLOUT, 0};
      poll(&ready, 1, 1);
    }
  }
  uint64_t unsent = outgoing_.size() - outgoingSent_;
  ::close(fd_);
  fd_ = -1;
  counters_.bytesDropped += unsent;
  counters_.recordsDropped += writer_.nextIndex() - sentUpTo_;  // a stalled collector's backlog
  // What the live verdicts did not see, from every rank that lost some: the trace file has them.
  if (counters_.recordsDropped > 0 || counters_.bytesDropped > 0) {
    std::fprintf(
        stderr,
        "[ncclwatch] rank %d: the collector did not read all of this rank's calls (%" PRIu64
        " records never sent, %" PRIu64
        " bytes queued but unsent at exit); live verdicts may miss them, the trace file "
        "keeps the newest\n",
        hello_.rank, counters_.recordsDropped, counters_.bytesDropped);
  }
}

}  // namespace ncclwatch::watchdog
