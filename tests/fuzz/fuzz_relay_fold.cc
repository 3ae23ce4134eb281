// The relay's folding (tools/relay_fold.h) fed what hostile or broken agents could send: the
// input's frames, each on the channel its header's reserved field picks (1 to 8), in order, with
// the relay's ticks between them. Whatever the relay lets through must be frames the collector
// decodes: each on a channel, each channel's RECORDS decoded with that channel's own bases (the
// relay re-encodes them), FOLDED within its bound. A frame the relay refuses ends that agent, as
// the relay process does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tools/relay_fold.h"
#include "trace/wire.h"

namespace {

namespace wire = ncclwatch::trace::wire;

struct Collector {
  std::map<uint32_t, wire::RecordDecoder> decoders;
  std::vector<std::byte> pending;

  // Every whole frame the relay wrote so far, as the collector's reader takes a relay link.
  void read(std::vector<std::byte>& out) {
    pending.insert(pending.end(), out.begin(), out.end());
    out.clear();
    std::span<std::byte> rest(pending);
    while (!rest.empty()) {
      size_t bytes = 0;
      uint32_t channel = 0;
      uint16_t type = 0;
      if (wire::splitFrame(rest, &bytes, &channel, &type) != wire::SplitStatus::kFrame) {
        std::abort();  // the relay writes whole frames only
      }
      if (channel == 0 || channel > wire::kMaxChannel) std::abort();
      std::vector<std::byte> frame(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(bytes));
      wire::setChannel(frame.data(), 0);
      wire::Frame decoded;
      size_t consumed = 0;
      std::string error;
      wire::DecodeStatus status =
          wire::decodeFrame(frame, &decoded, &consumed, &error, &decoders[channel]);
      // An agent's frame of another version goes on as it came (the collector refuses it).
      if (status == wire::DecodeStatus::kOtherVersion) {
        decoders.erase(channel);
      } else if (status != wire::DecodeStatus::kFrame || consumed != bytes) {
        // The relay passes HELLO, COMMS, WAITS, SITES and BYE on as they came, so an agent's
        // broken frame of those kinds reaches the collector broken (which drops that channel);
        // what the relay encodes itself must decode.
        if (type == static_cast<uint16_t>(wire::FrameType::kRecords) ||
            type == static_cast<uint16_t>(wire::FrameType::kFolded)) {
          std::abort();
        }
        decoders.erase(channel);
      }
      if (decoded.folded.size() > wire::kMaxFoldedNotes) std::abort();
      rest = rest.subspan(bytes);
    }
    pending.clear();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ncclwatch::relay::FoldOptions options;
  options.holdNs = 50;
  options.noteEveryNs = 20;
  ncclwatch::relay::Folder folder(options);
  Collector collector;
  std::vector<std::byte> out;
  std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data), size);
  int64_t now = 0;
  while (!rest.empty()) {
    size_t bytes = 0;
    uint32_t stamp = 0;
    uint16_t type = 0;
    if (wire::splitFrame(rest, &bytes, &stamp, &type) != wire::SplitStatus::kFrame) break;
    std::vector<std::byte> frame(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(bytes));
    uint32_t channel = stamp % 8 + 1;
    wire::setChannel(frame.data(), 0);
    if (!folder.agentFrame(channel, frame, now, out)) folder.agentEnded(channel, out);
    now += 10 + stamp % 64;
    folder.tick(now, out);
    collector.read(out);
    rest = rest.subspan(bytes);
  }
  for (uint32_t channel = 1; channel <= 8; ++channel) folder.agentEnded(channel, out);
  folder.tick(now + 1000, out);
  collector.read(out);
  if (folder.heldRecords() != 0) std::abort();  // every agent ended: nothing may stay held
  return 0;
}
