#include "cli/slots_cmd.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "drmgr/allocator_types.h"
#include "drmgr/slot_registry.h"
#include "drmgr/slot_view.h"
#include "watch/slots_view.h"

namespace kwatch::cli {

namespace {

using json = nlohmann::json;

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

std::string HolderText(const drmgr::SlotRow& r) {
  if (r.requests.empty()) {
    return "-";
  }
  return absl::StrCat(absl::StrJoin(r.labels, ", "), " (kwatch ", r.kwatch_pid, ")");
}

std::string RangeText(const drmgr::Chunk& c) {
  return absl::StrFormat("%d byte%s at 0x%x", c.len, c.len == 1 ? "" : "s", c.addr.value);
}

std::string StateText(const drmgr::SlotRow& r) {
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

// The widths of the HOLDER and RANGE columns of register tables.
struct Widths {
  size_t holder = 6;
  size_t range = 5;
  void Fit(const std::vector<drmgr::SlotRow>& rows) {
    for (const drmgr::SlotRow& r : rows) {
      holder = std::max(holder, HolderText(r).size());
      range = std::max(range, r.requests.empty() ? 1 : RangeText(r.chunk).size());
    }
  }
};

// A table of registers: SLOT HOLDER RANGE KIND STATE.
void PrintRows(const std::vector<drmgr::SlotRow>& rows, const Widths& w) {
  std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n", "SLOT", static_cast<int>(w.holder), "HOLDER",
              static_cast<int>(w.range), "RANGE", "KIND", "STATE");
  for (const drmgr::SlotRow& r : rows) {
    const bool mine = !r.requests.empty();
    std::printf("  %-4s  %-*s  %-*s  %-5s  %s\n",
                r.dr < 0 ? "DR?" : absl::StrCat("DR", r.dr).c_str(), static_cast<int>(w.holder),
                HolderText(r).c_str(), static_cast<int>(w.range),
                mine ? RangeText(r.chunk).c_str() : "-",
                mine ? Own(KindShort(r.kind)).c_str() : "-", StateText(r).c_str());
  }
}

void PrintText(const watch::ProcessSlots& p) {
  std::printf("process %d (%s): %zu thread%s\n", p.pid, p.comm.c_str(), p.threads.size(),
              p.threads.size() == 1 ? "" : "s");
  if (p.sessions.empty()) {
    std::printf("  no kwatch session watches it\n");
  }
  for (const drmgr::PublishedSlots& s : p.sessions) {
    std::printf("  kwatch %d: %s (published %s)\n", s.kwatch_pid, s.command_line.c_str(),
                Ago(s.updated_ns).c_str());
  }
  Widths widths;
  for (const drmgr::ThreadSlots& t : p.threads) {
    widths.Fit(t.rows);
  }
  for (const drmgr::ThreadSlots& t : p.threads) {
    std::printf("\nthread %d (%s): %d kwatch, %d held outside kwatch, %d free\n", t.tid,
                t.comm.c_str(), t.kwatch, t.external, t.free);
    PrintRows(t.rows, widths);
  }
  if (!p.not_in_hardware.empty()) {
    std::printf("\nnot in hardware:\n");
    for (const drmgr::WaitingRequest& w : p.not_in_hardware) {
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

json ProcessJson(const watch::ProcessSlots& p) {
  json sessions = json::array();
  for (const drmgr::PublishedSlots& s : p.sessions) {
    sessions.push_back(json{{"kwatch_pid", s.kwatch_pid},
                            {"command_line", s.command_line},
                            {"updated_ns", s.updated_ns}});
  }
  json threads = json::array();
  for (const drmgr::ThreadSlots& t : p.threads) {
    json rows = json::array();
    for (const drmgr::SlotRow& r : t.rows) {
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
  for (const drmgr::WaitingRequest& w : p.not_in_hardware) {
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

void PrintKernelText(const drmgr::PublishedSlots& s) {
  std::printf("kernel session kwatch %d: %s (published %s)\n", s.kwatch_pid, s.command_line.c_str(),
              Ago(s.updated_ns).c_str());
  for (const drmgr::CpuSlots& t : drmgr::KernelCpuSlots(s)) {
    std::printf("CPU %d: %d kwatch, %d held outside kwatch, %d free\n", t.cpu, t.kwatch, t.external,
                t.free);
    Widths widths;
    widths.Fit(t.rows);
    PrintRows(t.rows, widths);
  }
}

json KernelJson(const drmgr::PublishedSlots& s) {
  json cpus = json::array();
  for (const drmgr::CpuSlots& t : drmgr::KernelCpuSlots(s)) {
    json rows = json::array();
    for (const drmgr::SlotRow& r : t.rows) {
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

  absl::StatusOr<watch::SlotsView> view = watch::ReadSlotsView(static_cast<pid_t>(pid));
  if (!view.ok()) {
    return Fail(view.status());
  }
  const std::vector<watch::ProcessSlots>& tables = view->processes;
  const std::vector<drmgr::PublishedSlots>& kernel = view->kernel;
  const std::vector<std::string>& notes = view->notes;
  if (as_json) {
    json processes = json::array();
    for (const watch::ProcessSlots& t : tables) {
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
