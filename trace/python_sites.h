// Python call sites as the trace file and the wire carry them: one line per site,
// "<number> 0x<native return address> <frame> | <frame> | ...", innermost frame first, each
// frame "path/to/file.py:88 qualified.name" (line -1 when unknown). Written by the watchdog
// (watchdog/python_sites.h), read by the CLI and the collector; records refer to a site by
// number in their tagged callSite word.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ncclwatch::trace {

struct PythonSite {
  uint32_t number = 0;
  uint64_t nativeSite = 0;
  std::vector<std::string> frames;  // innermost first
};

// Site lines numbered 0 describe a native call site (a record whose caller ran no Python frame):
// nativeSite is the return address, the first frame "path/of/module.so+0x1a2b", its module and
// offset (watchdog/native_sites.h), and a second one, when known, "thread NAME": the thread of
// the site's first call. The CLI finds the function and line from the binary.
inline constexpr uint32_t kNativeSiteNumber = 0;
inline constexpr std::string_view kNativeSiteThreadPrefix = "thread ";

// Records whose callSite has this bit carry a Python site number in their low 32 bits
// (user-space return addresses never have it).
inline constexpr uint64_t kPythonSiteTag = 1ull << 63;
inline bool isPythonSite(uint64_t callSite) {
  return (callSite & kPythonSiteTag) != 0;
}
inline uint32_t pythonSiteNumber(uint64_t callSite) {
  return static_cast<uint32_t>(callSite);
}

std::string formatPythonSites(const std::vector<PythonSite>& sites);
// Appends the sites of `text` to `sites`; false with a one-line `error` naming the first bad line
// (the lines before it are kept).
bool parsePythonSites(std::string_view text, std::vector<PythonSite>* sites, std::string* error);

// Where a user means by "issued at": from the innermost frame outside the Python standard library
// and the installed packages that wrap NCCL (torch, site-packages in general), that frame and its
// caller, "train.py:88 step ← train.py:120 main" (from the innermost frame when every frame is
// such a frame). Empty when the site has no frames.
std::string issuedAtText(const PythonSite& site);
// The torch.distributed function the user's code called to issue the site's call ("barrier",
// "all_reduce", "batch_isend_irecv"): the library frame right inside the first user frame, past
// decorators; "" when that frame is not in torch/distributed or the site has no user frame.
std::string pythonApiOf(const PythonSite& site);

}  // namespace ncclwatch::trace
