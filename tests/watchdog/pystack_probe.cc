// A test-only Python extension-free module: loaded by pystack_script.py through ctypes, it runs
// the watchdog's Python stack calls inside a real CPython process.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "watchdog/python_stacks.h"

namespace nw = ncclwatch::watchdog;

extern "C" __attribute__((visibility("default"))) int probe_prepare() {
  return static_cast<int>(nw::preparePythonStacks(0));
}

// Dumps from a fresh thread with every signal blocked, like the watchdog; returns the route and
// writes the NUL-terminated text into buf.
extern "C" __attribute__((visibility("default"))) int probe_dump(char* buf, size_t n) {
  if (buf == nullptr || n == 0) return -1;
  const char* timeoutEnv = std::getenv("NW_PROBE_TIMEOUT_MS");
  const std::chrono::milliseconds timeout(timeoutEnv != nullptr ? std::atoi(timeoutEnv) : 2000);
  std::string text;
  nw::PythonStackRoute route = nw::PythonStackRoute::kUnavailable;
  std::thread dumper([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    route = nw::dumpPythonStacks(&text, n - 1, timeout);
  });
  dumper.join();
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  return static_cast<int>(route);
}
