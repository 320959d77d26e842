#include "watch/kernel/kernel_setup.h"

#include <span>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/kernel/btf_types.h"
#include "watch/kernel/capability.h"
#include "watch/kernel/kernel_expr.h"
#include "watch/kernel/kernel_registers.h"
#include "watch/perf_util.h"

namespace kwatch::watch::kernel {

namespace {

// ", callchains of up to N frames (--stack)" for the armed line, or "".
std::string StackNote(const KernelSetupOptions& opts) {
  return opts.callchain_frames > 0
             ? absl::StrFormat(", callchains of up to %d frames (--stack)", opts.callchain_frames)
             : std::string();
}

// Loads the kernel's line tables when a vmlinux with DWARF is at hand (--vmlinux, or perf's
// places), so that kernel code shows as func+off (file:line); says so when --vmlinux was
// given and cannot serve, and when --stack would show function+offset only.
void LoadKernelLines(const KernelSetupOptions& opts, core::kernel::KernelSymbolResolver& symbols,
                     const SetupSay& say) {
  const absl::Status st = symbols.LoadLines();
  if (st.ok()) {
    say(absl::StrCat("kernel source lines from ", symbols.lines_file()));
  } else if (!opts.vmlinux.empty() || opts.callchain_frames > 0) {
    say(absl::StrCat("note: ", st.message()));
  }
}

// Resolves a kernel watch's expression and says what it found: the notes on its length and
// section, then "jiffies: 8 bytes at 0x..., from System.map FILE (KASLR slide ...)".
absl::StatusOr<KernelWatch> ResolveAndSay(const std::string& text, const KernelSetupOptions& opts,
                                          core::kernel::KernelSymbolResolver& symbols,
                                          const core::kernel::KernelBtf* btf, const SetupSay& say) {
  KernelExprOptions eo;
  eo.len = opts.len;
  eo.type = opts.type;
  eo.via = opts.via;
  eo.exec = opts.kind == drmgr::DrKind::kExec;
  KW_ASSIGN_OR_RETURN(ResolvedKernelExpr r, ResolveKernelExpr(text, eo, symbols, btf));
  KernelWatch& w = r.watch;
  if (r.length_guessed) {
    say(absl::StrFormat(
        "note: no type for '%s' (System.map and kallsyms carry none, and the kernel's BTF "
        "describes only per-CPU variables): watching %u bytes; give --len N or --type TYPE",
        w.display, w.len));
  }
  if (r.read_only_section && opts.kind == drmgr::DrKind::kWrite) {
    say(absl::StrFormat(
        "warning: '%s' is in a read-only kernel section (type '%c' in %s): nothing writes "
        "there, so --write will see no event",
        r.symbol, r.symbol_type, w.source));
  }
  std::string slide;
  if (w.slide != 0 || absl::StartsWith(w.source, "System.map") ||
      absl::StartsWith(w.source, "vmlinux")) {
    slide = absl::StrFormat(
        " (KASLR slide %s0x%x)", w.slide < 0 ? "-" : "+",
        w.slide < 0 ? -static_cast<uint64_t>(w.slide) : static_cast<uint64_t>(w.slide));
  }
  say(absl::StrFormat("%s: %u byte%s at 0x%x%s%s, from %s%s", w.display, w.len,
                      w.len == 1 ? "" : "s", w.addr, w.type_name.empty() ? "" : ", ", w.type_name,
                      w.source, slide));
  return std::move(w);
}

// The drain-time values of `watches` (kcore), with the notes that say where they come from
// or why there are none.
absl::StatusOr<std::unique_ptr<DrainValues>> OpenValues(const KernelSetupOptions& opts,
                                                        const std::vector<KernelWatch>& watches,
                                                        const SetupSay& say) {
  auto opened = OpenDrainValues(opts.kcore, opts.values_needed, watches);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("--kcore ", opts.kcore, ": ", opened.status().message()));
  }
  if (!opened->why_none.ok()) {
    say(absl::StrCat("note: kernel events show no value: ", opened->why_none.message()));
  } else if (!opened->source.empty()) {
    say(absl::StrCat("values from ", opened->source,
                     ", read when kwatch drains the events (~V), not at the access"));
  }
  for (const auto& [i, why] : opened->unreadable) {
    say(ValueUnreadableNote(i, watches[i], why));
  }
  return std::move(opened->values);
}

}  // namespace

std::string ValueUnreadableNote(size_t i, const KernelWatch& w, const absl::Status& why) {
  return absl::StrFormat("note: watch #%d %s shows no value: %s", i + 1, w.display, why.message());
}

absl::StatusOr<KernelSetup> SetUpKernelWatches(const KernelSetupOptions& opts,
                                               const SetupSay& say) {
  if (!HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "watching the kernel needs root, or CAP_PERFMON (Linux >= 5.8) or CAP_SYS_ADMIN (also "
        "CAP_SYSLOG to read kernel addresses in /proc/kallsyms): run it with sudo, or `sudo "
        "setcap cap_perfmon,cap_syslog+ep $(command -v kwatch)`");
  }
  KernelSetup s;
  s.kind = opts.kind;
  core::kernel::KernelSymbolSources src;
  src.system_map = opts.system_map;
  src.vmlinux = opts.vmlinux;
  KW_ASSIGN_OR_RETURN(s.symbols, core::kernel::KernelSymbolResolver::Create(src));
  std::unique_ptr<core::kernel::KernelBtf> btf;
  if (auto b = core::kernel::KernelBtf::Load(); b.ok()) {
    btf = *std::move(b);
  } else if (!opts.type.empty()) {
    return b.status();
  }
  const std::vector<int> cpus = OnlineCpus();
  for (const std::string& e : opts.exprs) {
    KW_ASSIGN_OR_RETURN(KernelWatch w, ResolveAndSay(e, opts, *s.symbols, btf.get(), say));
    s.watches.push_back(std::move(w));
  }
  // drmgr decides who holds which register of each CPU; its slots are opened as CPU-wide
  // breakpoints (kernel_slots.h).
  KW_ASSIGN_OR_RETURN(s.slots, ArmKernelWatches(opts.kind, opts.callchain_frames, s.watches, cpus));
  KW_ASSIGN_OR_RETURN(s.values, OpenValues(opts, s.watches, say));
  LoadKernelLines(opts, *s.symbols, say);
  s.armed = absl::StrFormat(
      "armed %d kernel watch%s on %d CPUs (one breakpoint per CPU), perf breakpoint stream "
      "mode%s",
      s.watches.size(), s.watches.size() == 1 ? "" : "es", cpus.size(), StackNote(opts));
  return s;
}

absl::StatusOr<KernelSetup> SetUpKernelAccesses(const KernelSetupOptions& opts,
                                                const SetupSay& say) {
  if (!HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "--kernel-accesses watches kernel code: it needs root, or CAP_PERFMON (Linux >= 5.8) "
        "or CAP_SYS_ADMIN (also CAP_SYSLOG to read kernel addresses in /proc/kallsyms)");
  }
  KernelSetup s;
  s.kind = opts.kind;
  KW_ASSIGN_OR_RETURN(s.symbols, core::kernel::KernelSymbolResolver::Create({}));
  KW_ASSIGN_OR_RETURN(s.proc, core::ptrace::Process::Start(opts.pid, opts.command, opts.launch));
  absl::Cleanup abandon = [&s] { s.proc->Abandon(); };
  KW_ASSIGN_OR_RETURN(s.user_syms, core::symbols::Symbols::ForProcess(s.proc->pid()));
  core::ptrace::Process& proc = *s.proc;
  const core::symbols::MemoryReader reader =
      [&proc](core::RemoteAddr addr, std::span<uint8_t> out) { return proc.ReadMemory(addr, out); };
  for (const std::string& text : opts.exprs) {
    KW_ASSIGN_OR_RETURN(KernelWatch w, ResolveProcessExpr(text, opts.len, *s.user_syms, reader));
    s.watches.push_back(std::move(w));
  }
  KW_RETURN_IF_ERROR(proc.StopAll());
  // drmgr decides which registers of the process's threads the watches hold (process scope,
  // as process sessions ask it); each slot is opened on every thread, inherited by new ones.
  KW_ASSIGN_OR_RETURN(s.slots,
                      ArmKernelAccesses(opts.kind, opts.callchain_frames, s.watches, proc));
  // The process stays stopped: the session resumes it once its breakpoints' programs (values
  // at the access) are attached, so that its first accesses have their values.
  LoadKernelLines(opts, *s.symbols, say);
  s.armed = absl::StrFormat(
      "armed %d watch%s on pid %d (%s) for the kernel's accesses only (exclude_user), perf "
      "breakpoint stream mode%s",
      s.watches.size(), s.watches.size() == 1 ? "" : "es", proc.pid(),
      proc.argv().empty() ? "?" : proc.argv()[0], StackNote(opts));
  std::move(abandon).Cancel();
  return s;
}

}  // namespace kwatch::watch::kernel
