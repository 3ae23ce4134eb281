// The agent↔collector protocol (docs/protocol.md): frames over TCP, each a fixed 16-byte header
// and a bounded payload. Agents send who they are (HELLO, with the job's secret), their
// communicator table (COMMS) and their new or changed call records (RECORDS) — the same
// CallRecord and CommInfo layouts as the trace file, so that the collector rebuilds each rank's
// TraceFile and runs the offline analysis on it. The collector asks for dumps (DUMP) and aborts
// (ABORT). Standard library only: the agent side is linked into the preload library.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trace/ring_format.h"

namespace ncclwatch::trace::wire {

inline constexpr uint32_t kMagic = 0x3150574e;  // "NWP1" little-endian
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxPayload = 1u << 20;
inline constexpr uint32_t kMaxRecordsPerFrame = (kMaxPayload - 16) / sizeof(CallRecord);
inline constexpr size_t kSecretBytes = 64;

enum class FrameType : uint16_t {
  kHello = 1,    // agent → collector, first frame
  kComms = 2,    // agent → collector: the whole communicator table
  kRecords = 3,  // agent → collector: records new or changed since the last frame
  kBye = 4,      // agent → collector: the process ends normally
  kWaits = 5,    // agent → collector: where its pending calls wait inside NCCL (all of them)
  kSites = 6,    // agent → collector: Python call sites its records refer to (new ones)
  kDump = 16,    // collector → agent: take a dump (payload: reason text)
  kAbort = 17,   // collector → agent: abort the communicator (payload: u64 comm hash)
};

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t version;
  uint32_t length;  // payload bytes, at most kMaxPayload
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == 16);

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

// Encoders append one whole frame to `out`.
void encodeHello(const Hello& hello, std::vector<std::byte>& out);
void encodeComms(std::span<const CommInfo> comms, std::vector<std::byte>& out);
// `nowNs`: the agent's CLOCK_MONOTONIC at sending, so the collector can tell silence.
void encodeRecords(int64_t nowNs, std::span<const CallRecord> records, std::vector<std::byte>& out);
void encodeBye(std::vector<std::byte>& out);
// The whole current set of wait notes (replaces the previous set; empty: nothing waits).
void encodeWaits(int64_t nowNs, std::span<const WaitNote> waits, std::vector<std::byte>& out);
// Python call sites as text (trace/python_sites.h), at most kMaxPayload bytes of it.
void encodeSites(const std::string& text, std::vector<std::byte>& out);
void encodeDump(const std::string& reason, std::vector<std::byte>& out);
void encodeAbort(uint64_t commHash, std::vector<std::byte>& out);

// A decoded frame.
struct Frame {
  FrameType type = FrameType::kBye;
  Hello hello{};
  std::vector<CommInfo> comms;
  int64_t nowNs = 0;
  std::vector<CallRecord> records;
  std::vector<WaitNote> waits;
  std::string reason;  // DUMP: the reason; SITES: the sites' text
  uint64_t commHash = 0;
};

enum class DecodeStatus { kFrame, kNeedMore, kInvalid };

// Decodes the first frame in `bytes`: kFrame with `consumed` set, kNeedMore when the frame is
// not complete yet, kInvalid (with a one-line `error`) when the bytes cannot be a valid frame —
// the connection is then dropped. Never reads past `bytes`, never allocates more than the
// frame's bounded size.
DecodeStatus decodeFrame(std::span<const std::byte> bytes, Frame* frame, size_t* consumed,
                         std::string* error);

// Constant-time comparison of a received secret with the expected one.
bool secretMatches(const char (&received)[kSecretBytes], const std::string& expected);

}  // namespace ncclwatch::trace::wire
