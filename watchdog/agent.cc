#include "watchdog/agent.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "trace/clock.h"

namespace ncclwatch::watchdog {
namespace {

std::atomic<Agent*> g_agent{nullptr};
std::mutex g_startMutex;
std::once_flag g_atforkOnce;

void forgetAfterFork() {
  // The parent's thread does not exist in the child; its agent (and any lock it held) is left.
  g_agent.store(nullptr);
  new (&g_startMutex) std::mutex();
}

void stopAtExit() {
  if (Agent* agent = g_agent.load()) agent->stop(500);
}

}  // namespace

Agent::Agent(trace::RingWriter& writer, const AgentOptions& options)
    : writer_(writer), options_(options) {}

Agent* Agent::current() {
  return g_agent.load(std::memory_order_acquire);
}

Agent* Agent::start(trace::RingWriter& writer, const AgentOptions& options) {
  if (Agent* agent = current()) return agent;
  std::lock_guard<std::mutex> lock(g_startMutex);
  if (Agent* agent = current()) return agent;
  std::call_once(g_atforkOnce, [] { pthread_atfork(nullptr, nullptr, forgetAfterFork); });
  auto* agent = new Agent(writer, options);
  if (options.events) {
    const char* why = nullptr;
    if (const DriverApi* driver = loadDriverApi(&why)) {
      agent->completion_ = std::make_unique<CompletionTracker>(*driver, writer);
    } else {
      std::fprintf(stderr, "[ncclwatch] GPU completion tracking off: %s\n", why);
    }
  }
  // The thread inherits a full signal mask: no signal meant for the application lands on it.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  agent->thread_ = std::thread([agent] { agent->run(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  g_agent.store(agent, std::memory_order_release);
  // atexit handlers run in reverse order of registration: this one runs before the CUDA
  // runtime's (registered at its first call, earlier), so the driver is still there.
  std::atexit(stopAtExit);
  return agent;
}

void Agent::run() {
  pthread_setname_np(pthread_self(), "ncclwatch");
  if (completion_) completion_->enterPollingThread();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    bool last = stopping_;
    lock.unlock();
    trace::FastClock::calibrate();
    if (completion_) completion_->poll();
    // Continuous mode: the ring's records go to the file's segments after their states settle.
    if (writer_.continuous()) writer_.persistSegments();
    lock.lock();
    if (last) break;
    // Until the fast clock has its first line, poll often enough to publish it within ~25 ms.
    // Continuous mode polls and persists at least every 10 ms, so that a burst of calls rarely
    // laps the ring before its records reach the file with their settled states.
    bool eager = !trace::FastClock::calibrated() || writer_.continuous();
    int waitMs = eager ? std::min(options_.pollMs, 10) : options_.pollMs;
    wake_.wait_for(lock, std::chrono::milliseconds(waitMs), [this] { return stopping_; });
  }
  finished_ = true;
  wake_.notify_all();
}

void Agent::stop(int boundMs) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!thread_.joinable()) return;
  stopping_ = true;
  wake_.notify_all();
  bool done =
      wake_.wait_for(lock, std::chrono::milliseconds(boundMs), [this] { return finished_; });
  lock.unlock();
  if (done) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

}  // namespace ncclwatch::watchdog
