#pragma once

// The `perf probe` / kprobe_events syntax of kwatch's probes: a probe point followed by
// fetch arguments, separated by spaces.
//
//   spec   := point (' '+ arg)*
//   point  := [[GROUP ':'] EVENT '='] site
//   site   := FUNC ['@' SRC] ['+' OFF | '%return' | ':' RELLINE | ';' PATTERN]
//           | SRC ':' LINE | SRC ';' PATTERN      (SRC contains a '.', FUNC does not)
//           | '0x' HEX                             (a virtual address of the file, as nm
//                                                   prints it; the load bias is added later)
//   arg    := [NAME '='] fetch [':' TYPE]
//   fetch  := '%' REG                 register: kprobe names (%di %ax %ip %sp %flags...),
//                                     64-bit (%rdi %rax %r8) and 32-bit (%edi %eax %r8d)
//           | '@' ADDR                memory at a virtual address of the file (0x.. or decimal)
//           | '@' SYM [('+'|'-') OFF] memory at an ELF symbol of the file, plus or minus OFF
//           | '$stack' N              the Nth 8-byte slot of the stack (*(%sp + 8 * N))
//           | '$stack'                the stack pointer
//           | '$retval'               the return value (return probes only)
//           | '$comm'                 the thread's name (a string)
//           | '$params' | '$vars'     every parameter / every variable visible (DWARF)
//           | ['+'|'-'] OFF '(' fetch ')'   memory at the value of `fetch` plus OFF (any depth)
//           | VAR (('->' | '.') FIELD | '[' N ']' | ...)*   DWARF variable, members, elements
//   TYPE   := u8 u16 u32 u64 | s8 s16 s32 s64 | x8 x16 x32 x64 | string | ustring
//   OFF, N, LINE, RELLINE: decimal or 0x hexadecimal. PATTERN: a glob (*, ?) matched against
//   whole source lines with blanks ignored ("perf probe 'func;count++'").
//
// Default names (as perf): NAME when given; a DWARF argument is named by its text with the
// type separator turned into '_' ("p->len", "name_string"); any other is "argN", N being
// its position (from 1) in the argument list. Default types: x64 for raw arguments (x32 for
// 32-bit registers), from DWARF for variables (signed/unsigned/size; pointers x64).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/symbols/expr.h"

namespace kwatch::core::probe {

struct ProbePoint {
  enum class Kind : uint8_t {
    kFunction,    // FUNC[@SRC][+OFF|%return|:RELLINE|;PATTERN]
    kSourceLine,  // SRC:LINE or SRC;PATTERN
    kAddress,     // 0xADDR
  };
  Kind kind = Kind::kFunction;
  std::string text;         // as written
  std::string group;        // GROUP of GROUP:EVENT=, "" when not given
  std::string event;        // EVENT=, "" when not given (a default is chosen on resolution)
  std::string function;     // kFunction
  std::string file;         // @SRC of a function; SRC of kSourceLine
  uint64_t offset = 0;      // +OFF (kFunction)
  bool is_return = false;   // %return (kFunction)
  std::optional<int> line;  // :RELLINE (kFunction: lines after the declaration line),
                            // :LINE (kSourceLine: absolute)
  std::string pattern;      // ;PATTERN, "" when none
  uint64_t address = 0;     // kAddress
};

struct ArgType {
  enum class Kind : uint8_t { kUnsigned, kSigned, kHex, kString, kFloat };
  Kind kind = Kind::kHex;
  uint8_t bits = 64;  // 8, 16, 32 or 64; 0 for strings. kFloat (32/64) comes from DWARF only.

  bool operator==(const ArgType&) const = default;
  // "u32", "s8", "x64", "string", "f64".
  std::string Name() const;
};

struct ProbeArgSpec {
  enum class Kind : uint8_t {
    kRegister,      // %REG
    kAddress,       // @ADDR
    kSymbol,        // @SYM[+-OFF]
    kStackSlot,     // $stackN
    kStackPointer,  // $stack
    kRetval,        // $retval
    kComm,          // $comm
    kParams,        // $params
    kVars,          // $vars
    kVariable,      // DWARF variable expression
  };
  Kind kind = Kind::kVariable;
  std::string text;             // as written, without NAME=
  std::string name;             // NAME=, "" when not given
  std::string reg;              // kRegister: the name without '%'
  uint64_t address = 0;         // kAddress
  std::string symbol;           // kSymbol
  int64_t symbol_offset = 0;    // kSymbol
  uint64_t stack_index = 0;     // kStackSlot
  symbols::Expr variable;       // kVariable: base name and steps (no '&', no address)
  std::vector<int64_t> derefs;  // +OFF(...) wrappers, innermost first
  std::optional<ArgType> type;  // :TYPE, nullopt when not given

  // Whether perf would name it from its text (a DWARF variable without NAME=).
  bool IsDwarf() const { return kind == Kind::kVariable; }
};

struct ProbeSpec {
  ProbePoint point;
  std::vector<ProbeArgSpec> args;
};

// Parses a probe point. InvalidArgument naming the point and what is wrong, e.g.
// "bad probe point 'f+0x1g': '0x1g' is not a number (decimal or 0x hexadecimal)".
absl::StatusOr<ProbePoint> ParseProbePoint(absl::string_view text);

// Parses one fetch argument. InvalidArgument naming the argument, e.g.
// "bad argument 'x:u7': unknown type 'u7' (types: u8 u16 u32 u64 s8 ... string)".
absl::StatusOr<ProbeArgSpec> ParseProbeArg(absl::string_view text);

// Parses "POINT ARG ARG..." (arguments separated by blanks).
absl::StatusOr<ProbeSpec> ParseProbeSpec(absl::string_view text);

// Parses a type name without ':' ("u32", "string"...).
absl::StatusOr<ArgType> ParseArgType(absl::string_view text);

}  // namespace kwatch::core::probe
