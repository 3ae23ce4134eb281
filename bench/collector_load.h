// collector_load's parts, shared by its three files (bench only): collector_load.cc parses the
// arguments and runs the phases; collector_load_agents.cc is the synthetic agents and the wire
// they speak; collector_load_measure.cc starts and watches the collector and measures and
// reports (/proc samples, backlog, verdict lines, the table).
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "relay_fold.h"
#include "trace/fingerprint.h"
#include "trace/ring_format.h"
#include "trace/wire.h"

namespace ncclwatch::bench::collector_load {

namespace trace = ncclwatch::trace;
namespace wire = ncclwatch::trace::wire;
using trace::CallRecord;
using trace::OpKind;

// A backlogged connection holds at most this much in the generator; whole frames beyond it are
// dropped and counted, as a real agent's bounded send buffer does. Small enough that 4096 stuck
// connections cannot exhaust the machine (1 GiB), large enough for seconds of one agent's calls.
inline constexpr size_t kMaxQueuedBytes = 256 * 1024;
inline constexpr size_t kConnectBatch = 256;  // well under the collector's listen backlog of 1024
inline constexpr int64_t kConnectDeadlineNs = 120'000'000'000;
inline constexpr int64_t kStartDeadlineNs = 10'000'000'000;
inline constexpr int64_t kStopDeadlineNs = 30'000'000'000;
inline constexpr size_t kMaxStderrBytes = 64 * 1024;
inline constexpr uint8_t kBfloat16 = 9;  // ncclBfloat16
inline constexpr uint8_t kSum = 0;       // ncclSum
inline constexpr uint64_t kEpollStdout = ~0ull;
inline constexpr uint64_t kEpollStderr = ~0ull - 1;

extern volatile sig_atomic_t g_interrupted;

int64_t monotonicNs();
int64_t realtimeNs();
double mib(double bytes);

struct Args {
  std::string cli;
  long agents = 4096;
  double rate = 100;  // calls per second per agent
  double seconds = 20;
  double warmup = 3;
  double verdictWait = 30;
  long tickMs = 100;
  long commSize = 8;
  // 0: every agent has its own connection. N: agents on N hosts (consecutive ranks), each
  // host's agents multiplexed over one connection as its relay would (docs/protocol.md,
  // "Relays"): the synthetic relays live here.
  long hosts = 0;
  // Behind relays: whether they fold the calls of host-local communicators (the tensor-parallel
  // groups when --comm-size is the agents a host) as `ncclwatch relay` does, with its code
  // (tools/relay_fold.h); kFoldNone: every frame goes on as it came (the relays before session
  // 20); kFoldEmulated: what such a relay sends, made directly (no tensor-parallel record, a
  // FOLDED note a second per agent), so that the generator does not pay the relays' decoding:
  // at 32,768 ranks that took a core of the two here.
  enum Fold { kFoldNone = 0, kFoldRelayCode = 1, kFoldEmulated = 2 };
  int fold = kFoldRelayCode;
  // Behind relays: false, a host's frames of a tick go to the collector in one write, as a
  // relay sends what its agents, polling on the host's beat, sent within its gathering window
  // (tools/relay.h); true, each agent's frame is a write of its own, the hosts' writes
  // interleaved agent by agent, as the relays before session 21 passed on their agents' frames
  // at their own moments.
  bool writePerAgent = false;
  // The collector's --analysis-threads; 0: its default (half the cores, 8 at most).
  long analysisThreads = 0;
  // The collector's --reader-threads; 0: its default.
  long readerThreads = 0;
};

// What /proc says about the collector process.
struct ProcSample {
  bool ok = false;
  double cpuSeconds = 0;  // utime + stime
  long rssKiB = 0;
  long hwmKiB = 0;
  // CPU seconds of the collector's threads by role, from their names (/proc/PID/task): the
  // triage thread ("nw-triage") and the readers ("nw-reader-N"); 0 for a collector that does
  // not name them. The rest of cpuSeconds is the analysis helpers' (short-lived) and main's.
  double triageSeconds = 0;
  double readerSeconds = 0;
};

ProcSample sampleProcess(pid_t pid);
double ownCpuSeconds();

// Bytes the kernel holds for the collector that it has not read yet, over its established
// connections (each socket's receive queue): the backlog that our own queues cannot see. Asked
// over sock_diag netlink, which answers for thousands of sockets in a few ms, where reading
// /proc/net/tcp takes tens of ms and would stall the ticks.
uint64_t collectorUnreadBytes(int port);

// The whole machine's CPU time (/proc/stat), to tell a saturated machine from a slow collector.
// Softirq is shown apart: on loopback the kernel's TCP work for both ends runs there, charged to
// whichever process it interrupted (mostly the generator, whose sends deliver the segments).
struct MachineCpu {
  double busy = 0;     // seconds, every kind but idle and iowait
  double softirq = 0;  // seconds
  double niced = 0;    // seconds of niced processes: other work sharing the machine
};

MachineCpu machineCpu();

// Splits what a pipe delivers into lines.
struct LineReader {
  int fd = -1;
  bool open = true;
  std::string partial;

  // Appends the complete lines read so far to `lines`; false once the pipe is at its end.
  bool drain(std::vector<std::string>* lines) {
    char buffer[4096];
    for (;;) {
      ssize_t got = read(fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) break;  // EAGAIN: all read for now
      if (got == 0) {
        if (!partial.empty()) lines->push_back(std::move(partial));
        partial.clear();
        open = false;
        break;
      }
      partial.append(buffer, static_cast<size_t>(got));
    }
    for (size_t newline; (newline = partial.find('\n')) != std::string::npos;) {
      lines->push_back(partial.substr(0, newline));
      partial.erase(0, newline + 1);
    }
    return open;
  }
};

// "[ncclwatch] KIND ..." with KIND in capitals: the first line of a verdict as the collector
// prints it (analysis::printVerdictText).
bool isVerdictHeader(const std::string& line);

std::string statusText(int status);

// One simulated rank: its connection and the state its interposer would keep.
struct Agent {
  // The agent whose connection this one's frames travel on (itself unless behind a relay), and
  // its channel on it (0: direct). The connection's state below lives in that agent.
  size_t link = 0;
  uint32_t channel = 0;
  int fd = -1;
  int rank = 0;
  uint64_t tpHash = 0;
  uint64_t ringIndex = 0;
  uint64_t worldRolling = trace::kRollingSeed;
  uint64_t tpRolling = trace::kRollingSeed;
  // --fold 2: the tensor-parallel calls folded since the agent's last note, and when it is due.
  wire::FoldedNote note{};
  int64_t nextNoteNs = 0;
  // Bytes the socket would not take yet, from `head`; `frameEnds` are stream positions (counted
  // in `flushed`) at which a queued frame is completely written, with its record count.
  std::vector<std::byte> queue;
  size_t head = 0;
  uint64_t appended = 0;
  uint64_t flushed = 0;
  std::deque<std::pair<uint64_t, uint32_t>> frameEnds;
  bool writeWatched = false;
  // The connection's delta bases (docs/protocol.md, RECORDS): a RECORDS frame once encoded must
  // reach the collector, so records are encoded only when the queue can take their frame.
  wire::RecordEncoder encoder;
};

struct Counters {
  uint64_t calls = 0;          // calls the agents made (offered load), dropped ones included
  uint64_t recordsFolded = 0;  // --fold 2: records the emulated relays folded
  uint64_t framesSent = 0;
  uint64_t recordsSent = 0;
  uint64_t bytesSent = 0;
  uint64_t framesDropped = 0;
  uint64_t recordsDropped = 0;
  uint64_t queuedBytes = 0;  // all connections' backlog in the generator now
  uint64_t maxQueuedBytes = 0;
  uint64_t bytesFromCollector = 0;  // DUMP/ABORT frames the collector sent
  uint64_t closedByCollector = 0;
  int64_t maxTickLateNs = 0;
  uint64_t lateTicks = 0;  // ticks that began more than a tick late: the generator lagged
  uint64_t ticks = 0;
  uint64_t tickNs = 0;  // time spent building and sending all agents' frames
  int64_t maxTickNs = 0;
};

struct Sample {
  double at = 0;  // seconds since the steady window began
  ProcSample collector;
  double ownCpu = 0;
  MachineCpu machine;
  uint64_t queuedBytes = 0;
  uint64_t unreadBytes = 0;
  Counters counters;
};

class LoadGenerator {
 public:
  explicit LoadGenerator(const Args& args) : args_(args) {}
  ~LoadGenerator();
  int run();

 private:
  bool startCollector(std::string* error);
  bool connectAgents(std::string* error);
  void greet(Agent& agent);
  void tick(int64_t now, uint64_t calls);
  // `relayed`: frame_ is a relay's output for its link, stamped already (no agent's frame).
  void sendFrame(Agent& agent, uint32_t records, bool relayed = false);
  void flush(Agent& agent);
  void flushLinks(size_t watched, int64_t* watchedAt);
  void watchWrites(Agent& agent, bool on);
  void closeAgent(Agent& agent);
  void pump(int64_t untilNs);
  void handleLines(bool fromStdout, int64_t now);
  Sample takeSample(int64_t steadyStart) const;
  void stopCollector();
  void printReport(const std::vector<Sample>& samples, int64_t steadyNs) const;

  Args args_;
  std::string workDir_;
  std::string secret_;
  long finalHwmKiB_ = 0;
  pid_t child_ = -1;
  int childStatus_ = 0;
  bool childExited_ = false;
  bool collectorDiedEarly_ = false;
  int port_ = 0;
  LineReader out_, err_;
  std::string stderrText_;
  int epoll_ = -1;
  std::vector<Agent> agents_;
  Counters counters_;
  std::vector<std::byte> frame_;
  std::vector<std::byte> relayed_;  // a relay's output, swapped into frame_
  // Behind folding relays: each host's relay (index: link / agentsPerLink_).
  std::vector<std::unique_ptr<relay::Folder>> folders_;
  std::vector<CallRecord> records_;
  size_t agentsPerLink_ = 1;
  size_t maxQueued_ = kMaxQueuedBytes;  // per connection: a relay's carries its host's agents

  uint64_t worldHash_ = 0;
  uint64_t callsMade_ = 0;  // per agent, identical for all
  uint64_t worldCalls_ = 0;
  uint64_t tpCalls_ = 0;
  int64_t lastTickNs_ = 0;
  double connectSeconds_ = 0;

  // Phase 2: one agent issues a mismatched world allreduce.
  int culprit_ = 17;
  bool injectMismatch_ = false;
  int64_t mismatchSentNs_ = 0;
  size_t mismatchAgent_ = SIZE_MAX;  // behind relays: its frame waits for its host's write
  bool mismatchQueued_ = false;
  int64_t verdictNs_ = 0;
  std::string verdictLine_;
  long collectorSaysMs_ = -1;
  std::vector<std::string> earlyVerdicts_;  // verdicts before the mismatch: false positives
};

}  // namespace ncclwatch::bench::collector_load
