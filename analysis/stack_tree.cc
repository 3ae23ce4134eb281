#include "analysis/stack_tree.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "analysis/describe.h"

namespace ncclwatch::analysis {
namespace {

std::string hexText(uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

// Builds a prefix tree over interned frame keys. Ranks must be added in ascending order, so
// that each node's rank list stays sorted by appending.
class TreeBuilder {
 public:
  TreeBuilder() { tree_.nodes.emplace_back(); }

  uint32_t intern(std::string key, std::string label) {
    auto [it, inserted] = ids_.try_emplace(std::move(key), static_cast<uint32_t>(labels_.size()));
    if (inserted) labels_.push_back(std::move(label));
    return it->second;
  }

  // Walks `path` (label ids, outermost first) from the root; returns the last node.
  uint32_t add(int rank, std::span<const uint32_t> path) {
    uint32_t node = 0;
    touch(0, rank);
    for (uint32_t label : path) {
      uint64_t edge = (static_cast<uint64_t>(node) << 32) | label;
      auto [it, inserted] = edges_.try_emplace(edge, 0);
      if (inserted) {
        it->second = static_cast<uint32_t>(tree_.nodes.size());
        StackNode child;
        child.label = labels_[label];
        tree_.nodes.push_back(std::move(child));
        tree_.nodes[node].children.push_back(it->second);
      }
      node = it->second;
      touch(node, rank);
    }
    return node;
  }

  const std::string& label(uint32_t id) const { return labels_[id]; }

  StackTree finish() {
    for (StackNode& node : tree_.nodes) {
      std::sort(node.children.begin(), node.children.end(), [this](uint32_t a, uint32_t b) {
        const StackNode& x = tree_.nodes[a];
        const StackNode& y = tree_.nodes[b];
        if (x.ranks.front() != y.ranks.front()) return x.ranks.front() < y.ranks.front();
        return x.label < y.label;
      });
    }
    return std::move(tree_);
  }

 private:
  void touch(uint32_t node, int rank) {
    StackNode& n = tree_.nodes[node];
    if (n.ranks.empty() || n.ranks.back() != rank) n.ranks.push_back(rank);
    ++n.threads;
  }

  StackTree tree_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> labels_;
  std::unordered_map<uint64_t, uint32_t> edges_;
};

uint32_t nativeId(TreeBuilder& builder, const trace::DumpFrame& frame, FrameKey by) {
  std::string label = frameLabel(frame, by);
  if (by == FrameKey::kModule && !frame.buildId.empty()) {
    std::string key = label + "@" + frame.buildId;
    return builder.intern(std::move(key), std::move(label));
  }
  std::string key = label;
  return builder.intern(std::move(key), std::move(label));
}

// How many of a thread's innermost frames are our own signal handling: a dump taken while the
// thread runs ncclwatch's handler (a SIGTERM dump waits there for the watchdog) shows the
// handler, then the kernel's signal trampoline, then where the signal found the program. Only
// the last part says where the program is; with the rest, a rank that got SIGTERM a moment
// before its dump fell into a class of its own.
size_t ourSignalFrames(const trace::DumpThread& thread) {
  // The handler is near the top: a wait or two inside it, the handler, the trampoline.
  constexpr size_t kSearched = 8;
  const size_t searched = std::min(thread.frames.size(), kSearched);
  for (size_t i = 0; i < searched; ++i) {
    const trace::DumpFrame& frame = thread.frames[i];
    if (frame.function.rfind("ncclwatch::", 0) == 0 &&
        frame.function.find("::onSignal(") != std::string::npos && i + 2 < thread.frames.size()) {
      return i + 2;  // through the trampoline, the frame after the handler
    }
  }
  return 0;
}

// A thread's native path, outermost first. A thread that did not answer gets one node naming
// its kernel wait, so that it still shows where it is.
void nativePath(TreeBuilder& builder, const trace::DumpThread& thread, FrameKey by,
                std::vector<uint32_t>* path) {
  path->clear();
  if (thread.frames.empty()) {
    std::string label = "(no native stack; kernel wait " +
                        (thread.wchan.empty() ? std::string("?") : thread.wchan) + ")";
    std::string key = label;
    path->push_back(builder.intern(std::move(key), std::move(label)));
    return;
  }
  path->reserve(thread.frames.size());
  const auto end = thread.frames.rend() - static_cast<ptrdiff_t>(ourSignalFrames(thread));
  for (auto it = thread.frames.rbegin(); it != end; ++it) {
    path->push_back(nativeId(builder, *it, by));
  }
}

std::string threadText(const trace::DumpThread& thread) {
  return (thread.name.empty() ? std::string("?") : thread.name) + " (tid " +
         std::to_string(thread.tid) + ")";
}

void jsonString(std::ostream& out, std::string_view text) {
  out << '"';
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (u < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", u);
      out << buffer;
    } else {
      out << c;
    }
  }
  out << '"';
}

void jsonRanks(std::ostream& out, const std::vector<int>& ranks) {
  out << '[';
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << ']';
}

void jsonTree(const StackTree& tree, uint32_t index, std::ostream& out) {
  const StackNode& node = tree.nodes[index];
  out << "{\"label\":";
  jsonString(out, node.label);
  out << ",\"ranks\":\"" << formatRanks(node.ranks) << "\",\"count\":" << node.ranks.size()
      << ",\"threads\":" << node.threads << ",\"children\":[";
  for (size_t i = 0; i < node.children.size(); ++i) {
    if (i) out << ',';
    jsonTree(tree, node.children[i], out);
  }
  out << "]}";
}

void printChain(const StackTree& tree, uint32_t index, const std::string& first,
                const std::string& rest, std::ostream& out) {
  // A chain of single children keeps the continuation prefix; only branches recurse.
  const StackNode* node = &tree.nodes[index];
  out << first << "[" << formatRanks(node->ranks) << "] " << node->label << "\n";
  while (node->children.size() == 1) {
    node = &tree.nodes[node->children[0]];
    out << rest << "[" << formatRanks(node->ranks) << "] " << node->label << "\n";
  }
  for (size_t i = 0; i < node->children.size(); ++i) {
    bool last = i + 1 == node->children.size();
    printChain(tree, node->children[i], rest + (last ? "\u2514\u2500" : "\u251c\u2500"),
               rest + (last ? "  " : "\u2502 "), out);
  }
}

}  // namespace

std::string frameLabel(const trace::DumpFrame& frame, FrameKey by) {
  std::string module(baseName(frame.module));
  if (module.empty()) module = "?";
  std::string label;
  if (by == FrameKey::kModule) {
    label = module + "+" + hexText(frame.moduleOffset);
    if (!frame.function.empty()) label += " " + frame.function;
  } else {
    label = frame.function.empty() ? module + "+" + hexText(frame.moduleOffset) : frame.function;
  }
  if (frame.line > 0) label += " at " + frame.file + ":" + std::to_string(frame.line);
  if (frame.inlined) label += " (inlined)";
  if (!frame.sourceNote.empty()) label += " (" + frame.sourceNote + ")";
  return label;
}

std::string pythonFrameLabel(const trace::DumpPythonFrame& frame) {
  std::string label = frame.file.empty() ? std::string("?") : frame.file;
  label += ":" + (frame.line < 0 ? std::string("?") : std::to_string(frame.line));
  label += " " + (frame.function.empty() ? std::string("?") : frame.function);
  return label;
}

int keyThreadOf(const trace::Dump& dump, int pid) {
  const trace::DumpFinding* oldest = nullptr;
  for (const trace::DumpFinding& finding : dump.findings) {
    if (finding.state == "idle" || finding.threadId == 0) continue;
    if (oldest == nullptr || finding.ageMs > oldest->ageMs) oldest = &finding;
  }
  if (oldest != nullptr) {
    for (const trace::DumpThread& thread : dump.threads) {
      if (thread.tid == oldest->threadId) return thread.tid;
    }
  }
  for (const trace::DumpThread& thread : dump.threads) {
    if (thread.tid == pid) return thread.tid;
  }
  return dump.threads.empty() ? 0 : dump.threads.front().tid;
}

namespace {
// Modules whose frames say how a call waits, not where the program is.
bool isRuntimeModule(const std::string& module) {
  std::string base = module.substr(module.find_last_of('/') + 1);
  for (const char* prefix :
       {"libncclwatch", "libnccl", "libcuda", "libcudart", "libc.so", "libc-", "libpthread",
        "ld-linux", "libstdc++", "libgcc_s", "[vdso]", "linux-vdso"}) {
    if (base.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// A framework between the user's code and NCCL: PyTorch's libraries (ATen/c10 dispatch, c10d)
// and the Python interpreter. Their frames fold into one item that names the innermost.
const char* frameworkOf(const std::string& module) {
  std::string base = module.substr(module.find_last_of('/') + 1);
  for (const char* prefix : {"libtorch", "libc10", "libshm"}) {
    if (base.rfind(prefix, 0) == 0) return "PyTorch";
  }
  if (base.rfind("libpython", 0) == 0 || base.rfind("python3", 0) == 0) return "Python";
  return nullptr;
}

// Python code of the interpreter, the standard library or an installed package (PyTorch's
// distributed_c10d.py): not where the user's program is.
bool isLibraryPython(const std::string& file) {
  return file.find("/site-packages/") != std::string::npos ||
         file.find("/dist-packages/") != std::string::npos ||
         file.find("/lib/python3") != std::string::npos || file.rfind("<frozen", 0) == 0;
}

// Up to `frames` native frames of `thread`, innermost first, without the runtime's; framework
// frames before the first user frame fold into "[PyTorch: its innermost function]".
std::string nativeTop(const trace::DumpThread& thread, size_t frames) {
  std::string text;
  size_t taken = 0;
  bool folded = false;
  const std::span<const trace::DumpFrame> outsideOurs =
      std::span(thread.frames).subspan(ourSignalFrames(thread));
  for (const trace::DumpFrame& frame : outsideOurs) {  // innermost first
    if (taken == frames) break;
    if (isRuntimeModule(frame.module) || frame.function.rfind("ncclwatch::", 0) == 0) continue;
    if (const char* framework = frameworkOf(frame.module)) {
      if (folded) continue;
      folded = true;
      text += (taken++ ? " \u2190 " : "") + std::string("[") + framework + ": " +
              frameLabel(frame, FrameKey::kFunction) + "]";
      continue;
    }
    text += (taken++ ? " \u2190 " : "") + frameLabel(frame, FrameKey::kFunction);
  }
  return text;
}
constexpr std::string_view kEvalLoop = "_PyEval_EvalFrameDefault";

// Index (innermost first) of the innermost eval loop frame; frames.size() when none.
size_t innermostEval(const trace::DumpThread& thread) {
  for (size_t i = 0; i < thread.frames.size(); ++i) {
    if (thread.frames[i].function == kEvalLoop) return i;
  }
  return thread.frames.size();
}

// "libcuda.so.1" -> "libcuda".
std::string moduleShortName(const std::string& module) {
  std::string base(baseName(module));
  if (base.empty()) return "?";
  size_t so = base.find(".so");
  return so == std::string::npos || so == 0 ? base : base.substr(0, so);
}

// Template argument lists longer than a few words become "<…>": in a folded item the name
// says where, not how it was instantiated.
std::string collapseTemplates(const std::string& text) {
  constexpr size_t kLongArguments = 24;
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool opens = text[i] == '<' && !(out.size() >= 8 && out.ends_with("operator")) &&
                       !out.ends_with("operator<");
    if (!opens) {
      out += text[i];
      continue;
    }
    int depth = 0;
    size_t close = std::string::npos;
    for (size_t k = i; k < text.size(); ++k) {
      if (text[k] == '<') ++depth;
      if (text[k] == '>' && --depth == 0) {
        close = k;
        break;
      }
    }
    if (close == std::string::npos || close - i - 1 <= kLongArguments) {
      out += text[i];
      continue;
    }
    out += "<\u2026>";
    i = close;
  }
  return out;
}

// A function's name without its parameter list, long template arguments shortened.
std::string shortFunction(const trace::DumpFrame& frame) {
  if (frame.function.empty()) {
    return moduleShortName(frame.module) + "+" + hexText(frame.moduleOffset);
  }
  std::string text = readableNames(frame.function);
  // Drop the outermost trailing "(...)" (and what follows: " const").
  int depth = 0;
  for (size_t i = text.size(); i-- > 0;) {
    if (text[i] == ')') ++depth;
    if (text[i] == '(' && --depth == 0) {
      if (i > 0) text.resize(i);
      break;
    }
  }
  return collapseTemplates(text);
}

// libc, the loader, libstdc++, libgcc: how any code waits, never what it waits for.
bool isCRuntimeModule(const std::string& module) {
  std::string base(baseName(module));
  for (const char* prefix : {"libc.so", "libc-", "libpthread", "ld-linux", "libstdc++", "libgcc_s",
                             "[vdso]", "linux-vdso"}) {
    if (base.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

enum class FrameClass { kUser, kInterpreter, kPyTorch, kRuntime };

FrameClass classify(const trace::DumpFrame& frame) {
  if (isRuntimeModule(frame.module) || frame.function.rfind("ncclwatch::", 0) == 0) {
    return FrameClass::kRuntime;
  }
  if (const char* framework = frameworkOf(frame.module)) {
    return std::string_view(framework) == "Python" ? FrameClass::kInterpreter
                                                   : FrameClass::kPyTorch;
  }
  return FrameClass::kUser;
}

// An API a program calls: NCCL's (ncclAllReduce), CUDA runtime's (cudaMemcpy) or driver's.
bool isApiEntry(const std::string& function) {
  for (std::string_view prefix : {"nccl", "cuda", "cu"}) {
    if (function.size() > prefix.size() && function.compare(0, prefix.size(), prefix) == 0 &&
        std::isupper(static_cast<unsigned char>(function[prefix.size()]))) {
      return true;
    }
  }
  return false;
}

// Folds a run of native frames (outermost first) of one class into path items.
void foldRun(std::span<const trace::DumpFrame* const> run, FrameClass kind, bool guessed,
             std::vector<std::string>* path) {
  if (run.empty()) return;
  const std::string mark = guessed ? " (placed by guess)" : "";
  if (kind == FrameClass::kRuntime) {
    if (isApiEntry(run.front()->function)) {
      path->push_back(shortFunction(*run.front()) + mark);
      run = run.subspan(1);
      if (run.empty()) return;
    }
    // Named after its innermost named frame outside the C runtime (the sim's or NCCL's wait,
    // not libc's futex), else its innermost named frame.
    std::vector<std::string> modules;
    const trace::DumpFrame* innermostNamed = run.back();
    const trace::DumpFrame* innermostOutsideLibc = nullptr;
    for (const trace::DumpFrame* frame : run) {
      std::string module = moduleShortName(frame->module);
      if (std::find(modules.begin(), modules.end(), module) == modules.end()) {
        modules.push_back(module);
      }
      if (frame->function.empty()) continue;
      innermostNamed = frame;
      // std:: templates inlined into the runtime's code are how it waits, too.
      if (!isCRuntimeModule(frame->module) && frame->function.rfind("std::", 0) != 0) {
        innermostOutsideLibc = frame;
      }
    }
    if (innermostOutsideLibc != nullptr) innermostNamed = innermostOutsideLibc;
    std::string text =
        "[" + std::to_string(run.size()) + (run.size() == 1 ? " frame in " : " frames in ");
    for (size_t i = 0; i < modules.size(); ++i) text += (i ? ", " : "") + modules[i];
    path->push_back(text + ": " + shortFunction(*innermostNamed) + "]" + mark);
    return;
  }
  const char* name = kind == FrameClass::kPyTorch ? "PyTorch" : "Python";
  std::string text = std::string("[") + name;
  if (run.size() > 1) text += ", " + std::to_string(run.size()) + " frames";
  path->push_back(text + ": " + shortFunction(*run.back()) + "]" + mark);
}

}  // namespace

const trace::DumpPythonThread* pythonThreadOf(const trace::Dump& dump,
                                              const trace::DumpThread& thread) {
  if (thread.pthreadId == 0) return nullptr;
  for (const trace::DumpPythonThread& python : dump.pythonThreads) {
    if (python.threadId == thread.pthreadId && !python.frames.empty()) return &python;
  }
  return nullptr;
}

MixedStack mixedStack(const trace::DumpThread& native, const trace::DumpPythonThread& python,
                      FrameKey by) {
  MixedStack mixed;
  // Outermost first, both.
  std::vector<const trace::DumpFrame*> frames;
  const auto end = native.frames.rend() - static_cast<ptrdiff_t>(ourSignalFrames(native));
  for (auto it = native.frames.rbegin(); it != end; ++it) frames.push_back(&*it);
  std::vector<const trace::DumpPythonFrame*> pyFrames;
  for (auto it = python.frames.rbegin(); it != python.frames.rend(); ++it) {
    pyFrames.push_back(&*it);
  }
  std::vector<size_t> evals;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i]->function == kEvalLoop) evals.push_back(i);
  }
  mixed.evalFrames = static_cast<int>(evals.size());
  mixed.pythonFrames = static_cast<int>(pyFrames.size());
  for (auto it = pyFrames.rbegin(); it != pyFrames.rend(); ++it) {
    if (!isLibraryPython((*it)->file)) {
      mixed.userLine = pythonFrameLabel(**it);
      break;
    }
  }
  if (evals.empty() || pyFrames.empty()) return mixed;
  mixed.spliced = true;
  mixed.exact = evals.size() == pyFrames.size();
  // Which Python frames each eval frame runs: [first, last) into pyFrames, aligned from the
  // innermost; the outermost matched loop takes every frame left over outside.
  const size_t matched = std::min(evals.size(), pyFrames.size());
  const size_t firstMatched = evals.size() - matched;  // index into evals
  std::vector<std::pair<size_t, size_t>> runs(evals.size(), {0, 0});
  for (size_t k = firstMatched; k < evals.size(); ++k) {
    const size_t fromInside = evals.size() - 1 - k;  // 0 for the innermost loop
    const size_t last = pyFrames.size() - fromInside;
    runs[k] = {k == firstMatched ? 0 : last - 1, last};
  }
  const size_t outermostEval = evals.front();
  const size_t innermostEvalIndex = evals.back();
  const size_t guessFrom = evals[firstMatched];
  // Interpreter frames inside the innermost loop are call machinery (cfunction_call,
  // method_vectorcall) unless nothing but the runtime lies further in: then the thread is in the
  // interpreter itself (waiting for the GIL) and they are shown.
  size_t innermostNotInterpreter = innermostEvalIndex;
  for (size_t i = innermostEvalIndex + 1; i < frames.size(); ++i) {
    FrameClass kind = classify(*frames[i]);
    if (kind == FrameClass::kUser || kind == FrameClass::kPyTorch) innermostNotInterpreter = i;
  }

  std::vector<const trace::DumpFrame*> run;
  FrameClass runKind = FrameClass::kUser;
  bool runGuessed = false;
  auto flush = [&] {
    foldRun(run, runKind, runGuessed, &mixed.path);
    run.clear();
  };
  size_t evalOrdinal = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const trace::DumpFrame& frame = *frames[i];
    if (frame.function == kEvalLoop) {
      flush();
      auto [first, last] = runs[evalOrdinal++];
      for (size_t p = first; p < last; ++p) mixed.path.push_back(pythonFrameLabel(*pyFrames[p]));
      continue;
    }
    FrameClass kind = classify(frame);
    const bool outside = i < outermostEval;
    const bool betweenLoops = i > outermostEval && i < innermostEvalIndex;
    if ((kind == FrameClass::kInterpreter && i < innermostNotInterpreter) ||
        (kind == FrameClass::kRuntime && outside)) {
      continue;  // the interpreter's and the C runtime's machinery around Python code
    }
    const bool guessed = !mixed.exact && betweenLoops && i > guessFrom;
    if (guessed) mixed.guessed = true;
    if (kind == FrameClass::kUser) {
      flush();
      mixed.path.push_back(frameLabel(frame, by) + (guessed ? " (placed by guess)" : ""));
      continue;
    }
    if (!run.empty() && (kind != runKind || guessed != runGuessed)) flush();
    runKind = kind;
    runGuessed = guessed;
    run.push_back(&frame);
  }
  flush();
  return mixed;
}

namespace {

// The Python thread a stack top names: the thread's own when the dump joins them, else the
// current one (the last marked current, else the first).
const trace::DumpPythonThread* topPythonThread(const trace::Dump& dump,
                                               const trace::DumpThread* thread) {
  if (thread != nullptr) {
    if (const trace::DumpPythonThread* own = pythonThreadOf(dump, *thread)) return own;
  }
  const trace::DumpPythonThread* python = nullptr;
  for (const trace::DumpPythonThread& candidate : dump.pythonThreads) {
    if (python == nullptr || candidate.current) python = &candidate;
  }
  return python;
}

}  // namespace

std::string stackTop(const trace::Dump& dump, int threadId, int pid, size_t frames) {
  const trace::DumpThread* thread = nullptr;
  int key = keyThreadOf(dump, pid);
  for (const trace::DumpThread& candidate : dump.threads) {
    if (candidate.tid == threadId) thread = &candidate;
  }
  for (const trace::DumpThread& candidate : dump.threads) {
    if (thread == nullptr && candidate.tid == key) thread = &candidate;
  }
  const trace::DumpPythonThread* python = topPythonThread(dump, thread);
  std::string native;
  if (thread != nullptr && python != nullptr && python == pythonThreadOf(dump, *thread) &&
      innermostEval(*thread) < thread->frames.size()) {
    // Joined: the frames from the innermost eval loop out are the Python frames'.
    trace::DumpThread inside = *thread;
    inside.frames.resize(innermostEval(*thread));
    native = nativeTop(inside, frames);
  } else if (thread != nullptr) {
    native = nativeTop(*thread, frames);
  }
  if (python == nullptr || python->frames.empty()) return native;
  // The user's own Python line leads: the innermost frame outside installed packages (the
  // training loop's line, not distributed_c10d.py's), with the library frame it called.
  const trace::DumpPythonFrame* user = nullptr;
  for (const trace::DumpPythonFrame& frame : python->frames) {  // innermost first
    if (!isLibraryPython(frame.file)) {
      user = &frame;
      break;
    }
  }
  const trace::DumpPythonFrame& innermost = python->frames.front();
  if (user == nullptr)
    return (native.empty() ? "py: " : native + " | py: ") + pythonFrameLabel(innermost);
  std::string text = "py: " + pythonFrameLabel(*user);
  if (user != &innermost) {
    std::string file = innermost.file.substr(innermost.file.find_last_of('/') + 1);
    text += " (in " + file + ":" + std::to_string(innermost.line) + " " + innermost.function + ")";
  }
  return native.empty() ? text : text + " | " + native;
}

StackReport mergeStacks(std::span<const RankDump> input, const StackOptions& options) {
  StackReport report;
  report.options = options;
  std::vector<const RankDump*> ranks;
  ranks.reserve(input.size());
  for (const RankDump& r : input) ranks.push_back(&r);
  std::sort(ranks.begin(), ranks.end(),
            [](const RankDump* a, const RankDump* b) { return a->rank < b->rank; });
  report.ranks = static_cast<int>(ranks.size());

  TreeBuilder native, python;
  std::vector<uint32_t> path;
  // class key: the node where the thread that matters ends (same node = same path).
  std::unordered_map<uint32_t, size_t> classOf;
  std::vector<std::pair<uint32_t, StackClass>> classes;
  bool anyPython = false;
  std::string pythonNote;
  for (const RankDump* r : ranks) {
    RankNote note;
    note.rank = r->rank;
    if (r->dump == nullptr) {
      note.note = "no dump";
      report.noDump.push_back(r->rank);
      report.notes.push_back(std::move(note));
      continue;
    }
    const trace::Dump& dump = *r->dump;
    note.trigger = dump.trigger;
    const trace::DumpThread* key = nullptr;
    for (const trace::DumpThread& thread : dump.threads) {
      if (thread.tid == r->keyThread) key = &thread;
    }
    if (key == nullptr && !dump.threads.empty()) key = &dump.threads.front();
    if (key == nullptr) {
      note.note = "no threads in the dump";
    } else {
      note.thread = threadText(*key);
    }
    // A thread's path: mixed when it has a Python stack to splice in, else native.
    auto threadPath = [&](const trace::DumpThread& thread, MixedStack* mixed) {
      const trace::DumpPythonThread* own = options.mixed ? pythonThreadOf(dump, thread) : nullptr;
      if (own != nullptr) *mixed = mixedStack(thread, *own, options.by);
      if (!mixed->spliced) {
        nativePath(native, thread, options.by, &path);
        return;
      }
      path.clear();
      for (std::string& label : mixed->path) {
        std::string keyText = label;
        path.push_back(native.intern(std::move(keyText), std::move(label)));
      }
    };
    if (options.allThreads) {
      // Non-key threads first, so that each merges independently of the key thread's end node.
      for (const trace::DumpThread& thread : dump.threads) {
        if (&thread == key) continue;
        MixedStack mixed;
        threadPath(thread, &mixed);
        native.add(r->rank, path);
      }
    }
    if (key != nullptr) {
      MixedStack mixed;
      threadPath(*key, &mixed);
      if (mixed.spliced) report.mixedRanks.push_back(r->rank);
      if (mixed.guessed) report.guessedRanks.push_back(r->rank);
      uint32_t end = native.add(r->rank, path);
      auto [it, inserted] = classOf.try_emplace(end, classes.size());
      if (inserted) {
        StackClass c;
        c.representative = r->rank;
        c.thread = key->name;
        c.userLine = mixed.userLine;
        c.path.reserve(path.size());
        for (uint32_t id : path) c.path.push_back(native.label(id));
        classes.emplace_back(end, std::move(c));
      }
      classes[it->second].second.ranks.push_back(r->rank);
    }
    for (const trace::DumpPythonThread& thread : dump.pythonThreads) {
      path.clear();
      for (auto it = thread.frames.rbegin(); it != thread.frames.rend(); ++it) {
        std::string label = pythonFrameLabel(*it);
        std::string keyText = label;
        path.push_back(python.intern(std::move(keyText), std::move(label)));
      }
      if (path.empty()) continue;
      python.add(r->rank, path);
      anyPython = true;
    }
    if (pythonNote.empty() && !dump.pythonNote.empty()) pythonNote = dump.pythonNote;
    report.notes.push_back(std::move(note));
  }
  report.native = native.finish();
  if (anyPython) {
    report.python = python.finish();
  } else {
    report.pythonNote = pythonNote.empty() ? "no Python stacks in the dumps" : pythonNote;
  }
  for (auto& entry : classes) report.classes.push_back(std::move(entry.second));
  std::stable_sort(report.classes.begin(), report.classes.end(),
                   [](const StackClass& a, const StackClass& b) {
                     if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
                     return a.representative < b.representative;
                   });
  return report;
}

const trace::Dump* hangDumpOf(const trace::TraceFile& file) {
  for (auto it = file.dumps.rbegin(); it != file.dumps.rend(); ++it) {
    if (it->trigger == "hang" || it->trigger == "collector") return &*it;
  }
  return file.dumps.empty() ? nullptr : &file.dumps.back();
}

std::map<int, const trace::TraceFile*> newestByRank(std::span<const trace::TraceFile> files) {
  std::map<int, const trace::TraceFile*> newest;
  for (const trace::TraceFile& file : files) {
    if (!file.usable || file.header.rank < 0) continue;
    auto [it, inserted] = newest.try_emplace(file.header.rank, &file);
    if (!inserted && file.header.anchorRealtimeNs > it->second->header.anchorRealtimeNs) {
      it->second = &file;
    }
  }
  return newest;
}

StackReport stackReport(std::span<const trace::TraceFile> files, const Report& analysed,
                        const StackOptions& options) {
  // The newest process of each rank, and its newest dump.
  std::map<int, const trace::TraceFile*> newest = newestByRank(files);
  std::vector<RankDump> ranks;
  ranks.reserve(newest.size());
  for (const auto& [rank, file] : newest) {
    RankDump r;
    r.rank = rank;
    if (!file->dumps.empty()) {
      r.dump = hangDumpOf(*file);
      r.keyThread = keyThreadOf(*r.dump, file->header.pid);
    }
    ranks.push_back(r);
  }
  StackReport report = mergeStacks(ranks, options);

  // Suspects: on the communicator of the first primary verdict, else the largest one.
  const JobReport* job = analysed.jobs.empty() ? nullptr : &analysed.jobs.back();
  for (const JobReport& j : analysed.jobs) {
    if (!j.verdicts.empty()) job = &j;
  }
  if (job == nullptr) return report;
  const Verdict* verdict = nullptr;
  for (const Verdict& v : job->verdicts) {
    if (v.primary && v.kind != VerdictKind::kStraggler) {
      verdict = &v;
      break;
    }
  }
  const CommSummary* comm = nullptr;
  for (const CommSummary& c : job->comms) {
    if (verdict != nullptr) {
      if (c.comm.hash == verdict->comm.hash) comm = &c;
    } else if (comm == nullptr || c.ranks.size() > comm->ranks.size() ||
               (c.ranks.size() == comm->ranks.size() && c.calls > comm->calls)) {
      comm = &c;
    }
  }
  if (comm == nullptr) return report;
  report.suspectComm = comm->comm.hash;
  report.suspectCommText = commText(comm->comm);
  uint64_t most = 0;
  for (const auto& p : comm->progress) most = std::max(most, p.issuedSeq);
  for (const auto& p : comm->progress) {
    for (int rank : p.ranks) {
      Suspect s;
      s.rank = rank;
      s.issuedSeq = p.issuedSeq;
      s.completedSeq = p.completedSeq;
      s.behind = most - p.issuedSeq;
      if (verdict != nullptr) {
        s.culprit = std::find(verdict->culprits.begin(), verdict->culprits.end(), rank) !=
                    verdict->culprits.end();
      }
      if (s.behind > 0 || s.culprit) report.suspects.push_back(s);
    }
  }
  std::sort(report.suspects.begin(), report.suspects.end(), [](const Suspect& a, const Suspect& b) {
    if (a.behind != b.behind) return a.behind > b.behind;
    if (a.culprit != b.culprit) return a.culprit;
    if (a.completedSeq != b.completedSeq) return a.completedSeq < b.completedSeq;
    return a.rank < b.rank;
  });
  return report;
}

void printStackTree(const StackTree& tree, std::ostream& out) {
  if (tree.empty()) return;
  const StackNode& root = tree.nodes[0];
  for (size_t i = 0; i < root.children.size(); ++i) {
    bool last = i + 1 == root.children.size();
    if (root.children.size() == 1) {
      printChain(tree, root.children[i], "", "", out);
    } else {
      printChain(tree, root.children[i], last ? "\u2514\u2500" : "\u251c\u2500",
                 last ? "  " : "\u2502 ", out);
    }
  }
}

void printStacksText(const StackReport& report, std::ostream& out) {
  out << "Stacks of " << report.ranks << (report.ranks == 1 ? " rank" : " ranks")
      << ", each rank's newest dump taken on the hang (else its newest), merged by "
      << (report.options.by == FrameKey::kModule ? "module+offset" : "function") << "; "
      << (report.options.allThreads ? "all threads"
                                    : "the thread that issued the hung call, else the main thread")
      << "\n";
  out << report.classes.size() << (report.classes.size() == 1 ? " class" : " classes")
      << "; representative ranks: ";
  for (size_t i = 0; i < report.classes.size(); ++i) {
    out << (i ? ", " : "") << report.classes[i].representative;
  }
  if (report.classes.empty()) out << "none";
  out << "\n";
  for (size_t i = 0; i < report.classes.size(); ++i) {
    const StackClass& c = report.classes[i];
    out << "  class " << i + 1 << "  [" << formatRanks(c.ranks) << "] (" << c.ranks.size()
        << (c.ranks.size() == 1 ? " rank" : " ranks") << ")  representative " << c.representative;
    if (!c.path.empty()) {
      out << "  at ";
      size_t from = c.path.size() > 3 ? c.path.size() - 3 : 0;
      const bool userLineShown =
          std::find(c.path.begin() + from, c.path.end(), c.userLine) != c.path.end();
      if (!c.userLine.empty() && !userLineShown) out << c.userLine << " \u2026 ";
      for (size_t k = from; k < c.path.size(); ++k) out << (k > from ? " > " : "") << c.path[k];
    }
    out << "\n";
  }
  if (report.suspectComm != 0) {
    out << "Suspects on comm " << report.suspectCommText << ", furthest behind first:";
    if (report.suspects.empty()) out << " none (every member issued the same calls)";
    out << "\n";
    for (const Suspect& s : report.suspects) {
      out << "  rank " << s.rank << "  issued #" << s.issuedSeq << ", completed #" << s.completedSeq
          << ", " << s.behind << " behind" << (s.culprit ? "  (culprit)" : "") << "\n";
    }
  }
  if (!report.noDump.empty()) {
    out << "No dump: " << (report.noDump.size() == 1 ? "rank " : "ranks ")
        << formatRanks(report.noDump) << " (their stacks are not in the trees)\n";
  }
  if (report.mixedRanks.empty()) {
    out << "\nNative stacks, outermost frame first"
        << (report.options.allThreads ? " (all threads):\n" : " (the thread that matters):\n");
  } else {
    out << "\nMixed stacks, outermost frame first"
        << (report.options.allThreads ? " (all threads)" : " (the thread that matters)")
        << ": Python frames where the interpreter runs them (ranks "
        << formatRanks(report.mixedRanks) << "), runtime and PyTorch frames folded";
    if (!report.guessedRanks.empty()) {
      out << "; where ranks " << formatRanks(report.guessedRanks)
          << " ran several Python frames in one interpreter loop, frames marked \"placed by "
             "guess\" may sit elsewhere among the Python frames";
    }
    out << " (--no-mixed: native only):\n";
  }
  if (report.native.empty()) {
    out << "  none\n";
  } else {
    printStackTree(report.native, out);
  }
  out << "\nPython stacks, outermost frame first (all Python threads):\n";
  if (report.python.empty()) {
    out << "  none: " << report.pythonNote << "\n";
  } else {
    printStackTree(report.python, out);
  }
}

void printStacksJson(const StackReport& report, std::ostream& out) {
  out << "{\"by\":\"" << (report.options.by == FrameKey::kModule ? "module" : "function")
      << "\",\"all_threads\":" << (report.options.allThreads ? "true" : "false")
      << ",\"mixed\":" << (report.options.mixed ? "true" : "false") << ",\"ranks\":" << report.ranks
      << ",\"mixed_ranks\":";
  jsonRanks(out, report.mixedRanks);
  out << ",\"guessed_ranks\":";
  jsonRanks(out, report.guessedRanks);
  out << ",\"classes\":[";
  for (size_t i = 0; i < report.classes.size(); ++i) {
    const StackClass& c = report.classes[i];
    out << (i ? "," : "") << "{\"ranks\":\"" << formatRanks(c.ranks) << "\",\"rank_list\":";
    jsonRanks(out, c.ranks);
    out << ",\"representative\":" << c.representative << ",\"thread\":";
    jsonString(out, c.thread);
    out << ",\"user_line\":";
    jsonString(out, c.userLine);
    out << ",\"path\":[";
    for (size_t k = 0; k < c.path.size(); ++k) {
      if (k) out << ',';
      jsonString(out, c.path[k]);
    }
    out << "]}";
  }
  out << "],\"suspect_comm\":";
  if (report.suspectComm == 0) {
    out << "null";
  } else {
    out << "{\"hash\":\"" << hashText(report.suspectComm) << "\",\"text\":";
    jsonString(out, report.suspectCommText);
    out << "}";
  }
  out << ",\"suspects\":[";
  for (size_t i = 0; i < report.suspects.size(); ++i) {
    const Suspect& s = report.suspects[i];
    out << (i ? "," : "") << "{\"rank\":" << s.rank << ",\"issued_seq\":" << s.issuedSeq
        << ",\"completed_seq\":" << s.completedSeq << ",\"behind\":" << s.behind
        << ",\"culprit\":" << (s.culprit ? "true" : "false") << "}";
  }
  out << "],\"no_dump\":";
  jsonRanks(out, report.noDump);
  out << ",\"rank_notes\":[";
  for (size_t i = 0; i < report.notes.size(); ++i) {
    const RankNote& n = report.notes[i];
    out << (i ? "," : "") << "{\"rank\":" << n.rank << ",\"trigger\":";
    jsonString(out, n.trigger);
    out << ",\"thread\":";
    jsonString(out, n.thread);
    out << ",\"note\":";
    jsonString(out, n.note);
    out << "}";
  }
  out << "],\"native\":";
  jsonTree(report.native, 0, out);
  out << ",\"python\":";
  if (report.python.empty()) {
    out << "null";
  } else {
    jsonTree(report.python, 0, out);
  }
  out << ",\"python_note\":";
  jsonString(out, report.pythonNote);
  out << "}\n";
}

}  // namespace ncclwatch::analysis
