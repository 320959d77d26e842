#include "watch/profile/report_render.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/printable.h"
#include "watch/profile/duration.h"
#include "watch/profile/heat_scale.h"
#include "watch/profile/report_rows.h"
#include "watch/value_text.h"

namespace kwatch::watch::profile {
namespace {

using Json = nlohmann::json;

constexpr std::array<const char*, 4> kShades = {"░", "▒", "▓", "█"};
constexpr std::array<int, 6> kColours = {226, 220, 214, 208, 202, 196};  // xterm-256: yellow to red

std::string Hex(uint64_t v) {
  return absl::StrFormat("0x%x", v);
}

// "1 write", "2 writes".
std::string Count(uint64_t n, const char* noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// Every string that comes from the profile's input (names of fields, types, functions, files,
// tasks: a recording is a file people share) goes through this before it reaches the text or
// CSV output: control characters and ESC show escaped (core/base/printable.h).
std::string Shown(const std::string& s) {
  return core::Printable(s);
}

// Display width of a UTF-8 string (code points; the report's own text has no wide glyphs).
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (const char c : s) {
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80 ? 1 : 0;
  }
  return n;
}

std::string Pad(const std::string& s, size_t width) {
  const size_t n = Columns(s);
  return n >= width ? s : s + std::string(width - n, ' ');
}

// The report rows of a profile under the options, and the names of its sites (each site
// named once per rendering).
class View {
 public:
  View(const StorageProfile& p, const SiteNamer& namer, const ReportRenderOptions& o)
      : p_(p),
        namer_(namer),
        o_(o),
        rows_(BuildReportRows(p, ReportSelection{.field_filter = o.field_filter,
                                                 .path_prefix = o.path_prefix,
                                                 .threads = o.threads,
                                                 .top_sites = o.top_sites})) {}

  const StorageProfile& Profile() const { return p_; }
  const ReportRenderOptions& Options() const { return o_; }
  const ReportRows& Rows() const { return rows_; }
  bool ThreadFilter() const { return !o_.threads.empty(); }

  const SiteName& Locate(core::RemoteAddr ip) {
    auto it = names_.find(ip);
    if (it == names_.end()) {
      it = names_.emplace(ip, namer_ ? namer_(ip) : SiteName{}).first;
    }
    return it->second;
  }
  // "func+0x1a (file.c:42)", "func (file.c:42)", "0x401000".
  std::string Name(core::RemoteAddr ip) {
    const SiteName& n = Locate(ip);
    std::string out = n.function.empty() ? Hex(ip.value)
                      : n.offset == 0    ? Shown(n.function)
                                         : absl::StrCat(Shown(n.function), "+", Hex(n.offset));
    if (!n.file.empty()) {
      const size_t slash = n.file.rfind('/');
      absl::StrAppend(&out, " (",
                      Shown(slash == std::string::npos ? n.file : n.file.substr(slash + 1)), ":",
                      n.line, ")");
    }
    return out;
  }

  Json SiteJson(const SiteCount& s) {
    const SiteName& loc = Locate(s.ip);
    return Json{{"ip", Hex(s.ip.value)},   {"function", loc.function}, {"offset", loc.offset},
                {"file", loc.file},        {"line", loc.line},         {"count", s.counts.total()},
                {"reads", s.counts.reads}, {"writes", s.counts.writes}};
  }

 private:
  const StorageProfile& p_;
  const SiteNamer& namer_;
  const ReportRenderOptions& o_;
  ReportRows rows_;
  absl::flat_hash_map<core::RemoteAddr, SiteName> names_;
};

std::string OffsetText(const FieldInfo& f) {
  return f.bit_size > 0 ? absl::StrCat(f.offset, ":", f.bit_offset) : absl::StrCat(f.offset);
}
std::string SizeText(const FieldInfo& f) {
  return f.bit_size > 0 ? absl::StrCat(f.bit_size, "b") : absl::StrCat(f.size);
}
std::string TopSiteText(View& v, const FieldRow& r) {
  if (!r.sites.empty()) {
    return v.Name(r.sites[0].ip);
  }
  return r.other_sites.total() > 0 ? "(other)" : "-";
}

// Rows as aligned columns two spaces apart: align[c] is 'l' (left) or 'r' (right); the last
// column is never padded.
std::string Table(const std::vector<std::vector<std::string>>& rows, const std::string& align,
                  const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& r : rows) {
    widths.resize(std::max(widths.size(), r.size()), 0);
    for (size_t c = 0; c < r.size(); ++c) {
      widths[c] = std::max(widths[c], Columns(r[c]));
    }
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string gap(widths[c] - Columns(r[c]), ' ');
      if (c > 0) {
        line += "  ";
      }
      if (c < align.size() && align[c] == 'r') {
        line += gap + r[c];
      } else {
        line += c + 1 == r.size() ? r[c] : r[c] + gap;
      }
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

void TextHeatmap(View& v, const std::vector<FieldRow>& fields, std::string& out) {
  const StorageProfile& p = v.Profile();
  const TimeBins& bins = p.bins();
  const ReportRenderOptions& o = v.Options();
  if (bins.columns() == 0) {
    absl::StrAppend(&out, "  heatmap: no accesses in the time window\n");
    return;
  }
  std::vector<std::string> labels;
  size_t label = 0;
  for (const FieldRow& f : fields) {
    labels.push_back(Shown(p.fields()[f.field].path));
    label = std::max(label, Columns(labels.back()));
  }
  const size_t prefix = 2 + label + 2;
  const size_t avail = std::max<size_t>(10, static_cast<size_t>(std::max(o.width, 0)) > prefix + 1
                                                ? static_cast<size_t>(o.width) - prefix - 1
                                                : 0);
  const size_t group = (bins.columns() + avail - 1) / avail;
  const size_t ncols = (bins.columns() + group - 1) / group;
  std::vector<std::vector<uint64_t>> cells;
  uint64_t max = 0;
  for (const FieldRow& f : fields) {
    std::vector<uint64_t> row(ncols, 0);
    for (size_t c = 0; c < f.reads.size(); ++c) {
      row[c / group] += f.reads[c] + f.writes[c];
    }
    max = std::max(max, *std::max_element(row.begin(), row.end()));
    cells.push_back(std::move(row));
  }
  const int levels = o.color ? 6 : 4;
  const HeatLevels scale =
      MakeHeatLevels(max, levels, o.log_scale ? HeatScale::kLog : HeatScale::kLinear);
  auto cell = [&](int level, size_t n) {
    if (level == 0) {
      return std::string(n, ' ');
    }
    if (o.color) {
      return absl::StrCat("\x1b[48;5;", kColours[static_cast<size_t>(level - 1)], "m",
                          std::string(n, ' '), "\x1b[0m");
    }
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      s += kShades[static_cast<size_t>(level - 1)];
    }
    return s;
  };
  absl::StrAppend(
      &out, "  heatmap: ", v.ThreadFilter() ? "selected threads' " : "",
      "reads+writes per field, one column = ", FormatDuration(group * bins.width_ns()),
      group > 1 ? absl::StrCat(" (", group, " buckets of ", FormatDuration(bins.width_ns()), ")")
                : "",
      "\n");
  for (size_t i = 0; i < fields.size(); ++i) {
    std::string line = absl::StrCat("  ", Pad(labels[i], label), "  |");
    for (const uint64_t c : cells[i]) {
      line += cell(HeatLevel(scale, c), 1);
    }
    absl::StrAppend(&out, line, "|\n");
  }
  const std::string left = FormatDuration(bins.ColumnStartNs(0));
  const std::string right = FormatDuration(bins.ColumnStartNs(bins.columns()));
  const size_t span = ncols + 2;
  absl::StrAppend(
      &out, std::string(prefix, ' '), left,
      std::string(span > left.size() + right.size() ? span - left.size() - right.size() : 1, ' '),
      right, "\n");
  std::vector<std::string> legend;
  uint64_t lo = 1;
  for (int l = 1; l <= levels && max > 0; ++l) {
    const uint64_t hi = scale.upper[static_cast<size_t>(l - 1)];
    if (hi >= lo) {
      legend.push_back(absl::StrCat(cell(l, o.color ? 2 : 1), " ",
                                    lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi)));
      lo = hi + 1;
    }
  }
  absl::StrAppend(&out, "  scale", o.log_scale ? " (log)" : "", ": ", absl::StrJoin(legend, "  "),
                  " accesses per column\n");
}

// A value `field` held (from the value history) as its C type reads: "5 (was 4)", "-1",
// "0.25", "0x7ffd1230".
std::string ValueText(const FieldInfo& field, const ValueSample& s) {
  auto text = [&field](uint64_t bits) {
    return FieldValueText(field.type_name, field.size, field.bit_size, bits);
  };
  std::string t = text(s.value);
  if (s.old_value.has_value() && *s.old_value != s.value) {
    absl::StrAppend(&t, " (was ", text(*s.old_value), ")");
  }
  return t;
}

constexpr size_t kLastValues = 5;

void TextLastValues(View& v, const std::vector<FieldRow>& fields, std::string& out) {
  const StorageProfile& p = v.Profile();
  std::vector<std::vector<std::string>> rows = {
      {"field", "last values written (newest last)", "last written by"}};
  for (const FieldRow& row : fields) {
    const uint32_t f = row.field;
    std::vector<ValueSample> samples = p.FieldValues(f);
    std::erase_if(samples, [](const ValueSample& s) {
      return s.kind != core::AccessKind::kWrite || !s.exact;
    });
    if (samples.empty()) {
      continue;
    }
    const size_t from = samples.size() > kLastValues ? samples.size() - kLastValues : 0;
    std::vector<std::string> vals;
    for (size_t i = from; i < samples.size(); ++i) {
      vals.push_back(ValueText(p.fields()[f], samples[i]));
    }
    const ValueSample& last = samples.back();
    rows.push_back({Shown(p.fields()[f].path), absl::StrJoin(vals, ", "),
                    absl::StrCat("tid ", last.tid, " at ", v.Name(last.ip))});
  }
  if (rows.size() > 1) {
    absl::StrAppend(&out, "  values:\n", Table(rows, "lll", "    "));
  }
}

void TextWatch(View& v, const WatchRows& w, std::string& out) {
  const StorageProfile& p = v.Profile();
  const uint32_t obj = w.object;
  const WatchedObject& o = p.objects()[obj];
  const std::vector<FieldRow>& fields = w.fields;
  const bool filtered = !v.Options().field_filter.empty() || !v.Options().path_prefix.empty();
  if (fields.empty() && filtered) {
    return;
  }
  const ObjectStats& st = p.object_stats(obj);
  absl::StrAppend(&out, "\nwatch ", Shown(o.expr), " (",
                  o.type_name.empty() ? "" : Shown(o.type_name) + ", ", o.length, " bytes at ",
                  Hex(o.addr.value), "): ", Count(st.total.reads, "read"), ", ",
                  Count(st.total.writes, "write"));
  if (st.unattributed > 0) {
    absl::StrAppend(&out, ", ", st.unattributed, st.unattributed == 1 ? " access" : " accesses",
                    " outside its fields");
  }
  if (st.execs > 0) {
    absl::StrAppend(&out, ", ", Count(st.execs, "execution"));
  }
  absl::StrAppend(&out, "\n");
  std::vector<std::vector<std::string>> rows = {
      {"field", "offset", "size", "reads", "writes", "threads", "top site"}};
  for (const FieldRow& f : fields) {
    const FieldInfo& fi = p.fields()[f.field];
    rows.push_back({Shown(fi.path), OffsetText(fi), SizeText(fi), absl::StrCat(f.counts.reads),
                    absl::StrCat(f.counts.writes), absl::StrCat(f.threads), TopSiteText(v, f)});
  }
  absl::StrAppend(&out, Table(rows, "lrrrrrl", "  "));
  TextHeatmap(v, fields, out);

  // Top sites of the watch that touched a shown field, with the shown fields each touched.
  absl::StrAppend(&out, "  top sites", v.ThreadFilter() ? " (all threads)" : "", ":\n");
  rows = {{"reads", "writes", "site"}};
  size_t sites = 0;
  for (const SiteRow& s : w.sites) {
    if (s.fields.empty() || sites >= v.Options().top_sites) {
      continue;
    }
    ++sites;
    std::vector<std::string> paths;
    for (const uint32_t f : s.fields) {
      paths.push_back(Shown(p.fields()[f].path));
    }
    rows.push_back({absl::StrCat(s.site.counts.reads), absl::StrCat(s.site.counts.writes),
                    absl::StrCat(v.Name(s.site.ip), ": ", absl::StrJoin(paths, ", "))});
  }
  absl::StrAppend(&out, sites == 0 ? "    none\n" : Table(rows, "rrl", "    "));
  TextLastValues(v, fields, out);

  absl::StrAppend(&out, "  threads:\n");
  bool any = false;
  for (const ThreadRow& t : w.threads) {
    std::vector<std::vector<std::string>> trows = {{"field", "reads", "writes"}};
    for (const auto& [f, c] : t.fields) {
      trows.push_back({Shown(p.fields()[f].path), absl::StrCat(c.reads), absl::StrCat(c.writes)});
    }
    any = true;
    const ThreadInfo& ti = p.threads()[t.thread];
    const auto names = v.Options().task_names.find(ti.tid);
    absl::StrAppend(&out, "    tid ", ti.tid, " (pid ", ti.pid,
                    names == v.Options().task_names.end()
                        ? std::string()
                        : absl::StrCat(", ", Shown(absl::StrJoin(names->second, ", "))),
                    ")\n", Table(trows, "lrr", "      "));
  }
  if (!any) {
    absl::StrAppend(&out, "    none\n");
  }
}

void TextFalseSharing(View& v, std::string& out) {
  const StorageProfile& p = v.Profile();
  const std::vector<FalseSharingFinding>& found = v.Rows().false_sharing;
  absl::StrAppend(&out,
                  "\nfalse sharing (threads writing disjoint bytes of one 64-byte line within ",
                  FormatDuration(p.options().false_sharing_window_ns), "):\n");
  if (found.empty()) {
    absl::StrAppend(&out, "  no false sharing found\n");
    return;
  }
  const uint64_t start = p.options().start_ns;
  for (const auto& f : found) {
    absl::StrAppend(&out, "  line ", Hex(f.addr.value), ": ", f.false_transfers,
                    " false-sharing transfers (", f.true_transfers, " true-sharing) from ",
                    FormatSince(f.first_ns, start), " to ", FormatSince(f.last_ns, start), "\n");
    std::vector<std::string> fields;
    for (const uint32_t fi : f.fields) {
      const FieldInfo& info = p.fields()[fi];
      const uint64_t abs = p.objects()[info.object].addr.value + info.begin;
      fields.push_back(absl::StrCat(Shown(info.path), " (+", abs - f.addr.value, ", ",
                                    info.end - info.begin, ")"));
    }
    absl::StrAppend(&out, "    fields (+offset in line, bytes): ", absl::StrJoin(fields, ", "),
                    "\n");
    for (const auto& tw : f.threads) {
      std::vector<std::string> wrote;
      for (const auto& [field, n] : tw.fields) {
        wrote.push_back(absl::StrCat(Shown(p.fields()[field].path), " x", n));
      }
      std::vector<std::string> sites;
      for (const SiteCount& s : tw.top_sites) {
        sites.push_back(absl::StrCat(v.Name(s.ip), " x", s.counts.writes));
      }
      if (tw.other_sites.total() > 0) {
        sites.push_back(absl::StrCat("other x", tw.other_sites.total()));
      }
      absl::StrAppend(&out, "    tid ", tw.tid, ": ", Count(tw.writes, "write"), ": ",
                      absl::StrJoin(wrote, ", "), "\n      sites: ", absl::StrJoin(sites, ", "),
                      "\n");
    }
    if (!f.shared_fields.empty()) {
      std::vector<std::string> shared;
      for (const uint32_t fi : f.shared_fields) {
        shared.push_back(Shown(p.fields()[fi].path));
      }
      absl::StrAppend(&out, "    written by more than one thread: ", absl::StrJoin(shared, ", "),
                      "\n");
    }
  }
}

std::string CsvCell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) {
    return s;
  }
  std::string q = "\"";
  for (const char c : s) {
    q += c;
    if (c == '"') {
      q += '"';
    }
  }
  return q + "\"";
}

}  // namespace

int TerminalWidth(FILE* out) {
  winsize ws{};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) {
    return ws.ws_col;
  }
  if (const char* env = std::getenv("COLUMNS"); env != nullptr) {
    int n = 0;
    if (absl::SimpleAtoi(env, &n) && n >= 40) {
      return n;
    }
  }
  return 100;
}

std::string RenderText(const StorageProfile& profile, const SiteNamer& namer,
                       const ReportRenderOptions& opts) {
  View v(profile, namer, opts);
  std::string out;
  const uint64_t counted = profile.events() - profile.ignored_events();
  if (counted == 0) {
    absl::StrAppend(&out, "storage profile: no events\n");
  } else {
    absl::StrAppend(&out, "storage profile: ", Count(counted, "event"), " from ",
                    Count(profile.threads().size(), "thread"), ", ",
                    FormatSince(profile.first_ns(), profile.options().start_ns), " to ",
                    FormatSince(profile.last_ns(), profile.options().start_ns),
                    " after the start\n");
  }
  for (const WatchRows& w : v.Rows().watches) {
    TextWatch(v, w, out);
  }
  TextFalseSharing(v, out);
  return out;
}

namespace {

// The field's newest `n` recorded values, oldest first.
Json LastValuesJson(const StorageProfile& p, uint32_t field, size_t n) {
  const std::vector<ValueSample> samples = p.FieldValues(field);
  Json out = Json::array();
  for (size_t i = samples.size() > n ? samples.size() - n : 0; i < samples.size(); ++i) {
    const ValueSample& s = samples[i];
    Json j{{"time_ns", SinceNs(s.time_ns, p.options().start_ns)},
           {"tid", s.tid},
           {"ip", Hex(s.ip.value)},
           {"kind", s.kind == core::AccessKind::kWrite ? "w" : "r"},
           {"exact", s.exact},
           {"value", s.value}};
    if (s.old_value.has_value()) {
      j["old_value"] = *s.old_value;
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

namespace {

// The report's JSON in parts, so that it is built whole (RenderJson) or written a field at a
// time (WriteJson).
class JsonParts {
 public:
  explicit JsonParts(View& v) : v_(v), p_(v.Profile()), start_(p_.options().start_ns) {}

  // start_ns, events, ignored_events, duration_ns.
  Json Root() const {
    return Json{{"start_ns", start_},
                {"events", p_.events()},
                {"ignored_events", p_.ignored_events()},
                {"duration_ns", p_.last_ns() > start_ ? p_.last_ns() - start_ : 0}};
  }

  // A watch without its "fields", "heatmap" and "threads".
  Json WatchHead(const WatchRows& w) {
    const WatchedObject& o = p_.objects()[w.object];
    const ObjectStats& st = p_.object_stats(w.object);
    Json jw{{"id", o.id},
            {"expr", o.expr},
            {"address", Hex(o.addr.value)},
            {"length", o.length},
            {"type", o.type_name},
            {"reads", st.total.reads},
            {"writes", st.total.writes},
            {"unattributed", st.unattributed}};
    Json top = Json::array();
    for (const SiteRow& s : w.sites) {
      if (top.size() < v_.Options().top_sites) {
        top.push_back(v_.SiteJson(s.site));
      }
    }
    jw["top_sites"] = std::move(top);
    return jw;
  }

  // An element of a watch's "threads".
  Json Thread(const ThreadRow& t) const {
    Json tf = Json::array();
    for (const auto& [f, c] : t.fields) {
      tf.push_back(Json{{"path", p_.fields()[f].path}, {"reads", c.reads}, {"writes", c.writes}});
    }
    const ThreadInfo& ti = p_.threads()[t.thread];
    Json th{{"tid", ti.tid},
            {"pid", ti.pid},
            {"reads", t.total.reads},
            {"writes", t.total.writes},
            {"fields", std::move(tf)}};
    const auto& names = v_.Options().task_names;
    if (auto it = names.find(ti.tid); it != names.end()) {
      th["comm"] = absl::StrJoin(it->second, ", ");
    }
    return th;
  }

  // An element of a watch's "fields".
  Json Field(const FieldRow& r) {
    const FieldInfo& fi = p_.fields()[r.field];
    Json sites = Json::array();
    for (const SiteCount& s : r.sites) {
      if (sites.size() < v_.Options().top_sites) {
        sites.push_back(v_.SiteJson(s));
      }
    }
    const RwCounts& c = r.counts;
    const RwCounts& other = r.other_sites;
    return Json{{"path", fi.path},
                {"type", fi.type_name},
                {"offset", fi.offset},
                {"size", fi.size},
                {"bit_offset", fi.bit_offset},
                {"bit_size", fi.bit_size},
                {"reads", c.reads},
                {"writes", c.writes},
                {"threads", r.threads},
                {"top_sites", std::move(sites)},
                {"other_sites", {{"reads", other.reads}, {"writes", other.writes}}},
                {"last_values", LastValuesJson(p_, r.field, v_.Options().top_sites)}};
  }

  // A watch's "heatmap" without its "rows".
  Json HeatHead() const {
    const TimeBins& bins = p_.bins();
    return Json{{"bucket_ns", bins.width_ns()},
                {"first_column_ns", bins.ColumnStartNs(0)},
                {"columns", bins.columns()}};
  }

  // An element of a heatmap's "rows" (a field without accesses keeps no columns: zeros).
  Json HeatRow(const FieldRow& r) const {
    const auto heat = [&](const std::vector<uint64_t>& v) {
      return v.empty() ? Json(std::vector<uint64_t>(p_.bins().columns(), 0)) : Json(v);
    };
    return Json{
        {"path", p_.fields()[r.field].path}, {"reads", heat(r.reads)}, {"writes", heat(r.writes)}};
  }

  // A false-sharing finding without its "threads".
  Json FindingHead(const FalseSharingFinding& f) const {
    Json jf{{"line", Hex(f.addr.value)},
            {"false_transfers", f.false_transfers},
            {"true_transfers", f.true_transfers},
            {"first_ns", SinceNs(f.first_ns, start_)},
            {"last_ns", SinceNs(f.last_ns, start_)}};
    Json fields = Json::array();
    for (const uint32_t fi : f.fields) {
      const FieldInfo& info = p_.fields()[fi];
      fields.push_back(Json{{"path", info.path},
                            {"address", Hex(p_.objects()[info.object].addr.value + info.begin)},
                            {"size", info.end - info.begin}});
    }
    jf["fields"] = std::move(fields);
    Json shared = Json::array();
    for (const uint32_t fi : f.shared_fields) {
      shared.push_back(p_.fields()[fi].path);
    }
    jf["shared_fields"] = std::move(shared);
    return jf;
  }

  // An element of a finding's "threads".
  Json FindingThread(const FalseSharingFinding::ThreadWrites& tw) {
    Json wf = Json::array();
    for (const auto& [field, n] : tw.fields) {
      wf.push_back(Json{{"path", p_.fields()[field].path}, {"writes", n}});
    }
    Json sites = Json::array();
    for (const SiteCount& s : tw.top_sites) {
      sites.push_back(v_.SiteJson(s));
    }
    return Json{{"tid", tw.tid},
                {"writes", tw.writes},
                {"fields", std::move(wf)},
                {"top_sites", std::move(sites)}};
  }

 private:
  View& v_;
  const StorageProfile& p_;
  uint64_t start_;
};

// Writes JSON as nlohmann's dump(2, ' ', ensure_ascii, replace) does, a member or an element at
// a time: values that are whole Json objects are dumped, the big ones are written by callbacks.
class JsonWriter {
 public:
  using Member = std::function<void(int depth)>;

  explicit JsonWriter(FILE* out) : out_(out) {}

  // `value` at nesting `depth` (its first line is already indented).
  void Value(const Json& value, int depth) {
    const std::string s = value.dump(2, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
    const std::string pad = Pad(depth);
    size_t from = 0;
    for (size_t nl = s.find('\n'); nl != std::string::npos; nl = s.find('\n', from)) {
      Put(s.substr(from, nl + 1 - from));
      Put(pad);
      from = nl + 1;
    }
    Put(s.substr(from));
  }

  // An object of `small`'s members and the `big` ones (written by their callbacks), in key
  // order (nlohmann's objects are ordered by key).
  void Object(const Json& small, const std::map<std::string, Member>& big, int depth) {
    std::vector<std::pair<std::string, Member>> members;
    for (auto it = small.begin(); it != small.end(); ++it) {
      const Json* value = &*it;
      members.emplace_back(it.key(), [this, value](int d) { Value(*value, d); });
    }
    for (const auto& [key, fn] : big) {
      members.emplace_back(key, fn);
    }
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    if (members.empty()) {
      Put("{}");
      return;
    }
    Put("{");
    for (size_t i = 0; i < members.size(); ++i) {
      Put(i == 0 ? "\n" : ",\n");
      Put(Pad(depth + 1));
      Put(Json(members[i].first).dump(-1, ' ', true, Json::error_handler_t::replace));
      Put(": ");
      members[i].second(depth + 1);
    }
    Put("\n" + Pad(depth) + "}");
  }

  // An array of `n` elements, element(i, depth) writing each.
  void Array(size_t n, const std::function<void(size_t, int)>& element, int depth) {
    if (n == 0) {
      Put("[]");
      return;
    }
    Put("[");
    for (size_t i = 0; i < n; ++i) {
      Put(i == 0 ? "\n" : ",\n");
      Put(Pad(depth + 1));
      element(i, depth + 1);
    }
    Put("\n" + Pad(depth) + "]");
  }

  void Put(const std::string& s) { std::fwrite(s.data(), 1, s.size(), out_); }

 private:
  static std::string Pad(int depth) {
    std::string pad(static_cast<size_t>(depth) * 2, ' ');
    return pad;
  }

  FILE* out_;
};

}  // namespace

nlohmann::json RenderJson(const StorageProfile& profile, const SiteNamer& namer,
                          const ReportRenderOptions& opts) {
  View v(profile, namer, opts);
  JsonParts parts(v);
  Json root = parts.Root();
  Json watches = Json::array();
  for (const WatchRows& w : v.Rows().watches) {
    Json jw = parts.WatchHead(w);
    Json fields = Json::array();
    Json rows = Json::array();
    for (const FieldRow& r : w.fields) {
      fields.push_back(parts.Field(r));
      rows.push_back(parts.HeatRow(r));
    }
    jw["fields"] = std::move(fields);
    Json heat = parts.HeatHead();
    heat["rows"] = std::move(rows);
    jw["heatmap"] = std::move(heat);
    Json threads = Json::array();
    for (const ThreadRow& t : w.threads) {
      threads.push_back(parts.Thread(t));
    }
    jw["threads"] = std::move(threads);
    watches.push_back(std::move(jw));
  }
  root["watches"] = std::move(watches);
  Json findings = Json::array();
  for (const FalseSharingFinding& f : v.Rows().false_sharing) {
    Json jf = parts.FindingHead(f);
    Json threads = Json::array();
    for (const auto& tw : f.threads) {
      threads.push_back(parts.FindingThread(tw));
    }
    jf["threads"] = std::move(threads);
    findings.push_back(std::move(jf));
  }
  root["false_sharing"] = std::move(findings);
  return root;
}

void WriteJson(const StorageProfile& profile, const SiteNamer& namer,
               const ReportRenderOptions& opts, const nlohmann::json& extra, FILE* out) {
  View v(profile, namer, opts);
  JsonParts parts(v);
  JsonWriter w(out);
  Json small = parts.Root();
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    small[it.key()] = *it;
  }
  // An array of `n` elements, each the Json element(i) makes.
  const auto array = [&w](size_t n, const std::function<Json(size_t)>& element) {
    return [&w, n, element](int depth) {
      w.Array(
          n, [&](size_t i, int d) { w.Value(element(i), d); }, depth);
    };
  };
  const std::vector<WatchRows>& watches = v.Rows().watches;
  const std::vector<FalseSharingFinding>& findings = v.Rows().false_sharing;
  const auto watch = [&](size_t i, int depth) {
    const WatchRows& wr = watches[i];
    const auto heatmap = [&](int d) {
      w.Object(parts.HeatHead(),
               {{"rows",
                 array(wr.fields.size(), [&](size_t k) { return parts.HeatRow(wr.fields[k]); })}},
               d);
    };
    w.Object(
        parts.WatchHead(wr),
        {{"fields", array(wr.fields.size(), [&](size_t k) { return parts.Field(wr.fields[k]); })},
         {"heatmap", heatmap},
         {"threads",
          array(wr.threads.size(), [&](size_t k) { return parts.Thread(wr.threads[k]); })}},
        depth);
  };
  const auto finding = [&](size_t i, int depth) {
    const FalseSharingFinding& f = findings[i];
    w.Object(parts.FindingHead(f),
             {{"threads", array(f.threads.size(),
                                [&](size_t k) { return parts.FindingThread(f.threads[k]); })}},
             depth);
  };
  w.Object(small,
           {{"watches", [&](int depth) { w.Array(watches.size(), watch, depth); }},
            {"false_sharing", [&](int depth) { w.Array(findings.size(), finding, depth); }}},
           0);
  w.Put("\n");
}

std::string RenderCsv(const StorageProfile& profile, const SiteNamer& namer,
                      const ReportRenderOptions& opts) {
  View v(profile, namer, opts);
  std::string out = "watch,field,offset,size,reads,writes,threads,top_site\n";
  for (const WatchRows& w : v.Rows().watches) {
    for (const FieldRow& r : w.fields) {
      const FieldInfo& fi = profile.fields()[r.field];
      const RwCounts& c = r.counts;
      const std::vector<std::string> cells = {profile.objects()[w.object].expr,
                                              fi.path,
                                              OffsetText(fi),
                                              SizeText(fi),
                                              absl::StrCat(c.reads),
                                              absl::StrCat(c.writes),
                                              absl::StrCat(r.threads),
                                              TopSiteText(v, r)};
      std::vector<std::string> quoted;
      quoted.reserve(cells.size());
      for (const std::string& s : cells) {
        quoted.push_back(CsvCell(Shown(s)));
      }
      absl::StrAppend(&out, absl::StrJoin(quoted, ","), "\n");
    }
  }
  return out;
}

}  // namespace kwatch::watch::profile
