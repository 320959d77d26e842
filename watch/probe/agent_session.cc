#include "watch/probe/agent_session.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "agent/abi.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/probe/agent_fetch.h"
#include "core/probe/fetch_format.h"
#include "core/probe/insn_fixup.h"
#include "core/probe/jump_optimizer.h"
#include "core/ptrace/process.h"
#include "core/symbols/symbolizer.h"
#include "core/symbols/symbols.h"
#include "watch/agent/controller.h"
#include "watch/agent/int3_plan.h"
#include "watch/agent/loader.h"
#include "watch/probe/agent_aggregation.h"
#include "watch/probe/agent_filter.h"
#include "watch/probe/hit_stacks.h"
#include "watch/probe/jump_plan.h"
#include "watch/probe/session_base.h"

namespace kwatch::watch::probe {

namespace {

namespace ka = kwatch::agent;
namespace wa = kwatch::watch::agent;

// Bytes read at a probe for its instruction (the longest x86 instruction is 15).
constexpr size_t kInsnBytes = 15;

// The shared memory of a session: every probe of the set (twice over for the hash), and rings
// of 1 MiB for 1024 threads at once (a slot is freed once kwatch drained its thread's ring
// after the thread ended: programs that start threads by the hundred need many; a thread
// beyond them is counted, its hits dropped). The memfd's pages are allocated as rings fill,
// and the agent keeps them out of the program's core dumps.
constexpr uint32_t kRingBytes = 1U << 20;
// A drain that read this much found rings filling faster than the tick empties them: kwatch
// drains again at once (for up to kBusyDrainNs), so that a thread hitting probes flat out loses
// only what comes while kwatch works, not what comes while it sleeps.
constexpr uint64_t kBusyDrainBytes = kRingBytes / 4;
constexpr uint64_t kBusyDrainNs = 20'000'000;

wa::ShmConfig ShmFor(const ProbeSet& set) {
  wa::ShmConfig c;
  c.probe_capacity = std::max<uint32_t>(64, static_cast<uint32_t>(set.probes.size()) * 2);
  c.code_capacity = std::max<uint32_t>(8192, c.probe_capacity * 64);
  c.thread_capacity = 1024;
  c.ring_bytes = kRingBytes;
  return c;
}

// Reaps the threads of `pid` that ended while kwatch still traced them (waitpid on each tid;
// nothing for threads kwatch does not trace).
void ReapTracedThreads(pid_t pid) {
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    pid_t tid = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &tid) && tid != pid) {
      int status = 0;
      (void)::waitpid(tid, &status, __WALL | WNOHANG);
    }
  }
}

// Whether process `pid` runs on, not ending: not gone, not a zombie, and its leader not in
// its exit (PF_EXITING in the flags of /proc/PID/stat). When its lifeline's last reader went,
// every thread of an exiting process is already in its exit; a process that runs on exec'd.
bool RunsOn(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "re");
  if (f == nullptr) {
    return false;
  }
  std::array<char, 1024> buf{};
  const size_t n = std::fread(buf.data(), 1, buf.size() - 1, f);
  std::fclose(f);
  const absl::string_view text(buf.data(), n);
  const size_t paren = text.rfind(')');
  if (paren == absl::string_view::npos || paren + 2 >= text.size()) {
    return false;
  }
  // After the comm: state ppid pgrp session tty_nr tpgid flags ...
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(paren + 2), ' ', absl::SkipEmpty());
  constexpr uint64_t kPfExiting = 0x4;
  uint64_t flags = 0;
  if (fields.size() < 7 || !absl::SimpleAtoi(fields[6], &flags)) {
    return false;
  }
  const char state = fields[0].empty() ? 'X' : fields[0][0];
  return state != 'Z' && state != 'X' && state != 'x' && (flags & kPfExiting) == 0;
}

// A record copied out of its ring (the payload's span is valid only inside the drain).
struct Drained {
  uint32_t probe_index = 0;
  uint16_t type = 0;
  pid_t pid = 0;
  int32_t tid = 0;
  uint64_t time_ns = 0;
  uint64_t ip = 0;
  uint64_t return_address = 0;
  // Its payload: bytes [payload_at, payload_at + payload_len) of AgentSession::payloads_.
  size_t payload_at = 0;
  size_t payload_len = 0;
};

class AgentSession : public ProbeSessionBase {
 public:
  AgentSession(const ProbeSessionOptions& opts, AgentSessionOptions agent_opts, const ProbeSet& set,
               std::unique_ptr<EventLoop> loop, const ProbeSessionHooks& hooks)
      : ProbeSessionBase("agent", opts, set, std::move(loop), hooks),
        agent_opts_(std::move(agent_opts)) {}
  ~AgentSession() override = default;
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;
  AgentSession(AgentSession&&) = delete;
  AgentSession& operator=(AgentSession&&) = delete;

  absl::StatusOr<ProbeSessionEnd> Finish() override;

 private:
  // One probe as placed in the target.
  struct Placed {
    const ProbeDef* def = nullptr;
    uint32_t index = 0;  // in the agent's probe table
    core::probe::AgentFetchProgram program;
    ProbePath path;
    uint64_t after_stop = 0;        // records drained once the session was stopping
    uint64_t lost_at_stop = 0;      // KwProbe::lost when the session got its stop reason
    bool filter_in_target = false;  // its condition runs in the agent (else kwatch: why)
    std::string filter_why;
  };

  absl::Status Start() override;
  void Abandon() override;
  // -f: the children registered since (said before their hits), then the rings.
  absl::Status Collect(const EventLoop::Ready& /*ready*/) override {
    if (opts().follow_forks && ctl_ != nullptr) {
      AdoptChildren();
    }
    return DrainRings();
  }
  absl::Status PollTarget() override;
  // -f: the children the agents registered (followed from now on, said).
  void AdoptChildren();
  // -f: AdoptChildren, then the children that ended or exec'd (said).
  void PollChildren();
  // Notes each probe's lost records at the stop: those lost later are not hits taken.
  void OnStop() override;

  // Launches or attaches and loads the agent; Unavailable when the agent cannot serve the
  // target (the caller may fall back to another backend).
  absl::Status LoadAgent();
  // Places every probe, with the world stopped.
  absl::Status PlaceAll();
  absl::Status Place(const ProbeDef& def, const std::vector<core::RemoteAddr>& all);
  // --agg: the aggregations of `def` the target can accumulate, written and linked from
  // `entry` (the others stay in kwatch, with the reason).
  absl::Status PlaceAggregates(const ProbeDef& def, wa::ProbeEntry& entry);
  // At the end: a note for each aggregation kwatch made from the records while some of its
  // probe's records were lost.
  void NoteShortAggregates();
  // The first probe at its address: a jump if the optimizer and the threads allow, else INT3.
  // Returns whether it took the jump; errors carry no probe name (Place adds it).
  absl::StatusOr<bool> PlaceFirst(const wa::ProbeEntry& entry,
                                  const std::vector<core::RemoteAddr>& all, Placed& placed);
  // The jump optimizer's decision for a probe at `addr`.
  core::probe::JumpDecision PlanJump(core::RemoteAddr addr,
                                     const std::vector<core::RemoteAddr>& all);
  // Tries the jump path; false (with `why`) when the probe must take the INT3 path.
  absl::StatusOr<bool> PlaceJump(const core::probe::JumpPlan& plan, wa::ProbeEntry entry,
                                 Placed& placed, std::string& why);
  absl::Status PlaceInt3(wa::ProbeEntry entry, Placed& placed);

  // Drains every ring and delivers the records in time order.
  absl::Status DrainRings();
  wa::HitFn Collector();
  void DeliverDrained();
  void OnRecord(const Drained& d);

  AgentSessionOptions agent_opts_;
  std::unique_ptr<core::ptrace::Process> proc_;  // while the target is traced (arming)
  std::unique_ptr<wa::Controller> ctl_;
  std::unique_ptr<core::symbols::Symbols> symbols_;
  std::unique_ptr<core::symbols::Symbolizer> symbolizer_;
  std::unique_ptr<HitStacks> stacks_;  // --stack: unwinds the copies in the records
  pid_t pid_ = 0;
  uint64_t bias_ = 0;
  bool launched_ = false;
  bool detached_ = false;
  bool exited_ = false;         // the target ended (and, -f, every followed child)
  bool target_exited_ = false;  // the target itself ended
  bool agent_gone_ = false;     // the target exec'd: the agent went with the old image
  bool target_execd_ = false;   // -f: the target exec'd (said) while followed children ran
  std::optional<core::ptrace::ExitInfo> exit_;
  std::vector<Placed> placed_;
  std::map<uint32_t, size_t> by_index_;  // agent probe index -> placed_
  // The first probe placed at each address: the ones after it join its chain.
  struct First {
    uint32_t index = 0;  // in the agent's probe table
    ProbePath path;
  };
  std::map<uint64_t, First> first_at_;
  // -f: a fork child that kept the probes.
  struct Child {
    pid_t pid = 0;
    pid_t parent = 0;
    uint32_t entry = 0;    // its KwProcess (UINT32_MAX once it ended: forgotten)
    core::UniqueFd pidfd;  // -1 once it ended
    bool execd = false;    // it called exec: the agent went with the old image
  };
  // The note of an exec in a followed process: its probes ended there (the agent does not
  // follow an exec).
  void NoteExec(pid_t pid, bool child);
  std::vector<Child> children_;  // in the order kwatch learned of them
  std::vector<Drained> drained_;
  std::vector<uint8_t> payloads_;  // of drained_, one after the other
  uint64_t data_loss_ = 0;         // rings that held garbage
  bool stop_noted_ = false;        // OnStop took the lost_at_stop counts
};

absl::Status AgentSession::LoadAgent() {
  const auto unavailable = [this](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("the in-process agent cannot serve ",
                     pid_ > 0 ? absl::StrCat("pid ", pid_) : std::string("the target"), ": ", why));
  };
  core::ptrace::LaunchOptions lo;
  lo.run_as = opts().user;
  lo.kill_on_exit = opts().kill_on_exit;
  KW_ASSIGN_OR_RETURN(proc_, core::ptrace::Process::Start(opts().pid, opts().command, lo));
  pid_ = proc_->pid();
  launched_ = !opts().pid.has_value();
  KW_RETURN_IF_ERROR(proc_->StopAll());
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc_->Maps());
  absl::StatusOr<uint64_t> bias = set().target->LoadBias(maps);
  if (!bias.ok()) {
    return absl::NotFoundError(absl::StrCat(set().path, " is not mapped in process ", pid_, ": ",
                                            bias.status().message()));
  }
  bias_ = *bias;
  KW_ASSIGN_OR_RETURN(std::vector<pid_t> blocking, wa::ThreadsBlocking(pid_, SIGTRAP));
  if (!blocking.empty()) {
    return unavailable(absl::StrCat("thread", blocking.size() > 1 ? "s " : " ",
                                    absl::StrJoin(blocking, ", "),
                                    " block SIGTRAP (an INT3 there would kill the thread)"));
  }
  wa::LoadOptions lopts;
  lopts.agent_path = agent_opts_.agent_path;
  lopts.shm = ShmFor(set());
  if (agent_opts_.aggregator != nullptr) {
    lopts.shm.aggs_bytes = kAgentAggregateBytes;
  }
  if (opts().follow_forks) {
    lopts.shm.flags |= ka::kKwFollowForks;  // a fork child keeps the probes, and says so
  }
  absl::StatusOr<std::unique_ptr<wa::Controller>> ctl = wa::Controller::Load(*proc_, lopts);
  if (!ctl.ok()) {
    return unavailable(ctl.status().message());
  }
  ctl_ = *std::move(ctl);
  const ka::KwControl& c = ctl_->tables().control();
  if ((c.agent_features & ka::kKwFeatureInt3) == 0 ||
      (c.agent_features & ka::kKwFeatureWatchdog) == 0) {
    return unavailable("the agent started without its SIGTRAP handler or its watchdog");
  }
  return absl::OkStatus();
}

core::probe::JumpDecision AgentSession::PlanJump(core::RemoteAddr addr,
                                                 const std::vector<core::RemoteAddr>& all) {
  return PlanJumpAt(symbols_.get(), addr, all);
}

absl::StatusOr<bool> AgentSession::PlaceJump(const core::probe::JumpPlan& plan,
                                             wa::ProbeEntry entry, Placed& placed,
                                             std::string& why) {
  const core::RemoteAddr jump_entry{ctl_->tables().control().jump_entry};
  if ((ctl_->tables().control().agent_features & ka::kKwFeatureJump) == 0 ||
      jump_entry.value == 0) {
    why = "the agent has no jump entry";
    return false;
  }
  entry.flags |= ka::kKwProbeJump;
  entry.resume = ka::kKwResumeXol;
  KW_ASSIGN_OR_RETURN(const uint32_t index, ctl_->AddProbe(entry));
  const absl::Status patched = PatchJumpProbe(*ctl_, *proc_, plan, index, entry.addr);
  if (!patched.ok()) {
    // A thread parked inside the range, or no trampoline within reach: the INT3 path.
    KW_RETURN_IF_ERROR(ctl_->tables().RemoveProbe(index));
    why = std::string{patched.message()};
    return false;
  }
  placed.index = index;
  placed.path.path = "jump";
  return true;
}

absl::Status AgentSession::PlaceInt3(wa::ProbeEntry entry, Placed& placed) {
  std::vector<uint8_t> code(kInsnBytes);
  KW_RETURN_IF_ERROR(proc_->ReadMemory(entry.addr, code));
  KW_ASSIGN_OR_RETURN(const core::probe::ProbedInsn insn,
                      core::probe::AnalyzeProbedInsn(code, entry.addr));
  KW_RETURN_IF_ERROR(wa::PlanInt3(*ctl_, *proc_, insn, entry));
  KW_ASSIGN_OR_RETURN(placed.index, ctl_->AddProbe(entry));
  const uint8_t int3 = 0xcc;
  KW_RETURN_IF_ERROR(ctl_->Patch(*proc_, placed.index, entry.addr, std::span(&int3, 1)));
  placed.path.path = "int3";
  return absl::OkStatus();
}

absl::Status AgentSession::Place(const ProbeDef& def, const std::vector<core::RemoteAddr>& all) {
  const auto fail = [&def](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("probe ", def.point.event, " (", def.Location(),
                                               "): ", s.message()));
  };
  Placed placed;
  placed.def = &def;
  absl::StatusOr<core::probe::AgentFetchProgram> program = core::probe::CompileAgentFetch(
      def.args, bias_,
      core::probe::AgentFetchOptions{
          .stack_bytes = opts().stack_bytes,
          .stack_copy_bytes = opts().stack_frames > 0 ? StackCopyBytes(opts()) : 0});
  if (!program.ok()) {
    return fail(program.status());
  }
  placed.program = *std::move(program);
  wa::ProbeEntry entry;
  entry.id = def.id;
  entry.addr = core::RemoteAddr{def.point.vaddr.value + bias_};
  entry.flags = ka::kKwProbeEnabled | (def.point.is_return ? ka::kKwProbeReturn : 0U) |
                (placed.program.needs_fpregs ? ka::kKwProbeFpregs : 0U);
  entry.program = placed.program.ops;
  entry.record_bytes = placed.program.record_bytes;
  AgentFilter filter = CompileAgentFilter(def, bias_, ctl_->ids_are_kwatchs());
  placed.filter_in_target = !filter.ops.empty();
  placed.filter_why = std::move(filter.in_kwatch_why);
  entry.filter = std::move(filter.ops);
  if (absl::Status s = PlaceAggregates(def, entry); !s.ok()) {
    return fail(s);
  }
  entry.maxactive = opts().maxactive;
  if (auto first = first_at_.find(entry.addr.value); first != first_at_.end()) {
    // Another probe at a placed address: it joins that probe's chain (KwProbe::next) with the
    // resume fields the agent reads from the first (as placed) and its path; the code is
    // patched once.
    const ka::KwProbe& k = ctl_->tables().probe(first->second.index);
    entry.flags |= k.flags.load(std::memory_order_relaxed) & ka::kKwProbeJump;
    entry.xol_addr = k.xol_addr;
    entry.resume = k.resume;
    entry.insn_len = k.insn_len;
    entry.target = k.target;
    entry.cond = k.cond;
    entry.ret_imm = k.ret_imm;
    entry.ind_base = k.ind_base;
    entry.ind_index = k.ind_index;
    entry.ind_disp = k.ind_disp;
    entry.ind_scale = k.ind_scale;
    entry.ind_flags = k.ind_flags;
    absl::StatusOr<uint32_t> index = ctl_->AddProbe(entry);
    if (!index.ok()) {
      return fail(index.status());
    }
    placed.index = *index;
    placed.path = first->second.path;
  } else {
    if (absl::StatusOr<bool> jumped = PlaceFirst(entry, all, placed); !jumped.ok()) {
      return fail(jumped.status());
    }
    first_at_[entry.addr.value] = First{.index = placed.index, .path = placed.path};
  }
  by_index_[placed.index] = placed_.size();
  placed_.push_back(std::move(placed));
  return absl::OkStatus();
}

void AgentSession::NoteShortAggregates() {
  for (const AggregateTable& t : agent_opts_.aggregator->tables()) {
    if (t.in_target || t.in_kwatch_why.empty()) {
      continue;
    }
    for (const Placed& p : placed_) {
      const uint64_t lost = p.def == t.probe ? ctl_->tables().probe(p.index).lost.load() : 0;
      if (lost > 0) {
        ProbeNote n;
        n.kind = ProbeNote::Kind::kAggregateShort;
        n.path = absl::StrCat(t.probe->point.event, ": ", t.spec->call);
        n.why = t.in_kwatch_why;
        n.count = lost;
        Keep(std::move(n));
      }
    }
  }
}

absl::Status AgentSession::PlaceAggregates(const ProbeDef& def, wa::ProbeEntry& entry) {
  Aggregator* agg = agent_opts_.aggregator;
  if (agg == nullptr) {
    return absl::OkStatus();
  }
  // Linked in reverse, so that the agent updates them in the tables' order.
  for (size_t i = agg->tables().size(); i-- > 0;) {
    if (agg->tables()[i].probe != &def) {
      continue;
    }
    std::string why;
    std::optional<wa::AggregateEntry> e =
        CompileAgentAggregate(*agg, i, bias_, ctl_->ids_are_kwatchs(), &why);
    if (!e.has_value()) {
      agg->KeepInKwatch(i, std::move(why));
      continue;
    }
    e->next = entry.agg;
    absl::StatusOr<uint32_t> handle = ctl_->tables().AddAggregate(*e);
    if (!handle.ok()) {
      agg->KeepInKwatch(i, std::string{handle.status().message()});
      continue;
    }
    entry.agg = *handle;
    agg->TakeOver(i, [this, agg, i, h = *handle](AggregateTable& t) {
      if (ctl_ != nullptr) {
        ReadAgentAggregate(ctl_->tables(), h, agg->binding(i), t);
      }
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> AgentSession::PlaceFirst(const wa::ProbeEntry& entry,
                                              const std::vector<core::RemoteAddr>& all,
                                              Placed& placed) {
  std::string why;
  bool jumped = false;
  if (!agent_opts_.allow_jump) {
    why = "--no-jump";
  } else {
    const core::probe::JumpDecision d = PlanJump(entry.addr, all);
    if (d.plan.has_value()) {
      absl::StatusOr<bool> j = PlaceJump(*d.plan, entry, placed, why);
      if (!j.ok()) {
        return j.status();
      }
      jumped = *j;
    } else {
      why = d.reason;
    }
  }
  if (!jumped) {
    if (absl::Status s = PlaceInt3(entry, placed); !s.ok()) {
      return s;
    }
    placed.path.why = why;
  }
  return jumped;
}

absl::Status AgentSession::PlaceAll() {
  std::vector<core::RemoteAddr> all;
  all.reserve(set().probes.size());
  for (const ProbeDef& def : set().probes) {
    all.push_back(core::RemoteAddr{def.point.vaddr.value + bias_});
  }
  for (const ProbeDef& def : set().probes) {
    KW_RETURN_IF_ERROR(Place(def, all));
  }
  return absl::OkStatus();
}

absl::Status AgentSession::Start() {
  KW_RETURN_IF_ERROR(LoadAgent());
  if (auto syms = core::symbols::Symbols::ForProcess(pid_); syms.ok()) {
    symbols_ = *std::move(syms);
    symbolizer_ = std::make_unique<core::symbols::Symbolizer>(*symbols_);
  }
  if (opts().stack_frames > 0) {
    KW_ASSIGN_OR_RETURN(stacks_, HitStacks::ForProcess(pid_, nullptr));
  }
  KW_RETURN_IF_ERROR(hooks().open_recording(pid_, bias_));
  KW_RETURN_IF_ERROR(PlaceAll());
  KW_RETURN_IF_ERROR(loop().Add(ctl_->lifeline_fd()));
  KW_RETURN_IF_ERROR(loop().Add(ctl_->pidfd()));
  ctl_->Activate();
  ProbeSessionStart start;
  start.main_pid = pid_;
  NameWith(symbolizer_.get(), start);
  BeginOutput(std::move(start)).OnStart();
  ProbeNote armed;
  armed.kind = ProbeNote::Kind::kArmed;
  armed.backend = backend();
  armed.count = UserProbes(set());
  armed.pid = pid_;
  armed.path = set().path;
  if (ctl_->agent().copied) {
    armed.why = absl::StrCat(
        "the agent was loaded from a copy in a memfd (the target's "
        "filesystem has no ",
        ctl_->agent().path, ")");
  }
  Note(armed);
  // From here the target runs without kwatch: no ptrace stop on any hit.
  KW_RETURN_IF_ERROR(proc_->Detach());
  proc_.reset();
  detached_ = true;
  return absl::OkStatus();
}

void AgentSession::Abandon() {
  if (ctl_ != nullptr) {
    if (detached_) {
      (void)ctl_->EndDetached([](const wa::AgentHit&) {});
    } else if (proc_ != nullptr) {
      (void)ctl_->End(*proc_);
      (void)ctl_->Finish([](const wa::AgentHit&) {});
    }
  }
  if (proc_ != nullptr) {
    if (launched_) {
      (void)proc_->Kill();  // it never ran its own code with the probes
    } else {
      (void)proc_->Detach();
    }
    proc_.reset();
  }
}

wa::HitFn AgentSession::Collector() {
  return [this](const wa::AgentHit& h) {
    Drained d;
    d.probe_index = h.record.probe_index;
    d.type = h.record.type;
    d.pid = h.pid;
    d.tid = h.record.tid;
    d.time_ns = h.time_ns;
    d.ip = h.record.ip;
    d.return_address = h.record.return_address;
    d.payload_at = payloads_.size();
    d.payload_len = h.payload.size();
    payloads_.insert(payloads_.end(), h.payload.begin(), h.payload.end());
    drained_.push_back(d);
  };
}

void AgentSession::DeliverDrained() {
  // Rings are per thread, drained one after the other, each in time order: merge those runs by
  // time, as the hits happened (pairwise, ties in drain order).
  const auto by_time = [](const Drained& a, const Drained& b) { return a.time_ns < b.time_ns; };
  std::vector<size_t> runs = {0};
  for (size_t i = 1; i < drained_.size(); ++i) {
    if (drained_[i].time_ns < drained_[i - 1].time_ns) {
      runs.push_back(i);
    }
  }
  runs.push_back(drained_.size());
  while (runs.size() > 2) {
    std::vector<size_t> merged = {0};
    for (size_t r = 2; r < runs.size(); r += 2) {
      std::inplace_merge(drained_.begin() + static_cast<ptrdiff_t>(runs[r - 2]),
                         drained_.begin() + static_cast<ptrdiff_t>(runs[r - 1]),
                         drained_.begin() + static_cast<ptrdiff_t>(runs[r]), by_time);
      merged.push_back(runs[r]);
    }
    if (runs.size() % 2 == 0) {
      merged.push_back(runs.back());  // an odd run out: merged next round
    }
    runs = std::move(merged);
  }
  for (const Drained& d : drained_) {
    OnRecord(d);
  }
  drained_.clear();
  payloads_.clear();
}

absl::Status AgentSession::DrainRings() {
  if (ctl_ == nullptr) {
    return absl::OkStatus();
  }
  const uint64_t until = core::MonotonicNs() + kBusyDrainNs;
  for (;;) {
    absl::StatusOr<wa::DrainStats> st = ctl_->Drain(Collector());
    DeliverDrained();
    if (!st.ok()) {
      if (st.status().code() == absl::StatusCode::kDataLoss) {
        ++data_loss_;  // a ring with garbage was skipped; the others were read
        return absl::OkStatus();
      }
      return st.status();
    }
    if (st->bytes < kBusyDrainBytes || !TakesHits() || core::MonotonicNs() >= until ||
        DutiesDuringHit(core::MonotonicNs())) {
      break;
    }
  }
  return ctl_->ReapThreadSlots(Collector());
}

void AgentSession::OnRecord(const Drained& d) {
  if (d.type != ka::kKwRecordHit && d.type != ka::kKwRecordReturn) {
    return;
  }
  auto it = by_index_.find(d.probe_index);
  if (it == by_index_.end()) {
    return;
  }
  Placed& p = placed_[it->second];
  if (!TakesHits()) {
    ++p.after_stop;
    return;
  }
  ProbeHit hit;
  hit.time_ns = d.time_ns;
  hit.pid = d.pid != 0 ? d.pid : pid_;
  hit.tid = d.tid;
  hit.probe = p.def;
  hit.ip = core::RemoteAddr{d.ip};
  hit.return_address = core::RemoteAddr{d.return_address};
  core::probe::AgentRecordContext ctx;
  ctx.load_bias = bias_;
  ctx.at_return = d.type == ka::kKwRecordReturn;
  ctx.tid = d.tid;
  absl::StatusOr<core::probe::AgentArgValues> v = core::probe::FormatAgentRecord(
      p.def->args, p.program,
      std::span<const uint8_t>(payloads_).subspan(d.payload_at, d.payload_len), ctx);
  if (v.ok()) {
    hit.args = std::move(v->args);
    if (stacks_ != nullptr && v->stack_regs.has_value()) {
      hit.stack = stacks_->UnwindCopy(d.tid, *v->stack_regs, v->stack, opts().stack_frames);
    }
  } else {
    for (const core::probe::CompiledArg& a : p.def->args) {
      hit.args.emplace_back(a.name, core::probe::FetchErrorText(v.status()));
    }
  }
  Deliver(hit);
}

// The exit status of `pid` while it is a zombie no one reaped yet (exit_code, the 52nd
// field of /proc/PID/stat, in waitpid's form); nullopt once it is gone or before it ended.
std::optional<core::ptrace::ExitInfo> ZombieExit(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "re");
  if (f == nullptr) {
    return std::nullopt;
  }
  std::array<char, 1024> buf{};
  const size_t n = std::fread(buf.data(), 1, buf.size() - 1, f);
  std::fclose(f);
  const absl::string_view text(buf.data(), n);
  const size_t paren = text.rfind(')');
  if (paren == absl::string_view::npos || paren + 2 >= text.size()) {
    return std::nullopt;
  }
  // After the comm: field 3 (state) is fields[0], field 52 (exit_code) fields[49].
  const std::vector<absl::string_view> fields = absl::StrSplit(
      absl::StripTrailingAsciiWhitespace(text.substr(paren + 2)), ' ', absl::SkipEmpty());
  int status = 0;
  if (fields.size() < 50 || fields[0] != "Z" || !absl::SimpleAtoi(fields[49], &status)) {
    return std::nullopt;
  }
  core::ptrace::ExitInfo e;
  if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.signal = WTERMSIG(status);
    e.core_dumped = WCOREDUMP(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

void AgentSession::AdoptChildren() {
  // New children: those whose agent kept the probes (an entry still deciding is seen next
  // round). One that ended before kwatch looked is followed and ended at once.
  for (const wa::FollowedProcess& f : ctl_->Followed()) {
    if (f.state != ka::kKwProcessFollowed ||
        std::any_of(children_.begin(), children_.end(),
                    [&f](const Child& c) { return c.entry == f.entry && c.pid == f.pid; })) {
      continue;
    }
    Child c;
    c.pid = f.pid;
    c.parent = f.parent;
    c.entry = f.entry;
    c.pidfd = core::UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, f.pid, 0)));
    // The process under that pid maps the session's memory: the child itself, not another
    // process that took the pid of an ended child.
    if (c.pidfd.valid() && !ctl_->MapsSession(f.pid)) {
      c.pidfd.Reset();
    }
    if (!opts().quiet) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kChildFollowed;
      n.backend = backend();
      n.pid = f.pid;
      n.parent = f.parent;
      Note(n);
    }
    children_.push_back(std::move(c));
  }
}

void AgentSession::PollChildren() {
  AdoptChildren();
  for (Child& c : children_) {
    if (c.entry == UINT32_MAX) {
      continue;  // ended, said
    }
    if (c.pidfd.valid()) {
      pollfd pfd{.fd = c.pidfd.get(), .events = POLLIN, .revents = 0};
      if (::poll(&pfd, 1, 0) != 1) {
        // Runs: with the agent, or an exec'd image (its lifeline's end closed on exec).
        if (!c.execd && !ctl_->HoldsLifeline(c.pid)) {
          c.execd = true;
          NoteExec(c.pid, /*child=*/true);
        }
        continue;
      }
    }
    if (!opts().quiet) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kChildExited;
      n.backend = backend();
      n.pid = c.pid;
      n.child = true;
      n.exit = ZombieExit(c.pid);
      Note(n);
    }
    ctl_->ForgetProcess(c.entry);
    c.entry = UINT32_MAX;
    c.pidfd.Reset();
  }
}

void AgentSession::NoteExec(pid_t pid, bool child) {
  ProbeNote n;
  n.kind = ProbeNote::Kind::kExec;
  n.pid = pid;
  n.child = child;
  if (opts().follow_forks) {
    n.rearm = ProbeNote::Rearm::kFailed;
    n.why = "the agent does not follow an exec (--backend ptrace probes the new image)";
  }
  NoteAndKeep(n);
}

absl::Status AgentSession::PollTarget() {
  if (exited_ || ctl_ == nullptr) {
    return absl::OkStatus();
  }
  bool target_exited = target_exited_;
  bool lifeline_closed = agent_gone_;  // no process holds the agent's lifeline any more
  if (!agent_gone_) {
    KW_ASSIGN_OR_RETURN(const wa::Liveness live, ctl_->Wait(absl::ZeroDuration()));
    if ((live.target_exited && !target_exited_) || live.agent_gone) {
      // What the target recorded up to its end (or exec) is shown first.
      KW_RETURN_IF_ERROR(DrainRings());
    }
    target_exited = target_exited || live.target_exited;
    if (live.agent_gone) {
      // The lifeline's last reader went: an exit (its files close just before the pidfd says
      // so) or an exec (the read end is close-on-exec), after which the process runs on.
      // With -f, every followed child's end or exec came first.
      if (!target_exited) {
        pollfd pfd{.fd = ctl_->pidfd(), .events = POLLIN, .revents = 0};
        target_exited = ::poll(&pfd, 1, 0) == 1 || !RunsOn(pid_);
      }
      lifeline_closed = true;
      if (!target_exited) {
        agent_gone_ = true;
        KW_RETURN_IF_ERROR(loop().Remove(ctl_->lifeline_fd()));  // in error from now on
        if (!target_execd_) {
          target_execd_ = true;
          NoteExec(pid_, /*child=*/false);
        }
      }
    } else if (opts().follow_forks && !target_exited && !target_execd_ &&
               !ctl_->HoldsLifeline(pid_)) {
      // -f: the target exec'd while followed children hold the lifeline.
      pollfd pfd{.fd = ctl_->pidfd(), .events = POLLIN, .revents = 0};
      if (::poll(&pfd, 1, 0) == 0 && RunsOn(pid_)) {
        target_execd_ = true;
        NoteExec(pid_, /*child=*/false);
      }
    }
  } else if (!target_exited_) {
    pollfd pfd{.fd = ctl_->pidfd(), .events = POLLIN, .revents = 0};
    target_exited = ::poll(&pfd, 1, 0) == 1;
  }
  if (opts().follow_forks) {
    PollChildren();
  }
  if (target_exited && !target_exited_) {
    target_exited_ = true;
    if (launched_) {
      // The process may be between closing its files and becoming a zombie: wait for it. A
      // thread kwatch still traces (one that a detach missed while it ran) stays a zombie
      // until kwatch reaps it, and holds the exit status back: reap such threads meanwhile.
      pollfd pfd{.fd = ctl_->pidfd(), .events = POLLIN, .revents = 0};
      for (int waited_ms = 0; waited_ms < 60'000 && ::poll(&pfd, 1, 10) == 0; waited_ms += 10) {
        ReapTracedThreads(pid_);
      }
      exit_ = ctl_->ReapExit();
    }
    if (opts().follow_forks && !lifeline_closed) {
      // Followed children hold the agent still: the session goes on until they end. The
      // pidfd stays readable from now on.
      KW_RETURN_IF_ERROR(loop().Remove(ctl_->pidfd()));
    }
  }
  if (!target_exited_ || (opts().follow_forks && !lifeline_closed)) {
    return absl::OkStatus();
  }
  exited_ = true;
  if (!children_.empty()) {
    KW_RETURN_IF_ERROR(DrainRings());
    PollChildren();
    Stop("target and its followed children exited");
  } else {
    Stop(TargetEnded(exit_));
  }
  return absl::OkStatus();
}

void AgentSession::OnStop() {
  if (ctl_ == nullptr) {
    return;
  }
  for (Placed& p : placed_) {
    p.lost_at_stop = ctl_->tables().probe(p.index).lost.load(std::memory_order_relaxed);
  }
  stop_noted_ = true;
}

absl::StatusOr<ProbeSessionEnd> AgentSession::Finish() {
  (void)PollTarget();  // a stop signal ended the last Step before it looked
  absl::Status ended = absl::OkStatus();
  if (ctl_ != nullptr) {
    if (!exited_ && !agent_gone_) {
      ended = ctl_->EndDetached(Collector());
    } else {
      ended = ctl_->Finish(Collector());
    }
    DeliverDrained();
  }
  // -f: the children whose code the end put back (seized in turn), still running.
  const std::vector<pid_t> released =
      ctl_ != nullptr ? ctl_->released_children() : std::vector<pid_t>{};
  for (const pid_t child : released) {
    if (std::none_of(children_.begin(), children_.end(),
                     [child](const Child& c) { return c.pid == child; })) {
      Child c;  // registered while kwatch was ending: followed all the same
      c.pid = child;
      c.entry = UINT32_MAX;
      children_.push_back(std::move(c));
    }
  }
  if (!exited_) {
    if (launched_ && opts().kill_on_exit) {
      for (const pid_t child : released) {
        auto it = std::find_if(children_.begin(), children_.end(),
                               [child](const Child& c) { return c.pid == child; });
        if (it != children_.end() && it->pidfd.valid()) {
          (void)::syscall(SYS_pidfd_send_signal, it->pidfd.get(), SIGKILL, nullptr, 0);
        } else {
          ::kill(child, SIGKILL);  // just let go by kwatch: still this process
        }
      }
      if (!target_exited_) {
        ::kill(pid_, SIGKILL);
        pollfd pfd{.fd = ctl_ != nullptr ? ctl_->pidfd() : -1, .events = POLLIN, .revents = 0};
        (void)::poll(&pfd, 1, 5000);
        if (ctl_ != nullptr) {
          exit_ = ctl_->ReapExit();
        }
        AppendToStopReason("; target killed (--kill-on-exit)");
      }
    } else if (ended.ok()) {
      if (!released.empty()) {
        ProbeNote n;
        n.kind = ProbeNote::Kind::kChildrenReleased;
        n.count = released.size();
        Note(n);
      }
      if (!target_exited_) {
        ProbeNote n;
        n.kind = ProbeNote::Kind::kReleased;
        n.backend = backend();
        n.pid = pid_;
        Note(n);
      }
    }
  }
  if (agent_opts_.aggregator != nullptr) {
    agent_opts_.aggregator->Release();  // the target's rows, final: it takes no more hits
    NoteShortAggregates();
  }
  ProbeSessionEnd end;
  for (const Placed& p : placed_) {
    const ka::KwProbe& kp = ctl_->tables().probe(p.index);
    ProbeEndStats st;
    st.misses = kp.missed.load() + p.after_stop;
    st.nmissed = kp.nmissed.load();
    st.abandoned = kp.abandoned.load();
    st.faults = kp.faults.load();
    st.lost = kp.lost.load();
    // The agent counts every hit it took, records lost or not (a thread hitting a probe
    // flat out fills its ring between two drains): the hits are that count, less the
    // records of hits after the stop (drained then, or lost then). With --count reached,
    // the hits are the ones taken up to the limit.
    if (!(has_sink() && sink().done())) {
      const uint64_t lost_after = stop_noted_ ? st.lost - std::min(st.lost, p.lost_at_stop) : 0;
      const uint64_t hits = kp.hits.load();
      st.counted = hits - std::min(hits, p.after_stop + lost_after);
    }
    if (p.filter_in_target) {
      st.target_filter = ProbeEndStats::TargetFilter{.rejected = kp.filtered.load(),
                                                     .no_value = kp.filter_no_value.load(),
                                                     .division_by_zero = kp.filter_div0.load()};
    } else {
      st.condition_in_kwatch_why = p.filter_why;
    }
    end.stats[p.def->id] = st;
    end.paths[p.def->id] = p.path;
  }
  if (ctl_ != nullptr) {
    const ka::KwControl& c = ctl_->tables().control();
    const uint64_t dropped = c.recursion_miss.load() + c.no_thread_slot.load();
    if (dropped > 0) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kAgentDropped;
      n.count = dropped;
      n.why = absl::StrCat(c.recursion_miss.load(), " inside another hit of the same thread, ",
                           c.no_thread_slot.load(), " of threads beyond the ",
                           ctl_->tables().layout().thread_capacity, " the rings serve");
      Keep(std::move(n));
    }
    // -f follows a child unless the process table was full or kwatch was ending.
    if (const uint64_t forks = c.forks_seen.load() - c.forks_followed.load(); forks > 0) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kForksNotFollowed;
      n.count = forks;
      n.backend = backend();
      Keep(std::move(n));
    }
    if (!children_.empty()) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kChildrenFollowed;
      for (const Child& child : children_) {
        n.pids.push_back(child.pid);
      }
      Keep(std::move(n));
    }
    if (data_loss_ > 0) {
      ProbeNote n;
      n.kind = ProbeNote::Kind::kAgentDropped;
      n.count = data_loss_;
      n.why = "rings held records that do not parse (skipped)";
      Keep(std::move(n));
    }
  }
  ProbeRunInfo info;
  info.backend = backend();
  info.pid = pid_;
  info.seconds = Elapsed();
  info.stop_reason = stop_reason();
  info.exit = exit_;
  info.notes = kept_notes();
  end.info = std::move(info);
  end.launched = launched_;
  end.error = failed().ok() ? ended : failed();
  return end;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeSession>> StartAgentSession(
    const ProbeSessionOptions& opts, const AgentSessionOptions& agent_opts, const ProbeSet& set,
    core::UniqueFd sigfd, const ProbeSessionHooks& hooks) {
  // The rings are drained every 10 ms, and at once again while a drain finds them a quarter
  // full (DrainRings): 1 MiB per thread holds about 18,700 records of a probe with one argument,
  // so a thread hitting probes flat out (28 M/s through a jump) loses what comes while kwatch
  // works, and says so (measured with -o on a loaded 2-CPU VM: 2.0-2.5 M hits/s recorded from
  // one thread, 1.5 M/s from two).
  KW_ASSIGN_OR_RETURN(std::unique_ptr<EventLoop> loop,
                      EventLoop::Create(std::move(sigfd), absl::Milliseconds(10)));
  auto session = std::make_unique<AgentSession>(opts, agent_opts, set, std::move(loop), hooks);
  KW_RETURN_IF_ERROR(session->Begin());
  return session;
}

}  // namespace kwatch::watch::probe
