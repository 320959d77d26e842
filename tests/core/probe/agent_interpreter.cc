#include "tests/core/probe/agent_interpreter.h"

#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"

namespace kwatch::testing {
namespace {

// The memory of the Run in progress (the agent's safe routines are free functions).
thread_local const FetchMemory* t_memory = nullptr;

constexpr uint64_t kPage = 4096;

bool ReadAt(uint64_t addr, void* dst, size_t n) {
  return t_memory != nullptr &&
         (*t_memory)(addr, std::span<uint8_t>(static_cast<uint8_t*>(dst), n));
}

bool ReadAt(const void* src, void* dst, size_t n) {
  return ReadAt(reinterpret_cast<uint64_t>(src), dst, n);
}

}  // namespace

AgentInterpreter::AgentInterpreter(const user_regs_struct& regs, const user_fpregs_struct* fpregs,
                                   FetchMemory memory)
    : xmm_(256, 0), memory_(std::move(memory)) {
  static_assert(sizeof(regs_) == sizeof(regs));
  std::memcpy(&regs_, &regs, sizeof(regs_));
  if (fpregs != nullptr) {
    std::memcpy(xmm_.data(), fpregs->xmm_space, xmm_.size());
  }
}

std::vector<uint8_t> AgentInterpreter::Run(std::span<const agent::KwFetchOp> ops, uint32_t limit) {
  std::vector<agent::KwFetchOp> code(ops.begin(), ops.end());
  agent::Session s;
  s.code = code.data();
  s.code_capacity = static_cast<uint32_t>(code.size());
  agent::KwProbe probe{};
  probe.fetch_offset = 0;
  probe.fetch_len = static_cast<uint32_t>(code.size());
  const uint32_t bound = (limit + 7U) & ~7U;  // as the agent's hit path rounds it
  std::vector<uint8_t> out(bound);
  flags_ = 0;
  std::array<char, 16> own{};
  std::string name;
  if (tid_ > 0) {
    std::ifstream comm(absl::StrCat("/proc/", tid_, "/comm"));
    std::getline(comm, name);
    ::prctl(PR_GET_NAME, own.data());
    ::prctl(PR_SET_NAME, name.c_str());
  }
  t_memory = &memory_;
  const uint32_t used = agent::RunFetch(s, probe, regs_, xmm_.data(), out.data(), bound, &flags_);
  t_memory = nullptr;
  if (tid_ > 0) {
    ::prctl(PR_SET_NAME, own.data());
  }
  out.resize(used);
  return out;
}

AgentInterpreter::Verdict AgentInterpreter::RunFilter(std::span<const agent::KwFetchOp> ops,
                                                      int32_t tid, int32_t pid) {
  std::vector<agent::KwFetchOp> code(ops.begin(), ops.end());
  agent::Session s;
  s.code = code.data();
  s.code_capacity = static_cast<uint32_t>(code.size());
  agent::KwProbe probe{};
  probe.filter_offset = 0;
  probe.filter_len = static_cast<uint32_t>(code.size());
  agent::g_pid = pid;
  t_memory = &memory_;
  const bool taken = agent::RunFilter(s, probe, regs_, tid);
  t_memory = nullptr;
  if (taken) {
    return Verdict::kTaken;
  }
  if (probe.filter_no_value.load() > 0) {
    return Verdict::kNoValue;
  }
  return probe.filter_div0.load() > 0 ? Verdict::kDivisionByZero : Verdict::kRejected;
}

void AgentInterpreter::RunAggregates(const agent::Session& s, const agent::KwProbe& probe,
                                     int32_t tid, int32_t pid) {
  agent::g_pid = pid;
  t_memory = &memory_;
  agent::RunAggregates(s, probe, regs_, tid);
  t_memory = nullptr;
}

}  // namespace kwatch::testing

// The agent's process id (agent/init.cc in the library): RunFilter's `pid`.
int kwatch::agent::g_pid = 0;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

// The safe routines of agent/safe.S, as the agent's interpreter sees them, over t_memory.
extern "C" {

long kw_safe_copy(void* dst, const void* src, size_t n) {
  return kwatch::testing::ReadAt(src, dst, n) ? 0 : -1;
}

long kw_safe_read8(const void* src, uint64_t* out) {
  return kwatch::testing::ReadAt(src, out, sizeof(*out)) ? 0 : -1;
}

// A page at a time (readability is per page): the bytes before the first NUL, max when none,
// ~(bytes copied) when a page could not be read.
long kw_safe_strcopy(void* dst, const void* src, size_t max) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto from = reinterpret_cast<uint64_t>(src);
  size_t done = 0;
  while (done < max) {
    const uint64_t at = from + done;
    const size_t chunk =
        std::min<uint64_t>(kwatch::testing::kPage - at % kwatch::testing::kPage, max - done);
    std::vector<uint8_t> buf(chunk);
    if (!kwatch::testing::ReadAt(at, buf.data(), chunk)) {
      return ~static_cast<long>(done);
    }
    const auto nul = std::find(buf.begin(), buf.end(), 0);
    std::copy(buf.begin(), nul, d + done);
    done += static_cast<size_t>(nul - buf.begin());
    if (nul != buf.end()) {
      break;
    }
  }
  return static_cast<long>(done);
}

}  // extern "C"
