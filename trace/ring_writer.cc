#include "trace/ring_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

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
std::atomic_ref<int32_t> atomicField(int32_t& field) {
  return std::atomic_ref<int32_t>(field);
}

using detail::kBodyWords;
using detail::smallFields;
using detail::storeBody;
using detail::words;
using detail::writeSlot;

// The reader's protocol on the live ring: a copy between two equal, even reads of slotVersion.
bool loadStableSlot(CallRecord* slot, CallRecord* out) {
  auto version = std::atomic_ref<uint32_t>(slot->slotVersion);
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint32_t before = version.load(std::memory_order_acquire);
    if (before & 1u) continue;
    // Acquire loads (a background thread can afford them) keep the second read of the version
    // after the copy without a fence.
    uint64_t body[kBodyWords];
    for (size_t i = 0; i < kBodyWords; ++i) {
      body[i] = std::atomic_ref<uint64_t>(words(slot)[i]).load(std::memory_order_acquire);
    }
    uint32_t small = std::atomic_ref<uint32_t>(*smallFields(slot)).load(std::memory_order_acquire);
    uint64_t ringIndex = std::atomic_ref<uint64_t>(slot->ringIndex).load(std::memory_order_acquire);
    if (version.load(std::memory_order_relaxed) != before) continue;
    std::memcpy(out, body, sizeof body);
    std::memcpy(&out->redop, &small, sizeof small);
    out->slotVersion = before;
    out->ringIndex = ringIndex;
    return true;
  }
  return false;
}

bool isFinal(const CallRecord& record, int64_t now) {
  switch (record.state) {
    case RecordState::kCompleted:
    case RecordState::kFailed:
    case RecordState::kAborted:
      return true;
    case RecordState::kIssued:
      // No completion will come; a failing call's result still does, when the call returns.
      return (record.flags & (kRecordNoEvents | kRecordCaptured)) != 0 &&
             now - record.issueNs >= RingWriter::kNoEventsGraceNs;
    default:
      return false;
  }
}

// The writer whose file mapping the SIGBUS guard protects (one ring file per process).
std::atomic<RingWriter*> g_guarded{nullptr};
struct sigaction g_previousBus;
std::atomic<bool> g_busGuardInstalled{false};

// Behaves as the process would have without us.
void chainBus(int signal, siginfo_t* info, void* context) {
  if (g_previousBus.sa_flags & SA_SIGINFO) {
    if (g_previousBus.sa_sigaction != nullptr) g_previousBus.sa_sigaction(signal, info, context);
    return;
  }
  if (g_previousBus.sa_handler == SIG_IGN) return;
  if (g_previousBus.sa_handler == SIG_DFL) {
    // Blocked inside this handler: delivered with the default action as the handler returns.
    sigaction(signal, &g_previousBus, nullptr);
    syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), signal);
    return;
  }
  g_previousBus.sa_handler(signal);
}

void onBus(int signal, siginfo_t* info, void* context) {
  int savedErrno = errno;
  if (!RingWriter::recoverFault(info->si_addr)) chainBus(signal, info, context);
  errno = savedErrno;
}

// Once per address space: a handler installed later (the watchdog's fatal-signal handler)
// asks recoverFault() first and chains here for anything else.
void installBusGuard() {
  if (g_busGuardInstalled.exchange(true)) return;
  struct sigaction action {};
  action.sa_sigaction = onBus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previousBus);
}

// Growing a file past RLIMIT_FSIZE sends SIGXFSZ, which kills by default: ask first.
bool withinFileSizeLimit(uint64_t end) {
  rlimit limit{};
  return getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
         end <= limit.rlim_cur;
}

std::string mebibytes(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
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
  return open(path, RingOptions{capacity, TraceMode::kRing}, info, error);
}

bool RingWriter::open(const std::string& path, const RingOptions& options, const ProcessInfo& info,
                      std::string* error) {
  close();
  uint32_t capacity = ringCapacityFor(options.capacity);
  size_t bytes = kRingHeaderBytes + static_cast<size_t>(capacity) * sizeof(CallRecord);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (error) *error = path + ": cannot create the trace file: " + std::strerror(errno);
    return false;
  }
  // Every block reserved now (glibc writes one byte per block where the file system has no
  // fallocate, and reports what that write met): a sparse file would fault (SIGBUS) on the
  // first store into a page the disk cannot back.
  int reserved = EFBIG;
  if (withinFileSizeLimit(bytes)) {
    do {
      reserved = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    } while (reserved == EINTR);
  }
  void* mapping = MAP_FAILED;
  if (reserved == 0) {
    mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED && error) {
      *error = path + ": cannot map the trace file: " + std::strerror(errno);
    }
  } else if (error) {
    *error = path + ": cannot reserve " + mebibytes(bytes) +
             " for the trace file: " + std::strerror(reserved);
  }
  if (mapping == MAP_FAILED) {
    ::close(fd);
    unlink(path.c_str());  // a file without its blocks is no trace
    return false;
  }
  capacity_ = capacity;
  // Blocks after the ring (segments, dumps) are appended with pwrite past the mapping; the
  // descriptor stays open.
  fd_ = fd;
  fileEnd_ = bytes;
  mappedBytes_ = bytes;
  path_ = path;
  memoryOnly_.store(false);
  header_ = static_cast<RingHeader*>(mapping);
  records_ = reinterpret_cast<CallRecord*>(static_cast<char*>(mapping) + kRingHeaderBytes);
  initializeHeader(info, options.mode == TraceMode::kFull);
  faultLine_ = "[ncclwatch] the trace file " + path +
               " lost its storage under the job (truncated, or its disk failed): recording goes "
               "on in memory only\n";
  faultFloor_ = SIZE_MAX;
  installBusGuard();
  g_guarded.store(this, std::memory_order_release);
  return true;
}

void RingWriter::openInMemory(const RingOptions& options, const ProcessInfo& info) {
  close();
  capacity_ = ringCapacityFor(options.capacity);
  size_t bytes = kRingHeaderBytes + static_cast<size_t>(capacity_) * sizeof(CallRecord);
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return;  // isOpen() stays false: no memory left for a ring
  fd_ = -1;
  fileEnd_ = bytes;
  mappedBytes_ = bytes;
  path_.clear();
  memoryOnly_.store(true);
  header_ = static_cast<RingHeader*>(mapping);
  records_ = reinterpret_cast<CallRecord*>(static_cast<char*>(mapping) + kRingHeaderBytes);
  initializeHeader(info, options.mode == TraceMode::kFull);
}

void RingWriter::initializeHeader(const ProcessInfo& info, bool continuous) {
  long page = sysconf(_SC_PAGESIZE);
  pageBytes_ = page > 0 ? static_cast<size_t>(page) : 4096;
  continuous_ = continuous;
  std::memset(writtenWaits_, 0, sizeof writtenWaits_);  // a fresh header has none
  if (continuous) {
    persistCursor_ = 0;
    segment_.assign(sizeof(SegmentHeader) + kSegmentRecords * sizeof(CallRecord), std::byte{0});
  }
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
  header_->traceMode = static_cast<uint32_t>(continuous ? TraceMode::kFull : TraceMode::kRing);
  copyText(header_->host, info.host);
  copyText(header_->jobId, info.jobId);
  // The magic goes last: a reader never takes a half-initialized header for a trace.
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(header_->magic, kRingMagic, sizeof kRingMagic);
  headerCopy_.resize(sizeof(RingHeader));
  std::memcpy(headerCopy_.data(), header_, sizeof(RingHeader));
}

bool RingWriter::updateState(uint64_t index, RecordState state, int64_t startNs,
                             int64_t completeNs) {
  CallRecord* target = slot(index);
  if (std::atomic_ref<uint64_t>(target->ringIndex).load(std::memory_order_relaxed) != index) {
    return false;  // overwritten by a newer record after the ring wrapped
  }
  writeSlot(target, [&] {
    std::atomic_ref<RecordState>(target->state).store(state, std::memory_order_relaxed);
    auto start = std::atomic_ref<int64_t>(target->startNs);
    if (startNs != 0 && start.load(std::memory_order_relaxed) == 0) {
      start.store(startNs, std::memory_order_relaxed);
    }
    auto complete = std::atomic_ref<int64_t>(target->completeNs);
    if (completeNs != 0 && complete.load(std::memory_order_relaxed) == 0) {
      complete.store(completeNs, std::memory_order_relaxed);
    }
  });
  return true;
}

bool RingWriter::updateFlags(uint64_t index, uint8_t set, uint8_t clear) {
  CallRecord* target = slot(index);
  if (std::atomic_ref<uint64_t>(target->ringIndex).load(std::memory_order_relaxed) != index) {
    return false;
  }
  writeSlot(target, [&] {
    auto flags = std::atomic_ref<uint8_t>(target->flags);
    flags.store(static_cast<uint8_t>((flags.load(std::memory_order_relaxed) & ~clear) | set),
                std::memory_order_relaxed);
  });
  return true;
}

bool RingWriter::updateResult(uint64_t index, int32_t result) {
  CallRecord* target = slot(index);
  if (std::atomic_ref<uint64_t>(target->ringIndex).load(std::memory_order_relaxed) != index) {
    return false;
  }
  writeSlot(target, [&] {
    std::atomic_ref<int32_t>(target->result).store(result, std::memory_order_relaxed);
  });
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
  copiedHeader()->comms[index] = comm;
}

void RingWriter::setRank(int rank, int world, int localRank) {
  for (RingHeader* header : {header_, copiedHeader()}) {
    header->rank = rank;
    header->world = world;
    header->localRank = localRank;
  }
}

void RingWriter::addRecordingSource(RecordingSource source) {
  atomicField(header_->recordingSources).fetch_or(source, std::memory_order_relaxed);
  copiedHeader()->recordingSources |= source;
}

void RingWriter::writeWaits(std::span<const WaitNote> notes) {
  // Only the entries that changed are rewritten, each with its check: a process that ends inside
  // this (killed, or _exit on another thread) leaves at most the entry being written torn, and a
  // reader keeps the others whole (trace/ring_reader.cc readWaits).
  size_t count = std::min<size_t>(notes.size(), kWaitNoteCapacity);
  WaitNote wanted[kWaitNoteCapacity]{};
  bool changed = false;
  for (size_t i = 0; i < kWaitNoteCapacity; ++i) {
    if (i < count && notes[i].commHash != 0) {
      wanted[i] = notes[i];
      wanted[i].check = 0;
      wanted[i].check = waitNoteCheck(wanted[i]);
    }
    changed |= std::memcmp(&wanted[i], &writtenWaits_[i], sizeof(WaitNote)) != 0;
  }
  if (!changed) return;
  auto version = atomicField(header_->waitsVersion);
  uint32_t inside = version.load(std::memory_order_relaxed) | 1u;
  version.store(inside, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < kWaitNoteCapacity; ++i) {
    if (std::memcmp(&wanted[i], &writtenWaits_[i], sizeof(WaitNote)) == 0) continue;
    // Word by word with relaxed atomics: a reader in another process may copy concurrently.
    const auto* from = reinterpret_cast<const uint64_t*>(&wanted[i]);
    auto* to = reinterpret_cast<uint64_t*>(&header_->waits[i]);
    for (size_t w = 0; w < sizeof(WaitNote) / 8; ++w) {
      std::atomic_ref<uint64_t>(to[w]).store(from[w], std::memory_order_relaxed);
    }
    writtenWaits_[i] = wanted[i];
  }
  version.store(inside + 1, std::memory_order_release);
}

void RingWriter::noteLastError(uint64_t index, const char* text) {
  if (header_ == nullptr || text == nullptr || text[0] == '\0') return;
  auto marker = atomicField(header_->lastErrorIndex);
  uint64_t previous = marker.load(std::memory_order_relaxed);
  if (previous == kLastErrorWriting ||
      !marker.compare_exchange_strong(previous, kLastErrorWriting, std::memory_order_acquire)) {
    return;
  }
  char copied[sizeof header_->lastError] = {};
  std::strncpy(copied, text, sizeof copied - 1);
  // NCCL keeps a thread's last message until its next error: the same text again is most likely
  // that older failure's (a call that failed without a message of its own), so it stays with it.
  if (previous != 0 && std::memcmp(copied, header_->lastError, sizeof copied) == 0) {
    marker.store(previous, std::memory_order_release);
    return;
  }
  // Byte by byte with relaxed atomics: a reader in another process may copy concurrently.
  for (size_t i = 0; i < sizeof copied; ++i) {
    std::atomic_ref<char>(header_->lastError[i]).store(copied[i], std::memory_order_relaxed);
  }
  marker.store(index + 1, std::memory_order_release);
}

void RingWriter::setNcclLibrary(int version, const std::string& path) {
  for (RingHeader* header : {header_, copiedHeader()}) {
    header->ncclVersion = version;
    copyText(header->ncclLibrary, path);
  }
}

void RingWriter::setExitStatus(int status) {
  if (header_ == nullptr) return;
  atomicField(header_->exitStatus).store(status);
  atomicField(header_->exitStatusKnown).store(1);
}

void RingWriter::markCleanShutdown() {
  if (continuous_) persistSegments(true);
  atomicField(header_->cleanShutdown).store(1);
}

uint64_t RingWriter::persistedRecords() const {
  if (header_ == nullptr) return 0;
  return atomicField(header_->persistedRecords).load(std::memory_order_acquire);
}

// One pwrite of a SegmentHeader and the `count` records staged after it in segment_, then the
// header's persisted counters. False when the write failed (the file is left as it was meant to
// be up to fileEnd_; the next segment overwrites what a short write left).
bool RingWriter::writeSegment(uint64_t firstIndex, uint32_t count) {
  SegmentHeader segment{};
  std::memcpy(segment.magic, kSegmentMagic, sizeof kSegmentMagic);
  segment.firstIndex = firstIndex;
  segment.recordCount = count;
  segment.checksum = segmentChecksum(firstIndex, count, segment_.data() + sizeof segment);
  std::memcpy(segment_.data(), &segment, sizeof segment);
  size_t bytes = sizeof segment + static_cast<size_t>(count) * sizeof(CallRecord);
  size_t done = 0;
  bool allowed = withinFileSizeLimit(fileEnd_ + bytes);
  while (done < bytes) {
    ssize_t wrote = allowed ? pwrite(fd_, segment_.data() + done, bytes - done,
                                     static_cast<off_t>(fileEnd_ + done))
                            : -1;
    if (wrote < 0 && allowed && errno == EINTR) continue;
    if (wrote <= 0) {
      failedSegmentWrites_.fetch_add(1, std::memory_order_relaxed);
      atomicField(header_->failedSegmentWrites).fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    done += static_cast<size_t>(wrote);
  }
  fileEnd_ += bytes;
  atomicField(header_->persistedBytes).store(fileEnd_, std::memory_order_release);
  return true;
}

void RingWriter::noteFatalSignal(int signal, int threadId) {
  if (header_ == nullptr) return;
  std::atomic_ref<int32_t>(header_->fatalThread).store(threadId, std::memory_order_relaxed);
  std::atomic_ref<int32_t>(header_->fatalSignal).store(signal, std::memory_order_release);
}

uint64_t RingWriter::nextIndex() const {
  if (header_ == nullptr) return 0;
  uint64_t next = atomicField(header_->nextIndex).load(std::memory_order_acquire);
  // What a repaired header restarts above (recoverFault); readers are background threads.
  if (next > lastSeenNext_.load(std::memory_order_relaxed)) {
    lastSeenNext_.store(next, std::memory_order_relaxed);
  }
  return next;
}

uint32_t RingWriter::commCount() const {
  if (header_ == nullptr) return 0;
  return std::min(atomicField(header_->commCount).load(std::memory_order_acquire),
                  kCommTableCapacity);
}

std::vector<CommInfo> RingWriter::comms() const {
  std::vector<CommInfo> table;
  if (header_ == nullptr) return table;
  table.assign(header_->comms, header_->comms + commCount());
  return table;
}

bool RingWriter::read(uint64_t index, CallRecord* record) const {
  if (header_ == nullptr) return false;
  return loadStableSlot(slot(index), record) && record->ringIndex == index;
}

void RingWriter::callerAt(uint64_t index, uint64_t* callSite, int32_t* threadId) const {
  *callSite = 0;
  *threadId = 0;
  if (header_ == nullptr) return;
  // Whole words, as storeBody writes them: a narrower atomic load inside a word another thread
  // stores whole would be a mixed-size access.
  static_assert(offsetof(CallRecord, callSite) % 8 == 0);
  constexpr size_t kThreadWord = offsetof(CallRecord, threadId) / 8;
  constexpr size_t kThreadShift = offsetof(CallRecord, threadId) % 8 * 8;
  static_assert(kThreadWord < kBodyWords && kThreadShift <= 32);
  uint64_t* body = words(slot(index));
  *callSite = std::atomic_ref<uint64_t>(body[offsetof(CallRecord, callSite) / 8])
                  .load(std::memory_order_relaxed);
  uint64_t word = std::atomic_ref<uint64_t>(body[kThreadWord]).load(std::memory_order_relaxed);
  *threadId = static_cast<int32_t>(static_cast<uint32_t>(word >> kThreadShift));
}

bool RingWriter::appendDump(std::string_view text) {
  return appendTextBlock(kDumpMagic, text);
}

bool RingWriter::appendSites(std::string_view text) {
  return appendTextBlock(kSitesMagic, text);
}

bool RingWriter::appendTextBlock(const char (&magic)[8], std::string_view text) {
  std::lock_guard<std::mutex> lock(persistMutex_);
  if (header_ == nullptr || text.empty() || text.size() > kMaxDumpBytes) return false;
  if (fd_ < 0 || memoryOnly()) {
    noteUnwrittenBlock();
    return false;
  }
  std::vector<std::byte> block(sizeof(DumpHeader) + paddedDumpBytes(text.size()), std::byte{0});
  std::memcpy(block.data() + sizeof(DumpHeader), text.data(), text.size());
  DumpHeader dump{};
  std::memcpy(dump.magic, magic, sizeof magic);
  dump.textBytes = text.size();
  dump.checksum = dumpChecksum(text.size(), block.data() + sizeof(DumpHeader));
  std::memcpy(block.data(), &dump, sizeof dump);
  size_t done = 0;
  bool allowed = withinFileSizeLimit(fileEnd_ + block.size());
  while (done < block.size()) {
    ssize_t wrote = allowed ? pwrite(fd_, block.data() + done, block.size() - done,
                                     static_cast<off_t>(fileEnd_ + done))
                            : -1;
    if (wrote < 0 && allowed && errno == EINTR) continue;
    if (wrote <= 0) {
      // The next block goes where this one started: what a short write left is overwritten.
      noteUnwrittenBlock();
      return false;
    }
    done += static_cast<size_t>(wrote);
  }
  fileEnd_ += block.size();
  atomicField(header_->persistedBytes).store(fileEnd_, std::memory_order_release);
  return true;
}

size_t RingWriter::persistSegments(bool everything) {
  std::lock_guard<std::mutex> lock(persistMutex_);
  // Memory only: nothing to persist to (the one line at start or at the fault said so).
  if (header_ == nullptr || !continuous_ || memoryOnly()) return 0;
  // Indices below persistCursor_ are written or dropped; `cursor` is the next one looked at and
  // [first, first + staged) the records copied into segment_ but not yet written.
  uint64_t next = atomicField(header_->nextIndex).load(std::memory_order_acquire);
  uint64_t cursor = persistCursor_;
  uint64_t dropped = 0;
  if (next - cursor > capacity_) {
    // Their slots hold newer records (or are about to): gone.
    dropped += next - capacity_ - cursor;
    cursor = next - capacity_;
    persistCursor_ = cursor;
  }
  int64_t now = clockNs(CLOCK_MONOTONIC);
  uint64_t forcedBelow = next > capacity_ / 2 ? next - capacity_ / 2 : 0;
  size_t persisted = 0;
  uint64_t first = cursor;  // ring index of the first staged record
  uint32_t staged = 0;
  auto flush = [&]() -> bool {
    if (staged == 0) return true;
    if (!writeSegment(first, staged)) return false;
    persisted += staged;
    persistCursor_ = first + staged;
    staged = 0;
    return true;
  };
  bool failed = false;
  while (cursor < next) {
    CallRecord record;
    if (!loadStableSlot(slot(cursor), &record)) break;  // a writer is inside: next time
    if (record.slotVersion == 0 || record.ringIndex < cursor) break;  // reserved, not yet written
    if (record.ringIndex > cursor) {
      // Overwritten before it was persisted: a gap, so the segment ends here.
      if (!flush()) {
        failed = true;
        break;
      }
      ++dropped;
      persistCursor_ = ++cursor;
      first = cursor;
      continue;
    }
    if (!everything && cursor >= forcedBelow && !isFinal(record, now)) break;
    if (staged == 0) first = cursor;
    std::memcpy(segment_.data() + sizeof(SegmentHeader) + staged * sizeof(CallRecord), &record,
                sizeof record);
    ++staged;
    ++cursor;
    if (staged == kSegmentRecords && !flush()) {
      failed = true;
      break;
    }
  }
  // Every index below `cursor` is now written or dropped, unless a write failed: then
  // persistCursor_ stays at the first record of the failed segment, tried again next time.
  if (!failed && flush()) persistCursor_ = cursor;
  if (dropped != 0)
    atomicField(header_->droppedRecords).fetch_add(dropped, std::memory_order_relaxed);
  atomicField(header_->persistedRecords).store(persistCursor_, std::memory_order_release);
  return persisted;
}

void RingWriter::noteUnwrittenBlock() {
  unwrittenBlocks_.fetch_add(1, std::memory_order_relaxed);
  atomicField(header_->unwrittenBlocks).fetch_add(1, std::memory_order_relaxed);
}

RingWriter::Losses RingWriter::losses() const {
  Losses losses;
  losses.unwrittenBlocks = unwrittenBlocks_.load(std::memory_order_relaxed);
  losses.failedSegmentWrites = failedSegmentWrites_.load(std::memory_order_relaxed);
  losses.mappingFaults = mappingFaults_.load(std::memory_order_relaxed);
  if (header_ != nullptr) {
    losses.droppedRecords = atomicField(header_->droppedRecords).load(std::memory_order_relaxed);
  }
  return losses;
}

RingHeader* RingWriter::copiedHeader() {
  return reinterpret_cast<RingHeader*>(headerCopy_.data());
}

bool RingWriter::recoverFault(const void* address) {
  RingWriter* writer = g_guarded.load(std::memory_order_acquire);
  if (writer == nullptr || writer->header_ == nullptr) return false;
  auto* base = reinterpret_cast<const char*>(writer->header_);
  auto* at = static_cast<const char*>(address);
  if (at < base || at >= base + writer->mappedBytes_) return false;
  // Threads faulting together repair one at a time; the later ones find their page repaired.
  while (writer->faultLock_.exchange(1, std::memory_order_acquire) != 0) {
  }
  size_t page = writer->pageBytes_;
  size_t offset = static_cast<size_t>(at - base) & ~(page - 1);
  if (offset < writer->faultFloor_) {
    size_t bytes = page;
    struct stat file {};
    if (writer->fd_ >= 0 && fstat(writer->fd_, &file) == 0) {
      // Past the file's end every page faults: replace them all at once.
      size_t backed = (static_cast<size_t>(file.st_size) + page - 1) & ~(page - 1);
      if (offset >= backed) {
        offset = backed;
        bytes = writer->mappedBytes_ - backed;
        writer->faultFloor_ = backed;
      }
    }
    writer->replaceWithMemory(offset, bytes);
  }
  writer->faultLock_.store(0, std::memory_order_release);
  return true;
}

// In the SIGBUS handler: mmap, memcpy and write only.
void RingWriter::replaceWithMemory(size_t offset, size_t bytes) {
  char* base = reinterpret_cast<char*>(header_);
  mmap(base + offset, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
       0);
  if (offset < sizeof(RingHeader)) {
    // The header's identity comes back from the copy; indices restart far above any used so
    // far, so that readers take the jump for records lost, never for time going backwards.
    size_t restored = std::min(bytes, sizeof(RingHeader) - offset);
    std::memcpy(base + offset, headerCopy_.data() + offset, restored);
    // The wait notes as last written (the copy taken at open has none): writeWaits rewrites
    // only the entries that change.
    size_t waitsAt = offsetof(RingHeader, waits);
    if (offset <= waitsAt && offset + restored >= waitsAt + sizeof header_->waits) {
      std::memcpy(base + waitsAt, writtenWaits_, sizeof writtenWaits_);
    }
    if (offset <= offsetof(RingHeader, nextIndex)) {
      header_->nextIndex = lastSeenNext_.load(std::memory_order_relaxed) + (uint64_t{1} << 32);
    }
  }
  bool first = !memoryOnly_.exchange(true, std::memory_order_acq_rel);
  uint32_t faults = mappingFaults_.fetch_add(1, std::memory_order_relaxed) + 1;
  atomicField(header_->mappingFaults).store(faults, std::memory_order_relaxed);
  if (first) {
    ssize_t ignored = write(STDERR_FILENO, faultLine_.data(), faultLine_.size());
    (void)ignored;
  }
}

void RingWriter::forgetAfterFork() {
  RingWriter* self = this;
  g_guarded.compare_exchange_strong(self, nullptr);
  if (header_ != nullptr) munmap(header_, mappedBytes_);
  if (fd_ >= 0) ::close(fd_);
  header_ = nullptr;
  records_ = nullptr;
  fd_ = -1;
  continuous_ = false;
  // A parent thread may have held the lock at fork(): the child's copy would stay locked.
  new (&persistMutex_) std::mutex();
}

void RingWriter::close() {
  if (header_ == nullptr) return;
  if (continuous_) persistSegments(true);
  std::lock_guard<std::mutex> lock(persistMutex_);
  RingWriter* self = this;
  g_guarded.compare_exchange_strong(self, nullptr);
  if (!memoryOnly()) msync(header_, kRingHeaderBytes, MS_ASYNC);
  munmap(header_, mappedBytes_);
  if (fd_ >= 0) ::close(fd_);
  header_ = nullptr;
  records_ = nullptr;
  fd_ = -1;
  continuous_ = false;
}

}  // namespace ncclwatch::trace
