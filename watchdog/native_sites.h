// Native call sites: the return address a record keeps when its caller ran no Python frame (a
// C++ program, or PyTorch's own threads: DDP's gradient all-reduces come from the autograd
// thread). The watchdog thread finds the new ones in the ring and describes each once by its
// module and offset, a lock-free lookup with no symbol table; the trace file and the collector
// get them as site lines numbered 0 (trace/python_sites.h), and the CLI turns module + offset
// into a function and file:line from the binary on disk (tools/source_lines.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "trace/python_sites.h"
#include "trace/ring_writer.h"

namespace ncclwatch::watchdog {

// Distinct native sites described per process; past it new ones keep their raw address.
inline constexpr size_t kMaxNativeSites = 4096;

class NativeSites {
 public:
  // Watchdog thread: the records issued since the last call (the newest ring's worth at most),
  // their native call sites not seen before, as site lines. Allocates only for a new site.
  std::vector<trace::PythonSite> scan(const trace::RingWriter& writer);

 private:
  uint64_t next_ = 0;      // ring index scanned up to
  uint64_t lastSite_ = 0;  // the site of the last native call scanned
  std::unordered_set<uint64_t> seen_;
};

// "path/of/module.so+0x1a2b" for `address` in this process, or "" when no loaded module holds
// it. Reads /proc/self/maps (loaded_modules.h): no loader lock.
std::string moduleOffsetText(uintptr_t address);

}  // namespace ncclwatch::watchdog
