#include "cli/kernel_watch.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cli/output.h"
#include "cli/report_cmd.h"
#include "core/base/status_macros.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kallsyms.h"
#include "core/kernel/kernel_memory.h"
#include "core/kernel/kernel_symbols.h"
#include "core/ptrace/process.h"
#include "core/store/trace_writer.h"
#include "core/symbols/expr.h"
#include "core/symbols/symbols.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_registry.h"
#include "watch/condition.h"
#include "watch/kernel/drain_values.h"
#include "watch/kernel/kernel_event.h"
#include "watch/kernel/kernel_session.h"
#include "watch/kernel/kernel_slots.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::cli {

namespace {

using Options = WatchOptions;

using watch::kernel::DrainValues;
using watch::kernel::KernelEvent;
using watch::kernel::KernelEventSink;
using watch::kernel::KernelNote;
using watch::kernel::KernelSummary;
using watch::kernel::KernelWatch;
using watch::kernel::KernelWatchSession;
using watch::kernel::SitesByEvents;
using watch::kernel::SiteTally;

void Error(const absl::Status& s) {
  absl::FPrintF(stderr, "kwatch: error: %s\n", s.message());
}

// ---------------------------------------------------------------------------------------------
// Kernel watches: no -p and no command. One CPU-wide breakpoint per online CPU (pid -1).

// Where kernel watches read kernel memory for their values (CONFIG_PROC_KCORE).
constexpr absl::string_view kProcKcore = "/proc/kcore";

// The note that watch `i`'s value cannot be read (said once per watch).
std::string ValueUnreadableText(size_t i, const KernelWatch& w, const absl::Status& why) {
  return absl::StrFormat("kwatch: note: watch #%d %s shows no value: %s\n", i + 1, w.display,
                         why.message());
}

// ", callchains of up to N frames (--stack)" for the armed line of a kernel session, or "".
std::string StackNote(const Options& opts) {
  return opts.stack ? absl::StrFormat(", callchains of up to %d frames (--stack)", opts.stack_depth)
                    : std::string();
}

// Loads the kernel's line tables when a vmlinux with DWARF is at hand (--vmlinux, or perf's
// places), so that kernel code shows as func+off (file:line); says so when --vmlinux was
// given and cannot serve, and when --stack would show function+offset only.
void KernelLinesNote(const Options& opts, core::kernel::KernelSymbolResolver& symbols) {
  const absl::Status st = symbols.LoadLines();
  if (st.ok()) {
    std::fprintf(stderr, "kwatch: kernel source lines from %s\n", symbols.lines_file().c_str());
  } else if (!opts.vmlinux.empty() || opts.stack) {
    absl::FPrintF(stderr, "kwatch: note: %s\n", st.message());
  }
}

// Whether this process may open kernel breakpoint events: root, CAP_PERFMON or CAP_SYS_ADMIN
// (perf_event_open checks perfmon_capable(): CAP_PERFMON since Linux 5.8, else
// CAP_SYS_ADMIN).
bool HasPerfmonCapability() {
  if (geteuid() == 0) {
    return true;
  }
  auto status = core::kernel::ReadWholeFile("/proc/self/status");
  if (!status.ok()) {
    return false;
  }
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (absl::ConsumePrefix(&line, "CapEff:")) {
      uint64_t caps = 0;
      if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &caps)) {
        return false;
      }
      constexpr int kCapSysAdmin = 21;
      constexpr int kCapPerfmon = 38;
      return (caps & (1ULL << kCapSysAdmin)) != 0 || (caps & (1ULL << kCapPerfmon)) != 0;
    }
  }
  return false;
}

// The largest watch length (1, 2, 4, 8) that fits `room` bytes and the alignment of `addr`.
uint32_t LengthWithin(uint64_t addr, std::optional<uint64_t> room) {
  uint32_t len = 8;
  while (len > 1 && ((room.has_value() && *room < len) || addr % len != 0)) {
    len /= 2;
  }
  return len;
}

// Resolves one expression against the kernel: its address through the symbol chain, its
// member path and type through BTF (or --type), its length.
absl::StatusOr<KernelWatch> ResolveKernelExpr(const std::string& text, const Options& opts,
                                              core::kernel::KernelSymbolResolver& symbols,
                                              const core::kernel::KernelBtf* btf) {
  KW_ASSIGN_OR_RETURN(const core::Expr expr, core::ParseExpr(text));
  KernelWatch w;
  w.expr = text;
  if (expr.address.has_value()) {
    if (!expr.steps.empty()) {
      return absl::InvalidArgumentError("a raw kernel address takes no member path");
    }
    w.addr = *expr.address;
    w.display = absl::StrFormat("0x%x", w.addr);
    w.len = static_cast<uint32_t>(opts.len.value_or(expr.length.value_or(8)));
    w.source = "raw address";
    return w;
  }
  KW_ASSIGN_OR_RETURN(const core::kernel::KernelSymbolAddress sym, symbols.Resolve(expr.base));
  if (sym.addr < 0xffff800000000000ULL) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kernel symbol '%s' is at 0x%x in %s, outside the kernel's address space: it is a "
        "per-CPU variable (an offset into each CPU's area), which kwatch cannot watch yet",
        expr.base, sym.addr, sym.source));
  }
  w.addr = sym.addr;
  w.source = sym.source;
  w.slide = sym.slide;
  w.display = expr.base;
  // The symbol's type: --type, else BTF (per-CPU variables only on most kernels).
  std::optional<core::kernel::BtfTypeRef> type;
  if (!opts.kernel_type.empty()) {
    if (btf == nullptr) {
      return absl::FailedPreconditionError(
          "--type needs the kernel's BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)");
    }
    KW_ASSIGN_OR_RETURN(type, btf->FindType(opts.kernel_type));
  } else if (btf != nullptr) {
    type = btf->VarType(expr.base);
  }
  std::optional<uint64_t> type_size;
  if (type.has_value()) {
    KW_ASSIGN_OR_RETURN(const core::kernel::BtfMemberRef m, btf->Walk(*type, expr.steps));
    w.addr += m.offset;
    w.display += m.path;
    w.type_name = m.type_name;
    type_size = m.size;
    if (m.bit_size != 0) {
      w.type_name += absl::StrFormat(" (bitfield :%d)", m.bit_size);
    }
  } else if (sym.from_vmlinux) {
    // The vmlinux's DWARF (libdw) knows every variable's type: resolve the whole expression at
    // link-time addresses, then move it by the slide.
    KW_ASSIGN_OR_RETURN(auto dwarf, core::Symbols::ForFile(sym.file));
    const auto no_memory = [](core::RemoteAddr, std::span<uint8_t>) {
      return absl::InvalidArgumentError(
          "kwatch does not read kernel memory ('->' on a kernel "
          "pointer)");
    };
    auto r = dwarf->Resolve(expr, no_memory);
    if (r.ok()) {
      w.addr = r->addr.value + static_cast<uint64_t>(sym.slide);
      w.display = r->display;
      w.type_name = r->type_name;
      type_size = r->length;
    } else if (!expr.steps.empty()) {
      return r.status();
    }
  }
  if (!type_size.has_value() && !expr.steps.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no type for kernel symbol '%s': the kernel's BTF describes only per-CPU variables, "
        "and System.map and kallsyms carry no types; name its type with --type, e.g. "
        "`kwatch --rw '%s' --type 'struct task_struct'`",
        expr.base, text));
  }
  if (opts.exec) {
    w.len = 1;  // one instruction start (perf wants sizeof(long) on x86: PerfBreakpoint says so)
  } else if (opts.len.has_value()) {
    w.len = static_cast<uint32_t>(*opts.len);
  } else if (type_size.has_value()) {
    if (*type_size != 1 && *type_size != 2 && *type_size != 4 && *type_size != 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is a %s of %d bytes: one debug register watches 1, 2, 4 or 8 aligned bytes; "
          "watch a member, or give --len",
          w.display, w.type_name, *type_size));
    }
    w.len = static_cast<uint32_t>(*type_size);
  } else if (sym.type == 'T' || sym.type == 't' || sym.type == 'W' || sym.type == 'w') {
    w.len = LengthWithin(w.addr, sym.room);  // code: the first bytes of the function
  } else {
    w.len = LengthWithin(w.addr, sym.room);
    std::fprintf(stderr,
                 "kwatch: note: no type for '%s' (System.map and kallsyms carry none, and the "
                 "kernel's BTF describes only per-CPU variables): watching %u bytes; give "
                 "--len N or --type TYPE\n",
                 w.display.c_str(), w.len);
  }
  if (sym.type != 'D' && sym.type != 'd' && sym.type != 'B' && sym.type != 'b' && !opts.exec &&
      !opts.rw && !opts.read) {
    std::fprintf(stderr,
                 "kwatch: warning: '%s' is in a read-only kernel section (type '%c' in %s): "
                 "nothing writes there, so --write will see no event\n",
                 expr.base.c_str(), sym.type, sym.source.c_str());
  }
  return w;
}

// The command name of a task, read when its first event is printed.
class CommCache {
 public:
  const std::string& Get(pid_t tid, uint32_t cpu) {
    // tid 0 is each CPU's own idle task: one name per CPU.
    const int64_t key = tid == 0 ? -1 - static_cast<int64_t>(cpu) : tid;
    auto it = names_.find(key);
    if (it != names_.end()) {
      return it->second;
    }
    std::string name;
    if (tid == 0) {
      name = absl::StrCat("swapper/", cpu);  // the idle task of that CPU
    } else {
      auto comm = core::kernel::ReadWholeFile(absl::StrCat("/proc/", tid, "/comm"));
      name = comm.ok() ? std::string(absl::StripAsciiWhitespace(*comm)) : "?";
    }
    return names_.emplace(key, std::move(name)).first->second;
  }

 private:
  std::map<int64_t, std::string> names_;  // by tid; idle tasks by -1 - cpu
};
// The frames of a kernel event's callchain: kernel frames by Describe (func+off, file:line
// with a vmlinux), then the user frames of the task (by the process's symbols for
// --kernel-accesses; addresses for kernel-wide watches, whose tasks are anyone's).
struct KernelFrame {
  uint64_t ip = 0;
  bool user = false;
  std::string site;
};

std::vector<KernelFrame> KernelFrames(core::kernel::KernelSymbolResolver& symbols,
                                      const core::Symbols* user_syms,
                                      const watch::PerfCallchain& chain) {
  std::vector<KernelFrame> out;
  for (const uint64_t ip : chain.kernel) {
    out.push_back({ip, false, symbols.Describe(ip)});
  }
  for (const uint64_t ip : chain.user) {
    std::string site = absl::StrFormat("0x%x", ip);
    if (user_syms != nullptr) {
      if (auto f = user_syms->FunctionAt(core::RemoteAddr{ip}); f.has_value()) {
        site = absl::StrFormat("%s+0x%x", f->name, ip - f->start.value);
        if (auto l = user_syms->LineAt(core::RemoteAddr{ip}); l.has_value()) {
          const size_t slash = l->file.rfind('/');
          absl::StrAppendFormat(&site, " (%s:%d)",
                                slash == std::string::npos ? l->file : l->file.substr(slash + 1),
                                l->line);
        }
      }
    }
    out.push_back({ip, true, std::move(site)});
  }
  return out;
}

// The per-site table of watch `i` (text summary), "" when it saw no event:
//   kernel sites of watch #1 buf (the IP the CPU reported: after the access):
//     EVENTS  TASKS  CPUS      SITE
//        140      1  0,1       _copy_to_iter+0x80
std::string SitesText(const KernelWatch& w, size_t i, core::kernel::KernelSymbolResolver& symbols) {
  if (w.sites.by_ip.empty()) {
    return "";
  }
  std::string out = absl::StrFormat(
      "kernel sites of watch #%d %s (the IP the CPU reported: after the access):\n"
      "  %8s %6s  %-9s %s\n",
      i + 1, w.display, "EVENTS", "TASKS", "CPUS", "SITE");
  for (const auto& [ip, st] : SitesByEvents(w.sites)) {
    absl::StrAppendFormat(&out, "  %8d %6d  %-9s %s\n", st->events, st->tids.size(),
                          absl::StrJoin(st->cpus, ","), symbols.Describe(ip));
  }
  return out;
}

// The sites of a watch as a JSON array, most events first.
std::string SitesJson(const SiteTally& t, core::kernel::KernelSymbolResolver& symbols) {
  std::vector<std::string> items;
  for (const auto& [ip, st] : SitesByEvents(t)) {
    items.push_back(
        absl::StrFormat(R"({"ip":"0x%x","site":%s,"events":%d,"tasks":[%s],"cpus":[%s]})", ip,
                        JsonString(symbols.Describe(ip)), st->events, absl::StrJoin(st->tids, ","),
                        absl::StrJoin(st->cpus, ",")));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

// Says how many events of a watch came at the IP of their task's previous event on the same
// CPU (the signature of a rep string instruction trapping per iteration; see
// kRepeatedIpExplanation).
std::string RepeatedIpNote(const KernelWatch& w, size_t i,
                           core::kernel::KernelSymbolResolver& symbols) {
  return absl::StrFormat(
      "kwatch: note: watch #%d %s: %d of its %d events came at the same IP as the previous "
      "event of their task on their CPU (first at %s)\n",
      i + 1, w.display, w.sites.repeated, w.events, symbols.Describe(w.sites.first_repeated_ip));
}

// What repeated IPs mean, printed once after the notes above.
constexpr absl::string_view kRepeatedIpExplanation =
    "kwatch: note: a rep string instruction traps after each iteration that touches the "
    "watched bytes, reporting the instruction itself while iterations remain and the next one "
    "after the last: a `rep movsb` that copies N watched bytes (copy_to_user on CPUs with "
    "FSRM/ERMS) gives N events, which are iterations of one copy, not N calls; the kernel "
    "counts them the same way. A task running the same instruction again also repeats its IP "
    "(docs/kernel.md)\n";

// Appends one kernel event to the recording, with its site (symbolized once: function,
// offset and file:line as the live output names them) and its task's name (once per tid and
// name). A kernel event's ip is the trap IP: x86 reports data breakpoints after the access,
// and kwatch does not read kernel code to find the instruction before it. `value` is the
// watch's value at drain time, when kernel memory could be read.
absl::Status RecordKernelEvent(core::TraceWriter& writer,
                               core::kernel::KernelSymbolResolver& symbols, CommCache& comms,
                               const KernelWatch& w, const KernelEvent& ev) {
  const core::RemoteAddr ip{ev.s.ip};
  if (!writer.HasSite(ip)) {
    const core::kernel::KernelSymbolResolver::CodeSite site = symbols.Locate(ev.s.ip);
    core::SiteRecord rec;
    rec.ip = ip;
    rec.function = site.function;
    rec.offset = site.offset;
    rec.file = site.file;
    rec.line = site.line;
    KW_RETURN_IF_ERROR(writer.AddSite(rec));
  }
  KW_RETURN_IF_ERROR(
      writer.AddTask(core::TaskRecord{static_cast<pid_t>(ev.s.pid), static_cast<pid_t>(ev.s.tid),
                                      comms.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu)}));
  core::AccessEvent e;
  e.time_ns = ev.s.time;
  e.pid = static_cast<pid_t>(ev.s.pid);
  e.tid = static_cast<pid_t>(ev.s.tid);
  e.cpu = ev.s.cpu;
  e.watch_id = static_cast<uint32_t>(ev.watch);
  e.trap_ip = ip;
  e.ip = ip;
  e.addr = core::RemoteAddr{w.addr};
  e.len = w.len;
  e.access_addr = core::RemoteAddr{w.addr};
  e.access_size = 0;                  // the watched range is all a breakpoint tells
  e.kind = core::AccessKind::kWrite;  // -o takes --write kernel watches only
  e.value = ev.value;                 // read at drain time (DrainValues), or none
  e.value_exact = false;
  return writer.Append(e);
}

// Ends a kernel session's recording: the end record after success, else what was kept.
// Returns false when the recording failed (kwatch then exits 1).
bool FinishKernelRecording(core::TraceWriter& writer, const absl::Status& record_error,
                           const std::string& stop_reason, uint64_t lost,
                           std::optional<int> exit_status) {
  if (record_error.ok()) {
    core::SessionEnd end;
    end.exit_status = exit_status;
    end.exit_reason = stop_reason;
    end.lost_count = lost;
    if (absl::Status s = writer.Finish(end); !s.ok()) {
      Error(s);
      return false;
    }
    if (!writer.finish_warning().empty()) {
      std::fprintf(stderr, "kwatch: warning: %s\n", writer.finish_warning().c_str());
    }
    std::fprintf(stderr, "kwatch: recorded %llu events to %s (kwatch report %s)\n",
                 static_cast<unsigned long long>(writer.events_committed()), writer.path().c_str(),
                 writer.path().c_str());
    return true;
  }
  Error(record_error);
  if (!writer.location_lost()) {  // never claim a file that no longer exists
    const std::string& where = writer.moved_to().empty() ? writer.path() : writer.moved_to();
    std::fprintf(stderr,
                 "kwatch: the recording %s holds the events committed before the failure; "
                 "`kwatch report %s` reads it\n",
                 where.c_str(), where.c_str());
  }
  return false;
}

// Creates the recording of a kernel session (-o) with one watch row per kernel watch.
// `pid` is the process of --kernel-accesses (0 for kernel watches).
absl::StatusOr<std::unique_ptr<core::TraceWriter>> CreateKernelRecording(
    const Options& opts, pid_t pid, const std::vector<KernelWatch>& watches) {
  core::SessionRecord rec = core::SessionRecordForThisHost();
  rec.command_line = opts.command_line;
  rec.pid = pid;
  rec.kwatch_version = KWATCH_VERSION;
  rec.mode = pid == 0 ? "kernel" : "kernel-accesses";
  rec.backend = "perf";
  KW_ASSIGN_OR_RETURN(auto writer, core::TraceWriter::Create(opts.output, rec));
  for (size_t i = 0; i < watches.size(); ++i) {
    const KernelWatch& w = watches[i];
    core::WatchRecord wr;
    wr.id = static_cast<uint32_t>(i);
    wr.expr = w.display;
    wr.address = core::RemoteAddr{w.addr};
    wr.length = w.len;
    wr.kind = "w";
    wr.backend = "perf";
    wr.coverage =
        pid == 0 ? absl::StrFormat("%d bytes (hardware breakpoint on CPUs %s)", w.len,
                                   absl::StrJoin(w.cpus, ","))
                 : absl::StrFormat("%d bytes (hardware breakpoint, kernel accesses only)", w.len);
    wr.type_name = w.type_name;
    KW_RETURN_IF_ERROR(writer->AddWatch(wr));
  }
  return writer;
}

// Kernel memory for the values of kernel watches at drain time: --kcore FILE (an error when
// it cannot be read), else /proc/kcore; when /proc/kcore cannot be opened, says once why events
// show no value. Each watch is read once here, so that one its file does not map is said before
// any event. Nothing is opened with -q and no -o (no event is shown or recorded).
absl::StatusOr<std::unique_ptr<DrainValues>> OpenDrainValues(
    const Options& opts, const std::vector<KernelWatch>& watches) {
  if (opts.quiet && opts.output.empty()) {
    return std::make_unique<DrainValues>(nullptr, watches.size());
  }
  const std::string path = opts.kcore.empty() ? std::string{kProcKcore} : opts.kcore;
  absl::StatusOr<std::unique_ptr<core::kernel::KernelMemory>> memory =
      core::kernel::KernelMemory::Open(path);
  if (!memory.ok()) {
    if (!opts.kcore.empty()) {
      return absl::Status(memory.status().code(),
                          absl::StrCat("--kcore ", path, ": ", memory.status().message()));
    }
    std::string why(memory.status().message());
    if (absl::IsNotFound(memory.status())) {
      why =
          "this kernel has no /proc/kcore (built without CONFIG_PROC_KCORE), and kwatch reads "
          "kernel memory only there";
    } else if (absl::IsPermissionDenied(memory.status())) {
      absl::StrAppend(&why,
                      ": reading kernel memory needs CAP_SYS_RAWIO (root), and a kernel in "
                      "lockdown mode (Secure Boot) refuses it to everyone");
    }
    absl::FPrintF(stderr, "kwatch: note: kernel events show no value: %s\n", why);
    return std::make_unique<DrainValues>(nullptr, watches.size());
  }
  absl::FPrintF(stderr,
                "kwatch: values from %s, read when kwatch drains the events (~V), not at the "
                "access\n",
                path);
  auto values = std::make_unique<DrainValues>(*std::move(memory), watches.size());
  for (size_t i = 0; i < watches.size(); ++i) {
    if (const absl::Status st = values->Get(i, watches[i]).first_failure; !st.ok()) {
      std::fputs(ValueUnreadableText(i, watches[i], st).c_str(), stderr);
    }
  }
  values->NewBatch();
  return values;
}

// The debug registers of a kernel session as drmgr hands them out (KernelSlots), published
// for `kwatch slots` (kernel sessions' registers per CPU, --kernel-accesses registers with the
// process's: drmgr/slot_registry.h) whenever they change.
class SlotRegisters final : public watch::kernel::KernelRegisters {
 public:
  SlotRegisters(std::unique_ptr<watch::kernel::KernelSlots> slots, pid_t target,
                std::string command_line)
      : slots_(std::move(slots)), target_(target), command_line_(std::move(command_line)) {}
  SlotRegisters(const SlotRegisters&) = delete;
  SlotRegisters& operator=(const SlotRegisters&) = delete;
  ~SlotRegisters() override {
    if (published_) {
      drmgr::UnpublishSlots();
    }
  }

  std::vector<watch::kernel::ArmedBreakpoint> Armed() override {
    std::vector<watch::kernel::ArmedBreakpoint> out;
    out.reserve(slots_->armed().size());
    for (const watch::kernel::KernelBreakpoint& k : slots_->armed()) {
      out.push_back({k.bp.get(), k.watches});
    }
    return out;
  }

  absl::Status Request(size_t w, uint64_t addr, uint64_t len, int cpu) override {
    return slots_->Request(w, addr, len, cpu);
  }

  std::vector<watch::kernel::ClosedBreakpoint> ReleaseCpu(int cpu) override {
    std::vector<watch::kernel::ClosedBreakpoint> out;
    for (watch::kernel::KernelBreakpoint& k : slots_->ReleaseCpu(cpu)) {
      auto c = k.bp->Count();
      out.push_back({c.ok() ? *c : 0, k.bp->ring() != nullptr ? k.bp->ring()->lost() : 0,
                     std::move(k.watches)});
    }
    return out;
  }

  void CloseAll() override { slots_->armed().clear(); }

  void Changed() override {
    published_ = true;
    if (absl::Status st = drmgr::PublishSlots(target_, slots_->Snapshot(), command_line_);
        !st.ok()) {
      absl::FPrintF(stderr, "kwatch: note: kwatch slots will not show this session: %s\n",
                    st.message());
    }
  }

 private:
  std::unique_ptr<watch::kernel::KernelSlots> slots_;
  pid_t target_;  // --kernel-accesses: the process; 0 for kernel watches
  std::string command_line_;
  bool published_ = false;
};

// The live output of a kernel session: events and the summary on stdout (text, or JSON lines
// with --json), notes on stderr in both forms. Start once the session is created.
class KernelPrinter : public KernelEventSink {
 public:
  KernelPrinter(const Options& opts, drmgr::DrKind kind, pid_t target,
                core::kernel::KernelSymbolResolver& symbols, CommCache& comms,
                const core::Symbols* user_syms)
      : opts_(opts),
        kind_(kind),
        target_(target),
        symbols_(symbols),
        comms_(comms),
        user_syms_(user_syms) {}

  // The session's clock and watches; the column header.
  virtual void Start(const KernelWatchSession& session) {
    session_ = &session;
    show_values_ = session.values_shown();
  }

  void OnDrained() override { std::fflush(stdout); }

  void OnNote(const KernelNote& note) override {
    switch (note.kind) {
      case KernelNote::Kind::kValueUnreadable:
        std::fputs(
            ValueUnreadableText(note.watch, session_->watches()[note.watch], note.why).c_str(),
            stderr);
        break;
      case KernelNote::Kind::kCpuOffline:
        std::fprintf(stderr,
                     "kwatch: CPU %d went offline: its breakpoints are closed (the kernel drops "
                     "CPU-bound events of an offline CPU); it is armed again if it comes back\n",
                     note.cpu);
        std::fflush(stderr);
        break;
      case KernelNote::Kind::kCpuArmed:
        std::fprintf(stderr,
                     "kwatch: CPU %d came online during the session: armed %zu kernel watch%s "
                     "there (accesses on it before this line were not seen)\n",
                     note.cpu, note.count, note.count == 1 ? "" : "es");
        std::fflush(stderr);
        break;
      case KernelNote::Kind::kCpuRefused:
        std::fprintf(stderr,
                     "kwatch: warning: CPU %d came online during the session, but the kernel "
                     "watches could not be armed there: %s\n",
                     note.cpu, absl::StrCat(note.why.message()).c_str());
        break;
      case KernelNote::Kind::kCpuUnwatched:
        std::fprintf(stderr,
                     "kwatch: note: CPU %d came online during the session and was not watched\n",
                     note.cpu);
        break;
      case KernelNote::Kind::kDetached:
        std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", note.pid);
        break;
    }
  }

 protected:
  // Seconds from the session's start to an event's time.
  double Seconds(uint64_t time_ns) const {
    const uint64_t start = session_->start_ns();
    return time_ns >= start ? static_cast<double>(time_ns - start) / 1e9 : 0.0;
  }
  const char* Access() const {
    return kind_ == drmgr::DrKind::kExec ? "x" : kind_ == drmgr::DrKind::kWrite ? "w" : "rw";
  }
  std::vector<KernelFrame> Frames(const KernelEvent& ev) const {
    return opts_.stack ? KernelFrames(symbols_, user_syms_, ev.chain) : std::vector<KernelFrame>{};
  }
  // The CPUs a watch holds registers on, in order: "0,1,3".
  static std::string CpusText(const KernelWatch& w) {
    std::vector<int> sorted_cpus = w.cpus;  // CPUs that came online later are at the end
    std::sort(sorted_cpus.begin(), sorted_cpus.end());
    return absl::StrJoin(sorted_cpus, ",");
  }
  // The notes on repeated IPs (stderr), after the summary's watches.
  void RepeatedIpNotes(std::span<const KernelWatch> watches) const {
    bool repeated = false;
    for (size_t i = 0; i < watches.size(); ++i) {
      if (watches[i].sites.repeated > 0) {
        std::fprintf(stderr, "%s", RepeatedIpNote(watches[i], i, symbols_).c_str());
        repeated = true;
      }
    }
    if (repeated) {
      absl::FPrintF(stderr, "%s", kRepeatedIpExplanation);
    }
  }

  const Options& opts_;
  drmgr::DrKind kind_;
  pid_t target_;  // --kernel-accesses: the process; 0 for kernel watches
  core::kernel::KernelSymbolResolver& symbols_;
  CommCache& comms_;
  const core::Symbols* user_syms_;
  const KernelWatchSession* session_ = nullptr;
  bool show_values_ = false;
};

class KernelTextPrinter final : public KernelPrinter {
 public:
  using KernelPrinter::KernelPrinter;

  void Start(const KernelWatchSession& session) override {
    KernelPrinter::Start(session);
    if (opts_.quiet) {
      return;
    }
    if (show_values_) {
      std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %-22s %s\n", "TIME(s)", "CPU", "TID", "COMM",
                  "ACC", "WATCH", "VALUE (~ = at drain)", "IP (after the access)");
    } else {
      std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %s\n", "TIME(s)", "CPU", "TID", "COMM", "ACC",
                  "WATCH", "IP (after the access)");
    }
  }

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    if (opts_.quiet) {
      return absl::OkStatus();
    }
    const std::string ip = symbols_.Describe(ev.s.ip);
    const std::vector<KernelFrame> frames = Frames(ev);
    const double t = Seconds(ev.s.time);
    const std::string& comm = comms_.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
    if (show_values_) {
      const std::string v =
          ev.value.has_value() ? absl::StrCat("~", ValueOf(*ev.value, w.len)) : std::string("?");
      std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %-22s %s\n", t, ev.s.cpu, ev.s.tid,
                  comm.c_str(), Access(), w.display.c_str(), v.c_str(), ip.c_str());
    } else {
      std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %s\n", t, ev.s.cpu, ev.s.tid, comm.c_str(),
                  Access(), w.display.c_str(), ip.c_str());
    }
    for (size_t f = 0; f < frames.size(); ++f) {
      std::printf("    #%-2zu %s%s\n", f, frames[f].user ? "[user] " : "", frames[f].site.c_str());
    }
    return absl::OkStatus();
  }

  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    std::printf("kwatch: %llu event%s, %llu lost; %s\n",
                static_cast<unsigned long long>(summary.events), summary.events == 1 ? "" : "s",
                static_cast<unsigned long long>(summary.lost), summary.stop_reason.c_str());
    const std::string kind_name(drmgr::DrKindName(kind_));
    for (size_t i = 0; i < watches.size(); ++i) {
      const KernelWatch& w = watches[i];
      const std::string scope = target_ == 0 ? absl::StrCat("kernel, CPUs ", CpusText(w))
                                             : absl::StrCat("kernel accesses for pid ", target_);
      std::printf(
          "watch #%zu %s: %u byte%s at 0x%llx%s%s, %s, %s: %llu event%s "
          "(the kernel counted %llu)\n",
          i + 1, w.display.c_str(), w.len, w.len == 1 ? "" : "s",
          static_cast<unsigned long long>(w.addr), w.type_name.empty() ? "" : ", ",
          w.type_name.c_str(), kind_name.c_str(), scope.c_str(),
          static_cast<unsigned long long>(w.events), w.events == 1 ? "" : "s",
          static_cast<unsigned long long>(summary.counted[i]));
    }
    for (size_t i = 0; i < watches.size(); ++i) {
      std::printf("%s", SitesText(watches[i], i, symbols_).c_str());
    }
    RepeatedIpNotes(watches);
    std::fflush(stdout);
  }
};

class KernelJsonPrinter final : public KernelPrinter {
 public:
  using KernelPrinter::KernelPrinter;

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    if (opts_.quiet) {
      return absl::OkStatus();
    }
    const std::string ip = symbols_.Describe(ev.s.ip);
    const std::vector<KernelFrame> frames = Frames(ev);
    const double t = Seconds(ev.s.time);
    const std::string& comm = comms_.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
    const std::string value =
        ev.value.has_value() ? absl::StrCat(ValueOf(*ev.value, w.len), R"(,"value_at":"drain")")
                             : "null";
    const std::string stack =
        frames.empty()
            ? ""
            : absl::StrCat(",\"stack\":[",
                           absl::StrJoin(frames, ",",
                                         [](std::string* o, const KernelFrame& f) {
                                           absl::StrAppendFormat(
                                               o, "{\"ip\":\"0x%x\",\"space\":\"%s\",\"site\":%s}",
                                               f.ip, f.user ? "user" : "kernel",
                                               JsonString(f.site));
                                         }),
                           "]");
    std::printf(
        "{\"type\":\"event\",\"time\":%.9f,\"cpu\":%u,\"tid\":%u,\"comm\":%s,\"kind\":\"%s\","
        "\"watch\":%zu,\"field\":%s,\"addr\":\"0x%llx\",\"value\":%s,\"ip\":\"0x%llx\","
        "\"site\":%s%s}\n",
        t, ev.s.cpu, ev.s.tid, JsonString(comm).c_str(), Access(), ev.watch,
        JsonString(w.display).c_str(), static_cast<unsigned long long>(ev.s.addr), value.c_str(),
        static_cast<unsigned long long>(ev.s.ip), JsonString(ip).c_str(), stack.c_str());
    return absl::OkStatus();
  }

  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    std::printf(
        "{\"type\":\"summary\",\"events\":%llu,\"lost\":%llu,\"stop_reason\":%s,"
        "\"watches\":[",
        static_cast<unsigned long long>(summary.events),
        static_cast<unsigned long long>(summary.lost), JsonString(summary.stop_reason).c_str());
    const std::string kind_name(drmgr::DrKindName(kind_));
    for (size_t i = 0; i < watches.size(); ++i) {
      const KernelWatch& w = watches[i];
      std::printf(
          "%s{\"id\":%zu,\"expr\":%s,\"addr\":\"0x%llx\",\"len\":%u,\"kind\":\"%s\","
          "\"type\":%s,\"source\":%s,\"slide\":%lld,\"cpus\":[%s],\"events\":%llu,"
          "\"kernel_count\":%llu,\"sites\":%s,\"repeated_ip_events\":%llu}",
          i == 0 ? "" : ",", i, JsonString(w.display).c_str(),
          static_cast<unsigned long long>(w.addr), w.len, kind_name.c_str(),
          JsonString(w.type_name).c_str(), JsonString(w.source).c_str(),
          static_cast<long long>(w.slide), CpusText(w).c_str(),
          static_cast<unsigned long long>(w.events),
          static_cast<unsigned long long>(summary.counted[i]), SitesJson(w.sites, symbols_).c_str(),
          static_cast<unsigned long long>(w.sites.repeated));
    }
    RepeatedIpNotes(watches);
    std::printf("]}\n");
    std::fflush(stdout);
  }
};

// -o: records each event (with its site and task) before the printer shows it, and flushes the
// recording after each step. The first failure ends the session ("recording failed: ...") and
// stops the recording; the printer still gets every event.
class RecordingSink final : public KernelEventSink {
 public:
  RecordingSink(core::TraceWriter& writer, core::kernel::KernelSymbolResolver& symbols,
                CommCache& comms, KernelEventSink& next)
      : writer_(writer), symbols_(symbols), comms_(comms), next_(next) {}

  // The first failure of the recording, OK when none.
  const absl::Status& error() const { return error_; }

  absl::Status OnEvent(const KernelEvent& ev, const KernelWatch& w) override {
    absl::Status out;
    if (error_.ok()) {
      error_ = RecordKernelEvent(writer_, symbols_, comms_, w, ev);
      out = Failed();
    }
    (void)next_.OnEvent(ev, w);
    return out;
  }
  void OnDrained() override { next_.OnDrained(); }
  absl::Status OnStepEnd() override {
    if (error_.ok()) {
      error_ = writer_.Flush();
      if (absl::Status st = Failed(); !st.ok()) {
        return st;
      }
    }
    return next_.OnStepEnd();
  }
  void OnNote(const KernelNote& note) override { next_.OnNote(note); }
  void OnSummary(const KernelSummary& summary, std::span<const KernelWatch> watches) override {
    next_.OnSummary(summary, watches);
  }

 private:
  absl::Status Failed() const {
    return error_.ok()
               ? absl::OkStatus()
               : absl::Status(error_.code(), absl::StrCat("recording failed: ", error_.message()));
  }

  core::TraceWriter& writer_;
  core::kernel::KernelSymbolResolver& symbols_;
  CommCache& comms_;
  KernelEventSink& next_;
  absl::Status error_;  // the first failure
};

// What a kernel session runs on, set up by RunKernelWatch or RunKernelAccesses.
struct KernelRun {
  std::vector<KernelWatch> watches;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  std::string armed;  // the "armed ..." line
  std::unique_ptr<watch::kernel::KernelSlots> slots;
  std::unique_ptr<DrainValues> values;       // kernel memory for values at drain time, or null
  core::Process* proc = nullptr;             // --kernel-accesses: the process
  const core::Symbols* user_syms = nullptr;  // ... and its symbols
  core::TraceWriter* writer = nullptr;       // -o
};

// Runs a kernel session (kernel watches, or --kernel-accesses of `run.proc`) to its end:
// prints each event with its CPU, task and kernel function+offset, then the summary. Returns
// kwatch's exit status.
absl::StatusOr<int> RunKernelSession(const Options& opts, KernelRun run,
                                     core::kernel::KernelSymbolResolver& symbols) {
  const pid_t pid = run.proc != nullptr ? run.proc->pid() : 0;
  CommCache comms;
  std::unique_ptr<KernelPrinter> printer;
  if (opts.json) {
    printer =
        std::make_unique<KernelJsonPrinter>(opts, run.kind, pid, symbols, comms, run.user_syms);
  } else {
    printer =
        std::make_unique<KernelTextPrinter>(opts, run.kind, pid, symbols, comms, run.user_syms);
  }
  std::optional<RecordingSink> recorder;
  if (run.writer != nullptr) {
    recorder.emplace(*run.writer, symbols, comms, *printer);
  }
  KernelEventSink& sink = recorder.has_value() ? static_cast<KernelEventSink&>(*recorder)
                                               : static_cast<KernelEventSink&>(*printer);
  watch::kernel::KernelSessionOptions so;
  so.count = opts.count;
  so.duration = opts.duration;
  so.callchains = opts.stack;
  so.kill_on_exit = opts.kill_on_exit;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<KernelWatchSession> session,
                      KernelWatchSession::Create(so, std::move(run.watches),
                                                 std::make_unique<SlotRegisters>(
                                                     std::move(run.slots), pid, opts.command_line),
                                                 std::move(run.values), run.proc, sink));
  std::fprintf(stderr, "kwatch: %s\n", run.armed.c_str());
  std::fflush(stderr);
  printer->Start(*session);
  while (true) {
    KW_ASSIGN_OR_RETURN(const bool more, session->Step());
    if (!more) {
      break;
    }
  }
  KW_ASSIGN_OR_RETURN(const watch::kernel::KernelSessionEnd end, session->Finish());
  if (run.writer != nullptr && !FinishKernelRecording(*run.writer, recorder->error(),
                                                      end.stop_reason, end.lost, end.exit_status)) {
    return 1;  // -o was not honoured (docs/recording.md)
  }
  return end.exit_status.value_or(0);
}

absl::StatusOr<int> RunKernelWatch(const Options& opts) {
  if (!HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "watching the kernel needs root, or CAP_PERFMON (Linux >= 5.8) or CAP_SYS_ADMIN (also "
        "CAP_SYSLOG to read kernel addresses in /proc/kallsyms): run it with sudo, or `sudo "
        "setcap cap_perfmon,cap_syslog+ep $(command -v kwatch)`");
  }
  core::kernel::KernelSymbolSources src;
  src.system_map = opts.system_map;
  src.vmlinux = opts.vmlinux;
  KW_ASSIGN_OR_RETURN(auto symbols, core::kernel::KernelSymbolResolver::Create(src));
  std::unique_ptr<core::kernel::KernelBtf> btf;
  if (auto b = core::kernel::KernelBtf::Load(); b.ok()) {
    btf = *std::move(b);
  } else if (!opts.kernel_type.empty()) {
    return b.status();
  }

  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  if (opts.rw || opts.read) {
    kind = drmgr::DrKind::kReadWrite;
  } else if (opts.exec) {
    kind = drmgr::DrKind::kExec;
  }
  const std::vector<int> cpus = watch::OnlineCpus();
  std::vector<KernelWatch> watches;
  for (const std::string& e : opts.exprs) {
    KW_ASSIGN_OR_RETURN(KernelWatch w, ResolveKernelExpr(e, opts, *symbols, btf.get()));
    std::fprintf(stderr, "kwatch: %s: %u byte%s at 0x%llx%s%s, from %s%s\n", w.display.c_str(),
                 w.len, w.len == 1 ? "" : "s", static_cast<unsigned long long>(w.addr),
                 w.type_name.empty() ? "" : ", ", w.type_name.c_str(), w.source.c_str(),
                 w.slide != 0 || absl::StartsWith(w.source, "System.map") ||
                         absl::StartsWith(w.source, "vmlinux")
                     ? absl::StrFormat(" (KASLR slide %s0x%x)", w.slide < 0 ? "-" : "+",
                                       w.slide < 0 ? -static_cast<uint64_t>(w.slide)
                                                   : static_cast<uint64_t>(w.slide))
                           .c_str()
                     : "");
    watches.push_back(std::move(w));
  }
  // drmgr decides who holds which register of each CPU; its slots are opened as CPU-wide
  // breakpoints (watch/kernel/kernel_slots.h).
  watch::BreakpointRequest opened;
  opened.kind = kind;
  opened.tid = -1;
  opened.inherit = false;
  opened.exclude_kernel = false;
  opened.exclude_user = false;
  opened.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
  std::vector<std::string> labels;
  labels.reserve(watches.size());
  for (const KernelWatch& w : watches) {
    labels.push_back(w.display);
  }
  auto slots = std::make_unique<watch::kernel::KernelSlots>(opened, std::move(labels));
  for (size_t i = 0; i < watches.size(); ++i) {
    KernelWatch& w = watches[i];
    for (const int cpu : cpus) {
      KW_RETURN_IF_ERROR(slots->Request(i, w.addr, w.len, cpu));
      w.cpus.push_back(cpu);
    }
  }

  KW_ASSIGN_OR_RETURN(std::unique_ptr<DrainValues> values, OpenDrainValues(opts, watches));
  KernelLinesNote(opts, *symbols);
  // Signals go to the loop's signalfd: block them before the recording's checkpoint thread
  // starts, so that it inherits the mask (else a Ctrl-C there would kill kwatch).
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  std::unique_ptr<core::TraceWriter> writer;
  if (!opts.output.empty()) {
    KW_ASSIGN_OR_RETURN(writer, CreateKernelRecording(opts, 0, watches));
  }
  KernelRun run;
  run.kind = kind;
  run.armed = absl::StrFormat(
      "armed %d kernel watch%s on %d CPUs (one breakpoint per CPU), perf breakpoint stream "
      "mode%s",
      watches.size(), watches.size() == 1 ? "" : "es", cpus.size(), StackNote(opts));
  run.watches = std::move(watches);
  run.slots = std::move(slots);
  run.values = std::move(values);
  run.writer = writer.get();
  return RunKernelSession(opts, std::move(run), *symbols);
}

// --kernel-accesses: user addresses of a process watched for the accesses the kernel makes
// on the process's behalf (exclude_user: copy_to_user into a read(2) buffer, futex words...),
// on every thread (inherited by new ones), each event with its kernel function+offset.
absl::StatusOr<int> RunKernelAccesses(const Options& opts) {
  if (!HasPerfmonCapability()) {
    return absl::PermissionDeniedError(
        "--kernel-accesses watches kernel code: it needs root, or CAP_PERFMON (Linux >= 5.8) "
        "or CAP_SYS_ADMIN (also CAP_SYSLOG to read kernel addresses in /proc/kallsyms)");
  }
  KW_ASSIGN_OR_RETURN(auto ksyms, core::kernel::KernelSymbolResolver::Create({}));
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  core::LaunchOptions lo;
  lo.kill_on_exit = opts.kill_on_exit;
  lo.run_as = opts.run_as;
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::Process> proc,
                      core::Process::Start(opts.pid, opts.command, lo));
  auto fail = [&](absl::Status st) -> absl::Status {
    if (proc->launched()) {
      (void)proc->Kill();
    } else {
      (void)proc->Detach();
    }
    return st;
  };
  auto syms = core::Symbols::ForProcess(proc->pid());
  if (!syms.ok()) {
    return fail(syms.status());
  }
  const core::MemoryReader reader = [&proc](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc->ReadMemory(addr, out);
  };
  const drmgr::DrKind kind = opts.rw ? drmgr::DrKind::kReadWrite : drmgr::DrKind::kWrite;
  std::vector<KernelWatch> watches;
  for (const std::string& text : opts.exprs) {
    auto expr = core::ParseExpr(text);
    if (!expr.ok()) {
      return fail(expr.status());
    }
    KernelWatch w;
    w.expr = text;
    if (expr->address.has_value()) {
      w.addr = *expr->address;
      w.display = absl::StrFormat("0x%x", w.addr);
      w.len = static_cast<uint32_t>(opts.len.value_or(expr->length.value_or(8)));
    } else {
      auto r = (*syms)->Resolve(*expr, reader);
      if (!r.ok()) {
        return fail(r.status());
      }
      w.addr = r->addr.value;
      w.display = r->display;
      w.type_name = r->type_name;
      w.len = static_cast<uint32_t>(opts.len.value_or(r->length));
    }
    w.source = "the target's symbols";
    watches.push_back(std::move(w));
  }
  if (absl::Status st = proc->StopAll(); !st.ok()) {
    return fail(st);
  }
  // drmgr decides which registers of the process's threads the watches hold (process scope,
  // as process sessions ask it); each slot is opened on every thread, inherited by new ones.
  watch::BreakpointRequest opened;
  opened.kind = kind;
  opened.inherit = true;
  opened.exclude_kernel = false;
  opened.exclude_user = true;
  opened.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
  std::vector<std::string> labels;
  labels.reserve(watches.size());
  for (const KernelWatch& w : watches) {
    labels.push_back(w.display);
  }
  auto slots = std::make_unique<watch::kernel::KernelSlots>(
      opened, std::move(labels), proc->pid(), [&proc] { return proc->TracedThreads(); });
  for (size_t i = 0; i < watches.size(); ++i) {
    const KernelWatch& w = watches[i];
    if (absl::Status st = slots->RequestForProcess(i, w.addr, w.len); !st.ok()) {
      return fail(st);
    }
  }
  if (absl::Status st = proc->ResumeAll(); !st.ok()) {
    return fail(st);
  }
  KernelLinesNote(opts, *ksyms);
  std::unique_ptr<core::TraceWriter> writer;
  if (!opts.output.empty()) {
    auto w = CreateKernelRecording(opts, proc->pid(), watches);
    if (!w.ok()) {
      return fail(w.status());
    }
    writer = *std::move(w);
  }
  const std::string prog = proc->argv().empty() ? "?" : proc->argv()[0];
  KernelRun run;
  run.kind = kind;
  run.armed = absl::StrFormat(
      "armed %d watch%s on pid %d (%s) for the kernel's accesses only (exclude_user), perf "
      "breakpoint stream mode%s",
      watches.size(), watches.size() == 1 ? "" : "es", proc->pid(), prog, StackNote(opts));
  run.watches = std::move(watches);
  run.slots = std::move(slots);
  run.proc = proc.get();
  run.user_syms = syms->get();
  run.writer = writer.get();
  auto code = RunKernelSession(opts, std::move(run), *ksyms);
  if (!code.ok()) {
    return fail(code.status());
  }
  return code;
}

}  // namespace

// Why --if is refused for kernel watches and --kernel-accesses.
constexpr absl::string_view kKernelIfRefusal =
    "--if needs the values of each access, and kernel watches (and --kernel-accesses) are "
    "perf breakpoint streams that read no memory at the access; leave --if out and filter "
    "the --json events (tid, cpu, comm, site)";

constexpr absl::string_view kKernelRecordingRefusal =
    "-o records kernel --write watches only: a read-write breakpoint does not say whether the "
    "kernel read or wrote, kwatch does not read kernel code to decode the access, and a "
    "recording stores each event as a read or a write; record with --write, or watch --rw live";

int KernelMain(const Options& opts) {
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: error: --read is not available for kernel watches: kwatch tells reads "
                 "from writes by decoding the accessing instruction, and it does not read kernel "
                 "code; use --rw\n");
    return 2;
  }
  if (!opts.output.empty() && (opts.rw || opts.exec)) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelRecordingRefusal);
    return 2;
  }
  if (opts.backend == "page") {
    std::fprintf(stderr,
                 "kwatch: error: kernel watches use hardware breakpoints only (--backend page "
                 "protects a process's pages)\n");
    return 2;
  }
  if (opts.stop || opts.backend == "stop") {
    std::fprintf(stderr,
                 "kwatch: error: stop mode stops a process's threads through ptrace; kernel "
                 "watches use CPU-wide perf breakpoints (leave --stop out)\n");
    return 2;
  }
  if (!opts.condition.empty()) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
    return 2;
  }
  if (opts.overcommit == "pages" || opts.overcommit == "multiplex") {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 opts.overcommit == "pages"
                     ? "--overcommit=pages cannot watch kernel memory: page protection works on "
                       "a process's pages; kernel watches have the debug registers only "
                       "(--overcommit=fail, the default there)"
                     : "--overcommit=multiplex is for process watches; kernel watches take one "
                       "debug register each on every CPU and fail beyond four");
    return 2;
  }
  auto code = RunKernelWatch(opts);
  if (code.ok()) {
    return *code;
  }
  Error(code.status());
  if (absl::IsNotFound(code.status()) && opts.system_map.empty() && opts.vmlinux.empty()) {
    std::fprintf(stderr,
                 "kwatch: note: no target was given (-p PID or a command after `--`), so kwatch "
                 "watched the kernel and looked the expression up among kernel symbols\n");
    return 2;
  }
  return 1;
}

int KernelAccessesMain(const Options& opts) {
  if (!opts.condition.empty()) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
    return 2;
  }
  if (!opts.output.empty() && (opts.rw || opts.exec)) {
    absl::FPrintF(stderr, "kwatch: error: %s\n", kKernelRecordingRefusal);
    return 2;
  }
  auto code = RunKernelAccesses(opts);
  if (!code.ok()) {
    Error(code.status());
    return 1;
  }
  return *code;
}

}  // namespace kwatch::cli