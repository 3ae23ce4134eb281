// CPython's line tables, decoded without CPython: which source line an instruction offset of a
// code object belongs to. Used to name the Python line that issued an NCCL call (the site
// recorded with each call, watchdog/python_sites.h). Pure functions over bytes that come from
// another process's (or our own) memory: every read is bounds-checked, and a malformed table
// gives -1, never a crash.
#pragma once
#include <cstdint>
#include <span>

namespace ncclwatch::trace {

// CPython 3.11-3.13 location table (co_linetable): the line of the instruction `codeUnit` code
// units (2 bytes each) from the start of the code; -1 when the table says it has none, or the
// offset lies past the table, or the table is malformed.
int lineFromLocationTable(std::span<const uint8_t> table, int firstLine, uint32_t codeUnit);

// CPython 3.10 line table (PEP 626 co_linetable: byte-offset delta, signed line delta pairs):
// the line of the instruction at `byteOffset`; -1 as above.
int lineFromLineTable310(std::span<const uint8_t> table, int firstLine, uint32_t byteOffset);

}  // namespace ncclwatch::trace
