#pragma once

// Fetch programs of the in-process agent (docs/agent.md "Fetch programs", agent/abi.h):
// core::CompiledArg compiled into the KwFetchOps the agent runs at each hit, and the payload
// of a record they wrote formatted back into the text core::Evaluate gives for the same
// registers and memory. Pure functions: no process, no libdw.
//
// A program is, per argument that captures anything, kKwOpBeginArg then its ops; the record
// holds one KwArgHeader and the bytes (padded to 8) per such argument, in program order.
// Arguments compile in one of three ways (docs/agent.md "Fetch programs" has the table):
//  1. The place is computed by the program (kBytes, kString, kConstant, kComm): registers
//     (user_regs_struct offset / 8 is the KwReg; 32-bit names zero-extended), addresses of the
//     file (+ load bias), dereferences (of memory: kKwOpDeref; of a value: none), offsets in
//     memory (kKwOpAdd; within a value's bytes: left to the formatter), the final read
//     (kKwOpRead; :string kKwOpReadStr of kMaxFetchString + 1 bytes), and DWARF locations
//     made of one register plus constants and dereferences: DW_OP_regN/regx (%xmm0-15:
//     kKwOpXmm), DW_OP_bregN/bregx, DW_OP_addr, DW_OP_litN/constN, DW_OP_plus_uconst,
//     DW_OP_plus/minus of a constant, DW_OP_deref(_size), DW_OP_nop, DW_OP_stack_value,
//     DW_OP_implicit_value. Locations arrive self-contained (CompileLocation picked the
//     location-list entry for the pc and expanded DW_OP_fbreg and DW_OP_call_frame_cfa with
//     the CFI's CFA rule there). Constant values capture nothing; $comm captures nothing
//     (the formatter reads /proc/TID/comm); $retval is rax of a return record.
//  2. A DWARF value made of several such parts (kExpression): two registers added, pieces
//     (structs in registers), gcc's sign extension of a loaded int (DW_OP_deref_size 4;
//     DW_OP_const1u 32; DW_OP_shl; DW_OP_const1u 32; DW_OP_shra): the program captures each
//     part, the formatter evaluates the rest of the expression with core::Evaluate.
//  3. The fallback (kFallback), with a reason: memory at an address the expression computes
//     from several parts, a computed value dereferenced, a pointer in %xmm, an offset inside
//     a register before a dereference. The argument captures KwRegs (kKwOpRegsAll), the %xmm
//     registers the location names and a stack slice from rsp (kKwOpStack), and the formatter
//     runs core::EvaluateSampled over them as the uprobe backend does (memory outside the
//     slice shows kNotSampled).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/abi.h"
#include "core/probe/fetch.h"

namespace kwatch::core::probe {

// How one argument's value comes back from a record.
struct AgentArgPlan {
  enum class Kind : uint8_t {
    // The record holds the bytes of the argument's place after steps [0, first_step): a
    // register's 8 or 4 bytes, an %xmm register's 16, a value's 8, or the final read's bytes
    // (then first_step == steps.size()). The formatter applies the remaining steps (offsets
    // within the bytes) and the final read.
    kBytes,
    // The record holds a string read by kKwOpReadStr (its header says fault), or the
    // thread's name at the hit ($comm, kKwOpComm).
    kString,
    // Known when compiling: `constant` holds the place's bytes after steps [0, first_step).
    // Nothing in the record.
    kConstant,
    // A value the DWARF expression computes from several parts: the record holds the parts
    // the agent can compute (a register plus constants and dereferences, a register's bytes,
    // a piece of memory), and the formatter evaluates `location` (the expression with each
    // part replaced by its captured value) with core::Evaluate.
    kExpression,
    // The record holds KwRegs, then 16 bytes per register of `xmm`, then up to stack_bytes of
    // the stack from rsp: core::Evaluate runs over them when formatting.
    kFallback,
  };
  Kind kind = Kind::kBytes;
  size_t first_step = 0;          // kBytes, kConstant
  std::vector<uint8_t> constant;  // kConstant
  // kExpression: the expression to evaluate, and the index in it of each captured part in
  // record order: a DW_OP_const8u (8 bytes, the part's value) or a DW_OP_implicit_value
  // (`number` bytes: a register's or a piece of memory), whose operand the formatter fills.
  std::vector<DwarfOp> location;
  std::vector<size_t> captured;
  std::vector<int> xmm;      // kFallback: %xmm indexes captured, in record order
  uint32_t stack_bytes = 0;  // kFallback: most stack bytes captured
  std::string reason;        // kFallback: why the program cannot compute the value

  bool captures() const { return kind != Kind::kConstant; }
};

struct AgentFetchOptions {
  // Fallback arguments: bytes of stack captured from rsp (the uprobe backend's --stack-bytes
  // default). Rounded up to 8; at most 65536.
  uint32_t stack_bytes = 512;
  // --stack: after the arguments, the registers and this many bytes of stack from rsp, for
  // kwatch to unwind the hit's stack from (0: none). Rounded up to 8; at most 65536.
  uint32_t stack_copy_bytes = 0;
};

// One probe's program.
struct AgentFetchProgram {
  std::vector<agent::KwFetchOp> ops;  // ends with kKwOpEnd
  std::vector<AgentArgPlan> args;     // one per CompiledArg, in order
  // Upper bound of the payload a hit writes (KwProbe::record_bytes): every captured
  // argument's KwArgHeader and bytes, padded to 8.
  uint32_t record_bytes = 0;
  bool needs_fpregs = false;  // reads %xmm registers (KwProbe flag kKwProbeFpregs)
  uint32_t fallbacks = 0;     // arguments captured as the fallback
  bool stack_copy = false;    // the payload ends with registers and stack (stack_copy_bytes)
};

// Compiles `args` (of one probe point) for a target where the file's load bias is
// `load_bias`. InvalidArgument for more than 65535 arguments or a stack slice over 65536.
absl::StatusOr<AgentFetchProgram> CompileAgentFetch(std::span<const CompiledArg> args,
                                                    uint64_t load_bias,
                                                    const AgentFetchOptions& opts = {});

// A filter program's value of `arg` (agent/abi.h "Filter programs"): the ops that leave its
// bytes in the accumulator, then the kKwFilterPushAcc that pushes it as kwatch shows it (the
// number FormatFetchScalar prints). Nullopt, with `why`, when the agent cannot compute the
// value whole: strings, floats, $comm, a value kwatch finishes itself (a DWARF expression of
// several parts, the fallback), bytes within a register's value, %xmm, a constant, $retval
// outside a return (`at_return`).
std::optional<std::vector<agent::KwFetchOp>> AgentFilterValue(const CompiledArg& arg,
                                                              uint64_t load_bias, bool at_return,
                                                              std::string* why);

// The program of a per-call watch's lookup (agent/abi.h "Per-call watches"): argument 0 holds
// the address of `place` (a CompiledObject's: its base and steps, no final read), 8 bytes.
// Nullopt, with `why`, when the agent cannot compute it: the variable is in a register (it has
// no address), or its location is a value of several parts.
std::optional<std::vector<agent::KwFetchOp>> AgentObjectAddress(const CompiledArg& place,
                                                                uint64_t load_bias,
                                                                std::string* why);

// What a record was taken at.
struct AgentRecordContext {
  uint64_t load_bias = 0;  // the one the program was compiled with
  bool at_return = false;  // a kKwRecordReturn record ($retval)
  pid_t tid = 0;           // the thread ($comm)
};

// A record's arguments.
struct AgentArgValues {
  // name -> value, one per CompiledArg, as EvaluateAll shows them (core::ProbeArgs of
  // core/store/args_json.h, which core/probe does not include).
  std::vector<std::pair<std::string, std::string>> args;
  // Fallback values that needed memory outside the captured stack (shown as kNotSampled).
  uint32_t not_sampled = 0;
  // AgentFetchOptions::stack_copy_bytes: the registers at the hit and the stack copied from
  // their rsp (fewer bytes where the stack's mapping ended). Nullopt without, or when the
  // record was cut before them.
  std::optional<user_regs_struct> stack_regs;
  std::vector<uint8_t> stack;
};

// Formats the payload of a record written by `program` (compiled from `args`). An argument
// the payload lacks (a record cut short) shows "<error: not in the record>". DataLoss for a
// payload that does not follow the program (headers out of order, lengths beyond the
// payload or beyond what the op writes).
absl::StatusOr<AgentArgValues> FormatAgentRecord(std::span<const CompiledArg> args,
                                                 const AgentFetchProgram& program,
                                                 std::span<const uint8_t> payload,
                                                 const AgentRecordContext& ctx);

}  // namespace kwatch::core::probe
