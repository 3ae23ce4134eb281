// STAT-style merging of the stacks in the ranks' dumps (reference: STAT's call-graph prefix tree).
// Every rank's stacks, outermost frame first, are merged into one prefix tree whose edges carry
// the set of ranks that went through them. Ranks whose "thread that matters" has the same path
// form an equivalence class with a representative (its lowest rank). Suspects are ranks ordered
// by how far behind their last seq on the divergent communicator is. The offline `stacks` and
// `report` commands and the live collector share this code.
//
// Mixed stacks (what `py-spy dump --native` shows): a dump's native thread carries its
// pthread_self(), which is CPython's id for the thread's Python stack, so a thread with both
// gets one stack: each native `_PyEval_EvalFrameDefault` frame (the interpreter's loop) is
// replaced by the Python frames it runs, the interpreter's own frames around them are hidden,
// and runs of PyTorch, interpreter and runtime (CUDA, NCCL, libc) frames fold into one item.
// The placement rule, in mixedStack below, says when it is exact and when it is a guess. The
// tree of the thread that matters (and the classes) uses the mixed stack where a thread has
// one, the raw native path elsewhere; StackOptions::mixed = false keeps the two trees apart.
// The Python tree of every Python thread stays beside it.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "trace/dump.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// How native frames are told apart.
enum class FrameKey {
  kFunction,  // the demangled function name (robust across builds); module+offset when unknown
  kModule,    // module (and build id) + offset of the frame: exact; labelled with the function
};

struct StackOptions {
  FrameKey by = FrameKey::kFunction;
  bool allThreads = false;  // every thread of each rank, not only the thread that matters
  bool mixed = true;  // Python frames spliced into the native stack of the thread running them
};

// One node of a merged tree; node 0 of a tree is its root (no label, every merged rank).
struct StackNode {
  std::string label;
  std::vector<int> ranks;          // ranks through the edge into this node, ascending
  std::vector<uint32_t> children;  // indices into StackTree::nodes, by lowest rank, then label
  uint32_t threads = 0;            // how many thread stacks went through (>= ranks.size())
};

struct StackTree {
  std::vector<StackNode> nodes;  // nodes[0]: the root
  bool empty() const { return nodes.size() <= 1; }
};

// One rank's input: its dump (or none) and which thread matters in it.
struct RankDump {
  int rank = -1;
  const trace::Dump* dump = nullptr;  // nullptr: the rank has no dump
  int keyThread = 0;  // tid of the thread that matters (0: none found, use the first thread)
};

// Ranks whose thread that matters has the same native path.
struct StackClass {
  std::vector<int> ranks;         // ascending
  int representative = -1;        // the lowest rank
  std::string thread;             // the thread's name in the representative
  std::vector<std::string> path;  // outermost first
  std::string userLine;           // of its mixed stack (MixedStack::userLine); empty: none
};

struct Suspect {
  int rank = -1;
  uint64_t issuedSeq = 0;     // its last issued seq on the communicator
  uint64_t completedSeq = 0;  // its last completed seq there (unbroken prefix)
  uint64_t behind = 0;        // the most any member issued there, minus issuedSeq
  bool culprit = false;       // a primary verdict names it
};

struct RankNote {
  int rank = -1;
  std::string trigger;  // of the dump used; empty when none
  std::string thread;   // the thread that matters (name, tid), empty when none
  std::string note;     // "no dump", "no frames", ...
};

struct StackReport {
  StackOptions options;
  int ranks = 0;                    // ranks found in the files
  std::vector<StackClass> classes;  // largest first, then by representative
  std::vector<int> noDump;          // ranks without any dump
  uint64_t suspectComm = 0;         // the communicator suspects are measured on (0: none)
  std::string suspectCommText;      // "9f3a…(world, 8 ranks)"
  std::vector<Suspect> suspects;    // furthest behind first; culprits first among equals
  StackTree native;  // the thread that matters (all threads): mixed stacks where there are
  std::vector<int> mixedRanks;    // ranks whose thread that matters has a mixed stack, ascending
  std::vector<int> guessedRanks;  // of those, ranks where the mixed stack's split is a guess
  StackTree python;
  std::string pythonNote;       // why the Python tree is empty, when it is
  std::vector<RankNote> notes;  // one per rank, ascending
};

// The label a native frame merges under, with " at file:line", " (inlined)" and a source note
// when the CLI added them (tools/source_lines.h).
std::string frameLabel(const trace::DumpFrame& frame, FrameKey by);
// "train.py:88 step" for a Python frame.
std::string pythonFrameLabel(const trace::DumpPythonFrame& frame);

// The Python stack of a native thread: the Python thread whose CPython id is the native
// thread's pthread id; nullptr when the dump has no such thread (or no pthread id).
const trace::DumpPythonThread* pythonThreadOf(const trace::Dump& dump,
                                              const trace::DumpThread& thread);

// A native stack with the Python frames that its interpreter loops run spliced in.
//
// Placement. Every native `_PyEval_EvalFrameDefault` frame on the stack runs at least one
// Python frame (the one it was entered for). With as many eval frames as Python frames (every
// CPython up to 3.10, and 3.11+ when every call went through C) each runs exactly one: exact.
// CPython 3.11+ runs Python-to-Python calls inside one loop, so there are usually fewer eval
// frames than Python frames; which loop runs which frame is then unknown. The rule: aligned
// from the innermost (the innermost Python frame is the one the innermost loop runs, it called
// the native code below it), each inner loop runs one Python frame and the outermost loop all
// the rest (the training script's own frames, which call each other directly; library code
// such as PyTorch's decorators is where calls go through C). With more eval frames than Python
// frames (a Python stack cut at CPython's 100 frames) the outer surplus loops run none. Where
// the split is not exact, native frames that lie between two loops that run Python frames are
// labelled "(placed by guess)": their place among the Python frames may differ.
//
// Folding, outermost first: native frames outside the outermost eval frame that belong to the
// interpreter or the C runtime (`_start`, `main` of python, `Py_RunMain`...) are hidden, and so
// is every interpreter frame between eval frames (`_PyEval_Vector`, `PyObject_Call`, ...) and
// inside the innermost one (`cfunction_call`) unless only runtime frames lie further in (the
// thread is in the interpreter itself: waiting for the GIL). A run of PyTorch (libtorch*,
// libc10*) frames, or of such interpreter frames, is one item "[PyTorch, 12 frames: innermost
// function]" (names shortened, parameters dropped); a run of runtime frames
// (CUDA, NCCL, libc, libstdc++, ncclwatch) keeps its outermost frame when it is named (the API
// the program called: ncclAllReduce, cudaStreamSynchronize) and folds the rest into
// "[7 frames in libcuda, libc: pthread_cond_wait]". Native frames of other code stay as they
// are (frameLabel).
struct MixedStack {
  bool spliced = false;  // false: no Python frames, or no eval frame among the native ones
  bool exact = false;    // one Python frame per eval frame
  bool guessed = false;  // some native frame was placed by guess (see above)
  int evalFrames = 0;
  int pythonFrames = 0;
  std::vector<std::string> path;  // outermost first
  // The user's own line: the innermost Python frame outside installed packages and the
  // standard library (as stackTop), its path label; empty when every frame is library code.
  std::string userLine;
};
MixedStack mixedStack(const trace::DumpThread& native, const trace::DumpPythonThread& python,
                      FrameKey by = FrameKey::kFunction);

// The thread that matters in a dump: the one that issued its oldest pending call per the
// findings, else the process's main thread (tid == pid), else the first thread; 0 if none.
int keyThreadOf(const trace::Dump& dump, int pid);

// The innermost `frames` native frames of thread `threadId` (else the dump's thread that
// matters) that are not in NCCL, CUDA, the C/C++ runtimes or ncclwatch, innermost first joined
// by " ← ", led by "py: " and the user's innermost Python line when there is one; "" if none.
// The Python stack is the thread's own (pythonThreadOf) when the dump joins them, and then only
// the native frames inside its innermost eval loop count; else the current Python thread's.
std::string stackTop(const trace::Dump& dump, int threadId, int pid, size_t frames = 3);

// Merges the given ranks' dumps: trees, classes and notes (no suspects). Ranks must be unique.
StackReport mergeStacks(std::span<const RankDump> ranks, const StackOptions& options);

// The dump of a file that shows its hang: the newest taken on it (trigger "hang", or
// "collector": the collector asked on a verdict), else the newest; nullptr when it has none.
// After `ncclwatch run --abort` a process goes on to dump on its SIGABRT or SIGTERM, in a
// torn-down state that says nothing about where it hung.
const trace::Dump* hangDumpOf(const trace::TraceFile& file);

// The newest usable file (latest start) of each rank with a known rank.
std::map<int, const trace::TraceFile*> newestByRank(std::span<const trace::TraceFile> files);

// From trace files: each rank's dump that shows the hang (hangDumpOf), merged; suspects ordered
// from the records on the communicator of the report's first primary verdict (or the largest
// communicator).
StackReport stackReport(std::span<const trace::TraceFile> files, const Report& report,
                        const StackOptions& options);

// The tree as indented text, a rank set "[0-4,6-7]" on every line. A chain of single children
// keeps its indentation; branches are drawn with ├─ and └─.
void printStackTree(const StackTree& tree, std::ostream& out);
// Classes first, then suspects, ranks without dumps, then the trees.
void printStacksText(const StackReport& report, std::ostream& out);
void printStacksJson(const StackReport& report, std::ostream& out);

}  // namespace ncclwatch::analysis
