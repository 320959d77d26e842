#include "cli/output.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/symbols/symbolizer.h"
#include "watch/probe/hit_stacks.h"
#include "watch/profile/report_render.h"
#include "watch/value_text.h"

namespace kwatch::cli {

namespace {

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Hex(uint64_t v) {
  return absl::StrFormat("0x%x", v);
}

std::string SiteText(const core::symbols::CodeLocation& loc, core::RemoteAddr ip) {
  if (loc.function.empty()) {
    return Hex(ip.value);
  }
  std::string s = absl::StrFormat("%s+0x%x", loc.function, loc.offset);
  if (!loc.inlined_function.empty() && loc.inlined_function != loc.function) {
    s = absl::StrCat(loc.inlined_function, " inlined in ", s);
  }
  if (!loc.file.empty()) {
    absl::StrAppend(&s, " (", Basename(loc.file), ":", loc.line, ")");
  }
  return s;
}

template <typename K>
std::vector<std::pair<K, watch::KindCounts>> Ranked(
    const absl::flat_hash_map<K, watch::KindCounts>& m) {
  std::vector<std::pair<K, watch::KindCounts>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    if (a.second.total() != b.second.total()) {
      return a.second.total() > b.second.total();
    }
    return a.first < b.first;
  });
  return v;
}

constexpr size_t kTopSites = 10;

// Names sites with the symbols of `session`'s process.
watch::profile::SiteNamer SiteNamerFor(watch::WatchSession& session) {
  return [&session](core::RemoteAddr ip) {
    const core::symbols::CodeLocation& loc = session.symbolizer().Locate(ip);
    return watch::profile::SiteName{loc.function, loc.offset, loc.file, loc.line,
                                    loc.inlined_function};
  };
}

}  // namespace

int64_t ValueOf(uint64_t raw, uint32_t len) {
  if (len >= 8) {
    return static_cast<int64_t>(raw);
  }
  const int shift = static_cast<int>(64 - 8 * len);
  return static_cast<int64_t>(raw << shift) >> shift;
}

std::string ValueText(const watch::EventValues& v, uint64_t raw) {
  if (v.field != nullptr) {
    return watch::FieldValueText(v.field->type_name, v.field->size, 0, raw);
  }
  // A decoded bitfield is already sign-extended (or zero-extended) to 64 bits.
  return absl::StrCat(v.decoded ? static_cast<int64_t>(raw) : ValueOf(raw, v.width));
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

namespace {

// `,"stack":[...]` for an event with a backtrace, else "". Frame 0 is the accessing
// instruction (the thread stopped after it).
std::string StackJson(watch::WatchSession& session, const core::AccessEvent& ev) {
  const std::vector<core::RemoteAddr>* frames = session.stack(ev.stack_id);
  if (frames == nullptr) {
    return "";
  }
  std::string s = ",\"stack\":[";
  for (size_t i = 0; i < frames->size(); ++i) {
    const core::RemoteAddr at = i == 0 ? ev.ip : (*frames)[i];
    const core::symbols::CodeLocation& f =
        session.symbolizer().Locate(i == 0 ? ev.ip : watch::probe::FrameLookupAddress(*frames, i));
    absl::StrAppendFormat(&s,
                          "%s{\"ip\":\"%s\",\"function\":%s,\"offset\":%d,\"file\":%s,"
                          "\"line\":%d}",
                          i == 0 ? "" : ",", Hex(at.value), JsonString(f.function), f.offset,
                          JsonString(f.file), f.line);
  }
  s += "]";
  return s;
}

// --follow: what the summary says of watch `id` (nullptr: a location watch).
const RunInfo::Followed* FollowedIn(const RunInfo& info, uint32_t id) {
  for (const RunInfo::Followed& f : info.followed) {
    if (f.watch_id == id) {
      return &f;
    }
  }
  return nullptr;
}

// The fields of a --follow move, as JSON members (no braces).
std::string MoveJsonFields(const watch::FollowMove& m, const std::string& display,
                           const std::string& expr, const core::symbols::CodeLocation& loc) {
  const auto addr = [](const std::optional<core::RemoteAddr>& a) {
    return a.has_value() ? absl::StrCat("\"", Hex(a->value), "\"") : std::string("null");
  };
  std::string s = absl::StrFormat(
      R"("time_ns":%d,"tid":%d,"watch":%d,"expr":%s,"display":%s,"from":%s,"to":%s,)"
      R"("pointer":%s,"ip":"%s","function":%s,"offset":%d,"file":%s,"line":%d)",
      m.time_ns, m.tid, m.watch_id, JsonString(expr), JsonString(display), addr(m.from), addr(m.to),
      JsonString(m.pointer), Hex(m.ip.value), JsonString(loc.function), loc.offset,
      JsonString(loc.file), loc.line);
  if (!m.to.has_value()) {
    absl::StrAppend(&s, ",\"why\":", JsonString(m.why));
  }
  return s;
}

}  // namespace

void AccessPrinter::Start(const watch::WatchSession& session, uint64_t start_ns, pid_t main_pid) {
  start_ns_ = start_ns;
  main_pid_ = main_pid;
  if (shown_.empty()) {
    for (const watch::Watch& w : session.watches()) {
      shown_.push_back(w.id);
    }
  }
  if (!quiet_) {
    PrintHeader(session);
  }
}

watch::profile::ReportRenderOptions AccessPrinter::SummaryStart() {
  std::fflush(out_);
  watch::profile::ReportRenderOptions ropts;
  ropts.width = watch::profile::TerminalWidth(out_);
  return ropts;
}

void AccessPrinter::OnNote(const watch::AccessNote& note) {
  using Kind = watch::AccessNote::Kind;
  switch (note.kind) {
    case Kind::kText:
      std::fprintf(stderr, "kwatch: %s\n", note.text.c_str());
      break;
    case Kind::kChildExited:
      std::fprintf(stderr, "kwatch: followed child %d %s %d\n", note.pid,
                   note.exit->signaled ? "killed by signal" : "exited with status",
                   note.exit->signaled ? note.exit->signal : note.exit->code);
      break;
    case Kind::kTargetExec:
      std::fprintf(stderr,
                   "kwatch: target %d called exec; the watches of the old image have ended "
                   "(their addresses mean nothing in the new one; -f re-arms them)\n",
                   note.pid);
      break;
    case Kind::kGroupStop: {
      const std::string who = note.parent == 0 ? absl::StrCat("target ", note.pid)
                                               : absl::StrCat("followed child ", note.pid);
      std::fprintf(stderr, "kwatch: %s stopped by %s (job control); still watching\n", who.c_str(),
                   sigabbrev_np(note.signal));
      break;
    }
    case Kind::kChildFollowed:
      if (!quiet_) {
        std::fprintf(stderr, "kwatch: following child %d of %d (watches armed in %.0f us)\n",
                     note.pid, note.parent, note.arm_us);
      }
      break;
    case Kind::kChildrenDetached:
      std::fprintf(
          stderr, "kwatch: watches removed from %zu followed child%s, detached; %s running\n",
          note.count, note.count == 1 ? "" : "ren", note.count == 1 ? "it keeps" : "they keep");
      break;
    case Kind::kDetached:
      std::fprintf(stderr, "kwatch: detached; target %d keeps running\n", note.pid);
      break;
    case Kind::kCallEnded:
      if (!quiet_ && note.call.has_value()) {
        PrintCallEnd(*note.call, note.expr, note.text);
      }
      break;
    case Kind::kMoved:
      if (!quiet_) {
        PrintMove(note);
      }
      break;
  }
}

namespace {

// How a per-call watch's call ended, for people: "compute returned after 3 accesses to the
// object at 0x7ffc...; out of scope", "not watched: 'r->len': a pointer on the way is NULL".
std::string CallEndText(const watch::CallRecord& r, const std::string& function) {
  if (!r.armed) {
    return absl::StrCat("not watched in this call: ", r.why);
  }
  const std::string how = r.why.empty() ? absl::StrCat(function, " returned") : r.why;
  return absl::StrFormat("out of scope: %s after %d access%s to the object at %s", how, r.events,
                         r.events == 1 ? "" : "es", Hex(r.base.value));
}

// The field column of a per-call watch's lines: "r->len (call 3)".
std::string CallField(const std::string& field, uint32_t call) {
  return call == 0 ? field : absl::StrCat(field, " (call ", call, ")");
}

}  // namespace

void AccessTextPrinter::PrintCallEnd(const watch::CallRecord& r, const std::string& expr,
                                     const std::string& function) {
  absl::FPrintF(out_, "%-14.9f %-7d %-3s %-24s %s\n", Seconds(r.end_ns), r.tid, "-",
                CallField(expr, r.call), CallEndText(r, function));
}

void AccessJsonPrinter::PrintCallEnd(const watch::CallRecord& r, const std::string& expr,
                                     const std::string& function) {
  absl::FPrintF(
      out_,
      "{\"type\":\"call_end\",\"time_ns\":%d,\"tid\":%d,\"watch_id\":%d,"
      "\"expr\":%s,\"function\":%s,\"call\":%d,\"armed\":%s,\"addr\":\"%s\",\"events\":%d,"
      "\"returned\":%s,\"why\":%s}\n",
      r.end_ns, r.tid, r.watch_id, JsonString(expr), JsonString(function), r.call,
      r.armed ? "true" : "false", Hex(r.base.value), r.events, r.returned ? "true" : "false",
      JsonString(r.why));
}

void AccessJsonPrinter::PrintHeader(const watch::WatchSession& session) {
  (void)ns_pid_.Of(session.process().pid());  // read while the process is there
  for (const auto& w : session.watches()) {
    if (!Shown(w.id)) {
      continue;
    }
    absl::FPrintF(
        out_,
        "{\"type\":\"watch\",\"id\":%d,\"expr\":%s,\"display\":%s,\"addr\":\"%s\","
        "\"len\":%d,\"kind\":\"%s\",\"type_name\":%s,\"backend\":\"%s\"}\n",
        w.id, JsonString(w.request.expr), JsonString(w.target.display), Hex(w.target.addr.value),
        w.target.length, w.request.reads_only ? "read" : drmgr::DrKindName(w.request.kind),
        JsonString(w.target.type_name), watch::BackendName(session.placement(w.id).backend));
  }
}

void AccessJsonPrinter::PrintMove(const watch::AccessNote& note) {
  absl::FPrintF(out_, "{\"type\":\"move\",\"pid\":%d,%s}\n", note.pid,
                MoveJsonFields(note.move, note.display, note.display, note.site));
}

void AccessTextPrinter::PrintMove(const watch::AccessNote& note) {
  // In the event stream, between the accesses to the old object and those to the new one.
  absl::FPrintF(out_, "%-14.9f %-7d --  %s\n", Seconds(note.move.time_ns), note.move.tid,
                watch::FollowMoveText(note.move, note.display, SiteText(note.site, note.move.ip)));
}

void AccessTextPrinter::PrintHeader(const watch::WatchSession& session) {
  const bool exact = session.backend() == watch::BackendKind::kPage ||
                     session.backend() == watch::BackendKind::kStop;
  // Perf stream mode: values from the registers at the access, or (marked ~) read at drain
  // time when the instruction does not tell them (read-modify-write, xchg, SIMD...).
  absl::FPrintF(out_, "%-14s %-7s %-3s %-24s %-24s %s\n", "TIME(s)", "TID", "ACC", "FIELD",
                exact ? "OLD -> NEW" : "VALUE (~ = at drain)", "SITE");
}

absl::Status AccessJsonPrinter::OnEvent(watch::WatchSession& session, watch::Summary& summary,
                                        const core::AccessEvent& ev,
                                        const core::AccessEvent& as_counted) {
  if (quiet_) {
    return absl::OkStatus();
  }
  // Before `loc`: looking frames up may grow the symbolizer's cache, which `loc` points into.
  const std::string stack_json = StackJson(session, ev);
  const core::symbols::CodeLocation& loc = session.symbolizer().Locate(ev.ip);
  // Against the watch as counted (its first object with --follow, its first image with -f).
  const watch::Watch& w = summary.watches()[ev.watch_id];
  const std::string field = summary.FieldLabel(as_counted);
  const watch::EventValues v = watch::ValuesOf(watch::WatchedBitfield(w.target), as_counted);
  std::string value = "null";
  if (v.value.has_value()) {
    value = ValueText(v, *v.value);
  }
  std::string old_value = "null";
  if (v.old_value.has_value()) {
    old_value = ValueText(v, *v.old_value);
  }
  const std::string cpu = ev.cpu == core::kUnknownCpu ? "null" : absl::StrCat(ev.cpu);
  absl::FPrintF(
      out_,
      "{\"type\":\"event\",\"time_ns\":%d,\"pid\":%d%s,\"tid\":%d,\"cpu\":%s,"
      "\"access\":\"%s\",\"addr\":\"%s\",\"len\":%d,\"access_addr\":\"%s\","
      "\"access_size\":%d,\"expr\":%s,\"field\":%s,"
      "\"ip\":\"%s\",\"trap_ip\":\"%s\",\"function\":%s,\"offset\":%d,\"file\":%s,"
      "\"line\":%d,\"value\":%s,\"old_value\":%s,\"value_at\":\"%s\"%s%s}\n",
      ev.time_ns, ev.pid, ns_pid_.Of(ev.pid), ev.tid, cpu, core::AccessKindLetter(ev.kind),
      Hex(ev.addr.value), ev.len, Hex(ev.access_size > 0 ? ev.access_addr.value : ev.addr.value),
      ev.access_size > 0 ? ev.access_size : ev.len, JsonString(w.request.expr), JsonString(field),
      Hex(ev.ip.value), Hex(ev.trap_ip.value), JsonString(loc.function), loc.offset,
      JsonString(loc.file), loc.line, value, old_value, ev.value_exact ? "access" : "drain",
      ev.call == 0 ? std::string() : absl::StrCat(",\"call\":", ev.call), stack_json);
  return absl::OkStatus();
}

absl::Status AccessTextPrinter::OnEvent(watch::WatchSession& session, watch::Summary& summary,
                                        const core::AccessEvent& ev,
                                        const core::AccessEvent& as_counted) {
  if (quiet_) {
    return absl::OkStatus();
  }
  const core::symbols::CodeLocation& loc = session.symbolizer().Locate(ev.ip);
  const std::string field = CallField(summary.FieldLabel(as_counted), ev.call);
  // Against the watch as counted (its first object with --follow, its first image with -f,
  // offsets into each call's object for a watch per call).
  const core::symbols::ResolvedExpr& target = summary.watches()[ev.watch_id].target;
  watch::EventValues v = watch::ValuesOf(watch::WatchedBitfield(target), as_counted);
  v.field = watch::AccessedField(target, as_counted);  // text: values as their type; JSON numbers
  const double t = Seconds(ev.time_ns);
  std::string value = "?";
  if (v.value.has_value()) {
    value = absl::StrCat(ev.value_exact ? "" : "~", ValueText(v, *v.value));
  }
  if (v.old_value.has_value()) {
    value = absl::StrCat(ValueText(v, *v.old_value), " -> ", value);
  }
  const std::string who = main_pid_ != 0 && ev.pid != main_pid_
                              ? absl::StrCat(ev.pid, "/", ev.tid)  // a followed child (-f)
                              : absl::StrCat(ev.tid);
  absl::FPrintF(out_, "%-14.9f %-7s %-3s %-24s %-24s %s\n", t, who, core::AccessKindLetter(ev.kind),
                field, value, SiteText(loc, ev.ip));
  if (const std::vector<core::RemoteAddr>* frames = session.stack(ev.stack_id)) {
    for (size_t i = 0; i < frames->size(); ++i) {
      const core::RemoteAddr at = i == 0 ? ev.ip : watch::probe::FrameLookupAddress(*frames, i);
      const core::symbols::CodeLocation& f = session.symbolizer().Locate(at);
      absl::FPrintF(out_, "    #%-2d %s\n", i, SiteText(f, at));
    }
  }
  return absl::OkStatus();
}

void AccessJsonPrinter::OnSummary(const watch::AccessSummary& all) {
  watch::WatchSession& session = all.session;
  const watch::Summary& summary = all.summary;
  const RunInfo& info = all.info;
  const watch::profile::ReportRenderOptions ropts = SummaryStart();
  std::string s = absl::StrFormat(
      "{\"type\":\"summary\",\"events\":%d,\"lost\":%d,\"filtered\":%d,\"unrelated\":%d,"
      "\"spurious_traps\":%d,\"seconds\":%.6f,\"backend\":\"%s\",\"stop_reason\":%s,\"pid\":%d",
      summary.events(), info.lost, info.filtered, info.unrelated, info.spurious_traps, info.seconds,
      watch::BackendName(session.backend()), JsonString(info.stop_reason), info.pid);
  if (info.exit.has_value()) {
    absl::StrAppendFormat(&s, R"(,"exit_code":%d,"signal":%d)",
                          info.exit->signaled ? -1 : info.exit->code, info.exit->signal);
  }
  absl::StrAppendFormat(&s, ",\"external_slots\":%d", session.external_slots());
  if (info.armed_at.has_value()) {
    absl::StrAppendFormat(&s,
                          ",\"armed\":true,\"arm_at\":{\"spec\":%s,\"point\":%s,\"tid\":%d,"
                          "\"wait_ms\":%.3f,\"arm_us\":%.1f}",
                          JsonString(info.armed_at->spec), JsonString(info.armed_at->where),
                          info.armed_at->tid, info.armed_at->wait_ms, info.armed_at->arm_us);
  }
  if (!info.condition.empty()) {
    absl::StrAppendFormat(&s,
                          ",\"if\":{\"text\":%s,\"evaluated\":%d,\"matched\":%d,"
                          "\"undefined\":%d}",
                          JsonString(info.condition), info.condition_evaluated,
                          info.condition_matched, info.condition_undefined);
  }
  s += ",\"watches\":[";
  for (const auto& w : session.watches()) {
    if (!Shown(w.id)) {
      continue;
    }
    const watch::WatchCounts& c = summary.counts(w.id);
    absl::StrAppendFormat(
        &s,
        "%s{\"id\":%d,\"expr\":%s,\"display\":%s,\"addr\":\"%s\",\"len\":%d,\"kind\":\"%s\","
        "\"backend\":\"%s\",\"events\":%d,\"reads\":%d,\"writes\":%d,",
        w.id == shown_.front() ? "" : ",", w.id, JsonString(w.request.expr),
        JsonString(w.target.display), Hex(w.target.addr.value), w.target.length,
        w.request.reads_only ? "read" : drmgr::DrKindName(w.request.kind),
        watch::BackendName(session.placement(w.id).backend), c.total.total(), c.total.reads,
        c.total.writes);
    if (session.allocator() != nullptr) {
      const watch::WatchPlacement p = session.placement(w.id);
      s += "\"slots\":[";
      for (size_t i = 0; i < std::min(p.slots.size(), p.chunks.size()); ++i) {
        absl::StrAppendFormat(&s, R"(%s{"dr":%d,"addr":"%s","len":%d})", i == 0 ? "" : ",",
                              p.slots[i], Hex(p.chunks[i].addr.value), p.chunks[i].len);
      }
      absl::StrAppendFormat(&s,
                            "],\"multiplexed\":%s,\"coverage\":%.4f,\"exact_cover\":%s,"
                            "\"placement\":%s,",
                            p.multiplexed ? "true" : "false", p.coverage,
                            p.exact ? "true" : "false", JsonString(p.detail));
    }
    if (const RunInfo::Followed* f = FollowedIn(info, w.id); f != nullptr) {
      s += R"("follow":{"pointers":[)";
      for (size_t i = 0; i < f->pointers.size(); ++i) {
        absl::StrAppend(&s, i == 0 ? "" : ",", JsonString(f->pointers[i]));
      }
      absl::StrAppendFormat(&s, R"(],"parked":%s,)", f->parked ? "true" : "false");
      if (f->parked) {
        absl::StrAppend(&s, "\"why\":", JsonString(f->why), ",");
      }
      s += "\"objects\":[";
      for (size_t i = 0; i < f->objects.size(); ++i) {
        const RunInfo::FollowedObject& o = f->objects[i];
        absl::StrAppendFormat(&s, R"(%s{"addr":"%s","events":%d,"reads":%d,"writes":%d})",
                              i == 0 ? "" : ",", Hex(o.addr.value), o.counts.total(),
                              o.counts.reads, o.counts.writes);
      }
      s += R"(],"moves":[)";
      for (size_t i = 0; i < f->moves.size(); ++i) {
        const core::symbols::CodeLocation loc = session.symbolizer().Locate(f->moves[i].ip);
        absl::StrAppend(&s, i == 0 ? "{" : ",{",
                        MoveJsonFields(f->moves[i], w.target.display, w.request.expr, loc), "}");
      }
      s += "]},";
    }
    s += "\"fields\":[";
    bool first = true;
    for (const auto& [name, k] : Ranked(c.fields)) {
      absl::StrAppendFormat(&s, R"(%s{"field":%s,"reads":%d,"writes":%d})", first ? "" : ",",
                            JsonString(name), k.reads, k.writes);
      first = false;
    }
    s += "],\"threads\":[";
    first = true;
    for (const auto& [tid, k] : Ranked(c.threads)) {
      absl::StrAppendFormat(&s, R"(%s{"tid":%d,"reads":%d,"writes":%d})", first ? "" : ",", tid,
                            k.reads, k.writes);
      first = false;
    }
    s += "],\"sites\":[";
    first = true;
    size_t n = 0;
    for (const auto& [ip, k] : Ranked(c.sites)) {
      if (n++ == kTopSites) {
        break;
      }
      const core::symbols::CodeLocation& loc = session.symbolizer().Locate(ip);
      absl::StrAppendFormat(&s,
                            "%s{\"ip\":\"%s\",\"function\":%s,\"offset\":%d,\"file\":%s,"
                            "\"line\":%d,\"reads\":%d,\"writes\":%d}",
                            first ? "" : ",", Hex(ip.value), JsonString(loc.function), loc.offset,
                            JsonString(loc.file), loc.line, k.reads, k.writes);
      first = false;
    }
    s += "]}";
  }
  s += "]";
  if (const watch::KernelAccessStats* k = session.kernel_access(); k != nullptr && !k->empty()) {
    s += ",\"kernel\":";
    s += watch::KernelAccessJson(*k);
  }
  if (!info.processes.empty()) {
    s += ",\"processes\":[";
    for (size_t i = 0; i < info.processes.size(); ++i) {
      const RunInfo::Process& p = info.processes[i];
      absl::StrAppendFormat(&s, R"(%s{"pid":%d,"parent":%d,"events":%d,"watches":[%s])",
                            i == 0 ? "" : ",", p.pid, p.parent, p.events,
                            absl::StrJoin(p.per_watch, ","));
      if (p.exit.has_value()) {
        absl::StrAppendFormat(&s, R"(,"exit_code":%d,"signal":%d)",
                              p.exit->signaled ? -1 : p.exit->code, p.exit->signal);
      }
      s += "}";
    }
    s += "]";
  }
  if (!info.notes.empty()) {
    s += ",\"notes\":[";
    for (size_t i = 0; i < info.notes.size(); ++i) {
      absl::StrAppend(&s, i == 0 ? "" : ",", JsonString(info.notes[i]));
    }
    s += "]";
  }
  if (const watch::CallWatches* calls = session.calls(); calls != nullptr) {
    s += ",\"calls\":[";
    bool first_call = true;
    for (const watch::CallStats& st : calls->stats()) {
      std::string why;
      for (const auto& [text, n] : st.why_not) {
        absl::StrAppend(&why, why.empty() ? "" : ",",
                        absl::StrFormat(R"({"why":%s,"calls":%d})", JsonString(text), n));
      }
      absl::StrAppendFormat(
          &s,
          "%s{\"watch_id\":%d,\"function\":%s,\"point\":%s,\"calls\":%d,\"watched\":%d,"
          "\"not_watched\":%d,\"missed\":%d,\"abandoned\":%d,\"running\":%d,"
          "\"ended_watched\":%d,\"events_min\":%d,\"events_max\":%d,\"events_total\":%d,"
          "\"why_not\":[%s]}",
          first_call ? "" : ",", st.watch_id, JsonString(st.function), JsonString(st.point),
          st.calls, st.armed, st.not_armed, st.missed, st.abandoned, st.running, st.ended_armed,
          st.events_min, st.events_max, st.events_total, why);
      first_call = false;
    }
    s += "]";
  }
  s += ",\"profile\":";
  // Names from the target's debug information need not be UTF-8: replaced, never a throw.
  s += watch::profile::RenderJson(all.profile, SiteNamerFor(session), ropts)
           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s += "}\n";
  std::fputs(s.c_str(), out_);
  std::fflush(out_);
}

void AccessTextPrinter::OnSummary(const watch::AccessSummary& all) {
  watch::WatchSession& session = all.session;
  const watch::Summary& summary = all.summary;
  const RunInfo& info = all.info;
  const watch::profile::ReportRenderOptions ropts = SummaryStart();
  FILE* out = out_;
  absl::FPrintF(out, "\n== kwatch summary: %d events in %.3f s, %d lost", summary.events(),
                info.seconds, info.lost);
  if (info.filtered > 0) {
    absl::FPrintF(out, ", %d writes filtered (--read)", info.filtered);
  }
  if (info.unrelated > 0) {
    absl::FPrintF(out, ", %d faults on unwatched bytes of watched pages", info.unrelated);
  }
  if (info.spurious_traps > 0) {
    absl::FPrintF(out, ", %d spurious debug traps absorbed", info.spurious_traps);
  }
  absl::FPrintF(out, " (%s) ==\n", info.stop_reason);
  if (!info.condition.empty()) {
    absl::FPrintF(out, "--if '%s': %d of %d accesses matched", info.condition,
                  info.condition_matched, info.condition_evaluated);
    if (info.condition_undefined > 0) {
      absl::FPrintF(out, " (%d false for want of a value, or a division by zero)",
                    info.condition_undefined);
    }
    absl::FPrintF(out, "; the counts below are of those that matched\n");
  }
  if (info.armed_at.has_value()) {
    absl::FPrintF(out,
                  "armed at --arm-at %s: tid %d reached %s %.3f ms after the target was let run "
                  "(watches armed %.0f us later); accesses before it were not watched\n",
                  info.armed_at->spec, info.armed_at->tid, info.armed_at->where,
                  info.armed_at->wait_ms, info.armed_at->arm_us);
  }
  for (const auto& w : session.watches()) {
    if (!Shown(w.id)) {
      continue;
    }
    const watch::WatchPlacement p = session.placement(w.id);
    const RunInfo::Followed* f = FollowedIn(info, w.id);
    std::string where = session.per_call(w.id)
                            ? std::string("in each call's object (offsets from its start)")
                            : absl::StrCat("at ", Hex(w.target.addr.value));
    if (f != nullptr) {
      where = f->objects.empty()       ? "never reached an object"
              : f->objects.size() == 1 ? absl::StrCat("at ", Hex(f->objects[0].addr.value))
                                       : absl::StrCat("at ", f->objects.size(), " objects in turn");
    }
    absl::FPrintF(
        out, "watch #%d %s: %s%s%d bytes %s, %s, %s\n", w.id + 1, w.target.display,
        w.target.type_name, w.target.type_name.empty() ? "" : ", ", w.target.length, where,
        w.request.reads_only ? "read (read-write filtered)" : drmgr::DrKindName(w.request.kind),
        p.detail);
    if (const watch::CallWatches* calls = session.calls(); calls != nullptr) {
      for (const watch::CallStats& st : calls->stats()) {
        if (st.watch_id == w.id) {
          for (const std::string& line : watch::CallStatsLines(st)) {
            absl::FPrintF(out, "  %s\n", line);
          }
        }
      }
    }
    if (f != nullptr) {
      absl::FPrintF(out, "  --follow through %s: %d move%s\n",
                    f->pointers.empty()
                        ? std::string("its pointers")
                        : absl::StrCat("'", absl::StrJoin(f->pointers, "', '"), "'"),
                    f->moves.size(), f->moves.size() == 1 ? "" : "s");
      for (const watch::FollowMove& m : f->moves) {
        const core::symbols::CodeLocation loc = session.symbolizer().Locate(m.ip);
        absl::FPrintF(out, "    %.6f s  %s\n", Seconds(m.time_ns),
                      watch::FollowMoveText(m, w.target.display, SiteText(loc, m.ip)));
      }
      for (const RunInfo::FollowedObject& o : f->objects) {
        absl::FPrintF(out, "    object %-18s %8d reads %8d writes\n", Hex(o.addr.value),
                      o.counts.reads, o.counts.writes);
      }
    }
    if (p.multiplexed) {
      const watch::WatchCounts& c = summary.counts(w.id);
      absl::FPrintF(out, "  multiplexed: %d events seen in %.0f%% of the time, ~%.0f estimated\n",
                    c.total.total(), 100.0 * p.coverage,
                    p.coverage > 0 ? static_cast<double>(c.total.total()) / p.coverage : 0.0);
    }
  }
  if (const int ext = session.external_slots(); ext > 0) {
    absl::FPrintF(out, "%d debug register%s held outside kwatch (see `kwatch slots -p %d`)\n", ext,
                  ext == 1 ? " was" : "s were", info.pid);
  }
  absl::FPrintF(out, "\n%s", watch::profile::RenderText(all.profile, SiteNamerFor(session), ropts));
  if (const watch::KernelAccessStats* k = session.kernel_access(); k != nullptr && !k->empty()) {
    absl::FPrintF(out, "\n");
    for (const std::string& line : watch::KernelAccessLines(*k)) {
      absl::FPrintF(out, "%s\n", line);
    }
    absl::FPrintF(out, "kernel: %d system-call stops (page mode stops at every system call)\n",
                  k->syscall_stops);
  }
  if (!info.processes.empty()) {
    absl::FPrintF(out, "\nprocesses (-f: followed forks; events counted per process):\n");
    for (const RunInfo::Process& p : info.processes) {
      std::string end = "still running, detached";
      if (p.exit.has_value()) {
        end = p.exit->signaled ? absl::StrCat("killed by ", sigabbrev_np(p.exit->signal))
                               : absl::StrCat("exited with status ", p.exit->code);
      }
      absl::FPrintF(out, "  pid %-8d %-22s %10d events  (%s)  %s\n", p.pid,
                    p.parent == 0 ? "target" : absl::StrCat("child of ", p.parent), p.events,
                    absl::StrJoin(p.per_watch, " + "), end);
    }
  }
  for (const std::string& note : info.notes) {
    absl::FPrintF(out, "note: %s\n", note);
  }
  if (info.exit.has_value()) {
    if (info.exit->signaled) {
      absl::FPrintF(out, "\ntarget %d was killed by signal %d (%s)%s\n", info.pid,
                    info.exit->signal, sigabbrev_np(info.exit->signal),
                    info.exit->core_dumped ? ", core dumped" : "");
    } else {
      absl::FPrintF(out, "\ntarget %d exited with status %d\n", info.pid, info.exit->code);
    }
  }
  std::fflush(out);
}

}  // namespace kwatch::cli
