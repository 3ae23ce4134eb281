#include "watchdog/python_sites.h"

#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "trace/python_lines.h"

namespace ncclwatch::watchdog {
namespace {

// Where the fields we read live in one CPython minor version's structs (LP64, default build).
// Measured with offsetof against each version's own internal headers (pycore_frame.h,
// cpython/code.h, cpython/pystate.h, cpython/unicodeobject.h); tests/watchdog/python_sites_test
// checks the recorded lines against the interpreters themselves.
struct Layout {
  int minor;
  // Thread state to its innermost frame: 3.10 tstate->frame; 3.11/3.12 tstate->cframe
  // (->current_frame at cframeCurrent); 3.13 tstate->current_frame.
  size_t tstateFrame;
  bool viaCFrame;
  size_t cframeCurrent;
  size_t frameCode;      // f_code (3.13: f_executable)
  size_t framePrevious;  // previous (3.10: f_back)
  size_t frameInstr;     // prev_instr / instr_ptr; 3.10: f_lasti (an int, in instructions)
  long frameOwner;       // offset of the owner byte; -1 where no shim frames exist
  size_t codeAdaptive;   // co_code_adaptive (3.11+)
  size_t codeFilename, codeName, codeFirstLine, codeLineTable;
  size_t asciiHeader, compactHeader;  // sizes of PyASCIIObject and PyCompactUnicodeObject
};

constexpr Layout kLayouts[] = {
    {10, 24, false, 0, 32, 24, 96, -1, 0, 104, 112, 40, 120, 48, 72},
    {11, 56, true, 8, 32, 48, 56, -1, 184, 112, 128, 72, 136, 48, 72},
    {12, 56, true, 0, 0, 8, 56, 70, 192, 112, 128, 68, 136, 40, 56},
    {13, 72, false, 0, 0, 8, 56, 70, 200, 112, 128, 68, 136, 40, 56},
};
constexpr uint8_t kOwnedByCStack = 3;  // 3.12+: a shim frame of the C stack, not Python code
constexpr size_t kObjectType = 8;      // ob_type in every object header
constexpr size_t kVarSize = 16;        // ob_size of variable-size objects, length of a str
constexpr size_t kBytesData = 32;      // ob_sval of a bytes object
constexpr size_t kStrState = 32;       // the str state bitfield

enum class State : int { kOff, kUnchecked, kOn };

using GetThreadState = void* (*)();

struct Sites {
  std::atomic<State> state{State::kOff};
  const Layout* layout = nullptr;
  GetThreadState threadState = nullptr;
  uintptr_t codeType = 0;  // &PyCode_Type
  std::mutex checkMutex;
};

Sites& sites() {
  static Sites* instance = new Sites;  // never destroyed: the hot path may run during exit
  return *instance;
}

constexpr size_t kTableSize = 8192;  // a power of two

// One distinct call path: the native return address and the innermost Python frames.
struct Entry {
  std::atomic<uint64_t> key{0};    // 0: free; the path's hash (never 0) once claimed
  std::atomic<bool> ready{false};  // the fields below are written
  bool resolved = false;           // watchdog thread only
  uint64_t nativeSite = 0;
  int depth = 0;
  uintptr_t code[kSiteFrames] = {};
  int32_t instr[kSiteFrames] = {};  // code units (3.11+) or instructions (3.10)
};

struct Table {
  Entry entries[kTableSize];
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> dropped{0};
};

Table* table() {
  static Table* instance = new Table;
  return instance;
}

struct Path {
  int depth = 0;
  uintptr_t code[kSiteFrames];
  int32_t instr[kSiteFrames];
};

template <typename T>
T load(uintptr_t address) {
  T value;
  std::memcpy(&value, reinterpret_cast<const void*>(address), sizeof value);
  return value;
}

// Reads our own memory through the kernel: an address that is no longer mapped fails instead of
// faulting. For the watchdog's resolution and the one-time layout check, never the hot path.
bool readSelf(uintptr_t address, void* out, size_t bytes) {
  if (address == 0) return false;
  iovec local{out, bytes};
  iovec remote{reinterpret_cast<void*>(address), bytes};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes);
}

template <typename T>
bool readField(uintptr_t address, T* out) {
  return readSelf(address, out, sizeof *out);
}

// The innermost frame of a thread state, read either directly (the calling thread's own, which
// cannot change under us) or through readSelf.
template <typename Read>
uintptr_t innermostFrame(const Layout& layout, uintptr_t tstate, Read read) {
  uintptr_t frame = 0;
  if (!read(tstate + layout.tstateFrame, &frame)) return 0;
  if (layout.viaCFrame && frame != 0 && !read(frame + layout.cframeCurrent, &frame)) return 0;
  return frame;
}

// Walks the frames from `frame` outwards, keeping Python code frames (shim frames skipped, and
// anything whose code is not a code object ends the walk).
template <typename Read>
void walk(const Layout& layout, uintptr_t codeType, uintptr_t frame, Read read, Path* path) {
  path->depth = 0;
  for (int hops = 0; frame != 0 && path->depth < kSiteFrames && hops < 64; ++hops) {
    uintptr_t code = 0, type = 0, previous = 0;
    uint8_t owner = 0;
    bool shim = layout.frameOwner >= 0 &&
                read(frame + static_cast<size_t>(layout.frameOwner), &owner) &&
                owner == kOwnedByCStack;
    if (!read(frame + layout.frameCode, &code) || !read(frame + layout.framePrevious, &previous))
      return;
    if (!shim) {
      if (code == 0 || !read(code + kObjectType, &type) || type != codeType) return;
      int32_t unit = -1;
      if (layout.minor == 10) {
        int lasti = 0;
        if (!read(frame + layout.frameInstr, &lasti)) return;
        unit = lasti;
      } else {
        uintptr_t instr = 0;
        if (!read(frame + layout.frameInstr, &instr)) return;
        intptr_t bytes =
            static_cast<intptr_t>(instr) - static_cast<intptr_t>(code + layout.codeAdaptive);
        unit = bytes >= 0 ? static_cast<int32_t>(bytes / 2) : -1;
      }
      if (unit >= 0) {  // a negative offset: the frame has not started running yet
        path->code[path->depth] = code;
        path->instr[path->depth] = unit;
        ++path->depth;
      }
    }
    frame = previous;
  }
}

uint64_t hashPath(uint64_t native, const Path& path) {
  uint64_t hash = native * 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < path.depth; ++i) {
    hash = (hash ^ path.code[i]) * 0xff51afd7ed558ccdull;
    hash = (hash ^ static_cast<uint32_t>(path.instr[i])) * 0xc4ceb9fe1a85ec53ull;
  }
  hash ^= hash >> 29;
  return hash | 1;  // never 0, the free marker
}

bool samePath(const Entry& entry, uint64_t native, const Path& path) {
  if (entry.nativeSite != native || entry.depth != path.depth) return false;
  for (int i = 0; i < path.depth; ++i) {
    if (entry.code[i] != path.code[i] || entry.instr[i] != path.instr[i]) return false;
  }
  return true;
}

// The entry of this path, added when new: its number (index + 1), or 0 when the table is full.
uint32_t siteOf(uint64_t native, const Path& path) {
  Table& t = *table();
  uint64_t key = hashPath(native, path);
  for (size_t probe = 0; probe < kTableSize; ++probe) {
    size_t index = (key + probe) & (kTableSize - 1);
    Entry& entry = t.entries[index];
    uint64_t seen = entry.key.load(std::memory_order_acquire);
    if (seen == key && entry.ready.load(std::memory_order_acquire) && samePath(entry, native, path))
      return static_cast<uint32_t>(index + 1);
    if (seen != 0) continue;
    uint64_t expected = 0;
    if (!entry.key.compare_exchange_strong(expected, key, std::memory_order_acq_rel)) {
      if (expected == key) --probe;  // claimed by another thread for a path that may be ours
      continue;
    }
    entry.nativeSite = native;
    entry.depth = path.depth;
    for (int i = 0; i < path.depth; ++i) {
      entry.code[i] = path.code[i];
      entry.instr[i] = path.instr[i];
    }
    entry.ready.store(true, std::memory_order_release);
    t.count.fetch_add(1, std::memory_order_relaxed);
    return static_cast<uint32_t>(index + 1);
  }
  t.dropped.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// Once per process, on the first thread that has Python frames: the same walk with bounds-
// checked reads must find real code objects, or the layout is not the one we know.
bool layoutHolds(Sites& s, uintptr_t tstate) {
  auto safe = [](uintptr_t address, auto* out) { return readField(address, out); };
  uintptr_t frame = innermostFrame(*s.layout, tstate, safe);
  if (frame == 0) return false;  // no Python frame yet: check again on a later call
  Path path;
  walk(*s.layout, s.codeType, frame, safe, &path);
  return path.depth > 0;
}

void checkLayout(Sites& s, uintptr_t tstate) {
  std::lock_guard<std::mutex> lock(s.checkMutex);
  if (s.state.load() != State::kUnchecked) return;
  uintptr_t frame = innermostFrame(
      *s.layout, tstate, [](uintptr_t address, auto* out) { return readField(address, out); });
  if (frame == 0) return;
  if (layoutHolds(s, tstate)) {
    s.state.store(State::kOn, std::memory_order_release);
    detail::g_pythonSitesOn.store(true, std::memory_order_relaxed);
    return;
  }
  s.state.store(State::kOff, std::memory_order_release);
  detail::g_pythonSitesOn.store(false, std::memory_order_relaxed);
  std::fprintf(stderr,
               "[ncclwatch] Python call sites off: this CPython 3.%d build's frames do not look "
               "like the default build's (records keep native call sites)\n",
               s.layout->minor);
}

// ---- resolution (watchdog thread) ----

std::string readText(const Layout& layout, uintptr_t object) {
  uint64_t length = 0;
  uint32_t state = 0;
  if (!readField(object + kVarSize, &length) || !readField(object + kStrState, &state)) return "?";
  int kind = (state >> 2) & 7;
  bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || (kind != 1 && kind != 2 && kind != 4)) return "?";
  length = std::min<uint64_t>(length, 1024);
  uintptr_t data = object + (ascii ? layout.asciiHeader : layout.compactHeader);
  std::string text;
  text.reserve(length);
  std::vector<uint8_t> raw(length * static_cast<size_t>(kind));
  if (!raw.empty() && !readSelf(data, raw.data(), raw.size())) return "?";
  for (uint64_t i = 0; i < length; ++i) {
    uint32_t c = raw[i * kind];
    if (kind == 2) c |= static_cast<uint32_t>(raw[i * 2 + 1]) << 8;
    if (kind == 4) c = 0;  // wider characters: shown as '?'
    text += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return text;
}

std::string frameText(const Layout& layout, uintptr_t codeType, uintptr_t code, int32_t instr) {
  uintptr_t type = 0, filename = 0, name = 0, linetable = 0;
  int firstLine = 0;
  if (!readField(code + kObjectType, &type) || type != codeType ||
      !readField(code + layout.codeFilename, &filename) ||
      !readField(code + layout.codeName, &name) ||
      !readField(code + layout.codeFirstLine, &firstLine) ||
      !readField(code + layout.codeLineTable, &linetable)) {
    return "? (code object gone)";
  }
  int line = -1;
  uint64_t tableBytes = 0;
  if (readField(linetable + kVarSize, &tableBytes) && tableBytes <= (1u << 20)) {
    std::vector<uint8_t> bytes(tableBytes);
    if (bytes.empty() || readSelf(linetable + kBytesData, bytes.data(), bytes.size())) {
      line = layout.minor == 10
                 ? trace::lineFromLineTable310(bytes, firstLine, static_cast<uint32_t>(instr) * 2)
                 : trace::lineFromLocationTable(bytes, firstLine, static_cast<uint32_t>(instr));
    }
  }
  return readText(layout, filename) + ":" + std::to_string(line) + " " + readText(layout, name);
}

}  // namespace

void preparePythonSites() {
  Sites& s = sites();
  if (s.layout != nullptr) return;
  const char* setting = std::getenv("NCCLWATCH_PY_SITES");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) return;
  auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "Py_GetVersion"));
  auto threadState =
      reinterpret_cast<GetThreadState>(dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState"));
  void* codeType = dlsym(RTLD_DEFAULT, "PyCode_Type");
  if (version == nullptr || threadState == nullptr || codeType == nullptr) return;  // no CPython
  int major = 0, minor = 0;
  if (std::sscanf(version(), "%d.%d", &major, &minor) != 2 || major != 3) return;
  for (const Layout& layout : kLayouts) {
    if (layout.minor != minor) continue;
    s.layout = &layout;
    s.threadState = threadState;
    s.codeType = reinterpret_cast<uintptr_t>(codeType);
    table();  // allocated here, not on a call
    s.state.store(State::kUnchecked, std::memory_order_release);
    detail::g_pythonSitesOn.store(true, std::memory_order_relaxed);
    return;
  }
  std::fprintf(stderr,
               "[ncclwatch] Python call sites off: CPython 3.%d is not one ncclwatch reads "
               "(3.10-3.13); records keep native call sites\n",
               minor);
}

uint64_t pythonCallSite(uint64_t nativeSite) {
  Sites& s = sites();
  State state = s.state.load(std::memory_order_acquire);
  if (state == State::kOff) return nativeSite;
  auto tstate = reinterpret_cast<uintptr_t>(s.threadState());
  if (tstate == 0) return nativeSite;  // a thread Python never ran on (PyTorch's own threads)
  if (state == State::kUnchecked) {
    checkLayout(s, tstate);
    if (s.state.load(std::memory_order_acquire) != State::kOn) return nativeSite;
  }
  // Our own thread's frames: they cannot change or go away while it is inside this call.
  auto direct = [](uintptr_t address, auto* out) {
    *out = load<std::remove_pointer_t<decltype(out)>>(address);
    return true;
  };
  Path path;
  walk(*s.layout, s.codeType, innermostFrame(*s.layout, tstate, direct), direct, &path);
  if (path.depth == 0) return nativeSite;
  uint32_t number = siteOf(nativeSite, path);
  return number == 0 ? nativeSite : trace::kPythonSiteTag | number;
}

std::vector<trace::PythonSite> resolveNewPythonSites() {
  std::vector<trace::PythonSite> resolved;
  Sites& s = sites();
  if (s.state.load(std::memory_order_acquire) != State::kOn) return resolved;
  Table& t = *table();
  for (size_t index = 0; index < kTableSize; ++index) {
    Entry& entry = t.entries[index];
    if (entry.resolved || !entry.ready.load(std::memory_order_acquire)) continue;
    entry.resolved = true;
    trace::PythonSite site;
    site.number = static_cast<uint32_t>(index + 1);
    site.nativeSite = entry.nativeSite;
    for (int i = 0; i < entry.depth; ++i) {
      site.frames.push_back(frameText(*s.layout, s.codeType, entry.code[i], entry.instr[i]));
    }
    resolved.push_back(std::move(site));
  }
  return resolved;
}

PythonSiteCounters pythonSiteCounters() {
  Table& t = *table();
  return {t.count.load(std::memory_order_relaxed), t.dropped.load(std::memory_order_relaxed)};
}

}  // namespace ncclwatch::watchdog
