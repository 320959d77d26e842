#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/event.h"
#include "watch/bitfield_value.h"

namespace kwatch::watch {

// How a condition reads the watched value.
struct ConditionOptions {
  // True when the watch's C type is signed: `new` and `old` are sign-extended from the
  // accessed width and <, <=, >, >=, /, % and >> work on int64; else everything is uint64.
  bool signed_values = false;
  // A watch on a bitfield: `new` and `old` are the bitfield's bits of the accessed bytes
  // (sign-extended from its width when signed); an access that does not hold all of them
  // counts as missing `new`.
  std::optional<BitfieldPlace> bitfield;
};

// What happened to the events a condition was evaluated on.
struct ConditionStats {
  uint64_t evaluated = 0;         // events tested
  uint64_t matched = 0;           // events for which the condition held
  uint64_t missing_new = 0;       // uses `new`, the event had no value: false
  uint64_t missing_old = 0;       // uses `old`, the event had no old value: false
  uint64_t division_by_zero = 0;  // a '/' or '%' by 0 was evaluated: false
};

// A compiled `--if` condition over an exact-value access event (core::AccessEvent).
//
// Grammar (C precedence and associativity, no assignment, no ternary):
//   integer literals: decimal (0, 42) and hexadecimal (0x8000), up to 2^64-1; negative
//   values through unary minus (-1). Names: new, old (the accessed little-endian bytes, at
//   most 8, after and before the access), tid, pid, cpu, len (bytes accessed), addr (first
//   byte accessed). Unary ! ~ - +; binary * / % + - << >> < <= > >= == != & ^ | && ||;
//   parentheses. && and || short-circuit and give 0 or 1.
// Arithmetic wraps modulo 2^64. A shift by 64 or more (or by a negative count) gives 0
// (or -1 for >> of a negative signed value). Signed INT64_MIN / -1 wraps to INT64_MIN.
//
// Compiled to a flat stack bytecode at parse time; Matches() allocates nothing.
// Copyable value type; not thread-safe (Matches updates the counters).
class Condition {
 public:
  // Parses `text`. InvalidArgument on a syntax error, with the column (1-based, in bytes)
  // and a caret line, e.g. "--if 'new >> ': expected an operand at column 8\n  new >> \n
  //           ^".
  static absl::StatusOr<Condition> Parse(std::string_view text, const ConditionOptions& opts = {});

  // Whether `event` satisfies the condition, counting it in stats(). False (and counted)
  // when the condition needs `new` or `old` and the event lacks it, or divides by zero.
  bool Matches(const core::AccessEvent& event);

  const ConditionStats& stats() const { return stats_; }
  const std::string& text() const { return text_; }
  bool uses_new() const { return uses_new_; }
  bool uses_old() const { return uses_old_; }
  // Bytecode in readable form, one instruction per line (for tests and --debug).
  std::string Disassemble() const;

  // Operations of the bytecode (public for the compiler in condition.cc).
  enum class Op : uint8_t {
    kConst,
    kNew,
    kOld,
    kTid,
    kPid,
    kCpu,
    kLen,
    kAddr,  // push
    kNeg,
    kNot,
    kBitNot,  // unary
    kMul,
    kDivU,
    kDivS,
    kModU,
    kModS,
    kAdd,
    kSub,
    kShl,  // binary
    kShrU,
    kShrS,
    kLtU,
    kLtS,
    kLeU,
    kLeS,
    kGtU,
    kGtS,
    kGeU,  //
    kGeS,
    kEq,
    kNe,
    kAnd,
    kXor,
    kOr,             //
    kJumpIfZero,     // top == 0: jump to arg, keeping 0; else pop
    kJumpIfNonZero,  // top != 0: replace by 1, jump to arg; else pop
    kToBool,         // top = (top != 0)
  };
  struct Insn {
    Op op = Op::kConst;
    uint64_t arg = 0;  // kConst: the value; jumps: the target index
  };
  // Deepest evaluation stack a condition may need; deeper ones are refused at parse time.
  static constexpr size_t kMaxStack = 64;

 private:
  Condition() = default;

  std::string text_;
  ConditionOptions opts_;
  std::vector<Insn> code_;
  bool uses_new_ = false;
  bool uses_old_ = false;
  ConditionStats stats_;
};

// A C type's name without its qualifiers, leading ("volatile long" is "long") or after a
// pointer's '*' ("struct handle *volatile" is "struct handle *").
std::string_view UnqualifiedType(std::string_view type_name);

// Whether a C type, as the watch's DWARF names it ("volatile long", "int", "int64_t",
// "const short"), is a signed integer: ConditionOptions::signed_values for its watch.
bool IsSignedType(std::string_view type_name);

}  // namespace kwatch::watch
