#include "watch/gdb/server.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "watch/gdb/amd64_regs.h"
#include "watch/gdb/packet.h"
#include "watch/gdb/signals.h"
#include "watch/gdb/svr4.h"

namespace kwatch::watch::gdb {

namespace {

constexpr uint64_t kMaxMemoryPacket = 0x1fff;  // bytes per m reply (PacketSize 0x4000, in hex)
constexpr absl::string_view kErr = "E01";

// "addr,len" of m, M, X, Z and z packets.
bool ParseAddrLen(absl::string_view s, uint64_t& addr, uint64_t& len) {
  const std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(s, absl::MaxSplits(',', 1));
  absl::StatusOr<uint64_t> a = ParseHexNumber(parts.first);
  absl::StatusOr<uint64_t> l = ParseHexNumber(parts.second);
  if (!a.ok() || !l.ok()) {
    return false;
  }
  addr = *a;
  len = *l;
  return true;
}

// A thread id of H, T and vCont packets: hex tid, "-1" (all), "0" (any), or "pPID.TID".
bool ParseThreadId(absl::string_view s, pid_t& tid) {
  if (absl::ConsumePrefix(&s, "p")) {
    const size_t dot = s.find('.');
    s = dot == absl::string_view::npos ? absl::string_view("-1") : s.substr(dot + 1);
  }
  if (s == "-1") {
    tid = -1;
    return true;
  }
  absl::StatusOr<uint64_t> v = ParseHexNumber(s);
  if (!v.ok() || *v > 0x7fffffff) {
    return false;
  }
  tid = static_cast<pid_t>(*v);
  return true;
}

}  // namespace

GdbServer::GdbServer(core::ptrace::Process& proc, Connection& conn, bool attached)
    : proc_(proc), conn_(conn), attached_(attached) {}

GdbServer::~GdbServer() {
  if (proc_.alive()) {
    RemoveAllPoints();
  }
  proc_.RemoveInterceptor(this);
}

absl::Status GdbServer::Start() {
  engine_ = std::make_unique<core::probe::Int3Engine>(proc_);
  hw_ = std::make_unique<HwPoints>(proc_);
  proc_.AddInterceptor(this);  // last: kwatch's own backends and the engine claim first
  started_ = true;
  return absl::OkStatus();
}

absl::Status GdbServer::Reply(absl::string_view payload) {
  absl::Status s = conn_.Send(payload);
  if (!s.ok() && conn_.closed()) {
    return absl::OkStatus();  // gdb went away: the next read says so
  }
  return s;
}

pid_t GdbServer::ThreadFor(pid_t wanted) const {
  const std::vector<pid_t> threads = proc_.TracedThreads();
  if (wanted > 0 && std::find(threads.begin(), threads.end(), wanted) != threads.end()) {
    return wanted;
  }
  if (std::find(threads.begin(), threads.end(), proc_.pid()) != threads.end() || threads.empty()) {
    return proc_.pid();
  }
  return threads.front();
}

std::string GdbServer::StopReply(const StopInfo& stop) {
  // gdb takes the stopped thread as the one its next g, G, p, P, c and s are about (as
  // gdbserver does).
  if (!stop.exited && stop.tid > 0) {
    g_thread_ = stop.tid;
    c_thread_ = stop.tid;
  }
  if (stop.exited) {
    return stop.exit.signaled ? absl::StrFormat("X%02x", ToGdbSignal(stop.exit.signal))
                              : absl::StrFormat("W%02x", stop.exit.code & 0xff);
  }
  std::string r = absl::StrFormat("T%02xthread:%x;", ToGdbSignal(stop.signal), stop.tid);
  if (!stop.reason.empty()) {
    absl::StrAppend(&r, stop.reason, ";");
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Stops.

bool GdbServer::Claims(pid_t tid, const siginfo_t& si) {
  if (!started_) {
    return false;
  }
  if (si.si_signo == SIGSTOP && parked_.contains(tid)) {
    return true;  // a Z0 hit's stop: kwatch's, also once gdb has gone (never the target's)
  }
  if (state_ != State::kServing) {
    return false;
  }
  if (si.si_code == SI_TKILL && si.si_pid == ::getpid() &&
      injected_.erase({tid, si.si_signo}) > 0) {
    return false;  // a signal gdb resumed the thread with: the target's
  }
  if (std::optional<HwPoints::Hit> hit = hw_->Fired(tid, si); hit.has_value()) {
    if (stepping_) {
      step_hit_ = hit;  // Process::SingleStep drops it and steps on
    }
    return true;
  }
  if (stepping_) {
    return false;  // set aside by SingleStep: delivered when the thread resumes
  }
  const int sig = si.si_signo;
  if (sig == SIGTRAP) {
    // An INT3 nobody else claimed (gdb's own, or the program's), or a SIGTRAP someone sent.
    // Other traps (spurious debug exceptions, late traps of closed breakpoints) are absorbed
    // by Process.
    return si.si_code == SI_KERNEL || si.si_code <= 0;
  }
  return !pass_signals_.contains(sig);
}

absl::Status GdbServer::OnThreadStart(pid_t tid) {
  if (hw_ != nullptr && state_ == State::kServing) {
    return hw_->OnThreadStart(tid);
  }
  return absl::OkStatus();
}

void GdbServer::OnExec() {
  if (engine_ != nullptr) {
    engine_->OnExec();
  }
  sw_.clear();
  raw_sw_.clear();
  parked_.clear();
  if (hw_ != nullptr) {
    hw_->RemoveAll();
  }
}

absl::Status GdbServer::Handle(pid_t tid, const siginfo_t& si) {
  if (in_serve_) {
    return absl::OkStatus();  // not expected: the world is already held for gdb
  }
  if (state_ != State::kServing) {
    // The stop of a Z0 hit that came after gdb detached: the thread goes on from the
    // breakpoint's address, its instruction not run yet (the breakpoint is gone).
    parked_.erase(tid);
    return absl::OkStatus();
  }
  StopInfo stop;
  stop.tid = tid;
  stop.signal = si.si_signo;
  if (std::optional<HwPoints::Hit> hit = hw_->Fired(tid, si); hit.has_value()) {
    stop.signal = SIGTRAP;
    switch (hit->kind) {
      case HwKind::kBreak:
        stop.reason = "hwbreak:";
        break;
      case HwKind::kWrite:
        stop.reason = absl::StrCat("watch:", HexNumber(hit->addr.value));
        break;
      case HwKind::kRead:
        stop.reason = absl::StrCat("rwatch:", HexNumber(hit->addr.value));
        break;
      case HwKind::kAccess:
        stop.reason = absl::StrCat("awatch:", HexNumber(hit->addr.value));
        break;
    }
  } else if (si.si_signo == SIGSTOP && parked_.contains(tid)) {
    // A Z0 of the engine: the thread stopped at the breakpoint's address, its instruction
    // not run yet (Int3Engine::ParkCurrentThread).
    parked_.erase(tid);
    stop.signal = SIGTRAP;
    stop.reason = "swbreak:";
  } else if (si.si_signo == SIGTRAP && si.si_code == SI_KERNEL && !raw_sw_.empty()) {
    KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
    if (raw_sw_.contains(core::RemoteAddr{regs.rip - 1})) {
      regs.rip -= 1;  // back on the breakpoint's instruction
      KW_RETURN_IF_ERROR(proc_.SetRegs(tid, regs));
      stop.reason = "swbreak:";
    } else {
      stop.delivery = true;
    }
  } else {
    stop.delivery = true;  // the target's own signal
  }
  KW_ASSIGN_OR_RETURN(const Resume r, Serve(std::move(stop), /*quiet=*/false));
  (void)r;  // the thread resumes (HandleClaimed); kills and detaches were done in Serve
  return absl::OkStatus();
}

absl::Status GdbServer::ServeStopped(bool interrupted) {
  StopInfo stop;
  stop.tid = ThreadFor(0);
  stop.signal = interrupted ? SIGINT : SIGTRAP;
  KW_ASSIGN_OR_RETURN(const Resume r, Serve(std::move(stop), /*quiet=*/!interrupted));
  (void)r;
  return absl::OkStatus();
}

absl::Status GdbServer::PollConnection() {
  while (state_ == State::kServing && proc_.alive()) {
    absl::StatusOr<std::optional<Frame>> f = conn_.Next(absl::ZeroDuration());
    if (!f.ok()) {
      // gdb went away without detaching: its points go, the target runs on.
      RemoveAllPoints();
      state_ = State::kDetached;
      return absl::OkStatus();
    }
    if (!f->has_value()) {
      return absl::OkStatus();
    }
    if ((*f)->kind == Frame::Kind::kInterrupt) {
      KW_RETURN_IF_ERROR(proc_.StopAll());
      KW_RETURN_IF_ERROR(ServeStopped(/*interrupted=*/true));
      return proc_.ResumeAll();
    }
    if ((*f)->kind == Frame::Kind::kPacket) {
      // All-stop: nothing but 0x03 is expected while the target runs.
      KW_RETURN_IF_ERROR(Reply(kErr));
    }
  }
  return absl::OkStatus();
}

absl::Status GdbServer::ReportExit(const core::ptrace::ExitInfo& info) {
  if (state_ != State::kServing) {
    return absl::OkStatus();
  }
  state_ = State::kDetached;
  StopInfo stop;
  stop.exited = true;
  stop.exit = info;
  const std::string reply = StopReply(stop);
  KW_RETURN_IF_ERROR(Reply(reply));
  // Serve what gdb still asks about the dead process until it goes.
  for (;;) {
    absl::StatusOr<std::optional<Frame>> f = conn_.Next(absl::InfiniteDuration());
    if (!f.ok()) {
      return absl::OkStatus();
    }
    if (!f->has_value() || (*f)->kind != Frame::Kind::kPacket) {
      continue;
    }
    const absl::string_view p = (*f)->payload;
    if (p == "k") {
      return absl::OkStatus();
    }
    if (p == "?") {
      KW_RETURN_IF_ERROR(Reply(reply));
    } else if (absl::StartsWith(p, "vKill") || absl::StartsWith(p, "D")) {
      KW_RETURN_IF_ERROR(Reply("OK"));
      return absl::OkStatus();
    } else if (p == "qfThreadInfo" || p == "qsThreadInfo") {
      KW_RETURN_IF_ERROR(Reply("l"));
    } else if (absl::StartsWith(p, "qSupported")) {
      KW_RETURN_IF_ERROR(Reply("PacketSize=4000"));
    } else {
      KW_RETURN_IF_ERROR(Reply(p.empty() || p[0] == 'q' || p[0] == 'v' ? "" : kErr));
    }
  }
}

absl::StatusOr<GdbServer::Resume> GdbServer::Serve(StopInfo stop, bool quiet) {
  in_serve_ = true;
  proc_.HoldStopped();  // the engine's own stops and resumes must not let the target go
  absl::Cleanup done = [this] {
    proc_.DropHold();
    in_serve_ = false;
  };
  if (!quiet) {
    ++stops_;
    KW_RETURN_IF_ERROR(Reply(StopReply(stop)));
  }
  for (;;) {
    absl::StatusOr<std::optional<Frame>> f = conn_.Next(absl::InfiniteDuration());
    if (!f.ok()) {
      RemoveAllPoints();
      state_ = State::kDetached;
      return Resume::kGone;
    }
    if (!f->has_value() || (*f)->kind != Frame::Kind::kPacket) {
      continue;  // an interrupt while stopped, or a bad packet gdb will send again
    }
    std::optional<Resume> resume;
    KW_RETURN_IF_ERROR(Dispatch((*f)->payload, stop, resume));
    if (resume.has_value()) {
      hw_->Settle();  // registers gdb no longer uses go back to kwatch's watches
      return *resume;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Packets.

absl::Status GdbServer::Dispatch(absl::string_view p, StopInfo& stop,
                                 std::optional<Resume>& resume) {
  if (p.empty()) {
    return Reply("");
  }
  if (absl::StartsWith(p, "qSupported")) {
    return Reply(
        "PacketSize=4000;qXfer:features:read+;qXfer:auxv:read+;qXfer:libraries-svr4:read+;"
        "qXfer:exec-file:read+;QStartNoAckMode+;QPassSignals+;QProgramSignals+;swbreak+;"
        "hwbreak+;vContSupported+");
  }
  if (p == "QStartNoAckMode") {
    KW_RETURN_IF_ERROR(Reply("OK"));
    conn_.set_no_ack();
    return absl::OkStatus();
  }
  if (p == "?") {
    return Reply(StopReply(stop));
  }
  if (absl::StartsWith(p, "qXfer:")) {
    return Reply(Xfer(p));
  }
  if (p == "qfThreadInfo") {
    std::vector<std::string> ids;
    for (const pid_t t : proc_.TracedThreads()) {
      ids.push_back(HexNumber(static_cast<uint64_t>(t)));
    }
    return Reply(absl::StrCat("m", absl::StrJoin(ids, ",")));
  }
  if (p == "qsThreadInfo") {
    return Reply("l");
  }
  if (p == "qC") {
    return Reply(absl::StrCat("QC", HexNumber(static_cast<uint64_t>(stop.tid))));
  }
  if (absl::StartsWith(p, "qAttached")) {
    return Reply(attached_ ? "1" : "0");
  }
  if (absl::StartsWith(p, "qSymbol")) {
    return Reply("OK");
  }
  if (p == "vCont?") {
    return Reply("vCont;c;C;s;S");
  }
  if (absl::StartsWith(p, "QPassSignals:")) {
    std::set<int> pass;
    for (absl::string_view s : absl::StrSplit(p.substr(13), ';', absl::SkipEmpty())) {
      absl::StatusOr<uint64_t> n = ParseHexNumber(s);
      if (!n.ok()) {
        return Reply(kErr);
      }
      if (const int sig = FromGdbSignal(static_cast<int>(*n)); sig != 0) {
        pass.insert(sig);
      }
    }
    pass.erase(SIGTRAP);  // breakpoints and steps are gdb's business
    pass_signals_ = std::move(pass);
    return Reply("OK");
  }
  if (absl::StartsWith(p, "QProgramSignals:")) {
    return Reply("OK");
  }
  if (p == "QNonStop:0") {
    return Reply("OK");
  }
  if (p == "!") {
    return Reply("OK");  // extended-remote: the same server
  }
  if (p[0] == 'H' && p.size() >= 2) {
    pid_t tid = 0;
    if (!ParseThreadId(p.substr(2), tid)) {
      return Reply(kErr);
    }
    (p[1] == 'g' ? g_thread_ : c_thread_) = tid > 0 ? tid : 0;
    return Reply("OK");
  }
  if (p[0] == 'T') {
    pid_t tid = 0;
    const std::vector<pid_t> threads = proc_.TracedThreads();
    const bool alive = ParseThreadId(p.substr(1), tid) &&
                       std::find(threads.begin(), threads.end(), tid) != threads.end();
    return Reply(alive ? "OK" : kErr);
  }
  if (p == "g") {
    absl::StatusOr<ThreadRegisters> r = ThreadRegisters::Read(ThreadFor(g_thread_));
    return Reply(r.ok() ? ToHex(r->All()) : kErr);
  }
  if (p[0] == 'G') {
    const pid_t tid = ThreadFor(g_thread_);
    absl::StatusOr<ThreadRegisters> r = ThreadRegisters::Read(tid);
    absl::StatusOr<std::vector<uint8_t>> bytes = FromHex(p.substr(1));
    if (!r.ok() || !bytes.ok() || !r->SetAll(*bytes).ok() || !r->Write(tid).ok()) {
      return Reply(kErr);
    }
    return Reply("OK");
  }
  if (p[0] == 'p') {
    absl::StatusOr<uint64_t> n = ParseHexNumber(p.substr(1));
    absl::StatusOr<ThreadRegisters> r = ThreadRegisters::Read(ThreadFor(g_thread_));
    if (!n.ok() || !r.ok() || *n >= kNumRegisters) {
      return Reply(kErr);
    }
    absl::StatusOr<std::vector<uint8_t>> b = r->Get(static_cast<int>(*n));
    return Reply(b.ok() ? ToHex(*b) : kErr);
  }
  if (p[0] == 'P') {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(p.substr(1), absl::MaxSplits('=', 1));
    const pid_t tid = ThreadFor(g_thread_);
    absl::StatusOr<uint64_t> n = ParseHexNumber(kv.first);
    absl::StatusOr<std::vector<uint8_t>> bytes = FromHex(kv.second);
    absl::StatusOr<ThreadRegisters> r = ThreadRegisters::Read(tid);
    if (!n.ok() || !bytes.ok() || !r.ok() || *n >= kNumRegisters ||
        !r->Set(static_cast<int>(*n), *bytes).ok() || !r->Write(tid).ok()) {
      return Reply(kErr);
    }
    return Reply("OK");
  }
  if (p[0] == 'm') {
    return Reply(ReadMemoryReply(p.substr(1)));
  }
  if (p[0] == 'M' || p[0] == 'X') {
    const size_t colon = p.find(':');
    uint64_t addr = 0;
    uint64_t len = 0;
    if (colon == absl::string_view::npos || !ParseAddrLen(p.substr(1, colon - 1), addr, len)) {
      return Reply(kErr);
    }
    const absl::string_view data = p.substr(colon + 1);
    std::vector<uint8_t> bytes;
    if (p[0] == 'M') {
      absl::StatusOr<std::vector<uint8_t>> b = FromHex(data);
      if (!b.ok()) {
        return Reply(kErr);
      }
      bytes = *std::move(b);
    } else {
      bytes.assign(data.begin(), data.end());  // unescaped by the decoder
    }
    if (bytes.size() != len) {
      return Reply(kErr);
    }
    if (len == 0) {
      return Reply("OK");
    }
    return Reply(WriteMemory(addr, bytes).ok() ? "OK" : kErr);
  }
  if (p[0] == 'Z' || p[0] == 'z') {
    return Reply(Breakpoint(p, p[0] == 'Z'));
  }
  if (p[0] == 'D') {
    RemoveAllPoints();
    KW_RETURN_IF_ERROR(Reply("OK"));
    state_ = State::kDetached;
    resume = Resume::kDetach;
    return absl::OkStatus();
  }
  if (p == "k" || absl::StartsWith(p, "vKill")) {
    RemoveAllPoints();
    if (::kill(proc_.pid(), SIGKILL) != 0) {
      return Reply(kErr);
    }
    state_ = State::kKilled;
    if (p != "k") {
      KW_RETURN_IF_ERROR(Reply("OK"));
    }
    resume = Resume::kKill;
    return absl::OkStatus();
  }
  if (absl::StartsWith(p, "vCont;") || p[0] == 'c' || p[0] == 'C' || p[0] == 's' || p[0] == 'S') {
    absl::StatusOr<bool> run = DoResume(p, stop);
    if (!run.ok()) {
      return Reply(kErr);
    }
    if (*run) {
      resume = Resume::kContinue;
    } else if (stop.exited) {
      KW_RETURN_IF_ERROR(Reply(StopReply(stop)));
      state_ = State::kDetached;  // the driver sees the exit; nothing more to tell gdb
      resume = Resume::kContinue;
    } else {
      ++stops_;
      KW_RETURN_IF_ERROR(Reply(StopReply(stop)));
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(p, "vRun") || absl::StartsWith(p, "vAttach") || p[0] == 'R') {
    return Reply(kErr);  // one target per kwatch session
  }
  return Reply("");  // not supported: gdb copes
}

absl::StatusOr<bool> GdbServer::DoResume(absl::string_view p, StopInfo& stop) {
  struct Action {
    char op = 'c';
    int gdb_sig = 0;
    pid_t tid = -1;
    std::optional<uint64_t> addr;
  };
  std::vector<Action> actions;
  if (absl::ConsumePrefix(&p, "vCont;")) {
    for (absl::string_view a : absl::StrSplit(p, ';')) {
      Action act;
      const std::pair<absl::string_view, absl::string_view> at =
          absl::StrSplit(a, absl::MaxSplits(':', 1));
      absl::string_view what = at.first;
      if (what.empty()) {
        return absl::InvalidArgumentError("empty vCont action");
      }
      act.op = what[0];
      if (act.op == 'C' || act.op == 'S') {
        absl::StatusOr<uint64_t> sig = ParseHexNumber(what.substr(1));
        if (!sig.ok()) {
          return sig.status();
        }
        act.gdb_sig = static_cast<int>(*sig);
      } else if ((act.op != 'c' && act.op != 's') || what.size() != 1) {
        return absl::InvalidArgumentError("unsupported vCont action");
      }
      if (!at.second.empty() && !ParseThreadId(at.second, act.tid)) {
        return absl::InvalidArgumentError("bad thread id");
      }
      actions.push_back(act);
    }
  } else {
    Action act;
    act.op = p[0];
    absl::string_view rest = p.substr(1);
    if (act.op == 'C' || act.op == 'S') {
      const std::pair<absl::string_view, absl::string_view> sa =
          absl::StrSplit(rest, absl::MaxSplits(';', 1));
      absl::StatusOr<uint64_t> sig = ParseHexNumber(sa.first);
      if (!sig.ok()) {
        return sig.status();
      }
      act.gdb_sig = static_cast<int>(*sig);
      rest = sa.second;
    }
    if (!rest.empty()) {
      absl::StatusOr<uint64_t> addr = ParseHexNumber(rest);
      if (!addr.ok()) {
        return addr.status();
      }
      act.addr = *addr;
    }
    act.tid = c_thread_ > 0 ? c_thread_ : stop.tid;
    actions.push_back(act);
  }
  if (actions.empty()) {
    return absl::InvalidArgumentError("no resume action");
  }
  for (const Action& a : actions) {
    if (a.addr.has_value()) {
      const pid_t tid = ThreadFor(a.tid);
      KW_ASSIGN_OR_RETURN(user_regs_struct regs, proc_.GetRegs(tid));
      regs.rip = *a.addr;
      KW_RETURN_IF_ERROR(proc_.SetRegs(tid, regs));
    }
  }
  // A step: that thread runs one instruction while the others stay stopped (all-stop, as
  // with scheduler-locking on for steps), and gdb hears of the new stop.
  for (const Action& a : actions) {
    if (a.op == 's' || a.op == 'S') {
      const pid_t tid = ThreadFor(a.tid > 0 ? a.tid : stop.tid);
      KW_ASSIGN_OR_RETURN(stop, Step(tid, FromGdbSignal(a.gdb_sig)));
      return false;
    }
  }
  for (const Action& a : actions) {
    const int sig = FromGdbSignal(a.gdb_sig);
    if (a.op != 'C' || sig == 0) {
      continue;
    }
    const pid_t tid = ThreadFor(a.tid > 0 ? a.tid : stop.tid);
    if (tid == stop.tid && stop.delivery) {
      KW_RETURN_IF_ERROR(proc_.SetPendingSignal(tid, sig));  // in place of the one it stopped for
      continue;
    }
    // Stopped for something else: the kernel delivers a signal only from a signal-delivery
    // stop, so it is sent, and let through when it arrives.
    injected_.insert({tid, sig});
    if (::syscall(SYS_tgkill, proc_.pid(), tid, sig) != 0) {
      const int err = errno;
      injected_.erase({tid, sig});
      return core::SyscallError(err, absl::StrCat("tgkill(", proc_.pid(), ", ", tid, ")"));
    }
  }
  return true;
}

absl::StatusOr<GdbServer::StopInfo> GdbServer::Step(pid_t tid, int sig) {
  if (sig != 0) {
    KW_RETURN_IF_ERROR(proc_.SetPendingSignal(tid, sig));
  }
  stepping_ = true;
  step_hit_.reset();
  // A step at an address where kwatch's INT3 engine has a breakpoint (a joined `kwatch probe`'s,
  // or one of gdb's own Z0 at the same place) would run the INT3: the engine takes the hit and
  // runs the instruction instead.
  absl::StatusOr<bool> over = sig == 0 && engine_ != nullptr ? engine_->StepOver(tid) : false;
  absl::StatusOr<int> r = !over.ok() ? absl::StatusOr<int>(over.status())
                          : *over    ? absl::StatusOr<int>(proc_.alive() ? SIGTRAP : 0)
                                     : proc_.SingleStep(tid);
  stepping_ = false;
  KW_RETURN_IF_ERROR(r.status());
  StopInfo stop;
  stop.tid = tid;
  stop.signal = SIGTRAP;
  if (*r == 0 || !proc_.alive()) {
    stop.exited = true;
    if (proc_.exit_info().has_value()) {
      stop.exit = *proc_.exit_info();
    }
    return stop;
  }
  if (step_hit_.has_value()) {
    const std::string a = HexNumber(step_hit_->addr.value);
    switch (step_hit_->kind) {
      case HwKind::kBreak:
        stop.reason = "hwbreak:";
        break;
      case HwKind::kWrite:
        stop.reason = absl::StrCat("watch:", a);
        break;
      case HwKind::kRead:
        stop.reason = absl::StrCat("rwatch:", a);
        break;
      case HwKind::kAccess:
        stop.reason = absl::StrCat("awatch:", a);
        break;
    }
  }
  return stop;
}

// ---------------------------------------------------------------------------------------
// Memory.

std::string GdbServer::ReadMemoryReply(absl::string_view args) const {
  uint64_t addr = 0;
  uint64_t len = 0;
  if (!ParseAddrLen(args, addr, len)) {
    return std::string{kErr};
  }
  len = std::min(len, kMaxMemoryPacket);
  std::vector<uint8_t> buf(len);
  if (!proc_.ReadMemory(core::RemoteAddr{addr}, buf).ok()) {
    // What is readable from the start (the end of a mapping): byte by byte.
    size_t n = 0;
    while (
        n < len &&
        proc_.ReadMemory(core::RemoteAddr{addr + n}, std::span<uint8_t>(buf.data() + n, 1)).ok()) {
      ++n;
    }
    if (n == 0) {
      return std::string{kErr};
    }
    buf.resize(n);
  }
  // gdb sees the original code under kwatch's breakpoints and its own.
  auto overlay = [&](uint64_t at, uint8_t original) {
    if (at >= addr && at < addr + buf.size()) {
      buf[at - addr] = original;
    }
  };
  for (const auto& [a, original] : raw_sw_) {
    overlay(a.value, original);
  }
  if (engine_ != nullptr) {
    for (const core::probe::PatchRecord& r : engine_->Patches()) {
      if (r.kind == core::probe::PatchRecord::Kind::kBreakpoint) {
        for (size_t i = 0; i < r.original.size(); ++i) {
          overlay(r.addr.value + i, r.original[i]);
        }
      }
    }
  }
  return ToHex(buf);
}

absl::Status GdbServer::WriteMemory(uint64_t addr, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes = data;
  // A byte under one of gdb's own INT3s becomes its saved original: the INT3 stays.
  for (auto& [a, original] : raw_sw_) {
    if (a.value >= addr && a.value < addr + bytes.size()) {
      original = bytes[a.value - addr];
      bytes[a.value - addr] = 0xcc;
    }
  }
  return proc_.WriteMemory(core::RemoteAddr{addr}, bytes);
}

// ---------------------------------------------------------------------------------------
// Breakpoints.

absl::Status GdbServer::InsertSoftware(core::RemoteAddr addr) {
  if (sw_.contains(addr) || raw_sw_.contains(addr)) {
    return absl::OkStatus();
  }
  core::probe::ProbeHandlers h;
  h.pre = [this](const core::probe::ProbeContext& ctx) {
    if (state_ != State::kServing) {
      return;
    }
    parked_[ctx.tid] = ctx.addr;
    engine_->ParkCurrentThread();
  };
  absl::StatusOr<core::probe::ProbeId> id = engine_->Register(addr, std::move(h));
  if (id.ok()) {
    sw_[addr] = *id;
    return absl::OkStatus();
  }
  if (id.status().code() != absl::StatusCode::kInvalidArgument) {
    return id.status();
  }
  // An instruction the engine cannot displace (or data gdb chose to trap on): a plain INT3 of
  // gdb's own, which only gdb's stops step over.
  uint8_t original = 0;
  KW_RETURN_IF_ERROR(proc_.ReadMemory(addr, std::span<uint8_t>(&original, 1)));
  const uint8_t int3 = 0xcc;
  KW_RETURN_IF_ERROR(proc_.WriteMemory(addr, std::span<const uint8_t>(&int3, 1)));
  raw_sw_[addr] = original;
  return absl::OkStatus();
}

absl::Status GdbServer::RemoveSoftware(core::RemoteAddr addr) {
  if (auto it = sw_.find(addr); it != sw_.end()) {
    const core::probe::ProbeId id = it->second;
    sw_.erase(it);
    return engine_->Unregister(id);
  }
  if (auto it = raw_sw_.find(addr); it != raw_sw_.end()) {
    const uint8_t original = it->second;
    raw_sw_.erase(it);
    return proc_.WriteMemory(addr, std::span<const uint8_t>(&original, 1));
  }
  return absl::OkStatus();  // removing what is not there is not an error for gdb
}

std::string GdbServer::Breakpoint(absl::string_view p, bool insert) {
  // Ztype,addr,kind[;cond...]
  if (p.size() < 4 || p[2] != ',') {
    return std::string{kErr};
  }
  const char type = p[1];
  absl::string_view rest = p.substr(3);
  rest = rest.substr(0, rest.find(';'));
  uint64_t addr = 0;
  uint64_t len = 0;
  if (!ParseAddrLen(rest, addr, len)) {
    return std::string{kErr};
  }
  absl::Status s;
  switch (type) {
    case '0':
      s = insert ? InsertSoftware(core::RemoteAddr{addr}) : RemoveSoftware(core::RemoteAddr{addr});
      break;
    case '1':
    case '2':
    case '3':
    case '4': {
      const auto kind = static_cast<HwKind>(type - '0');
      if (len == 0 && kind != HwKind::kBreak) {
        return std::string{kErr};
      }
      s = insert ? hw_->Insert(kind, core::RemoteAddr{addr}, len)
                 : hw_->Remove(kind, core::RemoteAddr{addr}, len);
      if (!insert && s.code() == absl::StatusCode::kNotFound) {
        s = absl::OkStatus();
      }
      break;
    }
    default:
      return "";  // not supported
  }
  return std::string{s.ok() ? "OK" : kErr};
}

void GdbServer::RemoveAllPoints() {
  while (!sw_.empty()) {
    (void)RemoveSoftware(sw_.begin()->first);
  }
  while (!raw_sw_.empty()) {
    (void)RemoveSoftware(raw_sw_.begin()->first);
  }
  if (hw_ != nullptr) {
    hw_->RemoveAll();
  }
  // parked_ stays: the SIGSTOPs of hits already taken still arrive, and are dropped.
}

// ---------------------------------------------------------------------------------------
// qXfer.

std::string GdbServer::Xfer(absl::string_view p) {
  // qXfer:OBJECT:read:ANNEX:OFFSET,LENGTH
  std::vector<absl::string_view> parts = absl::StrSplit(p, absl::MaxSplits(':', 4));
  if (parts.size() != 5 || parts[2] != "read") {
    return "";
  }
  uint64_t off = 0;
  uint64_t len = 0;
  if (!ParseAddrLen(parts[4], off, len)) {
    return std::string{kErr};
  }
  const absl::string_view object = parts[1];
  const absl::string_view annex = parts[3];
  absl::StatusOr<std::string> doc;
  if (object == "features") {
    if (annex != "target.xml") {
      return "E00";
    }
    doc = Amd64TargetXml();
  } else if (object == "auxv") {
    doc = ReadAuxv(proc_.pid());
  } else if (object == "exec-file") {
    doc = ExecutablePath(proc_.pid());
  } else if (object == "libraries-svr4") {
    doc = LibraryListSvr4(proc_);
  } else {
    return "";
  }
  if (!doc.ok()) {
    return std::string{kErr};
  }
  if (off >= doc->size()) {
    return "l";
  }
  const std::string chunk = doc->substr(off, len);
  return absl::StrCat(off + chunk.size() >= doc->size() ? "l" : "m", chunk);
}

}  // namespace kwatch::watch::gdb
