// Pieces the ring-file tests share: where their files go, a recognizable record, a file's bytes.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "trace/record.h"
#include "trace/ring_reader.h"

namespace tracetest {

// $TMPDIR (or /tmp)/<prefix>-<pid>-<name>.ncclwatch
inline std::string tempPath(const std::string& prefix, const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + prefix + "-" + std::to_string(getpid()) + "-" +
         name + ".ncclwatch";
}

// A record whose fields follow from its seq, so a torn or misplaced copy shows.
inline ncclwatch::trace::CallRecord makeRecord(
    uint64_t seq, ncclwatch::trace::OpKind op = ncclwatch::trace::OpKind::kAllReduce) {
  ncclwatch::trace::CallRecord record{};
  record.commHash = 0xabcdef;
  record.seq = seq;
  record.count = seq * 10;  // a per-record invariant a torn copy would break
  record.op = op;
  record.dtype = 7;
  record.state = ncclwatch::trace::RecordState::kIssued;
  record.issueNs = static_cast<int64_t>(seq) * 1000;
  record.rootOrPeer = -1;
  return record;
}

inline std::vector<std::byte> fileBytes(const std::string& path) {
  std::vector<std::byte> bytes;
  std::string error;
  ncclwatch::trace::readFileBytes(path, &bytes, &error);  // empty when it cannot be read
  return bytes;
}

}  // namespace tracetest
