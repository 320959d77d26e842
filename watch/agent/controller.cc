#include "watch/agent/controller.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/probe/xol.h"
#include "core/ptrace/maps.h"
#include "core/ptrace/process.h"
#include "core/ptrace/remote_call.h"

namespace kwatch::watch::agent {

namespace ka = kwatch::agent;
using core::RemoteAddr;

namespace {

constexpr uint64_t kCodeAreaSize = uint64_t{64} * 1024;
constexpr uint64_t kCodeAlign = 16;
constexpr uint8_t kInt3 = 0xcc;
constexpr int kIdPidfd = 3;  // P_PIDFD (linux/wait.h; glibc 2.36 does not name it)

// Whether process `pid` has ended: gone, or a zombie (its state in /proc/PID/stat).
bool ProcessEnded(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "re");
  if (f == nullptr) {
    return true;
  }
  std::array<char, 512> buf{};
  const size_t n = std::fread(buf.data(), 1, buf.size() - 1, f);
  std::fclose(f);
  const absl::string_view text(buf.data(), n);
  const size_t paren = text.rfind(')');
  if (paren == absl::string_view::npos || paren + 2 >= text.size()) {
    return true;
  }
  const char state = text[paren + 2];
  return state == 'Z' || state == 'X' || state == 'x';
}

// The inode of the file mapped at `addr` in this process (kwatch's view of the memfd).
uint64_t InodeMappedAt(const void* addr) {
  absl::StatusOr<std::vector<core::ptrace::MapEntry>> maps = core::ptrace::ReadMaps(::getpid());
  if (!maps.ok()) {
    return 0;
  }
  for (const core::ptrace::MapEntry& m : *maps) {
    if (m.Contains(RemoteAddr{reinterpret_cast<uint64_t>(addr)})) {
      return m.inode;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> Controller::Load(core::ptrace::Process& proc,
                                                             const LoadOptions& options) {
  KW_ASSIGN_OR_RETURN(LoadedAgent agent, LoadAgent(proc, options));
  return Adopt(std::move(agent), proc.pid());
}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Adopt(LoadedAgent agent, pid_t pid) {
  core::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) {
    const int err = errno;
    return core::SyscallError(err, absl::StrCat("pidfd_open(", pid, ")"));
  }
  return std::unique_ptr<Controller>(new Controller(std::move(agent), pid, std::move(pidfd)));
}

Controller::Controller(LoadedAgent agent, pid_t pid, core::UniqueFd pidfd)
    : pid_(pid),
      agent_(std::move(agent)),
      tables_(std::span<uint8_t>(static_cast<uint8_t*>(agent_.shm.get()), agent_.shm.size()),
              agent_.layout),
      pidfd_(std::move(pidfd)),
      last_lost_(agent_.layout.thread_capacity, 0),
      ids_(pid),
      shm_inode_(InodeMappedAt(agent_.shm.get())) {
  struct stat st {};
  if (agent_.lifeline.valid() && ::fstat(agent_.lifeline.get(), &st) == 0) {
    lifeline_inode_ = st.st_ino;
  }
}

Controller::~Controller() = default;

// ---------------------------------------------------------------------------------------
// Arming.

absl::StatusOr<Controller::CodeArea*> Controller::MapArea(core::ptrace::Process& proc,
                                                          RemoteAddr near, uint64_t size) {
  const uint64_t bytes = std::max(kCodeAreaSize, (size + 4095) & ~uint64_t{4095});
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
  const std::optional<RemoteAddr> at =
      core::probe::FindXolGap(maps, near, bytes, core::probe::kXolMaxDistance);
  if (!at.has_value()) {
    return absl::OutOfRangeError(absl::StrFormat(
        "no room for %d bytes of code within 1 GiB of 0x%x in pid %d", bytes, near.value, pid_));
  }
  const pid_t tid = proc.AnyStoppedThread();
  if (tid == 0) {
    return absl::FailedPreconditionError("placing code needs a stopped thread");
  }
  const std::array<uint64_t, 6> args = {at->value,
                                        bytes,
                                        PROT_READ | PROT_EXEC,
                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                                        static_cast<uint64_t>(-1),
                                        0};
  KW_ASSIGN_OR_RETURN(const int64_t r,
                      core::ptrace::RemoteSyscallByTrap(proc, tid, SYS_mmap, args));
  if (r < 0 && r > -4096) {
    return core::SyscallError(
        static_cast<int>(-r),
        absl::StrFormat("mmap(0x%x, %d, PROT_READ|PROT_EXEC) in pid %d", at->value, bytes, pid_));
  }
  if (static_cast<uint64_t>(r) != at->value) {
    return absl::InternalError(absl::StrFormat("mmap placed the code area at 0x%x, not 0x%x",
                                               static_cast<uint64_t>(r), at->value));
  }
  // INT3 everywhere but the code placed: a stray jump traps instead of sliding.
  KW_RETURN_IF_ERROR(proc.WriteMemory(*at, std::vector<uint8_t>(bytes, kInt3)));
  areas_.push_back(CodeArea{.start = *at, .size = bytes, .used = 0});
  return &areas_.back();
}

absl::StatusOr<RemoteAddr> Controller::PlaceCode(core::ptrace::Process& proc, RemoteAddr near,
                                                 uint64_t size, const CodeBuilder& build) {
  const auto reaches = [near](RemoteAddr a, uint64_t n) {
    const uint64_t lo = std::min(a.value, near.value);
    const uint64_t hi = std::max(a.value + n, near.value);
    return hi - lo <= core::probe::kXolMaxDistance;
  };
  CodeArea* area = nullptr;
  for (CodeArea& a : areas_) {
    const uint64_t at = (a.used + kCodeAlign - 1) & ~(kCodeAlign - 1);
    if (at + size <= a.size && reaches(a.start + at, size)) {
      area = &a;
      break;
    }
  }
  if (area == nullptr) {
    KW_ASSIGN_OR_RETURN(area, MapArea(proc, near, size));
  }
  const uint64_t offset = (area->used + kCodeAlign - 1) & ~(kCodeAlign - 1);
  const RemoteAddr at = area->start + offset;
  KW_ASSIGN_OR_RETURN(const std::vector<uint8_t> code, build(at));
  if (code.size() > size) {
    return absl::InternalError(absl::StrCat("code built for ", size, " bytes took ", code.size()));
  }
  KW_RETURN_IF_ERROR(proc.WriteMemory(at, code));
  area->used = offset + code.size();
  return at;
}

absl::StatusOr<uint32_t> Controller::AddProbe(const ProbeEntry& entry) {
  KW_ASSIGN_OR_RETURN(const uint32_t index, tables_.AddProbe(entry));
  const bool jump = (entry.flags & ka::kKwProbeJump) != 0;
  if (entry.xol_addr != 0 && (jump || entry.resume == ka::kKwResumeXol)) {
    copies_.push_back(Copy{.probe = entry.addr,
                           .copy = RemoteAddr{entry.xol_addr},
                           .length = jump ? 0 : entry.insn_len});
  }
  return index;
}

absl::Status Controller::Patch(core::ptrace::Process& proc, uint32_t probe_index, RemoteAddr addr,
                               std::span<const uint8_t> bytes) {
  const size_t len = bytes.size();
  const bool jump = len > 1;
  if (len == 0 || len > 16 || (len == 1 && bytes[0] != kInt3) || (jump && len < 5) ||
      (jump && bytes[0] == kInt3)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a patch is one INT3 or a jump of 5 to 16 bytes (got ", len, " bytes)"));
  }
  for (const Applied& a : patches_) {
    if (addr.value < a.addr.value + a.original.size() && a.addr.value < addr.value + len) {
      return absl::AlreadyExistsError(
          absl::StrFormat("0x%x is patched already (probe %d)", addr.value, a.probe_index));
    }
  }
  if (jump) {
    // The optimizer's last check: no thread may resume in the middle of the new jmp.
    for (const pid_t tid : proc.TracedThreads()) {
      auto regs = proc.GetRegs(tid);
      if (regs.ok() && regs->rip > addr.value && regs->rip < addr.value + len) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "thread %d is stopped at 0x%x, inside the %d bytes a jump at 0x%x replaces", tid,
            regs->rip, len, addr.value));
      }
    }
  }
  Applied a;
  a.probe_index = probe_index;
  a.addr = addr;
  a.original.resize(len);
  a.patched.assign(bytes.begin(), bytes.end());
  KW_RETURN_IF_ERROR(proc.ReadMemory(addr, a.original));
  if (a.original[0] == kInt3) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "0x%x holds an INT3 already (another debugger's breakpoint, or the program's own)",
        addr.value));
  }
  KW_ASSIGN_OR_RETURN(a.journal,
                      tables_.Journal(PatchEntry{.kind = jump ? ka::kKwPatchJump : ka::kKwPatchInt3,
                                                 .addr = addr,
                                                 .original = a.original,
                                                 .patched = a.patched,
                                                 .probe_index = probe_index}));
  absl::Status written = absl::OkStatus();
  if (jump) {
    const uint8_t int3 = kInt3;
    written = proc.WriteMemory(addr, std::span<const uint8_t>(&int3, 1));
    if (written.ok()) {
      written = proc.WriteMemory(addr + 1, bytes.subspan(1));
    }
    if (written.ok()) {
      written = proc.WriteMemory(addr, bytes.first(1));
    }
  } else {
    written = proc.WriteMemory(addr, bytes);
  }
  if (!written.ok()) {
    (void)proc.WriteMemory(addr, a.original);  // whatever part went in
    tables_.Unjournal(a.journal);
    return written;
  }
  patches_.push_back(std::move(a));
  return absl::OkStatus();
}

absl::Status Controller::Restore(core::ptrace::Process& proc, const Applied& a) {
  if (a.original.size() > 1) {
    const uint8_t int3 = kInt3;
    KW_RETURN_IF_ERROR(proc.WriteMemory(a.addr, std::span<const uint8_t>(&int3, 1)));
    KW_RETURN_IF_ERROR(
        proc.WriteMemory(a.addr + 1, std::span<const uint8_t>(a.original).subspan(1)));
  }
  KW_RETURN_IF_ERROR(proc.WriteMemory(a.addr, std::span<const uint8_t>(a.original).first(1)));
  tables_.Unjournal(a.journal);
  return absl::OkStatus();
}

absl::Status Controller::Unpatch(core::ptrace::Process& proc, uint32_t probe_index) {
  for (auto it = patches_.begin(); it != patches_.end(); ++it) {
    if (it->probe_index == probe_index) {
      KW_RETURN_IF_ERROR(Restore(proc, *it));
      patches_.erase(it);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("probe ", probe_index, " has no patch"));
}

void Controller::Activate() {
  tables_.SetState(ka::kKwStateActive);
}

// ---------------------------------------------------------------------------------------
// Running.

absl::StatusOr<DrainStats> Controller::Drain(const HitFn& fn) {
  clock_.Recalibrate();
  DrainStats total;
  absl::Status first_error = absl::OkStatus();
  const uint32_t bytes = agent_.layout.ring_bytes;
  for (uint32_t i = 0; i < agent_.layout.thread_capacity; ++i) {
    KwRing& ring = tables_.ring(i);
    if (ring.head.load(std::memory_order_acquire) == ring.tail.load(std::memory_order_relaxed) &&
        ring.lost.load(std::memory_order_relaxed) == last_lost_[i]) {
      continue;
    }
    const pid_t pid = ring.tid.load(std::memory_order_acquire) != 0 ? ids_.Host(ring.pid) : 0;
    auto stats = DrainRing(ring, bytes, last_lost_[i],
                           [&](const ka::KwRecord& record, std::span<const uint8_t> payload) {
                             ka::KwRecord r = record;
                             r.tid = ids_.Host(r.tid);
                             fn(AgentHit{.ring = i,
                                         .pid = pid != 0 ? pid : pid_,
                                         .record = r,
                                         .payload = payload,
                                         .time_ns = clock_.ToMonotonicNs(record.tsc)});
                           });
    if (!stats.ok()) {
      if (first_error.ok()) {
        first_error = stats.status();
      }
      continue;
    }
    total.records += stats->records;
    total.pads += stats->pads;
    total.bytes += stats->bytes;
    total.lost += stats->lost;
  }
  KW_RETURN_IF_ERROR(first_error);
  return total;
}

absl::Status Controller::ReapThreadSlots(
    const HitFn& fn, const std::function<void(kwatch::agent::KwThread&)>& before_free) {
  for (uint32_t i = 0; i < agent_.layout.thread_capacity; ++i) {
    KwThread& t = tables_.thread(i);
    const int32_t tid = t.tid.load(std::memory_order_acquire);
    if (tid == 0) {
      continue;
    }
    const pid_t owner = t.pid != 0 ? ids_.Host(t.pid) : pid_;
    struct stat st {};
    if (::stat(absl::StrCat("/proc/", owner, "/task/", ids_.Host(tid)).c_str(), &st) == 0) {
      continue;  // alive
    }
    // Gone: what it left in its ring first, then the slot.
    auto stats = DrainRing(tables_.ring(i), agent_.layout.ring_bytes, last_lost_[i],
                           [&](const ka::KwRecord& record, std::span<const uint8_t> payload) {
                             ka::KwRecord r = record;
                             r.tid = ids_.Host(r.tid);
                             fn(AgentHit{.ring = i,
                                         .pid = owner,
                                         .record = r,
                                         .payload = payload,
                                         .time_ns = clock_.ToMonotonicNs(record.tsc)});
                           });
    KW_RETURN_IF_ERROR(stats.status());
    if (before_free != nullptr) {
      before_free(t);
    }
    tables_.FreeThread(i);
    last_lost_[i] = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<Liveness> Controller::Wait(absl::Duration timeout) {
  std::array<pollfd, 2> fds = {pollfd{.fd = agent_.lifeline.get(), .events = 0, .revents = 0},
                               pollfd{.fd = pidfd_.get(), .events = POLLIN, .revents = 0}};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  for (;;) {
    const int n = ::poll(fds.data(), fds.size(), ms);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) {
        continue;
      }
      return core::SyscallError(err, "poll(lifeline, pidfd)");
    }
    break;
  }
  Liveness l;
  l.agent_gone = (fds[0].revents & (POLLERR | POLLHUP)) != 0;
  l.target_exited = (fds[1].revents & (POLLIN | POLLHUP)) != 0;
  return l;
}

std::optional<core::ptrace::ExitInfo> Controller::ReapExit() {
  siginfo_t si{};
  if (::waitid(static_cast<idtype_t>(kIdPidfd), static_cast<id_t>(pidfd_.get()), &si,
               WEXITED | WNOHANG) != 0 ||
      si.si_pid == 0) {
    return std::nullopt;
  }
  core::ptrace::ExitInfo info;
  if (si.si_code == CLD_EXITED) {
    info.code = si.si_status;
  } else {
    info.signaled = true;
    info.signal = si.si_status;
    info.core_dumped = si.si_code == CLD_DUMPED;
  }
  return info;
}

// ---------------------------------------------------------------------------------------
// The end.

absl::Status Controller::MoveThreadsOutOfCopies(core::ptrace::Process& proc) {
  for (const pid_t tid : proc.TracedThreads()) {
    auto regs = proc.GetRegs(tid);
    if (!regs.ok()) {
      continue;  // gone meanwhile
    }
    for (const Copy& c : copies_) {
      uint64_t to = 0;
      if (regs->rip == c.copy.value) {
        to = c.probe.value;  // the copy has not run: the original will
      } else if (c.length != 0 && regs->rip == c.copy.value + c.length) {
        to = c.probe.value + c.length;  // it ran (a system call there restarts the original)
      }
      if (to != 0) {
        regs->rip = to;
        KW_RETURN_IF_ERROR(proc.SetRegs(tid, *regs));
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Controller::End(core::ptrace::Process& proc) {
  if (ended_) {
    return absl::OkStatus();
  }
  ended_ = true;
  if (!proc.alive()) {
    return EndGone();  // the image is gone; followed children may carry the code
  }
  absl::Status status = absl::OkStatus();
  const auto note = [&status](const absl::Status& s) {
    if (status.ok() && !s.ok()) {
      status = s;
    }
  };
  note(proc.StopAll());
  tables_.SetState(ka::kKwStateStopping);
  note(EndFollowed());
  if (MapsSession(pid_)) {
    for (size_t i = patches_.size(); i-- > 0;) {
      note(Restore(proc, patches_[i]));
    }
    note(MoveThreadsOutOfCopies(proc));
  } else {
    // The target exec'd (its followed children held the session): its new image is not
    // kwatch's to write.
    for (const Applied& a : patches_) {
      tables_.Unjournal(a.journal);
    }
  }
  patches_.clear();
  tables_.SetState(ka::kKwStateRestored);
  return status;
}

absl::Status Controller::Finish(const HitFn& fn) {
  absl::Status drained = Drain(fn).status();
  agent_.lifeline.Reset();  // the agent's watchdog reads EOF, sees Restored, and ends
  return drained;
}

std::vector<FollowedProcess> Controller::Followed() const {
  std::vector<FollowedProcess> out;
  for (uint32_t i = 0; i < agent_.layout.process_capacity; ++i) {
    const ka::KwProcess& p = tables_.process(i);
    const int32_t pid = p.pid.load(std::memory_order_seq_cst);
    if (pid == 0) {
      continue;
    }
    const uint32_t state = p.state.load(std::memory_order_acquire);
    if (state == ka::kKwProcessLeft) {
      continue;
    }
    out.push_back(FollowedProcess{
        .entry = i, .pid = ids_.Host(pid), .parent = ids_.Host(p.parent), .state = state});
  }
  return out;
}

bool Controller::MapsSession(pid_t pid) const {
  absl::StatusOr<std::vector<core::ptrace::MapEntry>> maps = core::ptrace::ReadMaps(pid);
  if (!maps.ok()) {
    return false;
  }
  return std::any_of(maps->begin(), maps->end(), [this](const core::ptrace::MapEntry& m) {
    return m.start == agent_.remote_shm && m.shared && (shm_inode_ == 0 || m.inode == shm_inode_);
  });
}

bool Controller::HoldsLifeline(pid_t pid) const {
  struct stat st {};
  return agent_.remote_lifeline >= 0 &&
         ::stat(absl::StrCat("/proc/", pid, "/fd/", agent_.remote_lifeline).c_str(), &st) == 0 &&
         S_ISFIFO(st.st_mode) && st.st_ino == lifeline_inode_;
}

absl::Status Controller::RunStopped(
    const std::function<absl::Status(core::ptrace::Process&)>& fn) const {
  KW_ASSIGN_OR_RETURN(std::unique_ptr<core::ptrace::Process> proc,
                      core::ptrace::Process::Attach(pid_));
  absl::Status status = proc->StopAll();
  if (status.ok()) {
    status = fn(*proc);
  }
  absl::Status detached = proc->Detach();
  KW_RETURN_IF_ERROR(status);
  return detached;
}

absl::Status Controller::EndDetached(const HitFn& fn) {
  if (!ended_) {
    if (ProcessEnded(pid_)) {
      KW_RETURN_IF_ERROR(EndGone());
    } else {
      const absl::Status ended =
          RunStopped([this](core::ptrace::Process& proc) { return End(proc); });
      if (ended.code() == absl::StatusCode::kNotFound) {
        KW_RETURN_IF_ERROR(EndGone());  // exited meanwhile
      } else {
        KW_RETURN_IF_ERROR(ended);
      }
    }
  }
  return Finish(fn);
}

absl::Status Controller::EndGone() {
  ended_ = true;
  tables_.SetState(ka::kKwStateStopping);
  absl::Status status = EndFollowed();
  for (const Applied& a : patches_) {
    tables_.Unjournal(a.journal);
  }
  patches_.clear();
  tables_.SetState(ka::kKwStateRestored);
  return status;
}

absl::Status Controller::EndFollowed() {
  absl::Status status = absl::OkStatus();
  std::set<pid_t> done;
  for (bool more = true; more;) {
    more = false;
    for (const FollowedProcess& f : Followed()) {
      if (!done.insert(f.pid).second) {
        continue;
      }
      more = true;
      absl::StatusOr<bool> restored = RestoreFollowed(f.pid);
      if (!restored.ok()) {
        if (status.ok()) {
          status = restored.status();
        }
      } else if (*restored) {
        released_children_.push_back(f.pid);
      }
    }
  }
  return status;
}

absl::StatusOr<bool> Controller::RestoreFollowed(pid_t pid) {
  if (ProcessEnded(pid)) {
    return false;
  }
  absl::StatusOr<std::unique_ptr<core::ptrace::Process>> p = core::ptrace::Process::Attach(pid);
  if (!p.ok()) {
    if (p.status().code() == absl::StatusCode::kNotFound || ProcessEnded(pid)) {
      return false;
    }
    return absl::Status(p.status().code(),
                        absl::StrCat("restoring followed child ", pid, ": ", p.status().message()));
  }
  core::ptrace::Process& proc = **p;
  absl::Status status = proc.StopAll();
  const auto note = [&status](const absl::Status& s) {
    if (status.ok() && !s.ok()) {
      status = s;
    }
  };
  // An exec'd child runs another image now: nothing of the session is in it.
  const bool ours = status.ok() && MapsSession(pid);
  if (ours) {
    for (size_t i = patches_.size(); i-- > 0;) {
      note(RestoreCopy(proc, patches_[i]));
    }
    note(MoveThreadsOutOfCopies(proc));
  }
  note(proc.Detach());
  if (!status.ok() && ProcessEnded(pid)) {
    return false;  // it ended meanwhile
  }
  KW_RETURN_IF_ERROR(status);
  return ours;
}

absl::Status Controller::RestoreCopy(core::ptrace::Process& proc, const Applied& a) {
  const size_t len = a.original.size();
  std::vector<uint8_t> now(len);
  KW_RETURN_IF_ERROR(proc.ReadMemory(a.addr, now));
  if (now == a.original) {
    return absl::OkStatus();
  }
  // The patch's bytes, or in between (the child's own restore begun): each byte original or
  // patched, the first also 0xCC. Anything else is someone else's code now.
  bool ours = now[0] == kInt3 || now[0] == a.original[0] || now[0] == a.patched[0];
  for (size_t k = 1; k < len; ++k) {
    ours = ours && (now[k] == a.original[k] || now[k] == a.patched[k]);
  }
  if (!ours) {
    return absl::OkStatus();
  }
  const std::span<const uint8_t> original(a.original);
  if (len > 1) {
    if (now[0] != kInt3) {
      const uint8_t int3 = kInt3;
      KW_RETURN_IF_ERROR(proc.WriteMemory(a.addr, std::span<const uint8_t>(&int3, 1)));
    }
    KW_RETURN_IF_ERROR(proc.WriteMemory(a.addr + 1, original.subspan(1)));
  }
  return proc.WriteMemory(a.addr, original.first(1));
}

}  // namespace kwatch::watch::agent
