#include "interpose/nvtx_ranges.h"

#include <nccl.h>
#include <nvtx3/nvToolsExt.h>
#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ncclwatch::interpose {
namespace {

using detail::g_nvtxState;
using detail::kNvtxOff;
using detail::kNvtxOn;
nvtxDomainHandle_t g_domain = nullptr;
std::once_flag g_decideOnce;

// Categories of the domain: one per kind of operation, so a timeline can filter or colour them.
enum Category : uint32_t { kCollective = 1, kPointToPoint = 2, kLifecycle = 3, kOther = 4 };

Category categoryOf(trace::OpKind op) {
  if (trace::isCollective(op)) return kCollective;
  if (trace::isPointToPoint(op)) return kPointToPoint;
  if (trace::isLifecycle(op)) return kLifecycle;
  return kOther;
}

uint32_t colorOf(Category category) {
  switch (category) {
    case kCollective:
      return 0xff76b900;
    case kPointToPoint:
      return 0xff1f77b4;
    case kLifecycle:
      return 0xffff7f0e;
    case kOther:
      break;
  }
  return 0xff7f7f7f;
}

// NCCLWATCH_NVTX: 1/on (default) or 0/off; anything else says so once and keeps the default.
bool settingOn() {
  const char* text = std::getenv("NCCLWATCH_NVTX");
  if (text == nullptr || *text == '\0') return true;
  if (strcasecmp(text, "1") == 0 || strcasecmp(text, "on") == 0) return true;
  if (strcasecmp(text, "0") == 0 || strcasecmp(text, "off") == 0) return false;
  std::fprintf(stderr, "[ncclwatch] NCCLWATCH_NVTX=%s is not 1/on or 0/off; using on\n", text);
  return true;
}

// NVTX attaches a tool to a preloaded library only through NVTX_INJECTION64_PATH: without it,
// every NVTX call would be a no-op, and formatting the message would be wasted.
bool toolNamed() {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  return path != nullptr && *path != '\0';
}

void decide() {
  uint8_t state = kNvtxOff;
  if (settingOn() && toolNamed()) {
    // The first NVTX call loads the tool. A tool that failed to load, or that does not handle
    // domains, returns no domain: then a NULL handle would mean NVTX's default domain, so
    // nothing is emitted at all.
    g_domain = nvtxDomainCreateA("ncclwatch");
    if (g_domain != nullptr) {
      nvtxDomainNameCategoryA(g_domain, kCollective, "collective");
      nvtxDomainNameCategoryA(g_domain, kPointToPoint, "p2p");
      nvtxDomainNameCategoryA(g_domain, kLifecycle, "lifecycle");
      nvtxDomainNameCategoryA(g_domain, kOther, "other");
      state = kNvtxOn;
    }
  }
  g_nvtxState.store(state, std::memory_order_release);
}

// Appends to a fixed buffer, always NUL-terminated, silently truncating.
class Line {
 public:
  Line(char* buffer, size_t size) : at_(buffer), end_(buffer + size - 1) { *at_ = '\0'; }

  Line& text(const char* text) {
    while (*text != '\0' && at_ < end_) *at_++ = *text++;
    *at_ = '\0';
    return *this;
  }
  Line& hex16(uint64_t value) {
    char digits[17];
    for (int i = 15; i >= 0; --i) {
      digits[i] = "0123456789abcdef"[value & 0xf];
      value >>= 4;
    }
    digits[16] = '\0';
    return text(digits);
  }
  Line& decimal(uint64_t value) {
    char digits[21];
    int i = 20;
    digits[i] = '\0';
    do {
      digits[--i] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    return text(digits + i);
  }

 private:
  char* at_;
  char* end_;
};

}  // namespace

bool detail::decideNvtxRanges() {
  try {
    std::call_once(g_decideOnce, decide);
  } catch (...) {
    return false;  // undecided: asked again next time
  }
  return g_nvtxState.load(std::memory_order_acquire) == kNvtxOn;
}

void nvtxPushCall(trace::OpKind op, uint64_t commHash, uint64_t seq, uint64_t count, int dtype) {
  if (!nvtxRangesEnabled()) return;
  char message[128];
  Line line(message, sizeof message);
  line.text(trace::opName(op)).text(" comm=").hex16(commHash).text(" seq=").decimal(seq);
  if (trace::isCollective(op) || trace::isPointToPoint(op)) {
    uint64_t bytes = 0;
    uint64_t size = static_cast<uint64_t>(trace::dtypeBytes(dtype));
    if (size != 0 && !__builtin_mul_overflow(count, size, &bytes)) {
      line.text(" bytes=").decimal(bytes);
    } else {
      line.text(" count=").decimal(count);
    }
  }
  Category category = categoryOf(op);
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.category = category;
  attributes.colorType = NVTX_COLOR_ARGB;
  attributes.color = colorOf(category);
  attributes.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  attributes.payload.ullValue = seq;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = message;
  nvtxDomainRangePushEx(g_domain, &attributes);
}

void nvtxPopCall() {
  if (!nvtxRangesEnabled()) return;
  nvtxDomainRangePop(g_domain);
}

}  // namespace ncclwatch::interpose
