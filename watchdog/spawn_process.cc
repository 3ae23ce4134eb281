#include "watchdog/spawn_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

namespace ncclwatch::watchdog {

std::vector<char*> spawnPointers(std::vector<std::string>& words) {
  std::vector<char*> result;
  for (std::string& word : words) result.push_back(word.data());
  result.push_back(nullptr);
  return result;
}

int spawnDetached(DetachedProcess& process, pid_t* pid) {
  std::vector<char*> argv = spawnPointers(process.arguments);
  std::vector<char*> envp = spawnPointers(process.environment);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  int firstClosed = STDERR_FILENO + 1;
  if (process.passedFd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, process.passedFd, firstClosed);
    ++firstClosed;
  }
  // A listening socket or pipe of the host kept open by the helper would outlive the host.
  posix_spawn_file_actions_addclosefrom_np(&actions, firstClosed);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, stopping;
  sigemptyset(&none);
  sigemptyset(&stopping);
  sigaddset(&stopping, SIGINT);
  sigaddset(&stopping, SIGTERM);
  if (process.defaultSigpipe) sigaddset(&stopping, SIGPIPE);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &stopping);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  const std::string& program = process.program;
  int error =
      program.find('/') != std::string::npos
          ? posix_spawn(pid, program.c_str(), &actions, &attributes, argv.data(), envp.data())
          : posix_spawnp(pid, program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  return error;
}

}  // namespace ncclwatch::watchdog
