#include "trace/ring_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ncclwatch::trace {
namespace {

int64_t clockNs(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

template <size_t N>
void copyText(char (&destination)[N], const std::string& text) {
  size_t length = std::min(text.size(), N - 1);
  std::memcpy(destination, text.data(), length);
  destination[length] = '\0';
}

std::atomic_ref<uint64_t> atomicField(uint64_t& field) {
  return std::atomic_ref<uint64_t>(field);
}
std::atomic_ref<uint32_t> atomicField(uint32_t& field) {
  return std::atomic_ref<uint32_t>(field);
}

// Seqlock write: odd while inside, the next even value once done.
template <typename Body>
void writeSlot(CallRecord* slot, Body body) {
  auto version = std::atomic_ref<uint32_t>(slot->slotVersion);
  uint32_t before = version.load(std::memory_order_relaxed);
  // A writer that died inside left an odd value: step past it, staying odd.
  uint32_t inside = (before & 1u) ? before + 2 : before + 1;
  version.store(inside, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  body();
  version.store(inside + 1, std::memory_order_release);
}

}  // namespace

uint32_t ringCapacityFor(uint32_t requested) {
  uint32_t capacity = kMinRingCapacity;
  while (capacity < requested && capacity < kMaxRingCapacity) capacity <<= 1;
  return capacity;
}

RingWriter::~RingWriter() {
  close();
}

bool RingWriter::open(const std::string& path, uint32_t capacity, const ProcessInfo& info,
                      std::string* error) {
  close();
  capacity_ = ringCapacityFor(capacity);
  size_t bytes = kRingHeaderBytes + static_cast<size_t>(capacity_) * sizeof(CallRecord);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (error) *error = path + ": cannot create the trace file: " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) {
    if (error) *error = path + ": cannot map the trace file: " + std::strerror(errno);
    return false;
  }
  mappedBytes_ = bytes;
  path_ = path;
  header_ = static_cast<RingHeader*>(mapping);
  records_ = reinterpret_cast<CallRecord*>(static_cast<char*>(mapping) + kRingHeaderBytes);
  header_->formatVersion = kRingFormatVersion;
  header_->headerBytes = kRingHeaderBytes;
  header_->recordBytes = sizeof(CallRecord);
  header_->capacity = capacity_;
  header_->pid = static_cast<int32_t>(getpid());
  header_->rank = info.rank;
  header_->world = info.world;
  header_->localRank = info.localRank;
  header_->anchorMonotonicNs = clockNs(CLOCK_MONOTONIC);
  header_->anchorRealtimeNs = clockNs(CLOCK_REALTIME);
  copyText(header_->host, info.host);
  copyText(header_->jobId, info.jobId);
  // The magic goes last: a reader never takes a half-initialized header for a trace.
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(header_->magic, kRingMagic, sizeof kRingMagic);
  return true;
}

CallRecord* RingWriter::slot(uint64_t index) const {
  return &records_[index & (capacity_ - 1)];
}

uint64_t RingWriter::append(const CallRecord& record) {
  uint64_t index = atomicField(header_->nextIndex).fetch_add(1, std::memory_order_relaxed);
  CallRecord* target = slot(index);
  writeSlot(target, [&] {
    uint32_t version = target->slotVersion;
    std::memcpy(target, &record, offsetof(CallRecord, slotVersion));
    target->slotVersion = version;
    target->ringIndex = index;
  });
  return index;
}

bool RingWriter::updateState(uint64_t index, RecordState state, int64_t startNs,
                             int64_t completeNs) {
  CallRecord* target = slot(index);
  if (std::atomic_ref<uint64_t>(target->ringIndex).load(std::memory_order_relaxed) != index) {
    return false;  // overwritten by a newer record after the ring wrapped
  }
  writeSlot(target, [&] {
    target->state = state;
    if (startNs != 0 && target->startNs == 0) target->startNs = startNs;
    if (completeNs != 0 && target->completeNs == 0) target->completeNs = completeNs;
  });
  return true;
}

bool RingWriter::updateResult(uint64_t index, int32_t result) {
  CallRecord* target = slot(index);
  if (std::atomic_ref<uint64_t>(target->ringIndex).load(std::memory_order_relaxed) != index) {
    return false;
  }
  writeSlot(target, [&] { target->result = result; });
  return true;
}

void RingWriter::addComm(const CommInfo& comm) {
  uint32_t index = atomicField(header_->commCount).fetch_add(1, std::memory_order_relaxed);
  if (index >= kCommTableCapacity) {
    atomicField(header_->commCount).fetch_sub(1, std::memory_order_relaxed);
    atomicField(header_->droppedComms).fetch_add(1, std::memory_order_relaxed);
    return;
  }
  header_->comms[index] = comm;
}

void RingWriter::setRank(int rank, int world, int localRank) {
  header_->rank = rank;
  header_->world = world;
  header_->localRank = localRank;
}

void RingWriter::setNcclLibrary(int version, const std::string& path) {
  header_->ncclVersion = version;
  copyText(header_->ncclLibrary, path);
}

void RingWriter::markCleanShutdown() {
  atomicField(header_->cleanShutdown).store(1);
}

void RingWriter::forgetAfterFork() {
  if (header_ != nullptr) munmap(header_, mappedBytes_);
  header_ = nullptr;
  records_ = nullptr;
}

void RingWriter::close() {
  if (header_ == nullptr) return;
  msync(header_, kRingHeaderBytes, MS_ASYNC);
  munmap(header_, mappedBytes_);
  header_ = nullptr;
  records_ = nullptr;
}

}  // namespace ncclwatch::trace
