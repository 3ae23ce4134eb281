// An NCCL program (one rank, on the sim) with the habits of real jobs that ncclwatch must not
// change: its own signal handlers, forked workers, thousands of communicators, dumps it asks
// for. Each mode prints what it did and exits with a status the test compares with the run
// without ncclwatch.
//
//   job_probe signals --handler none|before|after [--terms N] [--segv N]
//       "before"/"after" our first NCCL call, the program installs a SIGTERM handler that counts
//       (and exits 7 at the N-th) and a SIGSEGV handler that makes a guard page readable (as a
//       garbage collector's write barrier does); --segv N touches the guard page N times.
//       Prints "ready" once it loops on allreduces; with no handler SIGTERM ends it.
//   job_probe fork
//       Forks a worker that never execs and leaves through exit() (atexit handlers run), one
//       that leaves through _exit(), and one that execs /bin/true; the parent goes on calling.
//   job_probe comms --count N
//       Creates and destroys N communicators, one allreduce on each, then a last one with
//       10 allreduces.
//   job_probe dumps --threads N
//       Asks for dumps (ncclwatchDump) in a loop with N idle threads; prints "dumping" first.
//   job_probe calls --count N
//       N allreduces as fast as the sim goes (a flood of records for the collector link);
//       prints "calling" first and "calls: N in S s" at the end.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" int ncclwatchDump(int waitMs) __attribute__((weak));

namespace {

std::atomic<int> g_terms{0};
int g_termsToExit = 1;
char* g_guardPage = nullptr;
long g_pageSize = 4096;
std::atomic<int> g_segvs{0};

int fail(const char* what) {
  std::fprintf(stderr, "job_probe: %s\n", what);
  return 2;
}

void say(const char* text) {
  ssize_t ignored = write(STDOUT_FILENO, text, std::strlen(text));
  (void)ignored;
}

void onTerm(int) {
  int count = g_terms.fetch_add(1) + 1;
  say("own SIGTERM handler\n");
  if (count >= g_termsToExit) _exit(7);
}

// A guard-page fault the program expects: it opens the page and the access is retried.
void onSegv(int, siginfo_t* info, void*) {
  char* address = static_cast<char*>(info->si_addr);
  if (g_guardPage == nullptr || address < g_guardPage || address >= g_guardPage + g_pageSize) {
    signal(SIGSEGV, SIG_DFL);  // not ours: die as the program would
    return;
  }
  g_segvs.fetch_add(1);
  mprotect(g_guardPage, g_pageSize, PROT_READ | PROT_WRITE);
}

void installOwnHandlers() {
  struct sigaction term {};
  term.sa_handler = onTerm;
  sigemptyset(&term.sa_mask);
  sigaction(SIGTERM, &term, nullptr);
  struct sigaction segv {};
  segv.sa_sigaction = onSegv;
  segv.sa_flags = SA_SIGINFO;
  sigemptyset(&segv.sa_mask);
  sigaction(SIGSEGV, &segv, nullptr);
}

struct Rank {
  ncclComm_t comm = nullptr;
  float* buffer = nullptr;
  cudaStream_t stream = nullptr;
};

bool initRank(Rank* rank) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return false;
  if (ncclCommInitRank(&rank->comm, 1, id, 0) != ncclSuccess) return false;
  if (rank->buffer == nullptr && cudaMalloc(&rank->buffer, 1024 * sizeof(float)) != cudaSuccess) {
    return false;
  }
  if (rank->stream == nullptr && cudaStreamCreate(&rank->stream) != cudaSuccess) return false;
  return true;
}

bool allReduce(const Rank& rank) {
  if (ncclAllReduce(rank.buffer, rank.buffer, 1024, ncclFloat, ncclSum, rank.comm, rank.stream) !=
      ncclSuccess) {
    return false;
  }
  return cudaStreamSynchronize(rank.stream) == cudaSuccess;
}

int signals(const std::string& handler, int terms, int segvs) {
  g_termsToExit = terms;
  g_pageSize = sysconf(_SC_PAGESIZE);
  void* page = mmap(nullptr, g_pageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return fail("mmap");
  g_guardPage = static_cast<char*>(page);
  if (handler == "before") installOwnHandlers();
  Rank rank;
  if (!initRank(&rank)) return fail("no communicator");
  if (handler == "after") installOwnHandlers();
  for (int i = 0; i < segvs; ++i) {
    mprotect(g_guardPage, g_pageSize, PROT_NONE);
    *reinterpret_cast<volatile char*>(g_guardPage) = 1;  // faults once, then the handler opens it
  }
  if (segvs > 0) std::printf("guard-page faults handled: %d\n", g_segvs.load());
  std::printf("ready\n");
  std::fflush(stdout);
  for (int i = 0; i < 3000; ++i) {  // ~30 s at most: the test's signals end it long before
    if (!allReduce(rank)) return fail("allreduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 3;
}

int forks() {
  Rank rank;
  if (!initRank(&rank)) return fail("no communicator");
  for (int i = 0; i < 20; ++i) {
    if (!allReduce(rank)) return fail("allreduce");
  }
  std::fflush(stdout);
  std::vector<pid_t> workers;
  for (int kind = 0; kind < 3; ++kind) {
    pid_t pid = fork();
    if (pid < 0) return fail("fork");
    if (pid == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (kind == 0) std::exit(0);  // atexit handlers run in the worker
      if (kind == 1) _exit(0);
      execl("/bin/true", "true", static_cast<char*>(nullptr));
      _exit(127);
    }
    workers.push_back(pid);
  }
  for (int i = 0; i < 40; ++i) {  // the parent keeps training while its workers run
    if (!allReduce(rank)) return fail("allreduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int failed = 0;
  for (pid_t pid : workers) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ncclCommDestroy(rank.comm);
  std::printf("workers failed: %d; parent calls: 60\n", failed);
  return failed == 0 ? 0 : 1;
}

int comms(int count) {
  Rank rank;
  for (int i = 0; i < count; ++i) {
    if (!initRank(&rank) || !allReduce(rank)) return fail("communicator");
    if (ncclCommDestroy(rank.comm) != ncclSuccess) return fail("ncclCommDestroy");
  }
  if (!initRank(&rank)) return fail("last communicator");
  for (int i = 0; i < 10; ++i) {
    if (!allReduce(rank)) return fail("allreduce");
  }
  ncclCommDestroy(rank.comm);
  std::printf("communicators: %d and a last one\n", count);
  return 0;
}

int dumps(int threads) {
  if (ncclwatchDump == nullptr) return fail("libncclwatch.so is not preloaded");
  Rank rank;
  if (!initRank(&rank) || !allReduce(rank)) return fail("no communicator");
  std::atomic<bool> done{false};
  std::vector<std::thread> idle;
  for (int i = 0; i < threads; ++i) {
    idle.emplace_back([&done] {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
  }
  std::printf("dumping\n");
  std::fflush(stdout);
  for (int i = 0; i < 2000; ++i) {
    allReduce(rank);
    ncclwatchDump(4000);
  }
  done = true;
  for (std::thread& thread : idle) thread.join();
  return 0;
}

int calls(int count) {
  Rank rank;
  if (!initRank(&rank)) return fail("no communicator");
  std::printf("calling\n");
  std::fflush(stdout);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    if (ncclAllReduce(rank.buffer, rank.buffer, 1024, ncclFloat, ncclSum, rank.comm, rank.stream) !=
        ncclSuccess) {
      return fail("allreduce");
    }
    if (i % 64 == 63 && cudaStreamSynchronize(rank.stream) != cudaSuccess) return fail("sync");
  }
  cudaStreamSynchronize(rank.stream);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ncclCommDestroy(rank.comm);
  std::printf("calls: %d in %.2f s\n", count, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return fail("usage: job_probe signals|fork|comms|dumps|calls [options]");
  std::string mode = argv[1];
  std::string handler = "none";
  int terms = 1, segvs = 0, count = 10000, threads = 8;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--handler") handler = argv[i + 1];
    if (name == "--terms") terms = std::atoi(argv[i + 1]);
    if (name == "--segv") segvs = std::atoi(argv[i + 1]);
    if (name == "--count") count = std::atoi(argv[i + 1]);
    if (name == "--threads") threads = std::atoi(argv[i + 1]);
  }
  if (cudaSetDevice(0) != cudaSuccess) return fail("cudaSetDevice");
  if (mode == "signals") return signals(handler, terms, segvs);
  if (mode == "fork") return forks();
  if (mode == "comms") return comms(count);
  if (mode == "dumps") return dumps(threads);
  if (mode == "calls") return calls(count);
  return fail("unknown mode");
}
