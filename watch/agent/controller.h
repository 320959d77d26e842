#pragma once

// kwatch's side of one agent session (docs/agent.md "Life of a session"): it owns the shared
// memory mapping (kwatch's view), the lifeline's only write end, the tables in it, the patches
// it made in the target's code and the code it placed there (XOL copies, trampolines).
//
//  - Load: LoadAgent (loader.h) in a stopped target.
//  - Arm, with every thread stopped by a core::Process: PlaceCode, AddProbe, Patch (the
//    journal entry is published before the code changes; jumps as text_poke_bp: INT3, tail,
//    first byte, refused while a thread's rip is inside the range), Activate.
//  - Run, with ptrace detached: Drain every ring (records with CLOCK_MONOTONIC times) and Wait
//    for the lifeline (POLLERR: every holder of the read end, the agent's process and its
//    children, ended or exec'd) and the target's pidfd (exit).
//  - End: every thread stopped (the caller's Process, or a new seize), state Stopping, patches
//    undone in reverse (jumps INT3 first), journal cleared, threads moved out of XOL copies,
//    state Restored; then (Finish) detach, a last drain, the lifeline closed. The agent, its
//    mapping and the code kwatch placed stay in the target: a thread may still be inside them, and
//    they lead back to the restored code.
//
// Lifetime: one per target process and session. Not thread-safe: call it from the thread that
// traces the target (ptrace is per tracer thread).

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/abi.h"
#include "core/base/remote_addr.h"
#include "core/base/target_files.h"
#include "core/base/unique_fd.h"
#include "core/ptrace/process.h"
#include "watch/agent/loader.h"
#include "watch/agent/ring_reader.h"
#include "watch/agent/tables.h"
#include "watch/agent/tsc_clock.h"

namespace kwatch::watch::agent {

// One record drained from a ring.
struct AgentHit {
  uint32_t ring = 0;  // the thread slot it came from
  pid_t pid = 0;      // the process of the ring's thread (a followed child differs)
  kwatch::agent::KwRecord record{};
  std::span<const uint8_t> payload{};  // valid during the callback only
  uint64_t time_ns = 0;                // CLOCK_MONOTONIC of record.tsc
};
using HitFn = std::function<void(const AgentHit&)>;

struct Liveness {
  bool agent_gone = false;     // POLLERR on the lifeline's write end
  bool target_exited = false;  // the pidfd is readable
};

// A fork child that kept its probes (-f), as its agent registered it (agent/abi.h
// "Followed processes").
struct FollowedProcess {
  uint32_t entry = 0;  // its KwProcess
  pid_t pid = 0;
  pid_t parent = 0;
  uint32_t state = 0;  // KwProcessState
};

// Builds code for the address it will run at (an XOL copy, a trampoline).
using CodeBuilder = std::function<absl::StatusOr<std::vector<uint8_t>>(core::RemoteAddr at)>;

class Controller {
 public:
  // Loads the agent into `proc` (LoadAgent) and takes its session over.
  static absl::StatusOr<std::unique_ptr<Controller>> Load(core::ptrace::Process& proc,
                                                          const LoadOptions& options);
  // Takes over an agent LoadAgent loaded into process `pid`. Internal error when the pidfd
  // cannot be opened (the process is gone).
  static absl::StatusOr<std::unique_ptr<Controller>> Adopt(LoadedAgent agent, pid_t pid);

  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  pid_t pid() const { return pid_; }
  const LoadedAgent& agent() const { return agent_; }
  ShmTables& tables() { return tables_; }
  const ShmTables& tables() const { return tables_; }
  const TscClock& clock() const { return clock_; }
  int lifeline_fd() const { return agent_.lifeline.get(); }
  int pidfd() const { return pidfd_.get(); }
  // Whether the agent's tids and pids are kwatch's (the target shares kwatch's pid namespace).
  bool ids_are_kwatchs() const { return ids_.identity(); }

  // ---- Arming: every thread of `proc` stopped. ----

  // Places `size` bytes of code built by `build` for their address, in a read+execute area
  // kwatch maps within +-1 GiB of `near` (core::FindXolGap) and keeps for the image's life.
  // 16-byte aligned. OutOfRange when no area can be mapped near enough.
  absl::StatusOr<core::RemoteAddr> PlaceCode(core::ptrace::Process& proc, core::RemoteAddr near,
                                             uint64_t size, const CodeBuilder& build);

  // Writes a probe into the tables (ShmTables::AddProbe) and remembers its out-of-line copy
  // for End. Returns its index.
  absl::StatusOr<uint32_t> AddProbe(const ProbeEntry& entry);

  // Patches the code of probe `probe_index` at `addr` with `bytes`: {0xCC} (an INT3 probe) or
  // a jmp rel32 and its fill (5..16 bytes, a jump probe), journaled first. A jump is written
  // INT3 first, then its tail, then its first byte; FailedPrecondition (naming the thread)
  // when a thread's rip is inside (addr, addr + len): use INT3 for that probe.
  absl::Status Patch(core::ptrace::Process& proc, uint32_t probe_index, core::RemoteAddr addr,
                     std::span<const uint8_t> bytes);
  // Undoes the patch of one probe (jumps INT3 first) and frees its journal entry.
  absl::Status Unpatch(core::ptrace::Process& proc, uint32_t probe_index);
  size_t patches() const { return patches_.size(); }

  // State Active: the agent takes hits.
  void Activate();

  // ---- Running (ptrace may be detached). ----

  // Reads every ring, oldest record first per ring, into `fn`; recalibrates the clock first.
  // Totals over the rings; the first ring that held garbage is reported as DataLoss after the
  // others were drained.
  absl::StatusOr<DrainStats> Drain(const HitFn& fn);
  // Frees the thread slots of threads that are gone (after draining their rings, and calling
  // `before_free` with each slot when given).
  absl::Status ReapThreadSlots(
      const HitFn& fn, const std::function<void(kwatch::agent::KwThread&)>& before_free = nullptr);
  // Waits up to `timeout` for the agent's end or the target's exit (poll on both fds).
  absl::StatusOr<Liveness> Wait(absl::Duration timeout);
  // The exit status of a launched target (kwatch's child) once it exited and was reaped
  // here; nullopt while it runs or when it is not kwatch's child.
  std::optional<core::ptrace::ExitInfo> ReapExit();

  // -f: the fork children registered in the process table (KwProcess), but those that left
  // (restored their own code): the target's descendants that keep the probes.
  std::vector<FollowedProcess> Followed() const;
  // Frees the entry of a followed process that ended.
  void ForgetProcess(uint32_t entry) { tables_.FreeProcess(entry); }
  // Whether process `pid` maps this session's shared memory (at the target's address): it is
  // one of the agent's processes, not an exec'd image or another process under a reused pid.
  bool MapsSession(pid_t pid) const;
  // Whether process `pid` still holds the agent's end of the lifeline (the same pipe under
  // KwControl::lifeline_fd): false once it exec'd (close-on-exec) or ended.
  bool HoldsLifeline(pid_t pid) const;
  // The followed children whose code the end restored (seized, restored, let go), in order.
  const std::vector<pid_t>& released_children() const { return released_children_; }

  // Runs `fn` with every thread of the target seized and stopped (a session that detached
  // and now changes probes or patches), then detaches. NotFound when the target is gone.
  absl::Status RunStopped(const std::function<absl::Status(core::ptrace::Process&)>& fn) const;

  // ---- The end. ----

  // Takes every patch out, as the class comment says, with every thread of `proc` stopped
  // (they stay stopped and traced: the caller detaches, then calls Finish). A target that has
  // exited has nothing to restore. Followed children (-f) are restored first, each seized in
  // turn while the target is stopped (it forks no more), until the process table names no
  // child not done (a child forked meanwhile either registered or saw state Stopping and
  // restored itself).
  absl::Status End(core::ptrace::Process& proc);
  // The last drain (records of hits in flight at End land after the detach) into `fn`, then
  // the lifeline closes: the agent's watchdog sees state Restored and does nothing more.
  absl::Status Finish(const HitFn& fn);
  // End for a session that detached: seizes the target again, End, detach, Finish. A target
  // that has exited has nothing to restore, but its followed children may.
  absl::Status EndDetached(const HitFn& fn);
  bool ended() const { return ended_; }

 private:
  struct Applied {
    uint32_t probe_index = 0;
    uint32_t journal = 0;
    core::RemoteAddr addr;
    std::vector<uint8_t> original;
    std::vector<uint8_t> patched;
  };
  struct CodeArea {
    core::RemoteAddr start{};
    uint64_t size = 0;
    uint64_t used = 0;
  };
  struct Copy {
    core::RemoteAddr probe{};  // the probed address
    core::RemoteAddr copy{};   // its XOL copy
    uint32_t length = 0;       // the probed instruction's (INT3 copies), 0 for jump probes
  };

  Controller(LoadedAgent agent, pid_t pid, core::UniqueFd pidfd);
  absl::Status Restore(core::ptrace::Process& proc, const Applied& a);
  // Writes the original bytes of `a` back in a followed child, if they are still the patch's
  // (or in between: the child's own restore may have begun); the journal is left alone.
  static absl::Status RestoreCopy(core::ptrace::Process& proc, const Applied& a);
  // End once the target is gone: state Stopping, the followed children restored, the journal
  // cleared, state Restored.
  absl::Status EndGone();
  // Restores the followed children (End's first part): every error is kept, the first
  // returned after all were tried.
  absl::Status EndFollowed();
  // Seizes followed child `pid`, restores its copy of the code, moves its threads out of the
  // out-of-line copies and lets it go. False when it is gone or no longer the agent's.
  absl::StatusOr<bool> RestoreFollowed(pid_t pid);
  absl::Status MoveThreadsOutOfCopies(core::ptrace::Process& proc);
  absl::StatusOr<CodeArea*> MapArea(core::ptrace::Process& proc, core::RemoteAddr near,
                                    uint64_t size);

  pid_t pid_;
  LoadedAgent agent_;
  ShmTables tables_;
  core::UniqueFd pidfd_;
  TscClock clock_;
  std::vector<uint64_t> last_lost_;  // per ring
  std::vector<Applied> patches_;     // in the order made
  std::vector<CodeArea> areas_;
  std::vector<Copy> copies_;
  // The agent's pids and tids are the target's namespace's (a container's): kwatch's here.
  mutable core::NamespaceIds ids_;
  uint64_t shm_inode_ = 0;       // kwatch's memfd (MapsSession)
  uint64_t lifeline_inode_ = 0;  // the lifeline pipe (HoldsLifeline)
  std::vector<pid_t> released_children_;
  bool ended_ = false;
};

}  // namespace kwatch::watch::agent
