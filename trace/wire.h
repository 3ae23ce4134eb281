// The agent↔collector protocol (docs/protocol.md): frames over TCP, each a fixed 16-byte header
// and a bounded payload. Agents send who they are (HELLO, with the job's secret), their
// communicator table (COMMS, the trace file's CommInfo layout) and their new or changed call
// records (RECORDS: compact messages, each delta-encoded against the previous record of its
// communicator on the same connection, that the collector decodes back to the trace file's
// CallRecord), so that the collector rebuilds each rank's TraceFile and runs the offline analysis
// on it. The collector asks for dumps (DUMP) and aborts (ABORT), and answers an agent of another
// protocol version with REFUSED. Standard library only: the agent side is linked into the preload
// library.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trace/ring_format.h"

namespace ncclwatch::trace::wire {

inline constexpr uint32_t kMagic = 0x3150574e;  // "NWP1" little-endian
// 1: RECORDS carried whole 128-byte CallRecords. 2: RECORDS carry delta-encoded messages.
inline constexpr uint16_t kVersion = 2;
// Where an agent looks for the job's collector by default: MASTER_PORT + this. torchrun's store
// owns MASTER_PORT and the examples rendezvous on MASTER_PORT+1; +17 keeps clear of both and of
// the small offsets other launchers tend to use.
inline constexpr int kCollectorPortOffset = 17;
inline constexpr uint32_t kMaxPayload = 1u << 20;
// Records one RECORDS frame may carry: the collector's decoded frame stays within 1 MiB.
inline constexpr uint32_t kMaxRecordsPerFrame = (kMaxPayload - 16) / sizeof(CallRecord);
inline constexpr size_t kSecretBytes = 64;
// Delta bases one connection keeps (both ends alike): communicators a connection's records
// refer to at once (slots, reused round robin), and recent records whose state may still change
// (ring index modulo kPendingSlots), against which an UPDATE message is a few bytes.
inline constexpr size_t kMaxCommSlots = 64;
inline constexpr size_t kPendingSlots = 128;
// One record's messages on the wire at most (a COMM message and a RECORD message, every field).
inline constexpr size_t kMaxRecordBytes = 192;

enum class FrameType : uint16_t {
  kHello = 1,    // agent → collector, first frame
  kComms = 2,    // agent → collector: the whole communicator table
  kRecords = 3,  // agent → collector: records new or changed since the last frame
  kBye = 4,      // agent → collector: the process ends normally
  kWaits = 5,    // agent → collector: where its pending calls wait inside NCCL (all of them)
  kSites = 6,    // agent → collector: Python call sites its records refer to (new ones)
  // Relay link only, relay → collector, on an agent's channel (session 20 on): calls of that
  // agent its relay folded (docs/protocol.md, "Folding"): never sent as records.
  kFolded = 7,
  kDump = 16,   // collector → agent: take a dump (payload: reason text)
  kAbort = 17,  // collector → agent: abort the communicator (payload: u64 comm hash)
  // collector → agent: it speaks another protocol version (payload: u16 its version). Decoded
  // whatever the header's version, so that agents of every version understand it.
  kRefused = 18,
  // Relay link only (docs/protocol.md, "Relays"), either way, empty: relay → collector, the
  // channel's agent connection at the relay ended; collector → relay, drop that agent.
  kClosed = 19,
};

// The relay framing: on a link from a host's relay to the collector every frame is an agent's
// frame, byte for byte, except the header's `reserved` field, which names the agent's channel on
// that link (1 to kMaxChannel); the collector's answers come back the same way. Direct
// connections keep `reserved` 0.
inline constexpr uint32_t kMaxChannel = 32767;
// Agent connections one relay serves at once.
inline constexpr size_t kMaxChannelsPerLink = 4096;

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t version;
  uint32_t length;  // payload bytes, at most kMaxPayload
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == 16);

// FOLDED's entries: per communicator, the calls of one agent its relay folded since its last
// FOLDED (every member of the communicator is on the relay's host and completed them alike).
struct FoldedNote {
  uint64_t commHash;
  uint32_t calls;        // folded since the last note
  uint32_t flags;        // FoldedNoteFlags
  uint64_t lastOrdinal;  // every collective of the communicator through this ordinal is settled
  int64_t latestNs;      // the latest time of them (completion), the agent's CLOCK_MONOTONIC
};
enum FoldedNoteFlags : uint32_t {
  // Records of these calls went to the collector before the relay could judge them (it did not
  // know yet that every member is on its host): the collector drops them, as the calls folded
  // after them never come (its window would hold them, then a gap).
  kFoldedDropsSent = 1u << 0,
};
static_assert(sizeof(FoldedNote) == 32);
// Entries one FOLDED frame carries at most (communicators an agent folds on).
inline constexpr uint32_t kMaxFoldedNotes = 1024;

struct Hello {
  char secret[kSecretBytes];  // the job's secret, NUL-padded
  int32_t pid;
  int32_t rank;
  int32_t world;
  int32_t localRank;
  char host[64];
  char jobId[64];
  char tracePath[256];
  int64_t anchorMonotonicNs;  // the trace header's clock anchors: record times → wall clock
  int64_t anchorRealtimeNs;
};
static_assert(sizeof(Hello) == 480);

// What both ends of one connection remember of its records: per communicator slot the previous
// record (the delta base) and the counters a next call would take, the last ring index sent, and
// the records kept for UPDATE messages. A new connection starts from nothing on both sides.
class RecordStream {
 public:
  void reset();

 protected:
  struct Comm {
    CallRecord image;             // the previous record of this communicator
    uint64_t lastSeq = 0;         // the last nonzero seq
    uint64_t nextCollective = 0;  // ncclSeqNumber the next collective takes
    uint64_t nextPointToPoint = 0;
    uint64_t lastP2pSeq = 0;  // p2pSeq of the last send or receive
    uint64_t rolling = 0;     // rollingHash of the last collective, send or receive
    // The decoder's: image.fingerprint is the one its shape implies (it came without one), so a
    // record of the same shape takes it without hashing the shape again.
    bool imageFingerprintImplied = false;
  };
  void defineComm(size_t slot, uint64_t commHash);
  // After a RECORD message: the new delta bases.
  void recordSent(Comm& comm, const CallRecord& record, bool keep);
  CallRecord* pendingFor(uint64_t ringIndex);
  void keepPending(const CallRecord& record);
  void releasePending(uint64_t ringIndex);

  std::vector<Comm> comms_;          // grows to kMaxCommSlots
  std::vector<CallRecord> pending_;  // kPendingSlots once a record is kept
  std::vector<uint8_t> pendingValid_;
  uint64_t lastRing_ = ~0ull;  // the ring index of the last RECORD message
};

// Whether a record will not change any more: completed, failed or aborted, or a call whose
// completion is not tracked. An agent sends a record that is not final with `keep` (it watches
// it and sends its changes as UPDATE messages); a relay that re-encodes does the same.
bool isFinal(const CallRecord& record);

// The agent's side: turns records into messages. Allocates its tables once (constructor), never
// while encoding.
class RecordEncoder : public RecordStream {
 public:
  RecordEncoder();
  void reset();
  // Writes one record's messages to `out`, which has room for kMaxRecordBytes; returns the bytes
  // written. `keep`: the record's state may still change (the agent watches it), so the collector
  // keeps it for UPDATE messages. A record kept before and changed only in state, flags, result,
  // times or slot version becomes an UPDATE message; any other as a RECORD message.
  size_t encode(const CallRecord& record, bool keep, std::byte* out);

 private:
  // The slot of `commHash`, defining it (a COMM message at `out`, `written` bytes) if needed.
  size_t commSlot(uint64_t commHash, std::byte* out, size_t* written);
  size_t nextVictim_ = 0;  // the slot a new communicator takes once all are in use
};

// The collector's side: the messages of RECORDS frames back to CallRecords. Its tables grow with
// what the connection uses, to kMaxCommSlots and kPendingSlots at most.
class RecordDecoder : public RecordStream {
 public:
  // Appends the records of one RECORDS payload's messages; false with a one-line `error` when
  // they break the format (the connection is then dropped).
  bool decode(std::span<const std::byte> messages, std::vector<CallRecord>* records,
              std::string* error);
};

// Encoders append one whole frame to `out`.
void encodeHello(const Hello& hello, std::vector<std::byte>& out);
void encodeComms(std::span<const CommInfo> comms, std::vector<std::byte>& out);
// RECORDS frames built in place, for a sender that must not allocate: beginRecords appends the
// header and `nowNs` (the agent's CLOCK_MONOTONIC at sending, so the collector can tell silence),
// appendRecord one record (while recordsFit), endRecords sets the frame's length. `out` must have
// the capacity for it: it is resized, never reallocated, when it does.
size_t beginRecords(int64_t nowNs, std::vector<std::byte>& out);  // returns the frame's offset
bool recordsFit(size_t frameOffset, uint32_t records, const std::vector<std::byte>& out);
void appendRecord(RecordEncoder& encoder, const CallRecord& record, bool keep,
                  std::vector<std::byte>& out);
void endRecords(size_t frameOffset, std::vector<std::byte>& out);
// The whole of `records` as RECORDS frames of at most kMaxRecordsPerFrame each; at least one
// frame (an empty one is the heartbeat). None kept, or with `keepUnfinished` those not final
// (isFinal), as an agent keeps the records it watches (a relay that re-encodes them).
void encodeRecords(int64_t nowNs, std::span<const CallRecord> records, RecordEncoder& encoder,
                   std::vector<std::byte>& out, bool keepUnfinished = false);
// BYE: empty, or (session 18 on) the i32 status the process passed to exit(). A collector before
// session 18 drops a BYE with a payload (the rank then counts as gone, not ended).
void encodeBye(std::vector<std::byte>& out, std::optional<int32_t> exitStatus = std::nullopt);
// The whole current set of wait notes (replaces the previous set; empty: nothing waits).
void encodeWaits(int64_t nowNs, std::span<const WaitNote> waits, std::vector<std::byte>& out);
// Python call sites as text (trace/python_sites.h), at most kMaxPayload bytes of it.
void encodeSites(const std::string& text, std::vector<std::byte>& out);
void encodeDump(const std::string& reason, std::vector<std::byte>& out);
void encodeAbort(uint64_t commHash, std::vector<std::byte>& out);
void encodeRefused(std::vector<std::byte>& out);
// FOLDED (a relay's; the caller stamps the channel): at most kMaxFoldedNotes entries.
void encodeFolded(int64_t nowNs, std::span<const FoldedNote> notes, std::vector<std::byte>& out);

// A decoded frame.
struct Frame {
  FrameType type = FrameType::kBye;
  Hello hello{};
  std::vector<CommInfo> comms;
  int64_t nowNs = 0;
  std::vector<CallRecord> records;
  std::vector<WaitNote> waits;
  std::vector<FoldedNote> folded;  // FOLDED
  std::string reason;              // DUMP: the reason; SITES: the sites' text
  uint64_t commHash = 0;
  uint16_t version = 0;               // REFUSED: the version the collector speaks
  std::optional<int32_t> exitStatus;  // BYE: the status the process passed to exit(), if sent
};

enum class DecodeStatus { kFrame, kNeedMore, kInvalid, kOtherVersion };

// Decodes the first frame in `bytes`: kFrame with `consumed` set, kNeedMore when the frame is
// not complete yet, kInvalid (with a one-line `error`) when the bytes cannot be a valid frame —
// the connection is then dropped —, kOtherVersion (with `error`, and frame->version the peer's)
// when the peer speaks another protocol version. RECORDS frames need the connection's
// `records` decoder (nullptr: they are invalid). Never reads past `bytes`, never allocates more
// than the frame's bounded size.
DecodeStatus decodeFrame(std::span<const std::byte> bytes, Frame* frame, size_t* consumed,
                         std::string* error, RecordDecoder* records = nullptr);

// What a relay needs to pass frames on without decoding them: the first frame of `bytes`,
// judged by its header alone (magic, the payload bound). kFrame with its size, channel (the
// header's reserved field) and type; kNeedMore; kInvalid when no frame can start there.
enum class SplitStatus { kFrame, kNeedMore, kInvalid };
SplitStatus splitFrame(std::span<const std::byte> bytes, size_t* frameBytes, uint32_t* channel,
                       uint16_t* type);
// Stamps `channel` into the header of the frame that starts at `frame` (0: a direct frame).
void setChannel(std::byte* frame, uint32_t channel);
// Every frame of `frames` (whole frames, back to back) stamped with `channel`, appended to `out`.
void appendWithChannel(std::span<const std::byte> frames, uint32_t channel,
                       std::vector<std::byte>& out);
// A CLOSED frame for `channel`.
void encodeClosed(uint32_t channel, std::vector<std::byte>& out);

// Constant-time comparison of a received secret with the expected one.
bool secretMatches(const char (&received)[kSecretBytes], const std::string& expected);

}  // namespace ncclwatch::trace::wire
