#include "cli/kernel_watch.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
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
#include "cli/slot_registry.h"
#include "core/expr.h"
#include "core/kernel/btf_types.h"
#include "core/kernel/kallsyms.h"
#include "core/kernel/kernel_symbols.h"
#include "core/process.h"
#include "core/status_macros.h"
#include "core/store/trace_writer.h"
#include "core/symbols.h"
#include "core/syscall_status.h"
#include "core/unique_fd.h"
#include "drmgr/debug_regs.h"
#include "watch/condition.h"
#include "watch/perf_breakpoint.h"
#include "watch/perf_util.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/session.h"
#include "watch/summary.h"

namespace kwatch::cli {

namespace {

using Options = WatchOptions;

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

void Error(const absl::Status& s) {
  std::fprintf(stderr, "kwatch: error: %s\n", std::string(s.message()).c_str());
}

// ---------------------------------------------------------------------------------------------
// Kernel watches: no -p and no command. One CPU-wide breakpoint per online CPU (pid -1).

// One watched kernel object.
struct KernelWatch {
  std::string expr;     // as typed
  std::string display;  // "jiffies", "init_task.prio"
  uint64_t addr = 0;    // run-time address
  uint32_t len = 8;
  std::string type_name;  // "" when no source gives a type
  std::string source;     // where the symbol's address came from
  int64_t slide = 0;
  std::vector<std::unique_ptr<watch::PerfBreakpoint>> bps;  // one per CPU
  std::vector<int> cpus;
  uint64_t events = 0;
};

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
    std::fprintf(stderr, "kwatch: note: %s\n", std::string(st.message()).c_str());
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
    auto it = names_.find(tid);
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
    return names_.emplace(tid, std::move(name)).first->second;
  }

 private:
  std::map<pid_t, std::string> names_;
};

struct KernelEvent {
  watch::PerfSample s;
  size_t watch = 0;
  watch::PerfCallchain chain;  // --stack
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

// The event loop of breakpoints whose samples carry kernel IPs (kernel watches, and
// --kernel-accesses of a process, `proc`): drains the rings, prints each event with its CPU,
// task and kernel function+offset, stops on --count, --duration, a signal or the target's
// end, then prints the summary. Returns the exit status.
absl::StatusOr<int> RunBreakpointLoop(const Options& opts, std::vector<KernelWatch>& watches,
                                      core::kernel::KernelSymbolResolver& symbols,
                                      drmgr::DrKind kind, const std::string& armed,
                                      core::Process* proc,
                                      const core::Symbols* user_syms = nullptr) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) {
    sigaddset(&mask, sig);
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  core::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  core::UniqueFd epfd(epoll_create1(EPOLL_CLOEXEC));
  core::UniqueFd tick(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!sigfd || !epfd || !tick) {
    const int err = errno;
    return core::SyscallError(err, "signalfd/epoll_create1/timerfd_create");
  }
  itimerspec its{};
  its.it_interval.tv_nsec = 50'000'000;
  its.it_value.tv_nsec = 50'000'000;
  timerfd_settime(tick.get(), 0, &its, nullptr);
  auto add = [&](int fd) -> absl::Status {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epfd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      const int err = errno;
      return core::SyscallError(err, "epoll_ctl(ADD)");
    }
    return absl::OkStatus();
  };
  KW_RETURN_IF_ERROR(add(sigfd.get()));
  KW_RETURN_IF_ERROR(add(tick.get()));
  for (const KernelWatch& w : watches) {
    for (const auto& bp : w.bps) {
      for (const int fd : bp->fds()) {
        KW_RETURN_IF_ERROR(add(fd));
      }
    }
  }
  std::fprintf(stderr, "kwatch: %s\n", armed.c_str());
  std::fflush(stderr);
  // The target's end (or exec) while kwatch handles its stops.
  auto poll_target = [&]() -> absl::Status {
    if (proc == nullptr || !proc->alive()) {
      return absl::OkStatus();
    }
    KW_ASSIGN_OR_RETURN(const std::vector<core::ProcessEvent> pevs, proc->Poll());
    for (const auto& e : pevs) {
      if (e.kind == core::ProcessEvent::Kind::kExited) {
        return absl::CancelledError(
            proc->exit_info()->signaled
                ? absl::StrCat("target killed by ", sigabbrev_np(proc->exit_info()->signal))
                : std::string("target exited"));
      }
      if (e.kind == core::ProcessEvent::Kind::kExec) {
        KW_RETURN_IF_ERROR(proc->Resume(e.tid));
        return absl::CancelledError(
            "target called exec (the watched addresses mean nothing in the new image)");
      }
    }
    return absl::OkStatus();
  };

  const uint64_t start_ns = MonotonicNs();
  const uint64_t deadline_ns =
      opts.duration > 0 ? start_ns + static_cast<uint64_t>(opts.duration * 1e9) : 0;
  CommCache comms;
  uint64_t delivered = 0;
  std::string stop_reason;
  if (!opts.quiet && !opts.json) {
    std::printf("%-14s %-4s %-7s %-16s %-3s %-24s %s\n", "TIME(s)", "CPU", "TID", "COMM", "ACC",
                "WATCH", "IP (after the access)");
  }
  auto drain = [&]() {
    std::vector<KernelEvent> evs;
    for (size_t i = 0; i < watches.size(); ++i) {
      for (auto& bp : watches[i].bps) {
        if (bp->ring() == nullptr) {
          continue;
        }
        if (opts.stack) {
          bp->ring()->DrainRecords([&](std::span<const uint8_t> record) {
            KernelEvent ev;
            ev.watch = i;
            if (watch::ParseCallchainSample(record, ev.s, ev.chain)) {
              evs.push_back(std::move(ev));
            }
          });
        } else {
          bp->ring()->Drain([&](const watch::PerfSample& s) { evs.push_back({s, i, {}}); });
        }
      }
    }
    std::sort(evs.begin(), evs.end(),
              [](const KernelEvent& a, const KernelEvent& b) { return a.s.time < b.s.time; });
    for (const KernelEvent& ev : evs) {
      if (opts.count > 0 && delivered >= opts.count) {
        break;
      }
      ++delivered;
      KernelWatch& w = watches[ev.watch];
      ++w.events;
      if (opts.quiet) {
        continue;
      }
      const std::string ip = symbols.Describe(ev.s.ip);
      const std::vector<KernelFrame> frames =
          opts.stack ? KernelFrames(symbols, user_syms, ev.chain) : std::vector<KernelFrame>{};
      const double t =
          ev.s.time >= start_ns ? static_cast<double>(ev.s.time - start_ns) / 1e9 : 0.0;
      const std::string& comm = comms.Get(static_cast<pid_t>(ev.s.tid), ev.s.cpu);
      const char* acc = kind == drmgr::DrKind::kExec    ? "x"
                        : kind == drmgr::DrKind::kWrite ? "w"
                                                        : "rw";
      if (opts.json) {
        std::printf(
            "{\"type\":\"event\",\"time\":%.9f,\"cpu\":%u,\"tid\":%u,\"comm\":%s,\"kind\":\"%s\","
            "\"watch\":%zu,\"field\":%s,\"addr\":\"0x%llx\",\"ip\":\"0x%llx\",\"site\":%s%s}\n",
            t, ev.s.cpu, ev.s.tid, JsonString(comm).c_str(), acc, ev.watch,
            JsonString(w.display).c_str(), static_cast<unsigned long long>(ev.s.addr),
            static_cast<unsigned long long>(ev.s.ip), JsonString(ip).c_str(),
            frames.empty() ? ""
                           : absl::StrCat(",\"stack\":[",
                                          absl::StrJoin(frames, ",",
                                                        [](std::string* o, const KernelFrame& f) {
                                                          absl::StrAppendFormat(
                                                              o,
                                                              "{\"ip\":\"0x%x\",\"space\":"
                                                              "\"%s\",\"site\":%s}",
                                                              f.ip, f.user ? "user" : "kernel",
                                                              JsonString(f.site));
                                                        }),
                                          "]")
                                 .c_str());
      } else {
        std::printf("%-14.9f %-4u %-7u %-16s %-3s %-24s %s\n", t, ev.s.cpu, ev.s.tid, comm.c_str(),
                    acc, w.display.c_str(), ip.c_str());
        for (size_t f = 0; f < frames.size(); ++f) {
          std::printf("    #%-2zu %s%s\n", f, frames[f].user ? "[user] " : "",
                      frames[f].site.c_str());
        }
      }
    }
    std::fflush(stdout);
    if (opts.count > 0 && delivered >= opts.count && stop_reason.empty()) {
      stop_reason = absl::StrCat("--count ", opts.count, " reached");
    }
  };
  std::array<epoll_event, 64> evs{};
  while (stop_reason.empty()) {
    const int n = epoll_wait(epfd.get(), evs.data(), static_cast<int>(evs.size()), 1000);
    if (n < 0 && errno != EINTR) {
      const int err = errno;
      return core::SyscallError(err, "epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      if (evs[static_cast<size_t>(i)].data.fd == sigfd.get()) {
        signalfd_siginfo si{};
        while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
          if (si.ssi_signo != SIGCHLD) {
            stop_reason =
                absl::StrCat("interrupted by ", sigabbrev_np(static_cast<int>(si.ssi_signo)));
          }
        }
      } else if (evs[static_cast<size_t>(i)].data.fd == tick.get()) {
        uint64_t ticks = 0;
        (void)(read(tick.get(), &ticks, sizeof(ticks)) > 0);
      }
    }
    drain();
    if (absl::Status st = poll_target(); !st.ok()) {
      if (!absl::IsCancelled(st)) {
        return st;
      }
      if (stop_reason.empty()) {
        stop_reason.assign(st.message().data(), st.message().size());
      }
    }
    if (deadline_ns != 0 && MonotonicNs() >= deadline_ns && stop_reason.empty()) {
      stop_reason = absl::StrFormat("--duration %gs elapsed", opts.duration);
    }
  }
  drain();
  uint64_t lost = 0;
  for (KernelWatch& w : watches) {
    for (auto& bp : w.bps) {
      (void)bp->Disable();
      lost += bp->ring() != nullptr ? bp->ring()->lost() : 0;
    }
  }
  if (opts.json) {
    std::printf(
        "{\"type\":\"summary\",\"events\":%llu,\"lost\":%llu,\"stop_reason\":%s,"
        "\"watches\":[",
        static_cast<unsigned long long>(delivered), static_cast<unsigned long long>(lost),
        JsonString(stop_reason).c_str());
  } else {
    std::printf("kwatch: %llu event%s, %llu lost; %s\n", static_cast<unsigned long long>(delivered),
                delivered == 1 ? "" : "s", static_cast<unsigned long long>(lost),
                stop_reason.c_str());
  }
  for (size_t i = 0; i < watches.size(); ++i) {
    const KernelWatch& w = watches[i];
    uint64_t counted = 0;
    for (const auto& bp : w.bps) {
      auto c = bp->Count();
      counted += c.ok() ? *c : 0;
    }
    const std::string cpus_text = absl::StrJoin(w.cpus, ",");
    const std::string kind_name(drmgr::DrKindName(kind));
    const std::string scope = proc == nullptr
                                  ? absl::StrCat("kernel, CPUs ", cpus_text)
                                  : absl::StrCat("kernel accesses for pid ", proc->pid());
    if (opts.json) {
      std::printf(
          "%s{\"id\":%zu,\"expr\":%s,\"addr\":\"0x%llx\",\"len\":%u,\"kind\":\"%s\","
          "\"type\":%s,\"source\":%s,\"slide\":%lld,\"cpus\":[%s],\"events\":%llu,"
          "\"kernel_count\":%llu}",
          i == 0 ? "" : ",", i, JsonString(w.display).c_str(),
          static_cast<unsigned long long>(w.addr), w.len, kind_name.c_str(),
          JsonString(w.type_name).c_str(), JsonString(w.source).c_str(),
          static_cast<long long>(w.slide), cpus_text.c_str(),
          static_cast<unsigned long long>(w.events), static_cast<unsigned long long>(counted));
    } else {
      std::printf(
          "watch #%zu %s: %u byte%s at 0x%llx%s%s, %s, %s: %llu event%s "
          "(the kernel counted %llu)\n",
          i + 1, w.display.c_str(), w.len, w.len == 1 ? "" : "s",
          static_cast<unsigned long long>(w.addr), w.type_name.empty() ? "" : ", ",
          w.type_name.c_str(), kind_name.c_str(), scope.c_str(),
          static_cast<unsigned long long>(w.events), w.events == 1 ? "" : "s",
          static_cast<unsigned long long>(counted));
    }
  }
  if (opts.json) {
    std::printf("]}\n");
  }
  std::fflush(stdout);
  // CPU hotplug: a CPU that came online after arming had no breakpoint.
  if (proc == nullptr && !watches.empty()) {
    const std::vector<int>& cpus = watches.front().cpus;
    for (const int cpu : watch::OnlineCpus()) {
      if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) {
        std::fprintf(stderr,
                     "kwatch: note: CPU %d came online during the session and was not watched\n",
                     cpu);
      }
    }
  }
  watches.clear();  // closes every event before the target is let go
  if (proc != nullptr) {
    if (proc->alive()) {
      if (proc->launched() && opts.kill_on_exit) {
        KW_RETURN_IF_ERROR(proc->Kill());
      } else {
        KW_RETURN_IF_ERROR(proc->Detach());
        std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", proc->pid());
      }
    }
    if (proc->launched() && proc->exit_info().has_value()) {
      return proc->exit_info()->ShellStatus();
    }
  }
  return 0;
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
    for (const int cpu : cpus) {
      watch::BreakpointRequest req;
      req.addr = core::RemoteAddr{w.addr};
      req.len = w.len;
      req.kind = kind;
      req.tid = -1;
      req.cpu = cpu;
      req.inherit = false;
      req.exclude_kernel = false;
      req.exclude_user = false;
      req.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
      KW_ASSIGN_OR_RETURN(auto bp, watch::PerfBreakpoint::Open(req));
      w.bps.push_back(std::move(bp));
      w.cpus.push_back(cpu);
    }
    watches.push_back(std::move(w));
  }

  KernelLinesNote(opts, *symbols);
  return RunBreakpointLoop(
      opts, watches, *symbols, kind,
      absl::StrFormat("armed %d kernel watch%s on %d CPUs (one breakpoint per CPU), perf "
                      "breakpoint stream mode%s",
                      watches.size(), watches.size() == 1 ? "" : "es", cpus.size(),
                      StackNote(opts)),
      nullptr);
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
  std::unique_ptr<core::Process> proc;
  if (opts.pid.has_value()) {
    KW_ASSIGN_OR_RETURN(proc, core::Process::Attach(*opts.pid));
  } else {
    core::LaunchOptions lo;
    lo.kill_on_exit = opts.kill_on_exit;
    lo.run_as = opts.run_as;
    KW_ASSIGN_OR_RETURN(proc, core::Process::Launch(opts.command, lo));
    if (absl::Status st = proc->RunToEntry(); !st.ok()) {
      (void)proc->Kill();
      return st;
    }
  }
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
  for (KernelWatch& w : watches) {
    for (const pid_t tid : proc->TracedThreads()) {
      watch::BreakpointRequest req;
      req.addr = core::RemoteAddr{w.addr};
      req.len = w.len;
      req.kind = kind;
      req.tid = tid;
      req.inherit = true;
      req.exclude_kernel = false;
      req.exclude_user = true;
      req.callchain_frames = opts.stack ? static_cast<uint16_t>(opts.stack_depth) : 0;
      auto bp = watch::PerfBreakpoint::Open(req);
      if (!bp.ok()) {
        return fail(absl::Status(
            bp.status().code(), absl::StrCat("arming '", w.display, "': ", bp.status().message())));
      }
      w.bps.push_back(*std::move(bp));
    }
  }
  if (absl::Status st = proc->ResumeAll(); !st.ok()) {
    return fail(st);
  }
  KernelLinesNote(opts, *ksyms);
  const std::string prog = proc->argv().empty() ? "?" : proc->argv()[0];
  auto code = RunBreakpointLoop(
      opts, watches, *ksyms, kind,
      absl::StrFormat("armed %d watch%s on pid %d (%s) for the kernel's accesses only "
                      "(exclude_user), perf breakpoint stream mode%s",
                      watches.size(), watches.size() == 1 ? "" : "es", proc->pid(), prog,
                      StackNote(opts)),
      proc.get(), syms->get());
  if (!code.ok()) {
    return fail(code.status());
  }
  return code;
}

}  // namespace

const char kKernelIfRefusal[] =
    "--if needs the values of each access, and kernel watches (and --kernel-accesses) are "
    "perf breakpoint streams that read no memory at the access; leave --if out and filter "
    "the --json events (tid, cpu, comm, site)";

int KernelMain(const Options& opts) {
  if (opts.read) {
    std::fprintf(stderr,
                 "kwatch: error: --read is not available for kernel watches: kwatch tells reads "
                 "from writes by decoding the accessing instruction, and it does not read kernel "
                 "code; use --rw\n");
    return 2;
  }
  if (!opts.output.empty() || opts.backend == "page") {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 !opts.output.empty()
                     ? "recording kernel watches (-o) is not supported yet"
                     : "kernel watches use hardware breakpoints only (--backend page protects "
                       "a process's pages)");
    return 2;
  }
  if (opts.stop || opts.backend == "stop") {
    std::fprintf(stderr,
                 "kwatch: error: stop mode stops a process's threads through ptrace; kernel "
                 "watches use CPU-wide perf breakpoints (leave --stop out)\n");
    return 2;
  }
  if (!opts.condition.empty()) {
    std::fprintf(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
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
    std::fprintf(stderr, "kwatch: error: %s\n", kKernelIfRefusal);
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
