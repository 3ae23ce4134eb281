#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace simtest {

double nowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool check(bool condition, const RankContext& context, const std::string& what) {
  if (!condition)
    std::fprintf(stderr, "rank %d/%d: check failed: %s\n", context.rank, context.nranks,
                 what.c_str());
  return condition;
}

ncclComm_t initComm(const RankContext& context) {
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, context.nranks, context.id, context.rank) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: ncclCommInitRank failed: %s\n", context.rank,
                 ncclGetLastError(nullptr));
    return nullptr;
  }
  return comm;
}

bool streamDrainsWithin(cudaStream_t stream, double seconds) {
  const double deadline = nowSeconds() + seconds;
  while (nowSeconds() < deadline) {
    if (cudaStreamQuery(stream) == cudaSuccess) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cudaStreamQuery(stream) == cudaSuccess;
}

std::string JobResult::summary() const {
  std::string text = timedOut ? "job timed out\n" : "";
  for (size_t r = 0; r < exitCodes.size(); ++r) {
    text += "rank " + std::to_string(r) + " exit " + std::to_string(exitCodes[r]);
    if (!err[r].empty()) text += ", stderr:\n" + err[r];
    text += "\n";
  }
  return text;
}

bool JobResult::allExitedZero() const {
  if (timedOut) return false;
  for (int code : exitCodes)
    if (code != 0) return false;
  return true;
}

JobResult runJob(const JobOptions& options,
                 const std::function<int(const RankContext&)>& scenario) {
  JobResult result;
  if (ncclGetUniqueId(&result.id) != ncclSuccess) {
    result.timedOut = true;
    return result;
  }
  const double start = nowSeconds();
  std::vector<pid_t> children(options.nranks, -1);
  std::vector<std::string> errFiles(options.nranks);
  std::fflush(nullptr);
  for (int rank = 0; rank < options.nranks; ++rank) {
    char path[] = "/tmp/ncclsim-test-XXXXXX";
    const int errFd = mkstemp(path);
    errFiles[rank] = path;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(errFd, 2);
      close(errFd);
      // Eight GPUs a host, as a real job of more ranks spans hosts: NCCL refuses two ranks of one
      // communicator on one GPU of one host.
      setenv("NCCL_HOSTID", ("simhost" + std::to_string(rank / 8)).c_str(), 1);
      for (auto& [name, value] : options.env) setenv(name.c_str(), value.c_str(), 1);
      int code = 1;
      try {
        cudaSetDevice(rank % 8);
        code = scenario(RankContext{rank, options.nranks, result.id});
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: exception: %s\n", rank, error.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    close(errFd);
    children[rank] = pid;
  }
  result.exitCodes.assign(options.nranks, -1);
  int running = options.nranks;
  const double deadline = start + options.timeoutMs / 1000.0;
  while (running > 0) {
    for (int rank = 0; rank < options.nranks; ++rank) {
      if (children[rank] < 0) continue;
      int status = 0;
      if (waitpid(children[rank], &status, WNOHANG) == children[rank]) {
        result.exitCodes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        children[rank] = -1;
        --running;
      }
    }
    if (running == 0) break;
    if (nowSeconds() > deadline) {
      result.timedOut = true;
      for (pid_t pid : children)
        if (pid > 0) kill(pid, SIGKILL);
      for (int rank = 0; rank < options.nranks; ++rank) {
        if (children[rank] > 0) waitpid(children[rank], nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  result.seconds = nowSeconds() - start;
  for (int rank = 0; rank < options.nranks; ++rank) {
    result.err.push_back(readFile(errFiles[rank]));
    unlink(errFiles[rank].c_str());
  }
  return result;
}

}  // namespace simtest
