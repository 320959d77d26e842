#include "core/probe/int3_engine.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/probe/insn_emulate.h"

namespace kwatch::core::probe {

namespace {

constexpr uint8_t kInt3 = 0xcc;

bool IsFaultSignal(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

// Whether SIGTRAP waits in the thread's own pending set (a trap not yet taken).
bool TrapPending(pid_t tid) {
  const std::string pending = ptrace::ProcStatusField(tid, "SigPnd");
  uint64_t mask = 0;
  return !pending.empty() && absl::SimpleHexAtoi(pending, &mask) &&
         (mask & (1ULL << (SIGTRAP - 1))) != 0;
}

std::array<uint8_t, 8> Bytes64(uint64_t v) {
  std::array<uint8_t, 8> b{};
  std::memcpy(b.data(), &v, 8);
  return b;
}

}  // namespace

Int3Engine::Int3Engine(ptrace::Process& process) : process_(process) {
  memory_.read = [this](uint64_t addr, std::span<uint8_t> out) {
    return process_.ReadMemory(RemoteAddr{addr}, out);
  };
  memory_.write = [this](uint64_t addr, std::span<const uint8_t> data) {
    return process_.WriteMemory(RemoteAddr{addr}, data);
  };
  process_.AddInterceptor(this);
}

Int3Engine::~Int3Engine() {
  in_handler_ = false;
  const bool patched = !breakpoints_.empty() ||
                       std::any_of(threads_.begin(), threads_.end(),
                                   [](const auto& t) { return !t.second.instances.empty(); });
  if (process_.alive() && patched) {
    const absl::Status s = RestoreAll();
    if (!s.ok()) {
      std::fprintf(stderr, "kwatch: restoring the code of pid %d: %s\n", process_.pid(),
                   std::string{s.message()}.c_str());
    }
  }
  process_.RemoveInterceptor(this);
}

// ---------------------------------------------------------------------------------------
// Registration.

absl::Status Int3Engine::Mutable() const {
  if (in_handler_) {
    return absl::FailedPreconditionError(
        "probes cannot be registered, unregistered or restored from inside a probe handler");
  }
  if (!process_.alive()) {
    return absl::FailedPreconditionError(absl::StrCat("process ", process_.pid(), " has exited"));
  }
  return absl::OkStatus();
}

absl::Status Int3Engine::StopWorld() {
  if (world_depth_++ == 0) {
    absl::Status s = process_.StopAll();
    if (!s.ok()) {
      --world_depth_;
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Int3Engine::ResumeWorld() {
  if (world_depth_ == 0) {
    return absl::FailedPreconditionError("ResumeWorld() without StopWorld()");
  }
  if (--world_depth_ == 0) {
    return process_.ResumeAll();
  }
  return absl::OkStatus();
}

absl::StatusOr<ProbeId> Int3Engine::Register(RemoteAddr addr, ProbeHandlers handlers,
                                             ProbeOptions opts) {
  Probe p;
  p.addr = addr;
  p.enabled = opts.enabled;
  p.maxhits = opts.maxhits;
  p.handlers = std::move(handlers);
  if (p.handlers.entry) {
    return absl::InvalidArgumentError("an entry handler belongs to a return probe");
  }
  return AddProbe(addr, std::move(p), opts.execution, &opts);
}

absl::StatusOr<ProbeId> Int3Engine::RegisterReturn(RemoteAddr function_entry,
                                                   ProbeHandlers handlers,
                                                   ReturnProbeOptions opts) {
  Probe p;
  p.addr = function_entry;
  p.is_return = true;
  p.enabled = opts.enabled;
  p.maxhits = opts.maxhits;
  p.maxactive = opts.maxactive == 0 ? kDefaultMaxActive : opts.maxactive;
  p.handlers = std::move(handlers);
  if (p.handlers.post || p.handlers.fault) {
    return absl::InvalidArgumentError(
        "a return probe runs `pre` at the return and `entry` at the entry; post and fault "
        "handlers belong to probes");
  }
  return AddProbe(function_entry, std::move(p), ProbeExecution::kAuto, nullptr);
}

absl::StatusOr<ProbeId> Int3Engine::AddProbe(RemoteAddr addr, Probe probe, ProbeExecution execution,
                                             const ProbeOptions* placement) {
  KW_RETURN_IF_ERROR(Mutable());
  if (xol_.Contains(addr)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot probe 0x%x: it is in kwatch's trampoline area (out-of-line copies)", addr.value));
  }
  KW_RETURN_IF_ERROR(StopWorld());
  absl::StatusOr<ProbeId> id = [&]() -> absl::StatusOr<ProbeId> {
    KW_ASSIGN_OR_RETURN(Breakpoint * bp, EnsureBreakpoint(addr, execution, placement));
    if (probe.is_return) {
      KW_RETURN_IF_ERROR(EnsureTrampoline(addr));
    }
    const ProbeId new_id = next_id_++;
    probe.stats.registered = true;
    if (probe.handlers.fault) {
      ++fault_handlers_;
    }
    bp->probes.push_back(new_id);
    probes_.emplace(new_id, std::move(probe));
    return new_id;
  }();
  const absl::Status resumed = ResumeWorld();
  if (id.ok() && !resumed.ok()) {
    return resumed;
  }
  return id;
}

absl::Status Int3Engine::ReadOriginal(RemoteAddr addr, std::span<uint8_t> out) const {
  KW_RETURN_IF_ERROR(process_.ReadMemory(addr, out));
  for (size_t i = 0; i < out.size(); ++i) {
    if (auto it = breakpoints_.find(addr + i); it != breakpoints_.end()) {
      out[i] = it->second.insn.bytes[0];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Int3Engine::Breakpoint*> Int3Engine::EnsureBreakpoint(
    RemoteAddr addr, ProbeExecution execution, const ProbeOptions* placement) {
  if (auto it = breakpoints_.find(addr); it != breakpoints_.end()) {
    Breakpoint& bp = it->second;
    if ((execution == ProbeExecution::kEmulate && !bp.emulate) ||
        (execution == ProbeExecution::kOutOfLine && bp.emulate)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "0x%x is probed already with its instruction %s; probes at one address share it",
          addr.value, bp.emulate ? "emulated" : "run out of line"));
    }
    return &bp;
  }
  KW_ASSIGN_OR_RETURN(const std::vector<ptrace::MapEntry> maps, process_.Maps());
  const std::optional<ptrace::MapEntry> m = ptrace::FindMapping(maps, addr);
  if (!m.has_value() || !m->exec) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot probe 0x%x: it is not in executable code of pid %d%s", addr.value, process_.pid(),
        m.has_value()
            ? absl::StrCat(" (", m->path.empty() ? "anonymous" : m->path, " is not executable)")
            : " (not mapped)"));
  }
  std::array<uint8_t, 15> code{};
  const size_t avail = std::min<uint64_t>(code.size(), m->end - addr);
  KW_RETURN_IF_ERROR(ReadOriginal(addr, std::span<uint8_t>(code.data(), avail)));
  if (placement != nullptr && placement->function_start.has_value()) {
    std::vector<uint8_t> fn(placement->function_size);
    KW_RETURN_IF_ERROR(ReadOriginal(*placement->function_start, fn));
    KW_RETURN_IF_ERROR(CheckInstructionBoundary(fn, *placement->function_start, addr));
  }
  KW_ASSIGN_OR_RETURN(ProbedInsn insn,
                      AnalyzeProbedInsn(std::span<const uint8_t>(code.data(), avail), addr));
  for (uint8_t i = 1; i < insn.length; ++i) {
    if (breakpoints_.contains(addr + i)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot probe 0x%x (%s): the probe at 0x%x is inside this instruction",
                          addr.value, insn.text, addr.value + i));
    }
  }
  for (uint64_t back = 1; back < 15 && back <= addr.value; ++back) {
    auto it = breakpoints_.find(addr - back);
    if (it != breakpoints_.end() && it->second.insn.length > back) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot probe 0x%x: it is inside the instruction probed at 0x%x (%s)",
                          addr.value, it->first.value, it->second.insn.text));
    }
  }
  bool emulate = insn.PreferEmulation();
  if (execution == ProbeExecution::kEmulate) {
    if (!insn.can_emulate) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot emulate '%s' at 0x%x (kwatch emulates nops, register moves, lea, add/sub of "
          "an immediate, branches, call, ret, push and pop)",
          insn.text, addr.value));
    }
    emulate = true;
  } else if (execution == ProbeExecution::kOutOfLine) {
    if (!insn.can_run_out_of_line) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' at 0x%x cannot run out of line (relative branches, calls and ret are emulated)",
          insn.text, addr.value));
    }
    emulate = false;
  }
  const Slot* slot = nullptr;
  if (insn.can_run_out_of_line) {
    auto s = EnsureSlot(insn);
    if (!s.ok() && !emulate) {
      return s.status();
    }
    slot = s.ok() ? *s : nullptr;  // an emulated instruction does without its fallback
  }
  Breakpoint bp;
  bp.addr = addr;
  bp.insn = std::move(insn);
  bp.emulate = emulate;
  bp.slot = slot;
  const uint8_t original = bp.insn.bytes[0];
  Journal(PatchRecord::Kind::kBreakpoint, addr, std::span<const uint8_t>(&original, 1),
          std::span<const uint8_t>(&kInt3, 1), bp.journal);
  const absl::Status written = process_.WriteMemory(addr, std::span<const uint8_t>(&kInt3, 1));
  if (!written.ok()) {
    Unjournal(bp.journal);
    return written;
  }
  retired_[addr] = original;
  return &breakpoints_.emplace(addr, std::move(bp)).first->second;
}

absl::Status Int3Engine::WithRemoteSyscalls(pid_t tid, const std::function<absl::Status()>& fn) {
  syscall_tid_ = tid;
  swallowed_trap_ = false;
  absl::Status s = fn();
  syscall_tid_ = 0;
  if (swallowed_trap_ && process_.alive()) {
    // The thread had trapped on one of kwatch's INT3s; the step of the system call dropped
    // the SIGTRAP. Back onto the INT3: it traps again when the thread resumes.
    swallowed_trap_ = false;
    cached_tid_ = 0;
    KW_ASSIGN_OR_RETURN(user_regs_struct regs, process_.GetRegs(tid));
    regs.rip -= 1;
    KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
  }
  return s;
}

absl::StatusOr<const Int3Engine::Slot*> Int3Engine::EnsureSlot(const ProbedInsn& insn) {
  if (auto it = slot_of_.find(insn.addr); it != slot_of_.end()) {
    const Slot& old = slots_.at(it->second);
    if (old.length == insn.length &&
        std::equal(insn.bytes.begin(), insn.bytes.begin() + insn.length, old.original.begin())) {
      return &old;  // the same instruction probed again: its copies are still right
    }
  }
  const pid_t tid = process_.AnyStoppedThread();
  if (tid == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no thread of pid ", process_.pid(), " is stopped to map kwatch's area"));
  }
  const RemoteAddr target = RipRelativeTarget(insn);
  auto fits = [&insn, target](RemoteAddr slot) {
    return insn.rip_disp_offset == 0 ||
           (RipRelativeReaches(slot, insn.length, target) &&
            RipRelativeReaches(slot + kXolTrapOffset, insn.length, target));
  };
  RemoteAddr at;
  KW_RETURN_IF_ERROR(WithRemoteSyscalls(tid, [&]() -> absl::Status {
    KW_ASSIGN_OR_RETURN(at, xol_.AllocateSlot(process_, tid, insn.addr, fits));
    return absl::OkStatus();
  }));
  KW_ASSIGN_OR_RETURN(std::vector<uint8_t> jump_copy,
                      BuildOutOfLineCopy(insn, at, XolTail::kJumpBack));
  KW_ASSIGN_OR_RETURN(std::vector<uint8_t> trap_copy,
                      BuildOutOfLineCopy(insn, at + kXolTrapOffset, XolTail::kTrap));
  KW_RETURN_IF_ERROR(process_.WriteMemory(at, jump_copy));
  KW_RETURN_IF_ERROR(process_.WriteMemory(at + kXolTrapOffset, trap_copy));
  Slot slot;
  slot.addr = at;
  slot.probed = insn.addr;
  slot.length = insn.length;
  slot.original = insn.bytes;
  const Slot& stored = slots_.emplace(at.value, slot).first->second;
  slot_of_[insn.addr] = at.value;
  if (insn.falls_through) {
    post_traps_[at + kXolTrapOffset + insn.length] = at.value;
  }
  return &stored;
}

absl::Status Int3Engine::EnsureTrampoline(RemoteAddr near) {
  if (trampoline_.value != 0) {
    return absl::OkStatus();
  }
  const pid_t tid = process_.AnyStoppedThread();
  if (tid == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no thread of pid ", process_.pid(), " is stopped to map kwatch's area"));
  }
  return WithRemoteSyscalls(tid, [&]() -> absl::Status {
    KW_ASSIGN_OR_RETURN(trampoline_, xol_.Trampoline(process_, tid, near));
    return absl::OkStatus();
  });
}

absl::Status Int3Engine::Enable(ProbeId id) {
  auto it = probes_.find(id);
  if (it == probes_.end()) {
    return absl::NotFoundError(absl::StrCat("no probe ", id));
  }
  it->second.enabled = it->second.registered;
  return absl::OkStatus();
}

absl::Status Int3Engine::Disable(ProbeId id) {
  auto it = probes_.find(id);
  if (it == probes_.end()) {
    return absl::NotFoundError(absl::StrCat("no probe ", id));
  }
  it->second.enabled = false;
  return absl::OkStatus();
}

absl::StatusOr<ProbeStats> Int3Engine::Stats(ProbeId id) const {
  auto it = probes_.find(id);
  if (it == probes_.end()) {
    return absl::NotFoundError(absl::StrCat("no probe ", id));
  }
  ProbeStats s = it->second.stats;
  s.enabled = it->second.enabled;
  s.registered = it->second.registered;
  return s;
}

absl::Status Int3Engine::RemoveBreakpoint(Breakpoint& bp) {
  const uint8_t original = bp.insn.bytes[0];
  KW_RETURN_IF_ERROR(process_.WriteMemory(bp.addr, std::span<const uint8_t>(&original, 1)));
  Unjournal(bp.journal);
  return absl::OkStatus();
}

absl::Status Int3Engine::Unregister(ProbeId id) {
  KW_RETURN_IF_ERROR(Mutable());
  auto it = probes_.find(id);
  if (it == probes_.end()) {
    return absl::NotFoundError(absl::StrCat("no probe ", id));
  }
  Probe& p = it->second;
  if (!p.registered) {
    return absl::OkStatus();
  }
  p.registered = false;
  p.enabled = false;
  if (p.handlers.fault) {
    --fault_handlers_;
  }
  auto bp_it = breakpoints_.find(p.addr);
  if (bp_it == breakpoints_.end()) {
    return absl::OkStatus();
  }
  std::vector<ProbeId>& ids = bp_it->second.probes;
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  if (!ids.empty()) {
    return absl::OkStatus();
  }
  // A thread that trapped here but is not handled yet finds the address in retired_ and
  // goes back to the original instruction.
  KW_RETURN_IF_ERROR(StopWorld());
  absl::Status s = RemoveBreakpoint(bp_it->second);
  if (s.ok()) {
    breakpoints_.erase(bp_it);
  }
  const absl::Status resumed = ResumeWorld();
  return s.ok() ? resumed : s;
}

// ---------------------------------------------------------------------------------------
// Hits.

void Int3Engine::Drop(pid_t tid, const siginfo_t& si) {
  if (si.si_signo != SIGTRAP || si.si_code != SI_KERNEL) {
    return;
  }
  absl::StatusOr<user_regs_struct> regs = process_.GetRegs(tid);
  if (!regs.ok()) {
    return;
  }
  const RemoteAddr at{regs->rip - 1};
  if (breakpoints_.contains(at) || !retired_.contains(at)) {
    return;  // a live probe would trap again; anything else is not a probe's address
  }
  regs->rip = at.value;
  (void)process_.SetRegs(tid, *regs);
}

bool Int3Engine::Claims(pid_t tid, const siginfo_t& si) {
  if (si.si_signo == SIGTRAP && si.si_code == SI_KERNEL) {
    if (retired_.empty()) {
      return false;  // kwatch never patched this image
    }
    if (auto t = threads_.find(tid); t != threads_.end() && t->second.stale_traps > 0) {
      return true;
    }
    auto regs = process_.GetRegs(tid);
    if (!regs.ok()) {
      return false;
    }
    const RemoteAddr at{regs->rip - 1};
    const bool ours = breakpoints_.contains(at) || post_traps_.contains(at) ||
                      (trampoline_.value != 0 && xol_.IsTrampoline(at)) || retired_.contains(at);
    if (!ours) {
      return false;
    }
    cached_tid_ = tid;
    cached_regs_ = *regs;
    if (tid == syscall_tid_) {
      swallowed_trap_ = true;  // inside kwatch's own remote system call: see WithRemoteSyscalls
    }
    return true;
  }
  if (!IsFaultSignal(si.si_signo) || si.si_code <= 0 || fault_handlers_ == 0) {
    return false;
  }
  // A fault of a displaced instruction running in its copy: the fault handlers decide.
  auto regs = process_.GetRegs(tid);
  if (!regs.ok()) {
    return false;
  }
  const Slot* slot = SlotContaining(RemoteAddr{regs->rip});
  if (slot == nullptr) {
    return false;
  }
  auto bp = breakpoints_.find(slot->probed);
  if (bp == breakpoints_.end()) {
    return false;
  }
  user_regs_struct at = *regs;
  at.rip = slot->probed.value;
  const ProbeContext ctx{tid, MonotonicNs(), slot->probed, at, false, {}, {}, process_};
  bool handled = false;
  in_handler_ = true;
  for (const ProbeId id : bp->second.probes) {
    Probe& p = probes_.at(id);
    if (!p.handlers.fault || !p.registered) {
      continue;
    }
    ++p.stats.faults;
    if (p.handlers.fault(ctx, si.si_signo)) {
      handled = true;
      break;
    }
  }
  in_handler_ = false;
  return handled;
}

absl::Status Int3Engine::Handle(pid_t tid, const siginfo_t& si) {
  KW_ASSIGN_OR_RETURN(const bool done, HandleInPlace(tid, si));
  (void)done;
  return absl::OkStatus();
}

absl::StatusOr<user_regs_struct> Int3Engine::RegsOf(pid_t tid) {
  if (cached_tid_ == tid) {
    cached_tid_ = 0;
    return cached_regs_;
  }
  return process_.GetRegs(tid);
}

absl::StatusOr<bool> Int3Engine::HandleInPlace(pid_t tid, const siginfo_t& si) {
  if (si.si_signo != SIGTRAP) {
    return true;  // a fault a handler took (Claims): the copy runs again
  }
  if (auto t = threads_.find(tid); t != threads_.end() && t->second.stale_traps > 0) {
    --t->second.stale_traps;  // RestoreAll already dealt with this trap
    cached_tid_ = 0;
    return true;
  }
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, RegsOf(tid));
  const RemoteAddr at{regs.rip - 1};
  const bool resumed = TakeParked(tid, at);
  if (auto bp = breakpoints_.find(at); bp != breakpoints_.end()) {
    KW_RETURN_IF_ERROR(OnBreakpoint(tid, regs, bp->second, resumed));
    return true;
  }
  if (auto post = post_traps_.find(at); post != post_traps_.end()) {
    KW_RETURN_IF_ERROR(OnPostTrap(tid, regs, slots_.at(post->second)));
    return true;
  }
  if (trampoline_.value != 0 && xol_.IsTrampoline(at)) {
    KW_RETURN_IF_ERROR(OnReturn(tid, regs));
    return true;
  }
  if (retired_.contains(at)) {
    // Trapped on a breakpoint removed since: run the original instruction.
    regs.rip = at.value;
    KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
    return true;
  }
  return absl::InternalError(absl::StrFormat(
      "thread %d trapped at 0x%x, which is none of kwatch's breakpoints any more", tid, at.value));
}

bool Int3Engine::Admit(Probe& p) {
  const uint64_t used = p.is_return ? p.taken : p.stats.hits;
  if (!p.enabled || (p.maxhits != 0 && used >= p.maxhits)) {
    ++p.stats.misses;
    return false;
  }
  return true;
}

void Int3Engine::Consume(Probe& p) {
  uint64_t& used = p.is_return ? p.taken : p.stats.hits;
  ++used;
  if (p.maxhits != 0 && used >= p.maxhits) {
    p.enabled = false;
  }
}

void Int3Engine::Abandon(Instance& inst) {
  for (const ProbeId id : inst.probes) {
    Probe& p = probes_.at(id);
    --p.active;
    ++p.stats.abandoned;
  }
  Unjournal(inst.journal);
}

void Int3Engine::PruneDeadThreads() {
  const std::vector<pid_t> live = process_.TracedThreads();
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (!std::binary_search(live.begin(), live.end(), it->first)) {
      for (Instance& inst : it->second.instances) {
        Abandon(inst);
      }
      threads_.erase(it++);
    } else {
      ++it;
    }
  }
}

bool Int3Engine::TakeParked(pid_t tid, RemoteAddr at) {
  auto t = threads_.find(tid);
  if (t == threads_.end() || !t->second.parked_at.has_value()) {
    return false;
  }
  return std::exchange(t->second.parked_at, std::nullopt) == at;
}

absl::StatusOr<bool> Int3Engine::StepOver(pid_t tid) {
  KW_ASSIGN_OR_RETURN(user_regs_struct regs, process_.GetRegs(tid));
  const RemoteAddr at{regs.rip};
  const bool resumed = TakeParked(tid, at);
  regs.rip += 1;  // where the INT3's trap would have left it
  if (trampoline_.value != 0 && xol_.IsTrampoline(at)) {
    KW_RETURN_IF_ERROR(OnReturn(tid, regs));
    return true;
  }
  auto bp = breakpoints_.find(at);
  if (bp == breakpoints_.end()) {
    return false;
  }
  KW_RETURN_IF_ERROR(OnBreakpoint(tid, regs, bp->second, resumed));
  const Slot* slot = bp->second.slot;
  KW_ASSIGN_OR_RETURN(regs, process_.GetRegs(tid));
  if (slot == nullptr ||
      (regs.rip != slot->addr.value && regs.rip != slot->addr.value + kXolTrapOffset)) {
    return true;  // emulated (or parked again): the step is done
  }
  // Out of line: one step runs the copy; the jump back (or the post handlers' INT3) is taken
  // here instead of being stepped.
  const uint64_t copy = regs.rip;
  KW_ASSIGN_OR_RETURN(const int sig, process_.SingleStep(tid));
  if (sig == 0 || !process_.alive()) {
    return true;
  }
  KW_ASSIGN_OR_RETURN(regs, process_.GetRegs(tid));
  if (regs.rip != copy + slot->length) {
    return true;  // the copy went elsewhere (a signal the target handles): as it would
  }
  if (copy != slot->addr.value) {
    regs.rip += 1;  // as if the INT3 after the copy trapped
    KW_RETURN_IF_ERROR(OnPostTrap(tid, regs, *slot));
    return true;
  }
  regs.rip = slot->probed.value + slot->length;
  KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
  return true;
}

absl::Status Int3Engine::OnBreakpoint(pid_t tid, user_regs_struct& regs, Breakpoint& bp,
                                      bool resumed) {
  ++counters_.traps;
  user_regs_struct at = regs;
  at.rip = bp.addr.value;
  const ProbeContext ctx{tid, MonotonicNs(), bp.addr, at, false, {}, {}, process_};
  std::vector<ProbeId> post;
  std::vector<ProbeId> tracked;
  in_handler_ = true;
  absl::Cleanup not_in_handler = [this] { in_handler_ = false; };
  for (const ProbeId id : bp.probes) {
    Probe& p = probes_.at(id);
    if (resumed && !p.is_return) {
      continue;  // its handlers ran when the thread was parked here
    }
    if (!Admit(p)) {
      continue;
    }
    if (p.is_return) {
      if (p.active >= p.maxactive) {
        PruneDeadThreads();  // instances of threads gone meanwhile free their places
      }
      if (p.active >= p.maxactive) {
        ++p.stats.nmissed;
        continue;
      }
      Consume(p);
      ++p.active;
      tracked.push_back(id);
      if (p.handlers.entry && !resumed) {
        p.handlers.entry(ctx);
      }
      continue;
    }
    Consume(p);
    if (p.handlers.pre) {
      p.handlers.pre(ctx);
    }
    if (p.handlers.post) {
      post.push_back(id);
    }
  }
  std::move(not_in_handler).Invoke();
  if (std::exchange(park_, false)) {
    // --stop-on: the probed instruction has not run; the thread stops on SIGSTOP before it
    // does (the signal is taken on the way back to user space).
    for (const ProbeId id : tracked) {
      --probes_.at(id).active;  // not tracked after all
    }
    threads_[tid].parked_at = bp.addr;
    return Park(tid, at);
  }

  if (!tracked.empty()) {
    // Return probes: the trampoline replaces the return address at [rsp].
    ThreadState& ts = threads_[tid];
    while (!ts.instances.empty() && ts.instances.back().slot <= regs.rsp) {
      Abandon(ts.instances.back());  // a call left by longjmp: its frame is gone
      ts.instances.pop_back();
    }
    Instance inst;
    inst.slot = regs.rsp;
    inst.function = bp.addr;
    absl::Status s = process_.ReadMemory(
        RemoteAddr{regs.rsp}, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&inst.real_return), 8));
    if (s.ok()) {
      const auto real = Bytes64(inst.real_return);
      const auto tramp = Bytes64(trampoline_.value);
      Journal(PatchRecord::Kind::kReturnAddress, RemoteAddr{regs.rsp}, real, tramp, inst.journal);
      s = process_.WriteMemory(RemoteAddr{regs.rsp}, tramp);
    }
    if (s.ok()) {
      inst.probes = std::move(tracked);
      ts.instances.push_back(std::move(inst));
    } else {
      Unjournal(inst.journal);
      for (const ProbeId id : tracked) {  // the stack is not writable: not tracked after all
        Probe& p = probes_.at(id);
        --p.active;
        ++p.stats.nmissed;
      }
    }
  }

  const bool must_emulate = !post.empty() && !bp.insn.falls_through;  // jmp * never returns
  if (bp.emulate || must_emulate || bp.slot == nullptr) {
    user_regs_struct next = at;
    const absl::Status s = EmulateProbedInsn(bp.insn, next, memory_);
    if (s.ok()) {
      ++counters_.emulated;
      KW_RETURN_IF_ERROR(process_.SetRegs(tid, next));
      if (!post.empty()) {
        const ProbeContext after{tid, MonotonicNs(), bp.addr, next, false, {}, {}, process_};
        in_handler_ = true;
        for (const ProbeId id : post) {
          probes_.at(id).handlers.post(after);
        }
        in_handler_ = false;
      }
      return absl::OkStatus();
    }
    if (bp.slot == nullptr) {
      return {s.code(), absl::StrFormat("emulating '%s' at 0x%x in thread %d: %s", bp.insn.text,
                                        bp.addr.value, tid, s.message())};
    }
    // An emulated stack access failed (the stack is full, say): the copy runs instead and
    // meets the same fault as the original would.
  }
  ++counters_.out_of_line;
  regs.rip = bp.slot->addr.value;
  if (!post.empty()) {
    regs.rip += kXolTrapOffset;
    threads_[tid].posts.push_back(int3_internal::PendingPost{bp.addr, std::move(post)});
  }
  return process_.SetRegs(tid, regs);
}

absl::Status Int3Engine::OnPostTrap(pid_t tid, user_regs_struct& regs, const Slot& slot) {
  ++counters_.post_traps;
  regs.rip = slot.probed.value + slot.length;
  std::vector<ProbeId> ids;
  if (auto t = threads_.find(tid); t != threads_.end()) {
    auto& posts = t->second.posts;
    for (auto it = posts.rbegin(); it != posts.rend(); ++it) {
      if (it->addr == slot.probed) {
        ids = std::move(it->probes);
        posts.erase(std::next(it).base());
        break;
      }
    }
  }
  KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
  const ProbeContext ctx{tid, MonotonicNs(), slot.probed, regs, false, {}, {}, process_};
  in_handler_ = true;
  for (const ProbeId id : ids) {
    const Probe& p = probes_.at(id);
    if (p.registered && p.handlers.post) {
      p.handlers.post(ctx);
    }
  }
  in_handler_ = false;
  return absl::OkStatus();
}

absl::Status Int3Engine::OnReturn(pid_t tid, user_regs_struct& regs) {
  ++counters_.returns;
  const uint64_t slot = regs.rsp - 8;  // `ret` popped the return address from there
  auto t = threads_.find(tid);
  std::vector<Instance>* st = t == threads_.end() ? nullptr : &t->second.instances;
  if (st != nullptr && !st->empty() && st->back().slot != slot) {
    // Calls abandoned by longjmp or an exception lie deeper than the one returning (`ret
    // imm16` returns with rsp above slot + 8).
    while (st->size() >= 2 && (*st)[st->size() - 2].slot <= slot) {
      Abandon(st->back());
      st->pop_back();
    }
  }
  if (st == nullptr || st->empty() || st->back().slot > slot) {
    return absl::InternalError(absl::StrFormat(
        "thread %d returned through kwatch's trampoline (rsp 0x%x) but no call of it is "
        "tracked; its real return address is lost",
        tid, regs.rsp));
  }
  Instance inst = std::move(st->back());
  st->pop_back();
  Unjournal(inst.journal);
  regs.rip = inst.real_return;
  KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
  const ProbeContext ctx{tid,           MonotonicNs(), inst.function,
                         regs,          true,          RemoteAddr{inst.real_return},
                         inst.function, process_};
  in_handler_ = true;
  for (const ProbeId id : inst.probes) {
    Probe& p = probes_.at(id);
    --p.active;
    if (p.registered) {
      ++p.stats.hits;
      if (p.handlers.pre) {
        p.handlers.pre(ctx);
      }
    }
  }
  in_handler_ = false;
  if (std::exchange(park_, false)) {
    return Park(tid, regs);  // in the caller, right after the return
  }
  return absl::OkStatus();
}

absl::Status Int3Engine::Park(pid_t tid, const user_regs_struct& regs) {
  KW_RETURN_IF_ERROR(process_.SetRegs(tid, regs));
  if (::syscall(SYS_tgkill, process_.pid(), tid, SIGSTOP) != 0) {
    const int err = errno;
    return SyscallError(err, absl::StrFormat("tgkill(%d, %d, SIGSTOP)", process_.pid(), tid));
  }
  ++counters_.parked;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Restoration.

const Int3Engine::Slot* Int3Engine::SlotContaining(RemoteAddr rip) const {
  auto it = slots_.upper_bound(rip.value);
  if (it == slots_.begin()) {
    return nullptr;
  }
  --it;
  return rip.value < it->first + kXolSlotSize ? &it->second : nullptr;
}

bool Int3Engine::MoveOutOfCopy(user_regs_struct& regs) const {
  const Slot* slot = SlotContaining(RemoteAddr{regs.rip});
  if (slot == nullptr) {
    return false;
  }
  const uint64_t off = regs.rip - slot->addr.value;
  if (off == 0 || off == kXolTrapOffset) {
    regs.rip = slot->probed.value;  // the copy has not run: the original will
  } else if (off == slot->length || off == kXolTrapOffset + slot->length) {
    // It ran (a system call run there restarts from the original, same length).
    regs.rip = slot->probed.value + slot->length;
  } else {
    return false;
  }
  return true;
}

absl::Status Int3Engine::RestoreAll() {
  if (in_handler_) {
    return Mutable();
  }
  if (!process_.alive()) {
    DropImage();
    return absl::OkStatus();
  }
  KW_RETURN_IF_ERROR(StopWorld());
  absl::Status status = absl::OkStatus();
  auto note = [&status](const absl::Status& s) {
    if (status.ok() && !s.ok()) {
      status = s;
    }
  };
  cached_tid_ = 0;
  // 1. Threads stopped just after one of kwatch's INT3s (the trap taken, not yet handled):
  //    finish or undo the hit now, and absorb the SIGTRAP still to come. Threads inside a
  //    copy go back to the original code.
  for (const pid_t tid : process_.TracedThreads()) {
    auto regs = process_.GetRegs(tid);
    if (!regs.ok()) {
      continue;  // gone meanwhile
    }
    const RemoteAddr at{regs->rip - 1};
    bool trapped = true;
    if (breakpoints_.contains(at)) {
      regs->rip = at.value;  // undone: the instruction runs unprobed
      note(process_.SetRegs(tid, *regs));
    } else if (auto post = post_traps_.find(at); post != post_traps_.end()) {
      note(OnPostTrap(tid, *regs, slots_.at(post->second)));
    } else if (trampoline_.value != 0 && xol_.IsTrampoline(at)) {
      note(OnReturn(tid, *regs));
    } else {
      trapped = false;
      if (MoveOutOfCopy(*regs)) {
        if (auto t = threads_.find(tid); t != threads_.end() && !t->second.posts.empty()) {
          t->second.posts.pop_back();  // its post handlers will not run
        }
        note(process_.SetRegs(tid, *regs));
      }
    }
    if (trapped) {
      ThreadState& ts = threads_[tid];
      ++ts.stale_traps;
      if (TrapPending(tid)) {
        // Still queued: make it arrive now (a system call's single-step takes it), while
        // kwatch claims it, rather than after kwatch has gone.
        note(WithRemoteSyscalls(tid, [&]() -> absl::Status {
          return process_.RemoteSyscall(tid, SYS_getpid, {}).status();
        }));
        ts.stale_traps = 0;
      }
    }
  }
  // 2. The original bytes.
  for (auto& [addr, bp] : breakpoints_) {
    note(RemoveBreakpoint(bp));
  }
  breakpoints_.clear();
  // 3. Replaced return addresses, where the stacks still hold the trampoline.
  for (auto& [tid, ts] : threads_) {
    for (Instance& inst : ts.instances) {
      uint64_t now = 0;
      const absl::Status r = process_.ReadMemory(
          RemoteAddr{inst.slot}, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&now), 8));
      if (r.ok() && now == trampoline_.value) {
        note(process_.WriteMemory(RemoteAddr{inst.slot}, Bytes64(inst.real_return)));
      }
      for (const ProbeId id : inst.probes) {
        --probes_.at(id).active;
      }
      Unjournal(inst.journal);
    }
    ts.instances.clear();
    ts.posts.clear();
  }
  for (auto& [id, p] : probes_) {
    p.registered = false;
    p.enabled = false;
  }
  fault_handlers_ = 0;
  note(ResumeWorld());
  return status;
}

void Int3Engine::DropImage() {
  for (auto& [addr, bp] : breakpoints_) {
    Unjournal(bp.journal);
  }
  for (auto& [tid, ts] : threads_) {
    for (Instance& inst : ts.instances) {
      Unjournal(inst.journal);
    }
  }
  breakpoints_.clear();
  slots_.clear();
  slot_of_.clear();
  post_traps_.clear();
  retired_.clear();
  threads_.clear();
  xol_.Clear();
  trampoline_ = RemoteAddr{0};
  cached_tid_ = 0;
  fault_handlers_ = 0;
  for (auto& [id, p] : probes_) {
    p.registered = false;
    p.enabled = false;
    p.active = 0;
  }
}

void Int3Engine::OnExec() {
  DropImage();
}

void Int3Engine::OnThreadExit(pid_t tid) {
  auto it = threads_.find(tid);
  if (it == threads_.end()) {
    return;
  }
  for (Instance& inst : it->second.instances) {
    Abandon(inst);
  }
  threads_.erase(it);
}

absl::Status Int3Engine::OnFork(ptrace::Process& child) {
  // The child is a copy of the forking thread: give it the original code, its own return
  // addresses (the copies of every thread's stack are rewritten: only the forking thread's
  // matter, the others are dead memory in the child), and take it out of any copy. The XOL
  // areas stay mapped in it (fork copied them); nothing of kwatch runs there any more.
  absl::Status status = absl::OkStatus();
  auto note = [&status](const absl::Status& s) {
    if (status.ok() && !s.ok()) {
      status = s;
    }
  };
  for (const auto& [addr, bp] : breakpoints_) {
    note(child.WriteMemory(addr, std::span<const uint8_t>(bp.insn.bytes.data(), 1)));
  }
  for (const auto& [tid, ts] : threads_) {
    for (const Instance& inst : ts.instances) {
      uint64_t now = 0;
      const absl::Status r = child.ReadMemory(
          RemoteAddr{inst.slot}, std::span<uint8_t>(reinterpret_cast<uint8_t*>(&now), 8));
      if (r.ok() && now == trampoline_.value) {
        note(child.WriteMemory(RemoteAddr{inst.slot}, Bytes64(inst.real_return)));
      }
    }
  }
  if (!slots_.empty()) {
    auto regs = child.GetRegs(child.pid());
    if (regs.ok() && MoveOutOfCopy(*regs)) {
      note(child.SetRegs(child.pid(), *regs));
    }
  }
  return status;
}

std::unique_ptr<Int3Engine> Int3Engine::AdoptFork(ptrace::Process& child, pid_t forking_tid,
                                                  ptrace::Guardian* guardian) const {
  auto e = std::make_unique<Int3Engine>(child);
  e->guardian_ = guardian;
  e->xol_ = xol_;
  e->trampoline_ = trampoline_;
  e->slots_ = slots_;
  e->slot_of_ = slot_of_;
  e->post_traps_ = post_traps_;
  e->retired_ = retired_;
  e->next_id_ = next_id_;
  e->fault_handlers_ = fault_handlers_;
  e->probes_ = probes_;
  for (auto& [id, p] : e->probes_) {
    p.stats = ProbeStats{};
    p.taken = 0;
    p.active = 0;
  }
  for (const auto& [addr, bp] : breakpoints_) {
    Breakpoint copy = bp;
    if (bp.slot != nullptr) {
      copy.slot = &e->slots_.at(bp.slot->addr.value);  // the child's own copy of the slot
    }
    const uint8_t int3 = kInt3;
    e->Journal(PatchRecord::Kind::kBreakpoint, addr,
               std::span<const uint8_t>(bp.insn.bytes.data(), 1),
               std::span<const uint8_t>(&int3, 1), copy.journal);
    e->breakpoints_.emplace(addr, std::move(copy));
  }
  if (auto t = threads_.find(forking_tid); t != threads_.end()) {
    ThreadState ts = t->second;
    ts.stale_traps = 0;
    for (Instance& inst : ts.instances) {
      const auto real = Bytes64(inst.real_return);
      const auto tramp = Bytes64(trampoline_.value);
      e->Journal(PatchRecord::Kind::kReturnAddress, RemoteAddr{inst.slot}, real, tramp,
                 inst.journal);
      for (const ProbeId id : inst.probes) {
        if (auto p = e->probes_.find(id); p != e->probes_.end()) {
          ++p->second.active;
        }
      }
    }
    e->threads_.emplace(child.pid(), std::move(ts));
  }
  return e;
}

void Int3Engine::OnFollowedFork(ptrace::Process& child, pid_t parent_tid) {
  forked_[child.pid()] = AdoptFork(child, parent_tid, nullptr);
}

std::unique_ptr<Int3Engine> Int3Engine::TakeForkedEngine(pid_t pid) {
  auto it = forked_.find(pid);
  if (it == forked_.end()) {
    return nullptr;
  }
  std::unique_ptr<Int3Engine> e = std::move(it->second);
  forked_.erase(it);
  return e;
}

void Int3Engine::JournalInto(ptrace::Guardian* guardian) {
  guardian_ = guardian;
  const uint8_t int3 = kInt3;
  for (auto& [addr, bp] : breakpoints_) {
    if (bp.journal == int3_internal::kNoJournal) {
      Journal(PatchRecord::Kind::kBreakpoint, addr,
              std::span<const uint8_t>(bp.insn.bytes.data(), 1), std::span<const uint8_t>(&int3, 1),
              bp.journal);
    }
  }
  const auto tramp = Bytes64(trampoline_.value);
  for (auto& [tid, ts] : threads_) {
    for (Instance& inst : ts.instances) {
      if (inst.journal == int3_internal::kNoJournal) {
        Journal(PatchRecord::Kind::kReturnAddress, RemoteAddr{inst.slot}, Bytes64(inst.real_return),
                tramp, inst.journal);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Records.

std::vector<PatchRecord> Int3Engine::Patches() const {
  std::vector<PatchRecord> out;
  for (const auto& [addr, bp] : breakpoints_) {
    PatchRecord r;
    r.kind = PatchRecord::Kind::kBreakpoint;
    r.addr = addr;
    r.original = {bp.insn.bytes[0]};
    r.patched = {kInt3};
    out.push_back(std::move(r));
  }
  for (const auto& [tid, ts] : threads_) {
    for (const Instance& inst : ts.instances) {
      PatchRecord r;
      r.kind = PatchRecord::Kind::kReturnAddress;
      r.addr = RemoteAddr{inst.slot};
      const auto real = Bytes64(inst.real_return);
      const auto tramp = Bytes64(trampoline_.value);
      r.original.assign(real.begin(), real.end());
      r.patched.assign(tramp.begin(), tramp.end());
      r.tid = tid;
      out.push_back(std::move(r));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const PatchRecord& a, const PatchRecord& b) { return a.addr < b.addr; });
  return out;
}

void Int3Engine::Journal(PatchRecord::Kind kind, RemoteAddr addr, std::span<const uint8_t> original,
                         std::span<const uint8_t> patched, uint32_t& handle) {
  (void)kind;
  handle = int3_internal::kNoJournal;
  if (guardian_ == nullptr) {
    return;
  }
  auto h = guardian_->Record(addr, original, patched);
  if (h.ok()) {
    handle = *h;
  }
}

void Int3Engine::Unjournal(uint32_t& handle) {
  if (guardian_ != nullptr && handle != int3_internal::kNoJournal) {
    guardian_->Forget(handle);
  }
  handle = int3_internal::kNoJournal;
}

}  // namespace kwatch::core::probe
