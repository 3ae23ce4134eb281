#include "command.h"

#include <sys/wait.h>

#include <cstdio>

namespace testsupport {

Output command(const std::string& line, const std::string& stderrTo) {
  Output out;
  FILE* pipe = popen((line + " " + stderrTo).c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.text.append(buffer, n);
  int status = pclose(pipe);
  out.status = WIFEXITED(status)     ? WEXITSTATUS(status)
               : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                     : -1;
  return out;
}

}  // namespace testsupport
