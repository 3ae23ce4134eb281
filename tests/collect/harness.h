// What the collector tests share: a collector on an ephemeral port in a fresh folder, synthetic
// agents' sockets and records.
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collect.h"
#include "trace/fingerprint.h"
#include "trace/record.h"
#include "trace/wire.h"

namespace collecttest {

using namespace std::chrono_literals;

// A loopback TCP connection to `port` (the test fails if it cannot be made).
inline int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  return fd;
}

inline void sendAll(int fd, const std::vector<std::byte>& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds timeout = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return predicate();
}

// True when the peer closed the connection within `timeout`.
inline bool closedByPeer(int fd, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, 20) > 0) {
      char byte;
      ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    }
  }
  return false;
}

// A started allreduce of `count` f32 (dtype 7) at `seq` on `comm`, issued seq ms after 1 s.
inline ncclwatch::trace::CallRecord allReduce(uint64_t comm, uint64_t seq, uint64_t count) {
  ncclwatch::trace::CallRecord record{};
  record.commHash = comm;
  record.seq = seq;
  record.op = ncclwatch::trace::OpKind::kAllReduce;
  record.count = count;
  record.dtype = 7;
  record.state = ncclwatch::trace::RecordState::kStarted;
  record.issueNs = 1'000'000'000 + static_cast<int64_t>(seq) * 1'000'000;
  record.startNs = record.issueNs + 1000;
  record.rootOrPeer = -1;
  record.ringIndex = seq;
  record.slotVersion = 2;
  record.fingerprint = ncclwatch::trace::fingerprint({record.op, count, 7, 0, -1});
  return record;
}

// The same allreduce completed 1 µs after its start, NCCL's per-comm counter at seq - 1.
inline ncclwatch::trace::CallRecord completedAllReduce(uint64_t comm, uint64_t seq,
                                                       uint64_t count) {
  ncclwatch::trace::CallRecord record = allReduce(comm, seq, count);
  record.ncclSeqNumber = seq - 1;
  record.state = ncclwatch::trace::RecordState::kCompleted;
  record.completeNs = record.startNs + 1000;
  return record;
}

// A rank of a 2-rank job on "fakehost" saying hello with `secret`.
inline ncclwatch::trace::wire::Hello hello(const std::string& secret, int rank) {
  ncclwatch::trace::wire::Hello h{};
  std::strncpy(h.secret, secret.c_str(), sizeof h.secret - 1);
  h.pid = 1000 + rank;
  h.rank = rank;
  h.world = 2;
  h.localRank = rank;
  std::strcpy(h.host, "fakehost");
  std::strcpy(h.jobId, "fake-job");
  std::snprintf(h.tracePath, sizeof h.tracePath, "/fake/rank%d.ncclwatch", rank);
  h.anchorMonotonicNs = 1'000'000'000;
  h.anchorRealtimeNs = 1'700'000'000'000'000'000;
  return h;
}

// A collector started for each test, with `kSecret` and its own folder, stopped after it.
template <const char* kSecret, const char* kFolder>
class CollectorFixture : public testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::string(testing::TempDir()) + "/" + kFolder + "-" + std::to_string(getpid());
    std::filesystem::remove_all(directory_);
    ncclwatch::collect::Options options;
    options.secret = kSecret;
    options.directory = directory_;
    std::string error;
    ASSERT_TRUE(collector_.start(options, out_, &error)) << error;
  }
  void TearDown() override {
    collector_.stop();
    std::filesystem::remove_all(directory_);
  }
  // Stops the collector and returns the first line of its verdicts.jsonl ("" when none).
  std::string stopAndReadFirstVerdict() {
    collector_.stop();
    std::ifstream jsonl(directory_ + "/verdicts.jsonl");
    std::string line;
    std::getline(jsonl, line);
    return line;
  }
  std::string directory_;
  std::ostringstream out_;
  ncclwatch::collect::Collector collector_;
};

}  // namespace collecttest
