#include "watchdog/loaded_modules.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ncclwatch::watchdog {
namespace {

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
constexpr bool kHaveFindObject = true;
#else
constexpr bool kHaveFindObject = false;
#endif

bool parseHex(const char*& p, uintptr_t* value) {
  uintptr_t v = 0;
  const char* start = p;
  for (;; ++p) {
    const char c = *p;
    if (c >= '0' && c <= '9') {
      v = v * 16 + static_cast<uintptr_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = v * 16 + static_cast<uintptr_t>(c - 'a' + 10);
    } else {
      break;
    }
  }
  *value = v;
  return p != start;
}

void skipField(const char*& p) {
  while (*p == ' ') ++p;
  while (*p != ' ' && *p != '\0') ++p;
  while (*p == ' ') ++p;
}

// One /proc/self/maps line: "start-end perms offset dev inode   path".
bool visitLine(char* line, bool (*visit)(const LoadedModuleView&, void*), void* context,
               LoadedModuleView& module) {
  const char* p = line;
  uintptr_t start = 0;
  uintptr_t end = 0;
  uintptr_t offset = 0;
  if (!parseHex(p, &start) || *p++ != '-' || !parseHex(p, &end) || *p++ != ' ') return true;
  const bool readable = p[0] == 'r';
  skipField(p);  // perms
  if (!parseHex(p, &offset)) return true;
  if (!readable || offset != 0 || end <= start) return true;
  while (*p == ' ') ++p;
  skipField(p);                                     // dev
  skipField(p);                                     // inode
  if (loadedMapStart(start) != start) return true;  // not an object the loader knows
  ElfW(Ehdr) header;
  if (!readOwnMemory(start, &header, sizeof(header)) ||
      std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_phentsize != sizeof(ElfW(Phdr)) || header.e_phnum == 0 ||
      header.e_phnum > kMaxModulePhdrs ||
      !readOwnMemory(start + header.e_phoff, module.phdrs, header.e_phnum * sizeof(ElfW(Phdr)))) {
    return true;
  }
  module.mapStart = start;
  module.mapEnd = end;
  module.phnum = header.e_phnum;
  module.path = p;
  module.bias = 0;
  const uintptr_t pageMask = ~(static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)) - 1);
  for (int i = 0; i < module.phnum; ++i) {
    if (module.phdrs[i].p_type == PT_LOAD) {
      module.bias = start - (module.phdrs[i].p_vaddr & pageMask);
      break;
    }
  }
  return visit(module, context);
}

}  // namespace

uintptr_t loadedMapStart(uintptr_t address) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
  dl_find_object found;
  if (_dl_find_object(reinterpret_cast<void*>(address), &found) == 0) {
    return reinterpret_cast<uintptr_t>(found.dlfo_map_start);
  }
#else
  (void)address;
#endif
  return 0;
}

bool readOwnMemory(uintptr_t address, void* out, size_t size) {
  iovec local{out, size};
  iovec remote{reinterpret_cast<void*>(address), size};
  const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(size)) return true;
  if (n < 0 && (errno == ENOSYS || errno == EPERM)) {
    // Filtered out (seccomp): read directly. The module was listed by the loader an instant ago.
    std::memcpy(out, reinterpret_cast<const void*>(address), size);
    return true;
  }
  return false;
}

bool forEachLoadedModule(bool (*visit)(const LoadedModuleView& module, void* context),
                         void* context) {
  if (!kHaveFindObject) return false;
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char chunk[8192];
  char line[4400];
  size_t length = 0;
  LoadedModuleView module;
  bool more = true;
  while (more) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n && more; ++i) {
      if (chunk[i] != '\n') {
        if (length < sizeof(line) - 1) line[length++] = chunk[i];
        continue;
      }
      line[length] = '\0';
      more = visitLine(line, visit, context, module);
      length = 0;
    }
  }
  ::close(fd);
  return true;
}

}  // namespace ncclwatch::watchdog
