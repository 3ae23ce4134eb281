#include "watchdog/native_sites.h"

#include <cinttypes>
#include <cstdio>
#include <string>

#include "watchdog/loaded_modules.h"
#include "watchdog/stacks.h"

namespace ncclwatch::watchdog {
namespace {

struct ModuleSearch {
  uintptr_t address = 0;
  std::string text;
};

bool findModule(const LoadedModuleView& module, void* context) {
  auto* search = static_cast<ModuleSearch*>(context);
  for (int i = 0; i < module.phnum; ++i) {
    const ElfW(Phdr)& phdr = module.phdrs[i];
    if (phdr.p_type != PT_LOAD) continue;
    uintptr_t start = module.bias + phdr.p_vaddr;
    if (search->address < start || search->address - start >= phdr.p_memsz) continue;
    char offset[32];
    std::snprintf(offset, sizeof offset, "+0x%" PRIxPTR, search->address - module.bias);
    search->text = std::string(module.path) + offset;
    return false;
  }
  return true;
}

// The thread's name (/proc/self/task/<tid>/comm); "" when it is gone.
std::string threadName(int32_t tid) {
  if (tid <= 0) return "";
  char name[32];
  readTaskFile(tid, "comm", name, sizeof name);
  return name;
}

}  // namespace

std::string moduleOffsetText(uintptr_t address) {
  ModuleSearch search{address, {}};
  forEachLoadedModule(findModule, &search);
  return search.text;
}

std::vector<trace::PythonSite> NativeSites::scan(const trace::RingWriter& writer) {
  std::vector<trace::PythonSite> found;
  const uint64_t end = writer.nextIndex();
  const uint64_t capacity = writer.capacity();
  if (end - next_ > capacity) next_ = end - capacity;  // lapped: the older slots hold newer calls
  for (; next_ < end; ++next_) {
    // Two words of the slot, not a stable copy of the record: a torn read only describes an
    // address no record keeps, or names another thread (harmless); a site that was in the slot
    // overwritten before the scan comes back with its next call.
    uint64_t site = 0;
    int32_t thread = 0;
    writer.callerAt(next_, &site, &thread);
    // Calls come in runs from one site (a loop): the last one seen costs no hash lookup.
    if (site == lastSite_ || site == 0 || trace::isPythonSite(site)) continue;
    lastSite_ = site;
    if (seen_.size() >= kMaxNativeSites || !seen_.insert(site).second) continue;
    std::string text = moduleOffsetText(static_cast<uintptr_t>(site));
    if (text.empty()) continue;
    trace::PythonSite line;
    line.number = trace::kNativeSiteNumber;
    line.nativeSite = site;
    line.frames.push_back(std::move(text));
    // The thread of its first call, by name: a framework's threads say what they do
    // (pt_autograd_0: backward, where DDP's reducer all-reduces).
    std::string name = threadName(thread);
    if (!name.empty()) line.frames.push_back(std::string(trace::kNativeSiteThreadPrefix) + name);
    found.push_back(std::move(line));
  }
  return found;
}

}  // namespace ncclwatch::watchdog
