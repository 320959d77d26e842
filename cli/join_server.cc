#include "cli/join_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/join_socket.h"
#include "cli/output.h"
#include "cli/probe_join_wire.h"
#include "cli/watch_recording.h"
#include "core/base/clock.h"
#include "core/base/syscall_status.h"
#include "core/store/trace_writer.h"
#include "version/version.h"
#include "watch/condition.h"
#include "watch/probe/engine_probes.h"
#include "watch/probe/hit_stacks.h"
#include "watch/process_setup.h"
#include "watch/profile/storage_profile.h"
#include "watch/recording.h"
#include "watch/recording_sink.h"
#include "watch/summary.h"

namespace kwatch::cli {

namespace {
constexpr size_t kMaxRequestBytes = size_t{64} * 1024;  // a joiner's request lines, before "go"
constexpr size_t kHitBatchBytes = size_t{64} * 1024;    // hits sent at once, at most
constexpr uint64_t kHitBatchNs = 50'000'000;            // hits wait this long at most
}  // namespace

// One kwatch that joined: its connection, what it asked, its output and its counts.
struct JoinServer::Guest {
  core::UniqueFd fd;
  std::string in;  // bytes received, not yet a whole line
  pid_t pid = 0;   // the joiner's (SO_PEERCRED)
  bool armed = false;
  bool gone = false;    // finished: to be dropped
  bool probes = false;  // a `kwatch probe` (request "probe-file"): its probes in the engine
  std::vector<watch::WatchRequest> requests;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  bool reads_only = false;
  bool json = false;
  bool quiet = false;
  std::optional<uint64_t> len;
  uint64_t count = 0;     // -c: its watches end after this many of its events
  std::string condition;  // --if, "" when none
  std::map<uint32_t, watch::Condition> conditions;  // --if, per watch of its own (typed by it)
  std::vector<uint32_t> ids;
  std::vector<watch::Watch> all;  // the session's watches when it joined (Summary indexes by id)
  std::optional<watch::Summary> summary;
  std::optional<watch::profile::StorageProfile> profile;
  char* text = nullptr;  // open_memstream: what its printer writes
  size_t text_len = 0;
  FILE* out = nullptr;
  std::unique_ptr<AccessPrinter> printer;
  // -o: its recording, written by this session (the joiner's uid, SO_PEERCRED), events in front
  // of its printer.
  std::string output;        // absolute path, "" without -o
  std::string command_line;  // the joiner's, for the recording's session row
  std::unique_ptr<core::store::TraceWriter> writer;
  std::unique_ptr<watch::AccessRecordingSink> recorder;
  std::string recording_end;  // what its kwatch says of the recording at the end
  bool recording_failed = false;
  uint64_t start_ns = 0;
  uint64_t delivered = 0;
  std::string stop_reason;  // set when it should end at the next Serve
  // A `kwatch probe`'s probes in the session's INT3 engine.
  std::string probe_file;
  std::vector<std::string> specs;
  std::vector<watch::probe::FetchFor> fetch;
  uint32_t maxactive = 0;
  uint32_t stack_frames = 0;
  std::unique_ptr<watch::probe::ProbeSet> set;  // the same as the joiner's (ids, addresses)
  uint64_t bias = 0;
  std::map<uint32_t, core::probe::ProbeId> probe_ids;  // ProbeDef::id -> engine id, while placed
  std::unique_ptr<watch::probe::HitStacks> stacks;     // --stack
  std::string hits;                                    // encoded, not sent yet
  uint64_t hits_sent_ns = 0;

  Guest() = default;
  Guest(const Guest&) = delete;
  Guest& operator=(const Guest&) = delete;
  Guest(Guest&&) = delete;
  Guest& operator=(Guest&&) = delete;
  // Where its events, drains and summary go: the recorder (then the printer) with -o.
  watch::AccessSink& sink() const {
    return recorder != nullptr ? static_cast<watch::AccessSink&>(*recorder)
                               : static_cast<watch::AccessSink&>(*printer);
  }

  ~Guest() {
    recorder.reset();
    writer.reset();  // a joiner gone before its end leaves its recording cut short
    printer.reset();
    if (out != nullptr) {
      (void)std::fclose(out);
    }
    std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  }
};

JoinServer::JoinServer(core::UniqueFd fd, std::string path, pid_t target)
    : fd_(std::move(fd)), path_(std::move(path)), target_(target) {}

JoinServer::~JoinServer() {
  guests_.clear();
  (void)::unlink(path_.c_str());
}

absl::StatusOr<std::unique_ptr<JoinServer>> JoinServer::Listen(pid_t target) {
  std::string path;
  absl::StatusOr<core::UniqueFd> fd = ListenJoinSocket(target, &path);
  if (!fd.ok()) {
    return fd.status();
  }
  return std::unique_ptr<JoinServer>(new JoinServer(*std::move(fd), std::move(path), target));
}

void JoinServer::Refuse(Guest& g, const std::string& message) {
  (void)SendFrame(g.fd.get(), 'E', absl::StrCat("kwatch: error: ", message, "\n"));
  (void)SendFrame(g.fd.get(), 'X', "1");
  g.gone = true;
}

bool JoinServer::Read(Guest& g) {
  std::array<char, 4096> buf{};
  while (true) {
    const ssize_t n = ::recv(g.fd.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) {
      g.in.append(buf.data(), static_cast<size_t>(n));
      if (!g.armed && g.in.size() > kMaxRequestBytes) {
        return false;
      }
      continue;
    }
    if (n == 0) {
      return false;
    }
    const int err = errno;
    if (err == EINTR) {
      continue;
    }
    return err == EAGAIN || err == EWOULDBLOCK;
  }
}

void JoinServer::Handle(watch::WatchSession& session, Guest& g, std::vector<std::string>& notes) {
  size_t nl = 0;
  while (!g.gone && (nl = g.in.find('\n')) != std::string::npos) {
    const std::string line = g.in.substr(0, nl);
    g.in.erase(0, nl + 1);
    const std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    uint64_t number = 0;
    if (g.armed) {
      if (key == "end") {
        g.stop_reason = value.empty() ? "ended" : value;
      }
      continue;  // nothing else is asked once armed
    }
    if (key == "kwatch-join") {
      if (value != "1") {
        Refuse(g, absl::StrCat("this kwatch session speaks join protocol 1, not '", value,
                               "': use the same kwatch for both"));
      }
    } else if (key == "kind") {
      g.reads_only = value == "read";
      g.kind = value == "write" ? drmgr::DrKind::kWrite : drmgr::DrKind::kReadWrite;
      if (value != "write" && value != "rw" && value != "read") {
        Refuse(g, absl::StrCat("unknown watch kind '", value, "'"));
      }
    } else if (key == "len" && absl::SimpleAtoi(value, &number)) {
      g.len = number;
    } else if (key == "json") {
      g.json = value == "1";
    } else if (key == "quiet") {
      g.quiet = value == "1";
    } else if (key == "count" && absl::SimpleAtoi(value, &number)) {
      g.count = number;
    } else if (key == "if" && !value.empty()) {
      g.condition = value;
    } else if (key == "output" && absl::StartsWith(value, "/")) {
      g.output = value;
    } else if (key == "command") {
      g.command_line = value;
    } else if (key == "probe-file" && absl::StartsWith(value, "/")) {
      g.probes = true;
      g.probe_file = value;
    } else if (key == "spec" && !value.empty()) {
      g.specs.push_back(value);
    } else if (key == "fetch") {
      const std::pair<std::string, std::string> ev =
          absl::StrSplit(value, absl::MaxSplits('\t', 1));
      g.fetch.push_back(watch::probe::FetchFor{ev.first, ev.second});
    } else if (key == "maxactive" && absl::SimpleAtoi(value, &number)) {
      g.maxactive = static_cast<uint32_t>(number);
    } else if (key == "stack" && absl::SimpleAtoi(value, &number)) {
      g.stack_frames = static_cast<uint32_t>(number);
    } else if (key == "go" && g.probes) {
      ArmProbes(session, g, notes);
    } else if (key == "expr" && !value.empty()) {
      watch::WatchRequest r;
      r.expr = value;
      g.requests.push_back(std::move(r));
    } else if (key == "go") {
      Arm(session, g, notes);
    } else {
      Refuse(g, absl::StrCat("malformed join request line '", line, "'"));
    }
  }
}

void JoinServer::Arm(watch::WatchSession& session, Guest& g, std::vector<std::string>& notes) {
  if (!g.condition.empty()) {
    // Its errors, and whether the session gives what it reads, before anything is armed.
    absl::StatusOr<watch::Condition> c = watch::Condition::Parse(g.condition);
    if (!c.ok()) {
      Refuse(g, std::string{c.status().message()});
      return;
    }
    if ((c->uses_new() || c->uses_old()) && session.backend() == watch::BackendKind::kPerf) {
      Refuse(g, absl::StrCat("--if on new or old values needs the accessing thread stopped at the "
                             "access, and the session joined (kwatch pid ",
                             ::getpid(),
                             ") runs in perf stream mode, which reads values later: --if on tid, "
                             "pid, cpu, len or addr joins it; or end that session and start one "
                             "with --stop or --backend page"));
      return;
    }
  }
  for (watch::WatchRequest& r : g.requests) {
    r.kind = g.kind;
    r.reads_only = g.reads_only;
    r.length = g.len;
  }
  absl::StatusOr<std::vector<uint32_t>> ids =
      session.AddWatches(g.requests, absl::StrCat("joined kwatch pid ", g.pid));
  if (!ids.ok()) {
    Refuse(g, std::string{ids.status().message()});
    return;
  }
  g.armed = true;
  g.ids = *ids;
  g.all = session.watches();
  if (!g.condition.empty()) {
    for (const uint32_t id : g.ids) {
      absl::StatusOr<watch::Condition> c =
          watch::Condition::Parse(g.condition, watch::WatchConditionOptions(g.all[id]));
      if (!c.ok()) {
        (void)session.RemoveWatches(g.ids);
        Refuse(g, std::string{c.status().message()});
        return;
      }
      g.conditions.emplace(id, *std::move(c));
    }
  }
  g.summary.emplace(g.all);
  std::vector<watch::profile::WatchedObject> objects;
  for (const uint32_t id : g.ids) {
    owner_of_[id] = &g;
    objects.push_back(watch::profile::ObjectForWatch(g.all[id]));
  }
  g.start_ns = core::MonotonicNs();
  watch::profile::ProfileOptions popts;
  popts.start_ns = g.start_ns;
  g.profile.emplace(std::move(objects), popts);
  g.out = ::open_memstream(&g.text, &g.text_len);
  if (g.out == nullptr) {
    const int err = errno;
    Refuse(g, absl::StrCat("open_memstream: ", core::ErrnoText(err)));
    return;
  }
  if (g.json) {
    g.printer = std::make_unique<AccessJsonPrinter>(g.out, g.quiet);
  } else {
    g.printer = std::make_unique<AccessTextPrinter>(g.out, g.quiet);
  }
  g.printer->ShowOnly(g.ids);
  if (!g.output.empty()) {
    absl::StatusOr<std::unique_ptr<core::store::TraceWriter>> w = watch::CreateWatchRecording(
        watch::RecordingSpec{g.output, g.command_line, version::Full()}, session, target_, g.ids);
    if (!w.ok()) {
      for (const uint32_t id : g.ids) {
        owner_of_.erase(id);
      }
      (void)session.RemoveWatches(g.ids);
      Refuse(g, std::string{w.status().message()});
      return;
    }
    g.writer = *std::move(w);
    Guest* guest = &g;
    g.recorder = std::make_unique<watch::AccessRecordingSink>(
        *g.writer, *g.printer, [guest](const watch::RecordingOutcome& o) {
          guest->recording_end = RecordingEndText(o);
          guest->recording_failed = !o.complete;
        });
  }
  g.printer->Start(session, g.start_ns, session.process().pid());
  std::string err =
      absl::StrCat("kwatch: joined the session of kwatch pid ", ::getpid(), " on pid ", target_,
                   ": armed ", g.ids.size(), " watch", g.ids.size() == 1 ? "" : "es", "\n");
  std::vector<std::string> names;
  for (const uint32_t id : g.ids) {
    const watch::Watch& w = g.all[id];
    absl::StrAppend(&err, "kwatch:   watch #", id + 1, " ", w.target.display, ": ",
                    session.placement(id).detail, "\n");
    names.push_back(absl::StrCat("#", id + 1, " ", w.target.display));
  }
  (void)SendFrame(g.fd.get(), 'E', err);
  notes.push_back(absl::StrCat("kwatch pid ", g.pid, " joined this session with watch",
                               g.ids.size() == 1 ? " " : "es ", absl::StrJoin(names, ", ")));
  Flush(g);
}

void JoinServer::Flush(Guest& g) {
  if (g.out == nullptr) {
    return;
  }
  std::fflush(g.out);
  if (g.text_len > 0) {
    if (!SendFrame(g.fd.get(), 'O', absl::string_view(g.text, g.text_len)).ok()) {
      g.stop_reason = "its kwatch went away";
    }
    std::rewind(g.out);  // the next writes start over at the beginning of the buffer
    std::fflush(g.out);
  }
}

void JoinServer::OnGuestEvent(watch::WatchSession& session, const core::AccessEvent& ev) {
  auto it = owner_of_.find(ev.watch_id);
  if (it == owner_of_.end()) {
    return;  // its joiner left
  }
  Guest& g = *it->second;
  if (g.count > 0 && g.delivered >= g.count) {
    return;
  }
  if (!g.conditions.empty() && !g.conditions.at(ev.watch_id).Matches(ev)) {
    return;
  }
  ++g.delivered;
  g.summary->Add(ev);
  g.profile->Add(ev);
  if (absl::Status s = g.sink().OnEvent(session, *g.summary, ev, ev); !s.ok()) {
    g.stop_reason = std::string{s.message()};
  }
  if (g.count > 0 && g.delivered >= g.count && g.stop_reason.empty()) {
    g.stop_reason = absl::StrCat("--count ", g.count, " reached");
  }
}

void JoinServer::Finish(watch::WatchSession& session, Guest& g, const std::string& reason,
                        const watch::RunInfo* owner_info, std::vector<std::string>& notes) {
  watch::RunInfo info;
  info.stop_reason = reason;
  info.pid = target_;
  info.seconds = static_cast<double>(core::MonotonicNs() - g.start_ns) / 1e9;
  if (owner_info != nullptr) {
    info.exit = owner_info->exit;
  }
  if (!g.conditions.empty()) {
    info.condition = g.condition;
    for (const auto& [id, c] : g.conditions) {
      info.condition_evaluated += c.stats().evaluated;
      info.condition_matched += c.stats().matched;
      info.condition_undefined +=
          c.stats().missing_new + c.stats().missing_old + c.stats().division_by_zero;
    }
  }
  g.sink().OnSummary(watch::AccessSummary{session, *g.summary, *g.profile, info});
  Flush(g);
  if (!g.recording_end.empty()) {
    (void)SendFrame(g.fd.get(), 'E', g.recording_end);
  }
  if (absl::Status s = session.RemoveWatches(g.ids); !s.ok()) {
    notes.push_back(absl::StrCat("removing the watches of kwatch pid ", g.pid, ": ", s.message()));
  }
  for (const uint32_t id : g.ids) {
    owner_of_.erase(id);
  }
  if (owner_info != nullptr) {
    (void)SendFrame(g.fd.get(), 'E',
                    absl::StrCat("kwatch: the session this kwatch joined (kwatch pid ", ::getpid(),
                                 ") ended: ", owner_info->stop_reason, "\n"));
  }
  (void)SendFrame(g.fd.get(), 'X', g.recording_failed ? "1" : "0");  // -o not honoured: 1
  g.gone = true;
}

std::vector<std::string> JoinServer::Serve(watch::WatchSession& session) {
  std::vector<std::string> notes;
  while (true) {
    core::UniqueFd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) {
      break;  // EAGAIN: nobody else waits (other errors: try again at the next Serve)
    }
    auto g = std::make_unique<Guest>();
    g->fd = std::move(c);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(g->fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      continue;
    }
    g->pid = cred.pid;
    timeval tv{2, 0};  // a joiner that stops reading does not stall this session for long
    (void)::setsockopt(g->fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (cred.uid != ::geteuid()) {
      Refuse(*g, absl::StrCat("the kwatch session of pid ", target_, " (kwatch pid ", ::getpid(),
                              ") belongs to uid ", ::geteuid(), "; uid ", cred.uid,
                              " may not join it"));
      notes.push_back(absl::StrCat("refused pid ", cred.pid, " of uid ", cred.uid,
                                   " that tried to join this session (only uid ", ::geteuid(),
                                   " may)"));
      continue;
    }
    guests_.push_back(std::move(g));
  }
  for (const std::unique_ptr<Guest>& g : guests_) {
    if (g->gone) {
      continue;
    }
    const bool here = Read(*g);
    Handle(session, *g, notes);
    if (!here && !g->gone && g->probes) {
      if (g->armed) {
        // Killed, or went away without asking: its probes come out, the code as it was.
        const size_t n = g->set != nullptr ? watch::probe::UserProbes(*g->set) : 0;
        RemoveProbes(*g, nullptr);
        notes.push_back(absl::StrCat("kwatch pid ", g->pid,
                                     " that joined this session went away: its ", n, " probe",
                                     n == 1 ? "" : "s", " removed (the original code back)"));
      }
      g->gone = true;
      continue;
    }
    if (!here && !g->gone) {
      if (g->armed) {
        // Killed, or went away without asking: its watches go, their registers back to drmgr.
        std::vector<std::string> names;
        for (const uint32_t id : g->ids) {
          names.push_back(absl::StrCat("#", id + 1, " ", g->all[id].target.display));
        }
        if (absl::Status s = session.RemoveWatches(g->ids); !s.ok()) {
          notes.push_back(
              absl::StrCat("removing the watches of kwatch pid ", g->pid, ": ", s.message()));
        }
        for (const uint32_t id : g->ids) {
          owner_of_.erase(id);
        }
        notes.push_back(absl::StrCat("kwatch pid ", g->pid,
                                     " that joined this session went away: its watch",
                                     g->ids.size() == 1 ? " " : "es ", absl::StrJoin(names, ", "),
                                     " removed, their debug registers returned"));
      }
      g->gone = true;
      continue;
    }
    if (g->armed && g->probes) {
      if (!g->stop_reason.empty()) {
        const size_t n = watch::probe::UserProbes(*g->set);
        FinishProbes(*g, nullptr);
        notes.push_back(absl::StrCat("kwatch pid ", g->pid, " that joined this session ended (",
                                     g->stop_reason, "): its ", n, " probe", n == 1 ? "" : "s",
                                     " removed (the original code back)"));
      } else {
        FlushHits(*g);
      }
      continue;
    }
    if (g->armed && !g->stop_reason.empty()) {
      const std::vector<uint32_t> ids = g->ids;
      Finish(session, *g, g->stop_reason, nullptr, notes);
      notes.push_back(absl::StrCat("kwatch pid ", g->pid, " that joined this session ended (",
                                   g->stop_reason, "): its watch", ids.size() == 1 ? "" : "es",
                                   " removed, their debug registers returned"));
    } else if (g->armed) {
      // One round of its recording per Step of the session (core/store/round_order.h).
      if (absl::Status s = g->sink().OnDrained(); !s.ok()) {
        g->stop_reason = std::string{s.message()};
      }
      Flush(*g);
    }
  }
  std::erase_if(guests_, [](const std::unique_ptr<Guest>& g) { return g->gone; });
  DropEngineIfUnused();
  return notes;
}

void JoinServer::EndAll(watch::WatchSession& session, const watch::RunInfo& info) {
  std::vector<std::string> notes;
  for (const std::unique_ptr<Guest>& g : guests_) {
    if (g->gone) {
      continue;
    }
    if (!g->armed) {
      Refuse(*g, absl::StrCat("the session of pid ", target_,
                              " ended before this kwatch joined it (", info.stop_reason, ")"));
      continue;
    }
    if (g->probes) {
      FinishProbes(*g, &info);
      continue;
    }
    Finish(session, *g, absl::StrCat("the session it joined ended: ", info.stop_reason), &info,
           notes);
  }
  guests_.clear();
  DropEngineIfUnused();
}

void JoinServer::Abandon() {
  for (const std::unique_ptr<Guest>& g : guests_) {
    RemoveProbes(*g, nullptr);
  }
  DropEngineIfUnused();
}

void JoinServer::OnTargetEvent(const core::ptrace::ProcessEvent& event) {
  if (event.kind == core::ptrace::ProcessEvent::Kind::kThreadExited && own_engine_ != nullptr) {
    own_engine_->OnThreadExit(event.tid);
    return;
  }
  if (event.kind != core::ptrace::ProcessEvent::Kind::kExec || engine_ == nullptr) {
    return;
  }
  // The new image has none of the probes: they end here, as a `kwatch probe` without -f ends.
  if (own_engine_ != nullptr) {
    own_engine_->OnExec();
  }
  watch::RunInfo info;
  info.stop_reason = "the target called exec: the probes ended there";
  for (const std::unique_ptr<Guest>& g : guests_) {
    if (g->probes && g->armed && !g->gone) {
      g->probe_ids.clear();  // gone with the old image
      FinishProbes(*g, &info);
    }
  }
}

void JoinServer::ShareEngine(core::probe::Int3Engine* engine) {
  if (engine == nullptr && own_engine_ == nullptr) {
    for (const std::unique_ptr<Guest>& g : guests_) {
      g->probe_ids.clear();  // gone with the engine
    }
  }
  engine_ = engine;
}

absl::StatusOr<core::probe::Int3Engine*> JoinServer::Engine(watch::WatchSession& session) {
  process_ = &session.process();
  if (engine_ != nullptr) {
    return engine_;
  }
  // A guardian puts the code back if this kwatch dies with probes in place (as `kwatch probe
  // --backend ptrace` has one).
  absl::StatusOr<std::unique_ptr<core::ptrace::Guardian>> g =
      core::ptrace::Guardian::Start(process_->pid());
  if (!g.ok()) {
    return g.status();
  }
  guardian_ = *std::move(g);
  own_engine_ = std::make_unique<core::probe::Int3Engine>(*process_);
  own_engine_->SetGuardian(guardian_.get());
  engine_ = own_engine_.get();
  return engine_;
}

void JoinServer::DropEngineIfUnused() {
  if (own_engine_ == nullptr ||
      std::any_of(guests_.begin(), guests_.end(),
                  [](const std::unique_ptr<Guest>& g) { return !g->probe_ids.empty(); })) {
    return;
  }
  const bool alive = process_ != nullptr && process_->alive();
  if (alive) {
    (void)own_engine_->RestoreAll();  // return probes' replaced return addresses too
  }
  own_engine_.reset();
  engine_ = nullptr;
  if (guardian_ != nullptr) {
    if (!alive) {
      guardian_->ForgetAll();
    }
    (void)guardian_->Dismiss();
    guardian_.reset();
  }
}

void JoinServer::ArmProbes(watch::WatchSession& session, Guest& g,
                           std::vector<std::string>& notes) {
  if (g.specs.empty()) {
    Refuse(g, "a joining `kwatch probe` gave no probe spec");
    return;
  }
  absl::StatusOr<watch::probe::ProbeSet> set =
      watch::probe::ResolveProbes(g.probe_file, g.specs, g.fetch);
  if (!set.ok()) {
    Refuse(g, std::string{set.status().message()});
    return;
  }
  g.set = std::make_unique<watch::probe::ProbeSet>(*std::move(set));
  core::ptrace::Process& proc = session.process();
  absl::StatusOr<std::vector<core::ptrace::MapEntry>> maps = proc.Maps();
  absl::StatusOr<uint64_t> bias =
      maps.ok() ? g.set->target->LoadBias(*maps) : absl::StatusOr<uint64_t>(maps.status());
  if (!bias.ok()) {
    Refuse(g, absl::StrCat(g.probe_file, " is not mapped in process ", proc.pid(), ": ",
                           bias.status().message()));
    return;
  }
  g.bias = *bias;
  absl::StatusOr<core::probe::Int3Engine*> engine = Engine(session);
  if (!engine.ok()) {
    Refuse(g, absl::StrCat("the session joined (kwatch pid ", ::getpid(),
                           ") cannot place probes: ", engine.status().message()));
    return;
  }
  if (g.stack_frames > 0) {
    const core::ptrace::Process* p = &proc;
    absl::StatusOr<std::unique_ptr<watch::probe::HitStacks>> stacks =
        watch::probe::HitStacks::ForProcess(
            proc.pid(),
            [p](core::RemoteAddr a, std::span<uint8_t> out) { return p->ReadMemory(a, out); });
    if (!stacks.ok()) {
      Refuse(g, absl::StrCat("--stack: ", stacks.status().message()));
      DropEngineIfUnused();
      return;
    }
    g.stacks = *std::move(stacks);
  }
  Guest* guest = &g;
  absl::StatusOr<std::map<uint32_t, core::probe::ProbeId>> ids;
  absl::Status stopped = (*engine)->StopWorld();
  if (stopped.ok()) {
    // Together, with the world stopped: every probe sees the same calls.
    ids = watch::probe::RegisterProbes(
        **engine, *g.set, g.bias, g.maxactive,
        [guest](const watch::probe::ProbeDef& def, const core::probe::ProbeContext& ctx) {
          OnProbeHit(*guest, def, ctx);
        });
    stopped = (*engine)->ResumeWorld();
  }
  if (!stopped.ok() || !ids.ok()) {
    if (ids.ok()) {
      g.probe_ids = *ids;
      RemoveProbes(g, nullptr);
    }
    Refuse(g, std::string{(!ids.ok() ? ids.status() : stopped).message()});
    DropEngineIfUnused();
    return;
  }
  g.probe_ids = *std::move(ids);
  g.armed = true;
  g.start_ns = core::MonotonicNs();
  g.hits_sent_ns = g.start_ns;
  (void)SendFrame(g.fd.get(), 'A', ArmedOf(*g.set, g.bias).text());
  const size_t n = watch::probe::UserProbes(*g.set);
  notes.push_back(absl::StrCat("kwatch pid ", g.pid, " joined this session with ", n, " probe",
                               n == 1 ? "" : "s", " (", absl::StrJoin(g.specs, "; "),
                               "), placed by this session's INT3 engine"));
}

void JoinServer::OnProbeHit(Guest& g, const watch::probe::ProbeDef& def,
                            const core::probe::ProbeContext& ctx) {
  if (g.gone) {
    return;
  }
  watch::probe::ProbeHit hit = watch::probe::EngineHit(def, ctx, g.bias);
  if (g.stacks != nullptr) {
    hit.stack = g.stacks->Unwind(ctx.tid, ctx.regs, g.stack_frames);
  }
  EncodeHit(hit, g.hits);
  // While the target hits probes back to back the session's loop waits: hits leave by size
  // or age from here.
  if (g.hits.size() >= kHitBatchBytes || ctx.time_ns >= g.hits_sent_ns + kHitBatchNs) {
    FlushHits(g);
  }
}

void JoinServer::FlushHits(Guest& g) {
  g.hits_sent_ns = core::MonotonicNs();
  if (g.hits.empty()) {
    return;
  }
  if (!SendFrame(g.fd.get(), 'H', g.hits).ok() && g.stop_reason.empty()) {
    g.stop_reason = "its kwatch went away";
  }
  g.hits.clear();
}

void JoinServer::RemoveProbes(Guest& g, std::map<uint32_t, watch::probe::ProbeEndStats>* stats) {
  if (engine_ == nullptr || g.probe_ids.empty()) {
    return;
  }
  if (stats != nullptr) {
    watch::probe::AddEngineStats(*engine_, g.probe_ids, *stats);
  }
  if (process_ != nullptr && process_->alive()) {
    // One stop of the world for all of them.
    const bool stopped = engine_->StopWorld().ok();
    for (const auto& [def_id, id] : g.probe_ids) {
      (void)engine_->Unregister(id);
    }
    if (stopped) {
      (void)engine_->ResumeWorld();
    }
  }
  g.probe_ids.clear();
}

void JoinServer::FinishProbes(Guest& g, const watch::RunInfo* owner_info) {
  ProbeJoinEnd end;
  RemoveProbes(g, &end.stats);
  FlushHits(g);
  if (owner_info != nullptr) {
    end.stop_reason = owner_info->stop_reason;
    end.exit = owner_info->exit;
  }
  (void)SendFrame(g.fd.get(), 'S', end.text());
  (void)SendFrame(g.fd.get(), 'X', "0");
  g.gone = true;
}

}  // namespace kwatch::cli
