#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/symbols/symbols.h"

namespace kwatch::core::symbols {

// What the user sees for a code address.
struct CodeLocation {
  RemoteAddr ip;         // the address that was located
  std::string function;  // "" when no symbol covers the address
  uint64_t offset = 0;   // from the function's start
  std::string file;      // "" when no line info
  int line = 0;
  std::string inlined_function;
  std::string module;
};

// The instruction that made a data access, found from the trap address.
struct AccessSite {
  RemoteAddr ip;            // the accessing instruction (== trap_ip if it could not be found)
  bool exact = false;       // true when decoding found an instruction ending at trap_ip
  bool reads = false;       // the instruction reads memory it touches
  bool writes = false;      // the instruction writes memory it touches
  std::string disassembly;  // AT&T text of the instruction, e.g. "addq $0x1, 0x2f0e(%rip)"
  // When exact: the instruction's bytes (trap_ip - ip of them), read from the ELF file, so
  // that they are known after the process has gone.
  std::array<uint8_t, 15> code{};
};

// Address → location, with a cache so that millions of events cost one lookup per distinct
// address. Holds a reference to `symbols`, which must outlive it. Not thread-safe.
class Symbolizer {
 public:
  explicit Symbolizer(const Symbols& symbols) : symbols_(symbols) {}

  const CodeLocation& Locate(RemoteAddr ip);

  // For a data-watchpoint trap: decodes the function containing `trap_ip` from its start
  // (Zydis) to find the instruction that ends at `trap_ip`, and whether it reads and/or
  // writes memory. Cached by trap_ip.
  const AccessSite& SiteForTrap(RemoteAddr trap_ip);

  // "func+0x1a (file.c:42)" style one-liner.
  static std::string Format(const CodeLocation& loc);

 private:
  const Symbols& symbols_;
  absl::flat_hash_map<RemoteAddr, CodeLocation> locations_;
  absl::flat_hash_map<RemoteAddr, AccessSite> sites_;
};

}  // namespace kwatch::core::symbols
