#include "cli/probe_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "cli/output.h"
#include "cli/probe_notes.h"
#include "watch/probe/aggregate_output.h"
#include "watch/probe/hit_stacks.h"

namespace kwatch::cli {

namespace {

using watch::probe::HitTally;

std::string Hex(uint64_t v) {
  return absl::StrFormat("0x%x", v);
}

constexpr size_t kFlushBytes = size_t{64} * 1024;

// Where frame `i` of a --stack is (watch::probe::FrameLookupAddress).
core::symbols::CodeLocation FrameAt(const PrinterOptions& o, const std::vector<core::RemoteAddr>& f,
                                    size_t i) {
  const core::RemoteAddr at = watch::probe::FrameLookupAddress(f, i);
  if (o.locate) {
    return o.locate(at);
  }
  core::symbols::CodeLocation none;
  none.ip = at;
  return none;
}

// A frame as text: where it is, or its own address (a return address as the stack holds it,
// as gdb prints it) without a symbol.
std::string FrameText(const core::symbols::CodeLocation& loc, core::RemoteAddr frame) {
  return loc.function.empty() ? Hex(frame.value) : core::symbols::Symbolizer::Format(loc);
}

std::string ExitText(const ProbeRunInfo& info) {
  if (!info.exit.has_value()) {
    return "";
  }
  if (info.exit->signaled) {
    return absl::StrFormat("target %d was killed by signal %d (%s)%s", info.pid, info.exit->signal,
                           sigabbrev_np(info.exit->signal),
                           info.exit->core_dumped ? ", core dumped" : "");
  }
  return absl::StrFormat("target %d exited with status %d", info.pid, info.exit->code);
}

ProbeEndStats StatsOf(const ProbeSummary& s, uint32_t id) {
  auto it = s.end.stats.find(id);
  return it == s.end.stats.end() ? ProbeEndStats{} : it->second;
}

// A probe's hits: what the backend counted itself (the agent's own count, every hit even
// when its record was lost), else the hits delivered to the tally.
uint64_t HitsOf(const ProbeSummary& s, uint32_t id) {
  return StatsOf(s, id).counted.value_or(s.tally.hits(id));
}

// Every probe's hits (HitsOf), the summary's total.
uint64_t TotalHits(const ProbeSummary& s) {
  bool counted = false;
  uint64_t total = 0;
  for (const ProbeDef& p : s.probes) {
    if (p.internal()) {
      continue;  // a return probe's entry, for its $duration
    }
    counted = counted || StatsOf(s, p.id).counted.has_value();
    total += HitsOf(s, p.id);
  }
  return counted ? total : s.tally.taken();
}

// The path a probe took: the agent's per probe, else the backend's ("ptrace", "uprobe", "hw").
watch::probe::ProbePath PathOf(const ProbeSummary& s, uint32_t id) {
  auto it = s.end.paths.find(id);
  if (it != s.end.paths.end()) {
    return it->second;
  }
  return watch::probe::ProbePath{.path = s.end.info.backend, .why = ""};
}

// What the filter did with `p`'s hits: "if i > 1: 3 of 10 hits matched", the hits --skip
// ignored and those after -c EVENT:N.
void PrintFilterLines(FILE* out, const ProbeDef& p, const watch::probe::ProbeFilterStats& f,
                      const ProbeEndStats& st) {
  if (!p.condition.empty()) {
    std::string line = absl::StrFormat("    if %s: %d of %d hit%s matched", p.condition, f.matched,
                                       f.seen, f.seen == 1 ? "" : "s");
    if (st.target_filter.has_value()) {
      absl::StrAppend(&line, " (tested in the target)");
    } else if (!st.condition_in_kwatch_why.empty()) {
      absl::StrAppend(&line, " (tested in kwatch: ", st.condition_in_kwatch_why, ")");
    }
    if (st.lost > 0 && !st.target_filter.has_value()) {
      // The condition runs in kwatch, on the hits it receives: a full ring's are not tested.
      absl::StrAppend(&line, " (", st.lost, " lost in full rings were not tested)");
    }
    if (f.condition.has_value() && f.condition->missing_value > 0) {
      absl::StrAppend(&line, ", ", f.condition->missing_value,
                      " without a value (not read: not matched)");
    }
    if (f.condition.has_value() && f.condition->division_by_zero > 0) {
      absl::StrAppend(&line, ", ", f.condition->division_by_zero, " divided by zero (not matched)");
    }
    absl::FPrintF(out, "%s\n", line);
  }
  if (f.skipped > 0) {
    absl::FPrintF(out, "    --skip: the first %d matching hit%s ignored\n", f.skipped,
                  f.skipped == 1 ? "" : "s");
  }
  if (f.over_count > 0) {
    absl::FPrintF(out, "    -c %s: %d later matching hit%s not taken\n", p.point.event,
                  f.over_count, f.over_count == 1 ? "" : "s");
  }
}

}  // namespace

std::string ArgValueJson(const std::string& formatted) {
  return watch::probe::ArgValueJson(formatted, JsonString);
}

void ProbePrinter::OnStart() {
  if (opts_.quiet) {
    return;
  }
  pending_ += Header();
  WriteLines();
}

bool ProbePrinter::Add(const ProbeHit& hit) {
  if (!opts_.quiet) {
    Emit(Line(hit));
  }
  return true;
}

void ProbePrinter::Flush() {
  WriteLines();
}

absl::Status ProbePrinter::status() const {
  return output_failed_ ? absl::UnavailableError("output closed") : absl::OkStatus();
}

void ProbePrinter::OnNote(const watch::probe::ProbeNote& note) {
  if (note.pid > 0) {
    (void)ns_pid_.Of(note.pid);  // now: the hits may be printed once it is gone
  }
  std::fprintf(stderr, "kwatch: %s\n", ProbeNoteText(note).c_str());
  std::fflush(stderr);
}

double ProbePrinter::Seconds(uint64_t time_ns) const {
  return static_cast<double>(time_ns - std::min(time_ns, opts_.start_ns)) / 1e9;
}

void ProbePrinter::Emit(const std::string& line) {
  pending_ += line;
  if (pending_.size() >= kFlushBytes) {
    WriteLines();
  }
}

void ProbePrinter::WriteLines() {
  size_t done = 0;
  while (done < pending_.size() && !output_failed_) {
    // The longest run of whole lines within PIPE_BUF (a longer line goes alone).
    size_t end = std::min(pending_.size(), done + PIPE_BUF);
    if (end < pending_.size()) {
      const size_t nl = pending_.rfind('\n', end - 1);
      if (nl != std::string::npos && nl >= done) {
        end = nl + 1;
      } else if (const size_t next = pending_.find('\n', done); next != std::string::npos) {
        end = next + 1;
      } else {
        end = pending_.size();
      }
    }
    const ssize_t n = ::write(out_fd_, pending_.data() + done, end - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        continue;
      }
      output_failed_ = true;
      break;
    }
    done += static_cast<size_t>(n);
  }
  pending_.clear();
}

std::string ProbeTextPrinter::Header() const {
  return absl::StrFormat("%-12s %-7s %-20s %-34s %s\n", "TIME(s)", "TID", "EVENT", "LOCATION",
                         "ARGS");
}

std::string ProbeTextPrinter::Line(const ProbeHit& hit) const {
  const ProbeDef& p = *hit.probe;
  std::string where = p.Location();
  if (p.point.is_return) {
    absl::StrAppend(
        &where, " <- ",
        opts().caller ? opts().caller(hit.return_address) : Hex(hit.return_address.value));
  } else if (const std::string line = p.SourceLine(); !line.empty()) {
    absl::StrAppend(&where, " (", line, ")");
  }
  const std::string who = opts().main_pid != 0 && hit.pid != 0 && hit.pid != opts().main_pid
                              ? absl::StrCat(hit.pid, "/", hit.tid)
                              : absl::StrCat(hit.tid);
  std::string line =
      absl::StrFormat("%-12.6f %-7s %-20s %-34s", Seconds(hit.time_ns), who, p.point.event, where);
  for (const auto& [name, value] : hit.args) {
    absl::StrAppend(&line, " ", name, "=", value);
  }
  // Trailing blanks of the padding when there are no arguments.
  while (!line.empty() && line.back() == ' ') {
    line.pop_back();
  }
  line += '\n';
  for (size_t i = 0; opts().show_stack && i < hit.stack.size(); ++i) {
    absl::StrAppendFormat(&line, "    #%-2d %s\n", i,
                          FrameText(FrameAt(opts(), hit.stack, i), hit.stack[i]));
  }
  return line;
}

void ProbeTextPrinter::PrintSummary(FILE* out, const ProbeSummary& s) const {
  const ProbeRunInfo& info = s.end.info;
  const bool ptrace = info.backend == "ptrace";
  const uint64_t total = TotalHits(s);
  absl::FPrintF(out, "\n== kwatch probe summary: %d hit%s in %.3f s, %s backend (%s) ==\n", total,
                total == 1 ? "" : "s", info.seconds, info.backend, info.stop_reason);
  const bool agent = info.backend == "agent";
  if (agent) {
    absl::FPrintF(out, "%-20s %-24s %-22s %10s %8s %8s %8s %s\n", "EVENT", "LOCATION", "SOURCE",
                  "HITS", "MISSES", "NMISSED", "LOST", "PATH");
  } else if (ptrace) {
    absl::FPrintF(out, "%-20s %-24s %-22s %10s %8s %8s\n", "EVENT", "LOCATION", "SOURCE", "HITS",
                  "MISSES", "NMISSED");
  } else {
    absl::FPrintF(out, "%-20s %-24s %-22s %10s %8s\n", "EVENT", "LOCATION", "SOURCE", "HITS",
                  "LOST");
  }
  for (const ProbeDef& p : s.probes) {
    if (p.internal()) {
      continue;  // a return probe's entry, for its $duration
    }
    const ProbeEndStats st = StatsOf(s, p.id);
    const std::string source = p.SourceLine().empty() ? "-" : p.SourceLine();
    if (agent) {
      const watch::probe::ProbePath path = PathOf(s, p.id);
      absl::FPrintF(out, "%-20s %-24s %-22s %10d %8d %8s %8d %s\n", p.point.event, p.Location(),
                    source, HitsOf(s, p.id), st.misses,
                    p.point.is_return ? absl::StrCat(st.nmissed) : std::string("-"), st.lost,
                    path.path);
      if (!path.why.empty()) {
        absl::FPrintF(out, "    %s, not jump: %s\n", path.path, path.why);
      }
    } else if (ptrace) {
      absl::FPrintF(out, "%-20s %-24s %-22s %10d %8d %8s\n", p.point.event, p.Location(), source,
                    s.tally.hits(p.id), st.misses,
                    p.point.is_return ? absl::StrCat(st.nmissed) : std::string("-"));
    } else {
      absl::FPrintF(out, "%-20s %-24s %-22s %10d %8d\n", p.point.event, p.Location(), source,
                    s.tally.hits(p.id), st.lost);
    }
    if (st.abandoned > 0) {
      absl::FPrintF(out, "    %d tracked call%s never returned (longjmp, exception, thread exit)\n",
                    st.abandoned, st.abandoned == 1 ? "" : "s");
    }
    if (st.faults > 0) {
      absl::FPrintF(out, "    the probed instruction faulted %d time%s (signal passed on)\n",
                    st.faults, st.faults == 1 ? "" : "s");
    }
    if (s.filter != nullptr) {
      PrintFilterLines(out, p, watch::probe::SummaryFilterStats(s.filter->stats(p.id), st), st);
    }
    for (const HitTally::ArgTally& t : s.tally.args(p.id)) {
      std::string line = absl::StrFormat("    %-16s %s%d distinct:", t.name, t.other > 0 ? ">" : "",
                                         t.values.size());
      size_t n = 0;
      for (const auto& [v, c] : HitTally::Ranked(t)) {
        if (n++ == 5) {
          line += " ...";
          break;
        }
        absl::StrAppend(&line, " ", v, " (", c, ")");
      }
      absl::FPrintF(out, "%s\n", line);
    }
  }
  for (const watch::probe::ProbeNote& note : info.notes) {
    absl::FPrintF(out, "note: %s\n", SummaryNoteText(note));
  }
  if (const std::string exit = ExitText(info); !exit.empty()) {
    absl::FPrintF(out, "%s\n", exit);
  }
}

std::string ProbeJsonPrinter::Line(const ProbeHit& hit) const {
  const ProbeDef& p = *hit.probe;
  std::string s = absl::StrFormat(
      "{\"type\":\"hit\",\"time_ns\":%d,\"time\":%.9f,\"pid\":%d%s,\"tid\":%d,\"cpu\":%s,"
      "\"probe\":%d,\"event\":%s,\"ip\":\"%s\",\"function\":%s,\"offset\":%d,\"file\":%s,"
      "\"line\":%d,\"is_return\":%s",
      hit.time_ns, Seconds(hit.time_ns), hit.pid, NsPidOf(hit.pid), hit.tid,
      hit.cpu == core::kUnknownCpu ? std::string("null") : absl::StrCat(hit.cpu), p.id,
      JsonString(p.point.event), Hex(hit.ip.value), JsonString(p.point.function), p.point.offset,
      JsonString(p.point.file), p.point.line, p.point.is_return ? "true" : "false");
  if (p.point.is_return) {
    absl::StrAppend(&s, R"(,"return_address":")", Hex(hit.return_address.value), "\"");
    if (opts().caller) {
      absl::StrAppend(&s, ",\"caller\":", JsonString(opts().caller(hit.return_address)));
    }
  }
  if (opts().show_stack && !hit.stack.empty()) {
    s += ",\"stack\":[";
    for (size_t i = 0; i < hit.stack.size(); ++i) {
      const core::symbols::CodeLocation f = FrameAt(opts(), hit.stack, i);
      absl::StrAppendFormat(&s,
                            "%s{\"ip\":\"%s\",\"function\":%s,\"offset\":%d,\"file\":%s,"
                            "\"line\":%d}",
                            i == 0 ? "" : ",", Hex(hit.stack[i].value), JsonString(f.function),
                            f.offset, JsonString(f.file), f.line);
    }
    s += "]";
  }
  s += ",\"args\":{";
  for (size_t i = 0; i < hit.args.size(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ",", JsonString(hit.args[i].first), ":",
                    ArgValueJson(hit.args[i].second));
  }
  s += "}}\n";
  return s;
}

void ProbeJsonPrinter::PrintSummary(FILE* out, const ProbeSummary& s) const {
  const ProbeRunInfo& info = s.end.info;
  const std::optional<watch::probe::ProbeSessionEnd::Hw>& hw = s.end.hw;
  nlohmann::ordered_json j = {
      {"type", "summary"},       {"backend", info.backend},         {"hits", TotalHits(s)},
      {"seconds", info.seconds}, {"stop_reason", info.stop_reason}, {"pid", info.pid}};
  if (info.exit.has_value()) {
    j["exit_code"] = info.exit->signaled ? -1 : info.exit->code;
    j["signal"] = info.exit->signal;
  } else {
    j["exit_code"] = nullptr;
    j["signal"] = 0;
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ProbeDef& p : s.probes) {
    if (p.internal()) {
      continue;  // a return probe's entry, for its $duration
    }
    const ProbeEndStats st = StatsOf(s, p.id);
    nlohmann::ordered_json pj = {{"id", p.id},
                                 {"event", p.point.event},
                                 {"spec", p.spec},
                                 {"location", p.Location()},
                                 {"function", p.point.function},
                                 {"offset", p.point.offset},
                                 {"file", p.point.file},
                                 {"line", p.point.line},
                                 {"is_return", p.point.is_return},
                                 {"address", Hex(p.point.vaddr.value)},
                                 {"hits", HitsOf(s, p.id)},
                                 {"misses", st.misses},
                                 {"nmissed", st.nmissed},
                                 {"abandoned", st.abandoned},
                                 {"faults", st.faults},
                                 {"lost", st.lost}};
    if (s.filter != nullptr && s.filter->filters()) {
      const watch::probe::ProbeFilterStats f =
          watch::probe::SummaryFilterStats(s.filter->stats(p.id), st);
      pj["condition"] = p.condition.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(p.condition);
      if (!p.condition.empty()) {
        pj["condition_in"] = st.target_filter.has_value() ? "target" : "kwatch";
      }
      pj["seen"] = f.seen;
      pj["matched"] = f.matched;
      pj["skipped"] = f.skipped;
      pj["over_count"] = f.over_count;
      pj["no_value"] = f.condition.has_value() ? f.condition->missing_value : 0;
    }
    const watch::probe::ProbePath path = PathOf(s, p.id);
    pj["path"] = path.path;
    if (!path.why.empty()) {
      pj["path_reason"] = path.why;
    }
    if (st.kernel_count.has_value()) {
      pj["kernel_count"] = *st.kernel_count;
    }
    nlohmann::ordered_json args = nlohmann::ordered_json::array();
    for (const HitTally::ArgTally& t : s.tally.args(p.id)) {
      nlohmann::ordered_json top = nlohmann::ordered_json::array();
      size_t n = 0;
      for (const auto& [v, c] : HitTally::Ranked(t)) {
        if (n++ == 10) {
          break;
        }
        top.push_back({{"value", v}, {"count", c}});
      }
      args.push_back(
          {{"name", t.name}, {"distinct", t.values.size()}, {"more", t.other > 0}, {"top", top}});
    }
    pj["args"] = args;
    if (hw.has_value()) {  // --hw: where the probe was in the registers
      const auto it = hw->registers.find(p.id);
      if (it != hw->registers.end() && it->second >= 0) {
        pj["debug_register"] = it->second;
      } else {
        pj["debug_register"] = nullptr;
      }
    }
    list.push_back(pj);
  }
  j["probes"] = list;
  std::vector<std::string> notes;
  notes.reserve(info.notes.size());
  for (const watch::probe::ProbeNote& n : info.notes) {
    notes.push_back(SummaryNoteText(n));
  }
  j["notes"] = notes;
  if (hw.has_value()) {
    j["external_slots"] = hw->external_slots;
    j["stray_traps"] = hw->stray_traps;
  }
  std::fputs(j.dump().c_str(), out);
  std::fputc('\n', out);
}

}  // namespace kwatch::cli

namespace kwatch::cli {

void PrintAggregatesText(FILE* out, const watch::probe::Aggregator& agg, double elapsed) {
  absl::FPrintF(out, "\n%s",
                watch::probe::AggregatesText(watch::probe::AggregateResults(agg), elapsed));
}

void PrintAggregatesJson(FILE* out, const watch::probe::Aggregator& agg, double elapsed) {
  std::fputs(watch::probe::AggregatesJson(watch::probe::AggregateResults(agg), elapsed, JsonString)
                 .c_str(),
             out);
}

}  // namespace kwatch::cli
