// The collector's per-record feed of the progress kept on arrival (analysis/comm_progress.h) at
// N processes (default 4096), as Triage::store does it: windows of 128 records trimmed back from
// 128 + 64, records arriving round robin in frames of 10 per process (allreduces alternating
// between the world and a tensor-parallel communicator of 8, as bench/collector_load sends them),
// each arriving issued and completing with the next. Two ways of a trim, interleaved in one run
// over their own copies of the windows: the records dropped from the progress (droppingFront,
// then the erase) against the erase and a rebuild of the progress from the window left (before
// issue 15's change). Prints the CPU time per record of each, the window's own work (push,
// erase) included, and their ratio; and how many trims took each way.
// Usage: progress_trim [PROCESSES] [ROUNDS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "analysis/comm_progress.h"
#include "bench/cpu_time.h"
#include "trace/ring_reader.h"

namespace {

using ncclwatch::analysis::ProcessProgress;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;
using ncclwatch::trace::RecordWindow;
using ncclwatch::trace::TraceFile;

using ncclwatch::bench::processCpuSeconds;

constexpr size_t kWindow = 128, kSlack = 64, kFrame = 10;
constexpr uint64_t kWorld = 0x3002, kTensorBase = 0xE1CA0000;

struct Process {
  TraceFile file;
  ProcessProgress progress;
  uint64_t next = 0;  // calls issued so far
  uint64_t worldSeq = 0, tensorSeq = 0;
};

struct Job {
  std::vector<Process> processes;
  enum Way { kDrop, kRebuild, kNone } way;  // kNone: the window alone, no progress
  uint64_t trims = 0;
  Job(size_t count, Way w) : processes(count), way(w) {
    for (size_t p = 0; p < count; ++p) {
      Process& process = processes[p];
      process.file.comms.push_back({});
      process.file.comms.back().commHash = kWorld;
      process.file.comms.back().rank = static_cast<int>(p);
      process.file.comms.push_back({});
      process.file.comms.back().commHash = kTensorBase + p / 8;
      process.file.comms.back().rank = static_cast<int>(p % 8);
      process.file.records.reserve(kWindow + kSlack + 1);
      process.progress.rebuild(process.file);
    }
  }
  // One frame of each process.
  void round(int64_t nowNs) {
    for (size_t p = 0; p < processes.size(); ++p) {
      Process& process = processes[p];
      RecordWindow& records = process.file.records;
      for (size_t i = 0; i < kFrame; ++i) {
        bool world = process.next % 2 == 0;
        CallRecord r{};
        r.commHash = world ? kWorld : kTensorBase + p / 8;
        r.seq = world ? ++process.worldSeq : ++process.tensorSeq;
        r.op = OpKind::kAllReduce;
        r.count = 1 << 20;
        r.rootOrPeer = -1;
        r.state = RecordState::kIssued;
        r.ringIndex = process.next++;
        r.issueNs = nowNs + static_cast<int64_t>(i) * 1000;
        // The one before completes (the collector receives it again).
        if (!records.empty()) {
          CallRecord before = records.back();
          records.back().state = RecordState::kCompleted;
          records.back().startNs = before.issueNs + 100;
          records.back().completeNs = before.issueNs + 500;
          if (way != kNone) process.progress.replaced(process.file, before, records.back());
        }
        records.push_back(r);
        bool trim = records.size() > kWindow + kSlack;
        size_t drop = records.size() - kWindow;
        if (way == kNone) {
          if (trim) {
            records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(drop));
          }
        } else if (way == kDrop) {
          process.progress.appended(process.file);
          if (trim) {
            process.progress.droppingFront(process.file, drop);
            records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(drop));
          }
        } else if (trim) {
          records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(drop));
          process.progress.rebuild(process.file);
        } else {
          process.progress.appended(process.file);
        }
        trims += trim ? 1 : 0;
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  size_t processes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4096;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 200;
  Job dropping(processes, Job::kDrop), rebuilding(processes, Job::kRebuild),
      bare(processes, Job::kNone);
  Job* jobs[3] = {&dropping, &rebuilding, &bare};
  double seconds[3] = {0, 0, 0};
  uint64_t records = 0;
  int64_t now = 1'000'000'000;
  // Warm-up: the windows full and trimmed once.
  for (int r = 0; r < 40; ++r, now += 100'000'000) {
    for (Job* job : jobs) job->round(now);
  }
  for (int r = 0; r < rounds; ++r, now += 100'000'000) {
    // Rotating which goes first, so that none always follows the same other.
    for (int j = 0; j < 3; ++j) {
      int at = (j + r) % 3;
      double start = processCpuSeconds();
      jobs[at]->round(now);
      seconds[at] += processCpuSeconds() - start;
    }
    records += processes * kFrame;
  }
  uint64_t fast = 0, rebuilds = 0;
  for (const Process& p : dropping.processes) {
    fast += p.progress.trims();
    rebuilds += p.progress.rebuilds() - 1;  // less the first, empty one
  }
  auto ns = [&](int j) { return seconds[j] * 1e9 / static_cast<double>(records); };
  std::printf("%zu processes, window %zu + %zu, %llu records each way (CPU ns per record)\n",
              processes, kWindow, kSlack, static_cast<unsigned long long>(records));
  std::printf("window alone (push, erase)       %6.1f\n", ns(2));
  std::printf(
      "records dropped from progress    %6.1f  progress %5.1f (trims: %llu fast, %llu rebuilt)\n",
      ns(0), ns(0) - ns(2), static_cast<unsigned long long>(fast),
      static_cast<unsigned long long>(rebuilds));
  std::printf("progress rebuilt at each trim    %6.1f  progress %5.1f\n", ns(1), ns(1) - ns(2));
  std::printf("progress's cost, rebuilt / dropped: %.2f\n", (ns(1) - ns(2)) / (ns(0) - ns(2)));
  return 0;
}
