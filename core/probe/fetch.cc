#include "core/probe/fetch.h"

#include <dwarf.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch_format.h"
#include "core/probe/x86_regs.h"
#include "core/ptrace/maps.h"
#include "core/symbols/dwarf_types.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbol_match.h"

namespace kwatch::core::probe {
namespace {

constexpr int kMaxDwarfStack = 64;
constexpr uint64_t kPageSize = 4096;

// ---------------------------------------------------------------------------------------
// Compilation.

std::optional<uint64_t> UdataAttr(Dwarf_Die die, unsigned int name) {
  Dwarf_Attribute attr;
  Dwarf_Word value = 0;
  if (dwarf_attr_integrate(&die, name, &attr) == nullptr || dwarf_formudata(&attr, &value) != 0) {
    return std::nullopt;
  }
  return value;
}

bool IsCharType(const symbols::TypeRef& type) {
  const symbols::TypeRef s = symbols::StripType(type);
  Dwarf_Die die = s.die;
  if (dwarf_tag(&die) != DW_TAG_base_type || UdataAttr(die, DW_AT_byte_size).value_or(0) != 1) {
    return false;
  }
  const uint64_t enc = UdataAttr(die, DW_AT_encoding).value_or(0);
  return enc == DW_ATE_signed_char || enc == DW_ATE_unsigned_char || enc == DW_ATE_UTF ||
         enc == DW_ATE_signed || enc == DW_ATE_unsigned;
}

// How perf shows a scalar DWARF type by default; an error for aggregates.
absl::StatusOr<ArgType> DefaultType(const symbols::TypeRef& type, const std::string& what) {
  const symbols::TypeRef s = symbols::StripType(type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  const std::string name = symbols::TypeName(type);
  const std::optional<uint64_t> size = symbols::TypeSize(type);
  if (tag == DW_TAG_pointer_type || tag == DW_TAG_reference_type ||
      tag == DW_TAG_rvalue_reference_type) {
    return ArgType{ArgType::Kind::kHex, 64};
  }
  if (tag == DW_TAG_array_type) {
    const std::optional<symbols::TypeRef> elem = symbols::ArrayElement(s);
    return absl::InvalidArgumentError(absl::StrCat(
        "'", what, "' is ", name, ": pick an element ('", what, "[0]')",
        elem.has_value() && IsCharType(*elem) ? absl::StrCat(" or read it as ':string'") : ""));
  }
  if (tag == DW_TAG_structure_type || tag == DW_TAG_union_type || tag == DW_TAG_class_type) {
    const std::vector<std::string> members = symbols::MemberNames(die);
    return absl::InvalidArgumentError(
        absl::StrCat("'", what, "' is ", name, ": pick a member",
                     members.empty() ? "" : absl::StrCat(" (", absl::StrJoin(members, ", "), ")")));
  }
  if (!size.has_value() || (*size != 1 && *size != 2 && *size != 4 && *size != 8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", what, "' is ", name, size.has_value() ? absl::StrCat(" (", *size, " bytes)") : "",
        ": kwatch shows integers and floats of 1, 2, 4 or 8 bytes"));
  }
  const auto bits = static_cast<uint8_t>(*size * 8);
  uint64_t enc = DW_ATE_signed;
  if (tag == DW_TAG_base_type) {
    enc = UdataAttr(die, DW_AT_encoding).value_or(DW_ATE_signed);
  } else if (tag == DW_TAG_enumeration_type) {
    const std::optional<Dwarf_Die> under = symbols::TypeOf(die);
    enc = DW_ATE_unsigned;
    if (under.has_value()) {
      enc = UdataAttr(symbols::StripType(symbols::TypeRef{*under, 0}).die, DW_AT_encoding)
                .value_or(enc);
    }
  }
  switch (enc) {
    case DW_ATE_float:
      return ArgType{ArgType::Kind::kFloat, bits};
    case DW_ATE_signed:
    case DW_ATE_signed_char:
      return ArgType{ArgType::Kind::kSigned, bits};
    default:
      return ArgType{ArgType::Kind::kUnsigned, bits};
  }
}

void AddDerefs(const std::vector<int64_t>& derefs, CompiledArg* out) {
  for (const int64_t off : derefs) {
    out->steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
    out->steps.push_back(FetchStep{FetchStep::Kind::kOffset, off});
  }
}

std::string VarNames(const std::vector<ScopeVar>& vars) {
  std::vector<std::string> names;
  names.reserve(vars.size());
  for (const ScopeVar& v : vars) {
    names.push_back(v.name);
  }
  return absl::StrJoin(names, ", ");
}

// A member step (`.` or, after a dereference, `->`) on a struct or union.
absl::Status MemberStep(const symbols::ExprStep& step, const std::string& display,
                        symbols::TypeRef* type, CompiledArg* out,
                        std::optional<symbols::MemberInfo>* bitfield) {
  const symbols::TypeRef s = symbols::StripType(*type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  if (tag != DW_TAG_structure_type && tag != DW_TAG_union_type && tag != DW_TAG_class_type) {
    return absl::InvalidArgumentError(absl::StrCat("'", display, "' is ", symbols::TypeName(*type),
                                                   ", not a struct or union: it has no member '",
                                                   step.member, "'"));
  }
  const std::optional<symbols::MemberInfo> m = symbols::FindMember(die, step.member);
  if (!m.has_value() || !m->has_type) {
    const std::vector<std::string> names = symbols::MemberNames(die);
    std::string msg = absl::StrCat(symbols::TypeName(*type), " has no member '", step.member, "'");
    const std::vector<std::string> near = symbols::NearMatches(step.member, names, 1);
    if (!near.empty()) {
      absl::StrAppend(&msg, "; did you mean '", near[0], "'?");
    }
    absl::StrAppend(&msg, " Members: ", absl::StrJoin(names, ", "));
    return absl::InvalidArgumentError(msg);
  }
  out->steps.push_back(FetchStep{FetchStep::Kind::kOffset, static_cast<int64_t>(m->offset)});
  *type = m->type;
  if (m->bit_size != 0) {
    *bitfield = m;
  }
  return absl::OkStatus();
}

// Applies the DWARF steps of `spec` from the variable's place.
absl::Status VariableSteps(const ProbeArgSpec& spec, symbols::TypeRef* type, CompiledArg* out,
                           std::optional<symbols::MemberInfo>* bitfield) {
  std::string display = spec.variable.base;
  for (const symbols::ExprStep& step : spec.variable.steps) {
    if (bitfield->has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", display, "' is a bitfield: it has no members or elements"));
    }
    const symbols::TypeRef s = symbols::StripType(*type);
    Dwarf_Die die = s.die;
    const int tag = dwarf_tag(&die);
    const std::string type_name = symbols::TypeName(*type);
    switch (step.kind) {
      case symbols::ExprStep::Kind::kMember:
        if (tag == DW_TAG_pointer_type) {
          return absl::InvalidArgumentError(absl::StrCat("'", display, "' is a pointer (",
                                                         type_name, "): use '", display, "->",
                                                         step.member, "'"));
        }
        KW_RETURN_IF_ERROR(MemberStep(step, display, type, out, bitfield));
        absl::StrAppend(&display, ".", step.member);
        break;
      case symbols::ExprStep::Kind::kArrow: {
        if (tag != DW_TAG_pointer_type) {
          return absl::InvalidArgumentError(absl::StrCat("'", display, "' is ", type_name,
                                                         ", not a pointer: use '", display, ".",
                                                         step.member, "'"));
        }
        const std::optional<Dwarf_Die> pointee = symbols::TypeOf(die);
        if (!pointee.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", display, "' is a void pointer: it has no members"));
        }
        out->steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
        *type = symbols::TypeRef{*pointee, 0};
        KW_RETURN_IF_ERROR(MemberStep(step, display, type, out, bitfield));
        absl::StrAppend(&display, "->", step.member);
        break;
      }
      case symbols::ExprStep::Kind::kDeref: {
        const std::optional<Dwarf_Die> pointee =
            tag == DW_TAG_pointer_type ? symbols::TypeOf(die) : std::nullopt;
        if (!pointee.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat("'", display, "' is ", type_name, ": only a typed pointer takes '*'"));
        }
        out->steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
        *type = symbols::TypeRef{*pointee, 0};
        display = absl::StrCat("*", display);
        break;
      }
      case symbols::ExprStep::Kind::kIndex: {
        std::optional<symbols::TypeRef> elem;
        if (tag == DW_TAG_array_type) {
          elem = symbols::ArrayElement(s);
          const auto dims = symbols::ArrayDims(die);
          const auto dim = static_cast<size_t>(s.skip_dims);
          if (step.index < 0 || (dim < dims.size() && dims[dim].has_value() &&
                                 static_cast<uint64_t>(step.index) >= *dims[dim])) {
            return absl::InvalidArgumentError(absl::StrCat(
                "index ", step.index, " is out of bounds for '", display, "' (", type_name, ")"));
          }
        } else if (tag == DW_TAG_pointer_type) {
          if (const std::optional<Dwarf_Die> p = symbols::TypeOf(die); p.has_value()) {
            elem = symbols::TypeRef{*p, 0};
          }
          out->steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("'", display, "' is ", type_name,
                           ", not an array or a pointer: it takes no [index]"));
        }
        const std::optional<uint64_t> esize =
            elem.has_value() ? symbols::TypeSize(*elem) : std::optional<uint64_t>();
        if (!esize.has_value() || *esize == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("the elements of '", display, "' (", type_name, ") have no size"));
        }
        // The byte offset must fit in int64_t ('p[9223372036854775807]' overflowed it).
        int64_t byte_offset = 0;
        if (*esize > static_cast<uint64_t>(INT64_MAX) ||
            __builtin_mul_overflow(step.index, static_cast<int64_t>(*esize), &byte_offset)) {
          return absl::InvalidArgumentError(absl::StrCat("index ", step.index, " of '", display,
                                                         "' is too large: its elements are ",
                                                         *esize, " bytes"));
        }
        out->steps.push_back(FetchStep{FetchStep::Kind::kOffset, byte_offset});
        *type = *elem;
        absl::StrAppend(&display, "[", step.index, "]");
        break;
      }
    }
  }
  return absl::OkStatus();
}

// The final read of a DWARF argument of type `type`.
absl::Status DwarfFinal(const ProbeArgSpec& spec, const symbols::TypeRef& type,
                        const std::optional<symbols::MemberInfo>& bitfield, CompiledArg* out) {
  const std::string what = spec.text;
  const symbols::TypeRef s = symbols::StripType(type);
  Dwarf_Die die = s.die;
  const int tag = dwarf_tag(&die);
  if (spec.type.has_value() && spec.type->kind == ArgType::Kind::kString) {
    std::optional<symbols::TypeRef> elem;
    if (tag == DW_TAG_pointer_type) {
      if (const std::optional<Dwarf_Die> p = symbols::TypeOf(die); p.has_value()) {
        elem = symbols::TypeRef{*p, 0};
      }
      out->steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
    } else if (tag == DW_TAG_array_type) {
      elem = symbols::ArrayElement(s);
    }
    if (!elem.has_value() || !IsCharType(*elem)) {
      return absl::InvalidArgumentError(absl::StrCat("'", what, "' is ", symbols::TypeName(type),
                                                     ": ':string' needs a char pointer or array"));
    }
    out->type = *spec.type;
    return absl::OkStatus();
  }
  if (spec.type.has_value()) {
    out->type = *spec.type;
    out->size = spec.type->bits / 8;
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(out->type, DefaultType(type, what));
  out->size = out->type.bits / 8;
  if (bitfield.has_value()) {
    out->size = static_cast<uint32_t>(bitfield->size);
    out->bit_offset = static_cast<uint8_t>(bitfield->bit_offset);
    out->bit_size = static_cast<uint8_t>(bitfield->bit_size);
    out->type.bits = static_cast<uint8_t>(std::max<uint64_t>(8, bitfield->size * 8));
  }
  return absl::OkStatus();
}

class Compiler {
 public:
  Compiler(const ProbeTarget& target, const ResolvedPoint& point)
      : target_(target), point_(point) {}

  absl::Status Add(const ProbeArgSpec& spec);
  std::vector<CompiledArg> Take() { return std::move(out_); }
  // CompileObject's work: `spec` is a DWARF variable expression.
  absl::StatusOr<CompiledObject> Object(const ProbeArgSpec& spec);

 private:
  absl::StatusOr<const PcScope*> Scope() {
    if (!scope_.has_value()) {
      KW_ASSIGN_OR_RETURN(scope_, target_.ScopeAt(point_));
    }
    return &*scope_;
  }
  absl::Status AddVariable(const ProbeArgSpec& spec, CompiledArg arg);
  // Looks the variable of `spec` up at the point and sets `arg`'s base to its location;
  // returns its type.
  absl::StatusOr<symbols::TypeRef> Variable(const ProbeArgSpec& spec, CompiledArg& arg);
  static absl::Status Raw(const ProbeArgSpec& spec, CompiledArg* arg);

  const ProbeTarget& target_;
  const ResolvedPoint& point_;
  std::optional<PcScope> scope_;
  std::vector<CompiledArg> out_;
};

absl::StatusOr<symbols::TypeRef> Compiler::Variable(const ProbeArgSpec& spec, CompiledArg& arg) {
  if (point_.is_return) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", spec.text, "' is a variable: a return probe (", point_.function,
                     "%return) sees only $retval, registers, memory and the stack"));
  }
  KW_ASSIGN_OR_RETURN(const PcScope* scope, Scope());
  const std::optional<ScopeVar> var = FindVariable(*scope, spec.variable.base);
  if (!var.has_value()) {
    const std::vector<ScopeVar> visible = VisibleVariables(*scope);
    std::vector<std::string> names;
    names.reserve(visible.size());
    for (const ScopeVar& v : visible) {
      names.push_back(v.name);
    }
    std::string msg = absl::StrCat("no variable '", spec.variable.base, "' at ", scope->where);
    if (const std::vector<std::string> near = symbols::NearMatches(spec.variable.base, names, 1);
        !near.empty()) {
      absl::StrAppend(&msg, "; did you mean '", near[0], "'?");
    }
    absl::StrAppend(&msg, visible.empty() ? " (no variables are visible there)"
                                          : absl::StrCat(" (available: ", VarNames(visible), ")"));
    return absl::NotFoundError(msg);
  }
  KW_ASSIGN_OR_RETURN(arg.location, CompileLocation(*scope, *var));
  arg.base = CompiledArg::Base::kLocation;
  const std::optional<Dwarf_Die> type_die = symbols::TypeOf(var->die);
  if (!type_die.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", spec.variable.base, "' has no type in the debug info"));
  }
  return symbols::TypeRef{*type_die, 0};
}

absl::Status Compiler::AddVariable(const ProbeArgSpec& spec, CompiledArg arg) {
  KW_ASSIGN_OR_RETURN(symbols::TypeRef type, Variable(spec, arg));
  std::optional<symbols::MemberInfo> bitfield;
  if (!spec.derefs.empty()) {
    // +OFF(var): the variable's value is an address.
    AddDerefs(spec.derefs, &arg);
    if (!spec.variable.steps.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", spec.text, "': +OFF(...) takes a plain variable name"));
    }
    KW_RETURN_IF_ERROR(Raw(spec, &arg));
  } else {
    KW_RETURN_IF_ERROR(VariableSteps(spec, &type, &arg, &bitfield));
    KW_RETURN_IF_ERROR(DwarfFinal(spec, type, bitfield, &arg));
  }
  out_.push_back(std::move(arg));
  return absl::OkStatus();
}

absl::StatusOr<CompiledObject> Compiler::Object(const ProbeArgSpec& spec) {
  CompiledObject obj;
  obj.place.text = spec.text;
  obj.place.name = spec.text;
  KW_ASSIGN_OR_RETURN(symbols::TypeRef type, Variable(spec, obj.place));
  std::optional<symbols::MemberInfo> bitfield;
  KW_RETURN_IF_ERROR(VariableSteps(spec, &type, &obj.place, &bitfield));
  if (bitfield.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", spec.text,
                     "' is a bitfield: it has no address of its own; watch the structure "
                     "that holds it"));
  }
  obj.type_name = symbols::TypeName(type);
  const std::optional<uint64_t> size = symbols::TypeSize(type);
  if (!size.has_value() || *size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", spec.text, "' is ", obj.type_name, ", which has no size to watch"));
  }
  obj.length = *size;
  obj.layout = symbols::FlattenLayout(type);
  obj.place.size = 0;  // no final read
  return obj;
}

// Type and final read of an argument without DWARF typing.
absl::Status Compiler::Raw(const ProbeArgSpec& spec, CompiledArg* arg) {
  const bool in_memory = !spec.derefs.empty() || arg->base == CompiledArg::Base::kAddress ||
                         spec.kind == ProbeArgSpec::Kind::kStackSlot;
  if (spec.type.has_value() && spec.type->kind == ArgType::Kind::kString) {
    if (!in_memory) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", spec.text, "': ':string' reads memory: write '+0(", spec.text,
                       "):string' to read the string it points to"));
    }
    arg->type = *spec.type;
    return absl::OkStatus();
  }
  if (spec.type.has_value()) {
    arg->type = *spec.type;
  } else if (arg->base == CompiledArg::Base::kRegister && arg->reg_bytes == 4 && !in_memory) {
    arg->type = ArgType{ArgType::Kind::kHex, 32};
  } else {
    arg->type = ArgType{ArgType::Kind::kHex, 64};
  }
  arg->size = arg->type.bits / 8;
  return absl::OkStatus();
}

absl::Status Compiler::Add(const ProbeArgSpec& spec) {
  CompiledArg arg;
  arg.text = spec.text;
  if (!spec.name.empty()) {
    arg.name = spec.name;
  } else if (spec.IsDwarf()) {
    arg.name = spec.type.has_value() ? absl::StrCat(spec.text, "_", spec.type->Name()) : spec.text;
  } else {
    arg.name = absl::StrCat("arg", out_.size() + 1);
  }
  const auto reg = [&arg](const char* name) {
    const std::optional<X86Register> r = FindX86Register(name);
    KW_CHECK(r.has_value());
    arg.base = CompiledArg::Base::kRegister;
    arg.reg_offset = r->offset;
    arg.reg_bytes = r->bytes;
  };
  switch (spec.kind) {
    case ProbeArgSpec::Kind::kParams:
    case ProbeArgSpec::Kind::kVars: {
      if (point_.is_return) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", spec.text, "': a return probe sees no variables, only $retval"));
      }
      KW_ASSIGN_OR_RETURN(const PcScope* scope, Scope());
      for (const ScopeVar& v : VisibleVariables(*scope)) {
        if ((spec.kind == ProbeArgSpec::Kind::kParams && !v.is_param) ||
            !CompileLocation(*scope, v).ok()) {
          continue;
        }
        ProbeArgSpec one;
        one.kind = ProbeArgSpec::Kind::kVariable;
        one.text = v.name;
        one.variable.text = v.name;
        one.variable.base = v.name;
        CompiledArg compiled;
        compiled.text = v.name;
        compiled.name = v.name;
        // Aggregates and arrays are left out ($vars shows what it can print).
        const size_t before = out_.size();
        if (!AddVariable(one, std::move(compiled)).ok()) {
          out_.resize(before);
        }
      }
      return absl::OkStatus();
    }
    case ProbeArgSpec::Kind::kVariable:
      return AddVariable(spec, std::move(arg));
    case ProbeArgSpec::Kind::kRegister: {
      const std::optional<X86Register> r = FindX86Register(spec.reg);
      if (!r.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("unknown register '%", spec.reg, "'"));
      }
      arg.base = CompiledArg::Base::kRegister;
      arg.reg_offset = r->offset;
      arg.reg_bytes = r->bytes;
      break;
    }
    case ProbeArgSpec::Kind::kAddress:
      arg.base = CompiledArg::Base::kAddress;
      arg.address = spec.address;
      break;
    case ProbeArgSpec::Kind::kSymbol: {
      const std::optional<RemoteAddr> sym = target_.SymbolAddress(spec.symbol);
      if (!sym.has_value()) {
        return absl::NotFoundError(absl::StrCat("'@", spec.symbol, "': no symbol '", spec.symbol,
                                                "' in ", target_.path()));
      }
      arg.base = CompiledArg::Base::kAddress;
      arg.address = sym->value + static_cast<uint64_t>(spec.symbol_offset);
      break;
    }
    case ProbeArgSpec::Kind::kStackSlot:
      reg("sp");
      arg.steps.push_back(FetchStep{FetchStep::Kind::kDeref, 0});
      arg.steps.push_back(
          FetchStep{FetchStep::Kind::kOffset, static_cast<int64_t>(spec.stack_index * 8)});
      break;
    case ProbeArgSpec::Kind::kStackPointer:
      reg("sp");
      break;
    case ProbeArgSpec::Kind::kRetval:
      if (!point_.is_return) {
        return absl::InvalidArgumentError(
            absl::StrCat("$retval is only available in a return probe: probe '", point_.function,
                         "%return' instead of '", point_.Where(), "'"));
      }
      reg("ax");
      arg.needs_return = true;
      if (!spec.type.has_value() && spec.derefs.empty()) {
        // The function's return type, when DWARF gives a scalar one.
        if (const absl::StatusOr<const PcScope*> scope = Scope();
            scope.ok() && (*scope)->subprogram.has_value()) {
          if (const std::optional<Dwarf_Die> t = symbols::TypeOf(*(*scope)->subprogram);
              t.has_value()) {
            if (absl::StatusOr<ArgType> type = DefaultType(symbols::TypeRef{*t, 0}, "$retval");
                type.ok() && type->kind != ArgType::Kind::kFloat) {
              arg.type = *type;
              arg.size = type->bits / 8;
              out_.push_back(std::move(arg));
              return absl::OkStatus();
            }
          }
        }
      }
      break;
    case ProbeArgSpec::Kind::kComm:
      arg.base = CompiledArg::Base::kComm;
      arg.type = ArgType{ArgType::Kind::kString, 0};
      out_.push_back(std::move(arg));
      return absl::OkStatus();
  }
  AddDerefs(spec.derefs, &arg);
  KW_RETURN_IF_ERROR(Raw(spec, &arg));
  out_.push_back(std::move(arg));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Evaluation.

// Where a value is: memory at an address, or bytes already fetched (registers, constants).
struct Place {
  bool memory = false;
  uint64_t addr = 0;
  std::vector<uint8_t> bytes;
};

class Evaluator {
 public:
  explicit Evaluator(const FetchContext& ctx) : ctx_(ctx) {}

  bool Faulted() const { return faulted_; }

  absl::Status Read(uint64_t addr, std::span<uint8_t> out) {
    if (!ctx_.read) {
      return absl::FailedPreconditionError("no memory reader given to read the target");
    }
    absl::Status s = ctx_.read(RemoteAddr{addr}, out);
    if (!s.ok()) {
      faulted_ = true;
    }
    return s;
  }

  absl::StatusOr<uint64_t> ReadU64(uint64_t addr, size_t size) {
    std::array<uint8_t, 8> buf{};
    KW_RETURN_IF_ERROR(Read(addr, std::span<uint8_t>(buf.data(), std::min<size_t>(size, 8))));
    uint64_t v = 0;
    std::memcpy(&v, buf.data(), sizeof(v));
    return v;
  }

  absl::StatusOr<std::vector<uint8_t>> Register(int regno) const;
  absl::StatusOr<Place> Location(const std::vector<DwarfOp>& ops);

 private:
  const FetchContext& ctx_;
  bool faulted_ = false;
};

absl::StatusOr<std::vector<uint8_t>> Evaluator::Register(int regno) const {
  if (const std::optional<size_t> off = DwarfRegisterOffset(regno); off.has_value()) {
    const uint64_t v = RegisterValue(*ctx_.regs, *off);
    std::vector<uint8_t> out(8);
    std::memcpy(out.data(), &v, 8);
    return out;
  }
  if (const std::optional<int> xmm = DwarfXmmIndex(regno); xmm.has_value()) {
    if (ctx_.fpregs == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the value is in %xmm", *xmm, ": the floating-point registers were not given"));
    }
    std::vector<uint8_t> out(16);
    std::memcpy(out.data(), &ctx_.fpregs->xmm_space[static_cast<size_t>(*xmm) * 4], 16);
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the value is in register ", DwarfRegisterName(regno), ", which kwatch does not read"));
}

absl::StatusOr<Place> Evaluator::Location(const std::vector<DwarfOp>& ops) {
  std::vector<uint64_t> stack;
  std::vector<uint8_t> composite;
  bool pieces = false;
  // The location of the current piece when it is not memory at the top of the stack.
  std::optional<std::vector<uint8_t>> bytes;
  bool piece_has_ops = false;
  const auto need = [&stack](size_t n) -> absl::Status {
    if (stack.size() < n) {
      return absl::FailedPreconditionError("malformed DWARF expression (stack underflow)");
    }
    return absl::OkStatus();
  };
  const auto push = [&stack](uint64_t v) -> absl::Status {
    if (stack.size() >= kMaxDwarfStack) {
      return absl::FailedPreconditionError("DWARF expression too deep");
    }
    stack.push_back(v);
    return absl::OkStatus();
  };
  const auto reg_value = [this](int regno) -> absl::StatusOr<uint64_t> {
    const std::optional<size_t> off = DwarfRegisterOffset(regno);
    if (!off.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the address is based on ", DwarfRegisterName(regno), ", which kwatch does not read"));
    }
    return RegisterValue(*ctx_.regs, *off);
  };
  for (const DwarfOp& op : ops) {
    const uint8_t a = op.atom;
    if (a != DW_OP_piece) {
      piece_has_ops = true;
    }
    if (a >= DW_OP_lit0 && a <= DW_OP_lit31) {
      KW_RETURN_IF_ERROR(push(a - DW_OP_lit0));
      continue;
    }
    if ((a >= DW_OP_reg0 && a <= DW_OP_reg31) || a == DW_OP_regx) {
      const int regno = a == DW_OP_regx ? static_cast<int>(op.number) : a - DW_OP_reg0;
      KW_ASSIGN_OR_RETURN(bytes, Register(regno));
      continue;
    }
    if ((a >= DW_OP_breg0 && a <= DW_OP_breg31) || a == DW_OP_bregx) {
      const int regno = a == DW_OP_bregx ? static_cast<int>(op.number) : a - DW_OP_breg0;
      const uint64_t off = a == DW_OP_bregx ? op.number2 : op.number;
      KW_ASSIGN_OR_RETURN(const uint64_t v, reg_value(regno));
      KW_RETURN_IF_ERROR(push(v + off));
      continue;
    }
    uint64_t x = 0;
    uint64_t y = 0;
    const auto pop2 = [&]() -> absl::Status {
      KW_RETURN_IF_ERROR(need(2));
      x = stack.back();  // top
      stack.pop_back();
      y = stack.back();  // second
      stack.pop_back();
      return absl::OkStatus();
    };
    switch (a) {
      case DW_OP_addr:
        KW_RETURN_IF_ERROR(push(op.number + ctx_.load_bias));
        break;
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
        KW_RETURN_IF_ERROR(push(op.number));
        break;
      case DW_OP_dup:
        KW_RETURN_IF_ERROR(need(1));
        KW_RETURN_IF_ERROR(push(stack.back()));
        break;
      case DW_OP_drop:
        KW_RETURN_IF_ERROR(need(1));
        stack.pop_back();
        break;
      case DW_OP_over:
        KW_RETURN_IF_ERROR(need(2));
        KW_RETURN_IF_ERROR(push(stack[stack.size() - 2]));
        break;
      case DW_OP_pick:
        KW_RETURN_IF_ERROR(need(op.number + 1));
        KW_RETURN_IF_ERROR(push(stack[stack.size() - 1 - op.number]));
        break;
      case DW_OP_swap:
        KW_RETURN_IF_ERROR(need(2));
        std::swap(stack[stack.size() - 1], stack[stack.size() - 2]);
        break;
      case DW_OP_rot:
        KW_RETURN_IF_ERROR(need(3));
        std::rotate(stack.end() - 3, stack.end() - 1, stack.end());
        break;
      case DW_OP_deref:
      case DW_OP_deref_size: {
        KW_RETURN_IF_ERROR(need(1));
        const size_t size = a == DW_OP_deref ? 8 : op.number;
        KW_ASSIGN_OR_RETURN(stack.back(), ReadU64(stack.back(), size));
        break;
      }
      case DW_OP_abs:
        KW_RETURN_IF_ERROR(need(1));
        stack.back() = static_cast<uint64_t>(std::abs(static_cast<int64_t>(stack.back())));
        break;
      case DW_OP_neg:
        KW_RETURN_IF_ERROR(need(1));
        stack.back() = -stack.back();
        break;
      case DW_OP_not:
        KW_RETURN_IF_ERROR(need(1));
        stack.back() = ~stack.back();
        break;
      case DW_OP_plus_uconst:
        KW_RETURN_IF_ERROR(need(1));
        stack.back() += op.number;
        break;
      case DW_OP_and:
      case DW_OP_div:
      case DW_OP_minus:
      case DW_OP_mod:
      case DW_OP_mul:
      case DW_OP_or:
      case DW_OP_plus:
      case DW_OP_shl:
      case DW_OP_shr:
      case DW_OP_shra:
      case DW_OP_xor:
      case DW_OP_eq:
      case DW_OP_ge:
      case DW_OP_gt:
      case DW_OP_le:
      case DW_OP_lt:
      case DW_OP_ne: {
        KW_RETURN_IF_ERROR(pop2());
        const auto sx = static_cast<int64_t>(x);
        const auto sy = static_cast<int64_t>(y);
        uint64_t r = 0;
        switch (a) {
          case DW_OP_and:
            r = y & x;
            break;
          case DW_OP_or:
            r = y | x;
            break;
          case DW_OP_xor:
            r = y ^ x;
            break;
          case DW_OP_plus:
            r = y + x;
            break;
          case DW_OP_minus:
            r = y - x;
            break;
          case DW_OP_mul:
            r = y * x;
            break;
          case DW_OP_shl:
            r = x >= 64 ? 0 : y << x;
            break;
          case DW_OP_shr:
            r = x >= 64 ? 0 : y >> x;
            break;
          case DW_OP_shra:
            r = static_cast<uint64_t>(sy >> std::min<uint64_t>(x, 63));
            break;
          case DW_OP_eq:
            r = sy == sx ? 1 : 0;
            break;
          case DW_OP_ne:
            r = sy != sx ? 1 : 0;
            break;
          case DW_OP_lt:
            r = sy < sx ? 1 : 0;
            break;
          case DW_OP_gt:
            r = sy > sx ? 1 : 0;
            break;
          case DW_OP_le:
            r = sy <= sx ? 1 : 0;
            break;
          case DW_OP_ge:
            r = sy >= sx ? 1 : 0;
            break;
          default:  // div, mod
            if (x == 0) {
              return absl::FailedPreconditionError("division by zero in a DWARF expression");
            }
            r = a == DW_OP_div ? static_cast<uint64_t>(sy / sx) : y % x;
        }
        KW_RETURN_IF_ERROR(push(r));
        break;
      }
      case DW_OP_nop:
        break;
      case DW_OP_stack_value: {
        KW_RETURN_IF_ERROR(need(1));
        std::vector<uint8_t> v(8);
        std::memcpy(v.data(), &stack.back(), 8);
        stack.pop_back();
        bytes = std::move(v);
        break;
      }
      case DW_OP_implicit_value:
        bytes = op.block;
        break;
      case DW_OP_piece: {
        pieces = true;
        std::vector<uint8_t> part(op.number);
        if (!piece_has_ops) {
          return absl::FailedPreconditionError("part of the value is optimized out");
        }
        if (bytes.has_value()) {
          std::copy_n(bytes->begin(), std::min(bytes->size(), part.size()), part.begin());
        } else {
          KW_RETURN_IF_ERROR(need(1));
          KW_RETURN_IF_ERROR(Read(stack.back(), std::span<uint8_t>(part)));
          stack.pop_back();
        }
        composite.insert(composite.end(), part.begin(), part.end());
        bytes.reset();
        piece_has_ops = false;
        break;
      }
      default:
        return absl::FailedPreconditionError(
            absl::StrFormat("DWARF operation 0x%02x is not evaluated", a));
    }
  }
  Place place;
  if (pieces) {
    place.bytes = std::move(composite);
  } else if (bytes.has_value()) {
    place.bytes = *std::move(bytes);
  } else {
    KW_RETURN_IF_ERROR(need(1));
    place.memory = true;
    place.addr = stack.back();
  }
  return place;
}

// Reads the NUL-terminated string at `addr`, a page at a time, as FormatFetchString wants it.
std::string ReadCString(Evaluator& ev, uint64_t addr) {
  std::string s;
  while (s.size() <= kMaxFetchString) {
    const uint64_t at = addr + s.size();
    const size_t chunk =
        std::min<uint64_t>(kPageSize - at % kPageSize, kMaxFetchString + 1 - s.size());
    std::vector<uint8_t> buf(chunk);
    if (!ev.Read(at, std::span<uint8_t>(buf)).ok()) {
      return FormatFetchString(s, /*faulted=*/true);  // what was read before
    }
    const auto nul = std::find(buf.begin(), buf.end(), 0);
    s.append(buf.begin(), nul);
    if (nul != buf.end()) {
      break;
    }
  }
  return FormatFetchString(s, /*faulted=*/false);
}

absl::StatusOr<std::string> EvaluateImpl(const CompiledArg& arg, const FetchContext& ctx,
                                         Evaluator& ev) {
  if (ctx.regs == nullptr) {
    return absl::InvalidArgumentError("no registers given to evaluate the arguments");
  }
  if (arg.needs_return && !ctx.at_return) {
    return absl::FailedPreconditionError("$retval exists only at a function's return");
  }
  Place place;
  switch (arg.base) {
    case CompiledArg::Base::kRegister: {
      const uint64_t v = RegisterValue(*ctx.regs, arg.reg_offset);
      place.bytes.resize(arg.reg_bytes);
      std::memcpy(place.bytes.data(), &v, arg.reg_bytes);
      break;
    }
    case CompiledArg::Base::kAddress:
      place.memory = true;
      place.addr = arg.address + ctx.load_bias;
      break;
    case CompiledArg::Base::kLocation: {
      absl::StatusOr<Place> p = ev.Location(arg.location);
      if (!p.ok()) {
        if (ev.Faulted()) {
          return std::string{kFetchFault};
        }
        return absl::Status(p.status().code(),
                            absl::StrCat("'", arg.text, "': ", p.status().message()));
      }
      place = *std::move(p);
      break;
    }
    case CompiledArg::Base::kComm: {
      if (ctx.tid == 0) {
        return absl::FailedPreconditionError("$comm needs the thread id");
      }
      KW_ASSIGN_OR_RETURN(std::string comm,
                          ptrace::ReadSmallFile(absl::StrCat("/proc/", ctx.tid, "/comm")));
      return QuoteFetchString(absl::StripTrailingAsciiWhitespace(comm), false);
    }
  }
  for (size_t i = 0; i < arg.steps.size(); ++i) {
    const FetchStep& step = arg.steps[i];
    if (!place.memory &&
        std::none_of(arg.steps.begin() + static_cast<std::ptrdiff_t>(i), arg.steps.end(),
                     [](const FetchStep& s) { return s.kind == FetchStep::Kind::kDeref; })) {
      return FormatFetchBytes(arg, place.bytes, i);  // the rest stays within the bytes
    }
    if (step.kind == FetchStep::Kind::kDeref) {
      uint64_t ptr = 0;
      if (place.memory) {
        absl::StatusOr<uint64_t> v = ev.ReadU64(place.addr, 8);
        if (!v.ok()) {
          return std::string{kFetchFault};
        }
        ptr = *v;
      } else {
        std::memcpy(&ptr, place.bytes.data(), std::min<size_t>(8, place.bytes.size()));
      }
      place = Place{true, ptr, {}};
    } else if (place.memory) {
      place.addr += static_cast<uint64_t>(step.offset);
    } else {
      KW_ASSIGN_OR_RETURN(const std::span<const uint8_t> rest,
                          FetchBytesAt(arg, place.bytes, step.offset));
      place.bytes.assign(rest.begin(), rest.end());
    }
  }
  if (!place.memory) {
    return FormatFetchBytes(arg, place.bytes, arg.steps.size());
  }
  if (arg.type.kind == ArgType::Kind::kString) {
    return ReadCString(ev, place.addr);
  }
  // The final read: the bytes FormatFetchBytes formats, as the agent's records hold them.
  std::array<uint8_t, 8> buf{};
  const size_t size = std::min<size_t>(arg.size, 8);
  if (!ev.Read(place.addr, std::span<uint8_t>(buf.data(), size)).ok()) {
    return std::string{kFetchFault};
  }
  return FormatFetchBytes(arg, std::span<const uint8_t>(buf.data(), size), arg.steps.size());
}

}  // namespace

absl::StatusOr<std::vector<CompiledArg>> CompileArgs(const ProbeTarget& target,
                                                     const ResolvedPoint& point,
                                                     const std::vector<ProbeArgSpec>& args) {
  Compiler compiler(target, point);
  for (const ProbeArgSpec& spec : args) {
    KW_RETURN_IF_ERROR(compiler.Add(spec));
  }
  return compiler.Take();
}

absl::StatusOr<std::vector<CompiledArg>> CompileArgStrings(const ProbeTarget& target,
                                                           const ResolvedPoint& point,
                                                           const std::vector<std::string>& args) {
  std::vector<ProbeArgSpec> specs;
  for (const std::string& a : args) {
    KW_ASSIGN_OR_RETURN(ProbeArgSpec spec, ParseProbeArg(a));
    specs.push_back(std::move(spec));
  }
  return CompileArgs(target, point, specs);
}

absl::StatusOr<CompiledObject> CompileObject(const ProbeTarget& target, const ResolvedPoint& point,
                                             const std::string& expr) {
  // A C expression as kwatch's watches take them (core/symbols/expr.h), of a variable.
  absl::StatusOr<symbols::Expr> parsed = symbols::ParseExpr(expr);
  if (!parsed.ok() || parsed->base.empty() || parsed->address.has_value() ||
      parsed->cast.has_value() || parsed->address_of) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", expr,
        "': a watched object is a variable of the function, with members, elements, '->' and "
        "'*' (e.g. 'r->len', 'buf[2]', '*p')",
        parsed.ok() ? "" : absl::StrCat(": ", parsed.status().message())));
  }
  ProbeArgSpec spec;
  spec.kind = ProbeArgSpec::Kind::kVariable;
  spec.text = expr;
  spec.variable = *std::move(parsed);
  Compiler compiler(target, point);
  return compiler.Object(spec);
}

absl::StatusOr<RemoteAddr> EvaluateObjectAddress(const CompiledArg& place,
                                                 const FetchContext& ctx) {
  if (ctx.regs == nullptr) {
    return absl::InvalidArgumentError("no registers given to evaluate the object's address");
  }
  Evaluator ev(ctx);
  Place at;
  switch (place.base) {
    case CompiledArg::Base::kAddress:
      at = Place{true, place.address + ctx.load_bias, {}};
      break;
    case CompiledArg::Base::kLocation: {
      absl::StatusOr<Place> p = ev.Location(place.location);
      if (!p.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "'", place.text, "': ",
            ev.Faulted() ? "memory its location needs cannot be read" : p.status().message()));
      }
      at = *std::move(p);
      break;
    }
    case CompiledArg::Base::kRegister:
    case CompiledArg::Base::kComm:
      return absl::InvalidArgumentError(
          absl::StrCat("'", place.text, "' is not a variable: it has no address to watch"));
  }
  for (const FetchStep& step : place.steps) {
    if (step.kind == FetchStep::Kind::kDeref) {
      uint64_t ptr = 0;
      if (at.memory) {
        absl::StatusOr<uint64_t> v = ev.ReadU64(at.addr, 8);
        if (!v.ok()) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "'%s': the pointer at 0x%x on the way cannot be read", place.text, at.addr));
        }
        ptr = *v;
      } else {
        std::memcpy(&ptr, at.bytes.data(), std::min<size_t>(8, at.bytes.size()));
      }
      if (ptr == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", place.text, "': a pointer on the way is NULL"));
      }
      at = Place{true, ptr, {}};
    } else if (at.memory) {
      at.addr += static_cast<uint64_t>(step.offset);
    } else {
      break;  // within a register: no address
    }
  }
  if (!at.memory) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", place.text,
                     "' is in a register at this point: it has no address to watch (its function "
                     "was compiled with optimisation; watch a variable that lives in memory, or "
                     "pick the point with --at)"));
  }
  return RemoteAddr{at.addr};
}

absl::StatusOr<std::string> Evaluate(const CompiledArg& arg, const FetchContext& ctx) {
  Evaluator ev(ctx);
  return EvaluateImpl(arg, ctx, ev);
}

absl::StatusOr<std::string> EvaluateSampled(const CompiledArg& arg, FetchContext ctx, uint64_t sp,
                                            std::span<const uint8_t> stack, bool* not_sampled) {
  bool outside = false;
  ctx.read = [&](RemoteAddr a, std::span<uint8_t> out) -> absl::Status {
    if (a.value >= sp && a.value - sp <= stack.size() &&
        out.size() <= stack.size() - (a.value - sp)) {
      std::memcpy(out.data(), stack.data() + (a.value - sp), out.size());
      return absl::OkStatus();
    }
    outside = true;
    return absl::NotFoundError("not in the sampled stack");
  };
  absl::StatusOr<std::string> v = Evaluate(arg, ctx);
  if (v.ok() && outside && (*v == kFetchFault || v->empty())) {
    *not_sampled = true;
    return std::string{kNotSampled};
  }
  return v;
}

std::string EvaluateAll(const std::vector<CompiledArg>& args, const FetchContext& ctx) {
  std::vector<std::string> parts;
  parts.reserve(args.size());
  for (const CompiledArg& arg : args) {
    absl::StatusOr<std::string> v = Evaluate(arg, ctx);
    parts.push_back(absl::StrCat(arg.name, "=", v.ok() ? *v : FetchErrorText(v.status())));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace kwatch::core::probe
