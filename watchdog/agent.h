// The watchdog thread of one process. It starts lazily at the first communicator init (never in
// a constructor), runs with every signal blocked, polls completion events every poll interval,
// persists the ring to the file's segments in continuous mode, and is stopped with a bound at
// exit. A fork() child has no watchdog thread until it starts
// its own.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "trace/ring_writer.h"
#include "watchdog/completion.h"

namespace ncclwatch::watchdog {

struct AgentOptions {
  int pollMs = 100;
  bool events = true;  // GPU completion events (NCCLWATCH_EVENTS)
};

class Agent {
 public:
  // The process's agent, started on first use with `writer`'s trace. Never null after a
  // successful start; the agent lives until the process ends.
  static Agent* start(trace::RingWriter& writer, const AgentOptions& options);
  // The running agent, or null before start (and in a fork child until it starts its own).
  static Agent* current();

  // Null when events are off or the process has no CUDA driver.
  CompletionTracker* completion() { return completion_.get(); }
  int pollMs() const { return options_.pollMs; }

  // Stops the thread: one last poll, then join within `boundMs`; a thread that does not
  // finish in time is left behind (the agent is never freed, so it stays safe to run).
  void stop(int boundMs);

 private:
  Agent(trace::RingWriter& writer, const AgentOptions& options);
  void run();

  trace::RingWriter& writer_;
  AgentOptions options_;
  std::unique_ptr<CompletionTracker> completion_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace ncclwatch::watchdog
