// Starting the helper processes a rank runs beside the job (the sidecar collector, the host's
// relay, the stack helper): posix_spawn only (no fork of a multi-threaded host, no allocation
// in the child), from the watchdog thread.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace ncclwatch::watchdog {

// argv/envp for posix_spawn: pointers into `words`, null-terminated.
std::vector<char*> spawnPointers(std::vector<std::string>& words);

struct DetachedProcess {
  // The program: a path, or a name looked up on PATH.
  std::string program;
  std::vector<std::string> arguments;  // argv, the program's name first
  std::vector<std::string> environment;
  // A descriptor the process gets as its fd 3 (-1: none); it inherits no other beyond 0-2.
  int passedFd = -1;
  // SIGPIPE back to its default too (besides SIGINT and SIGTERM), for a host that ignores it.
  bool defaultSigpipe = false;
};

// Starts `process` detached from the job: stdin /dev/null, stdout joined to the caller's stderr,
// every signal unblocked (the watchdog thread blocks them all, and a child inherits its mask),
// the stopping signals at their defaults, and a process group of its own, so that a launcher
// killing the rank's group leaves it running. 0 and *pid, or posix_spawn's error number.
int spawnDetached(DetachedProcess& process, pid_t* pid);

}  // namespace ncclwatch::watchdog
