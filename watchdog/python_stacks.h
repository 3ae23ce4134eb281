// Python stacks of all threads of the host process, when it is CPython, taken by the watchdog
// (a non-Python thread with every signal blocked) at hang time, without ever taking the GIL.
//
// The Python C API is only reached through dlsym: the library links nothing but libc/libstdc++.
// Routes, best first (chosen once, by preparePythonStacks):
//  1. kDumpTracebackThreads: PyUnstable_DumpTracebackThreads (3.15+) or _Py_DumpTracebackThreads
//     (exported by 3.8, 3.11, 3.12), called directly from the watchdog into a memfd. The same
//     code CPython's own faulthandler watchdog thread runs without the GIL.
//  2. kFaulthandler (opt-in, NCCLWATCH_PY_ROUTE=faulthandler: once, under load, CPython 3.9
//     crashed inside faulthandler's handler while its main thread ran without the GIL): a
//     pending call (Py_AddPendingCall, run by the main thread with the GIL)
//     registers faulthandler on a real-time signal, writing into a memfd we own, all_threads and
//     chain=True. chain goes to our own handler, installed first, which tells the watchdog that
//     faulthandler has finished writing. At hang time the watchdog sends the signal to the main
//     thread (tgkill).
//  3. kUnavailable: a one-line reason instead of stacks.
// NCCLWATCH_PY_ROUTE=faulthandler allows route 2, =dump allows route 1 only (the default), =off
// disables Python stacks.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ncclwatch::watchdog {

enum class PythonStackRoute { kNotPython, kDumpTracebackThreads, kFaulthandler, kUnavailable };

// The faulthandler signal used when preparePythonStacks gets 0: SIGRTMIN + this.
inline constexpr int kDefaultPythonSignalOffset = 4;

// Called once early on an application thread (e.g. at the first communicator init). Detects
// CPython (Py_IsInitialized found by dlsym and true), resolves every symbol needed later, and
// picks the route; for kFaulthandler it schedules the registration (Py_AddPendingCall), which
// runs the next time the main thread runs Python code. `faulthandlerSignal` must be a real-time
// signal, 0 meaning SIGRTMIN + kDefaultPythonSignalOffset. Never takes the GIL, never blocks.
// Idempotent in a process; a forked child prepares again.
PythonStackRoute preparePythonStacks(int faulthandlerSignal);

// From the watchdog thread at hang time: writes the Python stacks of all threads as CPython's
// traceback text into `out` (at most maxBytes, cut at a line end; route 2 waits at most
// `timeout` for the main thread's handler). Returns the route that produced the text. On
// kUnavailable, `out` holds one line "Python stacks not available on this Python (3.x): <why>";
// on kNotPython, `out` is empty. Route 1 is a synchronous call bounded by CPython itself (100
// threads of 100 frames). Never takes the GIL, never calls the loader, allocates only `out`.
PythonStackRoute dumpPythonStacks(std::string* out, size_t maxBytes,
                                  std::chrono::milliseconds timeout);

// CPython's traceback text ("Thread 0x... (most recent call first):", "Current thread 0x...",
// '  File "x.py", line 12 in func') parsed into frames, innermost first. Lines it does not know
// are skipped; `line` is -1 when CPython printed "???". Safe on any input.
struct PythonFrame {
  std::string file;
  int line = -1;
  std::string function;
};
struct PythonThreadStack {
  uint64_t threadId = 0;  // pthread id as CPython prints it; 0 for a "Stack (...)" block
  bool current = false;   // "Current thread": the thread that dumped (route 2: the main thread)
  std::vector<PythonFrame> frames;
};
std::vector<PythonThreadStack> parsePythonTraceback(std::string_view text);

}  // namespace ncclwatch::watchdog
