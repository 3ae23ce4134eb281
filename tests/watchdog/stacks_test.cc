// watchdog/stacks: every thread's native stack, taken by signalling it, under the conditions
// a hang dump meets: threads that block the signal, threads inside malloc or the loader, a
// thread stuck while holding the loader's lock, a handler installed before ours, two callers.
#include "watchdog/stacks.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ncclwatch::watchdog {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

int ourSignal() {
  return SIGRTMIN + StackSampler::kDefaultSignalOffset;
}
int currentTid() {
  return static_cast<int>(syscall(SYS_gettid));
}

// A handler installed before ours: it must still see every signal that is not our request.
std::atomic<int> g_previousCalls{0};
std::atomic<int> g_previousLastValue{0};
void previousHandler(int, siginfo_t* info, void*) {
  g_previousCalls.fetch_add(1);
  if (info->si_code == SI_QUEUE) g_previousLastValue.store(info->si_value.sival_int);
}

class SamplerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = previousHandler;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ASSERT_EQ(sigaction(ourSignal(), &action, nullptr), 0);
    std::string error;
    ASSERT_TRUE(StackSampler::install(ourSignal(), &error)) << error;
  }
};
const auto* g_environment = ::testing::AddGlobalTestEnvironment(new SamplerEnvironment);

// ---------------------------------------------------------------------------------------------
// Threads parked in functions with distinct names. noipa: no inlining, cloning or merging of
// identical bodies, so each name survives in the stack.

__attribute__((noipa)) void parkLoop(const std::atomic<bool>* stop, int tag) {
  while (!stop->load()) usleep(1000 + tag);
}
__attribute__((noipa)) void parkedInAlpha(const std::atomic<bool>* stop) {
  parkLoop(stop, 1);
  asm volatile("" ::: "memory");
}
__attribute__((noipa)) void parkedInBravo(const std::atomic<bool>* stop) {
  parkLoop(stop, 2);
  asm volatile("" ::: "memory");
}
__attribute__((noipa)) void parkedInCharlie(const std::atomic<bool>* stop) {
  parkLoop(stop, 3);
  asm volatile("" ::: "memory");
}
__attribute__((noipa)) void parkedInDelta(const std::atomic<bool>* stop) {
  parkLoop(stop, 4);
  asm volatile("" ::: "memory");
}

// Threads that publish their tid and run `body` until stopped.
class ThreadGroup {
 public:
  ~ThreadGroup() { stopAll(); }
  int start(const std::string& name, std::function<void(const std::atomic<bool>*)> body) {
    std::atomic<int> tid{0};
    threads_.emplace_back([this, &tid, name, body] {
      pthread_setname_np(pthread_self(), name.c_str());
      {
        std::lock_guard<std::mutex> lock(idsLock_);
        pthreadIds_[currentTid()] = static_cast<uintptr_t>(pthread_self());
      }
      tid.store(currentTid());
      body(&stop_);
    });
    while (tid.load() == 0) std::this_thread::yield();
    return tid.load();
  }
  // What pthread_self() returned in the thread of `tid`.
  uintptr_t pthreadIdOf(int tid) {
    std::lock_guard<std::mutex> lock(idsLock_);
    return pthreadIds_[tid];
  }
  void stopAll() {
    stop_.store(true);
    for (auto& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex idsLock_;
  std::map<int, uintptr_t> pthreadIds_;
};

const ThreadStack* find(const std::vector<ThreadStack>& slots, size_t count, int tid) {
  for (size_t i = 0; i < count; ++i) {
    if (slots[i].tid == tid) return &slots[i];
  }
  return nullptr;
}

std::string describe(const ThreadStack& stack) {
  std::string out = "tid " + std::to_string(stack.tid) + " (" + stack.name + ")";
  if (!stack.answered) {
    return out + " did not answer; wchan=" + stack.wchan + " syscall=" + stack.syscall;
  }
  for (const Frame& frame : symbolize(std::span(stack.pcs, stack.frameCount))) {
    out += "\n  " + formatFrame(frame);
  }
  return out;
}

bool stackHasFunction(const ThreadStack& stack, const std::string& function) {
  for (const Frame& frame : symbolize(std::span(stack.pcs, stack.frameCount))) {
    if (frame.function.find(function) != std::string::npos) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------

TEST(StackSampler, InstallIsIdempotentAndRejectsOtherSignals) {
  std::string error;
  EXPECT_TRUE(StackSampler::install(ourSignal(), &error)) << error;
  EXPECT_FALSE(StackSampler::install(ourSignal() + 1, &error));
  EXPECT_NE(error.find("already installed"), std::string::npos) << error;
  EXPECT_EQ(StackSampler::signalNumber(), ourSignal());
}

TEST(StackSampler, EachThreadShowsTheFunctionItIsParkedIn) {
  ThreadGroup group;
  const int alpha = group.start("nw-alpha", parkedInAlpha);
  const int bravo = group.start("nw-bravo", parkedInBravo);
  const int charlie = group.start("nw-charlie", parkedInCharlie);
  const int delta = group.start("nw-delta", parkedInDelta);
  std::this_thread::sleep_for(milliseconds(20));

  std::vector<ThreadStack> slots(64);
  const CaptureResult result = StackSampler::captureAll(slots, milliseconds(2000));
  ASSERT_FALSE(result.busy);
  ASSERT_GE(result.count, 5u);
  EXPECT_EQ(result.count, result.threads);

  // Slot 0 is the caller, unwound directly.
  EXPECT_EQ(slots[0].tid, currentTid());
  EXPECT_TRUE(slots[0].answered);
  EXPECT_TRUE(stackHasFunction(slots[0], "EachThreadShowsTheFunctionItIsParkedIn"))
      << describe(slots[0]);

  const std::pair<int, const char*> expected[] = {{alpha, "parkedInAlpha"},
                                                  {bravo, "parkedInBravo"},
                                                  {charlie, "parkedInCharlie"},
                                                  {delta, "parkedInDelta"}};
  for (const auto& [tid, function] : expected) {
    const ThreadStack* stack = find(slots, result.count, tid);
    ASSERT_NE(stack, nullptr) << function;
    ASSERT_TRUE(stack->answered) << describe(*stack);
    EXPECT_TRUE(stackHasFunction(*stack, function)) << describe(*stack);
    EXPECT_TRUE(stackHasFunction(*stack, "parkLoop")) << describe(*stack);
    EXPECT_EQ(std::string(stack->name).rfind("nw-", 0), 0u) << stack->name;
    // The handler's own frames are not part of the stack: it starts where the signal hit.
    EXPECT_FALSE(stackHasFunction(*stack, "serveRequest")) << describe(*stack);
    // Its pthread id, read in the thread itself: what CPython names its Python stack by.
    EXPECT_EQ(stack->pthreadId, group.pthreadIdOf(tid)) << function;
    EXPECT_NE(stack->pthreadId, 0u) << function;
  }
  EXPECT_EQ(slots[0].pthreadId, static_cast<uintptr_t>(pthread_self()));
  std::printf("%s\n", describe(*find(slots, result.count, alpha)).c_str());
}

TEST(StackSampler, SymbolizeNamesHiddenFunctionsModulesAndBuildIds) {
  // A function of this executable in an anonymous namespace: only .symtab knows it.
  const auto pc = reinterpret_cast<uintptr_t>(&parkedInCharlie);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
    EXPECT_EQ(info.dli_sname, nullptr) << "dladdr is not expected to see a local symbol";
  }
  const uintptr_t pcs[] = {pc + 1, reinterpret_cast<uintptr_t>(&getpid) + 1};
  const std::vector<Frame> frames = symbolize(pcs);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_NE(frames[0].function.find("parkedInCharlie"), std::string::npos) << frames[0].function;
  EXPECT_EQ(frames[0].functionOffset, 1u);
  EXPECT_NE(frames[0].module.find("watchdog_stacks_test"), std::string::npos) << frames[0].module;
  EXPECT_NE(frames[1].function.find("getpid"), std::string::npos) << formatFrame(frames[1]);
  EXPECT_NE(frames[1].module.find("libc.so"), std::string::npos) << frames[1].module;
  EXPECT_FALSE(frames[1].buildId.empty());
  EXPECT_EQ(frames[1].buildId.size() % 2, 0u);
}

TEST(StackSampler, ThreadThatBlocksTheSignalIsReportedFromProcInTime) {
  std::atomic<bool> unblock{false};
  std::atomic<bool> unblocked{false};
  ThreadGroup group;
  const int blocked = group.start("nw-blocked", [&](const std::atomic<bool>* stop) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, ourSignal());
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    while (!unblock.load()) usleep(1000);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // our late signal arrives here
    unblocked.store(true);
    parkedInAlpha(stop);
  });
  std::this_thread::sleep_for(milliseconds(20));
  const int previousBefore = g_previousCalls.load();

  std::vector<ThreadStack> slots(64);
  const auto started = Clock::now();
  const CaptureResult result = StackSampler::captureAll(slots, milliseconds(200));
  const auto elapsed = Clock::now() - started;
  const ThreadStack* stack = find(slots, result.count, blocked);
  ASSERT_NE(stack, nullptr);
  EXPECT_FALSE(stack->answered);
  EXPECT_EQ(stack->frameCount, 0);
  EXPECT_STREQ(stack->name, "nw-blocked");
  EXPECT_TRUE(stack->wchan[0] != '\0' || stack->syscall[0] != '\0');
  EXPECT_LT(elapsed, milliseconds(200) + milliseconds(1500));
  std::printf("%s\n", describe(*stack).c_str());

  // The signal stays queued; when the thread unblocks it, it is recognized as ours (stale) and
  // neither answered into a later capture nor passed to the previous handler.
  unblock.store(true);
  while (!unblocked.load()) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(g_previousCalls.load(), previousBefore);
  const CaptureResult again = StackSampler::captureAll(slots, milliseconds(2000));
  stack = find(slots, again.count, blocked);
  ASSERT_NE(stack, nullptr);
  EXPECT_TRUE(stack->answered);
  EXPECT_TRUE(stackHasFunction(*stack, "parkedInAlpha")) << describe(*stack);
}

TEST(StackSampler, PreviousHandlerStillGetsSignalsThatAreNotOurs) {
  const int before = g_previousCalls.load();
  // From sigqueue (SI_QUEUE): not a request.
  sigval value;
  value.sival_int = 4242;
  ASSERT_EQ(sigqueue(getpid(), ourSignal(), value), 0);
  // (One at a time: TSan keeps one deferred signal per number and thread.)
  auto deadline = Clock::now() + milliseconds(2000);
  while (g_previousCalls.load() < before + 1 && Clock::now() < deadline) usleep(1000);
  // From tgkill (SI_TKILL, our pid) without a request pending for this thread.
  ASSERT_EQ(syscall(SYS_tgkill, getpid(), currentTid(), ourSignal()), 0);
  deadline = Clock::now() + milliseconds(2000);
  while (g_previousCalls.load() < before + 2 && Clock::now() < deadline) usleep(1000);
  EXPECT_EQ(g_previousCalls.load(), before + 2);
  EXPECT_EQ(g_previousLastValue.load(), 4242);

  // Our own requests never reach it.
  ThreadGroup group;
  group.start("nw-alpha", parkedInAlpha);
  std::vector<ThreadStack> slots(64);
  for (int i = 0; i < 5; ++i) StackSampler::captureAll(slots, milliseconds(2000));
  EXPECT_EQ(g_previousCalls.load(), before + 2);
}

// TSan does not see the loader's own lock and reports dlopen/dlclose in two threads as a race
// inside ld.so; under TSan the two loader threads take turns (captures still interrupt them
// inside the loader).
#if defined(__SANITIZE_THREAD__)
std::mutex g_loaderTurns;
struct LoaderGuard {
  LoaderGuard() { g_loaderTurns.lock(); }
  ~LoaderGuard() { g_loaderTurns.unlock(); }
};
#else
struct LoaderGuard {};
#endif

// malloc/free, dlopen/dlclose (of a loaded and of an unloaded library) while captures run.
TEST(StackSampler, CapturesWhileThreadsHammerMallocAndTheLoader) {
  ThreadGroup group;
  auto mallocLoop = [](const std::atomic<bool>* stop) {
    unsigned seed = 1;
    std::vector<void*> blocks(64, nullptr);
    while (!stop->load()) {
      seed = seed * 1103515245 + 12345;
      void*& block = blocks[seed % blocks.size()];
      std::free(block);
      block = std::malloc(16 + (seed >> 8) % 8192);
    }
    for (void* block : blocks) std::free(block);
  };
  auto loaderLoop = [](const std::atomic<bool>* stop) {
    const char* libraries[] = {"libm.so.6", "libexpat.so.1", "libbz2.so.1"};
    for (unsigned i = 0; !stop->load(); ++i) {
      [[maybe_unused]] LoaderGuard guard;
      void* handle = dlopen(libraries[i % 3], RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) dlclose(handle);
    }
  };
  auto mixedLoop = [](const std::atomic<bool>* stop) {
    for (unsigned i = 0; !stop->load(); ++i) {
      void* block = std::malloc(100 + i % 4000);
      {
        [[maybe_unused]] LoaderGuard guard;
        void* handle = dlopen("libexpat.so.1", RTLD_NOW | RTLD_LOCAL);
        if (handle != nullptr) dlclose(handle);
      }
      std::free(block);
    }
  };
  const int tids[] = {group.start("nw-malloc", mallocLoop), group.start("nw-loader", loaderLoop),
                      group.start("nw-mixed", mixedLoop)};

  std::vector<ThreadStack> slots(64);
  int answered = 0;
  int asked = 0;
  const auto started = Clock::now();
  for (int round = 0; round < 200; ++round) {
    const CaptureResult result = StackSampler::captureAll(slots, milliseconds(1000));
    ASSERT_FALSE(result.busy);
    ASSERT_GE(result.count, 4u);
    for (int tid : tids) {
      const ThreadStack* stack = find(slots, result.count, tid);
      ASSERT_NE(stack, nullptr);
      ++asked;
      if (stack->answered && stack->frameCount > 0) ++answered;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("stress: %d of %d stacks answered, 200 captures in %.2f s\n", answered, asked,
              seconds);
  EXPECT_GE(answered, asked * 95 / 100);
}

// A thread stuck inside dl_iterate_phdr holds the loader's lock: capture and symbolization must
// neither wait for it nor skip it.
std::atomic<bool> g_holdLoaderLock{false};
std::atomic<bool> g_insideLoaderLock{false};
__attribute__((noipa)) int stuckInsideDlIteratePhdr(dl_phdr_info*, size_t, void*) {
  g_insideLoaderLock.store(true);
  while (g_holdLoaderLock.load()) usleep(1000);
  return 1;
}

TEST(StackSampler, ThreadHoldingTheLoaderLockDoesNotBlockCapture) {
  g_holdLoaderLock.store(true);
  ThreadGroup group;
  const int holder = group.start("nw-ldlock", [](const std::atomic<bool>*) {
    dl_iterate_phdr(stuckInsideDlIteratePhdr, nullptr);
  });
  const int alpha = group.start("nw-alpha", parkedInAlpha);
  while (!g_insideLoaderLock.load()) usleep(1000);

  std::vector<ThreadStack> slots(64);
  const auto started = Clock::now();
  const CaptureResult result = StackSampler::captureAll(slots, milliseconds(1000));
  const ThreadStack* held = find(slots, result.count, holder);
  const ThreadStack* other = find(slots, result.count, alpha);
  ASSERT_NE(held, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(held->answered);
  EXPECT_TRUE(other->answered);
  // Symbolize while the lock is still held.
  EXPECT_TRUE(stackHasFunction(*held, "stuckInsideDlIteratePhdr")) << describe(*held);
  EXPECT_TRUE(stackHasFunction(*other, "parkedInAlpha")) << describe(*other);
  EXPECT_LT(Clock::now() - started, milliseconds(5000));
  std::printf("%s\n", describe(*held).c_str());
  g_holdLoaderLock.store(false);
}

// "At once": a busy answer never waits for the capture in progress (up to its 2 s bound). Under a
// sanitizer on a loaded machine a caller may simply not be scheduled for tens of ms: the bound
// there is 500 ms, still a quarter of what waiting would take.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr milliseconds kPromptBusy{500};
#else
constexpr milliseconds kPromptBusy{50};
#endif

TEST(StackSampler, ConcurrentCallersNeverOverlap) {
  ThreadGroup group;
  const int alpha = group.start("nw-alpha", parkedInAlpha);
  const int bravo = group.start("nw-bravo", parkedInBravo);
  std::this_thread::sleep_for(milliseconds(20));

  // Three callers capture back to back for a while: each call either captures everything
  // correctly or is told busy at once; a mixed-up stack would show an overlap.
  std::atomic<int> captured{0};
  std::atomic<int> busy{0};
  std::atomic<int> slowBusy{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      std::vector<ThreadStack> own(64);
      const auto end = Clock::now() + milliseconds(400);
      while (Clock::now() < end) {
        const auto started = Clock::now();
        const CaptureResult result = StackSampler::captureAll(own, milliseconds(2000));
        if (result.busy) {
          busy.fetch_add(1);
          if (Clock::now() - started > kPromptBusy) slowBusy.fetch_add(1);
          EXPECT_EQ(result.count, 0u);
          continue;
        }
        captured.fetch_add(1);
        EXPECT_EQ(own[0].tid, currentTid());
        const ThreadStack* a = find(own, result.count, alpha);
        const ThreadStack* b = find(own, result.count, bravo);
        ASSERT_TRUE(a != nullptr && b != nullptr);
        EXPECT_TRUE(a->answered && b->answered);
        EXPECT_TRUE(stackHasFunction(*a, "parkedInAlpha")) << describe(*a);
        EXPECT_TRUE(stackHasFunction(*b, "parkedInBravo")) << describe(*b);
      }
    });
  }
  for (auto& caller : callers) caller.join();
  std::printf("concurrent callers: %d captures, %d busy\n", captured.load(), busy.load());
  EXPECT_GT(captured.load(), 0);
  EXPECT_GT(busy.load(), 0);
  EXPECT_EQ(slowBusy.load(), 0);
}

TEST(StackSampler, TenThreadsCaptureTime) {
  ThreadGroup group;
  for (int i = 0; i < 10; ++i) group.start("nw-t" + std::to_string(i), parkedInBravo);
  std::this_thread::sleep_for(milliseconds(20));
  std::vector<ThreadStack> slots(64);
  StackSampler::captureAll(slots, milliseconds(2000));  // first call faults pages in
  constexpr int kRounds = 20;
  const auto started = Clock::now();
  size_t count = 0;
  for (int i = 0; i < kRounds; ++i)
    count = StackSampler::captureAll(slots, milliseconds(2000)).count;
  const double perCapture =
      std::chrono::duration<double, std::micro>(Clock::now() - started).count() / kRounds;
  std::printf("capture of %zu threads: %.0f us\n", count, perCapture);
  size_t answered = 0;  // ours: the caller and nw-t*; a sanitizer's helper thread blocks signals
  for (size_t i = 0; i < count; ++i) {
    const bool ours = i == 0 || std::string(slots[i].name).rfind("nw-t", 0) == 0;
    if (ours) {
      EXPECT_TRUE(slots[i].answered) << describe(slots[i]);
      ++answered;
    }
  }
  EXPECT_EQ(answered, 11u);
}

// The handler runs on whatever alternate stack a thread set up (SA_ONSTACK): it must fit in a
// small one.
TEST(StackSampler, HandlerFitsOnASmallAlternateStack) {
  constexpr size_t kAltStackSize = 64 * 1024;
  std::vector<unsigned char> memory(kAltStackSize, 0xA5);
  std::atomic<bool> ready{false};
  ThreadGroup group;
  const int tid = group.start("nw-altstack", [&](const std::atomic<bool>* stop) {
    stack_t altStack;
    altStack.ss_sp = memory.data();
    altStack.ss_size = memory.size();
    altStack.ss_flags = 0;
    sigaltstack(&altStack, nullptr);
    ready.store(true);
    parkedInDelta(stop);
    altStack.ss_flags = SS_DISABLE;
    sigaltstack(&altStack, nullptr);
  });
  while (!ready.load()) usleep(1000);
  std::vector<ThreadStack> slots(64);
  const CaptureResult result = StackSampler::captureAll(slots, milliseconds(2000));
  const ThreadStack* stack = find(slots, result.count, tid);
  ASSERT_NE(stack, nullptr);
  ASSERT_TRUE(stack->answered);
  EXPECT_TRUE(stackHasFunction(*stack, "parkedInDelta")) << describe(*stack);
  size_t untouched = 0;
  while (untouched < memory.size() && memory[untouched] == 0xA5) ++untouched;
  const size_t used = memory.size() - untouched;
  std::printf("handler used %zu bytes of the alternate stack\n", used);
  EXPECT_GT(used, 0u);
  EXPECT_LT(used, 32u * 1024);
}

// On an alternate stack too small to unwind on (a sanitizer's or a runtime's), the handler hands
// its registers over and waits while the watchdog unwinds the thread's stack from its own: the
// whole stack, not just the interrupted pc.
TEST(StackSampler, SmallAlternateStackIsUnwoundByTheWatchdog) {
  std::vector<unsigned char> memory(12 * 1024);
  std::atomic<bool> ready{false};
  ThreadGroup group;
  const int tid = group.start("nw-smallalt", [&](const std::atomic<bool>* stop) {
    stack_t altStack;
    altStack.ss_sp = memory.data();
    altStack.ss_size = memory.size();
    altStack.ss_flags = 0;
    sigaltstack(&altStack, nullptr);
    ready.store(true);
    parkedInDelta(stop);
    altStack.ss_flags = SS_DISABLE;
    sigaltstack(&altStack, nullptr);
  });
  while (!ready.load()) usleep(1000);
  std::vector<ThreadStack> slots(64);
  const CaptureResult result = StackSampler::captureAll(slots, milliseconds(2000));
  const ThreadStack* stack = find(slots, result.count, tid);
  ASSERT_NE(stack, nullptr);
  ASSERT_TRUE(stack->answered);
#if defined(__x86_64__)
  EXPECT_TRUE(stackHasFunction(*stack, "parkedInDelta")) << describe(*stack);
  EXPECT_TRUE(stackHasFunction(*stack, "parkLoop")) << describe(*stack);
  EXPECT_FALSE(stack->truncated);
#else
  EXPECT_EQ(stack->frameCount, 1);  // elsewhere the handler keeps the interrupted pc only
#endif
  EXPECT_NE(stack->pcs[0], 0u);
}

}  // namespace
}  // namespace ncclwatch::watchdog
