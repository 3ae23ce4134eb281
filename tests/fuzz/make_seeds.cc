// Writes the fuzzer's seed corpus: a valid ring file and a truncated one.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "trace/ring_writer.h"

int main(int argc, char** argv) {
  using namespace ncclwatch::trace;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
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
  writer.close();
  std::ifstream in(dir + "/valid.ncclwatch", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/truncated.ncclwatch", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 300));
  return 0;
}
