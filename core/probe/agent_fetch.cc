#include "core/probe/agent_fetch.h"

#include <dwarf.h>
#include <sys/user.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/probe/fetch_format.h"
#include "core/probe/x86_regs.h"

namespace kwatch::core::probe {
namespace {

using agent::KwArgHeader;
using agent::KwFetchOp;
using agent::KwRegs;

// KwRegs is user_regs_struct: CompiledArg::reg_offset / 8 is the KwReg.
static_assert(sizeof(KwRegs) == sizeof(user_regs_struct));
static_assert(offsetof(user_regs_struct, rdi) == size_t{agent::kKwRdi} * 8);
static_assert(offsetof(user_regs_struct, rsp) == size_t{agent::kKwRsp} * 8);
static_assert(offsetof(user_regs_struct, gs) == size_t{agent::kKwGs} * 8);
static_assert(sizeof(KwArgHeader) == 8);

constexpr uint32_t kStringBytes = kMaxFetchString + 1;  // one more: a longer string is cut
constexpr uint32_t kXmmBytes = 16;
constexpr uint32_t kMaxStackBytes = 65536;

uint32_t Pad8(uint64_t n) {
  return static_cast<uint32_t>((n + 7) & ~uint64_t{7});
}

// An op of a fetch program (KwFetchOpcode) or of a filter program (KwFilterOpcode).
KwFetchOp Op(uint16_t op, uint32_t a = 0, uint32_t b = 0, int64_t imm = 0) {
  return KwFetchOp{op, static_cast<uint16_t>(a), b, imm};
}

std::optional<uint16_t> KwRegOfDwarf(int regno) {
  const std::optional<size_t> off = DwarfRegisterOffset(regno);
  if (!off.has_value()) {
    return std::nullopt;
  }
  return static_cast<uint16_t>(*off / 8);
}

std::string OpName(uint8_t atom) {
  switch (atom) {
    case DW_OP_deref_size:
      return "DW_OP_deref_size";
    case DW_OP_mul:
      return "DW_OP_mul";
    case DW_OP_and:
      return "DW_OP_and";
    case DW_OP_or:
      return "DW_OP_or";
    case DW_OP_shl:
      return "DW_OP_shl";
    case DW_OP_shr:
      return "DW_OP_shr";
    case DW_OP_shra:
      return "DW_OP_shra";
    case DW_OP_neg:
      return "DW_OP_neg";
    case DW_OP_dup:
      return "DW_OP_dup";
    case DW_OP_swap:
      return "DW_OP_swap";
    default:
      return absl::StrFormat("DWARF operation 0x%02x", atom);
  }
}

// Bytes a DW_OP_deref or DW_OP_deref_size reads (kKwOpDeref's b), nullopt outside 1..8.
std::optional<uint32_t> DerefSize(const DwarfOp& op) {
  if (op.atom == DW_OP_deref) {
    return 8;
  }
  if (op.number < 1 || op.number > 8) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(op.number);
}

bool PushesConstant(const DwarfOp& op) {
  switch (op.atom) {
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
      return true;
    default:
      return op.atom >= DW_OP_lit0 && op.atom <= DW_OP_lit31;
  }
}

uint64_t ConstantOf(const DwarfOp& op, uint64_t load_bias) {
  if (op.atom >= DW_OP_lit0 && op.atom <= DW_OP_lit31) {
    return op.atom - DW_OP_lit0;
  }
  return op.atom == DW_OP_addr ? op.number + load_bias : op.number;
}

// Where a value is while lowering, and the ops that compute the accumulator for it.
struct Lowered {
  enum class Kind : uint8_t {
    kMemory,    // memory at acc
    kValue,     // the value is acc (its low `value_bytes`)
    kXmm,       // the bytes of %xmm[xmm]
    kConstant,  // `constant` (nothing to run)
  };
  Kind kind = Kind::kMemory;
  std::vector<KwFetchOp> ops;
  uint32_t value_bytes = 8;
  int xmm = 0;
  std::vector<uint8_t> constant;
};

// A symbolic DWARF stack entry: a constant, or the accumulator (at most one entry).
struct Sym {
  bool acc = false;
  uint64_t c = 0;
};

std::vector<uint8_t> Bytes8(uint64_t v) {
  std::vector<uint8_t> out(8);
  std::memcpy(out.data(), &v, 8);
  return out;
}

// Lowers a self-contained location expression (CompileLocation's), or says why not.
std::optional<Lowered> LowerLocation(const std::vector<DwarfOp>& ops, uint64_t load_bias,
                                     std::string* why) {
  std::vector<Sym> stack;
  std::vector<KwFetchOp> code;
  std::optional<Lowered> result;  // a register or value location: must be the last op
  const auto fail = [why](std::string reason) -> std::optional<Lowered> {
    *why = std::move(reason);
    return std::nullopt;
  };
  const auto acc_live = [&stack] {
    return std::any_of(stack.begin(), stack.end(), [](const Sym& s) { return s.acc; });
  };
  for (const DwarfOp& op : ops) {
    const uint8_t a = op.atom;
    if (a == DW_OP_piece || a == DW_OP_bit_piece) {
      return fail("the value is in pieces (DW_OP_piece)");
    }
    if (result.has_value()) {
      return fail(
          absl::StrCat("the location goes on after a register or a value (", OpName(a), ")"));
    }
    if (a >= DW_OP_lit0 && a <= DW_OP_lit31) {
      stack.push_back(Sym{false, static_cast<uint64_t>(a - DW_OP_lit0)});
      continue;
    }
    if ((a >= DW_OP_breg0 && a <= DW_OP_breg31) || a == DW_OP_bregx) {
      const int regno = a == DW_OP_bregx ? static_cast<int>(op.number) : a - DW_OP_breg0;
      const uint64_t off = a == DW_OP_bregx ? op.number2 : op.number;
      const std::optional<uint16_t> reg = KwRegOfDwarf(regno);
      if (!reg.has_value()) {
        return fail(absl::StrCat("the address is based on ", DwarfRegisterName(regno)));
      }
      if (acc_live()) {
        return fail("the location combines two registers");
      }
      code = {Op(agent::kKwOpReg, *reg, 8)};
      if (off != 0) {
        code.push_back(Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(off)));
      }
      stack.push_back(Sym{true, 0});
      continue;
    }
    if ((a >= DW_OP_reg0 && a <= DW_OP_reg31) || a == DW_OP_regx) {
      const int regno = a == DW_OP_regx ? static_cast<int>(op.number) : a - DW_OP_reg0;
      Lowered l;
      if (const std::optional<uint16_t> reg = KwRegOfDwarf(regno); reg.has_value()) {
        l.kind = Lowered::Kind::kValue;
        l.ops = {Op(agent::kKwOpReg, *reg, 8)};
      } else if (const std::optional<int> xmm = DwarfXmmIndex(regno); xmm.has_value()) {
        l.kind = Lowered::Kind::kXmm;
        l.xmm = *xmm;
      } else {
        return fail(absl::StrCat("the value is in ", DwarfRegisterName(regno)));
      }
      result = std::move(l);
      continue;
    }
    switch (a) {
      case DW_OP_addr:
        stack.push_back(Sym{false, op.number + load_bias});
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
        stack.push_back(Sym{false, op.number});
        break;
      case DW_OP_nop:
        break;
      case DW_OP_drop:
        if (stack.empty()) {
          return fail("the expression is malformed (stack underflow)");
        }
        stack.pop_back();
        break;
      case DW_OP_plus_uconst:
        if (stack.empty()) {
          return fail("the expression is malformed (stack underflow)");
        }
        if (stack.back().acc) {
          code.push_back(Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(op.number)));
        } else {
          stack.back().c += op.number;
        }
        break;
      case DW_OP_plus:
      case DW_OP_minus: {
        if (stack.size() < 2) {
          return fail("the expression is malformed (stack underflow)");
        }
        const Sym x = stack.back();  // top
        stack.pop_back();
        const Sym y = stack.back();
        stack.pop_back();
        if (!x.acc && !y.acc) {
          stack.push_back(Sym{false, a == DW_OP_plus ? y.c + x.c : y.c - x.c});
        } else if (!x.acc) {  // acc + c, acc - c
          code.push_back(
              Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(a == DW_OP_plus ? x.c : 0 - x.c)));
          stack.push_back(Sym{true, 0});
        } else if (a == DW_OP_plus) {  // c + acc
          code.push_back(Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(y.c)));
          stack.push_back(Sym{true, 0});
        } else {
          return fail("the location subtracts a register from a constant");
        }
        break;
      }
      case DW_OP_deref:
      case DW_OP_deref_size: {
        if (stack.empty()) {
          return fail("the expression is malformed (stack underflow)");
        }
        const std::optional<uint32_t> size = DerefSize(op);
        if (!size.has_value()) {
          return fail(absl::StrCat("the location reads ", op.number, " bytes (DW_OP_deref_size)"));
        }
        if (!stack.back().acc) {
          if (acc_live()) {
            return fail("the location reads memory while it holds a register");
          }
          code = {Op(agent::kKwOpImm, 0, 0, static_cast<int64_t>(stack.back().c))};
          stack.back().acc = true;
        }
        code.push_back(Op(agent::kKwOpDeref, 0, *size));
        break;
      }
      case DW_OP_stack_value: {
        if (stack.empty()) {
          return fail("the expression is malformed (stack underflow)");
        }
        Lowered l;
        if (stack.back().acc) {
          l.kind = Lowered::Kind::kValue;
          l.ops = code;
        } else {
          l.kind = Lowered::Kind::kConstant;
          l.constant = Bytes8(stack.back().c);
        }
        result = std::move(l);
        break;
      }
      case DW_OP_implicit_value: {
        Lowered l;
        l.kind = Lowered::Kind::kConstant;
        l.constant = op.block;
        result = std::move(l);
        break;
      }
      default:
        return fail(absl::StrCat("the location uses ", OpName(a)));
    }
  }
  if (result.has_value()) {
    return result;
  }
  if (stack.empty()) {
    return fail("the expression is malformed (stack underflow)");
  }
  Lowered l;
  l.kind = Lowered::Kind::kMemory;
  if (stack.back().acc) {
    l.ops = std::move(code);
  } else {
    l.ops = {Op(agent::kKwOpImm, 0, 0, static_cast<int64_t>(stack.back().c))};
  }
  return l;
}

// A location whose value kwatch computes at drain time from parts the agent captures.
struct LoweredExpr {
  std::vector<KwFetchOp> ops;
  std::vector<DwarfOp> location;  // AgentArgPlan::location
  std::vector<size_t> captured;   // AgentArgPlan::captured
  std::vector<int> xmm;
  uint32_t bytes = 0;
};

// Splits a value expression (one that ends in DW_OP_stack_value, DW_OP_implicit_value or
// pieces of those, registers and memory) into what the agent computes with one accumulator
// (each register plus constants and dereferences; each register; each piece of memory) and
// the rest, for core::Evaluate. Says why not when the value needs memory at an address only
// the rest computes.
std::optional<LoweredExpr> LowerExpression(const std::vector<DwarfOp>& ops, uint64_t load_bias,
                                           std::string* why) {
  LoweredExpr e;
  std::optional<std::vector<KwFetchOp>> chain;  // the part being computed in acc
  bool piece_open = false;                      // ops since the last piece (or the start)
  const auto fail = [why](std::string reason) -> std::optional<LoweredExpr> {
    *why = std::move(reason);
    return std::nullopt;
  };
  const auto capture = [&e](std::vector<KwFetchOp> code, DwarfOp placeholder, uint32_t bytes) {
    e.ops.insert(e.ops.end(), code.begin(), code.end());
    e.location.push_back(std::move(placeholder));
    e.captured.push_back(e.location.size() - 1);
    e.bytes += bytes;
  };
  const auto close_chain = [&] {
    if (chain.has_value()) {
      std::vector<KwFetchOp> code;
      code.swap(*chain);
      chain.reset();
      code.push_back(Op(agent::kKwOpStoreAcc, 0, 8));
      capture(std::move(code), DwarfOp{DW_OP_const8u, 0, 0, {}}, 8);
    }
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const DwarfOp& op = ops[i];
    const uint8_t a = op.atom;
    const DwarfOp* next = i + 1 < ops.size() ? &ops[i + 1] : nullptr;
    if ((a >= DW_OP_breg0 && a <= DW_OP_breg31) || a == DW_OP_bregx) {
      const int regno = a == DW_OP_bregx ? static_cast<int>(op.number) : a - DW_OP_breg0;
      const uint64_t off = a == DW_OP_bregx ? op.number2 : op.number;
      const std::optional<uint16_t> reg = KwRegOfDwarf(regno);
      if (!reg.has_value()) {
        return fail(absl::StrCat("the address is based on ", DwarfRegisterName(regno)));
      }
      close_chain();
      chain = std::vector<KwFetchOp>{Op(agent::kKwOpReg, *reg, 8)};
      if (off != 0) {
        chain->push_back(Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(off)));
      }
      piece_open = true;
      continue;
    }
    if ((a >= DW_OP_reg0 && a <= DW_OP_reg31) || a == DW_OP_regx) {
      const int regno = a == DW_OP_regx ? static_cast<int>(op.number) : a - DW_OP_reg0;
      close_chain();
      if (const std::optional<uint16_t> reg = KwRegOfDwarf(regno); reg.has_value()) {
        capture({Op(agent::kKwOpReg, *reg, 8), Op(agent::kKwOpStoreAcc, 0, 8)},
                DwarfOp{DW_OP_implicit_value, 8, 0, std::vector<uint8_t>(8)}, 8);
      } else if (const std::optional<int> xmm = DwarfXmmIndex(regno); xmm.has_value()) {
        capture({Op(agent::kKwOpXmm, static_cast<uint32_t>(*xmm), kXmmBytes)},
                DwarfOp{DW_OP_implicit_value, kXmmBytes, 0, std::vector<uint8_t>(kXmmBytes)},
                kXmmBytes);
        e.xmm.push_back(*xmm);
      } else {
        return fail(absl::StrCat("the value is in ", DwarfRegisterName(regno)));
      }
      piece_open = true;
      continue;
    }
    if (PushesConstant(op) && next != nullptr &&
        (next->atom == DW_OP_deref || next->atom == DW_OP_deref_size)) {
      close_chain();  // memory at a constant address: a part of its own
      chain = std::vector<KwFetchOp>{
          Op(agent::kKwOpImm, 0, 0, static_cast<int64_t>(ConstantOf(op, load_bias)))};
      piece_open = true;
      continue;
    }
    if (PushesConstant(op) && chain.has_value() && next != nullptr &&
        (next->atom == DW_OP_plus || next->atom == DW_OP_minus)) {
      const uint64_t c = ConstantOf(op, load_bias);
      chain->push_back(
          Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(next->atom == DW_OP_plus ? c : 0 - c)));
      ++i;
      continue;
    }
    if ((a == DW_OP_deref || a == DW_OP_deref_size || a == DW_OP_plus_uconst) &&
        chain.has_value()) {
      if (a == DW_OP_plus_uconst) {
        chain->push_back(Op(agent::kKwOpAdd, 0, 0, static_cast<int64_t>(op.number)));
        continue;
      }
      const std::optional<uint32_t> size = DerefSize(op);
      if (!size.has_value()) {
        return fail(absl::StrCat("the location reads ", op.number, " bytes (DW_OP_deref_size)"));
      }
      chain->push_back(Op(agent::kKwOpDeref, 0, *size));
      continue;
    }
    if (a == DW_OP_deref || a == DW_OP_deref_size) {
      return fail("the location reads memory at an address it computes");
    }
    if (a == DW_OP_piece && chain.has_value()) {  // a piece of memory at the part's address
      if (op.number < 1 || op.number > 8) {
        return fail(absl::StrCat("the location has a piece of ", op.number, " bytes of memory"));
      }
      const auto n = static_cast<uint32_t>(op.number);
      std::vector<KwFetchOp> code;
      code.swap(*chain);
      chain.reset();
      code.push_back(Op(agent::kKwOpRead, 0, n));
      capture(std::move(code), DwarfOp{DW_OP_implicit_value, n, 0, std::vector<uint8_t>(n)}, n);
      e.location.push_back(op);
      piece_open = false;
      continue;
    }
    close_chain();
    if (a == DW_OP_piece) {
      const uint8_t last = e.location.empty() ? 0 : e.location.back().atom;
      if (piece_open && last != DW_OP_stack_value && last != DW_OP_implicit_value) {
        return fail("the location has a piece of memory at an address it computes");
      }
      piece_open = false;
    } else {
      piece_open = true;
    }
    e.location.push_back(op);
  }
  if (chain.has_value()) {
    return fail("the location is memory at an address it computes");
  }
  const uint8_t last = e.location.empty() ? 0 : e.location.back().atom;
  if (last != DW_OP_stack_value && last != DW_OP_implicit_value && last != DW_OP_piece) {
    return fail("the location is memory at an address it computes");
  }
  return e;
}

// %xmm registers named by a location (the fallback captures them).
std::vector<int> XmmOf(const std::vector<DwarfOp>& ops) {
  std::vector<int> out;
  for (const DwarfOp& op : ops) {
    int regno = -1;
    if (op.atom >= DW_OP_reg0 && op.atom <= DW_OP_reg31) {
      regno = op.atom - DW_OP_reg0;
    } else if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31) {
      regno = op.atom - DW_OP_breg0;
    } else if (op.atom == DW_OP_regx || op.atom == DW_OP_bregx) {
      regno = static_cast<int>(op.number);
    }
    if (const std::optional<int> x = DwarfXmmIndex(regno);
        x.has_value() && std::find(out.begin(), out.end(), *x) == out.end()) {
      out.push_back(*x);
    }
  }
  return out;
}

// Lowers one argument: its ops (after kKwOpBeginArg) and the payload bytes they write at
// most; or the reason for the fallback.
struct LoweredArg {
  AgentArgPlan plan;
  std::vector<KwFetchOp> ops;
  uint32_t max_bytes = 0;
};

std::optional<LoweredArg> LowerArg(const CompiledArg& arg, uint64_t load_bias, std::string* why) {
  LoweredArg out;
  Lowered place;
  switch (arg.base) {
    case CompiledArg::Base::kComm:
      out.plan.kind = AgentArgPlan::Kind::kString;
      out.ops.push_back(Op(agent::kKwOpComm));
      out.max_bytes = 16;
      return out;
    case CompiledArg::Base::kRegister:
      if (arg.reg_offset % 8 != 0 || arg.reg_offset >= sizeof(KwRegs) ||
          (arg.reg_bytes != 8 && arg.reg_bytes != 4)) {
        *why = absl::StrCat("register slot ", arg.reg_offset, " of ", int{arg.reg_bytes}, " bytes");
        return std::nullopt;
      }
      place.kind = Lowered::Kind::kValue;
      place.value_bytes = arg.reg_bytes;
      place.ops = {Op(agent::kKwOpReg, static_cast<uint32_t>(arg.reg_offset / 8), arg.reg_bytes)};
      break;
    case CompiledArg::Base::kAddress:
      place.kind = Lowered::Kind::kMemory;
      place.ops = {Op(agent::kKwOpImm, 0, 0, static_cast<int64_t>(arg.address + load_bias))};
      break;
    case CompiledArg::Base::kLocation: {
      std::optional<Lowered> l = LowerLocation(arg.location, load_bias, why);
      if (l.has_value()) {
        place = *std::move(l);
        break;
      }
      // A value computed from several parts: kwatch finishes it (no dereference after it).
      if (std::any_of(arg.steps.begin(), arg.steps.end(),
                      [](const FetchStep& s) { return s.kind == FetchStep::Kind::kDeref; })) {
        absl::StrAppend(why, ", and the value is dereferenced");
        return std::nullopt;
      }
      std::optional<LoweredExpr> e = LowerExpression(arg.location, load_bias, why);
      if (!e.has_value()) {
        return std::nullopt;
      }
      out.plan.kind = AgentArgPlan::Kind::kExpression;
      out.plan.location = std::move(e->location);
      out.plan.captured = std::move(e->captured);
      out.plan.xmm = std::move(e->xmm);
      out.ops = std::move(e->ops);
      out.max_bytes = e->bytes;
      return out;
    }
  }
  size_t i = 0;
  for (; i < arg.steps.size(); ++i) {
    const FetchStep& step = arg.steps[i];
    if (place.kind != Lowered::Kind::kMemory &&
        std::none_of(arg.steps.begin() + static_cast<std::ptrdiff_t>(i), arg.steps.end(),
                     [](const FetchStep& s) { return s.kind == FetchStep::Kind::kDeref; })) {
      break;  // offsets within the value's bytes: the formatter applies them
    }
    if (step.kind == FetchStep::Kind::kDeref) {
      switch (place.kind) {
        case Lowered::Kind::kMemory:
          place.ops.push_back(Op(agent::kKwOpDeref));
          break;
        case Lowered::Kind::kValue:  // the value (zero-extended) is the address
          break;
        case Lowered::Kind::kXmm:
          *why = "a pointer in an %xmm register";
          return std::nullopt;
        case Lowered::Kind::kConstant: {
          uint64_t ptr = 0;
          std::memcpy(&ptr, place.constant.data(), std::min<size_t>(8, place.constant.size()));
          place.ops = {Op(agent::kKwOpImm, 0, 0, static_cast<int64_t>(ptr))};
          break;
        }
      }
      place.kind = Lowered::Kind::kMemory;
      continue;
    }
    switch (place.kind) {
      case Lowered::Kind::kMemory:
        if (step.offset != 0) {
          place.ops.push_back(Op(agent::kKwOpAdd, 0, 0, step.offset));
        }
        break;
      case Lowered::Kind::kValue:
      case Lowered::Kind::kXmm:
        if (step.offset != 0) {
          *why = "an offset within a register before a dereference";
          return std::nullopt;
        }
        break;
      case Lowered::Kind::kConstant: {
        absl::StatusOr<std::span<const uint8_t>> rest =
            FetchBytesAt(arg, place.constant, step.offset);
        if (!rest.ok()) {
          *why = std::string{rest.status().message()};
          return std::nullopt;
        }
        place.constant.assign(rest->begin(), rest->end());
        break;
      }
    }
  }
  out.ops = std::move(place.ops);
  out.plan.first_step = i;
  switch (place.kind) {
    case Lowered::Kind::kMemory:
      if (arg.type.kind == ArgType::Kind::kString) {
        out.plan.kind = AgentArgPlan::Kind::kString;
        out.ops.push_back(Op(agent::kKwOpReadStr, 0, kStringBytes));
        out.max_bytes = kStringBytes;
      } else {
        out.plan.kind = AgentArgPlan::Kind::kBytes;
        out.max_bytes = std::clamp<uint32_t>(arg.size, 1, 8);
        out.ops.push_back(Op(agent::kKwOpRead, 0, out.max_bytes));
      }
      break;
    case Lowered::Kind::kValue:
      out.plan.kind = AgentArgPlan::Kind::kBytes;
      out.max_bytes = place.value_bytes;
      out.ops.push_back(Op(agent::kKwOpStoreAcc, 0, place.value_bytes));
      break;
    case Lowered::Kind::kXmm:
      out.plan.kind = AgentArgPlan::Kind::kBytes;
      out.max_bytes = kXmmBytes;
      out.ops = {Op(agent::kKwOpXmm, static_cast<uint32_t>(place.xmm), kXmmBytes)};
      out.plan.xmm = {place.xmm};
      break;
    case Lowered::Kind::kConstant:
      out.plan.kind = AgentArgPlan::Kind::kConstant;
      out.plan.constant = std::move(place.constant);
      out.ops.clear();
      break;
  }
  return out;
}

LoweredArg FallbackArg(const CompiledArg& arg, uint32_t stack_bytes, std::string reason) {
  LoweredArg out;
  out.plan.kind = AgentArgPlan::Kind::kFallback;
  out.plan.reason = std::move(reason);
  out.plan.xmm = XmmOf(arg.location);
  out.plan.stack_bytes = stack_bytes;
  out.ops.push_back(Op(agent::kKwOpRegsAll, 0, sizeof(KwRegs)));
  for (const int x : out.plan.xmm) {
    out.ops.push_back(Op(agent::kKwOpXmm, static_cast<uint32_t>(x), kXmmBytes));
  }
  out.ops.push_back(Op(agent::kKwOpStack, 0, stack_bytes));
  out.max_bytes =
      static_cast<uint32_t>(sizeof(KwRegs) + kXmmBytes * out.plan.xmm.size()) + stack_bytes;
  return out;
}

// One argument's header and bytes in a payload.
struct ArgBytes {
  uint16_t status = 0;
  std::span<const uint8_t> bytes;
};

}  // namespace

std::optional<std::vector<KwFetchOp>> AgentFilterValue(const CompiledArg& arg, uint64_t load_bias,
                                                       bool at_return, std::string* why) {
  const auto refuse = [why](std::string text) {
    *why = std::move(text);
    return std::nullopt;
  };
  if (arg.type.kind == ArgType::Kind::kString || arg.base == CompiledArg::Base::kComm) {
    return refuse(absl::StrCat("'", arg.name, "' is a string"));
  }
  if (arg.type.kind == ArgType::Kind::kFloat) {
    return refuse(absl::StrCat("'", arg.name, "' is a float"));
  }
  if (arg.needs_return && !at_return) {
    return refuse(absl::StrCat("'", arg.name, "' is read at a return only"));
  }
  std::string lowered_why;
  std::optional<LoweredArg> l = LowerArg(arg, load_bias, &lowered_why);
  if (!l.has_value()) {
    return refuse(absl::StrCat("'", arg.name, "' is read by kwatch (", lowered_why, ")"));
  }
  if (l->plan.kind != AgentArgPlan::Kind::kBytes || l->ops.empty() ||
      l->plan.first_step != arg.steps.size() || !l->plan.xmm.empty()) {
    return refuse(absl::StrCat("'", arg.name, "' is finished by kwatch from the record"));
  }
  std::vector<KwFetchOp> ops = std::move(l->ops);
  KwFetchOp& last = ops.back();
  uint32_t bytes = 0;
  if (last.op == agent::kKwOpStoreAcc) {
    bytes = last.b;
    ops.pop_back();
  } else if (last.op == agent::kKwOpRead) {
    bytes = last.b;
    last = Op(agent::kKwOpDeref, 0, bytes);
  } else {
    return refuse(absl::StrCat("'", arg.name, "' is finished by kwatch from the record"));
  }
  // As FormatFetchBytes reads them: the record's bytes, at most the argument's size.
  const auto raw_bytes = std::min<uint32_t>({arg.size, 8, bytes});
  if (raw_bytes == 0) {
    return refuse(absl::StrCat("'", arg.name, "' has no bytes"));
  }
  const uint32_t bits = arg.bit_size != 0 ? arg.bit_size : arg.type.bits;
  const uint32_t shift = arg.bit_size != 0 ? arg.bit_offset : 0;
  if (bits == 0 || bits > 64) {
    return refuse(absl::StrCat("'", arg.name, "' is ", bits, " bits wide"));
  }
  ops.push_back(Op(agent::kKwFilterPushAcc, bits, (raw_bytes * 8) | (shift << 8),
                   arg.type.kind == ArgType::Kind::kSigned ? 1 : 0));
  return ops;
}

absl::StatusOr<AgentFetchProgram> CompileAgentFetch(std::span<const CompiledArg> args,
                                                    uint64_t load_bias,
                                                    const AgentFetchOptions& opts) {
  if (args.size() > 0xffff) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.size(), " arguments: a fetch program numbers at most 65535"));
  }
  if (opts.stack_bytes > kMaxStackBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a stack slice of ", opts.stack_bytes,
                                                   " bytes: the agent copies at most ",
                                                   kMaxStackBytes));
  }
  const uint32_t stack_bytes = Pad8(opts.stack_bytes);
  AgentFetchProgram prog;
  uint64_t record_bytes = 0;
  for (size_t k = 0; k < args.size(); ++k) {
    const CompiledArg& arg = args[k];
    std::string why;
    std::optional<LoweredArg> l = LowerArg(arg, load_bias, &why);
    if (!l.has_value()) {
      l = FallbackArg(arg, stack_bytes, std::move(why));
      ++prog.fallbacks;
    }
    if (!l->plan.xmm.empty()) {
      prog.needs_fpregs = true;
    }
    if (l->plan.captures()) {
      prog.ops.push_back(Op(agent::kKwOpBeginArg, static_cast<uint32_t>(k)));
      prog.ops.insert(prog.ops.end(), l->ops.begin(), l->ops.end());
      record_bytes += sizeof(KwArgHeader) + Pad8(l->max_bytes);
    }
    prog.args.push_back(std::move(l->plan));
  }
  if (opts.stack_copy_bytes > 0) {
    if (opts.stack_copy_bytes > kMaxStackBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a stack copy of ", opts.stack_copy_bytes,
                                                     " bytes: the agent copies at most ",
                                                     kMaxStackBytes));
    }
    const uint32_t copy = Pad8(opts.stack_copy_bytes);
    prog.ops.push_back(Op(agent::kKwOpBeginArg, static_cast<uint32_t>(args.size())));
    prog.ops.push_back(Op(agent::kKwOpRegsAll, 0, sizeof(KwRegs)));
    prog.ops.push_back(Op(agent::kKwOpStack, 0, copy));
    record_bytes += sizeof(KwArgHeader) + sizeof(KwRegs) + copy;
    prog.stack_copy = true;
  }
  prog.ops.push_back(Op(agent::kKwOpEnd));
  prog.record_bytes = static_cast<uint32_t>(record_bytes);
  return prog;
}

absl::StatusOr<AgentArgValues> FormatAgentRecord(std::span<const CompiledArg> args,
                                                 const AgentFetchProgram& program,
                                                 std::span<const uint8_t> payload,
                                                 const AgentRecordContext& ctx) {
  if (program.args.size() != args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a program of ", program.args.size(), " arguments for ", args.size()));
  }
  AgentArgValues out;
  out.args.reserve(args.size());
  size_t pos = 0;
  // What core::Evaluate says without memory: $retval outside a return.
  const user_regs_struct no_regs{};
  FetchContext plain;
  plain.regs = &no_regs;
  plain.load_bias = ctx.load_bias;
  plain.at_return = ctx.at_return;
  plain.tid = ctx.tid;
  for (size_t k = 0; k < args.size(); ++k) {
    const CompiledArg& arg = args[k];
    const AgentArgPlan& plan = program.args[k];
    const auto put = [&](const absl::StatusOr<std::string>& v) {
      out.args.emplace_back(arg.name, v.ok() ? *v : FetchErrorText(v.status()));
    };
    std::optional<ArgBytes> got;
    if (plan.captures()) {
      if (pos + sizeof(KwArgHeader) > payload.size()) {
        put(absl::DataLossError("not in the record"));
        continue;
      }
      KwArgHeader h{};
      std::memcpy(&h, payload.data() + pos, sizeof(h));
      if (h.arg != k || h.len > payload.size() - pos - sizeof(h)) {
        return absl::DataLossError(absl::StrFormat(
            "record payload at byte %d: argument %d of %d bytes where argument %d was due", pos,
            h.arg, h.len, k));
      }
      got = ArgBytes{h.status, payload.subspan(pos + sizeof(h), h.len)};
      pos += sizeof(h) + Pad8(h.len);
    }
    if (arg.needs_return && !ctx.at_return) {
      put(Evaluate(arg, plain));  // its error
      continue;
    }
    const uint16_t status = got.has_value() ? got->status : 0;
    const std::span<const uint8_t> bytes =
        got.has_value() ? got->bytes : std::span<const uint8_t>();
    if (status == agent::kKwArgInvalid) {
      put(absl::InternalError("the agent refused an op of this argument's fetch program"));
      continue;
    }
    // Cut: a string without a NUL in its kStringBytes (shown cut), or the record's end (the
    // program's record_bytes was short: the value is incomplete).
    if (status == agent::kKwArgCut &&
        !(plan.kind == AgentArgPlan::Kind::kString && bytes.size() == kStringBytes)) {
      put(absl::DataLossError("cut at the end of the record"));
      continue;
    }
    switch (plan.kind) {
      case AgentArgPlan::Kind::kConstant:
        put(FormatFetchBytes(arg, plan.constant, plan.first_step));
        break;
      case AgentArgPlan::Kind::kBytes:
        if (bytes.size() > kXmmBytes) {
          return absl::DataLossError(
              absl::StrCat("argument ", k, ": ", bytes.size(), " bytes for a value"));
        }
        if (status == agent::kKwArgFault) {
          put(std::string{kFetchFault});
        } else {
          put(FormatFetchBytes(arg, bytes, plan.first_step));
        }
        break;
      case AgentArgPlan::Kind::kString:
        if (bytes.size() > kStringBytes) {
          return absl::DataLossError(
              absl::StrCat("argument ", k, ": a string of ", bytes.size(), " bytes"));
        }
        put(FormatFetchString(
            absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
            status == agent::kKwArgFault));
        break;
      case AgentArgPlan::Kind::kExpression: {
        if (status == agent::kKwArgFault) {
          put(std::string{kFetchFault});
          break;
        }
        CompiledArg filled = arg;
        filled.location = plan.location;
        size_t at = 0;
        for (const size_t idx : plan.captured) {
          if (idx >= filled.location.size()) {
            return absl::InvalidArgumentError(absl::StrCat("argument ", k, ": a bad plan"));
          }
          DwarfOp& op = filled.location[idx];
          const size_t n = op.atom == DW_OP_const8u ? 8 : op.number;
          if (n > bytes.size() - at) {
            return absl::DataLossError(
                absl::StrCat("argument ", k, ": ", bytes.size(), " bytes, short of its parts"));
          }
          if (op.atom == DW_OP_const8u) {
            std::memcpy(&op.number, bytes.data() + at, 8);
          } else {
            op.block.assign(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                            bytes.begin() + static_cast<std::ptrdiff_t>(at + n));
          }
          at += n;
        }
        if (at != bytes.size()) {
          return absl::DataLossError(
              absl::StrCat("argument ", k, ": ", bytes.size(), " bytes for parts of ", at));
        }
        put(Evaluate(filled, plain));
        break;
      }
      case AgentArgPlan::Kind::kFallback: {
        const size_t fixed = sizeof(KwRegs) + kXmmBytes * plan.xmm.size();
        if (bytes.size() < fixed || bytes.size() - fixed > plan.stack_bytes) {
          return absl::DataLossError(absl::StrCat("argument ", k, ": ", bytes.size(),
                                                  " bytes for registers and a stack slice"));
        }
        user_regs_struct regs{};
        std::memcpy(&regs, bytes.data(), sizeof(regs));
        user_fpregs_struct fp{};
        for (size_t x = 0; x < plan.xmm.size(); ++x) {
          std::memcpy(&fp.xmm_space[static_cast<size_t>(plan.xmm[x]) * 4],
                      bytes.data() + sizeof(KwRegs) + kXmmBytes * x, kXmmBytes);
        }
        FetchContext fc = plain;
        fc.regs = &regs;
        fc.fpregs = plan.xmm.empty() ? nullptr : &fp;
        bool not_sampled = false;
        put(EvaluateSampled(arg, fc, regs.rsp, bytes.subspan(fixed), &not_sampled));
        out.not_sampled += not_sampled ? 1 : 0;
        break;
      }
    }
  }
  if (program.stack_copy && pos + sizeof(KwArgHeader) <= payload.size()) {
    KwArgHeader h{};
    std::memcpy(&h, payload.data() + pos, sizeof(h));
    if (h.arg != args.size() || h.len > payload.size() - pos - sizeof(h)) {
      return absl::DataLossError(absl::StrFormat(
          "record payload at byte %d: %d bytes of argument %d where the stack copy was due", pos,
          h.len, h.arg));
    }
    const std::span<const uint8_t> bytes = payload.subspan(pos + sizeof(h), h.len);
    pos += sizeof(h) + Pad8(h.len);
    if (bytes.size() >= sizeof(KwRegs)) {
      user_regs_struct regs{};
      static_assert(sizeof(regs) == sizeof(KwRegs));
      std::memcpy(&regs, bytes.data(), sizeof(regs));
      out.stack_regs = regs;
      out.stack.assign(bytes.begin() + sizeof(KwRegs), bytes.end());
    }
  }
  if (pos < payload.size()) {
    return absl::DataLossError(
        absl::StrCat("record payload: ", payload.size() - pos, " bytes after the last argument"));
  }
  return out;
}

std::optional<std::vector<KwFetchOp>> AgentObjectAddress(const CompiledArg& place,
                                                         uint64_t load_bias, std::string* why) {
  std::optional<LoweredArg> l = LowerArg(place, load_bias, why);
  if (!l.has_value()) {
    return std::nullopt;
  }
  if (l->plan.kind != AgentArgPlan::Kind::kBytes && l->plan.kind != AgentArgPlan::Kind::kString) {
    *why = "its location is not one address in memory";
    return std::nullopt;
  }
  if (l->ops.empty() || l->plan.first_step != place.steps.size() ||
      (l->ops.back().op != agent::kKwOpRead && l->ops.back().op != agent::kKwOpReadStr)) {
    *why = absl::StrCat("'", place.text, "' is in a register at this point: it has no address");
    return std::nullopt;
  }
  l->ops.back() = Op(agent::kKwOpStoreAcc, 0, 8);  // the address, not the bytes there
  std::vector<KwFetchOp> out;
  out.reserve(l->ops.size() + 1);
  out.push_back(Op(agent::kKwOpBeginArg, 0));
  out.insert(out.end(), l->ops.begin(), l->ops.end());
  return out;
}

}  // namespace kwatch::core::probe
