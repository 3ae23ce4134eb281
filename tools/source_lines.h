// File and line for native frames, offline: the CLI reads the DWARF of each module a dump names
// (the binary on disk, checked against the build id the dump recorded) with elfutils' libdwfl
// and adds source lines and inlined frames to the dumps' frames, and "issued at file:line" to
// verdicts whose call site is a native return address. Nothing of this runs in the preload
// library: dumps record module + offset + build id, and lines are resolved here.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::cli {

struct SourceFrame {
  std::string function;  // demangled; for the outermost frame empty unless DWARF names it
  std::string file;
  int line = 0;
  bool inlined = false;  // inlined into the next frame of the lookup
};

enum class SourceStatus {
  kFound,        // frames has at least the function's own line
  kNoLine,       // the binary is there but has no line for the address (stripped, no -g)
  kMissing,      // no readable ELF file at the module's path
  kChanged,      // the binary at the path has another build id than the dump recorded
  kUnavailable,  // built without libdw
};

struct SourceLookup {
  SourceStatus status = SourceStatus::kNoLine;
  std::vector<SourceFrame> frames;  // innermost first: inlined functions, then the function
};

struct SourceStats {
  uint64_t frames = 0;                         // native frames looked at
  uint64_t withLine = 0;                       // of which got a line
  uint64_t inlined = 0;                        // inlined frames added
  uint64_t callSites = 0;                      // verdict call sites given a line
  std::map<std::string, std::string> changed;  // module path -> the dump's build id
};

class SourceLines {
 public:
  // For the offline commands: paths shown relative to the working directory.
  static std::string workingDirectory();

  // Paths under `relativeTo` (normally the working directory) are shown relative to it.
  explicit SourceLines(std::string relativeTo = "");
  ~SourceLines();
  SourceLines(const SourceLines&) = delete;
  SourceLines& operator=(const SourceLines&) = delete;

  // `offset`: the frame's module offset (pc minus the module's load bias); `exact`: the pc
  // itself (innermost frame, interrupted pc) rather than a return address, which is looked up
  // one byte earlier, at the call. An empty `buildId` is not checked.
  SourceLookup lookup(const std::string& module, const std::string& buildId, uint64_t offset,
                      bool exact);
  // Whether `offset` falls in one of the module's loaded segments (for call sites).
  bool contains(const std::string& module, const std::string& buildId, uint64_t offset);

  // Adds file:line and inlined frames to every native frame of every dump.
  void annotateDumps(std::span<trace::TraceFile> files);
  // Gives every verdict class whose call site is a native return address an `issuedAt`
  // ("file.cc:142 function"), mapped through the modules of the class's first rank's dumps.
  void annotateCallSites(analysis::Report& report, std::span<const trace::TraceFile> files);
  // One line per module whose binary changed since the dump, prefixed "ncclwatch COMMAND: ".
  void printNotes(const std::string& command, std::ostream& err) const;

  const SourceStats& stats() const { return stats_; }

 private:
  struct Module;
  Module* open(const std::string& path);
  std::string shown(const char* file, const char* compileDir) const;

  std::string relativeTo_;
  std::map<std::string, std::unique_ptr<Module>> modules_;
  // Ranks run the same binaries: most frames repeat (module, build id, offset, exact).
  std::map<std::tuple<std::string, std::string, uint64_t, bool>, SourceLookup> found_;
  SourceStats stats_;
};

}  // namespace ncclwatch::cli
