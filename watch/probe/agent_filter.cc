#include "watch/probe/agent_filter.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/probe/agent_fetch.h"
#include "watch/condition.h"
#include "watch/probe/hit_filter.h"

namespace kwatch::watch::probe {

namespace {

namespace ka = kwatch::agent;
using Op = Condition::Op;

ka::KwFetchOp FilterOp(uint16_t op, uint32_t a = 0, uint32_t b = 0, int64_t imm = 0) {
  return ka::KwFetchOp{op, static_cast<uint16_t>(a), b, imm};
}

// The agent's operator for a unary or binary Condition::Op.
std::optional<ka::KwFilterOperator> OperatorOf(Op op) {
  switch (op) {
    case Op::kNeg:
      return ka::kKwFilterNeg;
    case Op::kNot:
      return ka::kKwFilterNot;
    case Op::kBitNot:
      return ka::kKwFilterBitNot;
    case Op::kMul:
      return ka::kKwFilterMul;
    case Op::kDivU:
      return ka::kKwFilterDivU;
    case Op::kDivS:
      return ka::kKwFilterDivS;
    case Op::kModU:
      return ka::kKwFilterModU;
    case Op::kModS:
      return ka::kKwFilterModS;
    case Op::kAdd:
      return ka::kKwFilterAdd;
    case Op::kSub:
      return ka::kKwFilterSub;
    case Op::kShl:
      return ka::kKwFilterShl;
    case Op::kShrU:
      return ka::kKwFilterShrU;
    case Op::kShrS:
      return ka::kKwFilterShrS;
    case Op::kLtU:
      return ka::kKwFilterLtU;
    case Op::kLtS:
      return ka::kKwFilterLtS;
    case Op::kLeU:
      return ka::kKwFilterLeU;
    case Op::kLeS:
      return ka::kKwFilterLeS;
    case Op::kGtU:
      return ka::kKwFilterGtU;
    case Op::kGtS:
      return ka::kKwFilterGtS;
    case Op::kGeU:
      return ka::kKwFilterGeU;
    case Op::kGeS:
      return ka::kKwFilterGeS;
    case Op::kEq:
      return ka::kKwFilterEq;
    case Op::kNe:
      return ka::kKwFilterNe;
    case Op::kAnd:
      return ka::kKwFilterAnd;
    case Op::kXor:
      return ka::kKwFilterXor;
    case Op::kOr:
      return ka::kKwFilterOr;
    default:
      return std::nullopt;
  }
}

bool IsUnary(Op op) {
  return op == Op::kNeg || op == Op::kNot || op == Op::kBitNot;
}

}  // namespace

AgentFilter CompileAgentFilter(const ProbeDef& def, uint64_t load_bias, bool ids_as_shown) {
  AgentFilter out;
  if (def.condition.empty()) {
    return out;
  }
  const auto in_kwatch = [&out](std::string why) {
    out.ops.clear();
    out.in_kwatch_why = std::move(why);
    return out;
  };
  absl::StatusOr<ConditionOptions> opts = ConditionOptionsFor(def);
  if (!opts.ok()) {
    return in_kwatch(std::string{opts.status().message()});
  }
  absl::StatusOr<Condition> cond = Condition::Parse(def.condition, *opts);
  if (!cond.ok()) {
    return in_kwatch(std::string{cond.status().message()});
  }
  const std::vector<Condition::Insn>& code = cond->code();
  // Where each instruction of the condition starts in the program (jumps are renumbered).
  std::vector<uint32_t> start(code.size() + 1, 0);
  std::vector<size_t> jumps;  // ops whose b is an instruction index until the end
  int depth = 0;
  int deepest = 0;
  for (size_t k = 0; k < code.size(); ++k) {
    const Condition::Insn& in = code[k];
    start[k] = static_cast<uint32_t>(out.ops.size());
    switch (in.op) {
      case Op::kConst:
        out.ops.push_back(FilterOp(ka::kKwFilterPushImm, 0, 0, static_cast<int64_t>(in.arg)));
        ++depth;
        break;
      case Op::kTid:
      case Op::kPid:
        if (!ids_as_shown) {
          return in_kwatch("the target's tids and pids are its pid namespace's, not kwatch's");
        }
        out.ops.push_back(
            FilterOp(in.op == Op::kTid ? ka::kKwFilterPushTid : ka::kKwFilterPushPid));
        ++depth;
        break;
      case Op::kCpu:
        return in_kwatch("the agent does not see the cpu");
      case Op::kVar: {
        if (in.arg >= def.args.size()) {
          return in_kwatch("$duration pairs calls in kwatch");
        }
        std::string why;
        std::optional<std::vector<ka::KwFetchOp>> value =
            core::probe::AgentFilterValue(def.args[in.arg], load_bias, def.point.is_return, &why);
        if (!value.has_value()) {
          return in_kwatch(why);
        }
        out.ops.insert(out.ops.end(), value->begin(), value->end());
        ++depth;
        break;
      }
      case Op::kStrEq:
      case Op::kStrNe:
        return in_kwatch("it compares strings");
      case Op::kJumpIfZero:
      case Op::kJumpIfNonZero:
        jumps.push_back(out.ops.size());
        out.ops.push_back(
            FilterOp(in.op == Op::kJumpIfZero ? ka::kKwFilterJumpZero : ka::kKwFilterJumpNonZero, 0,
                     static_cast<uint32_t>(in.arg)));
        --depth;  // the way on pops; the jump keeps the value its target finds
        break;
      case Op::kToBool:
        out.ops.push_back(FilterOp(ka::kKwFilterToBool));
        break;
      default: {
        const std::optional<ka::KwFilterOperator> op = OperatorOf(in.op);
        if (!op.has_value()) {
          return in_kwatch("it reads an access's names");  // new, old, len, addr
        }
        if (IsUnary(in.op)) {
          out.ops.push_back(FilterOp(ka::kKwFilterUnary, *op));
        } else {
          out.ops.push_back(FilterOp(ka::kKwFilterBinary, *op));
          --depth;
        }
        break;
      }
    }
    deepest = std::max(deepest, depth);
  }
  start[code.size()] = static_cast<uint32_t>(out.ops.size());
  out.ops.push_back(FilterOp(ka::kKwFilterEnd));
  for (const size_t j : jumps) {
    const uint32_t target = out.ops[j].b;
    if (target > code.size()) {
      return in_kwatch("a jump outside the condition");
    }
    out.ops[j].b = start[target];
  }
  if (deepest > static_cast<int>(ka::kKwFilterStack)) {
    return in_kwatch(
        absl::StrCat("it needs ", deepest, " stack words, the agent has ", ka::kKwFilterStack));
  }
  return out;
}

}  // namespace kwatch::watch::probe
