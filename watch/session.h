#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/event.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "core/symbols/unwind.h"
#include "drmgr/debug_regs.h"
#include "drmgr/slot_allocator.h"
#include "watch/backend.h"
#include "watch/follow.h"
#include "watch/slot_backend.h"

namespace kwatch::watch {

class CallWatches;
class PageBackend;

// drmgr priority of a per-call watch's request: below the session's own watches (10), whose
// registers it never takes.
inline constexpr int kCallWatchPriority = 5;

// What the user asked to watch.
struct WatchRequest {
  std::string expr;  // as typed: "g_stats.hits", "&jiffies", "0x601040:4"
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  bool reads_only = false;         // --read: read-write in hardware, writes filtered out
  std::optional<uint64_t> length;  // --len: overrides the length of the expression's type
  // --follow: evaluated again through its pointers whenever one of them is written, the watch
  // moved to where it leads then (gdb's `watch`); false: a location (gdb's `watch -l`).
  bool follow = false;
};

// A resolved, armed watch.
struct Watch {
  uint32_t id = 0;
  WatchRequest request;
  core::symbols::ResolvedExpr target;
};

// What a hardware session does with watches beyond the four debug registers of a thread.
enum class Overcommit : uint8_t {
  kPages,      // watch them with page protection (default for processes)
  kMultiplex,  // rotate the watches through the registers; counts scaled by coverage
  kFail,       // refuse the session
};
absl::string_view OvercommitName(Overcommit o);

// How one watch runs, decided by drmgr (hardware sessions) or the backend choice.
struct WatchPlacement {
  BackendKind backend = BackendKind::kPage;  // kPerf/kStop: debug registers; kPage: pages
  bool multiplexed = false;                  // takes turns for debug registers
  double coverage = 1.0;             // fraction of the session it was in hardware (multiplexed)
  std::vector<int> slots;            // debug registers (DR0-DR3) it holds now, one per chunk
  std::vector<drmgr::Chunk> chunks;  // the hardware cover
  bool exact = true;                 // false: a wider cover, the extra bytes filtered
  bool shared = false;               // some register also serves another watch
  std::string detail;                // for people: what drmgr chose and why
};

struct SessionOptions {
  BackendKind backend = BackendKind::kAuto;
  Overcommit overcommit = Overcommit::kPages;
  // The user asked for debug registers by name (--backend perf/stop) and said nothing about
  // overcommit: overcommit is kFail, and a refusal says how to allow pages or multiplexing.
  bool hardware_asked = false;
  absl::Duration mux_interval = absl::Milliseconds(10);  // multiplex rotation
  // Exact values at the access are needed (--if on new/old): auto prefers stop mode to perf
  // stream mode, and perf stream mode is refused.
  bool exact_values = false;
  size_t stack_frames = 0;      // --stack: backtrace of each access, at most this many frames
  size_t ring_pages = 256;      // per event, power of two
  uint32_t wakeup_events = 64;  // samples per wakeup; a periodic drain picks up the rest
  // A debugger shares the registers and takes them when it needs them (`kwatch gdbserver`,
  // LendSlots): with overcommit kPages, an execute watch it displaces takes turns (pages cannot
  // watch execution) instead of failing.
  bool debugger_shares = false;
  // Per-call watches are declared after Create (DeclareCallWatch): Create takes no request then.
  bool per_call = false;
};

// Watches of one target process. Resolves expressions against the target's symbols and
// runs them through one backend (perf stream mode, or page protection). Owns the backend and
// the symbols. Not thread-safe; use it from the thread that owns the Process.
class WatchSession {
 public:
  // Resolves every expression against the target's symbols (read from the process now),
  // checks that each fits the backend, and picks the backend (kAuto: hardware breakpoints
  // when this machine delivers their traps, else page protection, with a note saying why).
  // Nothing is armed yet.
  // `symbols`: the target's, read earlier (--arm-at: before the point, so that the world
  // stops only for the resolution); nullptr: read from the process now.
  static absl::StatusOr<std::unique_ptr<WatchSession>> Create(
      core::ptrace::Process& proc, std::vector<WatchRequest> requests,
      const SessionOptions& opts = {}, std::shared_ptr<core::symbols::Symbols> symbols = nullptr);
  // -f/--follow-forks: the session of `child`, a process `parent`'s target forked and kwatch
  // follows (stopped, one thread, not resumed yet): the same resolved watches (the child's
  // memory is a copy of the parent's), the same backend and options, the parent's symbols
  // shared. The child was cleaned up at its fork event (no protected page of the parent's is
  // left in it; breakpoints are never inherited): FailedPrecondition names what could not be
  // undone. Nothing is armed yet: Arm() it before the child runs, and the child's accesses
  // are exact from its first instruction.
  static absl::StatusOr<std::unique_ptr<WatchSession>> ForFork(WatchSession& parent,
                                                               core::ptrace::Process& child);
  WatchSession(const WatchSession&) = delete;
  WatchSession& operator=(const WatchSession&) = delete;
  ~WatchSession();

  // Installs the watches (all or nothing).
  absl::Status Arm();
  // Removes them; the target keeps running. Drain() first: perf samples still in the rings
  // are dropped.
  void Disarm();
  bool armed() const { return armed_; }
  // After the target's exec: the watches ended with the old image (nothing is restored).
  void Forget();

  // Collects what the backend observed, sorted by time, fills in values where the backend
  // could not (perf: read once per watch per batch, at drain time), filters writes out of
  // --read watches, and passes each event to `sink`. Returns the number delivered.
  size_t Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink);

  // Multiplexing: rotates the watches through the debug registers once per mux interval.
  // True when the armed registers changed (Fds() changed).
  absl::StatusOr<bool> Tick(absl::Time now);
  bool multiplexing() const { return multiplexing_; }
  // A debugger sharing the target (`kwatch gdbserver`) holds `n` (0-4) debug registers of the
  // target's threads, and watches `debugger_data` (absolute ranges: address, length) with them:
  // drmgr counts the registers as held outside kwatch, so kwatch's lowest-ranked watches give
  // theirs up and get them back when `n` drops. A displaced data watch moves to page protection
  // (overcommit kPages: exact, its counts go on; the target must be stopped, as it is when a
  // debugger inserts its points) unless its pages hold one of the debugger's data ranges (page
  // protection would hide those accesses from the debugger's registers): that one, and an
  // execute watch, take turns in the rest (multiplexed, counted with coverage), as with
  // --overcommit=multiplex; with kFail they wait, counting nothing. Returns a line for people per
  // watch whose placement changed. FailedPrecondition for a session without debug registers.
  absl::StatusOr<std::vector<std::string>> LendSlots(
      int n, const std::vector<std::pair<uint64_t, uint64_t>>& debugger_data = {});

  // Joining (cli/join_server.h): another kwatch's watches, added to this armed hardware
  // session as drmgr client `client_name` (its own client, at watchpoint priority; `kwatch slots`
  // shows each as "EXPR [client_name]"). Each gets a
  // register from the same drmgr or, with --overcommit=multiplex, takes turns; a watch that would
  // need page protection is refused (pages cannot be added to a running session yet), as is an
  // execute watch. All or nothing: on error no watch was added. Returns their ids (after the
  // session's own); their events come out of Drain like the others'.
  absl::StatusOr<std::vector<uint32_t>> AddWatches(std::vector<WatchRequest> requests,
                                                   const std::string& client_name);
  // Removes watches AddWatches added (Drain first: their samples still in the rings are
  // dropped); their registers go back to drmgr, and waiting watches may get them. Their ids stay
  // taken (placement() says "removed").
  absl::Status RemoveWatches(const std::vector<uint32_t>& ids);

  // Per-call watches (watch/call_watches.h). DeclareCallWatch adds a watch of `shape` (its
  // display, length, type and layout; its address 0: events of it count at their offset into
  // each call's object) that is armed only per call, by ArmCall. Hardware sessions, before
  // Arm; FailedPrecondition otherwise. Returns its id.
  absl::StatusOr<uint32_t> DeclareCallWatch(WatchRequest request,
                                            core::symbols::ResolvedExpr shape);
  bool per_call(uint32_t id) const { return id < per_call_.size() && per_call_[id]; }
  // Arms per-call watch `id` over its length at `addr`, in thread `tid` only, for call `call`:
  // a drmgr request of the thread's scope at kCallWatchPriority that takes no one's register.
  // Returns "" when it is in the registers, else why not (for people: no register free, a
  // range the registers cannot cover...). The thread must be stopped.
  absl::StatusOr<std::string> ArmCall(uint32_t id, uint32_t call, pid_t tid, core::RemoteAddr addr);
  // Ends call `call` of watch `id` (no-op when it was not armed): its events in the rings are
  // kept for the next Drain, and its register goes back.
  absl::Status EndCall(uint32_t id, uint32_t call);
  // The per-call watches' probes and calls; owned from here on (Disarm removes their probes).
  void SetCalls(std::unique_ptr<CallWatches> calls);
  CallWatches* calls() const { return calls_.get(); }

  std::vector<int> Fds() const;
  uint64_t lost() const;
  uint64_t unrelated() const;
  // Page mode: what the kernel did with the protected pages in system calls; null otherwise.
  const KernelAccessStats* kernel_access() const {
    return page_ != nullptr ? page_->kernel_access() : nullptr;
  }
  uint64_t filtered() const { return filtered_; }
  // Page mode: times the program's SIGSEGV handler was put back after the kernel reset it at a
  // fault of kwatch's, and resets left alone (SA_RESETHAND); see watch/page_backend.h.
  uint64_t segv_handler_restores() const;
  uint64_t segv_handler_resets_kept() const;
  // The session's main backend: the hardware one when some watch is in debug registers.
  BackendKind backend() const;
  // How watch `id` runs (kept current: multiplex coverage at the last Tick or Disarm).
  WatchPlacement placement(uint32_t id) const;
  // drmgr's decisions (hardware sessions), for `kwatch slots`; nullptr in page mode.
  const drmgr::SlotAllocator* allocator() const { return alloc_.get(); }
  // Debug registers of the target that the kernel said are held outside kwatch.
  int external_slots() const;
  // --stack: the backtrace of AccessEvent::stack_id (innermost first; frame 0 is where the
  // thread stopped, the others return addresses); nullptr for 0 or an unknown id.
  const std::vector<core::RemoteAddr>* stack(uint32_t id) const {
    return id == 0 || id > stacks_.size() ? nullptr : &stacks_[id - 1];
  }
  // A line for the user about the backend ("note: ..." why auto chose it, "warning: ..."
  // when a forced backend cannot work here), "" when there is nothing to say.
  const std::string& backend_note() const { return backend_note_; }

  // --follow: how watch `id` follows its pointers; nullptr for a location watch. Its target's
  // address is the object's now (0 while parked).
  const FollowedWatch* followed(uint32_t id) const {
    auto it = followed_.find(id);
    return it == followed_.end() ? nullptr : &it->second;
  }
  // --follow: the moves since the last call, in time order (watch/follow.h).
  std::vector<FollowMove> TakeMoves() { return std::exchange(moves_, {}); }
  // --follow: lines for people about it ("'g_x' goes through no pointer...").
  const std::vector<std::string>& follow_notes() const { return follow_notes_; }

  const std::vector<Watch>& watches() const { return watches_; }
  const SessionOptions& options() const { return opts_; }
  core::ptrace::Process& process() const { return proc_; }
  core::symbols::Symbolizer& symbolizer() { return *symbolizer_; }
  const core::symbols::Symbols& symbols() const { return *symbols_; }

 private:
  WatchSession(core::ptrace::Process& proc, std::shared_ptr<core::symbols::Symbols> symbols,
               std::shared_ptr<core::symbols::Symbolizer> symbolizer, std::vector<Watch> watches);

  // drmgr's reason with its request numbers replaced by the watches users know.
  std::string PeopleReason(const std::string& reason) const;

  core::ptrace::Process& proc_;
  // Shared with the sessions of followed fork children (same image, same addresses).
  std::shared_ptr<core::symbols::Symbols> symbols_;
  std::shared_ptr<core::symbols::Symbolizer> symbolizer_;
  std::vector<Watch> watches_;
  SessionOptions opts_;
  BackendKind kind_ = BackendKind::kPage;  // the hardware kind, or kPage for pages only
  std::unique_ptr<drmgr::SlotAllocator> alloc_;
  drmgr::ClientId client_;
  std::map<uint32_t, drmgr::RequestId> request_of_;      // by watch id
  std::map<uint32_t, drmgr::ShortagePolicy> policy_of_;  // own watches' requests, by id
  std::vector<core::AccessEvent> carried_;  // collected from a page backend replaced since
  uint64_t handler_restores_carried_ = 0;   // ... and its counts of the program's handler
  uint64_t handler_resets_kept_carried_ = 0;
  // Makes drmgr's kFallbackPages decisions real: the page backend rebuilt over those watches
  // (and those too long for registers), the others in registers (LendSlots).
  absl::Status SyncPages();
  // Builds the page backend over page_watches_ (told which watches hold registers, when some
  // do: `in_registers`), with the stack hook under --stack, arms it and keeps it (page_).
  absl::Status ArmPages(const std::vector<Watch>* in_registers);
  std::map<uint32_t, drmgr::ClientId> guest_client_;  // joined watches, by id
  std::vector<bool> removed_;  // by watch id: a joined watch that was removed
  std::unique_ptr<SlotBackend> hw_;
  std::vector<Watch> page_watches_;  // those watched with pages (ids kept)
  // Hybrid sessions: those in the registers, whose accesses the page backend reports when it
  // emulates an instruction (the registers never see it).
  std::vector<Watch> register_watches_;
  std::unique_ptr<WatchBackend> page_;
  PageBackend* page_backend_ = nullptr;  // page_, typed (fork cleanup)
  bool multiplexing_ = false;
  // --stack: distinct backtraces, by id - 1 (deduplicated: memory grows with distinct stacks).
  uint32_t CaptureStack(pid_t tid);
  std::unique_ptr<core::symbols::Unwinder> unwinder_;
  std::vector<std::vector<core::RemoteAddr>> stacks_;
  std::map<std::vector<core::RemoteAddr>, uint32_t> stack_ids_;
  uint64_t stack_errors_ = 0;
  std::string backend_note_;
  // --follow (watch/session_follow.cc): the followed watches by id, their pointers' drmgr
  // client and the owner ids (SlotBackend) of the pointers' requests: (watch id, pointer).
  std::map<uint32_t, FollowedWatch> followed_;
  drmgr::ClientId follow_client_;
  std::map<uint32_t, std::pair<uint32_t, size_t>> pointer_owner_;
  uint32_t next_pointer_owner_ = 0;
  std::vector<FollowMove> moves_;
  std::vector<std::string> follow_notes_;
  // Create: the shapes of the --follow requests (a request without pointers stops following,
  // with a note); FailedPrecondition when the backend cannot follow.
  static absl::Status CheckFollow(const core::symbols::Symbols& symbols,
                                  std::vector<WatchRequest>& requests,
                                  std::map<size_t, FollowedWatch>& shapes,
                                  std::vector<std::string>& notes);
  // Arm: requests and applies the followed watches' pointers (stop mode, every thread stopped).
  absl::Status ArmFollow();
  // A followed pointer was written (every thread stopped): each followed watch is resolved
  // again and its data and pointer watches moved where it leads now.
  absl::Status OnPointerWrite(const core::AccessEvent& ev);
  absl::Status Refollow(uint32_t id, const core::AccessEvent& cause, const std::string& pointer);
  // Requests the pointer watches of followed watch `id` from `first` on.
  absl::Status RequestPointers(uint32_t id, size_t first);
  bool armed_ = false;
  std::vector<core::AccessEvent> batch_;
  uint64_t filtered_ = 0;
  std::vector<bool> per_call_;                                              // by watch id
  std::map<std::pair<uint32_t, uint32_t>, drmgr::RequestId> call_request_;  // (id, call)
  // Last: destroyed first, while the backends its calls hold registers in still live.
  std::unique_ptr<CallWatches> calls_;
};

}  // namespace kwatch::watch
