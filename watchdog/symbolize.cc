// Symbolization half of watchdog/stacks.h. Runs on a normal thread, after capture: it may
// allocate, take the loader lock (dl_iterate_phdr, dladdr) and read files.
//
// Function names come from the module file's own .symtab (or .dynsym when stripped), read with
// a small ELF reader and cached per (path, build-id): dladdr only sees exported symbols, and
// everything in a -fvisibility=hidden library is invisible to it. The module list comes from
// loaded_modules.h, without the loader's lock, so symbolizing works while a hung thread holds
// it; dladdr is used only where that listing is unavailable.
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "watchdog/loaded_modules.h"
#include "watchdog/stacks.h"

namespace ncclwatch::watchdog {
namespace {

struct LoadedModule {
  std::string path;
  uintptr_t bias = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [start, end) of each PT_LOAD
  std::string buildId;
  uintptr_t mapStart = 0;  // first mapping: the in-memory image, read for the vDSO
  uintptr_t mapEnd = 0;
};

std::string hex(const unsigned char* bytes, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

// The GNU build-id in a note segment of `size` bytes at `notes`, or "".
std::string buildIdInNotes(const unsigned char* notes, size_t size, size_t align) {
  if (align != 8) align = 4;
  auto up = [align](size_t v) { return (v + align - 1) & ~(align - 1); };
  size_t offset = 0;
  while (offset + sizeof(ElfW(Nhdr)) <= size) {
    ElfW(Nhdr) note;
    std::memcpy(&note, notes + offset, sizeof(note));
    const size_t nameAt = offset + sizeof(note);
    const size_t descAt = nameAt + up(note.n_namesz);
    const size_t next = descAt + up(note.n_descsz);
    if (descAt > size || note.n_descsz > size - descAt || next <= offset) break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
        std::memcmp(notes + nameAt, "GNU", 4) == 0) {
      return hex(notes + descAt, note.n_descsz);
    }
    offset = next;
  }
  return "";
}

std::string mainProgramPath() {
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  return std::string(buffer, static_cast<size_t>(n));
}

void addModule(std::vector<LoadedModule>& modules, std::string path, uintptr_t bias,
               const ElfW(Phdr) * phdrs, int phnum) {
  LoadedModule module;
  module.bias = bias;
  module.path = std::move(path);
  for (int i = 0; i < phnum; ++i) {
    const ElfW(Phdr)& phdr = phdrs[i];
    if (phdr.p_type == PT_LOAD) {
      module.ranges.emplace_back(bias + phdr.p_vaddr, bias + phdr.p_vaddr + phdr.p_memsz);
    } else if (phdr.p_type == PT_NOTE && module.buildId.empty() && phdr.p_memsz < (1u << 16)) {
      std::vector<unsigned char> notes(phdr.p_memsz);
      if (readOwnMemory(bias + phdr.p_vaddr, notes.data(), notes.size())) {
        module.buildId = buildIdInNotes(notes.data(), notes.size(), phdr.p_align);
      }
    }
  }
  modules.push_back(std::move(module));
}

bool addListed(const LoadedModuleView& view, void* data) {
  auto* modules = static_cast<std::vector<LoadedModule>*>(data);
  addModule(*modules, view.path, view.bias, view.phdrs, view.phnum);
  modules->back().mapStart = view.mapStart;
  modules->back().mapEnd = view.mapEnd;
  return true;
}

int addIterated(dl_phdr_info* info, size_t, void* data) {
  auto* modules = static_cast<std::vector<LoadedModule>*>(data);
  std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (path.empty() && modules->empty()) path = mainProgramPath();
  addModule(*modules, std::move(path), info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum);
  return 0;
}

// Without the loader's lock where possible: a hung thread may hold it.
std::vector<LoadedModule> loadedModules(bool* lockFree) {
  std::vector<LoadedModule> modules;
  *lockFree = forEachLoadedModule(addListed, &modules);
  if (!*lockFree) {
    modules.clear();
    dl_iterate_phdr(addIterated, &modules);
  }
  return modules;
}

const LoadedModule* moduleOf(const std::vector<LoadedModule>& modules, uintptr_t pc) {
  for (const LoadedModule& module : modules) {
    for (const auto& [start, end] : module.ranges) {
      if (pc >= start && pc < end) return &module;
    }
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// A module's function symbols, read from its file.

struct Symbol {
  uintptr_t start;  // link-time address (st_value)
  uintptr_t size;   // 0: up to the next symbol
  uint32_t name;    // offset in names
  int rank;         // lower is preferred among aliases: global, weak, local
};

struct SymbolTable {
  std::vector<Symbol> symbols;  // sorted by start, then rank
  std::string names;

  // The function containing link-time address `address`.
  const Symbol* find(uintptr_t address) const {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), address,
                               [](uintptr_t a, const Symbol& s) { return a < s.start; });
    if (it == symbols.begin()) return nullptr;
    --it;
    const uintptr_t start = it->start;
    auto next = it + 1;
    while (it != symbols.begin() && (it - 1)->start == start) --it;
    if (it->size != 0) return address < start + it->size ? &*it : nullptr;
    return next == symbols.end() || address < next->start ? &*it : nullptr;
  }
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (data != MAP_FAILED) {
        data_ = static_cast<const unsigned char*>(data);
        size_ = static_cast<size_t>(st.st_size);
      }
    }
    ::close(fd);
  }
  // A copy of this process's memory [start, end), for images without a file (the vDSO).
  MappedFile(uintptr_t start, uintptr_t end) : copy_(end - start) {
    if (end > start && end - start < (1u << 24) &&
        readOwnMemory(start, copy_.data(), copy_.size())) {
      data_ = copy_.data();
      size_ = copy_.size();
    }
  }
  ~MappedFile() {
    if (data_ != nullptr && copy_.empty()) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  bool contains(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }
  const unsigned char* at(uint64_t offset) const { return data_ + offset; }
  bool ok() const { return data_ != nullptr; }

 private:
  std::vector<unsigned char> copy_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

void addSymbols(const MappedFile& file, const ElfW(Shdr) & symtab, const ElfW(Shdr) & strtab,
                SymbolTable& table) {
  if (symtab.sh_entsize != sizeof(ElfW(Sym)) || !file.contains(symtab.sh_offset, symtab.sh_size) ||
      !file.contains(strtab.sh_offset, strtab.sh_size)) {
    return;
  }
  const char* strings = reinterpret_cast<const char*>(file.at(strtab.sh_offset));
  const size_t count = symtab.sh_size / sizeof(ElfW(Sym));
  for (size_t i = 0; i < count; ++i) {
    ElfW(Sym) sym;
    std::memcpy(&sym, file.at(symtab.sh_offset + i * sizeof(sym)), sizeof(sym));
    const int type = ELF64_ST_TYPE(sym.st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF ||
        sym.st_value == 0 || sym.st_name >= strtab.sh_size) {
      continue;
    }
    const char* name = strings + sym.st_name;
    const size_t length = strnlen(name, strtab.sh_size - sym.st_name);
    if (length == 0 || length == strtab.sh_size - sym.st_name) continue;
    const int binding = ELF64_ST_BIND(sym.st_info);
    const int rank = binding == STB_GLOBAL ? 0 : binding == STB_WEAK ? 1 : 2;
    table.symbols.push_back(
        {sym.st_value, sym.st_size, static_cast<uint32_t>(table.names.size()), rank});
    table.names.append(name, length);
    table.names.push_back('\0');
  }
}

// Reads the symbols of the ELF file at `path`; empty when the file is not the one loaded
// (its build-id differs from `buildId`).
std::unique_ptr<SymbolTable> loadSymbols(const LoadedModule& module) {
  auto table = std::make_unique<SymbolTable>();
  const std::string& buildId = module.buildId;
  const bool inMemory = module.path == "[vdso]";
  MappedFile file = inMemory ? MappedFile(module.mapStart, module.mapEnd) : MappedFile(module.path);
  if (!file.ok() || !file.contains(0, sizeof(ElfW(Ehdr)))) return table;
  ElfW(Ehdr) header;
  std::memcpy(&header, file.at(0), sizeof(header));
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32) ||
      header.e_shentsize != sizeof(ElfW(Shdr)) ||
      !file.contains(header.e_shoff, uint64_t{header.e_shnum} * sizeof(ElfW(Shdr)))) {
    return table;
  }
  std::vector<ElfW(Shdr)> sections(header.e_shnum);
  if (!sections.empty()) {
    std::memcpy(sections.data(), file.at(header.e_shoff), sections.size() * sizeof(ElfW(Shdr)));
  }
  if (!buildId.empty()) {
    std::string fileBuildId;
    for (const ElfW(Shdr) & section : sections) {
      if (section.sh_type == SHT_NOTE && file.contains(section.sh_offset, section.sh_size)) {
        fileBuildId =
            buildIdInNotes(file.at(section.sh_offset), section.sh_size, section.sh_addralign);
        if (!fileBuildId.empty()) break;
      }
    }
    if (fileBuildId != buildId) return table;
  }
  bool haveSymtab = false;
  for (const ElfW(Shdr) & section : sections) haveSymtab |= section.sh_type == SHT_SYMTAB;
  const uint32_t wanted = haveSymtab ? SHT_SYMTAB : SHT_DYNSYM;
  for (const ElfW(Shdr) & section : sections) {
    if (section.sh_type == wanted && section.sh_link < sections.size()) {
      addSymbols(file, section, sections[section.sh_link], *table);
    }
  }
  std::sort(table->symbols.begin(), table->symbols.end(), [](const Symbol& a, const Symbol& b) {
    return a.start != b.start ? a.start < b.start : a.rank < b.rank;
  });
  return table;
}

std::mutex g_cacheLock;
// Leaked on purpose: symbolization may run while the process exits.
auto* g_cache = new std::map<std::string, std::unique_ptr<SymbolTable>>();

const SymbolTable* cachedTable(const LoadedModule& module, bool mayLoad) {
  const std::string key = module.path + '\n' + module.buildId;
  std::lock_guard<std::mutex> lock(g_cacheLock);
  auto it = g_cache->find(key);
  if (it != g_cache->end()) return it->second.get();
  if (!mayLoad) return nullptr;
  auto table = loadSymbols(module);
  return g_cache->emplace(key, std::move(table)).first->second.get();
}

std::string demangle(const char* name) {
  if (name[0] != '_' || name[1] != 'Z') return name;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    std::free(demangled);
    return name;
  }
  std::string out(demangled);
  std::free(demangled);
  return out;
}

}  // namespace

std::vector<Frame> symbolize(std::span<const uintptr_t> pcs, std::chrono::milliseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  bool lockFree = false;
  const std::vector<LoadedModule> modules = loadedModules(&lockFree);
  std::vector<Frame> frames;
  frames.reserve(pcs.size());
  for (size_t i = 0; i < pcs.size(); ++i) {
    Frame frame;
    frame.pc = pcs[i];
    // A return address points after the call: look the caller up at the call itself.
    const uintptr_t lookup = i == 0 || pcs[i] == 0 ? pcs[i] : pcs[i] - 1;
    const bool inBudget = std::chrono::steady_clock::now() < deadline;
    const LoadedModule* module = moduleOf(modules, lookup);
    if (module != nullptr) {
      frame.module = module->path;
      frame.moduleOffset = frame.pc - module->bias;
      frame.buildId = module->buildId;
      const bool readable =
          (!module->path.empty() && module->path[0] == '/') || module->path == "[vdso]";
      if (readable) {
        if (const SymbolTable* table = cachedTable(*module, inBudget)) {
          if (const Symbol* symbol = table->find(lookup - module->bias)) {
            frame.function = demangle(table->names.c_str() + symbol->name);
            frame.functionOffset = frame.pc - module->bias - symbol->start;
          }
        }
      }
    }
    // dladdr takes the loader's lock: only when the lock-free listing was not available.
    if (frame.function.empty() && inBudget && !lockFree) {
      Dl_info info;
      if (dladdr(reinterpret_cast<void*>(lookup), &info) != 0) {
        if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
          frame.function = demangle(info.dli_sname);
          frame.functionOffset = frame.pc - reinterpret_cast<uintptr_t>(info.dli_saddr);
        }
        if (frame.module.empty() && info.dli_fname != nullptr) {
          frame.module = info.dli_fname;
          frame.moduleOffset = frame.pc - reinterpret_cast<uintptr_t>(info.dli_fbase);
        }
      }
    }
    frames.push_back(std::move(frame));
  }
  return frames;
}

std::string formatFrame(const Frame& frame) {
  char offset[64];
  std::string out;
  if (!frame.function.empty()) {
    std::snprintf(offset, sizeof(offset), "+0x%zx", static_cast<size_t>(frame.functionOffset));
    out = frame.function + offset;
  } else {
    std::snprintf(offset, sizeof(offset), "0x%zx", static_cast<size_t>(frame.pc));
    out = offset;
  }
  if (!frame.module.empty()) {
    std::snprintf(offset, sizeof(offset), "+0x%zx", static_cast<size_t>(frame.moduleOffset));
    out += " (" + frame.module + offset + ")";
  }
  return out;
}

}  // namespace ncclwatch::watchdog
