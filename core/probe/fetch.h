#pragma once

// Probe arguments compiled against a resolved probe point, and their evaluation at a hit.
//
// A compiled argument is a small program: a base (a register, an address of the file, a
// DWARF location expression, a constant, the thread's name) that gives a place (memory at
// an address, or bytes such as a register's), then steps (dereference: read a pointer from
// the place and go there; offset: move within the place), then a final read (an integer of
// `size` bytes, a bitfield, or a NUL-terminated string). It holds no libdw pointers: it stays
// valid after the ProbeTarget is gone.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/remote_addr.h"
#include "core/probe/dwarf_location.h"
#include "core/probe/probe_spec.h"
#include "core/probe/probe_target.h"
#include "core/symbols/symbols.h"
#include "core/symbols/type_layout.h"

namespace kwatch::core::probe {

// Longest string an argument shows, in bytes (longer ones are cut and marked).
inline constexpr size_t kMaxFetchString = 256;

struct FetchStep {
  enum class Kind : uint8_t {
    kDeref,   // read 8 bytes at the place as a pointer: the place becomes memory there
    kOffset,  // move the place by `offset` bytes
  };
  Kind kind = Kind::kOffset;
  int64_t offset = 0;
};

struct CompiledArg {
  enum class Base : uint8_t {
    kRegister,  // bytes of a user_regs_struct slot
    kAddress,   // memory at a link-time address of the file (+ load bias)
    kLocation,  // a DWARF location expression
    kComm,      // the thread's name
  };
  std::string name;  // display name (NAME=, the DWARF text, or argN)
  std::string text;  // the argument as written, for messages
  ArgType type;      // how the value is shown
  Base base = Base::kRegister;
  size_t reg_offset = 0;          // kRegister: offset in user_regs_struct
  uint8_t reg_bytes = 8;          // kRegister: 8, or 4 for 32-bit names
  uint64_t address = 0;           // kAddress
  std::vector<DwarfOp> location;  // kLocation
  std::vector<FetchStep> steps;
  uint32_t size = 8;          // bytes of the final read (integers and floats)
  uint8_t bit_offset = 0;     // bitfields: first bit within the `size` bytes read
  uint8_t bit_size = 0;       // 0 unless a bitfield
  bool needs_return = false;  // $retval: only at a return
};

// What an argument is evaluated against: a stopped thread at the probe.
struct FetchContext {
  // Registers at the probed instruction (before it runs), or right after the function
  // returned for return probes. Required.
  const user_regs_struct* regs = nullptr;
  // Run-time address of the file minus its link-time address (ProbeTarget::LoadBias).
  uint64_t load_bias = 0;
  // Target memory; absolute run-time addresses.
  symbols::MemoryReader read;
  // The hit is a function return ($retval allowed).
  bool at_return = false;
  // Floating-point registers, for variables DWARF places in %xmm (optional).
  const user_fpregs_struct* fpregs = nullptr;
  // The thread, for $comm (read from /proc/TID/comm); 0 when unknown.
  pid_t tid = 0;
};

// Compiles `args` for `point`. $params and $vars expand to one argument per parameter or
// visible variable (those with a location there). InvalidArgument / NotFound /
// FailedPrecondition with advice: unknown variable (listing those available), unknown
// member, a variable optimized out at the point, $retval or a DWARF variable at a non-
// matching probe kind, :string on something that is not an address.
absl::StatusOr<std::vector<CompiledArg>> CompileArgs(const ProbeTarget& target,
                                                     const ResolvedPoint& point,
                                                     const std::vector<ProbeArgSpec>& args);

// The object a watch takes at a probe point (`kwatch --write 'r->len' --in compute`): a
// variable visible there, with members, elements, '->' and '*' (a ProbeArgSpec's DWARF form
// without a type suffix), compiled to the steps that find its address, with its type.
struct CompiledObject {
  CompiledArg place;      // its base and steps; no final read
  uint64_t length = 0;    // bytes of its type
  std::string type_name;  // C spelling
  symbols::TypeLayout layout;
};

// Compiles `expr` as CompileArgs does a variable (the same errors: unknown variable with
// those available, unknown member...), plus InvalidArgument for a bitfield (it has no address
// of its own: watch the structure holding it), a type without a size, and a return point.
absl::StatusOr<CompiledObject> CompileObject(const ProbeTarget& target, const ResolvedPoint& point,
                                             const std::string& expr);

// Where `place` (a CompiledObject's) lies in memory for this hit. FailedPrecondition when the
// variable is not in memory there ("'sum' is in a register at this point: it has no address
// to watch"), when a pointer on the way is NULL, or when a pointer cannot be read (naming the
// address); the evaluator's own errors as Evaluate gives them.
absl::StatusOr<RemoteAddr> EvaluateObjectAddress(const CompiledArg& place, const FetchContext& ctx);

// Parses each of `args` and compiles them.
absl::StatusOr<std::vector<CompiledArg>> CompileArgStrings(const ProbeTarget& target,
                                                           const ResolvedPoint& point,
                                                           const std::vector<std::string>& args);

// The value of `arg` formatted: decimal for u/s (and %g for floats), 0x.. for x, a quoted
// string for :string ("\"text\"", escaped, cut at kMaxFetchString bytes with `...` after
// the closing quote). Memory that cannot be read gives OK "(fault)", as perf shows it.
// Errors: FailedPrecondition for $retval outside a return, %xmm variables without
// fpregs, $comm without a tid, and expressions the evaluator cannot finish (stack
// underflow, division by zero).
absl::StatusOr<std::string> Evaluate(const CompiledArg& arg, const FetchContext& ctx);

// What a value shows when it needed memory a sampling backend did not copy (the uprobe
// backend's stack sample, the in-process agent's fallback capture).
inline constexpr absl::string_view kNotSampled = "(not sampled)";

// Evaluate with ctx's registers when the only memory known is `stack`, a copy of the
// thread's stack from `sp` up (ctx.read is replaced by it). A value that needed memory
// outside it shows kNotSampled and sets `*not_sampled` (left unchanged otherwise).
absl::StatusOr<std::string> EvaluateSampled(const CompiledArg& arg, FetchContext ctx, uint64_t sp,
                                            std::span<const uint8_t> stack, bool* not_sampled);

// "name=value name=value" for all of `args` (an error becomes "name=<error: ...>").
std::string EvaluateAll(const std::vector<CompiledArg>& args, const FetchContext& ctx);

}  // namespace kwatch::core::probe
