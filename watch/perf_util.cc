#include "watch/perf_util.h"

#include <asm/perf_regs.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/hw_breakpoint.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/base/confinement.h"
#include "core/base/unique_fd.h"

namespace kwatch::watch {

uint32_t PerfBpType(drmgr::DrKind kind) {
  switch (kind) {
    case drmgr::DrKind::kExec:
      return HW_BREAKPOINT_X;
    case drmgr::DrKind::kWrite:
      return HW_BREAKPOINT_W;
    case drmgr::DrKind::kReadWrite:
      return HW_BREAKPOINT_RW;
  }
  return HW_BREAKPOINT_EMPTY;
}

std::string NoBreakpointSupportAdvice() {
  return "this kernel has no hardware breakpoint support (CONFIG_HAVE_HW_BREAKPOINT)";
}

namespace {

// Where each sampled register lands in user_regs_struct, in perf_regs bit order.
struct RegSlot {
  int bit;
  unsigned long long user_regs_struct::*field;  // NOLINT(google-runtime-int)
};
constexpr std::array<RegSlot, 20> kRegSlots = {{
    {PERF_REG_X86_AX, &user_regs_struct::rax},  {PERF_REG_X86_BX, &user_regs_struct::rbx},
    {PERF_REG_X86_CX, &user_regs_struct::rcx},  {PERF_REG_X86_DX, &user_regs_struct::rdx},
    {PERF_REG_X86_SI, &user_regs_struct::rsi},  {PERF_REG_X86_DI, &user_regs_struct::rdi},
    {PERF_REG_X86_BP, &user_regs_struct::rbp},  {PERF_REG_X86_SP, &user_regs_struct::rsp},
    {PERF_REG_X86_IP, &user_regs_struct::rip},  {PERF_REG_X86_FLAGS, &user_regs_struct::eflags},
    {PERF_REG_X86_CS, &user_regs_struct::cs},   {PERF_REG_X86_SS, &user_regs_struct::ss},
    {PERF_REG_X86_R8, &user_regs_struct::r8},   {PERF_REG_X86_R9, &user_regs_struct::r9},
    {PERF_REG_X86_R10, &user_regs_struct::r10}, {PERF_REG_X86_R11, &user_regs_struct::r11},
    {PERF_REG_X86_R12, &user_regs_struct::r12}, {PERF_REG_X86_R13, &user_regs_struct::r13},
    {PERF_REG_X86_R14, &user_regs_struct::r14}, {PERF_REG_X86_R15, &user_regs_struct::r15},
}};

constexpr uint64_t Bit(int b) {
  return uint64_t{1} << b;
}

}  // namespace

uint64_t PerfUserRegsMaskAll() {
  uint64_t mask = 0;
  for (const RegSlot& slot : kRegSlots) {
    mask |= Bit(slot.bit);
  }
  return mask;
}

uint64_t PerfUserRegsMaskGeneral() {
  return PerfUserRegsMaskAll() &
         ~(Bit(PERF_REG_X86_FLAGS) | Bit(PERF_REG_X86_CS) | Bit(PERF_REG_X86_SS));
}

bool LoadPerfUserRegs(std::span<const uint8_t> raw, uint64_t mask, user_regs_struct& regs) {
  if (raw.size() < 8 * static_cast<size_t>(std::popcount(mask))) {
    return false;
  }
  const uint8_t* p = raw.data();
  for (const RegSlot& slot : kRegSlots) {  // ascending bit order, as the kernel writes them
    if ((mask & Bit(slot.bit)) != 0) {
      uint64_t v = 0;
      std::memcpy(&v, p, sizeof(v));
      regs.*slot.field = v;
      p += 8;
    }
  }
  return true;
}

std::string ReadSmallFile(const char* path) {
  core::UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return {};
  }
  std::array<char, 1024> buf{};
  const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
  if (n <= 0) {
    return {};
  }
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(buf.data(), static_cast<size_t>(n))));
}

std::string ParanoidLevel() {
  std::string value = ReadSmallFile("/proc/sys/kernel/perf_event_paranoid");
  return value.empty() ? "unknown" : value;
}

std::string PerfPermissionAdvice() {
  std::string advice = absl::StrCat(
      "needs root, or CAP_PERFMON (Linux >= 5.8) / CAP_SYS_ADMIN, or "
      "`sysctl kernel.perf_event_paranoid=1` (now ",
      ParanoidLevel(), ")");
  if (std::string confined = core::ConfinementAdvice(CAP_PERFMON, "PERFMON"); !confined.empty()) {
    absl::StrAppend(&advice, "; ", confined);
  }
  return advice;
}

std::vector<int> OnlineCpus() {
  std::vector<int> cpus;
  const std::string text = ReadSmallFile("/sys/devices/system/cpu/online");
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = 0;
    int hi = 0;
    if (ends.empty() || ends.size() > 2 || !absl::SimpleAtoi(ends.front(), &lo) ||
        !absl::SimpleAtoi(ends.back(), &hi) || lo < 0 || hi < lo) {
      cpus.clear();
      break;
    }
    for (int c = lo; c <= hi; ++c) {
      cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < (n > 0 ? n : 1); ++c) {
      cpus.push_back(static_cast<int>(c));
    }
  }
  return cpus;
}

}  // namespace kwatch::watch
