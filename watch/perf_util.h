#pragma once

#include <sys/user.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "drmgr/debug_regs.h"

namespace kwatch::watch {

// perf_event_attr.bp_type (HW_BREAKPOINT_X, _W, _RW) of a debug-register kind.
uint32_t PerfBpType(drmgr::DrKind kind);

// Advice for ENODEV/ENOENT/EOPNOTSUPP from perf_event_open of a breakpoint.
std::string NoBreakpointSupportAdvice();

// The first KiB of a small /proc or /sys file, without surrounding whitespace; empty when
// it cannot be read.
std::string ReadSmallFile(const char* path);

// The current kernel.perf_event_paranoid, or "unknown".
std::string ParanoidLevel();

// Advice for EACCES/EPERM from perf_event_open: which capability or sysctl would help.
std::string PerfPermissionAdvice();

// CPUs online now, from /sys/devices/system/cpu/online ("0-3,5"); falls back to
// 0..nprocs-1.
std::vector<int> OnlineCpus();

// perf_event_attr.sample_regs_user masks (asm/perf_regs.h, x86-64; the kernel refuses DS, ES,
// FS and GS for 64-bit tasks):
// every register kwatch samples: the 16 general registers, IP, FLAGS, CS and SS;
uint64_t PerfUserRegsMaskAll();
// the 16 general registers and IP: what an access's address and value need (136 bytes).
uint64_t PerfUserRegsMaskGeneral();

// Loads the registers of a PERF_SAMPLE_REGS_USER block sampled with `mask` (u64 each in
// ascending perf_regs bit order, after the abi word) into `regs`; registers outside the mask
// are left alone. False when `raw` is shorter than the mask says (regs then unchanged).
bool LoadPerfUserRegs(std::span<const uint8_t> raw, uint64_t mask, user_regs_struct& regs);

}  // namespace kwatch::watch
