// The filter interpreter (agent/abi.h "Filter programs"): a probe's condition, run at each hit
// before its record is written, so that a hit the condition rejects costs no record and no
// ring space; the same machine computes aggregations' values and keys (aggregate.cc).
// watch::Condition's semantics (watch/condition.cc), on the agent's terms: no libc, no system call,
// reads through the safe routines, a fixed stack on the thread's own.

#include <array>
#include <atomic>
#include <cstdint>

#include "agent/agent.h"
#include "agent/int_ops.h"

namespace kwatch::agent {

namespace {

using int_ops::DivSigned;
using int_ops::LessSigned;
using int_ops::ModSigned;
using int_ops::Negate;
using int_ops::Shl;
using int_ops::ShrS;
using int_ops::ShrU;

enum class Verdict : uint8_t { kValue, kDivZero, kInvalid };

// `x op y`; kDivZero for '/' or '%' by 0.
Verdict Binary(uint32_t op, uint64_t x, uint64_t y, uint64_t& out) {
  switch (op) {
    case kKwFilterMul:
      out = x * y;
      return Verdict::kValue;
    case kKwFilterDivU:
    case kKwFilterDivS:
    case kKwFilterModU:
    case kKwFilterModS:
      if (y == 0) {
        return Verdict::kDivZero;
      }
      if (op == kKwFilterDivU) {
        out = x / y;
      } else if (op == kKwFilterModU) {
        out = x % y;
      } else if (op == kKwFilterDivS) {
        out = DivSigned(x, y);
      } else {
        out = ModSigned(x, y);
      }
      return Verdict::kValue;
    case kKwFilterAdd:
      out = x + y;
      return Verdict::kValue;
    case kKwFilterSub:
      out = x - y;
      return Verdict::kValue;
    case kKwFilterShl:
      out = Shl(x, y);
      return Verdict::kValue;
    case kKwFilterShrU:
      out = ShrU(x, y);
      return Verdict::kValue;
    case kKwFilterShrS:
      out = ShrS(x, y);
      return Verdict::kValue;
    case kKwFilterLtU:
      out = static_cast<uint64_t>(x < y);
      return Verdict::kValue;
    case kKwFilterLtS:
      out = static_cast<uint64_t>(LessSigned(x, y));
      return Verdict::kValue;
    case kKwFilterLeU:
      out = static_cast<uint64_t>(x <= y);
      return Verdict::kValue;
    case kKwFilterLeS:
      out = static_cast<uint64_t>(!LessSigned(y, x));
      return Verdict::kValue;
    case kKwFilterGtU:
      out = static_cast<uint64_t>(x > y);
      return Verdict::kValue;
    case kKwFilterGtS:
      out = static_cast<uint64_t>(LessSigned(y, x));
      return Verdict::kValue;
    case kKwFilterGeU:
      out = static_cast<uint64_t>(x >= y);
      return Verdict::kValue;
    case kKwFilterGeS:
      out = static_cast<uint64_t>(!LessSigned(x, y));
      return Verdict::kValue;
    case kKwFilterEq:
      out = static_cast<uint64_t>(x == y);
      return Verdict::kValue;
    case kKwFilterNe:
      out = static_cast<uint64_t>(x != y);
      return Verdict::kValue;
    case kKwFilterAnd:
      out = x & y;
      return Verdict::kValue;
    case kKwFilterXor:
      out = x ^ y;
      return Verdict::kValue;
    case kKwFilterOr:
      out = x | y;
      return Verdict::kValue;
    default:
      return Verdict::kInvalid;
  }
}

inline uint64_t LowBits(uint64_t v, uint32_t bits) {
  return bits >= 64 ? v : v & ((uint64_t{1} << bits) - 1);
}

// kKwFilterPushAcc's value: the bytes the record would hold, read as the argument's type.
bool AccValue(const KwFetchOp& op, uint64_t acc, uint64_t& out) {
  const uint32_t bits = op.a;
  const uint32_t raw_bits = op.b & 0xff;
  const uint32_t shift = (op.b >> 8) & 0xff;
  if (bits == 0 || bits > 64 || raw_bits == 0 || raw_bits > 64 || shift >= 64) {
    return false;
  }
  uint64_t v = LowBits(LowBits(acc, raw_bits) >> shift, bits);
  if ((op.imm & 1) != 0 && bits < 64 && ((v >> (bits - 1)) & 1) != 0) {
    v |= ~((uint64_t{1} << bits) - 1);
  }
  out = v;
  return true;
}

inline void Count(std::atomic<uint64_t>& counter) {
  counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

EvalResult RunProgram(const Session& s, uint32_t first, uint32_t count, const KwRegs& regs,
                      int32_t tid, uint64_t& top) {
  if (count == 0 || first > s.code_capacity || count > s.code_capacity - first) {
    return EvalResult::kNoValue;
  }
  const KwFetchOp* ops = s.code + first;
  std::array<uint64_t, kKwFilterStack> stack;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  uint32_t sp = 0;                             // the next free slot
  uint64_t acc = 0;
  for (uint32_t pc = 0; pc < count; ++pc) {
    const KwFetchOp& op = ops[pc];
    switch (StepAcc(op, regs, acc)) {
      case AccStep::kDone:
        continue;
      case AccStep::kFault:
      case AccStep::kInvalid:
        return EvalResult::kNoValue;
      case AccStep::kNotAcc:
        break;
    }
    // Each op's stack needs, checked: a program kwatch got wrong must not write past it.
    const bool pushes = op.op == kKwFilterPushAcc || op.op == kKwFilterPushImm ||
                        op.op == kKwFilterPushTid || op.op == kKwFilterPushPid;
    if ((pushes && sp == kKwFilterStack) || (!pushes && sp == 0) ||
        (op.op == kKwFilterBinary && sp < 2)) {
      return EvalResult::kNoValue;
    }
    switch (op.op) {
      case kKwFilterEnd:
        top = stack[sp - 1];
        return EvalResult::kValue;
      case kKwFilterPushAcc:
        if (!AccValue(op, acc, stack[sp])) {
          return EvalResult::kNoValue;
        }
        ++sp;
        break;
      case kKwFilterPushImm:
        stack[sp++] = static_cast<uint64_t>(op.imm);
        break;
      case kKwFilterPushTid:
        stack[sp++] = static_cast<uint64_t>(static_cast<int64_t>(tid));
        break;
      case kKwFilterPushPid:
        stack[sp++] = static_cast<uint64_t>(static_cast<int64_t>(g_pid));
        break;
      case kKwFilterUnary: {
        uint64_t& t = stack[sp - 1];
        if (op.a == kKwFilterNeg) {
          t = Negate(t);
        } else if (op.a == kKwFilterNot) {
          t = static_cast<uint64_t>(t == 0);
        } else if (op.a == kKwFilterBitNot) {
          t = ~t;
        } else {
          return EvalResult::kNoValue;
        }
        break;
      }
      case kKwFilterBinary: {
        --sp;
        switch (Binary(op.a, stack[sp - 1], stack[sp], stack[sp - 1])) {
          case Verdict::kValue:
            break;
          case Verdict::kDivZero:
            return EvalResult::kDivZero;
          case Verdict::kInvalid:
            return EvalResult::kNoValue;
        }
        break;
      }
      case kKwFilterJumpZero:
      case kKwFilterJumpNonZero: {
        const bool zero = stack[sp - 1] == 0;
        if (zero == (op.op == kKwFilterJumpZero)) {
          if (op.b <= pc || op.b >= count) {
            return EvalResult::kNoValue;  // only forward, inside the program
          }
          if (!zero) {
            stack[sp - 1] = 1;
          }
          pc = op.b - 1;
        } else {
          --sp;
        }
        break;
      }
      case kKwFilterToBool:
        stack[sp - 1] = static_cast<uint64_t>(stack[sp - 1] != 0);
        break;
      default:
        return EvalResult::kNoValue;
    }
  }
  return EvalResult::kNoValue;  // no kKwFilterEnd
}

bool RunFilter(const Session& s, KwProbe& probe, const KwRegs& regs, int32_t tid) {
  if (probe.filter_len == 0) {
    return true;
  }
  uint64_t top = 0;
  switch (RunProgram(s, probe.filter_offset, probe.filter_len, regs, tid, top)) {
    case EvalResult::kValue:
      if (top == 0) {
        Count(probe.filtered);
        return false;
      }
      return true;
    case EvalResult::kNoValue:
      Count(probe.filter_no_value);
      return false;
    case EvalResult::kDivZero:
      Count(probe.filter_div0);
      return false;
  }
  return false;
}

}  // namespace kwatch::agent
