#pragma once

// How the agent goes on after an INT3 probe's hit (KwProbe's resume fields), decided by kwatch
// from the probed instruction (core/probe/insn_fixup): relative jumps, conditional branches
// (Jcc, jrcxz, loop*), calls, returns and indirect calls/jumps are emulated by the agent on the
// signal's registers; every other instruction runs out of line, from a copy kwatch places near
// it (BuildOutOfLineCopy with a jump back) through Controller::PlaceCode.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/probe/insn_fixup.h"
#include "watch/agent/tables.h"

namespace kwatch::core::ptrace {
class Process;
}  // namespace kwatch::core::ptrace

namespace kwatch::core {}

namespace kwatch::watch::agent {

class Controller;

// Fills the resume fields of `entry` (resume, insn_len, target, cond, ret_imm, ind_*) for an
// emulated instruction; for one that runs out of line, sets resume = kKwResumeXol and leaves
// xol_addr to the caller. FailedPrecondition when the instruction can neither be emulated by
// the agent nor run out of line (with insn.text).
absl::Status PlanResume(const core::probe::ProbedInsn& insn, ProbeEntry& entry);

// PlanResume, then for kKwResumeXol the copy placed near the instruction (every thread of
// `proc` stopped) and entry.xol_addr set to it.
absl::Status PlanInt3(Controller& controller, core::ptrace::Process& proc,
                      const core::probe::ProbedInsn& insn, ProbeEntry& entry);

}  // namespace kwatch::watch::agent
