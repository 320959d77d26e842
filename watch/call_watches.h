#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/remote_addr.h"
#include "core/event.h"
#include "core/probe/fetch.h"
#include "core/probe/int3_engine.h"
#include "core/probe/probe_target.h"
#include "core/ptrace/guardian.h"
#include "core/ptrace/process.h"
#include "watch/session.h"

namespace kwatch::watch {

// A watch armed per call (`kwatch --write 'r->len' --in compute`, or `compute::sum`).
struct CallWatchRequest {
  WatchRequest request;  // expr: a variable of the function, with members, elements, '->', '*'
  std::string function;  // --in FUNC
  std::string at;        // --at SPEC: where each call's object is looked up ("": the function's
                         // probe point, after its prologue, as `perf probe FUNC`)
  std::string until;     // --until SPEC: where each call's watch ends ("": at its return)
};

// One call's watched object, while it runs and after.
struct CallRecord {
  uint32_t watch_id = 0;
  uint32_t call = 0;  // of its function, from 1, every thread counted
  pid_t tid = 0;
  uint64_t entry_sp = 0;  // rsp at the function's first instruction (the return address slot)
  core::RemoteAddr base;  // where the object lay (0 until looked up)
  enum class State : uint8_t {
    kEntered,   // the function was entered; the object is looked up at the point
    kArmed,     // in a debug register of the calling thread
    kNotArmed,  // looked up, but not armed: `why`
    kEnded,     // the call returned (or was abandoned) while armed or not
  };
  State state = State::kEntered;
  bool armed = false;     // was in a debug register
  bool returned = false;  // ended by its return or --until (false: abandoned, thread exit, end)
  std::string why;        // kNotArmed: why; kEnded: how it ended, when not by a return
  uint64_t events = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

// Per function and watch, what the calls did (the summary's "per call" lines).
struct CallStats {
  uint32_t watch_id = 0;
  std::string function;
  std::string point;       // where each call's object was looked up ("compute+0x8 (prog.c:12)")
  uint64_t calls = 0;      // entries seen
  uint64_t armed = 0;      // ... whose object got a debug register
  uint64_t not_armed = 0;  // ... whose object was not watched (reasons below)
  uint64_t running = 0;    // ... still running when the session ended
  uint64_t missed = 0;     // entries not tracked (more calls in flight than tracked at once)
  uint64_t abandoned = 0;  // armed calls left by longjmp, a thread's exit or the session's end
  std::map<std::string, uint64_t> why_not;  // not_armed by reason
  // Accesses per armed call that ended (min, mean, max over `ended_armed` calls).
  uint64_t ended_armed = 0;
  uint64_t events_min = 0;
  uint64_t events_max = 0;
  uint64_t events_total = 0;
};

class CallWatches;

// Why a call's object was not armed when its thread had no register for it (the summary counts
// calls by reason).
inline constexpr const char* kCallNoRegister = "no debug register of the calling thread was free";

// What the in-process path of per-call watches is asked to plant: per function, its entry, the
// lookup point, --until, and each object's address program (the agent's fetch ops).
struct CallAgentPlan {
  struct Object {
    uint32_t watch_id = 0;
    core::probe::CompiledArg place;  // CompiledObject::place
    uint32_t length = 0;             // bytes (1, 2, 4 or 8: one breakpoint)
    drmgr::DrKind kind = drmgr::DrKind::kWrite;
  };
  struct Function {
    std::string name;
    core::RemoteAddr entry;
    core::RemoteAddr at;
    core::RemoteAddr until;  // 0: none
    std::vector<Object> objects;
  };
  std::vector<Function> functions;
  uint64_t load_bias = 0;
};

// The in-process path of per-call watches (watch/agent/agent_calls.h implements it): kwatch's
// agent, loaded into the target, numbers each call at its entry, looks its objects up and arms
// them in a perf breakpoint of the calling thread, and disarms them at the call's end, with no
// stop and no trip to kwatch. kwatch reads what it did (CallWatches::AgentLookup, AgentEnd)
// and the breakpoints' samples (Collect).
class CallAgent {
 public:
  CallAgent() = default;
  virtual ~CallAgent() = default;
  CallAgent(const CallAgent&) = delete;
  CallAgent& operator=(const CallAgent&) = delete;
  CallAgent(CallAgent&&) = delete;
  CallAgent& operator=(CallAgent&&) = delete;
  // The accesses since the last call, each with its watch and call; the lookups and ends read
  // on the way go to the CallWatches first.
  virtual void Collect(std::vector<core::AccessEvent>& out) = 0;
  virtual std::vector<int> Fds() const = 0;
  // Every thread stopped: the code back, every breakpoint disabled and closed in the target.
  virtual absl::Status End() = 0;
  // The target exec'd: nothing of the agent is left.
  virtual void Forget() = 0;
  // Lookups in no tracked call, per watch (more calls in flight than tracked).
  virtual uint64_t Missed(uint32_t watch_id) const = 0;
  // Accesses and records lost on the way (full rings).
  virtual uint64_t Lost() const = 0;
  // For the session's start: how the calls are armed.
  virtual std::string Description() const = 0;
};

// Plants `plan` in `proc` (every thread stopped) through the agent, reporting to `calls`.
// Unavailable or FailedPrecondition (with why) when the agent cannot take it: the caller uses
// ptrace.
using CallAgentFactory = std::function<absl::StatusOr<std::unique_ptr<CallAgent>>(
    core::ptrace::Process& proc, CallWatches& calls, const CallAgentPlan& plan)>;

// gdb's scope syntax: each of `requests` written `FUNC::EXPR` whose FUNC is a function of the
// executable of `pid` (not a C++ namespace or class) moves to `calls` as EXPR watched per call of
// FUNC. The others stay.
absl::Status TakeScopedRequests(pid_t pid, std::vector<WatchRequest>& requests,
                                std::vector<CallWatchRequest>& calls);

// The summary's lines for `s`, e.g.
//   "per call of compute (objects looked up at compute+0x4 (prog.c:30)): 8 calls, 8 watched"
//   "accesses per watched call: min 3, avg 3.00, max 3 (8 calls)"
//   "not watched in 2 calls: no debug register of the calling thread was free"
std::vector<std::string> CallStatsLines(const CallStats& s);

// The probes and per-call bookkeeping of a hardware session's per-call watches (issue: watches
// armed by code). Each --in function gets a return probe (its entry and return tracked per
// thread, recursion included, through core::probe::Int3Engine) and a probe at the point where
// each call's objects are looked up. At that point (the calling thread stopped by ptrace) each
// object's address is evaluated from the thread's registers and memory (DWARF locations of
// the function's parameters and locals), and armed in that thread's debug registers only
// (WatchSession::ArmCall: a drmgr request of the thread's scope, below the session's own
// watches; what does not fit is not armed and counted, by reason). At the call's return the
// watch ends (WatchSession::EndCall: its register goes back) and a kCallEnded note says that
// the object went out of scope.
//
// Events of a per-call watch carry the call (AccessEvent::call); the summary and the profile
// count them at their offset in the object (Rebase), so every call's object adds to one
// layout. Every INT3 is journaled with a guardian: a kwatch killed leaves none behind.
// Owned by the session (WatchSession::SetCalls); used from the tracer thread only.
class CallWatches {
 public:
  // Resolves every function and point in the target's executable, compiles each expression at
  // its point and declares each watch in `session` (hardware sessions only, before it arms).
  // Start() plants the probes. Errors name the option: NotFound for an unknown function (with near
  // matches) or variable (with those visible), InvalidArgument for a point outside the
  // function, FailedPrecondition for a page-protection session. Nothing is left patched then.
  static absl::StatusOr<std::unique_ptr<CallWatches>> Create(
      core::ptrace::Process& proc, WatchSession& session,
      const std::vector<CallWatchRequest>& reqs);
  ~CallWatches();
  // Plants the probes (the world stopped): after the session armed. On error nothing is left.
  // With `agent`, through the in-process agent when it can take them (else ptrace; path_note()
  // says which and why).
  // `why_not_agent`: why there is no `agent` (for path_note()).
  absl::Status Start(const CallAgentFactory& agent = nullptr,
                     const std::string& why_not_agent = std::string());
  // How the calls are armed, for the session's start ("through ptrace: ..." or in the target).
  const std::string& path_note() const { return path_note_; }
  bool in_process() const { return agent_ != nullptr; }

  // ---- The agent's reports (CallAgent implementations call these from Collect). ----
  // Call `call` of watch `watch_id` looked its object up at `addr` in thread `tid`; armed, or
  // not (`why`).
  void AgentLookup(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns, uint64_t entry_sp,
                   core::RemoteAddr addr, const std::string& why);
  // Call `call` of watch `watch_id` ended, as `how` says.
  enum class EndHow : uint8_t {
    kReturned,   // its return
    kUntil,      // --until
    kAbandoned,  // left by longjmp
    kNotLooked,  // it returned before its lookup point
  };
  void AgentEnd(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns, uint64_t entry_sp,
                EndHow how);
  // Events of the agent's breakpoints (none on the ptrace path).
  void Collect(std::vector<core::AccessEvent>& out);
  std::vector<int> Fds() const;
  uint64_t lost() const { return agent_ != nullptr ? agent_->Lost() : 0; }
  CallWatches(const CallWatches&) = delete;
  CallWatches& operator=(const CallWatches&) = delete;

  // Counts delivered event `ev` of a per-call watch to its call; returns `ev` with its
  // addresses made offsets into the call's object (the watch's declared address is 0).
  core::AccessEvent Rebase(const core::AccessEvent& ev);
  // The record of call `call` of watch `watch_id`; nullptr once it was retired.
  const CallRecord* Find(uint32_t watch_id, uint32_t call) const;
  // Calls that ended since the last call, with their events all delivered (each ended call's
  // events were collected from the rings when it ended, and delivered by the drain that
  // followed). Call after each drain; the records are retired into the stats.
  std::vector<CallRecord> TakeEnded();
  // A traced thread ended: its calls end (abandoned).
  void OnThreadExit(pid_t tid);
  // Ends every call still running (the session ends) and puts every patched byte back.
  absl::Status Remove();
  // The target exec'd: the probes ended with the old image.
  void Forget();

  std::vector<CallStats> stats() const;
  WatchSession& session() { return session_; }
  // "compute" for watch `watch_id` ("" when it is not per call).
  std::string FunctionOf(uint32_t watch_id) const;

 private:
  struct Object {
    uint32_t watch_id = 0;
    core::probe::CompiledObject compiled;
  };
  struct Function {
    std::string name;
    std::string point;  // where objects are looked up, for people
    core::RemoteAddr entry;
    core::RemoteAddr at;
    core::RemoteAddr until;  // --until: 0 when none
    std::string until_text;  // "reached --until compute+0x20 (prog.c:33)"
    std::vector<Object> objects;
    uint32_t calls = 0;
    core::probe::ProbeId return_probe = 0;
    core::probe::ProbeId at_probe = 0;
    // Calls in flight per thread, innermost last: (call, rsp at its entry).
    std::map<pid_t, std::vector<std::pair<uint32_t, uint64_t>>> stacks;
  };

  CallWatches(core::ptrace::Process& proc, WatchSession& session)
      : proc_(proc), session_(session) {}
  void OnEntry(Function& f, const core::probe::ProbeContext& ctx);
  void OnPoint(Function& f, const core::probe::ProbeContext& ctx);
  void OnReturn(Function& f, const core::probe::ProbeContext& ctx);
  void OnUntil(Function& f, const core::probe::ProbeContext& ctx);
  // Ends `r` (its register goes back); `how` says why when not by a return (`normal`: at
  // --until, as planned).
  void End(CallRecord& r, uint64_t now_ns, const std::string& how, bool normal = false);
  // Ends call `call` of `f` for each of its objects.
  void EndAll(Function& f, uint32_t call, uint64_t now_ns, const std::string& how);
  void Retire(const CallRecord& r);
  // The record of (watch_id, call), made on the agent's first report of it.
  CallRecord& AgentRecord(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns,
                          uint64_t entry_sp);

  core::ptrace::Process& proc_;
  WatchSession& session_;
  std::unique_ptr<core::ptrace::Guardian> guardian_;
  std::unique_ptr<core::probe::Int3Engine> engine_;
  std::unique_ptr<CallAgent> agent_;
  std::vector<pid_t> exited_;  // agent: threads gone since the last Collect
  std::string path_note_;
  uint64_t bias_ = 0;
  std::vector<Function> functions_;
  // Live and ended-but-not-retired calls, by (watch id, call).
  std::map<std::pair<uint32_t, uint32_t>, CallRecord> calls_;
  std::map<uint32_t, CallStats> stats_;               // by watch id
  std::vector<std::pair<uint32_t, uint32_t>> ended_;  // keys of calls_ that ended
  bool removed_ = false;
};

}  // namespace kwatch::watch
