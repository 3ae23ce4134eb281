// The synthetic agents of collector_load: connecting and greeting as the watchdog does, one
// RECORDS frame per agent and poll interval, bounded send queues, and the event loop.
#include "bench/collector_load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trace/fingerprint.h"
#include "trace/identity.h"
#include "trace/wire.h"

namespace ncclwatch::bench::collector_load {

void LoadGenerator::greet(Agent& agent) {
  int i = agent.rank;
  int world = static_cast<int>(args_.agents);
  int size = static_cast<int>(args_.commSize);
  int64_t now = monotonicNs();
  frame_.clear();
  wire::Hello hello{};
  std::snprintf(hello.secret, sizeof hello.secret, "%s", secret_.c_str());
  hello.pid = 100000 + i;
  hello.rank = i;
  hello.world = world;
  hello.localRank = agent.channel > 0 ? static_cast<int>(agent.channel) - 1 : i % 8;
  std::snprintf(hello.host, sizeof hello.host, "loadgen-%zu", agent.link / agentsPerLink_);
  std::snprintf(hello.jobId, sizeof hello.jobId, "loadgen");
  // Real clock anchors, as an agent reads them when its trace opens: the collector maps record
  // times to wall time with them, so its time-based checks and its "reported N ms after" see
  // the calls as recent.
  hello.anchorMonotonicNs = now;
  hello.anchorRealtimeNs = realtimeNs();
  wire::encodeHello(hello, frame_);
  sendFrame(agent, 0);

  // The world communicator from ncclCommInitRank, and its tensor-parallel child from
  // ncclCommSplit(world, color = rank / size, key = rank), the first split of the parent.
  trace::CommInfo comms[2] = {};
  comms[0].commHash = worldHash_;
  comms[0].commPointer = 0x7f0000100000ull + static_cast<uint64_t>(i) * 0x1000;
  comms[0].createdNs = now;
  comms[0].nranks = world;
  comms[0].rank = i;
  comms[0].device = i % 8;
  comms[0].color = -1;
  comms[0].kind = static_cast<uint8_t>(OpKind::kInit);
  comms[1] = comms[0];
  comms[1].commHash = agent.tpHash;
  comms[1].parentHash = worldHash_;
  comms[1].commPointer += 0x800;
  comms[1].nranks = size;
  comms[1].rank = i % size;
  comms[1].color = i / size;
  comms[1].splitIndex = 1;
  comms[1].kind = static_cast<uint8_t>(OpKind::kSplit);
  frame_.clear();
  wire::encodeComms(comms, frame_);
  sendFrame(agent, 0);

  // The lifecycle records the interposer writes for those: init (outside the sequence), the
  // split on the parent (its first sequenced operation), the child's init.
  CallRecord base{};
  base.threadId = 100000 + i;
  base.rootOrPeer = -1;
  base.state = trace::RecordState::kCompleted;
  base.flags = trace::kRecordNoEvents;  // host-synchronous calls have no completion events
  base.slotVersion = 2;
  CallRecord init = base;
  init.commHash = worldHash_;
  init.op = OpKind::kInit;
  init.count = static_cast<uint64_t>(world);
  init.rootOrPeer = i;
  init.issueNs = init.startNs = now - 2'000'000;
  init.completeNs = now - 1'500'000;
  init.ringIndex = agent.ringIndex++;
  CallRecord split = base;
  split.commHash = worldHash_;
  split.op = OpKind::kSplit;
  split.seq = 1;
  split.rootOrPeer = i / size;
  split.issueNs = split.startNs = now - 1'000'000;
  split.completeNs = now - 600'000;
  split.ringIndex = agent.ringIndex++;
  CallRecord childInit = base;
  childInit.commHash = agent.tpHash;
  childInit.op = OpKind::kInit;
  childInit.count = static_cast<uint64_t>(size);
  childInit.rootOrPeer = i % size;
  childInit.issueNs = childInit.startNs = now - 500'000;
  childInit.completeNs = now - 400'000;
  childInit.ringIndex = agent.ringIndex++;
  CallRecord lifecycle[3] = {init, split, childInit};
  frame_.clear();
  wire::encodeRecords(monotonicNs(), lifecycle, agent.encoder, frame_);
  sendFrame(agent, 3);
}

bool LoadGenerator::connectAgents(std::string* error) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port_));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int64_t started = monotonicNs();
  int64_t deadline = started + kConnectDeadlineNs;
  // Behind relays only each host's first agent connects; the others share its connection.
  std::vector<size_t> links;
  for (size_t i = 0; i < agents_.size(); ++i) {
    if (agents_[i].link == i) links.push_back(i);
  }
  size_t total = links.size();
  // Batches far below the listen backlog, each completed before the next: a full backlog drops
  // SYNs, and the kernel would retry them only after a second.
  for (size_t first = 0; first < total; first += kConnectBatch) {
    std::vector<size_t> todo;
    for (size_t i = first; i < std::min(total, first + kConnectBatch); ++i) {
      todo.push_back(links[i]);
    }
    while (!todo.empty()) {
      if (monotonicNs() > deadline || g_interrupted) {
        *error = "connected only " + std::to_string(first) + " of " + std::to_string(total) +
                 " connections in " + std::to_string(kConnectDeadlineNs / 1'000'000'000) + " s";
        return false;
      }
      std::vector<size_t> retry;
      std::vector<pollfd> fds;
      std::vector<size_t> who;
      for (size_t index : todo) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
          *error = "socket: " + std::string(std::strerror(errno)) + " after " +
                   std::to_string(index) + " agents";
          return false;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as the agents do
        if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 ||
            errno == EINPROGRESS) {
          fds.push_back({fd, POLLOUT, 0});
          who.push_back(index);
        } else {
          close(fd);  // EAGAIN, ECONNREFUSED: the collector is busy; again shortly
          retry.push_back(index);
        }
      }
      // Wait for this batch's connections to finish, five seconds at most.
      int64_t batchDeadline = monotonicNs() + 5'000'000'000;
      for (;;) {
        std::vector<pollfd> waiting;
        for (const pollfd& p : fds) {
          if (p.revents == 0) waiting.push_back(p);
        }
        int64_t left = batchDeadline - monotonicNs();
        if (waiting.empty() || left <= 0) break;
        if (poll(waiting.data(), waiting.size(), static_cast<int>(left / 1'000'000) + 1) <= 0) {
          continue;
        }
        size_t next = 0;
        for (pollfd& p : fds) {
          if (p.revents == 0 && next < waiting.size() && waiting[next].fd == p.fd) {
            p.revents = waiting[next++].revents;
          }
        }
      }
      for (size_t k = 0; k < fds.size(); ++k) {
        int soError = 0;
        socklen_t length = sizeof soError;
        if (fds[k].revents != 0 &&
            getsockopt(fds[k].fd, SOL_SOCKET, SO_ERROR, &soError, &length) == 0 && soError == 0) {
          Agent& agent = agents_[who[k]];
          agent.fd = fds[k].fd;
          epoll_event event{};
          event.events = EPOLLIN;
          event.data.u64 = who[k];
          epoll_ctl(epoll_, EPOLL_CTL_ADD, agent.fd, &event);
          for (size_t j = who[k]; j < who[k] + agentsPerLink_; ++j) greet(agents_[j]);
          if (agent.channel != 0) {
            flush(agent);
            if (agent.fd >= 0 && agent.head < agent.queue.size()) watchWrites(agent, true);
          }
        } else {
          close(fds[k].fd);
          retry.push_back(who[k]);
        }
      }
      if (!retry.empty()) usleep(50'000);
      todo = std::move(retry);
    }
  }
  connectSeconds_ = static_cast<double>(monotonicNs() - started) / 1e9;
  return true;
}

void LoadGenerator::watchWrites(Agent& agent, bool on) {
  if (agent.writeWatched == on || agent.fd < 0) return;
  epoll_event event{};
  event.events = on ? EPOLLIN | EPOLLOUT : EPOLLIN;
  event.data.u64 = static_cast<uint64_t>(&agent - agents_.data());
  epoll_ctl(epoll_, EPOLL_CTL_MOD, agent.fd, &event);
  agent.writeWatched = on;
}

void LoadGenerator::closeAgent(Agent& agent) {
  if (agent.fd < 0) return;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, agent.fd, nullptr);
  close(agent.fd);
  agent.fd = -1;
  counters_.closedByCollector++;
  counters_.queuedBytes -= agent.queue.size() - agent.head;
  agent.queue.clear();
  agent.head = 0;
  agent.frameEnds.clear();
}

// Sends `frame_` on the agent's connection, or queues what the socket does not take.
void LoadGenerator::sendFrame(Agent& sender, uint32_t records, bool relayed) {
  Agent& agent = agents_[sender.link];  // the connection's state
  if (sender.channel != 0 && !relayed && !folders_.empty()) {
    // What the host's relay does, with its code: fold, hold, or re-encode and stamp.
    relay::Folder& folder = *folders_[sender.link / agentsPerLink_];
    relayed_.clear();
    size_t at = 0, bytes = 0;
    uint32_t ignored = 0;
    uint16_t type = 0;
    while (wire::splitFrame(std::span(frame_).subspan(at), &bytes, &ignored, &type) ==
           wire::SplitStatus::kFrame) {
      folder.agentFrame(sender.channel, std::span(frame_).subspan(at, bytes), monotonicNs(),
                        relayed_);
      at += bytes;
    }
    frame_.swap(relayed_);
    if (frame_.empty()) return;  // all folded or held
  } else if (sender.channel != 0 && !relayed) {
    // What the host's relay does to each frame it passes on: the channel in the header.
    size_t at = 0, bytes = 0;
    uint32_t ignored = 0;
    uint16_t type = 0;
    while (wire::splitFrame(std::span(frame_).subspan(at), &bytes, &ignored, &type) ==
           wire::SplitStatus::kFrame) {
      wire::setChannel(frame_.data() + at, sender.channel);
      at += bytes;
    }
  }
  size_t size = frame_.size();
  if (agent.fd < 0) {
    counters_.framesDropped++;
    counters_.recordsDropped += records;
    return;
  }
  size_t sent = 0;
  // Behind a relay the frames of a tick are gathered per host and written in one go at its end
  // (flushLinks), as a relay writes what its agents sent since its last wake-up.
  if (sender.channel == 0 && agent.head == agent.queue.size()) {
    ssize_t n = send(agent.fd, frame_.data(), size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      closeAgent(agent);
      counters_.framesDropped++;
      counters_.recordsDropped += records;
      return;
    }
    sent = n > 0 ? static_cast<size_t>(n) : 0;
    counters_.bytesSent += sent;
    if (sent == size) {
      counters_.framesSent++;
      counters_.recordsSent += records;
      return;
    }
    // The rest of a frame already begun must follow whatever the bound says, or the stream
    // would be corrupt.
  } else if (agent.queue.size() - agent.head + size > maxQueued_) {
    counters_.framesDropped++;
    counters_.recordsDropped += records;
    return;
  }
  if (agent.head > 0 && agent.head * 2 >= agent.queue.size()) {
    agent.queue.erase(agent.queue.begin(),
                      agent.queue.begin() + static_cast<std::ptrdiff_t>(agent.head));
    agent.head = 0;
  }
  agent.queue.insert(agent.queue.end(), frame_.begin() + static_cast<std::ptrdiff_t>(sent),
                     frame_.end());
  agent.appended += size - sent;
  agent.frameEnds.emplace_back(agent.appended, records);
  counters_.queuedBytes += size - sent;
  counters_.maxQueuedBytes = std::max(counters_.maxQueuedBytes, counters_.queuedBytes);
  if (sender.channel == 0) watchWrites(agent, true);
}

// Behind relays: each host's gathered frames in one write; what the socket does not take waits
// for EPOLLOUT. `*watchedAt` (if given): when the link of agent `watched` was written.
void LoadGenerator::flushLinks(size_t watched, int64_t* watchedAt) {
  for (size_t i = 0; i < agents_.size(); i += agentsPerLink_) {
    Agent& link = agents_[i];
    if (link.fd < 0 || link.writeWatched || link.head == link.queue.size()) continue;
    flush(link);
    if (link.fd >= 0 && link.head < link.queue.size()) watchWrites(link, true);
    if (watchedAt != nullptr && agents_[watched].link == i) *watchedAt = monotonicNs();
  }
}

void LoadGenerator::flush(Agent& agent) {
  while (agent.fd >= 0 && agent.head < agent.queue.size()) {
    ssize_t n = send(agent.fd, agent.queue.data() + agent.head, agent.queue.size() - agent.head,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      closeAgent(agent);
      return;
    }
    size_t taken = static_cast<size_t>(n);
    agent.head += taken;
    agent.flushed += taken;
    counters_.bytesSent += taken;
    counters_.queuedBytes -= taken;
    while (!agent.frameEnds.empty() && agent.frameEnds.front().first <= agent.flushed) {
      counters_.framesSent++;
      counters_.recordsSent += agent.frameEnds.front().second;
      agent.frameEnds.pop_front();
    }
  }
  if (agent.head == agent.queue.size()) {
    agent.queue.clear();
    agent.head = 0;
    watchWrites(agent, false);
  }
}

// One poll interval of every agent: the calls it made since the last tick, in one frame.
void LoadGenerator::tick(int64_t now, uint64_t calls) {
  int64_t from = lastTickNs_;
  int64_t span = std::max<int64_t>(now - from, 1);
  lastTickNs_ = now;
  // Layer sizes of a tensor-parallel model's per-layer allreduces, and one data-parallel
  // gradient bucket: the same sequence on every rank.
  static constexpr uint64_t kTpCounts[] = {4u << 20, 4u << 20, 16u << 20, 1u << 20};
  constexpr uint64_t kWorldCount = 25u << 20;
  // Calls alternate tensor-parallel (even) and world (odd), the same on every agent.
  uint64_t worldBase = worldCalls_, tpBase = tpCalls_;
  uint64_t worldInTick = (callsMade_ + calls) / 2 - callsMade_ / 2;
  // The mismatch counts from when its host's frames were written.
  auto flushTick = [&] {
    bool mismatchNow = mismatchSentNs_ > 0 && mismatchAgent_ != SIZE_MAX;
    flushLinks(mismatchNow ? mismatchAgent_ : 0, mismatchNow ? &mismatchSentNs_ : nullptr);
    mismatchAgent_ = SIZE_MAX;
  };
  auto tickAgent = [&](Agent& agent) {
    records_.clear();
    uint64_t worldDone = 0, tpDone = 0;
    // Ranks reach a collective a little apart.
    int64_t skew = (agent.rank % 64) * 1000;
    for (uint64_t k = 0; k < calls; ++k) {
      uint64_t call = callsMade_ + k;
      bool world = call % 2 == 1;
      CallRecord r{};
      r.op = OpKind::kAllReduce;
      r.dtype = kBfloat16;
      r.redop = kSum;
      r.rootOrPeer = -1;
      r.threadId = 100000 + agent.rank;
      r.state = trace::RecordState::kCompleted;
      r.slotVersion = 2;
      r.ringIndex = agent.ringIndex++;
      int64_t interval = span / static_cast<int64_t>(calls);
      r.issueNs = from + static_cast<int64_t>(k) * interval + std::min<int64_t>(skew, interval / 4);
      r.startNs = r.issueNs + std::min<int64_t>(5000, interval / 4);
      r.completeNs = std::min(r.issueNs + interval / 2, now - 1);
      if (world) {
        uint64_t ordinal = worldBase + worldDone++;
        r.commHash = worldHash_;
        r.seq = ordinal + 2;  // the split was the world's first sequenced operation
        r.ncclSeqNumber = ordinal;
        r.count = kWorldCount;
        r.stream = 0x5600000a0000ull + static_cast<uint64_t>(agent.rank % 8) * 0x100;
        r.callSite = 0x55555555a000ull;
        if (injectMismatch_ && agent.rank == culprit_ && worldDone == 1) r.count = kWorldCount / 2;
        r.fingerprint = trace::fingerprint({r.op, r.count, r.dtype, r.redop, r.rootOrPeer});
        agent.worldRolling = trace::rollingHash(agent.worldRolling, r.fingerprint);
        r.rollingHash = agent.worldRolling;
      } else {
        uint64_t ordinal = tpBase + tpDone++;
        r.commHash = agent.tpHash;
        r.seq = ordinal + 1;
        r.ncclSeqNumber = ordinal;
        r.count = kTpCounts[ordinal % 4];
        r.stream = 0x5600000b0000ull + static_cast<uint64_t>(agent.rank % 8) * 0x100;
        r.callSite = 0x555555559000ull + (ordinal % 4) * 0x40;
        r.fingerprint = trace::fingerprint({r.op, r.count, r.dtype, r.redop, r.rootOrPeer});
        agent.tpRolling = trace::rollingHash(agent.tpRolling, r.fingerprint);
        r.rollingHash = agent.tpRolling;
      }
      if (!world && args_.hosts > 0 && args_.fold == Args::kFoldEmulated) {
        // Folded by the host's relay: counted in the agent's next note, never sent.
        agent.note.commHash = r.commHash;
        agent.note.calls++;
        agent.note.lastOrdinal = r.ncclSeqNumber;
        agent.note.latestNs = std::max(agent.note.latestNs, r.completeNs);
        counters_.recordsFolded++;
        continue;
      }
      records_.push_back(r);
    }
    // A frame that would not fit the queue is not encoded at all (its records are lost, as a
    // real agent's would wait in its ring): the encoder's bases stay those the collector has.
    size_t bound = sizeof(wire::FrameHeader) + 8 + records_.size() * wire::kMaxRecordBytes;
    const Agent& link = agents_[agent.link];
    if (link.fd < 0 ||
        (link.head < link.queue.size() && link.queue.size() - link.head + bound > maxQueued_)) {
      counters_.framesDropped++;
      counters_.recordsDropped += records_.size();
      counters_.calls += calls;
      return;
    }
    frame_.clear();
    if (agent.note.calls > 0 && now >= agent.nextNoteNs) {
      wire::encodeFolded(monotonicNs(), std::span(&agent.note, 1), frame_);
      agent.note.calls = 0;
      agent.nextNoteNs = now + 1'000'000'000;
    }
    wire::encodeRecords(monotonicNs(), records_, agent.encoder, frame_);
    bool carriesMismatch = injectMismatch_ && agent.rank == culprit_ && worldDone > 0;
    bool wasQueued = link.head < link.queue.size() && link.writeWatched;
    sendFrame(agent, static_cast<uint32_t>(records_.size()));
    if (carriesMismatch) {
      mismatchSentNs_ = monotonicNs();
      mismatchQueued_ = wasQueued;
      mismatchAgent_ = static_cast<size_t>(&agent - agents_.data());
      injectMismatch_ = false;
    }
    counters_.calls += calls;
  };
  if (args_.hosts > 0 && args_.writePerAgent) {
    // Each agent's frame a write of its own: the first agent of every host, then the second...
    for (size_t slot = 0; slot < agentsPerLink_; ++slot) {
      for (size_t i = slot; i < agents_.size(); i += agentsPerLink_) tickAgent(agents_[i]);
      flushTick();
    }
  } else {
    for (Agent& agent : agents_) tickAgent(agent);
  }
  // The relays' own work of the tick: held calls past their time, due FOLDED notes.
  for (size_t host = 0; host < folders_.size(); ++host) {
    frame_.clear();
    folders_[host]->tick(now, frame_);
    if (!frame_.empty()) sendFrame(agents_[host * agentsPerLink_], 0, true);
  }
  if (args_.hosts > 0) flushTick();
  callsMade_ += calls;
  worldCalls_ = worldBase + worldInTick;
  tpCalls_ = tpBase + (calls - worldInTick);
}

// Handles sockets and the collector's output until `untilNs`.
void LoadGenerator::pump(int64_t untilNs) {
  epoll_event events[256];
  for (;;) {
    int64_t now = monotonicNs();
    int timeoutMs = now >= untilNs ? 0 : static_cast<int>((untilNs - now + 999'999) / 1'000'000);
    int ready = epoll_wait(epoll_, events, 256, timeoutMs);
    now = monotonicNs();
    for (int e = 0; e < ready; ++e) {
      uint64_t tag = events[e].data.u64;
      if (tag == kEpollStdout || tag == kEpollStderr) {
        handleLines(tag == kEpollStdout, now);
        LineReader& reader = tag == kEpollStdout ? out_ : err_;
        if (!reader.open) epoll_ctl(epoll_, EPOLL_CTL_DEL, reader.fd, nullptr);
        continue;
      }
      Agent& agent = agents_[tag];
      if (agent.fd < 0) continue;
      if (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        // The collector's DUMP requests: a load generator has nothing to dump.
        char buffer[4096];
        for (;;) {
          ssize_t got = recv(agent.fd, buffer, sizeof buffer, MSG_DONTWAIT);
          if (got > 0) {
            counters_.bytesFromCollector += static_cast<uint64_t>(got);
            continue;
          }
          if (got < 0 && errno == EINTR) continue;
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closeAgent(agent);
          break;
        }
      }
      if (agent.fd >= 0 && (events[e].events & EPOLLOUT)) flush(agent);
    }
    if (monotonicNs() >= untilNs || g_interrupted) return;
  }
}

}  // namespace ncclwatch::bench::collector_load
