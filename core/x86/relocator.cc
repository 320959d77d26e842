#include "core/x86/relocator.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "core/x86/format.h"

namespace kwatch::core::x86 {

namespace {

std::string HexBytes(std::span<const uint8_t> code) {
  return absl::StrJoin(code, " ", [](std::string* out, uint8_t b) {
    absl::StrAppend(out, absl::Hex(b, absl::kZeroPad2));
  });
}

bool IsCondJump(ZydisMnemonic m) {
  switch (m) {
    case ZYDIS_MNEMONIC_JO:
    case ZYDIS_MNEMONIC_JNO:
    case ZYDIS_MNEMONIC_JB:
    case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ:
    case ZYDIS_MNEMONIC_JNZ:
    case ZYDIS_MNEMONIC_JBE:
    case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS:
    case ZYDIS_MNEMONIC_JNS:
    case ZYDIS_MNEMONIC_JP:
    case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL:
    case ZYDIS_MNEMONIC_JNL:
    case ZYDIS_MNEMONIC_JLE:
    case ZYDIS_MNEMONIC_JNLE:
      return true;
    default:
      return false;
  }
}

bool IsCounterJump(ZydisMnemonic m) {
  return m == ZYDIS_MNEMONIC_JRCXZ || m == ZYDIS_MNEMONIC_JECXZ || m == ZYDIS_MNEMONIC_LOOP ||
         m == ZYDIS_MNEMONIC_LOOPE || m == ZYDIS_MNEMONIC_LOOPNE;
}

InsnFlow FlowOf(const ZydisDecodedInstruction& insn, bool relative) {
  const ZydisMnemonic m = insn.mnemonic;
  const bool far = insn.meta.branch_type == ZYDIS_BRANCH_TYPE_FAR;
  switch (m) {
    case ZYDIS_MNEMONIC_JMP:
      return far ? InsnFlow::kStop : relative ? InsnFlow::kJump : InsnFlow::kIndirectJump;
    case ZYDIS_MNEMONIC_CALL:
      return far ? InsnFlow::kStop : relative ? InsnFlow::kCall : InsnFlow::kIndirectCall;
    case ZYDIS_MNEMONIC_RET:
      return far ? InsnFlow::kStop : InsnFlow::kReturn;
    case ZYDIS_MNEMONIC_XBEGIN:  // the abort path branches to its target
      return InsnFlow::kCondJump;
    case ZYDIS_MNEMONIC_UD0:
    case ZYDIS_MNEMONIC_UD1:
    case ZYDIS_MNEMONIC_UD2:
    case ZYDIS_MNEMONIC_HLT:
    case ZYDIS_MNEMONIC_INT3:
    case ZYDIS_MNEMONIC_INT1:
    case ZYDIS_MNEMONIC_IRET:
    case ZYDIS_MNEMONIC_IRETD:
    case ZYDIS_MNEMONIC_IRETQ:
    case ZYDIS_MNEMONIC_SYSRET:
    case ZYDIS_MNEMONIC_SYSEXIT:
    case ZYDIS_MNEMONIC_SYSENTER:
      return InsnFlow::kStop;
    default:
      return IsCondJump(m) || IsCounterJump(m) ? InsnFlow::kCondJump : InsnFlow::kNext;
  }
}

void AppendLe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
}

void AppendLe64(std::vector<uint8_t>& out, uint64_t v) {
  AppendLe32(out, static_cast<uint32_t>(v));
  AppendLe32(out, static_cast<uint32_t>(v >> 32));
}

int32_t Rel32(RemoteAddr next, RemoteAddr target) {
  return static_cast<int32_t>(static_cast<int64_t>(target.value - next.value));
}

// push $imm64 without touching a register or the flags: push $lo32 (sign-extended), then
// movl $hi32, 4(%rsp).
void AppendPushImm64(std::vector<uint8_t>& out, uint64_t v) {
  out.push_back(0x68);
  AppendLe32(out, static_cast<uint32_t>(v));
  out.insert(out.end(), {0xc7, 0x44, 0x24, 0x04});
  AppendLe32(out, static_cast<uint32_t>(v >> 32));
}

// jcc with condition `cc` (the low nibble of its opcode) to `target`.
void AppendJcc(std::vector<uint8_t>& out, RemoteAddr base, uint8_t cc, RemoteAddr target) {
  const RemoteAddr at = base + out.size();
  if (Rel32Reaches(at + 6, target)) {
    out.insert(out.end(), {0x0f, static_cast<uint8_t>(0x80 | cc)});
    AppendLe32(out, static_cast<uint32_t>(Rel32(at + 6, target)));
    return;
  }
  // The inverse condition jumps over an absolute jump (14 bytes).
  out.insert(out.end(), {static_cast<uint8_t>(0x70 | (cc ^ 1)), 14});
  AppendJump(out, base, target);
}

// Whether a memory operand uses %rsp (as base or index).
bool UsesRsp(const ZydisDecodedOperand& op) {
  if (op.type == ZYDIS_OPERAND_TYPE_REGISTER) {
    return op.reg.value == ZYDIS_REGISTER_RSP || op.reg.value == ZYDIS_REGISTER_ESP;
  }
  return op.type == ZYDIS_OPERAND_TYPE_MEMORY &&
         (op.mem.base == ZYDIS_REGISTER_RSP || op.mem.index == ZYDIS_REGISTER_RSP);
}

}  // namespace

std::string X86Insn::Text() const {
  return FormatAtt(insn, operands.data(), addr.value);
}

absl::StatusOr<X86Insn> DecodeX86(std::span<const uint8_t> code, RemoteAddr addr) {
  ZydisDecoder decoder;
  if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
    return absl::InternalError("cannot initialise the Zydis decoder");
  }
  X86Insn d;
  d.addr = addr;
  const size_t avail = std::min<size_t>(code.size(), d.bytes.size());
  if (avail == 0 || !ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code.data(), avail, &d.insn,
                                                         d.operands.data()))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the bytes at 0x%x (%s) do not decode as an x86-64 instruction", addr.value,
                        HexBytes(code.first(avail))));
  }
  d.length = d.insn.length;
  std::copy_n(code.begin(), d.length, d.bytes.begin());
  const bool relative = d.insn.raw.imm[0].is_relative != 0;
  if (relative) {
    d.branch_target = d.next() + static_cast<uint64_t>(d.insn.raw.imm[0].value.s);
  }
  for (uint8_t i = 0; i < d.insn.operand_count_visible; ++i) {
    const ZydisDecodedOperand& op = d.operands[i];
    if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.base == ZYDIS_REGISTER_RIP) {
      d.rip_target = d.next() + static_cast<uint64_t>(op.mem.disp.value);
    }
  }
  d.flow = FlowOf(d.insn, relative);
  return d;
}

std::string WhyCannotDisplace(const ZydisDecodedInstruction& insn,
                              std::span<const ZydisDecodedOperand> visible_operands) {
  const ZydisMnemonic m = insn.mnemonic;
  if (m == ZYDIS_MNEMONIC_INT3 || (m == ZYDIS_MNEMONIC_INT && !visible_operands.empty() &&
                                   visible_operands[0].imm.value.u == 3)) {
    return "it is a breakpoint already (int3: kwatch's own, a debugger's or the program's)";
  }
  if (m == ZYDIS_MNEMONIC_INT1) {
    return "int1 raises a debug trap";
  }
  if (m == ZYDIS_MNEMONIC_UD0 || m == ZYDIS_MNEMONIC_UD1 || m == ZYDIS_MNEMONIC_UD2) {
    return "it raises SIGILL by design; run out of line, the fault would point into kwatch's area";
  }
  if (m == ZYDIS_MNEMONIC_IRET || m == ZYDIS_MNEMONIC_IRETD || m == ZYDIS_MNEMONIC_IRETQ ||
      m == ZYDIS_MNEMONIC_SYSENTER || m == ZYDIS_MNEMONIC_SYSEXIT || m == ZYDIS_MNEMONIC_SYSRET) {
    return "a privilege-level transfer cannot be displaced";
  }
  if (m == ZYDIS_MNEMONIC_XBEGIN) {
    return "xbegin's abort address is relative and a transaction aborts on int3 anyway";
  }
  if ((insn.attributes & ZYDIS_ATTRIB_IS_PRIVILEGED) != 0) {
    return "a privileged instruction (ring 0 only) never runs in a user program";
  }
  if (insn.meta.branch_type == ZYDIS_BRANCH_TYPE_FAR) {
    return "far branches are not supported";
  }
  for (const ZydisDecodedOperand& op : visible_operands) {
    if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.base == ZYDIS_REGISTER_RIP &&
        insn.raw.disp.size != 32) {
      return "a RIP-relative operand without a 32-bit displacement";
    }
    if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.base == ZYDIS_REGISTER_EIP) {
      return "EIP-relative (addr32) operands are not supported";
    }
  }
  return "";
}

bool Rel32Reaches(RemoteAddr next, RemoteAddr target) {
  const auto delta = static_cast<int64_t>(target.value - next.value);
  return delta >= std::numeric_limits<int32_t>::min() &&
         delta <= std::numeric_limits<int32_t>::max();
}

void AppendJump(std::vector<uint8_t>& out, RemoteAddr base, RemoteAddr target) {
  const RemoteAddr at = base + out.size();
  if (Rel32Reaches(at + 5, target)) {
    out.push_back(0xe9);
    AppendLe32(out, static_cast<uint32_t>(Rel32(at + 5, target)));
    return;
  }
  out.insert(out.end(), {0xff, 0x25, 0, 0, 0, 0});  // jmp *0(%rip)
  AppendLe64(out, target.value);
}

absl::StatusOr<Relocation> Relocate(std::span<const uint8_t> code, RemoteAddr from, RemoteAddr to,
                                    CallMode mode) {
  Relocation r;
  r.from = from;
  r.to = to;
  r.length = static_cast<uint32_t>(code.size());
  const RemoteAddr end = from + code.size();
  size_t off = 0;
  while (off < code.size()) {
    auto decoded = DecodeX86(code.subspan(off), from + off);
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot relocate: ", decoded.status().message()));
    }
    const X86Insn& d = *decoded;
    const std::string text = d.Text();
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot relocate 0x%x (%s): %s", d.addr.value, text, why));
    };
    if (off + d.length > code.size()) {
      return refuse(absl::StrFormat("it crosses the end of the %d bytes to relocate", code.size()));
    }
    const std::string why =
        WhyCannotDisplace(d.insn, std::span(d.operands.data(), d.insn.operand_count_visible));
    if (!why.empty()) {
      return refuse(why);
    }
    const ZydisMnemonic m = d.insn.mnemonic;
    if (m == ZYDIS_MNEMONIC_XABORT || m == ZYDIS_MNEMONIC_XEND) {
      return refuse("transactional code: the probe's work would run inside the transaction");
    }
    const bool branch = d.flow == InsnFlow::kJump || d.flow == InsnFlow::kCondJump ||
                        d.flow == InsnFlow::kCall || d.flow == InsnFlow::kIndirectJump ||
                        d.flow == InsnFlow::kIndirectCall || d.flow == InsnFlow::kReturn;
    if (branch && (d.insn.attributes & ZYDIS_ATTRIB_HAS_OPERANDSIZE) != 0) {
      return refuse("16-bit near branches are not supported");
    }
    if (d.branch_target && *d.branch_target > from && *d.branch_target < end) {
      return refuse(
          absl::StrFormat("it jumps to 0x%x, inside the instructions being moved (0x%x..0x%x)",
                          d.branch_target->value, from.value, end.value));
    }
    const bool last = off + d.length == code.size();
    const bool call = d.flow == InsnFlow::kCall || d.flow == InsnFlow::kIndirectCall;
    if (call && mode == CallMode::kPushReturn && !last) {
      return refuse(absl::StrFormat(
          "the call returns to 0x%x, inside the instructions being moved: only a range's last "
          "instruction may be a call",
          d.next().value));
    }
    RelocatedInsn ri;
    ri.from = d.addr;
    ri.length = d.length;
    ri.out_offset = static_cast<uint32_t>(r.code.size());
    ri.text = text;
    // Copies the instruction with its RIP-relative displacement rebased to `at`.
    auto copy_rebased = [&](std::span<const uint8_t> bytes) -> absl::Status {
      const RemoteAddr at = to + r.code.size();
      const size_t start = r.code.size();
      r.code.insert(r.code.end(), bytes.begin(), bytes.end());
      if (d.rip_target) {
        if (!Rel32Reaches(at + bytes.size(), *d.rip_target)) {
          return absl::OutOfRangeError(absl::StrFormat(
              "cannot relocate 0x%x (%s): its RIP-relative target 0x%x is beyond +-2 GiB of "
              "0x%x",
              d.addr.value, text, d.rip_target->value, at.value));
        }
        const int32_t disp = Rel32(at + bytes.size(), *d.rip_target);
        std::memcpy(r.code.data() + start + d.insn.raw.disp.offset, &disp, sizeof(disp));
      }
      return absl::OkStatus();
    };
    const std::span<const uint8_t> bytes(d.bytes.data(), d.length);
    switch (d.flow) {
      case InsnFlow::kJump:
        AppendJump(r.code, to, *d.branch_target);
        break;
      case InsnFlow::kCondJump:
        if (IsCondJump(m)) {
          AppendJcc(r.code, to, d.insn.opcode & 0x0f, *d.branch_target);
        } else if (IsCounterJump(m)) {
          // jrcxz/loop keep their prefixes and rel8 form: taken, they skip a short jmp over
          // the jump to the target.
          r.code.insert(r.code.end(), bytes.begin(), bytes.end() - 1);
          r.code.push_back(2);
          const RemoteAddr jump_at = to + r.code.size() + 2;
          r.code.insert(
              r.code.end(),
              {0xeb, static_cast<uint8_t>(Rel32Reaches(jump_at + 5, *d.branch_target) ? 5 : 14)});
          AppendJump(r.code, to, *d.branch_target);
        } else {
          return refuse("a relative branch kwatch cannot rewrite");
        }
        break;
      case InsnFlow::kCall:
        if (mode == CallMode::kPushReturn) {
          AppendPushImm64(r.code, d.next().value);
          AppendJump(r.code, to, *d.branch_target);
        } else {
          const RemoteAddr at = to + r.code.size();
          if (Rel32Reaches(at + 5, *d.branch_target)) {
            r.code.push_back(0xe8);
            AppendLe32(r.code, static_cast<uint32_t>(Rel32(at + 5, *d.branch_target)));
          } else {
            // call *2(%rip); jmp over the address (the call returns there); the address.
            r.code.insert(r.code.end(), {0xff, 0x15, 0x02, 0, 0, 0, 0xeb, 0x08});
            AppendLe64(r.code, d.branch_target->value);
          }
        }
        break;
      case InsnFlow::kIndirectCall:
        if (mode == CallMode::kPushReturn) {
          if (UsesRsp(d.operands[0])) {
            return refuse("a call through %rsp cannot become push and jmp");
          }
          AppendPushImm64(r.code, d.next().value);
          // ff /2 (call) becomes ff /4 (jmp) with the same operand.
          std::array<uint8_t, 15> jmp = d.bytes;
          jmp[d.insn.raw.modrm.offset] =
              static_cast<uint8_t>((jmp[d.insn.raw.modrm.offset] & 0xc7) | (4 << 3));
          KW_RETURN_IF_ERROR(copy_rebased(std::span(jmp.data(), d.length)));
        } else {
          KW_RETURN_IF_ERROR(copy_rebased(bytes));
        }
        break;
      default:
        if (d.branch_target) {
          return refuse("a relative branch kwatch cannot rewrite");
        }
        KW_RETURN_IF_ERROR(copy_rebased(bytes));
        break;
    }
    ri.out_length = static_cast<uint32_t>(r.code.size()) - ri.out_offset;
    r.insns.push_back(std::move(ri));
    r.falls_through = d.flow != InsnFlow::kJump && d.flow != InsnFlow::kReturn &&
                      d.flow != InsnFlow::kIndirectJump && d.flow != InsnFlow::kStop &&
                      !(call && mode == CallMode::kPushReturn);
    off += d.length;
  }
  return r;
}

}  // namespace kwatch::core::x86
