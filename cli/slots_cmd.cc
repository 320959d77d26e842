#include "cli/slots_cmd.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/slot_probe.h"
#include "core/base/status_macros.h"
#include "core/base/syscall_status.h"
#include "core/base/unique_fd.h"
#include "drmgr/allocator_types.h"
#include "drmgr/slot_registry.h"

namespace kwatch::cli {

namespace {

using json = nlohmann::json;

struct SlotRow {
  int dr = 0;
  drmgr::SlotState state = drmgr::SlotState::kFree;
  pid_t kwatch_pid = 0;
  std::vector<drmgr::RequestId> requests;
  std::vector<std::string> labels;
  std::vector<std::string> waiting;  // labels of displaced requests (preempted slots)
  drmgr::Chunk chunk;
  drmgr::DrKind kind = drmgr::DrKind::kWrite;
  double coverage = 1.0;
};

struct ThreadTable {
  pid_t tid = 0;
  std::string comm;
  int free = 0;
  int kwatch = 0;
  int external = 0;
  std::vector<SlotRow> rows;
};

struct WaitingRequest {
  pid_t kwatch_pid = 0;
  drmgr::RequestView view;
};

struct ProcessTable {
  pid_t pid = 0;
  std::string comm;
  std::vector<drmgr::PublishedSlots> sessions;
  std::vector<ThreadTable> threads;
  std::vector<WaitingRequest> not_in_hardware;
};

// An owned copy without a functional cast (Debian's absl::string_view is a class).
std::string Own(absl::string_view v) {
  return {v.data(), v.size()};
}

absl::string_view KindShort(drmgr::DrKind kind) {
  switch (kind) {
    case drmgr::DrKind::kExec:
      return "exec";
    case drmgr::DrKind::kWrite:
      return "write";
    case drmgr::DrKind::kReadWrite:
      return "rw";
  }
  return "?";
}

std::string ReadLine(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return {};
  }
  std::array<char, 256> buf{};
  const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
  if (n <= 0) {
    return {};
  }
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(buf.data(), static_cast<size_t>(n))));
}

// The process's threads, ascending; NotFound naming the pid when it does not exist, and an
// error when `pid` is a thread of another process.
absl::StatusOr<std::vector<pid_t>> ListTasks(pid_t pid) {
  core::UniqueFd status(
      ::open(absl::StrCat("/proc/", pid, "/status").c_str(), O_RDONLY | O_CLOEXEC));
  if (!status.valid()) {
    const int err = errno;
    if (err == ENOENT || err == ESRCH) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " does not exist (or has exited)"));
    }
    return core::SyscallError(err, absl::StrCat("open(/proc/", pid, "/status)"));
  }
  std::string text(4096, '\0');
  const ssize_t n = ::read(status.get(), text.data(), text.size());
  if (n > 0) {
    text.resize(static_cast<size_t>(n));
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      pid_t tgid = 0;
      if (absl::ConsumePrefix(&line, "Tgid:") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &tgid) && tgid != pid) {
        return absl::InvalidArgumentError(
            absl::StrCat(pid, " is a thread of process ", tgid, ": give -p ", tgid));
      }
    }
  }
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
    }
    return core::SyscallError(err, absl::StrCat("opendir(", dir, ")"));
  }
  absl::Cleanup close_dir = [d] { ::closedir(d); };
  std::vector<pid_t> tids;
  while (const dirent* e = ::readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR*
    pid_t tid = 0;
    if (absl::SimpleAtoi(e->d_name, &tid) && tid > 0) {
      tids.push_back(tid);
    }
  }
  std::sort(tids.begin(), tids.end());
  if (tids.empty()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  return tids;
}

std::string Label(const drmgr::AllocatorSnapshot& snap, drmgr::RequestId id) {
  for (const drmgr::RequestView& r : snap.requests) {
    if (r.id == id && !r.request.label.empty()) {
      return r.request.label;
    }
  }
  return absl::StrCat("request ", id.value);
}

// Whether slots of `scope` sit in the debug registers of thread `tid` of `pid`.
bool OnThread(const drmgr::Scope& scope, pid_t pid, pid_t tid) {
  return (scope.kind == drmgr::Scope::Kind::kProcess && scope.pid == pid) ||
         (scope.kind == drmgr::Scope::Kind::kThread && scope.pid == pid && scope.tid == tid);
}

// Rows of thread `tid`: kwatch's slots at the index their allocator gave them when free on
// this thread (process-wide slots first), then the slots held outside kwatch from DR3 down,
// the rest free. `free` comes from the kernel.
ThreadTable BuildThread(pid_t pid, pid_t tid, int free,
                        const std::vector<drmgr::PublishedSlots>& sessions,
                        std::vector<std::string>& notes) {
  ThreadTable t;
  t.tid = tid;
  t.comm = ReadLine(absl::StrCat("/proc/", pid, "/task/", tid, "/comm"));
  t.free = free;
  std::vector<std::pair<int, SlotRow>> mine;  // preferred index, row
  for (const bool process_wide : {true, false}) {
    for (const drmgr::PublishedSlots& s : sessions) {
      for (const drmgr::ScopeView& sv : s.snapshot.scopes) {
        if (!OnThread(sv.scope, pid, tid) ||
            (sv.scope.kind == drmgr::Scope::Kind::kProcess) != process_wide) {
          continue;
        }
        for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
          const drmgr::SlotView& v = sv.slots[static_cast<size_t>(i)];
          if (v.state != drmgr::SlotState::kArmed && v.state != drmgr::SlotState::kMultiplexed &&
              v.state != drmgr::SlotState::kPreempted) {
            continue;
          }
          SlotRow row;
          row.state = v.state;
          row.kwatch_pid = s.kwatch_pid;
          row.requests = v.holders;
          for (const drmgr::RequestId id : v.holders) {
            row.labels.push_back(Label(s.snapshot, id));
          }
          for (const drmgr::RequestId id : v.displaced) {
            row.waiting.push_back(Label(s.snapshot, id));
          }
          row.chunk = v.chunk;
          row.kind = v.kind;
          row.coverage = v.coverage;
          mine.emplace_back(i, std::move(row));
        }
      }
    }
  }
  t.kwatch = static_cast<int>(mine.size());
  const int used = drmgr::kNumDebugRegisters - free;
  t.external = std::max(0, used - t.kwatch);
  if (t.kwatch > used) {
    notes.push_back(absl::StrFormat(
        "thread %d: kwatch sessions published %d slots but the kernel shows %d in use (a "
        "session is changing its slots, or its last publication is out of date)",
        tid, t.kwatch, used));
  }
  std::array<bool, drmgr::kNumDebugRegisters> taken{};
  std::vector<SlotRow> placed;
  std::vector<SlotRow> later;
  for (auto& [index, row] : mine) {
    if (!taken[static_cast<size_t>(index)]) {
      taken[static_cast<size_t>(index)] = true;
      row.dr = index;
      placed.push_back(std::move(row));
    } else {
      later.push_back(std::move(row));
    }
  }
  for (SlotRow& row : later) {
    row.dr = -1;
    for (int i = 0; i < drmgr::kNumDebugRegisters && row.dr < 0; ++i) {
      if (!taken[static_cast<size_t>(i)]) {
        taken[static_cast<size_t>(i)] = true;
        row.dr = i;
      }
    }
    placed.push_back(std::move(row));  // dr -1: more than four (an out-of-date publication)
  }
  int external = t.external;
  for (int i = drmgr::kNumDebugRegisters - 1; i >= 0; --i) {
    if (taken[static_cast<size_t>(i)]) {
      continue;
    }
    SlotRow row;
    row.dr = i;
    row.state = external > 0 ? drmgr::SlotState::kExternal : drmgr::SlotState::kFree;
    external -= external > 0 ? 1 : 0;
    placed.push_back(std::move(row));
  }
  std::sort(placed.begin(), placed.end(), [](const SlotRow& a, const SlotRow& b) {
    return static_cast<unsigned>(a.dr) < static_cast<unsigned>(b.dr);  // -1 last
  });
  t.rows = std::move(placed);
  return t;
}

absl::StatusOr<ProcessTable> BuildProcess(pid_t pid, std::vector<drmgr::PublishedSlots> sessions,
                                          std::vector<std::string>& notes) {
  ProcessTable p;
  p.pid = pid;
  KW_ASSIGN_OR_RETURN(const std::vector<pid_t> tids, ListTasks(pid));
  p.comm = ReadLine(absl::StrCat("/proc/", pid, "/comm"));
  p.sessions = std::move(sessions);
  for (const pid_t tid : tids) {
    absl::StatusOr<int> free = CountFreeSlots(tid);
    if (absl::IsNotFound(free.status())) {
      continue;  // the thread exited meanwhile
    }
    if (!free.ok()) {
      return free.status();
    }
    p.threads.push_back(BuildThread(pid, tid, *free, p.sessions, notes));
  }
  if (p.threads.empty()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " has exited"));
  }
  for (const drmgr::PublishedSlots& s : p.sessions) {
    for (const drmgr::RequestView& r : s.snapshot.requests) {
      if (!r.armed && r.request.scope.is_task() && r.request.scope.pid == pid) {
        p.not_in_hardware.push_back(WaitingRequest{s.kwatch_pid, r});
      }
    }
  }
  return p;
}

std::string HolderText(const SlotRow& r) {
  if (r.requests.empty()) {
    return "-";
  }
  return absl::StrCat(absl::StrJoin(r.labels, ", "), " (kwatch ", r.kwatch_pid, ")");
}

std::string RangeText(const drmgr::Chunk& c) {
  return absl::StrFormat("%d byte%s at 0x%x", c.len, c.len == 1 ? "" : "s", c.addr.value);
}

std::string StateText(const SlotRow& r) {
  switch (r.state) {
    case drmgr::SlotState::kFree:
      return "free";
    case drmgr::SlotState::kArmed:
      return "armed";
    case drmgr::SlotState::kMultiplexed:
      return absl::StrFormat("multiplexed %.0f%%", 100 * r.coverage);
    case drmgr::SlotState::kPreempted:
      return absl::StrCat("preempted (waiting: ", absl::StrJoin(r.waiting, ", "), ")");
    case drmgr::SlotState::kExternal:
      return "held outside kwatch";
  }
  return "?";
}

std::string WaitingStateText(const drmgr::RequestView& v) {
  switch (v.state) {
    case drmgr::RequestState::kFallbackPages:
      return "page-protected";
    case drmgr::RequestState::kFailed:
      return "failed";
    case drmgr::RequestState::kPreempted:
      return "preempted";
    case drmgr::RequestState::kMultiplexed:
      return absl::StrFormat("multiplexed %.0f%%", 100 * v.coverage());
    case drmgr::RequestState::kHardware:
      return "hardware, not armed";
  }
  return "?";
}

std::string RequestRange(const drmgr::SlotRequest& r) {
  return absl::StrFormat("%d byte%s at 0x%x", r.len, r.len == 1 ? "" : "s", r.addr.value);
}

std::string Ago(uint64_t ns) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  const double s = static_cast<double>(now - static_cast<int64_t>(ns)) / 1e9;
  return absl::StrFormat("%.1f s ago", std::max(0.0, s));
}

void PrintText(const ProcessTable& p) {
  std::printf("process %d (%s): %zu thread%s\n", p.pid, p.comm.c_str(), p.threads.size(),
              p.threads.size() == 1 ? "" : "s");
  if (p.sessions.empty()) {
    std::printf("  no kwatch session watches it\n");
  }
  for (const drmgr::PublishedSlots& s : p.sessions) {
    std::printf("  kwatch %d: %s (published %s)\n", s.kwatch_pid, s.command_line.c_str(),
                Ago(s.updated_ns).c_str());
  }
  size_t w_holder = 6;
  size_t w_range = 5;
  for (const ThreadTable& t : p.threads) {
    for (const SlotRow& r : t.rows) {
      w_holder = std::max(w_holder, HolderText(r).size());
      w_range = std::max(w_range, r.requests.empty() ? 1 : RangeText(r.chunk).size());
    }
  }
  for (const ThreadTable& t : p.threads) {
    std::printf("\nthread %d (%s): %d kwatch, %d held outside kwatch, %d free\n", t.tid,
                t.comm.c_str(), t.kwatch, t.external, t.free);
    std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n", "SLOT", static_cast<int>(w_holder), "HOLDER",
                static_cast<int>(w_range), "RANGE", "KIND", "STATE");
    for (const SlotRow& r : t.rows) {
      const bool mine = !r.requests.empty();
      std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n",
                  r.dr < 0 ? "DR?" : absl::StrCat("DR", r.dr).c_str(), static_cast<int>(w_holder),
                  HolderText(r).c_str(), static_cast<int>(w_range),
                  mine ? RangeText(r.chunk).c_str() : "-",
                  mine ? Own(KindShort(r.kind)).c_str() : "-", StateText(r).c_str());
    }
  }
  if (!p.not_in_hardware.empty()) {
    std::printf("\nnot in hardware:\n");
    for (const WaitingRequest& w : p.not_in_hardware) {
      const drmgr::RequestView& v = w.view;
      std::printf("  %s (kwatch %d): %s %s, %s: %s\n",
                  v.request.label.empty() ? absl::StrCat("request ", v.id.value).c_str()
                                          : v.request.label.c_str(),
                  w.kwatch_pid, RequestRange(v.request).c_str(),
                  Own(KindShort(v.request.kind)).c_str(), WaitingStateText(v).c_str(),
                  v.reason.c_str());
    }
  }
}

json ProcessJson(const ProcessTable& p) {
  json sessions = json::array();
  for (const drmgr::PublishedSlots& s : p.sessions) {
    sessions.push_back(json{{"kwatch_pid", s.kwatch_pid},
                            {"command_line", s.command_line},
                            {"updated_ns", s.updated_ns}});
  }
  json threads = json::array();
  for (const ThreadTable& t : p.threads) {
    json rows = json::array();
    for (const SlotRow& r : t.rows) {
      json row = {
          {"slot", r.dr}, {"state", Own(drmgr::SlotStateName(r.state))}, {"text", StateText(r)}};
      if (!r.requests.empty()) {
        json ids = json::array();
        for (const drmgr::RequestId id : r.requests) {
          ids.push_back(id.value);
        }
        row["kwatch_pid"] = r.kwatch_pid;
        row["holder"] = HolderText(r);
        row["labels"] = r.labels;
        row["requests"] = ids;
        row["addr"] = absl::StrFormat("0x%x", r.chunk.addr.value);
        row["len"] = r.chunk.len;
        row["kind"] = Own(KindShort(r.kind));
        row["coverage"] = r.coverage;
        row["waiting"] = r.waiting;
      }
      rows.push_back(std::move(row));
    }
    threads.push_back(json{{"tid", t.tid},
                           {"comm", t.comm},
                           {"kwatch", t.kwatch},
                           {"external", t.external},
                           {"free", t.free},
                           {"slots", rows}});
  }
  json waiting = json::array();
  for (const WaitingRequest& w : p.not_in_hardware) {
    const drmgr::RequestView& v = w.view;
    waiting.push_back(json{{"kwatch_pid", w.kwatch_pid},
                           {"request", v.id.value},
                           {"label", v.request.label},
                           {"addr", absl::StrFormat("0x%x", v.request.addr.value)},
                           {"len", v.request.len},
                           {"kind", Own(KindShort(v.request.kind))},
                           {"state", Own(drmgr::RequestStateName(v.state))},
                           {"text", WaitingStateText(v)},
                           {"coverage", v.coverage()},
                           {"reason", v.reason}});
  }
  return json{{"pid", p.pid},
              {"comm", p.comm},
              {"sessions", sessions},
              {"threads", threads},
              {"not_in_hardware", waiting}};
}

// A kernel session's registers on one CPU, as its allocator knows them (registers held by
// other tools are learned when the kernel refuses one: ENOSPC).
struct CpuTable {
  int cpu = 0;
  int kwatch = 0;
  int external = 0;
  int free = 0;
  std::vector<SlotRow> rows;  // DR0-DR3
};

std::vector<CpuTable> KernelTables(const drmgr::PublishedSlots& s) {
  std::vector<CpuTable> out;
  for (const drmgr::ScopeView& sv : s.snapshot.scopes) {
    if (sv.scope.kind != drmgr::Scope::Kind::kCpu) {
      continue;
    }
    CpuTable t;
    t.cpu = sv.scope.cpu;
    t.external = sv.external;
    t.free = sv.free;
    for (int i = 0; i < drmgr::kNumDebugRegisters; ++i) {
      const drmgr::SlotView& v = sv.slots[static_cast<size_t>(i)];
      SlotRow row;
      row.dr = i;
      row.state = v.state;
      if (!v.holders.empty()) {
        ++t.kwatch;
        row.kwatch_pid = s.kwatch_pid;
        row.requests = v.holders;
        for (const drmgr::RequestId id : v.holders) {
          row.labels.push_back(Label(s.snapshot, id));
        }
        row.chunk = v.chunk;
        row.kind = v.kind;
      }
      t.rows.push_back(std::move(row));
    }
    out.push_back(std::move(t));
  }
  return out;
}

void PrintKernelText(const drmgr::PublishedSlots& s) {
  std::printf("kernel session kwatch %d: %s (published %s)\n", s.kwatch_pid, s.command_line.c_str(),
              Ago(s.updated_ns).c_str());
  for (const CpuTable& t : KernelTables(s)) {
    std::printf("CPU %d: %d kwatch, %d held outside kwatch, %d free\n", t.cpu, t.kwatch, t.external,
                t.free);
    size_t w_holder = 6;
    size_t w_range = 5;
    for (const SlotRow& r : t.rows) {
      w_holder = std::max(w_holder, HolderText(r).size());
      w_range = std::max(w_range, r.requests.empty() ? 1 : RangeText(r.chunk).size());
    }
    std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n", "SLOT", static_cast<int>(w_holder), "HOLDER",
                static_cast<int>(w_range), "RANGE", "KIND", "STATE");
    for (const SlotRow& r : t.rows) {
      const bool mine = !r.requests.empty();
      std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n", absl::StrCat("DR", r.dr).c_str(),
                  static_cast<int>(w_holder), HolderText(r).c_str(), static_cast<int>(w_range),
                  mine ? RangeText(r.chunk).c_str() : "-",
                  mine ? Own(KindShort(r.kind)).c_str() : "-", StateText(r).c_str());
    }
  }
}

json KernelJson(const drmgr::PublishedSlots& s) {
  json cpus = json::array();
  for (const CpuTable& t : KernelTables(s)) {
    json rows = json::array();
    for (const SlotRow& r : t.rows) {
      json row = {
          {"slot", r.dr}, {"state", Own(drmgr::SlotStateName(r.state))}, {"text", StateText(r)}};
      if (!r.requests.empty()) {
        row["holder"] = HolderText(r);
        row["labels"] = r.labels;
        row["addr"] = absl::StrFormat("0x%x", r.chunk.addr.value);
        row["len"] = r.chunk.len;
        row["kind"] = Own(KindShort(r.kind));
      }
      rows.push_back(std::move(row));
    }
    cpus.push_back(json{{"cpu", t.cpu},
                        {"kwatch", t.kwatch},
                        {"external", t.external},
                        {"free", t.free},
                        {"slots", rows}});
  }
  return json{{"kwatch_pid", s.kwatch_pid},
              {"command_line", s.command_line},
              {"updated_ns", s.updated_ns},
              {"cpus", cpus}};
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kwatch: error: %s\n", Own(s.message()).c_str());
  return 1;
}

}  // namespace

int SlotsMain(const std::vector<std::string>& args) {
  int pid = 0;
  bool as_json = false;
  CLI::App app{
      "kwatch slots: who holds the four x86 debug registers (DR0-DR3) of each thread of a\n"
      "process: the watches of running kwatch sessions (armed, multiplexed with their coverage,\n"
      "or preempted by a higher priority), slots held outside kwatch (a debugger such as gdb,\n"
      "perf, another tool; counted through the kernel), and free slots; then the watches of\n"
      "kwatch sessions that are not in hardware (page-protected, waiting, failed). Without -p:\n"
      "every process a running kwatch session watches. Counting needs perf_event_open on the\n"
      "target's threads (root, CAP_PERFMON, or kernel.perf_event_paranoid <= 1 for your own\n"
      "processes). DR numbers are kwatch's: the kernel picks the real register.",
      "kwatch slots"};
  app.add_option("-p,--pid", pid, "The process to show (even when no kwatch session watches it)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", as_json, "Print one JSON object");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // --help: 0; a usage error: 2
  }

  std::vector<std::string> notes;
  absl::StatusOr<std::vector<drmgr::PublishedSlots>> published =
      drmgr::ReadPublishedSlots(static_cast<pid_t>(pid), &notes);
  if (!published.ok()) {
    return Fail(published.status());
  }
  std::map<pid_t, std::vector<drmgr::PublishedSlots>> by_target;
  std::vector<drmgr::PublishedSlots> kernel;  // kernel sessions (target 0): CPU-wide registers
  for (drmgr::PublishedSlots& s : *published) {
    if (s.target > 0) {
      by_target[s.target].push_back(std::move(s));
    } else if (pid == 0) {
      kernel.push_back(std::move(s));
    }
  }
  std::vector<ProcessTable> tables;
  if (pid > 0) {
    absl::StatusOr<ProcessTable> t =
        BuildProcess(static_cast<pid_t>(pid), std::move(by_target[pid]), notes);
    if (!t.ok()) {
      return Fail(t.status());
    }
    tables.push_back(*std::move(t));
  } else {
    for (auto& [target, sessions] : by_target) {
      const pid_t kw = sessions.front().kwatch_pid;
      absl::StatusOr<ProcessTable> t = BuildProcess(target, std::move(sessions), notes);
      if (absl::IsNotFound(t.status())) {
        notes.push_back(
            absl::StrCat("process ", target, " (watched by kwatch ", kw, ") has exited"));
        continue;
      }
      if (!t.ok()) {
        return Fail(t.status());
      }
      tables.push_back(*std::move(t));
    }
  }

  if (as_json) {
    json processes = json::array();
    for (const ProcessTable& t : tables) {
      processes.push_back(ProcessJson(t));
    }
    json kernel_sessions = json::array();
    for (const drmgr::PublishedSlots& s : kernel) {
      kernel_sessions.push_back(KernelJson(s));
    }
    const json out = {{"registry", drmgr::SlotRegistryDir()},
                      {"processes", processes},
                      {"kernel_sessions", kernel_sessions},
                      {"notes", notes}};
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  for (const std::string& n : notes) {
    std::fprintf(stderr, "kwatch: note: %s\n", n.c_str());
  }
  if (tables.empty() && kernel.empty()) {
    std::printf(
        "no running kwatch session watches a process (sessions publish their slots in %s)\n",
        drmgr::SlotRegistryDir().c_str());
    return 0;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (i > 0) {
      std::printf("\n");
    }
    PrintText(tables[i]);
  }
  for (size_t i = 0; i < kernel.size(); ++i) {
    if (i > 0 || !tables.empty()) {
      std::printf("\n");
    }
    PrintKernelText(kernel[i]);
  }
  return 0;
}

}  // namespace kwatch::cli
