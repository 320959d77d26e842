#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/event.h"
#include "watch/bitfield_value.h"

namespace kwatch::watch {

// A name a condition may use besides its built-in ones: a probe's argument ("len", "r->len",
// "$retval"), or what the caller measures at each hit ("comm", "$duration").
struct ConditionVariable {
  enum class Kind : uint8_t {
    kSigned,    // an integer compared as int64
    kUnsigned,  // an integer compared as uint64 (a condition using one is unsigned, as C)
    kString,    // bytes: only `NAME == "text"` and `NAME != "text"` (either side)
  };
  std::string name;
  Kind kind = Kind::kSigned;
  std::string alias;  // a second name ("$retval" for an argument shown as "arg1"), or ""
};

// How a condition reads the watched value.
struct ConditionOptions {
  // True when the watch's C type is signed: `new` and `old` are sign-extended from the
  // accessed width and <, <=, >, >=, /, % and >> work on int64; else everything is uint64.
  bool signed_values = false;
  // A watch on a bitfield: `new` and `old` are the bitfield's bits of the accessed bytes
  // (sign-extended from its width when signed); an access that does not hold all of them
  // counts as missing `new`.
  std::optional<BitfieldPlace> bitfield;

  // Probe conditions (`kwatch probe 'tick i if i > 1'`): false drops the names of an access
  // (new, old, len, addr) and lets names be paths as perf writes its arguments ("r->len",
  // "a.b[2]", "$retval") and compare strings with "literals"; tid, pid and cpu stay.
  bool access_names = true;
  // Names besides the built-in ones, by index (looked up first). Integers are signed unless
  // one used is unsigned (signed_values is ignored when access_names is false).
  std::vector<ConditionVariable> variables;
  // Where errors point: the condition is `text` at byte `context_offset` of `context` (a probe
  // spec); errors then quote `context` with the caret under the column in it. Empty: errors
  // quote the condition itself, as "--if '...'".
  std::string context;
  size_t context_offset = 0;
};

// The values of a probe condition's names at one hit (ConditionOptions::variables by index).
struct ConditionInputs {
  int64_t tid = 0;
  int64_t pid = 0;
  uint64_t cpu = 0;
  // Integers by variable index (nullopt: no value at this hit, e.g. a faulted read).
  std::span<const std::optional<uint64_t>> numbers;
  // Strings by variable index (nullopt: no value).
  std::span<const std::optional<std::string_view>> strings;
};

// What happened to the events a condition was evaluated on.
struct ConditionStats {
  uint64_t evaluated = 0;         // events tested
  uint64_t matched = 0;           // events for which the condition held
  uint64_t missing_new = 0;       // uses `new`, the event had no value: false
  uint64_t missing_old = 0;       // uses `old`, the event had no old value: false
  uint64_t division_by_zero = 0;  // a '/' or '%' by 0 was evaluated: false
  uint64_t missing_value = 0;     // a variable it read had no value at the hit: false
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
  // The same for a probe condition (ConditionOptions::access_names false).
  bool Matches(const ConditionInputs& inputs);

  // The words of `text` that are names (paths in probe syntax: "r->len", "$retval"), in order
  // of first use, each once: a caller binds them to variables before Parse. Empty when the
  // text does not tokenize (Parse says why).
  static std::vector<std::string> NamesIn(std::string_view text);

  const ConditionStats& stats() const { return stats_; }
  const std::string& text() const { return text_; }
  bool uses_new() const { return uses_new_; }
  bool uses_old() const { return uses_old_; }
  // Whether the condition reads variable `index` (ConditionOptions::variables).
  bool uses_variable(size_t index) const;
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
    kVar,            // push the integer variable `arg`
    kStrEq,          // push (string test `arg` holds): variable == literal
    kStrNe,          // push (string test `arg` fails)
  };
  struct Insn {
    Op op = Op::kConst;
    uint64_t arg = 0;  // kConst: the value; jumps: the target index
  };
  // Deepest evaluation stack a condition may need; deeper ones are refused at parse time.
  static constexpr size_t kMaxStack = 64;
  // The bytecode Matches runs (for compilers into other machines: the agent's filters).
  const std::vector<Insn>& code() const { return code_; }

 private:
  Condition() = default;
  // Evaluates the bytecode; `in` supplies every name.
  struct Inputs;
  bool Run(const Inputs& in);

  std::string text_;
  ConditionOptions opts_;
  std::vector<Insn> code_;
  // kStrEq / kStrNe operands: the string variable and the literal.
  struct StringTest {
    size_t variable = 0;
    std::string literal;
  };
  std::vector<StringTest> string_tests_;
  std::vector<bool> used_variables_;
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
