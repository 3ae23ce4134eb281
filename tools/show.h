// `ncclwatch show FILE`: one ring file's header, communicators and records, as a table or JSON.
#pragma once
#include <ostream>
#include <string>

#include "trace/ring_reader.h"

namespace ncclwatch::show {

// The record model's names of NCCL enum values (trace/record.h).
using trace::dtypeName;
using trace::redopName;
using trace::stateName;

void printTable(const trace::TraceFile& file, std::ostream& out);
void printJson(const trace::TraceFile& file, std::ostream& out);

// Reads `path` and prints it; returns the exit code: 0 when the file was read without problems,
// 1 when problems were found (and reported, with what could be salvaged), 2 when the file is
// not a readable trace.
int run(const std::string& path, bool json, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::show
