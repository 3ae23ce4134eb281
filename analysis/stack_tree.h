// STAT-style merging of the stacks in the ranks' dumps (reference: STAT's call-graph prefix tree).
// Every rank's stacks, outermost frame first, are merged into one prefix tree whose edges carry
// the set of ranks that went through them. Ranks whose "thread that matters" has the same path
// form an equivalence class with a representative (its lowest rank). Suspects are ranks ordered
// by how far behind their last seq on the divergent communicator is. The offline `stacks` and
// `report` commands and the live collector share this code.
//
// Native and Python stacks are two separate trees: a dump records CPython's thread id
// (pthread_t) and the kernel's tid for native threads, and nothing joins the two, so splicing
// Python frames onto a native path would be a guess. The native tree decides the classes.
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

// One rank's input: its newest dump (or none) and which thread matters in it.
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
  StackTree native;
  StackTree python;
  std::string pythonNote;       // why the Python tree is empty, when it is
  std::vector<RankNote> notes;  // one per rank, ascending
};

// The label a native frame merges under, with " at file:line", " (inlined)" and a source note
// when the CLI added them (tools/source_lines.h).
std::string frameLabel(const trace::DumpFrame& frame, FrameKey by);
// "train.py:88 step" for a Python frame.
std::string pythonFrameLabel(const trace::DumpPythonFrame& frame);

// The thread that matters in a dump: the one that issued its oldest pending call per the
// findings, else the process's main thread (tid == pid), else the first thread; 0 if none.
int keyThreadOf(const trace::Dump& dump, int pid);

// The innermost `frames` native frames of thread `threadId` (else the dump's thread that
// matters) that are not in NCCL, CUDA, the C/C++ runtimes or ncclwatch, innermost first joined
// by " ← ", then " | py: " and the innermost frame of the current Python thread; "" if none.
std::string stackTop(const trace::Dump& dump, int threadId, int pid, size_t frames = 3);

// Merges the given ranks' dumps: trees, classes and notes (no suspects). Ranks must be unique.
StackReport mergeStacks(std::span<const RankDump> ranks, const StackOptions& options);

// The newest usable file (latest start) of each rank with a known rank.
std::map<int, const trace::TraceFile*> newestByRank(std::span<const trace::TraceFile> files);

// From trace files: the newest dump of each rank, merged; suspects ordered from the records on
// the communicator of the report's first primary verdict (or the largest communicator).
StackReport stackReport(std::span<const trace::TraceFile> files, const Report& report,
                        const StackOptions& options);

// The tree as indented text, a rank set "[0-4,6-7]" on every line. A chain of single children
// keeps its indentation; branches are drawn with ├─ and └─.
void printStackTree(const StackTree& tree, std::ostream& out);
// Classes first, then suspects, ranks without dumps, then the trees.
void printStacksText(const StackReport& report, std::ostream& out);
void printStacksJson(const StackReport& report, std::ostream& out);

}  // namespace ncclwatch::analysis
