// libFuzzer target: the collector's frame decoder must take any bytes a network peer sends
// without crashing or reading out of bounds, consume whole frames only, and never hand out more
// entries than the frame's bounds allow.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "trace/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ncclwatch::trace;
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data), size);
  for (;;) {
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    wire::DecodeStatus status = wire::decodeFrame(rest, &frame, &consumed, &error);
    if (status != wire::DecodeStatus::kFrame) {
      if (status == wire::DecodeStatus::kInvalid && error.empty()) std::abort();
      return 0;
    }
    if (consumed < sizeof(wire::FrameHeader) || consumed > rest.size()) std::abort();
    if (frame.records.size() > wire::kMaxRecordsPerFrame) std::abort();
    if (frame.comms.size() > kCommTableCapacity) std::abort();
    if (frame.reason.size() > 1024) std::abort();
    rest = rest.subspan(consumed);
  }
}
