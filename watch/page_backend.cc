#include "watch/page_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/ptrace/remote_exec.h"
#include "core/x86/x86_access.h"
#include "core/x86/x86_emulate.h"

namespace kwatch::watch {

namespace {

constexpr uint64_t kPageSize = 4096;
// Buffers up to this size are bounced through scratch memory; larger ones get their pages
// opened instead.
constexpr uint64_t kMaxBounce = 16ULL << 20;
constexpr uint64_t kScratchQuantum = 64ULL << 10;
// How long a call opened with the other threads stopped may run before kwatch lets them go.
constexpr absl::Duration kAloneMax = absl::Milliseconds(20);

uint64_t ArgOf(const user_regs_struct& r, int i) {
  switch (i) {
    case 0:
      return r.rdi;
    case 1:
      return r.rsi;
    case 2:
      return r.rdx;
    case 3:
      return r.r10;
    case 4:
      return r.r8;
    default:
      return r.r9;
  }
}

void SetArg(user_regs_struct& r, int i, uint64_t v) {
  switch (i) {
    case 0:
      r.rdi = v;
      break;
    case 1:
      r.rsi = v;
      break;
    case 2:
      r.rdx = v;
      break;
    case 3:
      r.r10 = v;
      break;
    case 4:
      r.r8 = v;
      break;
    default:
      r.r9 = v;
      break;
  }
}

// Copies `size` bytes inside the target, through kwatch (protections do not apply).
absl::Status CopyRemote(const core::ptrace::Process& proc, uint64_t from, uint64_t to,
                        uint64_t size) {
  std::vector<uint8_t> buf(std::min<uint64_t>(size, kScratchQuantum));
  for (uint64_t off = 0; off < size;) {
    const uint64_t n = std::min<uint64_t>(size - off, buf.size());
    const std::span<uint8_t> chunk(buf.data(), n);
    KW_RETURN_IF_ERROR(proc.ReadMemory(core::RemoteAddr{from + off}, chunk));
    KW_RETURN_IF_ERROR(proc.WriteMemory(core::RemoteAddr{to + off}, chunk));
    off += n;
  }
  return absl::OkStatus();
}

uint64_t PageOf(uint64_t addr) {
  return addr & ~(kPageSize - 1);
}

std::string ProtText(int prot) {
  if (prot == PROT_NONE) {
    return "---";
  }
  return absl::StrCat((prot & PROT_READ) != 0 ? "r" : "-", (prot & PROT_WRITE) != 0 ? "w" : "-",
                      (prot & PROT_EXEC) != 0 ? "x" : "-");
}

// SIG_DFL and SIG_IGN as rt_sigaction's handler word.
constexpr uint64_t kSigDfl = 0;
constexpr uint64_t kSigIgn = 1;

// The bit of signal `sig` in the kernel's signal masks (sigcatch, rt_sigaction's sa_mask).
constexpr uint64_t SigBit(int sig) {
  return uint64_t{1} << (sig - 1);
}

// The sigcatch mask (field 34) of a /proc/PID/stat text; nullopt when it does not parse.
std::optional<uint64_t> SigCatchOf(absl::string_view stat) {
  // The command name (field 2) may hold spaces and parentheses: count from its last ')'.
  const size_t paren = stat.rfind(')');
  if (paren == absl::string_view::npos) {
    return std::nullopt;
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(paren + 1), ' ', absl::SkipEmpty());
  constexpr size_t kSigCatch = 34 - 3;  // fields from 3 (state) on
  uint64_t caught = 0;
  if (fields.size() <= kSigCatch || !absl::SimpleAtoi(fields[kSigCatch], &caught)) {
    return std::nullopt;
  }
  return caught;
}

}  // namespace

absl::Status PageBackend::ProtectIn(core::ptrace::Process& proc, pid_t tid, uint64_t page,
                                    int prot) {
  return core::ptrace::RemoteMprotect(
      proc, tid, core::RemoteAddr{page}, kPageSize, prot,
      absl::StrFormat("mprotect(0x%x, %s) in pid %d", page, ProtText(prot), proc.pid()));
}

absl::Status PageBackend::Protect(pid_t tid, uint64_t page, int prot) {
  return ProtectIn(proc_, tid, page, prot);
}

absl::Status PageBackend::OnFork(core::ptrace::Process& child) {
  if (!armed_) {
    return absl::OkStatus();
  }
  for (const auto& [addr, page] : pages_) {
    KW_RETURN_IF_ERROR(ProtectIn(child, child.pid(), addr, page.original));
  }
  UnmapScratch(child, child.pid());
  return absl::OkStatus();
}

void PageBackend::OnFollowedFork(core::ptrace::Process& child, pid_t /*parent_tid*/) {
  fork_cleanup_[child.pid()] = OnFork(child);
}

absl::Status PageBackend::TakeForkCleanup(pid_t pid) {
  auto it = fork_cleanup_.find(pid);
  if (it == fork_cleanup_.end()) {
    return absl::OkStatus();
  }
  absl::Status s = std::move(it->second);
  fork_cleanup_.erase(it);
  return s;
}

absl::Status PageBackend::Arm() {
  if (armed_) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc_.Maps());
  std::map<uint64_t, Page> pages;
  std::set<uint64_t> reads_count;
  for (const Watch& w : watches_) {
    if (w.request.kind == drmgr::DrKind::kExec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", w.target.display, "': page-protection watches cover data, not execution"));
    }
    const uint64_t first = PageOf(w.target.addr.value);
    const uint64_t last = PageOf(w.target.addr.value + w.target.length - 1);
    for (uint64_t p = first; p <= last; p += kPageSize) {
      const auto m = core::ptrace::FindMapping(maps, core::RemoteAddr{p});
      if (!m.has_value()) {
        return absl::FailedPreconditionError(absl::StrFormat("'%s': 0x%x is not mapped in pid %d",
                                                             w.target.display, p, proc_.pid()));
      }
      Page& page = pages[p];
      page.original =
          (m->read ? PROT_READ : 0) | (m->write ? PROT_WRITE : 0) | (m->exec ? PROT_EXEC : 0);
      // Write watches keep the page readable; a watch that counts reads takes it all.
      if (w.request.kind != drmgr::DrKind::kWrite) {
        reads_count.insert(p);
      }
      page.armed = reads_count.contains(p) ? PROT_NONE : (page.original & ~PROT_WRITE);
    }
  }
  if (guardian_ == nullptr) {
    // Journal room for these pages and those of an exec's re-arm.
    KW_ASSIGN_OR_RETURN(guardian_, core::ptrace::Guardian::Start(
                                       proc_.pid(), std::max<size_t>(256, 2 * pages.size())));
  }
  KW_RETURN_IF_ERROR(proc_.StopAll());
  absl::Cleanup resume = [this] { (void)proc_.ResumeAll(); };
  const pid_t tid = proc_.AnyStoppedThread();
  if (tid == 0) {
    return absl::FailedPreconditionError("no thread of the target could be stopped");
  }
  if (absl::Status s = LearnHandler(tid); !s.ok()) {
    UnmapScratch(proc_, tid);
    return s;
  }
  std::vector<uint64_t> done;
  for (const auto& [addr, page] : pages) {
    absl::StatusOr<core::ptrace::Guardian::Handle> journaled =
        guardian_->RecordProtection(core::RemoteAddr{addr}, kPageSize, page.original);
    absl::Status s = journaled.ok() ? Protect(tid, addr, page.armed) : journaled.status();
    if (!s.ok()) {
      for (uint64_t d : done) {  // all or nothing
        (void)Protect(tid, d, pages[d].original);
      }
      UnmapScratch(proc_, tid);
      guardian_->ForgetAll();
      return s;
    }
    done.push_back(addr);
  }
  pages_ = std::move(pages);
  armed_ = true;
  proc_.AddInterceptor(this);
  // The kernel's accesses to these pages come through system calls: watch them too.
  proc_.SetSyscallStops(true);
  return absl::OkStatus();
}

void PageBackend::Disarm() {
  if (!armed_) {
    return;
  }
  // Claims stay on while the world stops, so that faults already raised are not mistaken
  // for the target's own.
  if (proc_.alive() && proc_.StopAll().ok()) {
    // Calls in flight (interrupted by the stop) settle first: bounced buffers are copied back
    // and their arguments restored, calls that failed on a protected page are set to re-run.
    disarming_ = true;
    if (absl::Status s = proc_.SettleSyscallStops(); !s.ok()) {
      std::fprintf(stderr, "kwatch: settling system calls in pid %d: %s\n", proc_.pid(),
                   std::string{s.message()}.c_str());
    }
    disarming_ = false;
    const pid_t tid = proc_.AnyStoppedThread();
    for (const auto& [addr, page] : pages_) {
      const absl::Status s = tid != 0 ? Protect(tid, addr, page.original)
                                      : absl::FailedPreconditionError("no stopped thread");
      if (!s.ok()) {
        std::fprintf(stderr, "kwatch: cannot restore the protection of page 0x%lx in pid %d: %s\n",
                     static_cast<unsigned long>(addr), proc_.pid(),
                     std::string{s.message()}.c_str());
      }
    }
    if (tid != 0) {
      UnmapScratch(proc_, tid);
    }
    for (auto& [addr, page] : pages_) {
      page.holds = 0;
    }
    if (guardian_ != nullptr) {
      guardian_->ForgetAll();
      (void)guardian_->Dismiss();
      guardian_.reset();
    }
    close_pending_.clear();
    armed_ = false;
    draining_ = true;
    proc_.SetSyscallStops(false);
    (void)proc_.ResumeAll();
  }
  armed_ = false;
  draining_ = true;
  proc_.SetSyscallStops(false);
}

void PageBackend::Forget() {
  // The pages belonged to the old image: nothing to restore, and no fault of theirs can come.
  if (guardian_ != nullptr) {
    guardian_->ForgetAll();
  }
  armed_ = false;
  draining_ = false;
  pages_.clear();
  code_cache_.clear();
  calls_.clear();
  scratch_.clear();
  close_pending_.clear();
  handler_.reset();  // exec resets caught signals to SIG_DFL
  stat_fd_.Reset();
  proc_.SetSyscallStops(false);
  proc_.RemoveInterceptor(this);
}

PageBackend::~PageBackend() {
  Disarm();
  proc_.RemoveInterceptor(this);
}

bool PageBackend::Claims(pid_t /*tid*/, const siginfo_t& si) {
  if ((!armed_ && !draining_) || si.si_signo != SIGSEGV || si.si_code != SEGV_ACCERR) {
    return false;
  }
  const auto addr = reinterpret_cast<uint64_t>(si.si_addr);
  return pages_.contains(PageOf(addr));
}

absl::Status PageBackend::ReadValue(uint64_t addr, uint32_t size, uint64_t& out) const {
  std::array<uint8_t, 8> buf{};
  KW_RETURN_IF_ERROR(proc_.ReadMemory(core::RemoteAddr{addr},
                                      std::span<uint8_t>(buf).first(std::min<uint32_t>(size, 8))));
  std::memcpy(&out, buf.data(), buf.size());
  return absl::OkStatus();
}

void PageBackend::Match(const absl::StatusOr<core::x86::DecodedAccess>& decoded, uint64_t fault,
                        std::vector<Hit>& hits, std::vector<uint64_t>& touched) const {
  touched.push_back(PageOf(fault));
  if (!decoded.ok()) {
    // Undecodable: attribute by the fault address alone.
    for (const Watch& w : watches_) {
      if (fault >= w.target.addr.value && fault < w.target.addr.value + w.target.length) {
        Hit h{w.id, core::AccessKind::kRead, fault, 1, 0};
        (void)ReadValue(h.addr, h.size, h.old_value);
        hits.push_back(h);
      }
    }
    return;
  }
  for (const core::x86::MemoryOperand& m : decoded->memory) {
    for (uint64_t p = PageOf(m.addr); p < m.addr + m.size; p += kPageSize) {
      if (pages_.contains(p) && std::find(touched.begin(), touched.end(), p) == touched.end()) {
        touched.push_back(p);
      }
    }
  }
  MatchWatches(watches_, *decoded, hits);
}

void PageBackend::MatchWatches(const std::vector<Watch>& ws,
                               const core::x86::DecodedAccess& decoded,
                               std::vector<Hit>& hits) const {
  for (const core::x86::MemoryOperand& m : decoded.memory) {
    for (const Watch& w : ws) {
      const uint64_t a = w.target.addr.value;
      if (m.addr >= a + w.target.length || m.addr + m.size <= a) {
        continue;
      }
      const core::AccessKind kind = m.write ? core::AccessKind::kWrite : core::AccessKind::kRead;
      if (w.request.kind == drmgr::DrKind::kWrite && kind != core::AccessKind::kWrite) {
        continue;
      }
      // The bytes of the operand that lie inside the watched range.
      const uint64_t lo = std::max(m.addr, a);
      const uint64_t hi = std::min(m.addr + m.size, a + w.target.length);
      Hit h{w.id, kind, lo, static_cast<uint32_t>(hi - lo), 0};
      (void)ReadValue(h.addr, h.size, h.old_value);
      hits.push_back(h);
    }
  }
}

const Watch& PageBackend::WatchById(uint32_t id) const {
  // The session may give this backend only some of its watches: find by id.
  auto it =
      std::find_if(watches_.begin(), watches_.end(), [&](const Watch& x) { return x.id == id; });
  if (it == watches_.end()) {
    KW_CHECK(register_watches_ != nullptr);
    it = std::find_if(register_watches_->begin(), register_watches_->end(),
                      [&](const Watch& x) { return x.id == id; });
    KW_CHECK(it != register_watches_->end());
  }
  return *it;
}

void PageBackend::Record(pid_t tid, uint64_t rip, const std::vector<Hit>& hits) {
  if (hits.empty()) {
    ++unrelated_;
    return;
  }
  const uint64_t now = core::MonotonicNs();
  const uint32_t stack = CaptureStack(tid);
  for (const Hit& h : hits) {
    const Watch& w = WatchById(h.watch_id);
    core::AccessEvent ev;
    ev.time_ns = now;
    ev.pid = proc_.pid();
    ev.tid = tid;
    ev.watch_id = h.watch_id;
    ev.trap_ip = core::RemoteAddr{rip};
    ev.ip = core::RemoteAddr{rip};
    ev.addr = w.target.addr;
    ev.len = static_cast<uint32_t>(w.target.length);
    ev.access_addr = core::RemoteAddr{h.addr};
    ev.access_size = h.size;
    ev.kind = h.kind;
    ev.old_value = h.old_value;
    ev.stack_id = stack;
    uint64_t v = h.old_value;
    if (h.kind == core::AccessKind::kRead || ReadValue(h.addr, h.size, v).ok()) {
      ev.value = v;  // a load leaves the bytes as they were
    }
    ev.value_exact = true;
    events_.push_back(ev);
  }
}

std::span<const uint8_t> PageBackend::CodeAt(uint64_t rip) {
  // Code does not change under a watch (kwatch patches none here): read it once per address.
  auto cached = code_cache_.find(rip);
  if (cached == code_cache_.end()) {
    Code code;
    code.size = code.bytes.size();
    // The instruction may sit at the end of a mapping: read less if need be.
    while (
        code.size > 0 &&
        !proc_.ReadMemory(core::RemoteAddr{rip}, std::span<uint8_t>(code.bytes.data(), code.size))
             .ok()) {
      code.size /= 2;
    }
    cached = code_cache_.emplace(rip, code).first;
  }
  return {cached->second.bytes.data(), cached->second.size};
}

absl::StatusOr<bool> PageBackend::HandleInPlace(pid_t tid, const siginfo_t& si) {
  KW_ASSIGN_OR_RETURN(const bool reset, HandlerReset());
  if (reset) {
    return false;  // put back by Handle, with every thread stopped (a remote rt_sigaction)
  }
  if (!armed_) {
    return true;  // a late fault of a disarmed page: drop it, the access re-runs unprotected
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
  const uint64_t rip = regs.rip;
  const std::span<const uint8_t> code = CodeAt(rip);
  auto decoded = core::x86::DecodeAccess(code, rip, regs);
  std::vector<Hit> hits;
  std::vector<uint64_t> touched;
  Match(decoded, reinterpret_cast<uint64_t>(si.si_addr), hits, touched);
  // Emulated, the access never reaches the debug registers: it is reported for their watches
  // here (old values read before it).
  std::vector<Hit> register_hits;
  if (register_watches_ != nullptr && decoded.ok()) {
    MatchWatches(*register_watches_, *decoded, register_hits);
  }
  core::x86::EmulatorMemory mem;
  mem.read = [this](uint64_t addr, std::span<uint8_t> out) {
    return proc_.ReadMemory(core::RemoteAddr{addr}, out);
  };
  mem.write = [this](uint64_t addr, std::span<const uint8_t> data) {
    return proc_.WriteMemory(core::RemoteAddr{addr}, data);
  };
  KW_ASSIGN_OR_RETURN(const std::optional<core::x86::EmulatedAccess> done,
                      core::x86::EmulateDataMove(code, regs, mem));
  if (!done.has_value()) {
    return false;  // not a plain move: single-step it with the world stopped
  }
  KW_RETURN_IF_ERROR(proc_.SetRegs(tid, regs));
  ++emulated_;
  hits.insert(hits.end(), register_hits.begin(), register_hits.end());
  Record(tid, rip, hits);
  return true;
}

absl::Status PageBackend::Handle(pid_t tid, const siginfo_t& si) {
  KW_ASSIGN_OR_RETURN(const bool reset, HandlerReset());
  if (reset) {
    KW_RETURN_IF_ERROR(RestoreHandler(tid));
  }
  if (!armed_) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const user_regs_struct regs, proc_.GetRegs(tid));
  auto decoded = core::x86::DecodeAccess(CodeAt(regs.rip), regs.rip, regs);
  std::vector<Hit> hits;
  std::vector<uint64_t> touched;
  Match(decoded, reinterpret_cast<uint64_t>(si.si_addr), hits, touched);
  // Lift the protection, run the one instruction, protect again (a page a system call
  // holds open stays open).
  for (uint64_t p : touched) {
    if (pages_[p].holds == 0) {
      KW_RETURN_IF_ERROR(Protect(tid, p, pages_[p].original));
    }
  }
  KW_ASSIGN_OR_RETURN(const int stop, proc_.SingleStep(tid));
  if (stop == 0) {
    return absl::OkStatus();  // the process ended
  }
  for (uint64_t p : touched) {
    if (pages_[p].holds == 0) {
      KW_RETURN_IF_ERROR(Protect(tid, p, pages_[p].armed));
    }
  }
  ++stepped_;
  Record(tid, regs.rip, hits);
  return absl::OkStatus();
}

// ---- System calls ----

KernelAccessStats::Syscall& PageBackend::CallStats(uint64_t nr) {
  return kstats_.syscalls[SyscallName(nr)];
}

std::vector<uint64_t> PageBackend::BlockedPages(const std::vector<KernelRange>& ranges) const {
  std::vector<uint64_t> out;
  for (const KernelRange& r : ranges) {
    if (r.size == 0) {
      continue;
    }
    const uint64_t end = r.addr + r.size < r.addr ? ~0ULL : r.addr + r.size;
    for (auto it = pages_.lower_bound(PageOf(r.addr)); it != pages_.end() && it->first < end;
         ++it) {
      const Page& pg = it->second;
      bool blocks = false;
      switch (r.use) {
        case KernelUse::kRead:
        case KernelUse::kPage:
          blocks = (pg.original & PROT_READ) != 0 && (pg.armed & PROT_READ) == 0;
          break;
        case KernelUse::kWrite:
          blocks = (pg.original & PROT_WRITE) != 0 && (pg.armed & PROT_WRITE) == 0;
          break;
        case KernelUse::kReadWrite:
        case KernelUse::kUnknown:
          blocks = pg.armed != pg.original;
          break;
      }
      if (blocks) {
        out.push_back(it->first);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::Status PageBackend::ProtectRuns(pid_t tid, const std::vector<uint64_t>& pages, bool open) {
  for (size_t i = 0; i < pages.size();) {
    const auto prot_of = [&](uint64_t p) {
      const Page& pg = pages_.at(p);
      return open ? pg.original : pg.armed;
    };
    const int prot = prot_of(pages[i]);
    size_t j = i + 1;
    while (j < pages.size() && pages[j] == pages[j - 1] + kPageSize && prot_of(pages[j]) == prot) {
      ++j;
    }
    KW_RETURN_IF_ERROR(core::ptrace::RemoteMprotect(
        proc_, tid, core::RemoteAddr{pages[i]}, (j - i) * kPageSize, prot,
        absl::StrFormat("mprotect(0x%x, %d pages, %s) in pid %d", pages[i], j - i, ProtText(prot),
                        proc_.pid())));
    i = j;
  }
  return absl::OkStatus();
}

absl::Status PageBackend::OpenPages(pid_t tid, Call& c, const std::vector<uint64_t>& pages) {
  std::vector<uint64_t> closed;
  for (uint64_t p : pages) {
    if (pages_.at(p).holds == 0) {
      closed.push_back(p);
    }
  }
  KW_RETURN_IF_ERROR(ProtectRuns(tid, closed, /*open=*/true));
  for (uint64_t p : pages) {
    ++pages_.at(p).holds;
    c.held.push_back(p);
  }
  return absl::OkStatus();
}

absl::Status PageBackend::ReleasePages(pid_t via_tid, Call& c) {
  std::vector<uint64_t> to_close;
  for (uint64_t p : c.held) {
    auto it = pages_.find(p);
    if (it != pages_.end() && it->second.holds > 0 && --it->second.holds == 0 && armed_) {
      to_close.push_back(p);
    }
  }
  c.held.clear();
  if (via_tid == 0) {
    // No thread to run mprotect in now; every other thread is inside a system call and
    // passes a syscall stop before it runs user code again: the first one closes them.
    close_pending_.insert(close_pending_.end(), to_close.begin(), to_close.end());
    return absl::OkStatus();
  }
  std::sort(to_close.begin(), to_close.end());
  return ProtectRuns(via_tid, to_close, /*open=*/false);
}

absl::Status PageBackend::ClosePending(pid_t tid) {
  if (close_pending_.empty()) {
    return absl::OkStatus();
  }
  std::vector<uint64_t> pages;
  for (uint64_t p : close_pending_) {
    auto it = pages_.find(p);
    if (armed_ && it != pages_.end() && it->second.holds == 0) {
      pages.push_back(p);
    }
  }
  close_pending_.clear();
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return ProtectRuns(tid, pages, /*open=*/false);
}

void PageBackend::AddUnprotected(Call& c, uint64_t now_ns) {
  if (c.open_since_ns == 0) {
    return;
  }
  for (uint64_t p : c.held) {
    KernelAccessStats::Unprotected& u = kstats_.unprotected[{p, SyscallName(c.nr)}];
    ++u.times;
    u.ns += now_ns - c.open_since_ns;
  }
  c.open_since_ns = 0;
}

absl::StatusOr<int> PageBackend::TakeScratch(pid_t tid, uint64_t size) {
  for (size_t i = 0; i < scratch_.size(); ++i) {
    if (!scratch_[i].busy && scratch_[i].size >= size) {
      scratch_[i].busy = true;
      return static_cast<int>(i);
    }
  }
  const uint64_t sz = (size + kScratchQuantum - 1) / kScratchQuantum * kScratchQuantum;
  KW_ASSIGN_OR_RETURN(
      const core::RemoteAddr r,
      core::ptrace::RemoteMmap(
          proc_, tid, core::ptrace::RemoteMapping{0, sz, PROT_READ | PROT_WRITE, MAP_NORESERVE},
          absl::StrFormat("mmap(%d bytes of scratch) in pid %d", sz, proc_.pid())));
  scratch_.push_back({r.value, sz, true});
  return static_cast<int>(scratch_.size() - 1);
}

void PageBackend::UnmapScratch(core::ptrace::Process& proc, pid_t tid) {
  const bool child = &proc != &proc_;
  for (auto it = scratch_.begin(); it != scratch_.end();) {
    if (it->busy && !child) {
      ++it;  // a call still uses it: unmapped with its exit... or left (see Disarm)
      continue;
    }
    (void)core::ptrace::RemoteMunmap(proc, tid, core::RemoteAddr{it->addr}, it->size);
    it = child ? it + 1 : scratch_.erase(it);
  }
}

void PageBackend::SnapshotBefore(Call& c) {
  for (const KernelRange& r : c.model.ranges) {
    if (r.use != KernelUse::kWrite && r.use != KernelUse::kReadWrite) {
      continue;
    }
    for (const Watch& w : watches_) {
      const uint64_t a = w.target.addr.value;
      const uint64_t lo = std::max(r.addr, a);
      const uint64_t hi = std::min(r.addr + r.size, a + w.target.length);
      if (lo < hi) {
        Before b{w.id, lo, 0};
        (void)ReadValue(lo, static_cast<uint32_t>(std::min<uint64_t>(hi - lo, 8)), b.value);
        c.before.push_back(b);
      }
    }
  }
}

void PageBackend::RecordKernel(pid_t tid, const Call& c, int64_t ret) {
  KernelAccessStats::Syscall& cs = CallStats(c.nr);
  const uint64_t now = core::MonotonicNs();
  for (const KernelRange& r : TouchedRanges(c.nr, c.model, ret)) {
    for (const Watch& w : watches_) {
      const uint64_t a = w.target.addr.value;
      const uint64_t lo = std::max(r.addr, a);
      const uint64_t hi = std::min(r.addr + r.size, a + w.target.length);
      if (lo >= hi) {
        continue;
      }
      const core::AccessKind kind =
          r.use == KernelUse::kRead ? core::AccessKind::kRead : core::AccessKind::kWrite;
      if (w.request.kind == drmgr::DrKind::kWrite && kind != core::AccessKind::kWrite) {
        continue;
      }
      const auto size = static_cast<uint32_t>(std::min<uint64_t>(hi - lo, 8));
      uint64_t now_value = 0;
      (void)ReadValue(lo, size, now_value);
      uint64_t old_value = now_value;
      for (const Before& b : c.before) {
        if (b.watch_id == w.id && b.addr == lo) {
          old_value = b.value;
          break;
        }
      }
      core::AccessEvent ev;
      ev.time_ns = now;
      ev.pid = proc_.pid();
      ev.tid = tid;
      ev.watch_id = w.id;
      ev.trap_ip = core::RemoteAddr{c.ip};
      ev.ip = core::RemoteAddr{c.ip - 2};  // the syscall instruction
      ev.addr = w.target.addr;
      ev.len = static_cast<uint32_t>(w.target.length);
      ev.access_addr = core::RemoteAddr{lo};
      ev.access_size = static_cast<uint32_t>(hi - lo);
      ev.kind = kind;
      ev.old_value = old_value;
      ev.value = now_value;
      ev.value_exact = true;
      events_.push_back(ev);
      ++cs.events;
    }
  }
  if (!c.model.known) {
    // A pointer argument into watched bytes: the kernel may have used them, how is unknown.
    for (const KernelRange& r : c.model.ranges) {
      const bool inside = std::any_of(watches_.begin(), watches_.end(), [&](const Watch& w) {
        return r.addr >= w.target.addr.value && r.addr < w.target.addr.value + w.target.length;
      });
      if (inside) {
        ++cs.unknown;
        break;
      }
    }
  }
}

absl::Status PageBackend::SetupBounce(pid_t tid, Call& c) {
  const Bounce& b = *c.model.bounce;
  KW_ASSIGN_OR_RETURN(const int i, TakeScratch(tid, b.size));
  absl::Cleanup release = [&] { scratch_[i].busy = false; };
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
  const uint64_t real = ArgOf(regs, b.arg);
  if (b.in) {
    KW_RETURN_IF_ERROR(CopyRemote(proc_, real, scratch_[i].addr, b.size));
  }
  SetArg(regs, b.arg, scratch_[i].addr);
  KW_RETURN_IF_ERROR(proc_.SetRegs(tid, regs));
  std::move(release).Cancel();
  c.scratch = i;
  c.bounced_arg = real;
  return absl::OkStatus();
}

absl::Status PageBackend::FinishBounce(pid_t tid, Call& c, int64_t ret, bool copy_out) {
  const Bounce& b = *c.model.bounce;
  Scratch& s = scratch_[c.scratch];
  absl::Cleanup release = [&] {
    s.busy = false;
    c.scratch = -1;
  };
  if (copy_out) {
    KW_RETURN_IF_ERROR(CopyRemote(proc_, s.addr, c.bounced_arg, BounceOutBytes(b, ret)));
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
  SetArg(regs, b.arg, c.bounced_arg);  // the ABI keeps argument registers across a call
  return proc_.SetRegs(tid, regs);
}

absl::Status PageBackend::OnSyscallStop(pid_t tid, const core::ptrace::SyscallStop& st,
                                        bool world_stopped) {
  kstats_.syscall_stops = proc_.syscall_stop_count();
  absl::Status s = ClosePending(tid);
  if (s.ok()) {
    s = st.entry ? OnEntry(tid, st, world_stopped) : OnExit(tid, st, world_stopped);
  }
  if (!s.ok() && (!proc_.alive() || !absl::c_linear_search(proc_.TracedThreads(), tid))) {
    // The thread (or the process) ended under kwatch's hands: nothing is left to look after.
    calls_.erase(tid);
    return absl::OkStatus();
  }
  return s;
}

absl::Status PageBackend::OnEntry(pid_t tid, const core::ptrace::SyscallStop& st,
                                  bool world_stopped) {
  if (auto it = calls_.find(tid); it != calls_.end()) {
    // What a call that ended with a restart code still held (the restart, or whatever the
    // thread does next, starts afresh).
    Call old = std::move(it->second);
    calls_.erase(it);
    AddUnprotected(old, core::MonotonicNs());
    KW_RETURN_IF_ERROR(ReleasePages(tid, old));
  }
  if (!armed_ || disarming_) {
    return absl::OkStatus();
  }
  const auto read = [this](uint64_t addr, std::span<uint8_t> out) {
    return proc_.ReadMemory(core::RemoteAddr{addr}, out).ok();
  };
  Call c;
  c.nr = st.nr;
  c.ip = st.ip;
  c.model = ModelSyscall(st.nr, st.args, read);
  std::vector<uint64_t> blocked = BlockedPages(c.model.ranges);
  if (blocked.empty()) {
    return absl::OkStatus();  // the common case: nothing protected in reach
  }
  KernelAccessStats::Syscall& cs = CallStats(c.nr);
  ++cs.calls;
  SnapshotBefore(c);
  if (c.model.bounce.has_value() && c.model.bounce->size <= kMaxBounce &&
      !BlockedPages({c.model.ranges[0]}).empty()) {
    // Without scratch memory (mmap refused) the pages are opened instead.
    if (SetupBounce(tid, c).ok()) {
      ++cs.bounced;
      const std::vector<KernelRange> rest(c.model.ranges.begin() + 1, c.model.ranges.end());
      blocked = BlockedPages(rest);
    }
  }
  Call& call = calls_[tid] = std::move(c);
  if (blocked.empty()) {
    return absl::OkStatus();
  }
  ++cs.opened;
  if (call.model.lifecycle) {
    // clone, exec, exit: never run alone; the page stays open until the call returns.
    KW_RETURN_IF_ERROR(OpenPages(tid, call, blocked));
    if (proc_.TracedThreads().size() > 1) {
      call.open_since_ns = core::MonotonicNs();
    }
    return absl::OkStatus();
  }
  const bool stop_others = !world_stopped && proc_.TracedThreads().size() > 1;
  if (stop_others) {
    KW_RETURN_IF_ERROR(proc_.StopUserCode());
  }
  absl::Status s = OpenPages(tid, call, blocked);
  if (s.ok()) {
    s = RunOpen(tid, call, /*world_stopped=*/true);  // `call` may be gone after this
  }
  if (stop_others) {
    const absl::Status r = proc_.ResumeAll();
    if (s.ok()) {
      s = r;
    }
  }
  return s;
}

absl::Status PageBackend::RunOpen(pid_t tid, Call& c, bool world_stopped) {
  KW_ASSIGN_OR_RETURN(const core::ptrace::SyscallOutcome out, proc_.FinishSyscall(tid, kAloneMax));
  switch (out.kind) {
    case core::ptrace::SyscallOutcome::Kind::kReturned:
      KW_RETURN_IF_ERROR(OnSigaction(out.exit));
      return ExitCall(tid, c, out.exit, world_stopped);
    case core::ptrace::SyscallOutcome::Kind::kBlocked: {
      if (c.model.start_only && !c.retried) {
        // The call used its memory before it went to sleep (futex wait): protect again now,
        // through a thread that is stopped (or the next one to pass a syscall stop).
        const pid_t other = proc_.AnyStoppedThread();
        return ReleasePages(other != tid ? other : 0, c);
      }
      if (proc_.TracedThreads().size() > 1) {
        c.open_since_ns = core::MonotonicNs();  // others run while the page is open
      }
      return absl::OkStatus();
    }
    case core::ptrace::SyscallOutcome::Kind::kGone: {
      Call gone = std::move(c);
      calls_.erase(tid);
      const pid_t other = proc_.AnyStoppedThread();
      if (other != 0 && proc_.alive()) {
        return ReleasePages(other, gone);
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status PageBackend::RunAgainAfterEfault(pid_t tid, Call& c, bool world_stopped) {
  ++CallStats(c.nr).retried;
  c.retried = true;
  if (!armed_ || disarming_) {
    // The pages are (being) restored: the call only has to run again.
    Call done = std::move(c);
    calls_.erase(tid);
    AddUnprotected(done, core::MonotonicNs());
    (void)ReleasePages(tid, done);
    return proc_.RestartSyscall(tid);
  }
  // Which protected page the kernel met is unknown (a pointer inside a structure): open them
  // all for the second run.
  std::vector<uint64_t> all;
  for (const auto& [addr, pg] : pages_) {
    if (pg.armed != pg.original && std::find(c.held.begin(), c.held.end(), addr) == c.held.end()) {
      all.push_back(addr);
    }
  }
  const bool stop_others = !world_stopped && proc_.TracedThreads().size() > 1;
  if (stop_others) {
    KW_RETURN_IF_ERROR(proc_.StopUserCode());
  }
  absl::Status s = OpenPages(tid, c, all);
  if (s.ok()) {
    s = proc_.RestartSyscall(tid);
    if (absl::IsUnimplemented(s)) {
      // Not made with `syscall`: it cannot run again; the program gets its EFAULT.
      Call done = std::move(c);
      calls_.erase(tid);
      s = ReleasePages(tid, done);
    } else if (s.ok()) {
      s = RunOpen(tid, c, /*world_stopped=*/true);
    }
  }
  if (stop_others) {
    const absl::Status r = proc_.ResumeAll();
    if (s.ok()) {
      s = r;
    }
  }
  return s;
}

absl::Status PageBackend::OnExit(pid_t tid, const core::ptrace::SyscallStop& st,
                                 bool world_stopped) {
  KW_RETURN_IF_ERROR(OnSigaction(st));
  auto it = calls_.find(tid);
  if (it == calls_.end()) {
    // A call kwatch did not look after: only an EFAULT on a protected page concerns it
    // (rt_sigreturn's "result" is the interrupted code's rax, not its own).
    if (st.ret != -EFAULT || pages_.empty() || !(armed_ || disarming_) ||
        st.nr == SYS_rt_sigreturn) {
      return absl::OkStatus();
    }
    Call& c = calls_[tid];
    c.nr = st.nr;
    c.ip = st.ip;
    c.unseen = true;
    ++CallStats(c.nr).calls;
    return RunAgainAfterEfault(tid, c, world_stopped);
  }
  return ExitCall(tid, it->second, st, world_stopped);
}

absl::Status PageBackend::ExitCall(pid_t tid, Call& c, const core::ptrace::SyscallStop& st,
                                   bool world_stopped) {
  const int64_t ret = st.ret;
  if (ret == -EFAULT && !c.retried && (armed_ || disarming_) && c.nr != SYS_rt_sigreturn) {
    return RunAgainAfterEfault(tid, c, world_stopped);
  }
  if (ret == -EFAULT && c.retried && c.unseen) {
    // It fails with every page open: the program's own EFAULT, not kwatch's doing.
    KernelAccessStats::Syscall& cs = CallStats(c.nr);
    --cs.calls;
    --cs.retried;
  }
  if (IsRestartResult(ret)) {
    // Not over: interrupted by a signal, to run again (or fail with EINTR) after it. The
    // buffer argument goes back to the program's own; what is held stays held until the
    // thread's next call.
    if (c.scratch >= 0) {
      KW_RETURN_IF_ERROR(FinishBounce(tid, c, ret, /*copy_out=*/false));
    }
    c.restarting = true;
    if (!c.held.empty() && c.open_since_ns == 0 && proc_.TracedThreads().size() > 1) {
      c.open_since_ns = core::MonotonicNs();
    }
    return absl::OkStatus();
  }
  absl::Status s = absl::OkStatus();
  if (c.scratch >= 0) {
    s = FinishBounce(tid, c, ret, /*copy_out=*/true);
  }
  RecordKernel(tid, c, ret);
  AddUnprotected(c, core::MonotonicNs());
  Call done = std::move(c);
  calls_.erase(tid);
  const absl::Status r = ReleasePages(tid, done);
  return s.ok() ? r : s;
}

// ---- The program's SIGSEGV handler ----

absl::StatusOr<bool> PageBackend::SegvCaught() {
  if (!stat_fd_.valid()) {
    const std::string path = absl::StrCat("/proc/", proc_.pid(), "/stat");
    stat_fd_.Reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!stat_fd_.valid()) {
      const int err = errno;
      return core::SyscallError(err, absl::StrCat("open(", path, ")"));
    }
  }
  // Read again from the start: the kernel writes the text afresh (seq_file).
  std::array<char, 1024> buf{};
  const ssize_t n = ::pread(stat_fd_.get(), buf.data(), buf.size() - 1, 0);
  if (n < 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("read(/proc/", proc_.pid(), "/stat)"));
  }
  const std::optional<uint64_t> caught =
      SigCatchOf(absl::string_view(buf.data(), static_cast<size_t>(n)));
  if (!caught.has_value()) {
    return absl::InternalError(
        absl::StrCat("/proc/", proc_.pid(), "/stat has no signal masks kwatch can read"));
  }
  return (*caught & SigBit(SIGSEGV)) != 0;
}

absl::Status PageBackend::LearnHandler(pid_t tid) {
  handler_.reset();
  KW_ASSIGN_OR_RETURN(const bool caught, SegvCaught());
  if (!caught) {
    return absl::OkStatus();
  }
  const auto refuse = [this](const absl::Status& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pid ", proc_.pid(), " handles SIGSEGV itself and kwatch cannot read its handler (",
        why.message(),
        "): page mode would lose the handler the first time the program touched a watched page "
        "with SIGSEGV blocked (the kernel resets it then); use --backend perf or --stop"));
  };
  absl::StatusOr<int> slot = TakeScratch(tid, sizeof(KernelSigaction));
  if (!slot.ok()) {
    return refuse(slot.status());
  }
  Scratch& s = scratch_[*slot];
  absl::Cleanup release = [&s] { s.busy = false; };
  const std::array<uint64_t, 4> args = {SIGSEGV, 0, s.addr, sizeof(uint64_t)};
  absl::StatusOr<int64_t> r = proc_.RemoteSyscall(tid, SYS_rt_sigaction, args);
  if (r.ok() && *r < 0) {
    r = core::SyscallError(static_cast<int>(-*r), "rt_sigaction(SIGSEGV, NULL, &old)");
  }
  if (!r.ok()) {
    return refuse(r.status());
  }
  KernelSigaction act;
  if (absl::Status read =
          proc_.ReadMemory(core::RemoteAddr{s.addr},
                           std::span<uint8_t>(reinterpret_cast<uint8_t*>(&act), sizeof act));
      !read.ok()) {
    return refuse(read);
  }
  if (act.handler != kSigDfl && act.handler != kSigIgn) {
    handler_ = act;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PageBackend::HandlerReset() {
  if (!handler_.has_value()) {
    return false;
  }
  KW_ASSIGN_OR_RETURN(const bool caught, SegvCaught());
  // The program's own rt_sigaction calls keep handler_ current: a handler gone is the kernel's
  // reset.
  return !caught;
}

absl::Status PageBackend::RestoreHandler(pid_t tid) {
  if ((handler_->flags & SA_RESETHAND) != 0) {
    // A handler for one fault: the kernel reset it at its delivery (SA_RESETHAND), or at a
    // fault of kwatch's while SIGSEGV was blocked, which look the same. Left as the flag asks
    // (inside that handler, the usual place of a blocked SIGSEGV, it was reset already).
    ++handler_resets_kept_;
    handler_.reset();
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const int slot, TakeScratch(tid, sizeof(KernelSigaction)));
  Scratch& s = scratch_[slot];
  absl::Cleanup release = [&s] { s.busy = false; };
  const KernelSigaction act = *handler_;
  KW_RETURN_IF_ERROR(proc_.WriteMemory(
      core::RemoteAddr{s.addr},
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&act), sizeof act)));
  const std::array<uint64_t, 4> args = {SIGSEGV, s.addr, 0, sizeof(uint64_t)};
  KW_ASSIGN_OR_RETURN(const int64_t r, proc_.RemoteSyscall(tid, SYS_rt_sigaction, args));
  if (r < 0) {
    return core::SyscallError(
        static_cast<int>(-r),
        absl::StrFormat("rt_sigaction(SIGSEGV) putting back the handler at 0x%x in pid %d, which "
                        "the kernel reset when thread %d touched a watched page with SIGSEGV "
                        "blocked",
                        act.handler, proc_.pid(), tid));
  }
  // The kernel unblocked SIGSEGV in the thread because it was blocked: block it again.
  uint64_t mask = 0;
  if (::ptrace(PTRACE_GETSIGMASK, tid, sizeof mask, &mask) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("ptrace(PTRACE_GETSIGMASK, ", tid, ")"));
  }
  mask |= SigBit(SIGSEGV);
  if (::ptrace(PTRACE_SETSIGMASK, tid, sizeof mask, &mask) != 0) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("ptrace(PTRACE_SETSIGMASK, ", tid, ")"));
  }
  ++handler_restores_;
  return absl::OkStatus();
}

void PageBackend::Drop(pid_t tid, const siginfo_t& /*si*/) {
  // A fault kwatch lets go of unhandled (it detaches): the access runs again on the restored
  // page, but a handler the kernel reset at the fault would stay lost.
  const absl::StatusOr<bool> reset = HandlerReset();
  absl::Status s = reset.ok() ? absl::OkStatus() : reset.status();
  if (s.ok() && *reset) {
    s = RestoreHandler(tid);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kwatch: cannot put back the SIGSEGV handler of pid %d: %s\n", proc_.pid(),
                 std::string{s.message()}.c_str());
  }
}

absl::Status PageBackend::OnSigaction(const core::ptrace::SyscallStop& exit) {
  // The kernel takes the signal number as an int: the register's high half does not count.
  if (exit.nr != SYS_rt_sigaction || static_cast<int>(exit.args[0]) != SIGSEGV ||
      exit.args[1] == 0 || exit.ret != 0) {
    return absl::OkStatus();
  }
  // The call only read `act` (still in rsi at its exit): the disposition it set.
  KernelSigaction act;
  if (absl::Status s =
          proc_.ReadMemory(core::RemoteAddr{exit.args[1]},
                           std::span<uint8_t>(reinterpret_cast<uint8_t*>(&act), sizeof act));
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pid ", proc_.pid(), " set a SIGSEGV handler that kwatch cannot read (", s.message(),
        "): page mode would lose it the first time the program touched a watched page with "
        "SIGSEGV blocked (the kernel resets it then)"));
  }
  if (act.handler == kSigDfl || act.handler == kSigIgn) {
    handler_.reset();
  } else {
    handler_ = act;
  }
  return absl::OkStatus();
}

void PageBackend::Collect(std::vector<core::AccessEvent>& out) {
  out.insert(out.end(), events_.begin(), events_.end());
  events_.clear();
  // A burst between two drains (kwatch starved of CPU) must not keep its memory for the
  // rest of the session: past 64k events the buffer starts again from nothing.
  if (events_.capacity() > 65536) {
    std::vector<core::AccessEvent>().swap(events_);
  }
}

}  // namespace kwatch::watch
