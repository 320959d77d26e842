#include "core/probe/dwarf_location.h"

#include <dwarf.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/symbols/dwarf_types.h"

namespace kwatch::core::probe {
namespace {

constexpr int kMaxFrameBaseDepth = 4;

// Operations the evaluator (core/probe/fetch.cc) knows.
bool Supported(uint8_t atom) {
  if ((atom >= DW_OP_lit0 && atom <= DW_OP_lit31) || (atom >= DW_OP_reg0 && atom <= DW_OP_reg31) ||
      (atom >= DW_OP_breg0 && atom <= DW_OP_breg31)) {
    return true;
  }
  switch (atom) {
    case DW_OP_addr:
    case DW_OP_const1u:
    case DW_OP_const1s:
    case DW_OP_const2u:
    case DW_OP_const2s:
    case DW_OP_const4u:
    case DW_OP_const4s:
    case DW_OP_const8u:
    case DW_OP_const8s:
    case DW_OP_constu:
    case DW_OP_consts:
    case DW_OP_dup:
    case DW_OP_drop:
    case DW_OP_over:
    case DW_OP_pick:
    case DW_OP_swap:
    case DW_OP_rot:
    case DW_OP_deref:
    case DW_OP_deref_size:
    case DW_OP_abs:
    case DW_OP_and:
    case DW_OP_div:
    case DW_OP_minus:
    case DW_OP_mod:
    case DW_OP_mul:
    case DW_OP_neg:
    case DW_OP_not:
    case DW_OP_or:
    case DW_OP_plus:
    case DW_OP_plus_uconst:
    case DW_OP_shl:
    case DW_OP_shr:
    case DW_OP_shra:
    case DW_OP_xor:
    case DW_OP_eq:
    case DW_OP_ge:
    case DW_OP_gt:
    case DW_OP_le:
    case DW_OP_lt:
    case DW_OP_ne:
    case DW_OP_regx:
    case DW_OP_bregx:
    case DW_OP_nop:
    case DW_OP_piece:
    case DW_OP_stack_value:
    case DW_OP_implicit_value:
      return true;
    default:
      return false;
  }
}

std::string OpName(uint8_t atom) {
  switch (atom) {
    case DW_OP_entry_value:
    case DW_OP_GNU_entry_value:
      return "DW_OP_entry_value";
    case DW_OP_implicit_pointer:
    case DW_OP_GNU_implicit_pointer:
      return "DW_OP_implicit_pointer";
    case DW_OP_GNU_parameter_ref:
      return "DW_OP_GNU_parameter_ref";
    case DW_OP_form_tls_address:
    case DW_OP_GNU_push_tls_address:
      return "DW_OP_form_tls_address (thread-local storage)";
    case DW_OP_bit_piece:
      return "DW_OP_bit_piece";
    case DW_OP_convert:
    case DW_OP_regval_type:
    case DW_OP_deref_type:
    case DW_OP_const_type:
      return "a typed DWARF operation";
    case DW_OP_bra:
    case DW_OP_skip:
      return "a DWARF branch";
    default:
      return absl::StrFormat("DWARF operation 0x%02x", atom);
  }
}

bool IsScopeWithVars(int tag) {
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
         tag == DW_TAG_lexical_block || tag == DW_TAG_try_block || tag == DW_TAG_catch_block;
}

// Children of `die` that are variables or parameters, in order.
void ScopeChildren(Dwarf_Die die, std::vector<ScopeVar>* out) {
  Dwarf_Die child;
  if (dwarf_child(&die, &child) != 0) {
    return;
  }
  do {
    const int tag = dwarf_tag(&child);
    if (tag != DW_TAG_formal_parameter && tag != DW_TAG_variable) {
      continue;
    }
    ScopeVar v;
    v.die = child;
    v.name = symbols::DieName(child);
    v.is_param = tag == DW_TAG_formal_parameter;
    if (!v.name.empty()) {
      out->push_back(std::move(v));
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

std::optional<ScopeVar> FileScopeVariable(Dwarf_Die cu, absl::string_view name, bool externs_only) {
  Dwarf_Die child;
  if (dwarf_child(&cu, &child) != 0) {
    return std::nullopt;
  }
  do {
    if (dwarf_tag(&child) != DW_TAG_variable || symbols::DieName(child) != name) {
      continue;
    }
    Dwarf_Attribute attr;
    if (dwarf_attr(&child, DW_AT_location, &attr) == nullptr &&
        dwarf_attr(&child, DW_AT_const_value, &attr) == nullptr) {
      continue;  // a declaration
    }
    bool external = false;
    if (externs_only && (dwarf_attr_integrate(&child, DW_AT_external, &attr) == nullptr ||
                         dwarf_formflag(&attr, &external) != 0 || !external)) {
      continue;
    }
    ScopeVar v;
    v.die = child;
    v.name = std::string(name.data(), name.size());
    v.global = true;
    return v;
  } while (dwarf_siblingof(&child, &child) == 0);
  return std::nullopt;
}

absl::Status Unavailable(const PcScope& /*scope*/, const ScopeVar& var, absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat(var.is_param ? "parameter '" : "variable '", var.name, "' ", why));
}

// Appends `ops` (an expression of `attr`) to `out`, expanding frame-relative operations.
absl::Status Translate(const PcScope& scope, const ScopeVar& var, Dwarf_Attribute* attr,
                       const Dwarf_Op* ops, size_t n, int depth, std::vector<DwarfOp>* out);

// The frame base of the function as ops computing its value.
absl::Status FrameBase(const PcScope& scope, const ScopeVar& var, int depth,
                       std::vector<DwarfOp>* out) {
  if (!scope.subprogram.has_value() || depth > kMaxFrameBaseDepth) {
    return Unavailable(scope, var, "is relative to a frame base that is not known here");
  }
  Dwarf_Die fn = *scope.subprogram;
  Dwarf_Attribute attr;
  if (dwarf_attr_integrate(&fn, DW_AT_frame_base, &attr) == nullptr) {
    return Unavailable(scope, var, "is relative to a frame base, and the function has none");
  }
  Dwarf_Op* ops = nullptr;
  size_t n = 0;
  const int found = dwarf_getlocation_addr(&attr, scope.pc, &ops, &n, 1);
  if (found <= 0 || n == 0) {
    return Unavailable(scope, var,
                       absl::StrCat("is relative to the frame base, unknown at ", scope.where));
  }
  // A register location as frame base means the register's value.
  if (n == 1 && ops[0].atom >= DW_OP_reg0 && ops[0].atom <= DW_OP_reg31) {
    out->push_back(
        DwarfOp{static_cast<uint8_t>(DW_OP_breg0 + (ops[0].atom - DW_OP_reg0)), 0, 0, {}});
    return absl::OkStatus();
  }
  if (n == 1 && ops[0].atom == DW_OP_regx) {
    out->push_back(DwarfOp{DW_OP_bregx, ops[0].number, 0, {}});
    return absl::OkStatus();
  }
  return Translate(scope, var, &attr, ops, n, depth + 1, out);
}

absl::Status CallFrameCfa(const PcScope& scope, const ScopeVar& var, int depth,
                          std::vector<DwarfOp>* out) {
  if (scope.cfi == nullptr) {
    return Unavailable(scope, var,
                       "is relative to the call frame (CFA), and the file has no call frame "
                       "information (.eh_frame)");
  }
  Dwarf_Frame* frame = nullptr;
  if (dwarf_cfi_addrframe(scope.cfi, scope.cfi_pc, &frame) != 0 || frame == nullptr) {
    return Unavailable(scope, var,
                       absl::StrCat("is relative to the call frame (CFA), which the call frame "
                                    "information does not give at ",
                                    scope.where, ": ", dwarf_errmsg(-1)));
  }
  Dwarf_Op* ops = nullptr;
  size_t n = 0;
  absl::Status s;
  if (dwarf_frame_cfa(frame, &ops, &n) != 0 || n == 0) {
    s = Unavailable(scope, var,
                    absl::StrCat("is relative to the call frame (CFA), unknown at ", scope.where));
  } else {
    s = Translate(scope, var, nullptr, ops, n, depth + 1, out);
  }
  free(frame);  // NOLINT(cppcoreguidelines-no-malloc): allocated by libdw
  return s;
}

absl::Status EntryValue(const PcScope& scope, const ScopeVar& var, Dwarf_Attribute* attr,
                        const Dwarf_Op* op, std::vector<DwarfOp>* out) {
  Dwarf_Attribute inner;
  Dwarf_Op* ops = nullptr;
  size_t n = 0;
  if (attr != nullptr && dwarf_getlocation_attr(attr, op, &inner) == 0 &&
      dwarf_getlocation(&inner, &ops, &n) == 0 && n == 1 && scope.at_entry) {
    // At the function's entry every register still holds its entry value.
    if (ops[0].atom >= DW_OP_reg0 && ops[0].atom <= DW_OP_reg31) {
      out->push_back(
          DwarfOp{static_cast<uint8_t>(DW_OP_breg0 + (ops[0].atom - DW_OP_reg0)), 0, 0, {}});
      return absl::OkStatus();
    }
    if (ops[0].atom == DW_OP_regx) {
      out->push_back(DwarfOp{DW_OP_bregx, ops[0].number, 0, {}});
      return absl::OkStatus();
    }
  }
  return Unavailable(scope, var,
                     absl::StrCat("is only known at ", scope.where,
                                  " as its value on entry to the function "
                                  "(DW_OP_entry_value), which kwatch cannot recover there; "
                                  "probe the function's entry instead"));
}

absl::Status Translate(const PcScope& scope, const ScopeVar& var, Dwarf_Attribute* attr,
                       const Dwarf_Op* ops, size_t n, int depth, std::vector<DwarfOp>* out) {
  for (size_t i = 0; i < n; ++i) {
    const Dwarf_Op& op = ops[i];
    switch (op.atom) {
      case DW_OP_fbreg:
        KW_RETURN_IF_ERROR(FrameBase(scope, var, depth, out));
        out->push_back(DwarfOp{DW_OP_consts, op.number, 0, {}});
        out->push_back(DwarfOp{DW_OP_plus, 0, 0, {}});
        continue;
      case DW_OP_call_frame_cfa:
        KW_RETURN_IF_ERROR(CallFrameCfa(scope, var, depth, out));
        continue;
      case DW_OP_entry_value:
      case DW_OP_GNU_entry_value:
        KW_RETURN_IF_ERROR(EntryValue(scope, var, attr, &op, out));
        continue;
      case DW_OP_addr:
        out->push_back(
            DwarfOp{DW_OP_addr, op.number + static_cast<uint64_t>(scope.addr_adjust), 0, {}});
        continue;
      case DW_OP_implicit_value: {
        Dwarf_Block block;
        if (attr == nullptr || dwarf_getlocation_implicit_value(attr, &op, &block) != 0) {
          return Unavailable(scope, var, "has an implicit value that libdw cannot read");
        }
        DwarfOp copy{DW_OP_implicit_value, block.length, 0, {}};
        copy.block.assign(block.data, block.data + block.length);
        out->push_back(std::move(copy));
        continue;
      }
      default:
        break;
    }
    if (!Supported(op.atom)) {
      return Unavailable(scope, var,
                         absl::StrCat("has a location at ", scope.where, " that uses ",
                                      OpName(op.atom), ", which kwatch does not evaluate"));
    }
    out->push_back(DwarfOp{op.atom, op.number, op.number2, {}});
  }
  return absl::OkStatus();
}

// The constant of a DW_AT_const_value as little-endian bytes of the variable's size.
absl::StatusOr<std::vector<DwarfOp>> ConstValue(const PcScope& scope, const ScopeVar& var,
                                                Dwarf_Attribute* attr) {
  DwarfOp op{DW_OP_implicit_value, 0, 0, {}};
  Dwarf_Block block;
  Dwarf_Sword sval = 0;
  if (dwarf_formblock(attr, &block) == 0) {
    op.block.assign(block.data, block.data + block.length);
  } else if (dwarf_formsdata(attr, &sval) == 0) {
    op.block.resize(sizeof(sval));
    std::memcpy(op.block.data(), &sval, sizeof(sval));
  } else {
    return Unavailable(scope, var, "has a constant value of a form kwatch does not read");
  }
  op.number = op.block.size();
  return std::vector<DwarfOp>{std::move(op)};
}

}  // namespace

std::vector<ScopeVar> VisibleVariables(const PcScope& scope) {
  std::vector<ScopeVar> out;
  absl::flat_hash_set<std::string> seen;
  for (const Dwarf_Die& die : scope.scopes) {
    if (!IsScopeWithVars(dwarf_tag(const_cast<Dwarf_Die*>(&die)))) {
      continue;
    }
    std::vector<ScopeVar> level;
    ScopeChildren(die, &level);
    for (ScopeVar& v : level) {
      if (seen.insert(v.name).second) {
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

std::optional<ScopeVar> FindVariable(const PcScope& scope, absl::string_view name) {
  for (ScopeVar& v : VisibleVariables(scope)) {
    if (v.name == name) {
      return std::move(v);
    }
  }
  if (std::optional<ScopeVar> v = FileScopeVariable(scope.cu, name, false); v.has_value()) {
    return v;
  }
  if (scope.module == nullptr) {
    return std::nullopt;
  }
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = nullptr;
  while ((cu = dwfl_module_nextcu(scope.module, cu, &bias)) != nullptr) {
    if (std::optional<ScopeVar> v = FileScopeVariable(*cu, name, true); v.has_value()) {
      return v;
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<DwarfOp>> CompileLocation(const PcScope& scope, const ScopeVar& var) {
  Dwarf_Die die = var.die;
  Dwarf_Attribute attr;
  if (dwarf_attr(&die, DW_AT_location, &attr) == nullptr) {
    if (dwarf_attr_integrate(&die, DW_AT_const_value, &attr) != nullptr) {
      return ConstValue(scope, var, &attr);
    }
    return Unavailable(scope, var, absl::StrCat("is optimized out at ", scope.where));
  }
  Dwarf_Op* ops = nullptr;
  size_t n = 0;
  const int found = dwarf_getlocation_addr(&attr, scope.pc, &ops, &n, 1);
  if (found < 0) {
    return absl::InternalError(
        absl::StrCat("dwarf_getlocation_addr(", var.name, "): ", dwarf_errmsg(-1)));
  }
  if (found == 0 || n == 0) {
    return Unavailable(scope, var, absl::StrCat("is optimized out at ", scope.where));
  }
  std::vector<DwarfOp> out;
  KW_RETURN_IF_ERROR(Translate(scope, var, &attr, ops, n, 0, &out));
  return out;
}

}  // namespace kwatch::core::probe
