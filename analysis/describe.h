// How verdicts read: short call descriptions, the "what happened" paragraph, the text a user
// sees in a terminal and the JSON lines of verdicts.jsonl (docs/verdicts.md).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "analysis/analyze.h"

namespace ncclwatch::analysis {

const char* dtypeText(int dtype);  // f32, bf16, ...
std::string redopText(int redop);  // sum, prod, max, min, avg, premulsum
// "AllReduce 4194304 x f32 sum", "Broadcast 1 x f32 root=0", "Send 512 x f32 peer=3".
std::string callText(const CallDesc& call);
std::string hashText(uint64_t hash);      // 16 hex digits
std::string shortHash(uint64_t hash);     // "9f3a…"
std::string wallText(int64_t ns);         // "2026-11-22 19:06:00.134" (local time), "unknown"
std::string commText(const CommDesc& c);  // "9f3a…(world, 8 ranks)"
// C++ names as a verdict's text lines print them: ABI tags ("[abi:cxx11]") dropped, the
// template arguments of a std:: template longer than 24 characters shown as "<…>"
// ("std::chrono::duration<…>"), parameter lists longer than 60 characters as "(…)". JSON keeps
// the full names.
std::string readableNames(std::string_view text);
// Upper case, as a verdict's headline names its kind ("MISMATCH" of "mismatch").
std::string upperCase(std::string_view text);
// The last component of a path ("libtorch_cuda.so" of ".../lib/libtorch_cuda.so").
std::string_view baseName(std::string_view path);

// The paragraph that opens a report: who ran, how it ended, what went wrong first.
std::string whatHappened(const JobReport& job, int64_t nowNs, int64_t lastActivityNs);

struct TextStyle {
  bool colour = false;
};
void printText(const Report& report, std::ostream& out, const TextStyle& style = {});
void printVerdictText(const Verdict& v, std::ostream& out, const TextStyle& style = {});

// One JSON object per verdict, one per line (verdicts.jsonl).
std::string verdictJson(const Verdict& v, const std::string& jobId, int attempt);
// The line that withdraws a live verdict said earlier (a rank alive but silent that issued calls
// again): {"kind":"withdrawn","withdraws":KIND,"job","attempt","comm","seq","culprits",
// "explanation": why}. docs/verdicts.md, "Withdrawn verdicts".
std::string withdrawalJson(const Verdict& v, const std::string& jobId, int attempt,
                           const std::string& why);
// The whole report as one JSON document: jobs with summary, processes, verdicts, comms.
void printJson(const Report& report, std::ostream& out);

}  // namespace ncclwatch::analysis
