#include "watch/session.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "core/symbols/code_point.h"
#include "core/symbols/expr.h"
#include "drmgr/applier.h"
#include "watch/call_watches.h"
#include "watch/hw_probe.h"
#include "watch/page_backend.h"
#include "watch/perf_backend.h"
#include "watch/session_policy.h"
#include "watch/stop_backend.h"

namespace kwatch::watch {

using session_internal::SlotRequestFor;

namespace {
constexpr uint64_t kMaxPageWatch = 64ULL << 20;
}  // namespace

absl::string_view BackendName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kPerf:
      return "perf";
    case BackendKind::kPage:
      return "page";
    case BackendKind::kStop:
      return "stop";
  }
  return "?";
}

WatchSession::WatchSession(core::ptrace::Process& proc,
                           std::shared_ptr<core::symbols::Symbols> symbols,
                           std::shared_ptr<core::symbols::Symbolizer> symbolizer,
                           std::vector<Watch> watches)
    : proc_(proc),
      symbols_(std::move(symbols)),
      symbolizer_(symbolizer != nullptr ? std::move(symbolizer)
                                        : std::make_shared<core::symbols::Symbolizer>(*symbols_)),
      watches_(std::move(watches)) {}

WatchSession::~WatchSession() {
  Disarm();
}

namespace {

bool IsHardware(BackendKind kind) {
  return kind != BackendKind::kPage && kind != BackendKind::kAuto;
}

// What to tell a user whose watch cannot have hardware.
std::string RefusalAdvice(const Watch& w, const SessionOptions& opts) {
  if (w.request.kind == drmgr::DrKind::kExec) {
    return "an execute watch needs a debug register of its own (page protection cannot "
           "watch execution); watch fewer addresses, or --overcommit=multiplex to take turns";
  }
  if (opts.hardware_asked) {
    return absl::StrCat("--backend ", opts.backend == BackendKind::kStop ? "stop" : "perf",
                        " asks for debug registers only: add --overcommit=pages to watch what "
                        "does not fit with page protection (exact, slower), or "
                        "--overcommit=multiplex to rotate the watches through the registers");
  }
  if (opts.overcommit == Overcommit::kFail) {
    return "--overcommit=pages watches what does not fit with page protection, "
           "--overcommit=multiplex rotates the watches through the registers";
  }
  return "--overcommit=pages watches it with page protection";
}

// --follow: no debug register is left for pointer `p` of followed watch `w`.
std::string FollowShortage(const Watch& w, const FollowedWatch& fw,
                           const core::symbols::PointerLoad& p, const std::string& reason) {
  return absl::StrCat("--follow: no debug register is left for pointer '", p.display, "' of '",
                      w.target.display, "' (", reason,
                      "): a followed watch needs one for its object and one for each pointer it "
                      "goes through (",
                      FollowPointersText(fw), "), ", fw.pointers.size() + 1,
                      " of the 4 in all; watch fewer expressions");
}

}  // namespace

absl::string_view OvercommitName(Overcommit o) {
  switch (o) {
    case Overcommit::kPages:
      return "pages";
    case Overcommit::kMultiplex:
      return "multiplex";
    case Overcommit::kFail:
      return "fail";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<WatchSession>> WatchSession::Create(
    core::ptrace::Process& proc, std::vector<WatchRequest> requests, const SessionOptions& opts,
    std::shared_ptr<core::symbols::Symbols> symbols) {
  if (requests.empty() && !opts.per_call) {
    return absl::InvalidArgumentError("nothing to watch: give at least one expression");
  }
  if (symbols == nullptr) {
    KW_ASSIGN_OR_RETURN(symbols, core::symbols::Symbols::ForProcess(proc.pid()));
  }
  // --follow: by request index.
  std::map<size_t, FollowedWatch> follows;
  std::vector<std::string> follow_notes;
  KW_RETURN_IF_ERROR(CheckFollow(*symbols, requests, follows, follow_notes));
  BackendKind kind = opts.backend;
  std::string note;
  const bool exact = opts.exact_values || opts.stack_frames > 0;
  if (!follows.empty()) {
    // The pointers are watched in stop mode: each write of one stops its thread, and the
    // watch moves before any thread runs on.
    const char* why = nullptr;
    if (kind == BackendKind::kPerf) {
      why =
          "perf stream mode does not stop the thread that writes a pointer, so the watch could "
          "not move before the program writes the new object: use --stop (with --follow, "
          "auto picks it)";
    } else if (kind == BackendKind::kPage) {
      why =
          "it watches the pointers with debug registers in stop mode, and --backend page uses "
          "none: use --stop (with --follow, auto picks it)";
    } else if (kind == BackendKind::kAuto && !ProbeDebugTraps().delivered) {
      return absl::FailedPreconditionError(
          absl::StrCat("--follow watches the pointers with debug registers in stop mode, and ",
                       ProbeDebugTraps().detail));
    }
    if (why != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--follow: ", why));
    }
    kind = BackendKind::kStop;
  }
  if (kind == BackendKind::kAuto) {
    const DebugTrapProbe& probe = ProbeDebugTraps();
    if (probe.delivered) {
      kind = exact ? BackendKind::kStop : BackendKind::kPerf;
    } else {
      kind = BackendKind::kPage;
      note = absl::StrCat("note: ", probe.detail,
                          "; using page-protection watchpoints instead (exact values and any size, "
                          "at one fault per access to the page; --backend perf forces "
                          "hardware breakpoints)");
    }
  }
  if (IsHardware(kind)) {
    const DebugTrapProbe& probe = ProbeDebugTraps();
    if (probe.accepted && !probe.delivered) {
      note = absl::StrCat("warning: ", probe.detail, "; --backend ", BackendName(kind),
                          " will arm the watches but report no accesses in debug registers "
                          "(--backend page works here)");
    }
  }
  if (kind == BackendKind::kPerf && exact) {
    return absl::InvalidArgumentError(absl::StrCat(
        opts.stack_frames > 0 ? "--stack" : "--if on new or old values",
        " needs the accessing thread stopped at the access, and perf stream mode reads values "
        "later, at drain time: use --stop (debug registers through ptrace) or --backend page"));
  }
  const core::symbols::MemoryReader reader =
      [&proc](core::RemoteAddr addr, std::span<uint8_t> out) { return proc.ReadMemory(addr, out); };
  std::vector<Watch> watches;
  std::map<uint32_t, FollowedWatch> followed;
  for (auto& req : requests) {
    if (auto f = follows.find(watches.size()); f != follows.end()) {
      // --follow: where the pointers lead now, or parked until they lead somewhere.
      FollowedWatch& fw = f->second;
      FollowResolution now = ResolveFollowed(*symbols, fw.expr, reader, fw.shape);
      fw.pointers = std::move(now.pointers);
      fw.parked = !now.target.has_value();
      fw.why = now.why;
      core::symbols::ResolvedExpr target = now.target.has_value() ? *now.target : fw.shape;
      if (fw.parked) {
        target.addr = core::RemoteAddr{0};
      }
      target.length = req.length.value_or(fw.shape.length);
      if (target.length == 0 || target.length > drmgr::kMaxRequestLen) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--follow: '%s' is %d bytes, and a followed watch moves from debug register to debug "
            "register, which cover 1 to %d bytes: watch a field of it",
            fw.shape.display, target.length, drmgr::kMaxRequestLen));
      }
      Watch w;
      w.id = static_cast<uint32_t>(watches.size());
      w.request = std::move(req);
      w.target = std::move(target);
      followed[w.id] = std::move(fw);
      watches.push_back(std::move(w));
      continue;
    }
    // --exec takes code as `kwatch probe` writes it (FUNC, FUNC+OFF, FILE:LINE) before data.
    std::optional<core::symbols::ResolvedExpr> code;
    if (req.kind == drmgr::DrKind::kExec) {
      absl::StatusOr<std::optional<core::symbols::ResolvedExpr>> c =
          core::symbols::ResolveCodePoint(*symbols, req.expr);
      if (!c.ok()) {
        return absl::Status(c.status().code(),
                            absl::StrCat("'", req.expr, "': ", c.status().message()));
      }
      code = *std::move(c);
    }
    absl::StatusOr<core::symbols::ResolvedExpr> resolved = absl::UnknownError("unresolved");
    if (code.has_value()) {
      resolved = *std::move(code);
    } else {
      KW_ASSIGN_OR_RETURN(const core::symbols::Expr expr, core::symbols::ParseExpr(req.expr));
      resolved = symbols->Resolve(expr, reader);
    }
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat("'", req.expr, "': ", resolved.status().message()));
    }
    if (req.length.has_value()) {
      resolved->length = *req.length;
    } else if (req.kind == drmgr::DrKind::kExec) {
      resolved->length = 1;  // an execute breakpoint fires at one instruction start
    }
    if (resolved->length == 0 || resolved->length > kMaxPageWatch) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s': a watch covers 1 byte to %d MiB; this one is %d bytes",
                          resolved->display, kMaxPageWatch >> 20, resolved->length));
    }
    if (req.kind == drmgr::DrKind::kExec) {
      if (kind == BackendKind::kPage) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", resolved->display, "': --exec needs hardware breakpoints, and ",
                         note.empty() ? "the page backend was chosen" : ProbeDebugTraps().detail));
      }
      KW_RETURN_IF_ERROR(drmgr::CheckHardwareRange(resolved->addr, resolved->length, req.kind));
    }
    Watch w;
    w.id = static_cast<uint32_t>(watches.size());
    w.request = std::move(req);
    w.target = *std::move(resolved);
    watches.push_back(std::move(w));
  }
  if (IsHardware(kind)) {
    // What drmgr would decide with every register free: refusals surface now, before
    // anything is armed (the kernel may still say that some registers are taken, at Arm).
    drmgr::SlotAllocator dry;
    const drmgr::ClientId client = dry.AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
    for (const Watch& w : watches) {
      if (w.target.length > drmgr::kMaxRequestLen && opts.overcommit == Overcommit::kPages) {
        continue;  // straight to pages
      }
      auto fw = followed.find(w.id);
      if (fw != followed.end() && fw->second.parked) {
        continue;  // nothing to watch yet
      }
      absl::StatusOr<drmgr::Grant> g =
          fw != followed.end()
              ? dry.Request(client, SlotRequestFor(w, proc.pid(), drmgr::ShortagePolicy::kFail))
              : dry.Request(client,
                            SlotRequestFor(w, proc.pid(), opts.overcommit, opts.debugger_shares));
      if (!g.ok()) {
        return absl::Status(g.status().code(),
                            absl::StrCat("'", w.target.display, "': ", g.status().message()));
      }
      if (g->state == drmgr::RequestState::kFailed) {
        return absl::ResourceExhaustedError(
            absl::StrCat("'", w.target.display, "' (", w.target.length, " bytes at ",
                         absl::StrFormat("0x%x", w.target.addr.value), "): ", g->reason, "; ",
                         RefusalAdvice(w, opts)));
      }
    }
    // --follow: each pointer needs a register of its own too.
    for (const auto& [id, fw] : followed) {
      for (const core::symbols::PointerLoad& p : fw.pointers) {
        absl::StatusOr<drmgr::Grant> g =
            dry.Request(client, session_internal::PointerRequestFor(p, watches[id], proc.pid()));
        if (!g.ok()) {
          return absl::Status(g.status().code(), absl::StrCat("--follow: pointer '", p.display,
                                                              "': ", g.status().message()));
        }
        if (g->state == drmgr::RequestState::kFailed) {
          return absl::ResourceExhaustedError(FollowShortage(watches[id], fw, p, g->reason));
        }
      }
    }
  }
  auto session = std::unique_ptr<WatchSession>(
      new WatchSession(proc, std::move(symbols), nullptr, std::move(watches)));
  session->backend_note_ = std::move(note);
  session->followed_ = std::move(followed);
  session->follow_notes_ = std::move(follow_notes);
  session->opts_ = opts;
  session->kind_ = kind;
  return session;
}

absl::StatusOr<std::unique_ptr<WatchSession>> WatchSession::ForFork(WatchSession& parent,
                                                                    core::ptrace::Process& child) {
  if (!parent.followed_.empty()) {
    return absl::FailedPreconditionError(
        "--follow: the watches of a forked child would follow its own pointers: not supported "
        "yet");
  }
  // What the fork copied of kwatch's changes was undone at the fork event (OnFollowedFork):
  // protected pages. Perf and stop mode's breakpoints are never inherited across fork.
  if (parent.page_backend_ != nullptr) {
    if (absl::Status s = parent.page_backend_->TakeForkCleanup(child.pid()); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cleaning up what forked child ", child.pid(), " inherited: ", s.message()));
    }
  }
  auto session = std::unique_ptr<WatchSession>(
      new WatchSession(child, parent.symbols_, parent.symbolizer_, parent.watches_));
  session->opts_ = parent.opts_;
  session->kind_ = parent.kind_;
  return session;
}

std::string WatchSession::PeopleReason(const std::string& reason) const {
  // drmgr names requests ("request 3 (watchpoint 'kwatch', g_stats.hits, priority 10)", a joined
  // kwatch's client named otherwise; "requests 2, 3"); a user knows the watches by number.
  std::map<uint64_t, uint32_t> watch_of;
  for (const auto& [id, req] : request_of_) {
    watch_of[req.value] = id;
  }
  static const std::regex kOne(R"(request (\d+) \(watchpoint '[^']*', [^()]*, priority \d+\))");
  static const std::regex kMany(R"(requests? ((\d+)(, \d+)*))");
  std::string out = std::regex_replace(reason, kOne, "request $1");
  std::string result;
  auto begin = std::sregex_iterator(out.begin(), out.end(), kMany);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    result.append(out, last, static_cast<size_t>(m.position(0)) - last);
    std::vector<std::string> names;
    for (absl::string_view n : absl::StrSplit(m[1].str(), ", ")) {
      uint64_t id = 0;
      auto w = absl::SimpleAtoi(n, &id) ? watch_of.find(id) : watch_of.end();
      names.push_back(w == watch_of.end() ? absl::StrCat("request ", n)
                                          : absl::StrCat("#", w->second + 1, " ",
                                                         watches_[w->second].target.display));
    }
    absl::StrAppend(&result, names.size() == 1 ? "watch " : "watches ", absl::StrJoin(names, ", "));
    last = static_cast<size_t>(m.position(0) + m.length(0));
  }
  result.append(out, last);
  return result;
}

absl::Status WatchSession::Arm() {
  page_watches_.clear();
  page_backend_ = nullptr;
  if (opts_.stack_frames > 0 && unwinder_ == nullptr) {
    KW_ASSIGN_OR_RETURN(unwinder_,
                        core::symbols::Unwinder::ForProcess(
                            proc_.pid(), [this](core::RemoteAddr a, std::span<uint8_t> o) {
                              return proc_.ReadMemory(a, o);
                            }));
  }
  // Both backends stop and resume the world while they arm: the target must not run between
  // the hardware registers and the protected pages.
  if (proc_.alive()) {
    KW_RETURN_IF_ERROR(proc_.StopAll());
  }
  proc_.HoldStopped();
  absl::Cleanup release = [this] { (void)proc_.ReleaseHold(); };
  if (IsHardware(kind_)) {
    alloc_ = std::make_unique<drmgr::SlotAllocator>(
        drmgr::SlotAllocator::Options{.rotate_interval = opts_.mux_interval});
    client_ = alloc_->AddClient(drmgr::ClientKind::kWatchpoint, "kwatch");
    request_of_.clear();
    if (kind_ == BackendKind::kStop) {
      hw_ = std::make_unique<StopBackend>(proc_, watches_, *symbolizer_,
                                          std::map<drmgr::RequestId, uint32_t>{});
    } else {
      hw_ = std::make_unique<PerfBackend>(proc_, watches_, *symbolizer_, opts_,
                                          std::map<drmgr::RequestId, uint32_t>{});
    }
    if (unwinder_ != nullptr) {
      hw_->SetStackHook([this](pid_t tid) { return CaptureStack(tid); });
    }
    KW_RETURN_IF_ERROR(hw_->Arm());
    absl::Cleanup undo = [this] { hw_->Disarm(); };
    for (const Watch& w : watches_) {
      if (per_call(w.id)) {
        continue;  // armed per call, in the calling thread (ArmCall)
      }
      if (w.target.length > drmgr::kMaxRequestLen) {
        page_watches_.push_back(w);  // Create allowed it only with --overcommit=pages
        continue;
      }
      const auto fw = followed_.find(w.id);
      if (fw != followed_.end() && fw->second.parked) {
        continue;  // --follow: armed when its pointers lead somewhere
      }
      const drmgr::ShortagePolicy policy =
          fw != followed_.end()
              ? drmgr::ShortagePolicy::kFail  // moved from register to register
              : session_internal::PolicyFor(w.request, opts_.overcommit, opts_.debugger_shares);
      KW_ASSIGN_OR_RETURN(drmgr::Grant g,
                          alloc_->Request(client_, SlotRequestFor(w, proc_.pid(), policy)));
      hw_->AddOwner(g.id, w.id);
      request_of_[w.id] = g.id;
      policy_of_[w.id] = policy;
      if (absl::Status s = drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g.changes)); !s.ok()) {
        return {s.code(), absl::StrCat("arming '", w.target.display, "': ", s.message())};
      }
    }
    KW_RETURN_IF_ERROR(ArmFollow());
    multiplexing_ = false;
    register_watches_.clear();
    for (const Watch& w : watches_) {
      auto it = request_of_.find(w.id);
      if (it == request_of_.end()) {
        continue;
      }
      KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(it->second));
      switch (v.state) {
        case drmgr::RequestState::kFallbackPages:
          page_watches_.push_back(w);
          break;
        case drmgr::RequestState::kFailed:
        case drmgr::RequestState::kPreempted:
          return absl::ResourceExhaustedError(
              absl::StrCat("'", w.target.display, "': ", v.reason, "; ", RefusalAdvice(w, opts_)));
        case drmgr::RequestState::kMultiplexed:
          multiplexing_ = true;
          break;
        case drmgr::RequestState::kHardware:
          // Multiplexed watches are left out: they hold a register only part of the time.
          register_watches_.push_back(w);
          break;
      }
    }
    alloc_->AdvanceClock(absl::Now());  // multiplex coverage counts from here
    if (!page_watches_.empty()) {
      KW_RETURN_IF_ERROR(ArmPages(&register_watches_));
    }
    std::move(undo).Cancel();
  } else {
    page_watches_ = watches_;
    KW_RETURN_IF_ERROR(ArmPages(nullptr));
  }
  armed_ = true;
  std::move(release).Cancel();
  return proc_.ReleaseHold();
}

absl::Status WatchSession::ArmPages(const std::vector<Watch>* in_registers) {
  auto page = std::make_unique<PageBackend>(proc_, page_watches_);
  if (in_registers != nullptr) {
    page->SetRegisterWatches(in_registers);
  }
  if (unwinder_ != nullptr) {
    page->SetStackHook([this](pid_t tid) { return CaptureStack(tid); });
  }
  KW_RETURN_IF_ERROR(page->Arm());
  page_backend_ = page.get();
  page_ = std::move(page);
  return absl::OkStatus();
}

uint32_t WatchSession::CaptureStack(pid_t tid) {
  absl::StatusOr<user_regs_struct> regs = proc_.GetRegs(tid);
  if (!regs.ok()) {
    ++stack_errors_;
    return 0;
  }
  absl::StatusOr<std::vector<core::RemoteAddr>> frames =
      unwinder_->Unwind(tid, *regs, opts_.stack_frames);
  if (!frames.ok()) {
    ++stack_errors_;
    return 0;
  }
  auto [it, fresh] = stack_ids_.try_emplace(*frames, static_cast<uint32_t>(stacks_.size() + 1));
  if (fresh) {
    stacks_.push_back(*std::move(frames));
  }
  return it->second;
}

absl::StatusOr<bool> WatchSession::Tick(absl::Time now) {
  if (alloc_ == nullptr || !armed_) {
    return false;
  }
  drmgr::Changes changes = alloc_->Rotate(now);
  if (changes.slots.empty()) {
    return false;
  }
  KW_RETURN_IF_ERROR(drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(changes)));
  return true;
}

absl::StatusOr<std::vector<uint32_t>> WatchSession::AddWatches(std::vector<WatchRequest> requests,
                                                               const std::string& client_name) {
  if (alloc_ == nullptr || hw_ == nullptr || !armed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the session of pid ", proc_.pid(),
        " watches with page protection only, and a joined watch needs the debug registers of a "
        "hardware session (page-protected watches cannot be added to a running session yet); "
        "end that session, or start it with --backend perf"));
  }
  if (requests.empty()) {
    return absl::InvalidArgumentError("nothing to watch: give at least one expression");
  }
  const core::symbols::MemoryReader reader = [this](core::RemoteAddr addr, std::span<uint8_t> out) {
    return proc_.ReadMemory(addr, out);
  };
  std::vector<Watch> added;
  for (WatchRequest& req : requests) {
    if (req.kind == drmgr::DrKind::kExec) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", req.expr,
                       "': --exec cannot join another kwatch's session yet (only --write, --rw "
                       "and --read watches can)"));
    }
    KW_ASSIGN_OR_RETURN(const core::symbols::Expr expr, core::symbols::ParseExpr(req.expr));
    absl::StatusOr<core::symbols::ResolvedExpr> resolved = symbols_->Resolve(expr, reader);
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat("'", req.expr, "': ", resolved.status().message()));
    }
    if (req.length.has_value()) {
      resolved->length = *req.length;
    }
    if (resolved->length == 0 || resolved->length > drmgr::kMaxRequestLen) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s': %d bytes; a watch that joins another kwatch's session gets debug registers "
          "only (at most %d bytes), and page protection cannot be added to a running session "
          "yet: watch a field of it",
          resolved->display, resolved->length, drmgr::kMaxRequestLen));
    }
    Watch w;
    w.id = static_cast<uint32_t>(watches_.size() + added.size());
    w.request = std::move(req);
    w.target = *std::move(resolved);
    added.push_back(std::move(w));
  }
  alloc_->AdvanceClock(absl::Now());
  const drmgr::ClientId client = alloc_->AddClient(drmgr::ClientKind::kWatchpoint, client_name);
  const size_t first = watches_.size();
  for (const Watch& w : added) {
    watches_.push_back(w);
  }
  removed_.resize(watches_.size(), false);
  // On error, the client's requests are released and the watches forgotten.
  absl::Cleanup undo = [this, client, first] {
    if (absl::StatusOr<drmgr::Changes> c = alloc_->RemoveClient(client); c.ok()) {
      (void)drmgr::ApplyWithRetry(*alloc_, *hw_, *std::move(c));
    }
    for (size_t id = first; id < watches_.size(); ++id) {
      request_of_.erase(static_cast<uint32_t>(id));
      guest_client_.erase(static_cast<uint32_t>(id));
    }
    watches_.resize(first);
    removed_.resize(first);
  };
  // Joined watches never fall back to pages: what does not fit fails, or takes turns.
  const Overcommit policy =
      opts_.overcommit == Overcommit::kMultiplex ? Overcommit::kMultiplex : Overcommit::kFail;
  for (const Watch& w : added) {
    drmgr::SlotRequest request = SlotRequestFor(w, proc_.pid(), policy);
    request.label = absl::StrCat(w.target.display, " [", client_name, "]");  // `kwatch slots`
    KW_ASSIGN_OR_RETURN(drmgr::Grant g, alloc_->Request(client, std::move(request)));
    hw_->AddOwner(g.id, w.id);
    request_of_[w.id] = g.id;
    guest_client_[w.id] = client;
    if (g.state == drmgr::RequestState::kFailed) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "'", w.target.display, "': ", PeopleReason(g.reason),
          opts_.overcommit == Overcommit::kMultiplex
              ? ""
              : "; the session joined has no debug register left for it (page protection "
                "cannot be added to a running session yet): watch fewer fields, or start the "
                "first kwatch with --overcommit=multiplex to let watches take turns"));
    }
    if (absl::Status s = drmgr::ApplyWithRetry(*alloc_, *hw_, std::move(g.changes)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("arming '", w.target.display, "': ", s.message()));
    }
  }
  std::vector<uint32_t> ids;
  for (const Watch& w : added) {
    KW_ASSIGN_OR_RETURN(const drmgr::RequestView v, alloc_->Describe(request_of_[w.id]));
    if (v.state == drmgr::RequestState::kMultiplexed) {
      multiplexing_ = true;
    } else if (v.state == drmgr::RequestState::kHardware) {
      register_watches_.push_back(w);
    } else {
      return absl::ResourceExhaustedError(
          absl::StrCat("'", w.target.display, "': ", PeopleReason(v.reason)));
    }
    ids.push_back(w.id);
  }
  std::move(undo).Cancel();
  return ids;
}

absl::Status WatchSession::RemoveWatches(const std::vector<uint32_t>& ids) {
  for (const uint32_t id : ids) {
    if (!guest_client_.contains(id) || removed_[id]) {
      return absl::InvalidArgumentError(absl::StrCat("watch #", id + 1, " was not joined"));
    }
  }
  if (alloc_ == nullptr || hw_ == nullptr) {
    return absl::FailedPreconditionError("no debug registers in this session");
  }
  alloc_->AdvanceClock(absl::Now());
  absl::Status status;
  std::set<drmgr::ClientId> clients;
  for (const uint32_t id : ids) {
    removed_[id] = true;
    clients.insert(guest_client_[id]);
    std::erase_if(register_watches_, [id](const Watch& w) { return w.id == id; });
    auto it = request_of_.find(id);
    if (it == request_of_.end()) {
      continue;
    }
    absl::StatusOr<drmgr::Changes> changes = alloc_->Release(it->second);
    request_of_.erase(it);
    if (!changes.ok()) {
      status.Update(changes.status());
      continue;
    }
    status.Update(drmgr::ApplyWithRetry(*alloc_, *hw_, *std::move(changes)));
  }
  for (const drmgr::ClientId client : clients) {
    if (std::none_of(guest_client_.begin(), guest_client_.end(),
                     [&](const auto& e) { return e.second == client && !removed_[e.first]; })) {
      if (absl::StatusOr<drmgr::Changes> c = alloc_->RemoveClient(client); c.ok()) {
        status.Update(drmgr::ApplyWithRetry(*alloc_, *hw_, *std::move(c)));
      }
    }
  }
  multiplexing_ = false;
  for (const auto& [watch_id, request] : request_of_) {
    absl::StatusOr<drmgr::RequestView> v = alloc_->Describe(request);
    multiplexing_ |= v.ok() && v->state == drmgr::RequestState::kMultiplexed;
  }
  return status;
}

void WatchSession::Disarm() {
  if (calls_ != nullptr) {
    (void)calls_->Remove();  // their probes first: no call arms anything after this
  }
  if (alloc_ != nullptr && armed_) {
    alloc_->AdvanceClock(absl::Now());
  }
  if (hw_ != nullptr) {
    hw_->Disarm();
  }
  if (page_ != nullptr) {
    page_->Disarm();
  }
  armed_ = false;
}

void WatchSession::Forget() {
  if (calls_ != nullptr) {
    calls_->Forget();
  }
  if (alloc_ != nullptr && armed_) {
    alloc_->AdvanceClock(absl::Now());
  }
  if (hw_ != nullptr) {
    hw_->Forget();
  }
  if (page_ != nullptr) {
    page_->Forget();
  }
  armed_ = false;
}

std::vector<int> WatchSession::Fds() const {
  std::vector<int> fds;
  for (const WatchBackend* b : {static_cast<const WatchBackend*>(hw_.get()),
                                static_cast<const WatchBackend*>(page_.get())}) {
    if (b != nullptr) {
      for (int fd : b->Fds()) {
        fds.push_back(fd);
      }
    }
  }
  return fds;
}

uint64_t WatchSession::lost() const {
  return (hw_ != nullptr ? hw_->lost() : 0) + (page_ != nullptr ? page_->lost() : 0) +
         (calls_ != nullptr ? calls_->lost() : 0);
}

uint64_t WatchSession::unrelated() const {
  return (hw_ != nullptr ? hw_->unrelated() : 0) + (page_ != nullptr ? page_->unrelated() : 0);
}

uint64_t WatchSession::segv_handler_restores() const {
  return handler_restores_carried_ +
         (page_backend_ != nullptr ? page_backend_->handler_restores() : 0);
}

uint64_t WatchSession::segv_handler_resets_kept() const {
  return handler_resets_kept_carried_ +
         (page_backend_ != nullptr ? page_backend_->handler_resets_kept() : 0);
}

BackendKind WatchSession::backend() const {
  if (IsHardware(kind_) && page_watches_.size() < watches_.size()) {
    return kind_;
  }
  return BackendKind::kPage;
}

int WatchSession::external_slots() const {
  return alloc_ != nullptr ? alloc_->ExternallyHeld(drmgr::Scope::Process(proc_.pid())) : 0;
}

WatchPlacement WatchSession::placement(uint32_t id) const {
  WatchPlacement p;
  if (per_call(id)) {
    p.backend = kind_;
    p.detail =
        absl::StrCat("a debug register of the calling thread during each call of ",
                     calls_ != nullptr ? calls_->FunctionOf(id) : std::string("its function"), " (",
                     kind_ == BackendKind::kPerf ? "perf breakpoint stream" : "stop mode",
                     "), when one is free");
    return p;
  }
  if (id < removed_.size() && removed_[id]) {
    p.backend = kind_;
    p.detail = "removed (the kwatch that joined with it ended; its debug registers went back)";
    return p;
  }
  if (const FollowedWatch* fw = followed(id); fw != nullptr && fw->parked) {
    p.backend = kind_;
    p.detail =
        absl::StrCat("parked (--follow): ", fw->why, "; armed when ", FollowPointersText(*fw),
                     " lead", fw->pointers.size() == 1 ? "s" : "", " to an object");
    return p;
  }
  const bool paged = std::any_of(page_watches_.begin(), page_watches_.end(),
                                 [id](const Watch& w) { return w.id == id; });
  auto it = request_of_.find(id);
  std::optional<drmgr::RequestView> v;
  if (alloc_ != nullptr && it != request_of_.end()) {
    if (auto d = alloc_->Describe(it->second); d.ok()) {
      v = *std::move(d);
    }
  }
  if (paged || !v.has_value()) {
    p.backend = BackendKind::kPage;
    if (!IsHardware(kind_)) {
      p.detail = "page protection (exact values)";
    } else if (v.has_value()) {
      p.detail = absl::StrCat("page protection (exact values): ", PeopleReason(v->reason));
    } else {
      p.detail = absl::StrCat("page protection (exact values): ", watches_[id].target.length,
                              " bytes are more than debug registers can cover");
    }
    return p;
  }
  p.backend = kind_;
  p.chunks = v->chunks;
  p.slots = v->slots;
  p.exact = v->exact;
  p.shared = v->shared;
  p.multiplexed = v->state == drmgr::RequestState::kMultiplexed;
  p.coverage = v->coverage();
  std::string regs;
  for (size_t i = 0; i < p.slots.size(); ++i) {
    absl::StrAppend(&regs, i == 0 ? "" : "+", "DR", p.slots[i]);
  }
  const char* mode = kind_ == BackendKind::kPerf ? "perf breakpoint stream" : "stop mode";
  const std::string reason = PeopleReason(v->reason);
  if (p.multiplexed) {
    p.detail = absl::StrCat("debug registers, multiplexed (", mode, "): ", reason);
  } else {
    p.detail = absl::StrCat("debug register", p.slots.size() == 1 ? " " : "s ", regs, " (", mode,
                            "): ", reason);
  }
  if (const FollowedWatch* fw = followed(id); fw != nullptr && alloc_ != nullptr) {
    std::vector<std::string> held;
    for (size_t i = 0; i < fw->requests.size() && i < fw->pointers.size(); ++i) {
      absl::StatusOr<drmgr::RequestView> pv = alloc_->Describe(fw->requests[i]);
      std::string regs;
      for (size_t k = 0; pv.ok() && k < pv->slots.size(); ++k) {
        absl::StrAppend(&regs, k == 0 ? "" : "+", "DR", pv->slots[k]);
      }
      held.push_back(absl::StrCat(fw->pointers[i].display, " in ", regs.empty() ? "?" : regs));
    }
    absl::StrAppend(&p.detail, "; --follow: moves when ", FollowPointersText(*fw),
                    fw->pointers.size() == 1 ? " is" : " are",
                    " written (watched in stop mode: ", absl::StrJoin(held, ", "), ")");
  }
  return p;
}

size_t WatchSession::Drain(absl::FunctionRef<void(const core::AccessEvent&)> sink) {
  batch_.clear();
  if (batch_.capacity() > 65536) {  // the memory of an old burst goes back (see PageBackend)
    std::vector<core::AccessEvent>().swap(batch_);
  }
  if (hw_ != nullptr) {
    hw_->Collect(batch_);
  }
  if (page_ != nullptr) {
    page_->Collect(batch_);
  }
  if (calls_ != nullptr) {
    calls_->Collect(batch_);  // per-call watches armed in the target by kwatch's agent
  }
  if (!carried_.empty()) {  // from page backends replaced since (LendSlots)
    batch_.insert(batch_.end(), carried_.begin(), carried_.end());
    carried_.clear();
  }
  if (batch_.empty()) {
    return 0;
  }
  std::stable_sort(
      batch_.begin(), batch_.end(),
      [](const core::AccessEvent& a, const core::AccessEvent& b) { return a.time_ns < b.time_ns; });
  // Backends that cannot read values at the access: one read per range per batch.
  std::map<std::pair<uint64_t, uint32_t>, std::optional<uint64_t>> values;
  size_t delivered = 0;
  for (auto& ev : batch_) {
    const Watch& w = watches_[ev.watch_id];
    if (w.request.reads_only && ev.kind == core::AccessKind::kWrite) {
      ++filtered_;
      continue;
    }
    if (!ev.value_exact) {
      const auto key = std::make_pair(ev.addr.value, ev.len);
      auto [it, fresh] = values.try_emplace(key);
      if (fresh && proc_.alive() && w.request.kind != drmgr::DrKind::kExec && ev.len > 0 &&
          ev.len <= 8) {
        std::array<uint8_t, 8> buf{};
        if (proc_.ReadMemory(ev.addr, std::span<uint8_t>(buf).first(ev.len)).ok()) {
          uint64_t v = 0;
          std::memcpy(&v, buf.data(), buf.size());
          it->second = v;
        }
      }
      ev.value = it->second;
    }
    sink(ev);
    ++delivered;
  }
  return delivered;
}

}  // namespace kwatch::watch
