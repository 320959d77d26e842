#pragma once

// The agent's own fetch interpreter (agent/fetch.cc, compiled into the test binary) run in the
// test's process over registers, %xmm registers and a memory callback: the safe reads of
// agent/safe.S are replaced by reads through the callback (agent_interpreter.cc), so a
// program runs exactly as libkwatch-agent.so runs it at a hit, against memory the test makes
// up or a stopped target's. Tests compare what core::FormatAgentRecord makes of the payload
// with core::Evaluate over the same registers and memory.

#include <sys/types.h>
#include <sys/user.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "agent/abi.h"
#include "agent/agent.h"

namespace kwatch::testing {

// Reads `out.size()` bytes at `addr` as the thread could: false when any byte is unreadable.
// Called with ranges that do not cross a page boundary, or that may be refused whole.
using FetchMemory = std::function<bool(uint64_t addr, std::span<uint8_t> out)>;

class AgentInterpreter {
 public:
  // `fpregs` null: the %xmm registers read as zeros.
  AgentInterpreter(const user_regs_struct& regs, const user_fpregs_struct* fpregs,
                   FetchMemory memory);

  // The payload the agent writes for `ops` (ending with kKwOpEnd) into a record of at most
  // `limit` bytes (KwProbe::record_bytes).
  std::vector<uint8_t> Run(std::span<const agent::KwFetchOp> ops, uint32_t limit);

  // The agent's verdict on a filter program (agent/abi.h "Filter programs", agent/filter.cc)
  // at a hit of thread `tid` of process `pid`.
  enum class Verdict { kTaken, kRejected, kNoValue, kDivisionByZero };
  Verdict RunFilter(std::span<const agent::KwFetchOp> ops, int32_t tid, int32_t pid);
  // The agent's aggregations of `probe` (KwProbe::agg in `s`'s area, agent/aggregate.cc)
  // updated for a hit of thread `tid` of process `pid`.
  void RunAggregates(const agent::Session& s, const agent::KwProbe& probe, int32_t tid,
                     int32_t pid);

  // The KwRecord flags of the last Run (1: a fault, 2: cut at the record's end).
  uint16_t flags() const { return flags_; }

  // $comm (kKwOpComm) reads the name of the thread running the program: Run gives the test's
  // thread the name of the thread at the hit, /proc/TID/comm of `tid`, for its duration.
  void RunAsThread(pid_t tid) { tid_ = tid; }

 private:
  agent::KwRegs regs_{};
  std::vector<uint8_t> xmm_;  // 16 registers of 16 bytes
  FetchMemory memory_;
  uint16_t flags_ = 0;
  pid_t tid_ = 0;
};

}  // namespace kwatch::testing
