// The Python line that issued an NCCL call. PyTorch calls NCCL from C++ with the GIL released,
// while the calling thread's Python frames stay put: the wrapper reads them on that thread,
// without the GIL, as (code object, instruction offset) pairs of the innermost frames, and keeps
// each distinct path once in a site table. The call's record stores the site's number in its
// callSite word (tagged, below). The watchdog thread later turns new sites into text (file:line
// and function of each frame) by reading the code objects with bounds-checked reads of its own
// memory, so a code object freed since can never fault; the text goes into the trace file and
// to the collector, where verdicts show "issued at".
//
// Supported: CPython 3.10-3.13 (default builds, x86-64 and other LP64 targets). Each version's
// struct offsets are pinned in python_sites.cc and checked once per process against the live
// interpreter before the fast path is used; anything else leaves sites off (native call sites
// only).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "trace/python_sites.h"

namespace ncclwatch::watchdog {

inline constexpr int kSiteFrames = 6;  // innermost Python frames kept per site

namespace detail {
// Mirrors the site table's state (off, or CPython found): a constant-initialized global, so the
// hot path's check is one load with no call and no guard, and stays valid during exit.
inline std::atomic<bool> g_pythonSitesOn{false};
}  // namespace detail

// Whether sites are being recorded (CPython found; its layout is checked at the first site).
// Cheap: the hot path asks it on every call.
inline bool pythonSitesOn() {
  return detail::g_pythonSitesOn.load(std::memory_order_relaxed);
}
// At recorder start (any thread): looks for CPython in the process; a no-op elsewhere.
// NCCLWATCH_PY_SITES=0 turns sites off.
void preparePythonSites();
// Hot path: the calling thread's Python site as a tagged callSite, or `nativeSite` when the thread
// runs no Python frame or the site table is full (counted).
uint64_t pythonCallSite(uint64_t nativeSite);

// Watchdog thread: the sites added since the last call, resolved to text (trace/python_sites.h).
std::vector<trace::PythonSite> resolveNewPythonSites();

struct PythonSiteCounters {
  uint64_t sites = 0;    // distinct sites recorded
  uint64_t dropped = 0;  // calls whose site did not fit the table
};
PythonSiteCounters pythonSiteCounters();

}  // namespace ncclwatch::watchdog
