// Writes the fuzzer's seed corpus: a valid ring file and a truncated one, and a continuous-mode
// file (segments after the ring) whole, truncated inside a segment, and with a corrupt segment.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "trace/dump.h"
#include "trace/fingerprint.h"
#include "trace/ring_writer.h"
#include "trace/wire.h"

namespace {

std::vector<char> readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeAll(const std::string& path, const std::vector<char>& bytes, size_t size) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
}

// 16 slots, 60 records persisted in rounds of 12 (some still issued), 8 more only in the ring.
bool writeContinuous(const std::string& path, std::string* error) {
  using namespace ncclwatch::trace;
  RingWriter writer;
  if (!writer.open(path, RingOptions{16, TraceMode::kFull}, {1, 2, 1, "seed", "seed"}, error)) {
    return false;
  }
  CommInfo comm{};
  comm.commHash = 0x1234;
  comm.nranks = 2;
  comm.rank = 1;
  writer.addComm(comm);
  for (uint64_t seq = 1; seq <= 68; ++seq) {
    CallRecord record{};
    record.commHash = 0x1234;
    record.seq = seq;
    record.op = seq % 3 ? OpKind::kAllReduce : OpKind::kRecv;
    record.state = RecordState::kIssued;
    uint64_t index = writer.append(record);
    if (seq % 4) writer.updateState(index, RecordState::kCompleted, 10, 20);
    if (seq % 12 == 0 && seq <= 60) writer.persistSegments(seq == 60);
  }
  writer.forgetAfterFork();  // as if killed: the last records stay in the ring only
  return true;
}

}  // namespace

// Seeds for the protocol decoder: a whole agent conversation, and the collector's requests.
int writeWireSeeds(const std::string& dir) {
  using namespace ncclwatch::trace;
  std::vector<std::byte> agent;
  wire::Hello hello{};
  std::strcpy(hello.secret, "seed-secret");
  hello.rank = 1;
  hello.world = 2;
  wire::encodeHello(hello, agent);
  CommInfo comm{};
  comm.commHash = 0x1234;
  comm.nranks = 2;
  comm.rank = 1;
  std::vector<CommInfo> comms{comm};
  wire::encodeComms(comms, agent);
  // A training loop's allreduces on two communicators, sent issued and then completed (UPDATE
  // messages), a send and a receive, a lifecycle call, and a ring index that jumps.
  wire::RecordEncoder encoder;
  size_t frame = wire::beginRecords(42, agent);
  agent.reserve(agent.size() + wire::kMaxPayload);
  std::vector<CallRecord> issued;
  for (uint64_t i = 0; i < 12; ++i) {
    CallRecord record{};
    record.commHash = i % 3 == 2 ? 0x5678 : 0x1234;
    record.seq = i + 1;
    record.ncclSeqNumber = i;
    record.op = OpKind::kAllReduce;
    record.count = i % 2 ? 4096 : 1024;
    record.dtype = 9;
    record.rootOrPeer = -1;
    record.issueNs = 1'000'000'000 + static_cast<int64_t>(i) * 10'000'000;
    record.stream = 0x7f00;
    record.callSite = 0x401000 + (i % 2) * 0x40;
    record.state = RecordState::kIssued;
    record.slotVersion = 2;
    record.ringIndex = i < 10 ? i : i + 100;
    record.fingerprint = fingerprint({record.op, record.count, record.dtype, 0, -1});
    if (i == 7) {
      record.op = i % 2 ? OpKind::kSend : OpKind::kRecv;
      record.rootOrPeer = 1;
      record.p2pSeq = 1;
      record.fingerprint = fingerprint({record.op, record.count, record.dtype, 0, 1});
    }
    if (i == 9) {
      record.op = OpKind::kDestroy;
      record.fingerprint = 0;
    }
    record.rollingHash = record.fingerprint ^ 0x55;
    wire::appendRecord(encoder, record, true, agent);
    issued.push_back(record);
  }
  for (CallRecord& record : issued) {
    record.state = RecordState::kCompleted;
    record.startNs = record.issueNs + 5'000;
    record.completeNs = record.startNs + 2'000'000;
    record.slotVersion = 4;
    wire::appendRecord(encoder, record, false, agent);
  }
  wire::endRecords(frame, agent);
  wire::encodeRecords(43, {}, encoder, agent);  // a heartbeat
  wire::encodeBye(agent);
  std::vector<std::byte> collector;
  wire::encodeDump("seed reason", collector);
  wire::encodeAbort(0x1234, collector);
  wire::encodeRefused(collector);
  // A relay's link: the agent's conversation on channel 3, a second agent's HELLO on channel
  // 9 and its end (CLOSED), then the collector's answers stamped the same way.
  std::vector<std::byte> relay;
  wire::appendWithChannel(agent, 3, relay);
  std::vector<std::byte> second;
  hello.rank = 0;
  wire::encodeHello(hello, second);
  // Its table says the first agent's communicator has another size (a relay must not trust it).
  CommInfo other = comm;
  other.nranks = 5;
  other.rank = 4;
  std::vector<CommInfo> otherComms{other};
  wire::encodeComms(otherComms, second);
  wire::appendWithChannel(second, 9, relay);
  wire::encodeClosed(9, relay);
  // A relay's note of calls it folded for the agent of channel 3 (tools/relay_fold.h).
  std::vector<std::byte> folded;
  std::vector<wire::FoldedNote> notes{{0x1234, 5, 0, 11, 1'200'000'000},
                                      {0x5678, 2, wire::kFoldedDropsSent, 10, 1'100'000'000}};
  wire::encodeFolded(44, notes, folded);
  wire::appendWithChannel(folded, 3, relay);
  wire::appendWithChannel(collector, 3, relay);
  for (auto& [name, bytes] :
       {std::pair{"agent.bin", &agent}, std::pair{"collector.bin", &collector},
        std::pair{"relay.bin", &relay}}) {
    std::ofstream(dir + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()),
               static_cast<std::streamsize>(bytes->size()));
  }
  return 0;
}

int main(int argc, char** argv) {
  using namespace ncclwatch::trace;
  if (argc == 3 && std::string(argv[2]) == "--wire") return writeWireSeeds(argv[1]);
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR [--wire]\n");
    return 2;
  }
  std::string dir = argv[1];
  RingWriter writer;
  std::string error;
  if (!writer.open(dir + "/valid.ncclwatch", 16, {0, 2, 0, "seed", "seed"}, &error)) {
    std::fprintf(stderr, "make_seeds: %s\n", error.c_str());
    return 1;
  }
  CommInfo comm{};
  comm.commHash = 0x1234;
  comm.nranks = 2;
  writer.addComm(comm);
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    CallRecord record{};
    record.commHash = 0x1234;
    record.seq = seq;
    record.op = seq % 2 ? OpKind::kAllReduce : OpKind::kSend;
    record.state = RecordState::kIssued;
    uint64_t index = writer.append(record);
    if (seq < 4) writer.updateState(index, RecordState::kCompleted, 10, 20);
  }
  // A dump block after the ring, as the watchdog writes one at a hang.
  ncclwatch::trace::Dump dump;
  dump.trigger = "hang";
  dump.reason = "calls pending past the hang threshold";
  dump.timeNs = 123456789;
  dump.findings.push_back({0x1234, 5, "Send", "started", 2500, 77, "Send 16 x float peer 1"});
  ncclwatch::trace::DumpThread thread;
  thread.tid = 77;
  thread.name = "seed";
  thread.answered = true;
  thread.frames.push_back(
      {0x401000, "runStep(int)", 0x20, "/bin/seed", 0x1000, "ab12", "", 0, false, ""});
  dump.threads.push_back(thread);
  dump.pythonNote = "CPython's faulthandler";
  dump.pythonThreads.push_back({0x7f00, true, {{"train.py", 12, "step"}}});
  writer.appendDump(ncclwatch::trace::formatDump(dump));
  writer.close();
  std::vector<char> bytes = readAll(dir + "/valid.ncclwatch");
  writeAll(dir + "/truncated.ncclwatch", bytes, bytes.size() - 300);

  if (!writeContinuous(dir + "/continuous.ncclwatch", &error)) {
    std::fprintf(stderr, "make_seeds: %s\n", error.c_str());
    return 1;
  }
  bytes = readAll(dir + "/continuous.ncclwatch");
  writeAll(dir + "/continuous-truncated.ncclwatch", bytes, bytes.size() - 200);
  size_t firstSegment = kRingHeaderBytes + 16 * sizeof(CallRecord);
  if (bytes.size() > firstSegment + 100) bytes[firstSegment + 100] ^= 0x5a;  // checksum mismatch
  writeAll(dir + "/continuous-corrupt.ncclwatch", bytes, bytes.size());
  return 0;
}
