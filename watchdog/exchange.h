// The agent's side of the exchange with the collector (docs/protocol.md). The watchdog thread
// calls step() every poll: it connects (non-blocking, with backoff), sends HELLO with the job's
// secret, the communicator table when it changed, and the records that are new or changed
// since the last step, and reads the collector's requests. Nothing here runs on an application
// thread; every buffer is bounded and what does not fit is dropped and counted. Without a
// collector the agent keeps its local detection. Where the collector is: watchdog/discovery.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trace/ring_writer.h"
#include "trace/wire.h"

namespace ncclwatch::watchdog {

// Whether the agents of a host reach the collector through the host's relay (docs/protocol.md,
// "Relays"): NCCLWATCH_RELAY=on, off, or auto (the default: jobs of kRelayAutoWorld ranks or
// more, where one connection per host instead of per rank pays).
enum class RelayMode { kAuto, kOn, kOff };
inline constexpr int kRelayAutoWorld = 64;

struct CollectorAddress {
  std::string host;  // numeric IPv4/IPv6 or a name getaddrinfo resolves
  int port = 0;
  std::string secret;  // empty while it waits to be derived
  // The default address from MASTER_ADDR and MASTER_PORT, not NCCLWATCH_COLLECTOR: rank 0
  // then hosts the collector as a sidecar.
  bool fromMasterAddr = false;
  // The secret comes from the first root communicator's unique id (NCCLWATCH_SECRET unset).
  bool secretFromUniqueId = false;
  RelayMode relay = RelayMode::kAuto;
};

// What the collector asked for.
struct CollectorRequest {
  enum class Kind { kDump, kAbort } kind;
  std::string reason;
  uint64_t commHash = 0;
};

struct ExchangeCounters {
  uint64_t framesSent = 0;
  uint64_t recordsSent = 0;
  uint64_t bytesDropped = 0;    // frames that did not fit the send buffer
  uint64_t recordsDropped = 0;  // overwritten in the ring before the collector read them
  uint64_t fullSteps = 0;       // steps that found the send buffer full (the collector stalls)
  uint64_t connects = 0;        // connection attempts
  uint64_t established = 0;     // attempts that reached the collector
};

class CollectorLink {
 public:
  CollectorLink(const CollectorAddress& address, trace::RingWriter& writer, int rank, int world,
                int localRank);
  ~CollectorLink();
  CollectorLink(const CollectorLink&) = delete;
  CollectorLink& operator=(const CollectorLink&) = delete;

  // The job's secret, for a link created before it was known; it never connects without one.
  void setSecret(const char* secret);
  // Reach the collector through the host's relay, listening on the abstract socket `name`
  // (watchdog/relay_host.h): tried first, given up for a direct connection when none listens
  // within kRelayWaitNs, and for good once a relay connection ended (the relay died or lost the
  // collector: each agent says so in one line).
  void useRelay(const std::string& name);
  bool onRelay() const { return onRelay_ && fd_ >= 0; }
  // One exchange step; appends the collector's requests to `requests`.
  void step(int64_t nowNs, std::vector<CollectorRequest>* requests);
  // Where this process's pending calls wait inside NCCL (the plugin's notes): sent at the next
  // step, after the records, and again on every new connection.
  void publishWaits(const std::vector<trace::WaitNote>& waits);
  // New Python call sites (their text): sent at the next step, and all of them again on every
  // new connection.
  void publishSites(const std::string& text);
  // At a normal exit: the last records and BYE, sent within `boundMs` (and, when the link
  // never reached the collector, connecting first within another `boundMs`).
  // `exitStatus`: what the process passed to exit(), sent with BYE when known.
  void finish(int boundMs, std::optional<int32_t> exitStatus = std::nullopt);
  const ExchangeCounters& counters() const { return counters_; }

 private:
  void connectNow(int64_t nowNs);
  bool connectRelay(int64_t nowNs);
  void startOver();
  bool connectBeforeExit(int boundMs);
  void disconnect(int64_t nowNs);
  void queue(const std::vector<std::byte>& frame);
  // Encodes one frame into scratch_ and queues it: the buffer keeps its capacity, so that the
  // watchdog thread does not allocate every poll (a fork child of a process whose allocator has
  // no fork handlers would inherit a held lock).
  template <typename Encode>
  void queueEncoded(Encode&& encode) {
    scratch_.clear();
    encode(scratch_);
    queue(scratch_);
  }
  void collectRecords(int64_t nowNs);
  void compact();
  void refuse(uint16_t version);
  void queueWaits(int64_t nowNs);
  bool flush();
  void receive(std::vector<CollectorRequest>* requests, int64_t nowNs);
  void lose(int64_t nowNs, const char* why);
  void sayUnreachable(const char* when);
  bool speaks() const { return hello_.localRank <= 0; }
  std::string where() const;

  CollectorAddress address_;
  trace::RingWriter& writer_;
  trace::wire::Hello hello_{};
  std::vector<std::byte> scratch_;  // queueEncoded's frame
  int fd_ = -1;
  bool connecting_ = false;
  int64_t nextAttemptNs_ = 0;
  int64_t backoffNs_ = 100'000'000;
  uint64_t sentUpTo_ = 0;  // ring indices below this were sent at least once
  size_t commsSent_ = 0;
  struct Watched {
    uint64_t index;
    trace::RecordState state;
  };
  std::vector<trace::WaitNote> waits_;
  bool waitsDirty_ = false;
  std::string sites_;             // every site's text so far
  size_t sitesSent_ = 0;          // bytes of sites_ sent on this connection
  std::vector<Watched> watched_;  // sent while not final: resent when their state changes
  // Frames queued for the collector; reserved once, so that RECORDS frames are encoded in place
  // without allocating. Records are encoded only while they fit: a RECORDS frame is never dropped
  // once encoded (the collector's delta bases would no longer match the encoder's).
  std::vector<std::byte> outgoing_;
  size_t outgoingSent_ = 0;
  trace::wire::RecordEncoder encoder_;  // this connection's delta bases; reset on each connect
  bool refused_ = false;  // the collector speaks another protocol version: local detection only
  std::vector<std::byte> incoming_;
  int64_t lastFrameNs_ = INT64_MIN / 2;  // when the last RECORDS frame was queued
  // What the user is told (docs/reliability.md, "The collector"): one line per fault.
  int64_t firstAttemptNs_ = -1;
  std::string lastError_;  // why the last attempt or connection failed
  bool saidUnreachable_ = false;
  bool saidStalled_ = false;
  bool lostOnce_ = false;      // a connection that was up ended: the next one says so
  bool reached_ = false;       // a connection stayed up for a second: the collector took us
  int64_t establishedNs_ = 0;  // when the current connection was established
  ExchangeCounters counters_;
  // The host's relay (useRelay): its socket name, whether this connection goes to it, and
  // whether it was given up for a direct connection.
  std::string relayName_;
  bool onRelay_ = false;
  bool relayGivenUp_ = false;
  int64_t relayFirstTryNs_ = -1;
};

}  // namespace ncclwatch::watchdog
