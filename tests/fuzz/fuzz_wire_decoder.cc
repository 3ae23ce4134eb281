// libFuzzer target: the collector's frame decoder must take any bytes a network peer sends
// without crashing or reading out of bounds, consume whole frames only, and never hand out more
// entries than the frame's bounds allow. RECORDS frames go through one connection's record
// decoder, whose delta bases carry over from frame to frame as on a real connection; and every
// record decoded must encode again, from an encoder fed the same records, to messages that decode
// to the same records (the format has one meaning for each message).
//
// The same bytes are also read as a relay's link (docs/protocol.md, "Relays"), as the collector
// reads one: frames split by their header alone, each channel's frames decoded with that
// channel's own delta bases once the channel stamp is cleared. Splitting must agree with
// decoding on every frame's size, a channel stamped in and out must leave the frame's bytes as
// they were, and the channels one link keeps stay within kMaxChannelsPerLink.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "trace/wire.h"

namespace {
using namespace ncclwatch::trace;

void readDirect(std::span<const std::byte> rest) {
  wire::RecordDecoder decoder;
  // The records decoded so far, encoded again by an agent's encoder and decoded by a second
  // collector: each must come back the same.
  wire::RecordEncoder reencoder;
  wire::RecordDecoder redecoder;
  for (;;) {
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    wire::DecodeStatus status = wire::decodeFrame(rest, &frame, &consumed, &error, &decoder);
    if (status != wire::DecodeStatus::kFrame) {
      if (status != wire::DecodeStatus::kNeedMore && error.empty()) std::abort();
      return;
    }
    if (consumed < sizeof(wire::FrameHeader) || consumed > rest.size()) std::abort();
    if (frame.records.size() > wire::kMaxRecordsPerFrame) std::abort();
    for (const CallRecord& record : frame.records) {
      std::byte message[wire::kMaxRecordBytes];
      size_t bytes = reencoder.encode(record, record.state == RecordState::kIssued, message);
      if (bytes > sizeof message) std::abort();
      std::vector<CallRecord> again;
      if (!redecoder.decode(std::span(message, bytes), &again, &error) || again.size() != 1 ||
          std::memcmp(&again[0], &record, sizeof record) != 0) {
        std::abort();
      }
    }
    if (frame.comms.size() > kCommTableCapacity) std::abort();
    if (frame.reason.size() > 1024) std::abort();
    rest = rest.subspan(consumed);
  }
}

void readRelayLink(std::span<const std::byte> rest) {
  std::map<uint32_t, wire::RecordDecoder> channels;
  for (;;) {
    size_t bytes = 0;
    uint32_t channel = 0;
    uint16_t type = 0;
    wire::SplitStatus split = wire::splitFrame(rest, &bytes, &channel, &type);
    if (split != wire::SplitStatus::kFrame) return;  // need more, or the link is dropped
    if (bytes < sizeof(wire::FrameHeader) || bytes > rest.size()) std::abort();
    if (bytes > sizeof(wire::FrameHeader) + wire::kMaxPayload) std::abort();
    if (channel == 0 || channel > wire::kMaxChannel) return;  // the collector drops the link
    std::vector<std::byte> frame(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(bytes));
    // Stamped out and in again: the same bytes.
    std::vector<std::byte> restamped;
    wire::setChannel(frame.data(), 0);
    wire::appendWithChannel(frame, channel, restamped);
    if (restamped.size() != bytes || std::memcmp(restamped.data(), rest.data(), bytes) != 0) {
      std::abort();
    }
    if (type == static_cast<uint16_t>(wire::FrameType::kClosed)) {
      channels.erase(channel);
    } else {
      bool known = channels.count(channel) > 0;
      if (known || channels.size() < wire::kMaxChannelsPerLink) {
        wire::RecordDecoder& decoder = channels[channel];
        wire::Frame decoded;
        size_t consumed = 0;
        std::string error;
        wire::DecodeStatus status = wire::decodeFrame(frame, &decoded, &consumed, &error, &decoder);
        if (status == wire::DecodeStatus::kNeedMore) std::abort();  // a whole frame was split
        if (status == wire::DecodeStatus::kFrame && consumed != bytes) std::abort();
        if (status != wire::DecodeStatus::kFrame) channels.erase(channel);  // that agent only
      }
    }
    if (channels.size() > wire::kMaxChannelsPerLink) std::abort();
    rest = rest.subspan(bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  readDirect(bytes);
  readRelayLink(bytes);
  return 0;
}
