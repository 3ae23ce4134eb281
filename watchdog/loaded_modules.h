// The ELF modules loaded in this process, listed without the loader's lock: a thread may hang
// inside dl_iterate_phdr or dlopen (holding it) at the very moment the watchdog must dump.
// Internal to watchdog/stacks.
//
// Source: /proc/self/maps (the kernel's view), each offset-0 mapping confirmed as a loaded
// object by _dl_find_object (lock-free, glibc >= 2.35), headers copied with process_vm_readv so
// that a module unloaded meanwhile reads as an error instead of a crash. No allocation.
#pragma once
#include <link.h>

#include <cstddef>
#include <cstdint>

namespace ncclwatch::watchdog {

inline constexpr int kMaxModulePhdrs = 64;

struct LoadedModuleView {
  uintptr_t mapStart = 0;  // first mapping (holds the ELF header)
  uintptr_t mapEnd = 0;    // end of that first mapping
  uintptr_t bias = 0;      // dlpi_addr: run-time address minus link-time address
  int phnum = 0;
  ElfW(Phdr) phdrs[kMaxModulePhdrs];
  const char* path = "";  // from /proc/self/maps; "[vdso]" for the vDSO
};

// Calls visit(module, context) for each loaded module until it returns false. False when the
// lock-free listing is unavailable (old glibc, no /proc): callers fall back to dl_iterate_phdr.
bool forEachLoadedModule(bool (*visit)(const LoadedModuleView& module, void* context),
                         void* context);

// Copies `size` bytes at `address` of this process; false (not a crash) when unmapped.
bool readOwnMemory(uintptr_t address, void* out, size_t size);

// _dl_find_object(address)->dlfo_map_start, or 0. Lock-free and async-signal-safe.
uintptr_t loadedMapStart(uintptr_t address);

}  // namespace ncclwatch::watchdog
