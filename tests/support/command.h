// Runs a shell command line for a test and returns what it printed and how it ended.
#pragma once
#include <string>

namespace testsupport {

struct Output {
  int status = -1;  // exit code, 128 + signal for a signal death, -1 if it could not run
  std::string text;
};

// `line` runs under /bin/sh with `stderrTo` appended ("2>&1" by default: stderr with stdout).
Output command(const std::string& line, const std::string& stderrTo = "2>&1");

// A loopback TCP port nothing listened on a moment ago (bound, read, closed), for a collector;
// 0 if none could be bound.
int freeLoopbackPort();

// A socket listening on a loopback port the kernel chose (`*port`), standing in for a collector
// or a relay's collector; -1 if none could be set up.
int listenOnLoopback(int* port);

}  // namespace testsupport
