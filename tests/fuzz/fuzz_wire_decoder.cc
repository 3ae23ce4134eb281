// libFuzzer target: the collector's frame decoder must take any bytes a network peer sends
// without crashing or reading out of bounds, consume whole frames only, and never hand out more
// entries than the frame's bounds allow. RECORDS frames go through one connection's record
// decoder, whose delta bases carry over from frame to frame as on a real connection; and every
// record decoded must encode again, from an encoder fed the same records, to messages that decode
// to the same records (the format has one meaning for each message).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "trace/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ncclwatch::trace;
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data), size);
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
      return 0;
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
