#pragma once

// DWARF variables visible at one address, and their location expressions made
// self-contained for evaluation at a probe hit (private to core/probe/). Every Dwarf_Die
// here belongs to the Dwfl of a ProbeTarget, which must outlive it.

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kwatch::core::probe {

// One operation of a DWARF expression, copied out of libdw. DW_OP_fbreg and
// DW_OP_call_frame_cfa never appear (they are expanded at the probe's address), and
// DW_OP_addr operands are link-time virtual addresses of the file (the load bias is added
// at evaluation). `block` holds the bytes of DW_OP_implicit_value.
struct DwarfOp {
  uint8_t atom = 0;
  uint64_t number = 0;
  uint64_t number2 = 0;
  std::vector<uint8_t> block;
};

// The DWARF view of a probe address.
struct PcScope {
  Dwfl_Module* module = nullptr;
  Dwarf_Die cu{};
  Dwarf_Addr pc = 0;                    // DWARF address of the probe
  std::vector<Dwarf_Die> scopes;        // innermost first, ending at the innermost function
                                        // (DW_TAG_subprogram or DW_TAG_inlined_subroutine)
  std::optional<Dwarf_Die> subprogram;  // the out-of-line function containing pc
  bool at_entry = false;                // pc is that function's entry point
  Dwarf_CFI* cfi = nullptr;             // .eh_frame or .debug_frame, nullptr if none
  Dwarf_Addr cfi_pc = 0;                // pc as the CFI numbers it
  int64_t addr_adjust = 0;              // DWARF address + addr_adjust = link-time vaddr
  std::string where;                    // "func+0x8", for messages
};

// A variable or parameter.
struct ScopeVar {
  Dwarf_Die die{};
  std::string name;
  bool is_param = false;
  bool global = false;  // found at file scope
};

// Parameters and variables of the scopes containing pc, innermost first, those of the
// innermost function last; an inner name hides an outer one. Unnamed ones are left out.
std::vector<ScopeVar> VisibleVariables(const PcScope& scope);

// `name` among VisibleVariables, else a file-scope variable of pc's compilation unit,
// else an external variable of any compilation unit of the module.
std::optional<ScopeVar> FindVariable(const PcScope& scope, absl::string_view name);

// The location of `var` at scope.pc, self-contained. FailedPrecondition with advice when
// the variable has no location there ("'x' is optimized out at func+0x8"), when it is only
// known through its value at function entry away from the entry, or when the expression
// uses operations kwatch does not evaluate (named in the message).
absl::StatusOr<std::vector<DwarfOp>> CompileLocation(const PcScope& scope, const ScopeVar& var);

}  // namespace kwatch::core::probe
