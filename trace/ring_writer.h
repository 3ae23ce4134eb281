// Writes the ring file from inside the traced process. Opening allocates and does I/O; after
// that, append() and update() are lock-free plain stores into the shared mapping: no
// allocation, no lock, no system call, so they may run on an application's hot path.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "trace/ring_format.h"

namespace ncclwatch::trace {

struct ProcessInfo {
  int rank = -1;
  int world = -1;
  int localRank = -1;
  std::string host;
  std::string jobId;
};

class RingWriter {
 public:
  RingWriter() = default;
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Creates `path` (mode 0600; its folder must exist) sized for `capacity` records (rounded up
  // to a power of two within [kMinRingCapacity, kMaxRingCapacity]). False with a one-line
  // `error` naming the file on failure.
  bool open(const std::string& path, uint32_t capacity, const ProcessInfo& info,
            std::string* error);
  bool isOpen() const { return header_ != nullptr; }
  const std::string& path() const { return path_; }
  uint32_t capacity() const { return capacity_; }

  // Appends a copy of `record` (its slotVersion and ringIndex are set here) and returns its
  // ring index, which later updates refer to.
  uint64_t append(const CallRecord& record);

  // Changes the state of record `index` if it has not been overwritten since; false if it was.
  bool updateState(uint64_t index, RecordState state, int64_t startNs, int64_t completeNs);

  // Stores the ncclResult_t a call returned, if record `index` has not been overwritten.
  bool updateResult(uint64_t index, int32_t result);

  // Records a communicator in the header's table; counts it as dropped when the table is full.
  void addComm(const CommInfo& comm);
  void setRank(int rank, int world, int localRank);
  void setNcclLibrary(int version, const std::string& path);
  void markCleanShutdown();

  // In a fork() child: drop the mapping without writing to it, so that the child never
  // writes into its parent's trace.
  void forgetAfterFork();
  void close();

 private:
  CallRecord* slot(uint64_t index) const;
  RingHeader* header_ = nullptr;
  CallRecord* records_ = nullptr;
  size_t mappedBytes_ = 0;
  uint32_t capacity_ = 0;
  std::string path_;
};

// Rounds to a power of two within the allowed range.
uint32_t ringCapacityFor(uint32_t requested);

}  // namespace ncclwatch::trace
