#include "cli/report_cmd.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/heatmap_png.h"
#include "core/base/printable.h"
#include "core/store/trace_reader.h"
#include "core/store/trace_writer.h"
#include "watch/chrome_trace.h"
#include "watch/folded_stacks.h"
#include "watch/probe/aggregate_output.h"
#include "watch/probe_tally.h"
#include "watch/profile/heatmap_panels.h"
#include "watch/profile/report_render.h"
#include "watch/recording.h"

namespace kwatch::cli {

namespace {

struct ReportOptions {
  std::string file;
  std::string format = "text";
  std::string field;
  std::optional<pid_t> thread;
  std::optional<double> from_s;
  std::optional<double> to_s;
  std::string png;
  bool log_scale = false;
  double bucket_ms = 0;
  std::string color = "auto";
  bool upgrade = false;
};

std::string WallTime(uint64_t ns) {
  const auto t = static_cast<time_t>(ns / 1000000000ULL);
  tm tmv{};
  localtime_r(&t, &tmv);
  std::array<char, 64> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%d %H:%M:%S", &tmv);
  return buf.data();
}

// A string of the recording as the text output shows it: control characters and ESC escaped
// (a recording is a file people share; core/base/printable.h).
std::string Shown(const std::string& s) {
  return core::Printable(s);
}

void PrintSessionText(const core::store::TraceReader& r, uint64_t events, uint64_t hits) {
  const core::store::SessionRecord& s = r.session();
  std::printf("== kwatch recording %s\n", Shown(r.path()).c_str());
  std::printf("command   %s\n", Shown(s.command_line).c_str());
  const std::string ns =
      s.ns_pid != 0 ? absl::StrCat(" (", s.ns_pid, " in its namespace)") : std::string();
  std::printf("target    pid %d%s   mode %s   backend %s\n", s.pid, ns.c_str(),
              Shown(s.mode).c_str(), Shown(s.backend).c_str());
  std::printf("host      %s   kernel %s   kwatch %s\n", Shown(s.host).c_str(),
              Shown(s.kernel).c_str(), Shown(s.kwatch_version).c_str());
  std::printf("started   %s\n", WallTime(s.start_wall_ns).c_str());
  if (r.complete() && r.end().has_value()) {
    const core::store::SessionEnd& e = *r.end();
    std::printf("ended     after %.3fs: %s",
                static_cast<double>(e.end_mono_ns - s.start_mono_ns) / 1e9,
                Shown(e.exit_reason).c_str());
    if (e.exit_status.has_value()) {
      std::printf(" (exit status %d)", *e.exit_status);
    }
    std::printf("\n");
    if (e.lost_count > 0) {
      std::printf("lost      %llu events (ring buffer overflow)\n",
                  static_cast<unsigned long long>(e.lost_count));
    }
  } else {
    std::printf(
        "ended     CUT SHORT: kwatch stopped before finishing this recording (killed, or the "
        "disk filled); it holds every batch committed before that\n");
  }
  std::printf("recorded  %llu events, %llu probe hits\n\n", static_cast<unsigned long long>(events),
              static_cast<unsigned long long>(hits));
}

nlohmann::json SessionJson(const core::store::TraceReader& r, uint64_t events, uint64_t hits) {
  const core::store::SessionRecord& s = r.session();
  nlohmann::json j = {{"file", r.path()},
                      {"command", s.command_line},
                      {"pid", s.pid},
                      {"mode", s.mode},
                      {"backend", s.backend},
                      {"host", s.host},
                      {"kernel", s.kernel},
                      {"kwatch_version", s.kwatch_version},
                      {"start_wall_ns", s.start_wall_ns},
                      {"complete", r.complete()},
                      {"events", events},
                      {"hits", hits}};
  if (s.ns_pid != 0) {
    j["ns_pid"] = s.ns_pid;
  }
  if (r.end().has_value()) {
    j["duration_s"] = static_cast<double>(r.end()->end_mono_ns - s.start_mono_ns) / 1e9;
    j["exit_reason"] = r.end()->exit_reason;
    j["lost"] = r.end()->lost_count;
    if (r.end()->exit_status.has_value()) {
      j["exit_status"] = *r.end()->exit_status;
    }
  }
  return j;
}

void PrintProbesText(const core::store::TraceReader& r,
                     const std::map<uint32_t, watch::ProbeTally>& tallies) {
  std::printf("== probes\n");
  for (const core::store::ProbeRecord& p : r.probes()) {
    auto it = tallies.find(p.id);
    const uint64_t hits = it == tallies.end() ? 0 : it->second.hits;
    std::printf("%-24s %s%s  %s:%d   %llu hits", Shown(p.event).c_str(), Shown(p.function).c_str(),
                p.is_return ? "%return" : "", Shown(p.file).c_str(), p.line,
                static_cast<unsigned long long>(hits));
    if (it == tallies.end()) {
      std::printf("\n");
      continue;
    }
    std::printf(" in %zu thread%s\n", it->second.threads.size(),
                it->second.threads.size() == 1 ? "" : "s");
    for (size_t i = 0; i < it->second.args.size(); ++i) {
      const auto& [name, values] = it->second.args[i];
      std::printf("    %-16s", Shown(name).c_str());
      for (const auto& [v, n] : watch::TopValues(values, 5)) {
        std::printf("  %s (%llu)", Shown(v).c_str(), static_cast<unsigned long long>(n));
      }
      if (values.size() > 5 || it->second.other_values[i] > 0) {
        std::printf("  ...");
      }
      std::printf("\n");
    }
  }
  std::printf("\n");
}

nlohmann::json ProbesJson(const core::store::TraceReader& r,
                          const std::map<uint32_t, watch::ProbeTally>& tallies) {
  nlohmann::json out = nlohmann::json::array();
  for (const core::store::ProbeRecord& p : r.probes()) {
    auto it = tallies.find(p.id);
    nlohmann::json j = {{"event", p.event},
                        {"spec", p.spec},
                        {"function", p.function},
                        {"file", p.file},
                        {"line", p.line},
                        {"is_return", p.is_return},
                        {"address", absl::StrFormat("0x%x", p.address.value)},
                        {"hits", it == tallies.end() ? 0 : it->second.hits}};
    nlohmann::json threads = nlohmann::json::object();
    nlohmann::json args = nlohmann::json::object();
    if (it != tallies.end()) {
      for (const auto& [tid, n] : it->second.threads) {
        threads[absl::StrCat(tid)] = n;
      }
      for (const auto& [name, values] : it->second.args) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& [v, n] : watch::TopValues(values, 10)) {
          top.push_back({{"value", v}, {"count", n}});
        }
        args[name] = top;
      }
    }
    j["threads"] = threads;
    j["top_values"] = args;
    out.push_back(j);
  }
  return out;
}

// The report's JSON beside the profile: the session, the probes and, when recorded, the
// aggregations' {"type":"aggregate"} objects.
nlohmann::json ExtraJson(const core::store::TraceReader& r, uint64_t events, uint64_t hits,
                         const std::map<uint32_t, watch::ProbeTally>& tallies) {
  nlohmann::json extra{{"session", SessionJson(r, events, hits)},
                       {"probes", ProbesJson(r, tallies)}};
  if (!r.aggregates().empty()) {
    extra["aggregates"] = watch::probe::ReportAggregatesJson(r.aggregates());
  }
  return extra;
}

// Writes the recording as a Chrome trace on stdout; what it holds on stderr. Returns the exit
// status.
int WriteChromeTrace(const core::store::TraceReader& r, const watch::RecordingSlice& slice,
                     double bucket_ms) {
  const auto bucket_ns = static_cast<uint64_t>(bucket_ms * 1e6);
  const absl::StatusOr<watch::ChromeTraceCounts> c =
      watch::WriteChromeTrace(r, watch::ChromeTraceOptions{slice, bucket_ns}, stdout);
  if (!c.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n", Shown(std::string{c.status().message()}).c_str());
    return 1;
  }
  std::fprintf(stderr,
               "kwatch: chrome trace: %llu accesses, %llu probe hits, %llu calls, %llu counter "
               "samples, %llu threads\n",
               static_cast<unsigned long long>(c->accesses),
               static_cast<unsigned long long>(c->hits), static_cast<unsigned long long>(c->calls),
               static_cast<unsigned long long>(c->counters),
               static_cast<unsigned long long>(c->threads));
  return 0;
}

}  // namespace

int ExportMain(const std::vector<std::string>& args) {
  std::string file;
  std::string sql_out;
  CLI::App app{
      "kwatch export: a recording for other tools. --sql OUT writes OUT, a copy of FILE whose\n"
      "events are one row each in table `events` (time_ns, pid, tid, cpu, watch_id, ip, trap_ip,\n"
      "addr, len, access_addr, access_size, kind, value, old_value, value_exact), as sqlite3\n"
      "queries expect them; kwatch stores them in compressed blocks (docs/recording.md).",
      "kwatch export"};
  app.add_option("file", file, "The recording (.kwdb)")->required();
  app.add_option("--sql", sql_out, "Write the copy with one row per event to this new file")
      ->required();
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto reader = core::store::TraceReader::Open(file);
  if (!reader.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 Shown(std::string{reader.status().message()}).c_str());
    return 1;
  }
  const absl::StatusOr<uint64_t> rows = core::store::ExportEventRows(**reader, sql_out);
  if (!rows.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 Shown(std::string{rows.status().message()}).c_str());
    return 1;
  }
  // Every event and hit of the copy is a row now (those of older recordings were already).
  const absl::StatusOr<uint64_t> events = (*reader)->CountEvents();
  const absl::StatusOr<uint64_t> hits = (*reader)->CountHits();
  std::fprintf(
      stderr,
      "kwatch: %s: %llu events as rows of table events, %llu probe hits as rows of table hits\n",
      Shown(sql_out).c_str(), static_cast<unsigned long long>(events.value_or(*rows)),
      static_cast<unsigned long long>(hits.value_or(0)));
  return 0;
}

int ReportMain(const std::vector<std::string>& args) {
  ReportOptions o;
  CLI::App app{
      "kwatch report: the storage profile of a recording made with `kwatch ... -o FILE`:\n"
      "per watched structure its fields (reads, writes, threads, top source lines), a heatmap\n"
      "of fields over time, per-thread views, cache lines and false-sharing findings; and for\n"
      "probe recordings the hits per probe with their argument values.",
      "kwatch report"};
  app.add_option("file", o.file, "The recording (.kwdb)")->required();
  app.add_option("--format", o.format,
                 "Output format (chrome-trace: the Chrome trace-event JSON that ui.perfetto.dev "
                 "and chrome://tracing open; folded: the stacks recorded with kwatch probe "
                 "--stack, one 'EVENT;outer;...;inner COUNT' line each, for flamegraph.pl and "
                 "speedscope)")
      ->check(CLI::IsMember({"text", "json", "csv", "chrome-trace", "folded"}))
      ->capture_default_str();
  app.add_option("--field", o.field, "Only fields whose path contains this text");
  app.add_option("--thread", o.thread, "Only events of this thread (tid)");
  app.add_option("--from", o.from_s, "Only events at or after SECS from the session start");
  app.add_option("--to", o.to_s, "Only events at or before SECS from the session start");
  app.add_option("--png", o.png, "Also write the heatmap as a PNG image to this file");
  app.add_flag("--log", o.log_scale, "Logarithmic colour scale for the heatmaps");
  app.add_option("--bucket-ms", o.bucket_ms,
                 "Width of a heatmap time column in milliseconds (default: chosen from the "
                 "session's length)")
      ->check(CLI::PositiveNumber);
  app.add_option("--color", o.color, "Colour in the terminal heatmap")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  app.add_flag("--upgrade", o.upgrade,
               "Rewrite FILE, recorded by an older kwatch, as kwatch records now (events in "
               "compressed blocks and in time order, the profile kept, which later reports read "
               "at once); prints no report");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.upgrade) {
    const absl::StatusOr<std::optional<uint64_t>> n = watch::UpgradeRecording(o.file);
    if (!n.ok()) {
      std::fprintf(stderr, "kwatch: error: %s\n", Shown(std::string{n.status().message()}).c_str());
      return 1;
    }
    if (!n->has_value()) {
      std::fprintf(stderr, "kwatch: %s is current (schema %d); nothing to do\n",
                   Shown(o.file).c_str(), core::store::kTraceSchemaVersion);
    } else {
      std::fprintf(stderr, "kwatch: %s upgraded to schema %d: %llu events in blocks\n",
                   Shown(o.file).c_str(), core::store::kTraceSchemaVersion,
                   static_cast<unsigned long long>(**n));
    }
    return 0;
  }
  auto reader = core::store::TraceReader::Open(o.file);
  if (!reader.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 Shown(std::string{reader.status().message()}).c_str());
    return 1;
  }
  const core::store::TraceReader& r = **reader;
  watch::RecordingSlice slice{o.from_s, o.to_s, o.thread};
  if (o.format == "chrome-trace") {
    return WriteChromeTrace(r, slice, o.bucket_ms);
  }
  if (o.format == "folded") {
    const absl::StatusOr<watch::FoldedStacks> f = watch::FoldStacks(r, slice);
    if (!f.ok()) {
      std::fprintf(stderr, "kwatch: error: %s\n", Shown(std::string{f.status().message()}).c_str());
      return 1;
    }
    std::fputs(f->text.c_str(), stdout);
    std::fprintf(
        stderr, "kwatch: folded: %llu hits in %llu stacks%s\n",
        static_cast<unsigned long long>(f->hits), static_cast<unsigned long long>(f->stacks),
        f->without > 0 ? absl::StrCat(" (", f->without, " hits without a stack)").c_str() : "");
    return 0;
  }
  auto profile = watch::ProfileFromRecording(r, slice, watch::ReportProfileOptions(r, o.bucket_ms));
  if (!profile.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 Shown(std::string{profile.status().message()}).c_str());
    return 1;
  }
  absl::StatusOr<std::map<uint32_t, watch::ProbeTally>> tallied = watch::TallyHits(r, slice);
  if (!tallied.ok()) {
    std::fprintf(stderr, "kwatch: error: %s\n",
                 Shown(std::string{tallied.status().message()}).c_str());
    return 1;
  }
  const std::map<uint32_t, watch::ProbeTally>& tallies = *tallied;
  uint64_t hits = 0;
  for (const auto& [id, t] : tallies) {
    hits += t.hits;
  }
  // Site names come from the recording's sites table.
  absl::flat_hash_map<uint64_t, const core::store::SiteRecord*> sites;
  for (const core::store::SiteRecord& s : r.sites()) {
    sites[s.ip.value] = &s;
  }
  watch::profile::SiteNamer namer = [&](core::RemoteAddr ip) {
    watch::profile::SiteName n;
    auto it = sites.find(ip.value);
    if (it != sites.end()) {
      const core::store::SiteRecord& s = *it->second;
      n = {s.function, s.offset, s.file, s.line, s.inlined};
    }
    return n;
  };
  watch::profile::ReportRenderOptions ropts;
  ropts.field_filter = o.field;
  ropts.log_scale = o.log_scale;
  ropts.width = watch::profile::TerminalWidth(stdout);
  ropts.color = o.color == "always" || (o.color == "auto" && isatty(STDOUT_FILENO) != 0);
  for (const core::store::TaskRecord& t : r.tasks()) {
    ropts.task_names[t.tid].push_back(t.comm);
  }
  if (!r.complete()) {
    std::fprintf(stderr,
                 "kwatch: note: %s was cut short (kwatch stopped before finishing it); the "
                 "report covers every batch committed before that\n",
                 o.file.c_str());
  }
  if (o.format == "json") {
    // Written a field at a time, ASCII only (\uXXXX) with bytes that are not UTF-8 replaced
    // (U+FFFD): any name a recording holds is valid JSON and nothing a terminal would obey.
    watch::profile::WriteJson(*profile, namer, ropts,
                              ExtraJson(r, profile->events(), hits, tallies), stdout);
  } else if (o.format == "csv") {
    std::fputs(watch::profile::RenderCsv(*profile, namer, ropts).c_str(), stdout);
  } else {
    PrintSessionText(r, profile->events(), hits);
    if (!r.watches().empty()) {
      std::fputs(watch::profile::RenderText(*profile, namer, ropts).c_str(), stdout);
    }
    if (!r.probes().empty()) {
      PrintProbesText(r, tallies);
    }
    std::fputs(watch::probe::ReportAggregatesText(r.aggregates()).c_str(), stdout);
  }
  if (!o.png.empty()) {
    const std::vector<HeatmapPanel> panels = watch::profile::HeatmapPanels(*profile, o.field);
    if (panels.empty()) {
      std::fprintf(stderr, "kwatch: error: no watched fields to draw in %s\n", o.png.c_str());
      return 1;
    }
    const std::string subtitle =
        absl::StrCat(r.session().command_line, r.complete() ? "" : "  (cut short)");
    if (absl::Status s = WriteHeatmapPng(panels, subtitle, o.log_scale, o.png); !s.ok()) {
      std::fprintf(stderr, "kwatch: error: %s\n", std::string{s.message()}.c_str());
      return 1;
    }
    std::fprintf(stderr, "kwatch: heatmap written to %s\n", o.png.c_str());
  }
  return 0;
}

}  // namespace kwatch::cli
