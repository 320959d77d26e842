#include "core/probe/jump_optimizer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"

namespace kwatch::core::probe {

namespace {

// What the whole-function scan keeps of each instruction.
struct ScannedInsn {
  RemoteAddr addr;
  uint8_t length = 0;
  x86::InsnFlow flow = x86::InsnFlow::kNext;
  std::optional<RemoteAddr> branch_target;
  std::optional<RemoteAddr> rip_target;
  bool int3 = false;
};

// "main+0x12 (0x401136)", or "0x401136" outside any named code.
std::string Where(const FunctionCode& fn, RemoteAddr addr) {
  if (!fn.name.empty() && addr >= fn.start && addr - fn.start <= fn.bytes.size()) {
    return absl::StrFormat("%s+0x%x (0x%x)", fn.name, addr - fn.start, addr.value);
  }
  return absl::StrFormat("0x%x", addr.value);
}

// The text of the instruction at `addr` in `code` ("?" when it does not decode).
std::string TextAt(const FunctionCode& code, RemoteAddr addr) {
  auto d = x86::DecodeX86(code.bytes.subspan(addr - code.start), addr);
  return d.ok() ? d->Text() : "?";
}

// Decodes `code` linearly. On failure, the offset that does not decode.
struct Scan {
  std::vector<ScannedInsn> insns;
  std::optional<uint64_t> bad_offset;
};

Scan ScanLinear(const FunctionCode& code) {
  Scan scan;
  uint64_t off = 0;
  while (off < code.bytes.size()) {
    auto d = x86::DecodeX86(code.bytes.subspan(off), code.start + off);
    if (!d.ok() || off + d->length > code.bytes.size()) {
      scan.bad_offset = off;
      return scan;
    }
    ScannedInsn s;
    s.addr = d->addr;
    s.length = d->length;
    s.flow = d->flow;
    s.branch_target = d->branch_target;
    s.rip_target = d->rip_target;
    s.int3 = d->insn.mnemonic == ZYDIS_MNEMONIC_INT3;
    scan.insns.push_back(s);
    off += d->length;
  }
  return scan;
}

// Every code region given, scanned: the function first, then options.other_code.
struct CodeScan {
  const FunctionCode* code = nullptr;
  Scan scan;
};

std::vector<CodeScan> ScanAll(const FunctionCode& fn, const JumpOptions& options) {
  std::vector<CodeScan> scans;
  scans.push_back({&fn, ScanLinear(fn)});
  for (const FunctionCode& other : options.other_code) {
    scans.push_back({&other, ScanLinear(other)});
  }
  return scans;
}

// Whether `addr` starts an instruction of a scanned region.
bool IsBoundary(const std::vector<CodeScan>& scans, RemoteAddr addr) {
  for (const CodeScan& cs : scans) {
    const auto& insns = cs.scan.insns;
    const auto it = std::lower_bound(insns.begin(), insns.end(), addr,
                                     [](const ScannedInsn& s, RemoteAddr a) { return s.addr < a; });
    if (it != insns.end() && it->addr == addr) {
      return true;
    }
  }
  return false;
}

ZydisRegister Reg64(ZydisRegister reg) {
  return ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, reg);
}

bool IsReg(const ZydisDecodedOperand& op) {
  return op.type == ZYDIS_OPERAND_TYPE_REGISTER;
}

bool IsReg64(const ZydisDecodedOperand& op) {
  return IsReg(op) && ZydisRegisterGetClass(op.reg.value) == ZYDIS_REGCLASS_GPR64;
}

// The jump table proof over scanned code (ProveJumpTable's contract); `k` indexes the jmp in
// scans[r].
absl::StatusOr<std::vector<RemoteAddr>> ProveTable(const std::vector<CodeScan>& scans, size_t r,
                                                   size_t k, const JumpOptions& options) {
  const FunctionCode& fn = *scans[r].code;
  const std::vector<ScannedInsn>& insns = scans[r].scan.insns;
  auto decode = [&](size_t i) {
    return x86::DecodeX86(fn.bytes.subspan(insns[i].addr - fn.start), insns[i].addr);
  };
  auto mismatch = [](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a jump table kwatch can prove (", what, ")"));
  };
  KW_ASSIGN_OR_RETURN(const x86::X86Insn jmp, decode(k));
  const ZydisDecodedOperand& target_op = jmp.operands[0];
  // Walks back from the jmp over the table load, then the bound check.
  size_t i = k;
  auto prev = [&]() -> absl::StatusOr<x86::X86Insn> {
    if (i == 0) {
      return mismatch("the function starts before the bound check");
    }
    --i;
    return decode(i);
  };
  std::optional<RemoteAddr> table;
  uint32_t entry_size = 0;
  ZydisRegister index = ZYDIS_REGISTER_NONE;
  if (IsReg64(target_op)) {
    // add %rB,%rX; movslq (%rB,%rI,4),%rX; [lea T(%rip),%rB]
    const ZydisRegister x = target_op.reg.value;
    KW_ASSIGN_OR_RETURN(const x86::X86Insn add, prev());
    if (add.insn.mnemonic != ZYDIS_MNEMONIC_ADD || !IsReg64(add.operands[0]) ||
        !IsReg64(add.operands[1]) || add.operands[0].reg.value != x) {
      return mismatch(absl::StrCat("'", add.Text(), "' before the jmp is not add %rB,%rX"));
    }
    const ZydisRegister b = add.operands[1].reg.value;
    KW_ASSIGN_OR_RETURN(const x86::X86Insn load, prev());
    const ZydisDecodedOperand& mem = load.operands[1];
    if (load.insn.mnemonic != ZYDIS_MNEMONIC_MOVSXD || !IsReg64(load.operands[0]) ||
        load.operands[0].reg.value != x || mem.type != ZYDIS_OPERAND_TYPE_MEMORY ||
        mem.mem.base != b || mem.mem.scale != 4 || mem.mem.disp.has_displacement != 0 ||
        Reg64(mem.mem.index) != mem.mem.index || mem.mem.index == ZYDIS_REGISTER_NONE) {
      return mismatch(
          absl::StrCat("'", load.Text(), "' is not movslq (%rB,%rI,4),%rX with the add's %rB"));
    }
    index = mem.mem.index;
    if (index == b) {
      return mismatch(absl::StrCat("'", load.Text(), "' indexes with the table's base"));
    }
    entry_size = 4;
    KW_ASSIGN_OR_RETURN(x86::X86Insn before, prev());
    if (before.insn.mnemonic == ZYDIS_MNEMONIC_LEA && IsReg64(before.operands[0]) &&
        before.operands[0].reg.value == b && before.rip_target) {
      table = before.rip_target;
    } else {
      ++i;  // the lea may come before the bound check
    }
  } else if (target_op.type == ZYDIS_OPERAND_TYPE_MEMORY &&
             target_op.mem.base == ZYDIS_REGISTER_NONE && target_op.mem.scale == 8 &&
             target_op.mem.index != ZYDIS_REGISTER_NONE &&
             Reg64(target_op.mem.index) == target_op.mem.index) {
    table = RemoteAddr{static_cast<uint64_t>(target_op.mem.disp.value)};
    entry_size = 8;
    index = target_op.mem.index;
  } else {
    return mismatch(absl::StrCat("'", jmp.Text(), "' is neither jmp *%rX nor jmp *T(,%rI,8)"));
  }
  // [mov %eI,%eI]; ja/jae; cmp $N,%rI or %eI
  KW_ASSIGN_OR_RETURN(x86::X86Insn insn, prev());
  bool zero_extended = false;
  if (insn.insn.mnemonic == ZYDIS_MNEMONIC_MOV && IsReg(insn.operands[0]) &&
      IsReg(insn.operands[1]) && insn.operands[0].reg.value == insn.operands[1].reg.value &&
      ZydisRegisterGetClass(insn.operands[0].reg.value) == ZYDIS_REGCLASS_GPR32 &&
      Reg64(insn.operands[0].reg.value) == index) {
    zero_extended = true;
    KW_ASSIGN_OR_RETURN(insn, prev());
  }
  const bool above = insn.insn.mnemonic == ZYDIS_MNEMONIC_JNBE;
  if (!above && insn.insn.mnemonic != ZYDIS_MNEMONIC_JNB) {
    return mismatch(absl::StrCat("'", insn.Text(), "' is not the bound's ja/jae"));
  }
  KW_ASSIGN_OR_RETURN(const x86::X86Insn cmp, prev());
  if (cmp.insn.mnemonic != ZYDIS_MNEMONIC_CMP || !IsReg(cmp.operands[0]) ||
      Reg64(cmp.operands[0].reg.value) != index ||
      cmp.operands[1].type != ZYDIS_OPERAND_TYPE_IMMEDIATE) {
    return mismatch(absl::StrCat("'", cmp.Text(), "' is not cmp $N on the table's index"));
  }
  if (ZydisRegisterGetClass(cmp.operands[0].reg.value) != ZYDIS_REGCLASS_GPR64 && !zero_extended) {
    return mismatch("the bound checks a 32-bit index that is not zero-extended");
  }
  const int64_t bound = cmp.operands[1].imm.value.s;
  if (bound < 0 || bound > 4096) {
    return mismatch(absl::StrFormat("a bound of %d", bound));
  }
  size_t first = i;
  if (!table) {
    KW_ASSIGN_OR_RETURN(const x86::X86Insn lea, prev());
    const ZydisRegister b = decode(k - 1)->operands[1].reg.value;
    if (lea.insn.mnemonic != ZYDIS_MNEMONIC_LEA || !IsReg64(lea.operands[0]) ||
        lea.operands[0].reg.value != b || !lea.rip_target) {
      return mismatch(absl::StrCat("no lea T(%rip) of the table's base before '", cmp.Text(), "'"));
    }
    table = lea.rip_target;
    first = i;
  }
  // Nothing may enter the sequence after its first instruction.
  const RemoteAddr from = insns[first].addr;
  for (const CodeScan& cs : scans) {
    for (const ScannedInsn& s : cs.scan.insns) {
      if (s.branch_target && *s.branch_target > from && *s.branch_target <= jmp.addr) {
        return mismatch(absl::StrFormat("a branch at 0x%x enters the dispatch at 0x%x",
                                        s.addr.value, s.branch_target->value));
      }
    }
  }
  const auto count = static_cast<size_t>(above ? bound + 1 : bound);
  std::vector<uint8_t> raw(count * entry_size);
  KW_RETURN_IF_ERROR(options.read_image(*table, raw));
  std::vector<RemoteAddr> targets;
  for (size_t e = 0; e < count; ++e) {
    RemoteAddr t;
    if (entry_size == 4) {
      int32_t rel = 0;
      std::memcpy(&rel, raw.data() + e * 4, 4);
      t = *table + static_cast<uint64_t>(static_cast<int64_t>(rel));
    } else {
      std::memcpy(&t.value, raw.data() + e * 8, 8);
    }
    if (!IsBoundary(scans, t)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "entry %d of the jump table at 0x%x leads to 0x%x, not an instruction of %s or the "
          "other code given",
          e, table->value, t.value, fn.name.empty() ? "the function" : fn.name));
    }
    targets.push_back(t);
  }
  return targets;
}

}  // namespace

std::string_view JumpRefusalName(JumpRefusal refusal) {
  switch (refusal) {
    case JumpRefusal::kNone:
      return "none";
    case JumpRefusal::kOutsideFunction:
      return "outside_function";
    case JumpRefusal::kUndecodable:
      return "undecodable";
    case JumpRefusal::kBreakpoint:
      return "breakpoint";
    case JumpRefusal::kNotOnBoundary:
      return "not_on_boundary";
    case JumpRefusal::kTooShort:
      return "too_short";
    case JumpRefusal::kTooLong:
      return "too_long";
    case JumpRefusal::kBranchIntoRange:
      return "branch_into_range";
    case JumpRefusal::kAddressTaken:
      return "address_taken";
    case JumpRefusal::kEntryInside:
      return "entry_inside";
    case JumpRefusal::kProbeInside:
      return "probe_inside";
    case JumpRefusal::kCallInside:
      return "call_inside";
    case JumpRefusal::kFlowEndsInside:
      return "flow_ends_inside";
    case JumpRefusal::kUnrelocatable:
      return "unrelocatable";
    case JumpRefusal::kIndirectJump:
      return "indirect_jump";
    case JumpRefusal::kThreadInside:
      return "thread_inside";
  }
  return "unknown";
}

JumpDecision PlanJumpProbe(const FunctionCode& fn, RemoteAddr probe, const JumpOptions& options) {
  JumpDecision decision;
  const std::string at = Where(fn, probe);
  auto refuse = [&](JumpRefusal why, RemoteAddr culprit, const std::string& text) {
    decision.refusal = why;
    decision.culprit = culprit;
    decision.reason = absl::StrCat("no jump at ", at, ": ", text);
    return decision;
  };
  const std::string fname =
      fn.name.empty() ? absl::StrFormat("the function at 0x%x", fn.start.value) : fn.name;
  if (probe < fn.start || probe - fn.start >= fn.bytes.size()) {
    return refuse(JumpRefusal::kOutsideFunction, probe,
                  absl::StrFormat("the address is outside %s (%d bytes at 0x%x)", fname,
                                  fn.bytes.size(), fn.start.value));
  }
  const std::vector<CodeScan> scans = ScanAll(fn, options);
  const Scan& scan = scans[0].scan;
  if (scan.bad_offset) {
    const RemoteAddr bad = fn.start + *scan.bad_offset;
    return refuse(JumpRefusal::kUndecodable, bad,
                  absl::StrFormat("%s does not decode at %s (data in the code?), so its jumps "
                                  "cannot be checked",
                                  fname, Where(fn, bad)));
  }
  for (const ScannedInsn& s : scan.insns) {
    if (s.int3) {
      return refuse(JumpRefusal::kBreakpoint, s.addr,
                    absl::StrFormat("an int3 at %s (a debugger's breakpoint or the program's "
                                    "own) hides the instruction under it, so the jumps of %s "
                                    "cannot be checked",
                                    Where(fn, s.addr), fname));
    }
  }
  // The probed instruction and the range of whole instructions covering 5 bytes.
  const auto first = std::find_if(scan.insns.begin(), scan.insns.end(), [&](const ScannedInsn& s) {
    return s.addr.value + s.length > probe.value;
  });
  if (first->addr != probe) {
    return refuse(JumpRefusal::kNotOnBoundary, first->addr,
                  absl::StrFormat("the address is inside '%s' at %s", TextAt(fn, first->addr),
                                  Where(fn, first->addr)));
  }
  uint32_t len = 0;
  auto last = first;
  for (auto it = first; len < kJumpPatchBytes; ++it) {
    if (it == scan.insns.end()) {
      return refuse(JumpRefusal::kTooShort, probe,
                    absl::StrFormat("only %d bytes of whole instructions from there to the end "
                                    "of %s; a jmp rel32 needs %d",
                                    len, fname, kJumpPatchBytes));
    }
    len += it->length;
    last = it;
  }
  const RemoteAddr end = probe + len;
  if (len > kMaxDisplacedBytes) {
    return refuse(JumpRefusal::kTooLong, last->addr,
                  absl::StrFormat("the whole instructions covering %d bytes take %d (up to '%s' "
                                  "at %s), more than the %d a patch holds",
                                  kJumpPatchBytes, len, TextAt(fn, last->addr),
                                  Where(fn, last->addr), kMaxDisplacedBytes));
  }
  const std::string range = absl::StrFormat("the %d bytes the jump overwrites (%s..0x%x)", len,
                                            Where(fn, probe), end.value);
  auto inside = [&](RemoteAddr a) { return a > probe && a < end; };

  // Anything that reaches a byte after the first: branches and code addresses in all the code
  // given, then the entries and probes the caller knows of.
  std::optional<JumpDecision> address_taken;
  for (const CodeScan& cs : scans) {
    const FunctionCode* code = cs.code;
    if (code != &fn && cs.scan.bad_offset) {
      const RemoteAddr bad = code->start + *cs.scan.bad_offset;
      return refuse(JumpRefusal::kUndecodable, bad,
                    absl::StrFormat("%s does not decode at %s (data in the code?), so its jumps "
                                    "into %s cannot be checked",
                                    code->name.empty() ? "other code" : code->name,
                                    Where(*code, bad), fname));
    }
    for (const ScannedInsn& s : cs.scan.insns) {
      if (s.branch_target && inside(*s.branch_target)) {
        return refuse(JumpRefusal::kBranchIntoRange, s.addr,
                      absl::StrFormat("'%s' at %s jumps to %s, inside %s", TextAt(*code, s.addr),
                                      Where(*code, s.addr), Where(fn, *s.branch_target), range));
      }
      if (s.rip_target && inside(*s.rip_target) && !address_taken) {
        address_taken = refuse(
            JumpRefusal::kAddressTaken, s.addr,
            absl::StrFormat("'%s' at %s takes the address %s, inside %s (a computed goto or a "
                            "code pointer may jump there)",
                            TextAt(*code, s.addr), Where(*code, s.addr), Where(fn, *s.rip_target),
                            range));
      }
    }
  }
  if (address_taken) {
    return *address_taken;
  }
  for (const RemoteAddr entry : options.entries) {
    if (inside(entry)) {
      return refuse(JumpRefusal::kEntryInside, entry,
                    absl::StrFormat("%s is entered from elsewhere (an exception landing pad or "
                                    "another known entry) and lies inside %s",
                                    Where(fn, entry), range));
    }
  }
  for (const RemoteAddr other : options.other_probes) {
    if (inside(other)) {
      return refuse(JumpRefusal::kProbeInside, other,
                    absl::StrFormat("another probe at %s lies inside %s", Where(fn, other), range));
    }
  }
  // The range itself: control enters at its first byte only and leaves at its end (or by its
  // last instruction).
  for (auto it = first; it != last; ++it) {
    if (it->flow == x86::InsnFlow::kCall || it->flow == x86::InsnFlow::kIndirectCall) {
      return refuse(JumpRefusal::kCallInside, it->addr,
                    absl::StrFormat("'%s' at %s returns to %s, inside %s: a thread in the "
                                    "callee would come back into the patched bytes",
                                    TextAt(fn, it->addr), Where(fn, it->addr),
                                    Where(fn, it->addr + it->length), range));
    }
    if (it->flow == x86::InsnFlow::kJump || it->flow == x86::InsnFlow::kReturn ||
        it->flow == x86::InsnFlow::kIndirectJump || it->flow == x86::InsnFlow::kStop) {
      return refuse(JumpRefusal::kFlowEndsInside, it->addr,
                    absl::StrFormat("'%s' at %s does not fall through, so the code after it "
                                    "inside %s is reached from elsewhere (a jump table, a landing "
                                    "pad) that kwatch may not see",
                                    TextAt(fn, it->addr), Where(fn, it->addr), range));
    }
  }
  const std::span<const uint8_t> displaced = fn.bytes.subspan(probe - fn.start, len);
  auto relocated = x86::Relocate(displaced, probe, probe, options.call_mode);
  if (!relocated.ok()) {
    return refuse(JumpRefusal::kUnrelocatable, probe, absl::StrCat(relocated.status().message()));
  }
  // Indirect jumps, in all the code given: where a proven jump table leads, else refused.
  for (size_t r = 0; r < scans.size(); ++r) {
    const FunctionCode& code = *scans[r].code;
    const std::vector<ScannedInsn>& insns = scans[r].scan.insns;
    for (size_t k = 0; k < insns.size(); ++k) {
      const ScannedInsn& s = insns[k];
      if (s.flow != x86::InsnFlow::kIndirectJump) {
        continue;
      }
      absl::StatusOr<std::vector<RemoteAddr>> targets =
          options.read_image
              ? ProveTable(scans, r, k, options)
              : absl::FailedPreconditionError("kwatch was given no image to read its table from");
      if (!targets.ok()) {
        return refuse(JumpRefusal::kIndirectJump, s.addr,
                      absl::StrFormat("%s has an indirect jump, '%s' at %s, and a jump table or "
                                      "a computed goto may land inside %s: %s",
                                      code.name.empty() ? fname : code.name, TextAt(code, s.addr),
                                      Where(code, s.addr), range, targets.status().message()));
      }
      for (size_t e = 0; e < targets->size(); ++e) {
        if (inside((*targets)[e])) {
          return refuse(JumpRefusal::kBranchIntoRange, s.addr,
                        absl::StrFormat("'%s' at %s jumps to %s (entry %d of its jump table), "
                                        "inside %s",
                                        TextAt(code, s.addr), Where(code, s.addr),
                                        Where(fn, (*targets)[e]), e, range));
        }
      }
    }
  }
  JumpPlan plan;
  plan.addr = probe;
  plan.len = len;
  plan.original.assign(displaced.begin(), displaced.end());
  for (const x86::RelocatedInsn& ri : relocated->insns) {
    plan.insn_text.push_back(ri.text);
  }
  plan.call_mode = options.call_mode;
  plan.function = fn.name;
  plan.function_start = fn.start;
  decision.plan = std::move(plan);
  return decision;
}

absl::StatusOr<std::vector<RemoteAddr>> ProveJumpTable(const FunctionCode& fn, RemoteAddr jmp,
                                                       const JumpOptions& options) {
  if (!options.read_image) {
    return absl::FailedPreconditionError("no image to read the table from");
  }
  const std::vector<CodeScan> scans = ScanAll(fn, options);
  const auto& insns = scans[0].scan.insns;
  const auto it =
      std::find_if(insns.begin(), insns.end(), [&](const ScannedInsn& s) { return s.addr == jmp; });
  if (it == insns.end() || it->flow != x86::InsnFlow::kIndirectJump) {
    return absl::InvalidArgumentError(
        absl::StrFormat("0x%x is not an indirect jmp of %s", jmp.value, fn.name));
  }
  return ProveTable(scans, 0, static_cast<size_t>(it - insns.begin()), options);
}

absl::Status CheckThreadsOutside(const JumpPlan& plan, std::span<const ThreadRip> threads) {
  for (const ThreadRip& t : threads) {
    if (t.rip > plan.addr && t.rip < plan.addr + plan.len) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no jump at 0x%x: thread %d is stopped at 0x%x, inside the %d bytes the jump would "
          "overwrite (it would resume in the middle of the jmp)",
          plan.addr.value, t.tid, t.rip.value, plan.len));
    }
  }
  return absl::OkStatus();
}

}  // namespace kwatch::core::probe
