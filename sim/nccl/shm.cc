#include "shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "cudasim_ext.h"

namespace ncclsim {

void futexWaitShared(std::atomic<uint32_t>* word, uint32_t expected, int timeoutMs) {
  timespec timeout{timeoutMs / 1000, (timeoutMs % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void futexWakeShared(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

namespace {
constexpr size_t alignUp(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr size_t kSlotsOffset = alignUp(sizeof(SegmentHeader), 64);

// Segment names whose communicator completed its init in this process. A unique id makes one
// communicator: once all its ranks joined, its segment's name is gone (the last rank unlinks it),
// as NCCL's root closes its bootstrap socket. A process that creates that name again is using a
// stale id.
std::mutex gUsedUpMutex;
std::set<std::string>& usedUpNames() {
  static auto* names = new std::set<std::string>();  // lives for the process
  static pid_t owner = getpid();
  if (owner != getpid()) {  // a fork child attaches on its own account
    names->clear();
    owner = getpid();
  }
  return *names;
}
}  // namespace

size_t Segment::sizeFor(int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  return kSlotsOffset + n * sizeof(RankSlot) + n * n * sizeof(Mailbox);
}

RankSlot* Segment::slot(int rank) const {
  return reinterpret_cast<RankSlot*>(static_cast<char*>(base_.load(std::memory_order_acquire)) +
                                     kSlotsOffset) +
         rank;
}

Mailbox* Segment::mailbox(int src, int dst) const {
  auto* first =
      reinterpret_cast<Mailbox*>(static_cast<char*>(base_.load(std::memory_order_acquire)) +
                                 kSlotsOffset + static_cast<size_t>(nranks_) * sizeof(RankSlot));
  return first + static_cast<size_t>(src) * nranks_ + dst;
}

Segment::~Segment() {
  if (void* base = base_.load()) munmap(base, size_);
}

std::string Segment::attach(const std::string& name, int nranks) {
  name_ = name;
  nranks_ = nranks;
  size_ = sizeFor(nranks);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  const bool creator = fd >= 0;
  if (creator) {
    // Only a name whose communicator completed counts: ranks of one communicator initialising
    // concurrently in this process (ncclCommInitAll, a group of inits) race for O_EXCL, and the
    // loser must find the winner's segment, not a stale-id error that unlinks it.
    std::lock_guard<std::mutex> lock(gUsedUpMutex);
    if (usedUpNames().count(name)) {
      close(fd);
      shm_unlink(name.c_str());
      return "the unique id was already used up by a communicator of this process (a stale id): "
             "its root no longer accepts ranks";
    }
  }
  if (!creator) {
    if (errno != EEXIST) return "shm_open " + name + ": " + std::strerror(errno);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) return "shm_open " + name + ": " + std::strerror(errno);
    // The creator may still be sizing it: wait (briefly, it is a few syscalls away) for the size.
    struct stat info {};
    for (int attempt = 0;
         fstat(fd, &info) == 0 && info.st_size < static_cast<off_t>(sizeof(SegmentHeader));
         ++attempt) {
      if (attempt > 30000) {
        close(fd);
        return "segment " + name + " was never initialized by its creator";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (info.st_size != static_cast<off_t>(size_)) {
      close(fd);
      return "segment " + name + " has the size for another rank count: ranks disagree on nranks";
    }
  } else if (ftruncate(fd, static_cast<off_t>(size_)) != 0) {
    const std::string message = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    shm_unlink(name.c_str());
    return message;
  }
  void* mapped = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) return std::string("mmap: ") + std::strerror(errno);
  base_.store(mapped, std::memory_order_release);
  SegmentHeader* head = header();
  if (creator) {
    head->nranks = nranks;
    head->size = size_;
    head->ready.store(kSegmentReadyMagic, std::memory_order_release);
    return {};
  }
  for (int attempt = 0; head->ready.load(std::memory_order_acquire) != kSegmentReadyMagic;
       ++attempt) {
    if (attempt > 30000) return "segment " + name + " was never initialized by its creator";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (head->nranks != nranks) {
    return "ranks disagree on nranks (" + std::to_string(head->nranks) + " vs " +
           std::to_string(nranks) + ")";
  }
  return {};
}

void Segment::markUsedUp() const {
  std::lock_guard<std::mutex> lock(gUsedUpMutex);
  usedUpNames().insert(name_);
}

void Segment::unlinkName() {
  shm_unlink(name_.c_str());
}

void Segment::notifyAll() {
  SegmentHeader* head = header();
  head->wakeWord.fetch_add(1, std::memory_order_seq_cst);
  if (head->sleepers.load(std::memory_order_seq_cst) > 0) futexWakeShared(&head->wakeWord);
}

void Segment::sleep(uint32_t seenValue, int timeoutMs) {
  SegmentHeader* head = header();
  head->sleepers.fetch_add(1, std::memory_order_seq_cst);
  futexWaitShared(&head->wakeWord, seenValue, timeoutMs);
  head->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

namespace {

struct HeapMappings {
  std::mutex mutex;
  std::map<std::pair<int, int>, const char*> byOwner;
};

HeapMappings& heapMappings() {
  // Leaked on purpose: stream threads may still read through it during static destruction.
  static HeapMappings* mappings = new HeapMappings;
  return *mappings;
}

}  // namespace

const void* mapHeapRef(const HeapRef& ref, std::string* error) {
  if (ref.pid == 0) {
    *error = "no buffer";
    return nullptr;
  }
  const size_t heapSize = cudasimHeapSize();
  if (ref.offset > heapSize) {
    *error = "heap offset out of range";
    return nullptr;
  }
  HeapMappings& mappings = heapMappings();
  std::lock_guard<std::mutex> lock(mappings.mutex);
  auto found = mappings.byOwner.find({ref.pid, ref.fd});
  if (found == mappings.byOwner.end()) {
    // Like CUDA IPC: open the owner's memfd through /proc and map all of it, once.
    const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      *error = "open " + path + ": " + std::strerror(errno);
      return nullptr;
    }
    void* base = mmap(nullptr, heapSize, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      *error = "mmap " + path + ": " + std::strerror(errno);
      return nullptr;
    }
    found =
        mappings.byOwner.emplace(std::make_pair(ref.pid, ref.fd), static_cast<const char*>(base))
            .first;
  }
  return found->second + ref.offset;
}

void forgetHeapMappingsAfterFork() {
  // The child inherits the mappings themselves, which stay valid; only the mutex may have been
  // held by a parent thread at fork time.
  new (&heapMappings().mutex) std::mutex;
}

void removeStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    const char* prefix = "ncclsim-";
    if (std::strncmp(entry->d_name, prefix, std::strlen(prefix)) != 0) continue;
    const long pid = std::strtol(entry->d_name + std::strlen(prefix), nullptr, 10);
    if (pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      shm_unlink((std::string("/") + entry->d_name).c_str());
    }
  }
  closedir(dir);
}

}  // namespace ncclsim
