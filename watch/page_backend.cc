#include "watch/page_backend.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "core/syscall_status.h"
#include "core/x86_access.h"
#include "core/x86_emulate.h"

namespace kwatch::watch {

namespace {

constexpr uint64_t kPageSize = 4096;

uint64_t PageOf(uint64_t addr) {
  return addr & ~(kPageSize - 1);
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

std::string ProtText(int prot) {
  if (prot == PROT_NONE) {
    return "---";
  }
  return absl::StrCat((prot & PROT_READ) ? "r" : "-", (prot & PROT_WRITE) ? "w" : "-",
                      (prot & PROT_EXEC) ? "x" : "-");
}

}  // namespace

absl::Status PageBackend::ProtectIn(core::Process& proc, pid_t tid, uint64_t page, int prot) {
  const uint64_t args[3] = {page, kPageSize, static_cast<uint64_t>(prot)};
  KW_ASSIGN_OR_RETURN(const int64_t r, proc.RemoteSyscall(tid, SYS_mprotect, args));
  if (r < 0) {
    return core::SyscallError(
        static_cast<int>(-r),
        absl::StrFormat("mprotect(0x%x, %s) in pid %d", page, ProtText(prot), proc.pid()));
  }
  return absl::OkStatus();
}

absl::Status PageBackend::Protect(pid_t tid, uint64_t page, int prot) {
  return ProtectIn(proc_, tid, page, prot);
}

absl::Status PageBackend::OnFork(core::Process& child) {
  if (!armed_) {
    return absl::OkStatus();
  }
  for (const auto& [addr, page] : pages_) {
    KW_RETURN_IF_ERROR(ProtectIn(child, child.pid(), addr, page.original));
  }
  return absl::OkStatus();
}

absl::Status PageBackend::Arm() {
  if (armed_) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const std::vector<core::MapEntry> maps, proc_.Maps());
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
      const auto m = core::FindMapping(maps, core::RemoteAddr{p});
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
      page.armed = reads_count.count(p) != 0 ? PROT_NONE : (page.original & ~PROT_WRITE);
    }
  }
  KW_RETURN_IF_ERROR(proc_.StopAll());
  absl::Cleanup resume = [this] { (void)proc_.ResumeAll(); };
  const pid_t tid = proc_.AnyStoppedThread();
  if (tid == 0) {
    return absl::FailedPreconditionError("no thread of the target could be stopped");
  }
  std::vector<uint64_t> done;
  for (const auto& [addr, page] : pages) {
    absl::Status s = Protect(tid, addr, page.armed);
    if (!s.ok()) {
      for (uint64_t d : done) {  // all or nothing
        (void)Protect(tid, d, pages[d].original);
      }
      return s;
    }
    done.push_back(addr);
  }
  pages_ = std::move(pages);
  armed_ = true;
  proc_.SetInterceptor(this);
  return absl::OkStatus();
}

void PageBackend::Disarm() {
  if (!armed_) {
    return;
  }
  // Claims stay on while the world stops, so that faults already raised are not mistaken
  // for the target's own.
  if (proc_.alive() && proc_.StopAll().ok()) {
    const pid_t tid = proc_.AnyStoppedThread();
    for (const auto& [addr, page] : pages_) {
      const absl::Status s = tid != 0 ? Protect(tid, addr, page.original)
                                      : absl::FailedPreconditionError("no stopped thread");
      if (!s.ok()) {
        std::fprintf(stderr, "kwatch: cannot restore the protection of page 0x%lx in pid %d: %s\n",
                     static_cast<unsigned long>(addr), proc_.pid(),
                     std::string(s.message()).c_str());
      }
    }
    armed_ = false;
    draining_ = true;
    (void)proc_.ResumeAll();
  }
  armed_ = false;
  draining_ = true;
}

void PageBackend::Forget() {
  // The pages belonged to the old image: nothing to restore, and no fault of theirs can come.
  armed_ = false;
  draining_ = false;
  pages_.clear();
  code_cache_.clear();
  proc_.SetInterceptor(nullptr);
}

PageBackend::~PageBackend() {
  Disarm();
  proc_.SetInterceptor(nullptr);
}

bool PageBackend::Claims(pid_t /*tid*/, const siginfo_t& si) {
  if ((!armed_ && !draining_) || si.si_signo != SIGSEGV || si.si_code != SEGV_ACCERR) {
    return false;
  }
  const uint64_t addr = reinterpret_cast<uint64_t>(si.si_addr);
  return pages_.count(PageOf(addr)) != 0;
}

absl::Status PageBackend::ReadValue(uint64_t addr, uint32_t size, uint64_t& out) const {
  uint8_t buf[8] = {};
  KW_RETURN_IF_ERROR(proc_.ReadMemory(core::RemoteAddr{addr},
                                      std::span<uint8_t>(buf, std::min<uint32_t>(size, 8))));
  std::memcpy(&out, buf, 8);
  return absl::OkStatus();
}

void PageBackend::Match(const absl::StatusOr<core::DecodedAccess>& decoded, uint64_t fault,
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
  for (const core::MemoryOperand& m : decoded->memory) {
    for (uint64_t p = PageOf(m.addr); p < m.addr + m.size; p += kPageSize) {
      if (pages_.count(p) != 0 && std::find(touched.begin(), touched.end(), p) == touched.end()) {
        touched.push_back(p);
      }
    }
    for (const Watch& w : watches_) {
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

void PageBackend::Record(pid_t tid, uint64_t rip, const std::vector<Hit>& hits) {
  if (hits.empty()) {
    ++unrelated_;
    return;
  }
  const uint64_t now = MonotonicNs();
  for (const Hit& h : hits) {
    const Watch& w = watches_[h.watch_id];
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
  if (!armed_) {
    return true;  // a late fault of a disarmed page: drop it, the access re-runs unprotected
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
  const uint64_t rip = regs.rip;
  const std::span<const uint8_t> code = CodeAt(rip);
  auto decoded = core::DecodeAccess(code, rip, regs);
  std::vector<Hit> hits;
  std::vector<uint64_t> touched;
  Match(decoded, reinterpret_cast<uint64_t>(si.si_addr), hits, touched);
  core::EmulatorMemory mem;
  mem.read = [this](uint64_t addr, std::span<uint8_t> out) {
    return proc_.ReadMemory(core::RemoteAddr{addr}, out);
  };
  mem.write = [this](uint64_t addr, std::span<const uint8_t> data) {
    return proc_.WriteMemory(core::RemoteAddr{addr}, data);
  };
  KW_ASSIGN_OR_RETURN(const std::optional<core::EmulatedAccess> done,
                      core::EmulateDataMove(code, regs, mem));
  if (!done.has_value()) {
    return false;  // not a plain move: single-step it with the world stopped
  }
  KW_RETURN_IF_ERROR(proc_.SetRegs(tid, regs));
  ++emulated_;
  Record(tid, rip, hits);
  return true;
}

absl::Status PageBackend::Handle(pid_t tid, const siginfo_t& si) {
  if (!armed_) {
    return absl::OkStatus();
  }
  KW_ASSIGN_OR_RETURN(const user_regs_struct regs, proc_.GetRegs(tid));
  auto decoded = core::DecodeAccess(CodeAt(regs.rip), regs.rip, regs);
  std::vector<Hit> hits;
  std::vector<uint64_t> touched;
  Match(decoded, reinterpret_cast<uint64_t>(si.si_addr), hits, touched);
  // Lift the protection, run the one instruction, protect again.
  for (uint64_t p : touched) {
    KW_RETURN_IF_ERROR(Protect(tid, p, pages_[p].original));
  }
  KW_ASSIGN_OR_RETURN(const int stop, proc_.SingleStep(tid));
  if (stop == 0) {
    return absl::OkStatus();  // the process ended
  }
  for (uint64_t p : touched) {
    KW_RETURN_IF_ERROR(Protect(tid, p, pages_[p].armed));
  }
  ++stepped_;
  Record(tid, regs.rip, hits);
  return absl::OkStatus();
}

void PageBackend::Collect(std::vector<core::AccessEvent>& out) {
  out.insert(out.end(), events_.begin(), events_.end());
  events_.clear();
}

}  // namespace kwatch::watch
