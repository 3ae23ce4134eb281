#include "source_lines.h"

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <utility>

#include "analysis/describe.h"
#include "analysis/issued_at.h"
#include "trace/python_sites.h"

#if NCCLWATCH_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace ncclwatch::cli {

namespace {

// Frames whose pc is not a return address: the innermost one, and the one a signal interrupted
// (the frame after the signal trampoline).
bool exactPc(const std::vector<trace::DumpFrame>& frames, size_t i) {
  return i == 0 || frames[i - 1].function == "__restore_rt";
}

// The C and C++ runtimes: their lines never answer "which line of mine", and whether a machine
// has their DWARF (libc6-dbg) would change the output from one machine to the next.
bool isRuntime(const std::string& module) {
  std::string_view base(module);
  base.remove_prefix(std::min(base.size(), base.find_last_of('/') + 1));
  for (std::string_view prefix : {"libc.so", "libc-", "libpthread", "ld-linux", "libstdc++",
                                  "libgcc_s", "libm.so", "libdl.so", "librt.so"}) {
    if (base.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

}  // namespace

#if NCCLWATCH_HAVE_LIBDW

struct SourceLines::Module {
  Dwfl* dwfl = nullptr;
  Dwfl_Module* module = nullptr;
  Dwarf_Addr bias = 0;  // dwfl address = module offset + bias
  std::string buildId;  // of the file on disk
  ~Module() {
    if (dwfl != nullptr) dwfl_end(dwfl);
  }
};

namespace {

std::string demangle(const char* symbol) {
  int status = -1;
  char* text = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
  std::string result = status == 0 && text != nullptr ? text : symbol;
  std::free(text);
  return result;
}

// Separate debug files are looked up by build id and .gnu_debuglink (/usr/lib/debug), as
// eu-addr2line does; the module itself is the file at the dump's path.
const Dwfl_Callbacks kOffline = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = nullptr,
};

std::string hexBuildId(Dwfl_Module* module) {
  const unsigned char* bits = nullptr;
  GElf_Addr noteAddress = 0;
  int length = dwfl_module_build_id(module, &bits, &noteAddress);
  std::string hex;
  for (int i = 0; i < length; ++i) {
    char digits[3];
    std::snprintf(digits, sizeof digits, "%02x", bits[i]);
    hex += digits;
  }
  return hex;
}

// "ns::Class::name" of a DIE without a linkage name (internal linkage): the names of the
// namespaces and classes around its declaration.
std::string qualifiedName(Dwarf_Die* die, const char* name) {
  Dwarf_Die declaration = *die;
  Dwarf_Attribute attribute;
  for (int link : {DW_AT_abstract_origin, DW_AT_specification}) {
    Dwarf_Die target;
    if (dwarf_attr(&declaration, link, &attribute) != nullptr &&
        dwarf_formref_die(&attribute, &target) != nullptr) {
      declaration = target;
    }
  }
  Dwarf_Die* scopes = nullptr;
  int count = dwarf_getscopes_die(&declaration, &scopes);
  std::string qualified = name;
  for (int i = 1; i < count; ++i) {  // scopes[0] is the declaration itself
    int tag = dwarf_tag(&scopes[i]);
    if (tag != DW_TAG_namespace && tag != DW_TAG_class_type && tag != DW_TAG_structure_type &&
        tag != DW_TAG_union_type) {
      continue;
    }
    const char* scope = dwarf_diename(&scopes[i]);
    qualified =
        (scope != nullptr ? std::string(scope) : "(anonymous namespace)") + "::" + qualified;
  }
  std::free(scopes);
  return qualified;
}

// The demangled name of an inlined or out-of-line function's DIE, following its abstract
// origin and specification; the plain DWARF name when there is no linkage name.
std::string dieFunction(Dwarf_Die* die) {
  Dwarf_Attribute attribute;
  for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dwarf_attr_integrate(die, name, &attribute) != nullptr) {
      if (const char* linkage = dwarf_formstring(&attribute)) return demangle(linkage);
    }
  }
  if (dwarf_attr_integrate(die, DW_AT_name, &attribute) != nullptr) {
    if (const char* plain = dwarf_formstring(&attribute)) return qualifiedName(die, plain);
  }
  return "";
}

// File name `index` of the compile unit's line table.
const char* cuFile(Dwarf_Die* cu, Dwarf_Word index) {
  Dwarf_Files* files = nullptr;
  size_t count = 0;
  if (dwarf_getsrcfiles(cu, &files, &count) != 0 || index >= count) return nullptr;
  return dwarf_filesrc(files, index, nullptr, nullptr);
}

}  // namespace

SourceLines::SourceLines(std::string relativeTo) : relativeTo_(std::move(relativeTo)) {
  if (!relativeTo_.empty() && relativeTo_.back() != '/') relativeTo_ += '/';
}

SourceLines::~SourceLines() = default;

SourceLines::Module* SourceLines::open(const std::string& path) {
  auto found = modules_.find(path);
  if (found != modules_.end()) return found->second.get();
  std::unique_ptr<Module>& slot = modules_[path];
  if (path.empty() || path[0] != '/') return nullptr;  // [vdso], unknown: nothing on disk
  if (::access(path.c_str(), R_OK) != 0) return nullptr;
  auto module = std::make_unique<Module>();
  module->dwfl = dwfl_begin(&kOffline);
  if (module->dwfl == nullptr) return nullptr;
  dwfl_report_begin(module->dwfl);
  module->module = dwfl_report_offline(module->dwfl, path.c_str(), path.c_str(), -1);
  dwfl_report_end(module->dwfl, nullptr, nullptr);
  if (module->module == nullptr || dwfl_module_getelf(module->module, &module->bias) == nullptr) {
    return nullptr;
  }
  module->buildId = hexBuildId(module->module);
  slot = std::move(module);
  return slot.get();
}

// ccache's base_dir makes compilers record "../src/x.cc" relative to the compile unit's folder:
// joined to it and made lexically normal, it is what a user opens.
std::string SourceLines::shown(const char* file, const char* compileDir) const {
  std::filesystem::path source(file);
  if (source.is_relative() && compileDir != nullptr) source = compileDir / source;
  std::string path = source.lexically_normal().string();
  if (!relativeTo_.empty() && path.rfind(relativeTo_, 0) == 0) path.erase(0, relativeTo_.size());
  return path;
}

SourceLookup SourceLines::lookup(const std::string& path, const std::string& buildId,
                                 uint64_t offset, bool exact) {
  SourceLookup result;
  Module* module = open(path);
  if (module == nullptr) {
    result.status = SourceStatus::kMissing;
    return result;
  }
  if (!buildId.empty() && buildId != module->buildId) {
    result.status = SourceStatus::kChanged;
    return result;
  }
  // A damaged dump's offset, or 0: DWARF gives discarded functions address 0.
  if (!contains(path, buildId, offset)) return result;
  const Dwarf_Addr address = offset + module->bias - (exact || offset == 0 ? 0 : 1);
  Dwarf_Addr cuBias = 0;
  Dwarf_Die* cu = dwfl_module_addrdie(module->module, address, &cuBias);
  Dwfl_Line* row = dwfl_module_getsrc(module->module, address);
  int line = 0;
  const char* file =
      row != nullptr ? dwfl_lineinfo(row, nullptr, &line, nullptr, nullptr, nullptr) : nullptr;
  if (cu == nullptr || file == nullptr || line <= 0) {
    result.status = SourceStatus::kNoLine;
    // The function all the same, from the symbol table (.symtab, else .dynsym), which gives each
    // symbol's size: an address past the end of a function gets no name (dladdr would give the
    // nearest exported one before it).
    GElf_Off symbolOffset = 0;
    GElf_Sym symbol;
    const char* name = dwfl_module_addrinfo(module->module, address, &symbolOffset, &symbol,
                                            nullptr, nullptr, nullptr);
    if (name != nullptr && symbol.st_size > 0 && GELF_ST_TYPE(symbol.st_info) == STT_FUNC) {
      result.frames.push_back({demangle(name), "", 0, false});
    }
    return result;
  }
  Dwarf_Attribute compileDirAttribute;
  const char* compileDir = dwarf_formstring(dwarf_attr(cu, DW_AT_comp_dir, &compileDirAttribute));
  // dwarf_getscopes continues an inlined instance with its abstract origin's scopes; the
  // innermost DIE's own parents (dwarf_getscopes_die) are the concrete nesting: inlined calls
  // up to the out-of-line function.
  Dwarf_Die* scopes = nullptr;
  int count = dwarf_getscopes(cu, address - cuBias, &scopes);
  if (count > 0) {
    Dwarf_Die innermost = scopes[0];
    std::free(scopes);
    scopes = nullptr;
    count = dwarf_getscopes_die(&innermost, &scopes);
  }
  // A line without a function around it is the nearest row of some other code (the line table
  // of a unit whose ranges cover startup code without DWARF, like _start): no line.
  bool inFunction = false;
  for (int i = 0; i < count; ++i) inFunction |= dwarf_tag(&scopes[i]) == DW_TAG_subprogram;
  if (!inFunction) {
    std::free(scopes);
    return result;
  }
  result.status = SourceStatus::kFound;
  // Innermost scope first: each inlined call is a frame at the current line, and its call site
  // is the line of the scope around it.
  for (int i = 0; i < count; ++i) {
    int tag = dwarf_tag(&scopes[i]);
    if (tag == DW_TAG_subprogram) {
      result.frames.push_back({dieFunction(&scopes[i]), shown(file, compileDir), line, false});
      break;
    }
    if (tag != DW_TAG_inlined_subroutine) continue;
    result.frames.push_back({dieFunction(&scopes[i]), shown(file, compileDir), line, true});
    Dwarf_Attribute attribute;
    Dwarf_Word callFile = 0, callLine = 0;
    if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attribute), &callFile) != 0 ||
        dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attribute), &callLine) != 0) {
      file = nullptr;
    } else {
      file = cuFile(cu, callFile);
    }
    line = static_cast<int>(callLine);
    if (file == nullptr) break;  // the call site is not recorded: no line for the caller
  }
  std::free(scopes);
  if (result.frames.back().inlined) {  // the call site of the outermost inlined call is unknown
    result.frames.push_back({"", "", 0, false});
  }
  return result;
}

bool SourceLines::contains(const std::string& path, const std::string& buildId, uint64_t offset) {
  Module* module = open(path);
  if (module == nullptr || (!buildId.empty() && buildId != module->buildId)) return false;
  Dwarf_Addr low = 0, high = 0;
  dwfl_module_info(module->module, nullptr, &low, &high, nullptr, nullptr, nullptr, nullptr);
  const Dwarf_Addr address = offset + module->bias;
  return address > low && address <= high;  // a return address may sit at the very end
}

#else  // no libdw: every lookup says so, and dumps keep their function+offset labels

struct SourceLines::Module {};

SourceLines::SourceLines(std::string relativeTo) : relativeTo_(std::move(relativeTo)) {}
SourceLines::~SourceLines() = default;
SourceLines::Module* SourceLines::open(const std::string&) {
  return nullptr;
}
std::string SourceLines::shown(const char* file, const char*) const {
  return file;
}
SourceLookup SourceLines::lookup(const std::string&, const std::string&, uint64_t, bool) {
  return {SourceStatus::kUnavailable, {}};
}
bool SourceLines::contains(const std::string&, const std::string&, uint64_t) {
  return false;
}

#endif

std::string SourceLines::workingDirectory() {
  std::error_code error;
  std::string path = std::filesystem::current_path(error).string();
  return error ? std::string() : path;
}

void SourceLines::annotateDumps(std::span<trace::TraceFile> files) {
  for (trace::TraceFile& file : files) {
    for (trace::Dump& dump : file.dumps) {
      for (trace::DumpThread& thread : dump.threads) {
        std::vector<trace::DumpFrame> expanded;
        expanded.reserve(thread.frames.size());
        for (size_t i = 0; i < thread.frames.size(); ++i) {
          trace::DumpFrame frame = thread.frames[i];
          if (frame.line > 0 || frame.inlined || !frame.sourceNote.empty()) {
            expanded.push_back(std::move(frame));  // annotated already
            continue;
          }
          ++stats_.frames;
          SourceLookup found;
          if (!isRuntime(frame.module)) {
            const bool exact = exactPc(thread.frames, i);
            auto key = std::make_tuple(frame.module, frame.buildId, frame.moduleOffset, exact);
            auto cached = found_.find(key);
            if (cached == found_.end()) {
              cached =
                  found_
                      .emplace(key, lookup(frame.module, frame.buildId, frame.moduleOffset, exact))
                      .first;
            }
            found = cached->second;
          }
          if (found.status == SourceStatus::kChanged) {
            frame.sourceNote = "binary changed";
            stats_.changed[frame.module] = frame.buildId;
          }
          for (const SourceFrame& source : found.frames) {
            trace::DumpFrame shown = frame;
            if (source.inlined || frame.function.empty()) shown.function = source.function;
            if (source.inlined) shown.functionOffset = 0;
            shown.file = source.file;
            shown.line = source.line;
            shown.inlined = source.inlined;
            stats_.inlined += source.inlined ? 1 : 0;
            expanded.push_back(std::move(shown));
          }
          if (found.frames.empty()) {
            expanded.push_back(std::move(frame));
          } else {
            ++stats_.withLine;
          }
        }
        thread.frames = std::move(expanded);
      }
    }
  }
}

namespace {
// Like a Python site: the line, then its callers up to the function it is in; without a line
// (a binary built without -g, like PyTorch's wheels) the function and its module; "" when
// neither is known.
std::string callSiteText(const SourceLookup& found, const std::string& module) {
  std::string text;
  for (const SourceFrame& site : found.frames) {
    if (site.line <= 0) continue;
    if (!text.empty()) text += " \u2190 ";
    text += site.file + ":" + std::to_string(site.line) +
            (site.function.empty() ? "" : " " + site.function) + (site.inlined ? " (inlined)" : "");
  }
  if (!text.empty() || found.frames.empty() || found.frames.front().function.empty()) return text;
  return found.frames.front().function + " (" + std::string(analysis::baseName(module)) + ")";
}
}  // namespace

void SourceLines::annotateCallSites(analysis::Report& report,
                                    std::span<const trace::TraceFile> files) {
  std::map<std::string, const trace::TraceFile*> fileOfPath;
  for (const trace::TraceFile& file : files) fileOfPath[file.path] = &file;
  for (analysis::JobReport& job : report.jobs) {
    analysis::NewestTraces newest;  // built once a class of this job needs it
    std::map<int, const trace::TraceFile*> fileOfRank;
    for (const analysis::ProcessSummary& process : job.processes) {
      auto known = fileOfPath.find(process.path);
      if (known != fileOfPath.end()) fileOfRank[process.rank] = known->second;
    }
    for (analysis::Verdict& verdict : job.verdicts) {
      for (analysis::RankClass& rankClass : verdict.classes) {
        analysis::CallDesc& call = rankClass.call;
        if (call.callSite == 0 || trace::isPythonSite(call.callSite) || rankClass.ranks.empty()) {
          continue;
        }
        // The rank the class's call was read from: a return address means something only in
        // its own process (another rank's modules may load elsewhere).
        auto it = fileOfRank.find(call.callRank >= 0 ? call.callRank : rankClass.ranks.front());
        if (it == fileOfRank.end()) it = fileOfRank.find(rankClass.ranks.front());
        if (it == fileOfRank.end()) continue;
        // A rank of the class described the site itself (module + offset): its function and line.
        std::string module, thread;
        uint64_t offset = 0;
        if (newest.empty()) newest = analysis::newestTraces(files, job.jobId);
        if (const trace::TraceFile* described = analysis::traceDescribing(
                newest, analysis::siteRanks(rankClass), call.callSite, &module, &offset, &thread)) {
          std::string text = callSiteText(lookup(module, "", offset, false), module);
          if (!text.empty()) {
            // In a Python process, the thread it came from (no Python frame on it).
            if (!thread.empty() && analysis::runsPython(*described)) {
              text += " " + analysis::issuingThreadText(thread);
            }
            call.issuedAt = text;
            ++stats_.callSites;
          }
          continue;
        }
        if (!call.issuedAt.empty()) continue;
        // Each module a dump of the process names gives its load bias (pc - module offset).
        std::map<std::string, std::pair<std::string, uint64_t>> biasOf;
        for (const trace::Dump& dump : it->second->dumps) {
          for (const trace::DumpThread& thread : dump.threads) {
            for (const trace::DumpFrame& frame : thread.frames) {
              if (!frame.module.empty() && frame.pc >= frame.moduleOffset) {
                biasOf.emplace(frame.module,
                               std::make_pair(frame.buildId, frame.pc - frame.moduleOffset));
              }
            }
          }
        }
        for (const auto& [path, idAndBias] : biasOf) {
          const auto& [buildId, bias] = idAndBias;
          if (call.callSite < bias || !contains(path, buildId, call.callSite - bias)) continue;
          call.issuedAt = callSiteText(lookup(path, buildId, call.callSite - bias, false), path);
          if (!call.issuedAt.empty()) ++stats_.callSites;
          break;
        }
      }
    }
  }
}

void SourceLines::printNotes(const std::string& command, std::ostream& err) const {
  for (const auto& [path, buildId] : stats_.changed) {
    err << "ncclwatch " << command << ": " << path << " changed since the dump (build id "
        << buildId << " in the dump, another on disk): its frames have no source lines\n";
  }
}

}  // namespace ncclwatch::cli
