#include "watch/call_watches.h"

#include <algorithm>
#include <regex>
#include <span>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/clock.h"
#include "core/base/status_macros.h"
#include "core/base/target_files.h"
#include "core/probe/probe_spec.h"

namespace kwatch::watch {

namespace {

absl::Status InOption(const absl::Status& s, const std::string& function) {
  return {s.code(), absl::StrCat("--in '", function, "': ", s.message())};
}

// "compute+0x8 (prog.c:12)".
std::string PointText(const core::probe::ResolvedPoint& p) {
  std::string out = p.Where();
  if (!p.file.empty()) {
    const size_t slash = p.file.rfind('/');
    absl::StrAppend(&out, " (", slash == std::string::npos ? p.file : p.file.substr(slash + 1), ":",
                    p.line, ")");
  }
  return out;
}

// The one point of `spec` (option `option`) inside the function of `entry`: its own errors,
// or InvalidArgument naming where it is when it is elsewhere (`why`: why it must be inside).
absl::StatusOr<core::probe::ResolvedPoint> PointInside(const core::probe::ProbeTarget& target,
                                                       const core::probe::ResolvedPoint& entry,
                                                       const std::string& option,
                                                       const std::string& spec,
                                                       const std::string& why) {
  absl::StatusOr<core::probe::ProbePoint> ap = core::probe::ParseProbePoint(spec);
  if (!ap.ok()) {
    return absl::Status(ap.status().code(),
                        absl::StrCat(option, " '", spec, "': ", ap.status().message()));
  }
  absl::StatusOr<std::vector<core::probe::ResolvedPoint>> r = target.Resolve(*ap);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat(option, " '", spec, "': ", r.status().message()));
  }
  const auto inside = std::find_if(r->begin(), r->end(), [&](const auto& p) {
    return !p.is_return && p.function_start == entry.function_start;
  });
  if (inside == r->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, " '", spec, "' is not inside ", entry.function, " (it is at ",
                     r->empty() ? std::string{"no code"} : PointText(r->front()), "): ", why));
  }
  return *inside;
}

// How a call that never returned through kwatch ended (longjmp, an exception).
constexpr const char* kAbandoned = "abandoned (it never returned: longjmp?)";

}  // namespace

absl::StatusOr<std::unique_ptr<CallWatches>> CallWatches::Create(
    core::ptrace::Process& proc, WatchSession& session, const std::vector<CallWatchRequest>& reqs) {
  std::unique_ptr<CallWatches> cw(new CallWatches(proc, session));
  KW_ASSIGN_OR_RETURN(const std::string exe, core::OpenableExecutable(proc.pid()));
  KW_ASSIGN_OR_RETURN(const std::unique_ptr<core::probe::ProbeTarget> target,
                      core::probe::ProbeTarget::Open(exe));
  KW_ASSIGN_OR_RETURN(const std::vector<core::ptrace::MapEntry> maps, proc.Maps());
  KW_ASSIGN_OR_RETURN(cw->bias_, target->LoadBias(maps));
  // Resolved points by function, for the --at points of the same function.
  // (function, at and until) -> functions_
  std::map<std::pair<std::string, std::string>, size_t> index;
  std::map<size_t, core::probe::ResolvedPoint> at_points;
  for (const CallWatchRequest& req : reqs) {
    auto [it, fresh] =
        index.try_emplace({req.function, req.at + "\n" + req.until}, cw->functions_.size());
    if (fresh) {
      absl::StatusOr<core::probe::ProbePoint> point = core::probe::ParseProbePoint(req.function);
      if (!point.ok()) {
        return InOption(point.status(), req.function);
      }
      if (point->kind != core::probe::ProbePoint::Kind::kFunction || point->is_return ||
          point->offset != 0 || point->line.has_value() || !point->pattern.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--in '", req.function,
                         "': give a function name (the point inside it goes in --at SPEC)"));
      }
      absl::StatusOr<std::vector<core::probe::ResolvedPoint>> entry = target->Resolve(*point);
      if (!entry.ok()) {
        return InOption(entry.status(), req.function);
      }
      if (entry->size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--in '", req.function, "': names ", entry->size(), " functions in ", exe,
                         "; add @FILE to pick one (e.g. '", req.function, "@prog.c')"));
      }
      core::probe::ResolvedPoint at = entry->front();
      if (!req.at.empty()) {
        KW_ASSIGN_OR_RETURN(at, PointInside(*target, entry->front(), "--at", req.at,
                                            "each call's object is looked up in the call"));
      }
      Function f;
      f.name = req.function;
      f.point = PointText(at);
      f.entry = core::RemoteAddr{entry->front().function_start.value + cw->bias_};
      f.at = core::RemoteAddr{at.vaddr.value + cw->bias_};
      if (!req.until.empty()) {
        KW_ASSIGN_OR_RETURN(const core::probe::ResolvedPoint until,
                            PointInside(*target, entry->front(), "--until", req.until,
                                        "a call's watch ends there, in the call"));
        f.until = core::RemoteAddr{until.vaddr.value + cw->bias_};
        f.until_text = absl::StrCat("reached --until ", PointText(until));
      }
      cw->functions_.push_back(std::move(f));
      at_points[it->second] = at;
    }
    Function& f = cw->functions_[it->second];
    absl::StatusOr<core::probe::CompiledObject> obj =
        core::probe::CompileObject(*target, at_points[it->second], req.request.expr);
    if (!obj.ok()) {
      return InOption(obj.status(), req.function);
    }
    core::symbols::ResolvedExpr shape;
    shape.display = req.request.expr;
    shape.length = obj->length;
    shape.type_name = obj->type_name;
    shape.layout = obj->layout;
    shape.module = exe;
    absl::StatusOr<uint32_t> id = session.DeclareCallWatch(req.request, std::move(shape));
    if (!id.ok()) {
      return InOption(id.status(), req.function);
    }
    CallStats& st = cw->stats_[*id];
    st.watch_id = *id;
    st.function = f.name;
    st.point = f.point;
    f.objects.push_back(Object{*id, *std::move(obj)});
  }
  return cw;
}

absl::Status TakeScopedRequests(pid_t pid, std::vector<WatchRequest>& requests,
                                std::vector<CallWatchRequest>& calls) {
  static const std::regex kScoped(R"(^\s*([A-Za-z_][A-Za-z0-9_]*)::(.+)$)");
  std::unique_ptr<core::probe::ProbeTarget> target;
  std::vector<WatchRequest> kept;
  for (WatchRequest& r : requests) {
    std::smatch m;
    if (!std::regex_match(r.expr, m, kScoped)) {
      kept.push_back(std::move(r));
      continue;
    }
    if (target == nullptr) {
      KW_ASSIGN_OR_RETURN(const std::string exe, core::OpenableExecutable(pid));
      KW_ASSIGN_OR_RETURN(target, core::probe::ProbeTarget::Open(exe));
    }
    const std::string function = m[1].str();
    if (target->FunctionNames(function).empty()) {
      kept.push_back(std::move(r));  // a namespace or a class: a global of the program
      continue;
    }
    CallWatchRequest c;
    c.function = function;
    c.request = std::move(r);
    c.request.expr = m[2].str();
    calls.push_back(std::move(c));
  }
  requests = std::move(kept);
  return absl::OkStatus();
}

std::vector<std::string> CallStatsLines(const CallStats& s) {
  std::vector<std::string> out;
  out.push_back(absl::StrFormat(
      "per call of %s (objects looked up at %s): %d call%s, %d watched, %d not watched", s.function,
      s.point, s.calls, s.calls == 1 ? "" : "s", s.armed, s.not_armed));
  if (s.ended_armed > 0) {
    out.push_back(absl::StrFormat(
        "accesses per watched call: min %d, avg %.2f, max %d (%d call%s)", s.events_min,
        static_cast<double>(s.events_total) / static_cast<double>(s.ended_armed), s.events_max,
        s.ended_armed, s.ended_armed == 1 ? "" : "s"));
  }
  for (const auto& [why, n] : s.why_not) {
    out.push_back(absl::StrFormat("not watched in %d call%s: %s", n, n == 1 ? "" : "s", why));
  }
  if (s.missed > 0) {
    out.push_back(absl::StrFormat(
        "%d call%s not tracked: more calls were in flight at once than kwatch tracks (%d)",
        s.missed, s.missed == 1 ? "" : "s", core::probe::kDefaultMaxActive));
  }
  if (s.abandoned > 0) {
    out.push_back(absl::StrFormat(
        "%d watched call%s ended without returning (longjmp, a thread's exit, the session's end)",
        s.abandoned, s.abandoned == 1 ? "" : "s"));
  }
  if (s.running > 0) {
    out.push_back(absl::StrFormat("%d call%s still running", s.running, s.running == 1 ? "" : "s"));
  }
  return out;
}

CallWatches::~CallWatches() {
  (void)Remove();
}

absl::Status CallWatches::Start(const CallAgentFactory& agent, const std::string& why_not_agent) {
  constexpr const char* kPtracePath =
      "watches per call run through ptrace: each call stops its thread at its entry and its "
      "return (tens of us a call)";
  std::string refused = why_not_agent;
  if (agent != nullptr && session_.backend() != BackendKind::kPerf) {
    refused = "exact values (stop mode) need the thread stopped at each access";
  } else if (agent != nullptr) {
    CallAgentPlan plan;
    plan.load_bias = bias_;
    for (const Function& f : functions_) {
      CallAgentPlan::Function pf;
      pf.name = f.name;
      pf.entry = f.entry;
      pf.at = f.at;
      pf.until = f.until;
      for (const Object& o : f.objects) {
        const Watch& w = session_.watches()[o.watch_id];
        const uint64_t len = w.target.length;
        if (len != 1 && len != 2 && len != 4 && len != 8) {
          refused = absl::StrCat("'", w.target.display, "' takes ", len,
                                 " bytes: the agent arms one breakpoint of 1, 2, 4 or 8 bytes");
        }
        pf.objects.push_back(CallAgentPlan::Object{o.watch_id, o.compiled.place,
                                                   static_cast<uint32_t>(len), w.request.kind});
      }
      plan.functions.push_back(std::move(pf));
    }
    if (refused.empty()) {
      absl::StatusOr<std::unique_ptr<CallAgent>> a = agent(proc_, *this, plan);
      if (a.ok()) {
        agent_ = *std::move(a);
        path_note_ = agent_->Description();
        return absl::OkStatus();
      }
      refused = std::string{a.status().message()};
    }
  }
  path_note_ = refused.empty() ? std::string(kPtracePath)
                               : absl::StrCat(kPtracePath, "; not in the target: ", refused);
  KW_ASSIGN_OR_RETURN(guardian_, core::ptrace::Guardian::Start(proc_.pid()));
  engine_ = std::make_unique<core::probe::Int3Engine>(proc_);
  engine_->SetGuardian(guardian_.get());
  KW_RETURN_IF_ERROR(engine_->StopWorld());
  absl::Status s;
  for (Function& f : functions_) {
    core::probe::ProbeHandlers track;
    track.entry = [this, &f](const core::probe::ProbeContext& ctx) { OnEntry(f, ctx); };
    track.pre = [this, &f](const core::probe::ProbeContext& ctx) { OnReturn(f, ctx); };
    absl::StatusOr<core::probe::ProbeId> r = engine_->RegisterReturn(f.entry, std::move(track));
    if (!r.ok()) {
      s = InOption(r.status(), f.name);
      break;
    }
    f.return_probe = *r;
    // Registered after the return probe: at the entry itself, its handler runs second.
    core::probe::ProbeHandlers point;
    point.pre = [this, &f](const core::probe::ProbeContext& ctx) { OnPoint(f, ctx); };
    absl::StatusOr<core::probe::ProbeId> p = engine_->Register(f.at, std::move(point));
    if (!p.ok()) {
      s = absl::Status(p.status().code(), absl::StrCat("the point of --in '", f.name, "' (",
                                                       f.point, "): ", p.status().message()));
      break;
    }
    f.at_probe = *p;
    if (f.until.value != 0) {
      core::probe::ProbeHandlers until;
      until.pre = [this, &f](const core::probe::ProbeContext& ctx) { OnUntil(f, ctx); };
      absl::StatusOr<core::probe::ProbeId> u = engine_->Register(f.until, std::move(until));
      if (!u.ok()) {
        s = absl::Status(u.status().code(),
                         absl::StrCat("--until of --in '", f.name, "': ", u.status().message()));
        break;
      }
    }
  }
  if (!s.ok()) {
    (void)engine_->RestoreAll();
  }
  (void)engine_->ResumeWorld();
  return s;
}

void CallWatches::OnEntry(Function& f, const core::probe::ProbeContext& ctx) {
  const uint64_t sp = ctx.regs.rsp;
  // Frames at or below this one that never returned (longjmp, an exception): abandoned.
  for (Function& g : functions_) {
    auto it = g.stacks.find(ctx.tid);
    if (it == g.stacks.end()) {
      continue;
    }
    while (!it->second.empty() && it->second.back().second <= sp) {
      EndAll(g, it->second.back().first, ctx.time_ns, kAbandoned);
      it->second.pop_back();
    }
  }
  const uint32_t call = ++f.calls;
  f.stacks[ctx.tid].emplace_back(call, sp);
  for (const Object& o : f.objects) {
    CallRecord r;
    r.watch_id = o.watch_id;
    r.call = call;
    r.tid = ctx.tid;
    r.entry_sp = sp;
    r.start_ns = ctx.time_ns;
    calls_[{o.watch_id, call}] = std::move(r);
    ++stats_[o.watch_id].calls;
  }
}

void CallWatches::OnPoint(Function& f, const core::probe::ProbeContext& ctx) {
  auto st = f.stacks.find(ctx.tid);
  if (st == f.stacks.end() || st->second.empty()) {
    return;  // not in a tracked call (more calls in flight than tracked at once)
  }
  const uint32_t call = st->second.back().first;
  core::probe::FetchContext fc;
  fc.regs = &ctx.regs;
  fc.load_bias = bias_;
  fc.read = [this](core::RemoteAddr a, std::span<uint8_t> out) { return proc_.ReadMemory(a, out); };
  fc.tid = ctx.tid;
  for (const Object& o : f.objects) {
    auto it = calls_.find({o.watch_id, call});
    if (it == calls_.end() || it->second.state != CallRecord::State::kEntered) {
      continue;  // looked up already (the point runs again in the same call)
    }
    CallRecord& r = it->second;
    CallStats& stats = stats_[o.watch_id];
    absl::StatusOr<core::RemoteAddr> addr =
        core::probe::EvaluateObjectAddress(o.compiled.place, fc);
    if (!addr.ok()) {
      r.state = CallRecord::State::kNotArmed;
      r.why = std::string{addr.status().message()};
      ++stats.not_armed;
      ++stats.why_not[r.why];
      continue;
    }
    r.base = *addr;
    absl::StatusOr<std::string> why = session_.ArmCall(o.watch_id, call, ctx.tid, *addr);
    if (!why.ok() || !why->empty()) {
      r.state = CallRecord::State::kNotArmed;
      r.why = why.ok() ? *why : std::string{why.status().message()};
      ++stats.not_armed;
      ++stats.why_not[why.ok() ? std::string{kCallNoRegister} : r.why];
      continue;
    }
    r.state = CallRecord::State::kArmed;
    r.armed = true;
    ++stats.armed;
  }
}

void CallWatches::OnUntil(Function& f, const core::probe::ProbeContext& ctx) {
  auto st = f.stacks.find(ctx.tid);
  if (st == f.stacks.end() || st->second.empty()) {
    return;
  }
  // The innermost call of this thread ends its watches here; its return ends nothing more.
  const uint32_t call = st->second.back().first;
  for (const Object& o : f.objects) {
    auto it = calls_.find({o.watch_id, call});
    if (it != calls_.end()) {
      End(it->second, ctx.time_ns, f.until_text, /*normal=*/true);
    }
  }
}

void CallWatches::OnReturn(Function& f, const core::probe::ProbeContext& ctx) {
  auto st = f.stacks.find(ctx.tid);
  if (st == f.stacks.end()) {
    return;
  }
  // The caller's rsp is the returning call's entry rsp + 8; calls deeper than it were left.
  std::vector<std::pair<uint32_t, uint64_t>>& stack = st->second;
  while (!stack.empty() && stack.back().second < ctx.regs.rsp) {
    const bool returning = stack.back().second + 8 == ctx.regs.rsp;
    EndAll(f, stack.back().first, ctx.time_ns, returning ? std::string() : std::string{kAbandoned});
    stack.pop_back();
  }
}

void CallWatches::EndAll(Function& f, uint32_t call, uint64_t now_ns, const std::string& how) {
  for (const Object& o : f.objects) {
    auto it = calls_.find({o.watch_id, call});
    if (it != calls_.end()) {
      End(it->second, now_ns, how);
    }
  }
}

void CallWatches::End(CallRecord& r, uint64_t now_ns, const std::string& how, bool normal) {
  if (r.state == CallRecord::State::kEnded) {
    return;
  }
  if (r.state == CallRecord::State::kArmed) {
    if (absl::Status s = session_.EndCall(r.watch_id, r.call); !s.ok()) {
      r.why = absl::StrCat("its register could not be given back: ", s.message());
    }
  }
  if (r.state == CallRecord::State::kEntered) {
    r.why = "the function ended before the point where its object is looked up";
    ++stats_[r.watch_id].not_armed;
    ++stats_[r.watch_id].why_not[r.why];
  }
  r.state = CallRecord::State::kEnded;
  r.returned = how.empty() || normal;
  if (!how.empty()) {
    r.why = how;
  }
  r.end_ns = now_ns;
  ended_.emplace_back(r.watch_id, r.call);
}

CallRecord& CallWatches::AgentRecord(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns,
                                     uint64_t entry_sp) {
  auto [it, fresh] = calls_.try_emplace({watch_id, call});
  if (fresh) {
    CallRecord& r = it->second;
    r.watch_id = watch_id;
    r.call = call;
    r.tid = tid;
    r.entry_sp = entry_sp;
    r.start_ns = time_ns;
    ++stats_[watch_id].calls;
  }
  return it->second;
}

void CallWatches::AgentLookup(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns,
                              uint64_t entry_sp, core::RemoteAddr addr, const std::string& why) {
  CallRecord& r = AgentRecord(watch_id, call, tid, time_ns, entry_sp);
  if (r.state != CallRecord::State::kEntered) {
    return;
  }
  CallStats& stats = stats_[watch_id];
  r.base = addr;
  if (!why.empty()) {
    r.state = CallRecord::State::kNotArmed;
    r.why = why;
    ++stats.not_armed;
    ++stats.why_not[why];
    return;
  }
  r.state = CallRecord::State::kArmed;
  r.armed = true;
  ++stats.armed;
}

void CallWatches::AgentEnd(uint32_t watch_id, uint32_t call, pid_t tid, uint64_t time_ns,
                           uint64_t entry_sp, EndHow how) {
  CallRecord& r = AgentRecord(watch_id, call, tid, time_ns, entry_sp);
  switch (how) {
    case EndHow::kReturned:
    case EndHow::kNotLooked:  // End says why: it ended before the point
      End(r, time_ns, std::string());
      break;
    case EndHow::kAbandoned:
      End(r, time_ns, kAbandoned);
      break;
    case EndHow::kUntil:
      for (const Function& f : functions_) {
        for (const Object& o : f.objects) {
          if (o.watch_id == watch_id) {
            End(r, time_ns, f.until_text, /*normal=*/true);
            return;
          }
        }
      }
      End(r, time_ns, std::string());
      break;
  }
}

void CallWatches::Collect(std::vector<core::AccessEvent>& out) {
  if (agent_ == nullptr) {
    return;
  }
  agent_->Collect(out);
  // Threads that exited before this drain: their calls that the agent did not end were left.
  if (!exited_.empty()) {
    const uint64_t now = core::MonotonicNs();
    for (auto& [key, r] : calls_) {
      if (r.state != CallRecord::State::kEnded &&
          std::find(exited_.begin(), exited_.end(), r.tid) != exited_.end()) {
        End(r, now, "its thread exited in the call");
      }
    }
    exited_.clear();
  }
}

std::vector<int> CallWatches::Fds() const {
  return agent_ != nullptr ? agent_->Fds() : std::vector<int>{};
}

core::AccessEvent CallWatches::Rebase(const core::AccessEvent& ev) {
  core::AccessEvent out = ev;
  auto it = calls_.find({ev.watch_id, ev.call});
  if (it == calls_.end()) {
    return out;
  }
  ++it->second.events;
  const uint64_t base = it->second.base.value;
  out.addr.value -= std::min(base, out.addr.value);
  out.access_addr.value -= std::min(base, out.access_addr.value);
  return out;
}

const CallRecord* CallWatches::Find(uint32_t watch_id, uint32_t call) const {
  auto it = calls_.find({watch_id, call});
  return it == calls_.end() ? nullptr : &it->second;
}

std::vector<CallRecord> CallWatches::TakeEnded() {
  std::vector<CallRecord> out;
  out.reserve(ended_.size());
  for (const auto& key : ended_) {
    auto it = calls_.find(key);
    if (it == calls_.end()) {
      continue;
    }
    Retire(it->second);
    out.push_back(std::move(it->second));
    calls_.erase(it);
  }
  ended_.clear();
  return out;
}

void CallWatches::Retire(const CallRecord& r) {
  CallStats& s = stats_[r.watch_id];
  if (!r.armed) {
    return;
  }
  if (!r.returned) {
    ++s.abandoned;
  }
  s.events_min = s.ended_armed == 0 ? r.events : std::min(s.events_min, r.events);
  s.events_max = std::max(s.events_max, r.events);
  s.events_total += r.events;
  ++s.ended_armed;
}

void CallWatches::OnThreadExit(pid_t tid) {
  const uint64_t now = core::MonotonicNs();
  if (agent_ != nullptr) {
    exited_.push_back(tid);  // ended after the agent's records before its exit are read
    return;
  }
  for (Function& f : functions_) {
    auto it = f.stacks.find(tid);
    if (it == f.stacks.end()) {
      continue;
    }
    for (size_t i = it->second.size(); i-- > 0;) {  // innermost first
      EndAll(f, it->second[i].first, now, "its thread exited in the call");
    }
    f.stacks.erase(it);
  }
  if (engine_ != nullptr) {
    engine_->OnThreadExit(tid);
  }
}

absl::Status CallWatches::Remove() {
  if (removed_) {
    return absl::OkStatus();
  }
  removed_ = true;
  if (engine_ == nullptr && agent_ == nullptr && calls_.empty()) {
    return absl::OkStatus();  // never started: nothing planted, and the target stays as it is
  }
  // Every thread stopped: a call's registers are its thread's, written while it is stopped.
  const bool live = proc_.alive() && proc_.StopAll().ok();
  if (live) {
    proc_.HoldStopped();
  }
  absl::Cleanup release = [this, live] {
    if (live) {
      (void)proc_.ReleaseHold();
    }
  };
  const uint64_t now = core::MonotonicNs();
  absl::Status s;
  if (agent_ != nullptr) {
    // The code back and the breakpoints disabled (a live target), and the agent's last records
    // read (also of a target that exited: they are in kwatch's shared memory).
    s = agent_->End();
    for (auto& [key, r] : calls_) {
      if (r.state != CallRecord::State::kEnded) {
        End(r, now, "still running when the session ended");
      }
    }
    for (Function& f : functions_) {
      for (const Object& o : f.objects) {
        stats_[o.watch_id].missed = agent_->Missed(o.watch_id);
      }
    }
    return s;
  }
  for (Function& f : functions_) {
    for (auto& [tid, stack] : f.stacks) {
      for (size_t i = stack.size(); i-- > 0;) {  // innermost first
        EndAll(f, stack[i].first, now, "still running when the session ended");
      }
    }
    f.stacks.clear();
  }
  for (const Function& f : functions_) {
    if (engine_ == nullptr) {
      break;
    }
    if (absl::StatusOr<core::probe::ProbeStats> ps = engine_->Stats(f.return_probe); ps.ok()) {
      for (const Object& o : f.objects) {
        stats_[o.watch_id].missed = ps->nmissed;
      }
    }
  }
  if (engine_ != nullptr && proc_.alive()) {
    s = engine_->RestoreAll();
  }
  engine_.reset();
  return s;
}

void CallWatches::Forget() {
  const uint64_t now = core::MonotonicNs();
  for (auto& [key, r] : calls_) {
    if (r.state != CallRecord::State::kEnded) {
      r.state = CallRecord::State::kEnded;  // the backends forgot their registers already
      r.why = "the target called exec in the call";
      r.end_ns = now;
      ended_.push_back(key);
    }
  }
  for (Function& f : functions_) {
    f.stacks.clear();
  }
  if (engine_ != nullptr) {
    engine_->OnExec();
  }
  if (agent_ != nullptr) {
    agent_->Forget();
  }
  removed_ = true;
}

std::vector<CallStats> CallWatches::stats() const {
  std::vector<CallStats> out;
  for (const auto& [id, s] : stats_) {
    CallStats c = s;
    if (agent_ != nullptr && !removed_) {
      c.missed = agent_->Missed(id);
    }
    for (const Function& f : functions_) {
      if (f.name != s.function || engine_ == nullptr) {
        continue;
      }
      if (absl::StatusOr<core::probe::ProbeStats> ps = engine_->Stats(f.return_probe); ps.ok()) {
        c.missed = ps->nmissed;
      }
    }
    for (const auto& [key, r] : calls_) {
      if (key.first == id && r.state != CallRecord::State::kEnded) {
        ++c.running;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string CallWatches::FunctionOf(uint32_t watch_id) const {
  auto it = stats_.find(watch_id);
  return it == stats_.end() ? std::string() : it->second.function;
}

}  // namespace kwatch::watch
