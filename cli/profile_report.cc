#include "cli/profile_report.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "watch/profile/duration.h"
#include "watch/profile/heat_scale.h"

namespace kwatch::cli {
namespace {

using Json = nlohmann::json;
using watch::FieldInfo;
using watch::FormatDuration;
using watch::RwCounts;
using watch::SiteCount;
using watch::StorageProfile;

constexpr std::array<const char*, 4> kShades = {"░", "▒", "▓", "█"};
constexpr std::array<int, 6> kColours = {226, 220, 214, 208, 202, 196};  // xterm-256: yellow to red

std::string Hex(uint64_t v) {
  return absl::StrFormat("0x%x", v);
}

// "1 write", "2 writes".
std::string Count(uint64_t n, const char* noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// Display width of a UTF-8 string (code points; the report's own text has no wide glyphs).
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (const char c : s) {
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80 ? 1 : 0;
  }
  return n;
}

// What the options select from the profile, with the counts they imply.
class View {
 public:
  View(const StorageProfile& p, const SiteNamer& namer, const ReportRenderOptions& o)
      : p_(p), namer_(namer), o_(o), thread_on_(p.threads().size(), o.threads.empty()) {
    for (const pid_t tid : o.threads) {
      const uint32_t t = p.ThreadIndex(tid);
      if (t != StorageProfile::kNone) {
        thread_on_[t] = true;
      }
    }
  }

  const StorageProfile& Profile() const { return p_; }
  const ReportRenderOptions& Options() const { return o_; }
  bool ThreadFilter() const { return !o_.threads.empty(); }
  bool ThreadShown(uint32_t t) const { return thread_on_[t]; }

  bool FieldShown(uint32_t f) const {
    const std::string& path = p_.fields()[f].path;
    if (!o_.field_filter.empty() && !absl::StrContains(path, o_.field_filter)) {
      return false;
    }
    if (!o_.path_prefix.empty()) {
      if (!absl::StartsWith(path, o_.path_prefix)) {
        return false;
      }
      const size_t n = o_.path_prefix.size();
      if (path.size() > n && path[n] != '.' && path[n] != '[' && path.compare(n, 2, "->") != 0) {
        return false;
      }
    }
    return true;
  }

  std::vector<uint32_t> Fields(uint32_t obj) const {
    std::vector<uint32_t> out;
    const auto [begin, end] = p_.FieldRange(obj);
    for (uint32_t f = begin; f < end; ++f) {
      if (FieldShown(f)) {
        out.push_back(f);
      }
    }
    return out;
  }

  RwCounts Counts(uint32_t f) const {
    if (!ThreadFilter()) {
      return p_.field_counts(f);
    }
    RwCounts c;
    for (uint32_t t = 0; t < thread_on_.size(); ++t) {
      if (thread_on_[t]) {
        c += p_.ThreadFieldCounts(t, f);
      }
    }
    return c;
  }

  uint32_t Threads(uint32_t f) const {
    uint32_t n = 0;
    for (uint32_t t = 0; t < thread_on_.size(); ++t) {
      n += thread_on_[t] && p_.ThreadFieldCounts(t, f).total() > 0 ? 1 : 0;
    }
    return n;
  }

  // Per time column: reads, writes or both.
  std::vector<uint64_t> Heat(uint32_t f, bool reads, bool writes) const {
    std::vector<uint64_t> out(p_.bins().columns(), 0);
    auto add = [&out](const auto& row) {
      for (size_t c = 0; c < out.size(); ++c) {
        out[c] += row[c];
      }
    };
    for (const bool w : {false, true}) {
      if ((w && !writes) || (!w && !reads)) {
        continue;
      }
      if (!ThreadFilter()) {
        add(p_.FieldBins(f, w));
        continue;
      }
      for (uint32_t t = 0; t < thread_on_.size(); ++t) {
        if (thread_on_[t]) {
          add(p_.ThreadFieldBins(t, f, w));
        }
      }
    }
    return out;
  }

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
                      : n.offset == 0    ? n.function
                                         : absl::StrCat(n.function, "+", Hex(n.offset));
    if (!n.file.empty()) {
      const size_t slash = n.file.rfind('/');
      absl::StrAppend(&out, " (", slash == std::string::npos ? n.file : n.file.substr(slash + 1),
                      ":", n.line, ")");
    }
    return out;
  }

  Json SiteJson(const SiteCount& s) {
    const SiteName& loc = Locate(s.ip);
    return Json{{"ip", Hex(s.ip.value)},   {"function", loc.function}, {"offset", loc.offset},
                {"file", loc.file},        {"line", loc.line},         {"count", s.counts.total()},
                {"reads", s.counts.reads}, {"writes", s.counts.writes}};
  }

  // Findings involving a shown thread.
  std::vector<watch::FalseSharingFinding> FalseSharing() const {
    std::vector<watch::FalseSharingFinding> out;
    for (auto& f : p_.FalseSharing(o_.top_sites)) {
      const bool shown = std::any_of(f.threads.begin(), f.threads.end(),
                                     [&](const auto& tw) { return thread_on_[tw.thread]; });
      if (shown) {
        out.push_back(std::move(f));
      }
    }
    return out;
  }

 private:
  const StorageProfile& p_;
  const SiteNamer& namer_;
  const ReportRenderOptions& o_;
  std::vector<bool> thread_on_;
  absl::flat_hash_map<core::RemoteAddr, SiteName> names_;
};

std::string OffsetText(const FieldInfo& f) {
  return f.bit_size > 0 ? absl::StrCat(f.offset, ":", f.bit_offset) : absl::StrCat(f.offset);
}
std::string SizeText(const FieldInfo& f) {
  return f.bit_size > 0 ? absl::StrCat(f.bit_size, "b") : absl::StrCat(f.size);
}
std::string TopSiteText(View& v, uint32_t f) {
  const std::vector<SiteCount> sites = v.Profile().FieldSites(f);
  if (!sites.empty()) {
    return v.Name(sites[0].ip);
  }
  return v.Profile().FieldOtherSites(f).total() > 0 ? "(other)" : "-";
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

void TextHeatmap(View& v, const std::vector<uint32_t>& fields, std::string& out) {
  const StorageProfile& p = v.Profile();
  const watch::TimeBins& bins = p.bins();
  const ReportRenderOptions& o = v.Options();
  if (bins.columns() == 0) {
    absl::StrAppend(&out, "  heatmap: no accesses in the time window\n");
    return;
  }
  size_t label = 0;
  for (const uint32_t f : fields) {
    label = std::max(label, Columns(p.fields()[f].path));
  }
  const size_t prefix = 2 + label + 2;
  const size_t avail = std::max<size_t>(10, static_cast<size_t>(std::max(o.width, 0)) > prefix + 1
                                                ? static_cast<size_t>(o.width) - prefix - 1
                                                : 0);
  const size_t group = (bins.columns() + avail - 1) / avail;
  const size_t ncols = (bins.columns() + group - 1) / group;
  std::vector<std::vector<uint64_t>> cells;
  uint64_t max = 0;
  for (const uint32_t f : fields) {
    const std::vector<uint64_t> heat = v.Heat(f, true, true);
    std::vector<uint64_t> row(ncols, 0);
    for (size_t c = 0; c < heat.size(); ++c) {
      row[c / group] += heat[c];
    }
    max = std::max(max, *std::max_element(row.begin(), row.end()));
    cells.push_back(std::move(row));
  }
  const int levels = o.color ? 6 : 4;
  const watch::HeatLevels scale = watch::MakeHeatLevels(
      max, levels, o.log_scale ? watch::HeatScale::kLog : watch::HeatScale::kLinear);
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
    std::string line = absl::StrCat("  ", Pad(p.fields()[fields[i]].path, label), "  |");
    for (const uint64_t c : cells[i]) {
      line += cell(watch::HeatLevel(scale, c), 1);
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

// The last values each field held (from the value history), newest last: "5 (was 4)".
std::string ValueText(const watch::ValueSample& s) {
  std::string t = absl::StrCat(static_cast<int64_t>(s.value));
  if (s.old_value.has_value() && *s.old_value != s.value) {
    absl::StrAppend(&t, " (was ", static_cast<int64_t>(*s.old_value), ")");
  }
  return t;
}

constexpr size_t kLastValues = 5;

void TextLastValues(View& v, const std::vector<uint32_t>& fields, std::string& out) {
  const StorageProfile& p = v.Profile();
  std::vector<std::vector<std::string>> rows = {
      {"field", "last values written (newest last)", "last written by"}};
  for (const uint32_t f : fields) {
    std::vector<watch::ValueSample> samples = p.FieldValues(f);
    std::erase_if(samples, [](const watch::ValueSample& s) {
      return s.kind != core::AccessKind::kWrite || !s.exact;
    });
    if (samples.empty()) {
      continue;
    }
    const size_t from = samples.size() > kLastValues ? samples.size() - kLastValues : 0;
    std::vector<std::string> vals;
    for (size_t i = from; i < samples.size(); ++i) {
      vals.push_back(ValueText(samples[i]));
    }
    const watch::ValueSample& last = samples.back();
    rows.push_back({p.fields()[f].path, absl::StrJoin(vals, ", "),
                    absl::StrCat("tid ", last.tid, " at ", v.Name(last.ip))});
  }
  if (rows.size() > 1) {
    absl::StrAppend(&out, "  values:\n", Table(rows, "lll", "    "));
  }
}

void TextWatch(View& v, uint32_t obj, std::string& out) {
  const StorageProfile& p = v.Profile();
  const watch::WatchedObject& o = p.objects()[obj];
  const std::vector<uint32_t> fields = v.Fields(obj);
  const bool filtered = !v.Options().field_filter.empty() || !v.Options().path_prefix.empty();
  if (fields.empty() && filtered) {
    return;
  }
  const watch::ObjectStats& st = p.object_stats(obj);
  absl::StrAppend(&out, "\nwatch ", o.expr, " (", o.type_name.empty() ? "" : o.type_name + ", ",
                  o.length, " bytes at ", Hex(o.addr.value), "): ", Count(st.total.reads, "read"),
                  ", ", Count(st.total.writes, "write"));
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
  for (const uint32_t f : fields) {
    const FieldInfo& fi = p.fields()[f];
    const RwCounts c = v.Counts(f);
    rows.push_back({fi.path, OffsetText(fi), SizeText(fi), absl::StrCat(c.reads),
                    absl::StrCat(c.writes), absl::StrCat(v.Threads(f)), TopSiteText(v, f)});
  }
  absl::StrAppend(&out, Table(rows, "lrrrrrl", "  "));
  TextHeatmap(v, fields, out);

  // Top sites of the watch, with the shown fields each touched.
  absl::flat_hash_map<core::RemoteAddr, std::vector<std::string>> site_fields;
  for (const uint32_t f : fields) {
    for (const SiteCount& s : p.FieldSites(f)) {
      site_fields[s.ip].push_back(p.fields()[f].path);
    }
  }
  std::vector<SiteCount> sites;
  for (const SiteCount& s : p.ObjectSites(obj)) {
    if (site_fields.contains(s.ip) && sites.size() < v.Options().top_sites) {
      sites.push_back(s);
    }
  }
  absl::StrAppend(&out, "  top sites", v.ThreadFilter() ? " (all threads)" : "", ":\n");
  rows = {{"reads", "writes", "site"}};
  for (const SiteCount& s : sites) {
    rows.push_back({absl::StrCat(s.counts.reads), absl::StrCat(s.counts.writes),
                    absl::StrCat(v.Name(s.ip), ": ", absl::StrJoin(site_fields[s.ip], ", "))});
  }
  absl::StrAppend(&out, sites.empty() ? "    none\n" : Table(rows, "rrl", "    "));
  TextLastValues(v, fields, out);

  absl::StrAppend(&out, "  threads:\n");
  bool any = false;
  for (uint32_t t = 0; t < p.threads().size(); ++t) {
    if (!v.ThreadShown(t)) {
      continue;
    }
    std::vector<std::vector<std::string>> trows;
    for (const uint32_t f : fields) {
      const RwCounts& c = p.ThreadFieldCounts(t, f);
      if (c.total() > 0) {
        trows.push_back({p.fields()[f].path, absl::StrCat(c.reads), absl::StrCat(c.writes)});
      }
    }
    if (trows.empty()) {
      continue;
    }
    trows.insert(trows.begin(), {"field", "reads", "writes"});
    any = true;
    const watch::ThreadInfo& ti = p.threads()[t];
    const auto names = v.Options().task_names.find(ti.tid);
    absl::StrAppend(&out, "    tid ", ti.tid, " (pid ", ti.pid,
                    names == v.Options().task_names.end()
                        ? std::string()
                        : absl::StrCat(", ", absl::StrJoin(names->second, ", ")),
                    ")\n", Table(trows, "lrr", "      "));
  }
  if (!any) {
    absl::StrAppend(&out, "    none\n");
  }
}

void TextFalseSharing(View& v, std::string& out) {
  const StorageProfile& p = v.Profile();
  const std::vector<watch::FalseSharingFinding> found = v.FalseSharing();
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
                    FormatDuration(f.first_ns - start), " to ", FormatDuration(f.last_ns - start),
                    "\n");
    std::vector<std::string> fields;
    for (const uint32_t fi : f.fields) {
      const FieldInfo& info = p.fields()[fi];
      const uint64_t abs = p.objects()[info.object].addr.value + info.begin;
      fields.push_back(
          absl::StrCat(info.path, " (+", abs - f.addr.value, ", ", info.end - info.begin, ")"));
    }
    absl::StrAppend(&out, "    fields (+offset in line, bytes): ", absl::StrJoin(fields, ", "),
                    "\n");
    for (const auto& tw : f.threads) {
      std::vector<std::string> wrote;
      for (const auto& [field, n] : tw.fields) {
        wrote.push_back(absl::StrCat(p.fields()[field].path, " x", n));
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
        shared.push_back(p.fields()[fi].path);
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
                    FormatDuration(profile.first_ns() - profile.options().start_ns), " to ",
                    FormatDuration(profile.last_ns() - profile.options().start_ns),
                    " after the start\n");
  }
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    TextWatch(v, obj, out);
  }
  TextFalseSharing(v, out);
  return out;
}

namespace {

// The field's newest `n` recorded values, oldest first.
Json LastValuesJson(const StorageProfile& p, uint32_t field, size_t n) {
  const std::vector<watch::ValueSample> samples = p.FieldValues(field);
  Json out = Json::array();
  for (size_t i = samples.size() > n ? samples.size() - n : 0; i < samples.size(); ++i) {
    const watch::ValueSample& s = samples[i];
    Json j{{"time_ns", s.time_ns - p.options().start_ns},
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

nlohmann::json RenderJson(const StorageProfile& profile, const SiteNamer& namer,
                          const ReportRenderOptions& opts) {
  View v(profile, namer, opts);
  const uint64_t start = profile.options().start_ns;
  Json root{{"start_ns", start},
            {"events", profile.events()},
            {"ignored_events", profile.ignored_events()},
            {"duration_ns", profile.last_ns() > start ? profile.last_ns() - start : 0}};
  Json watches = Json::array();
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    const watch::WatchedObject& o = profile.objects()[obj];
    const watch::ObjectStats& st = profile.object_stats(obj);
    const std::vector<uint32_t> fields = v.Fields(obj);
    Json jw{{"id", o.id},
            {"expr", o.expr},
            {"address", Hex(o.addr.value)},
            {"length", o.length},
            {"type", o.type_name},
            {"reads", st.total.reads},
            {"writes", st.total.writes},
            {"unattributed", st.unattributed}};
    Json jfields = Json::array();
    Json rows = Json::array();
    for (const uint32_t f : fields) {
      const FieldInfo& fi = profile.fields()[f];
      const RwCounts c = v.Counts(f);
      Json sites = Json::array();
      for (const SiteCount& s : profile.FieldSites(f)) {
        if (sites.size() < opts.top_sites) {
          sites.push_back(v.SiteJson(s));
        }
      }
      const RwCounts& other = profile.FieldOtherSites(f);
      jfields.push_back(Json{{"path", fi.path},
                             {"type", fi.type_name},
                             {"offset", fi.offset},
                             {"size", fi.size},
                             {"bit_offset", fi.bit_offset},
                             {"bit_size", fi.bit_size},
                             {"reads", c.reads},
                             {"writes", c.writes},
                             {"threads", v.Threads(f)},
                             {"top_sites", std::move(sites)},
                             {"other_sites", {{"reads", other.reads}, {"writes", other.writes}}},
                             {"last_values", LastValuesJson(profile, f, v.Options().top_sites)}});
      rows.push_back(Json{{"path", fi.path},
                          {"reads", v.Heat(f, true, false)},
                          {"writes", v.Heat(f, false, true)}});
    }
    jw["fields"] = std::move(jfields);
    const watch::TimeBins& bins = profile.bins();
    jw["heatmap"] = Json{{"bucket_ns", bins.width_ns()},
                         {"first_column_ns", bins.ColumnStartNs(0)},
                         {"columns", bins.columns()},
                         {"rows", std::move(rows)}};
    Json threads = Json::array();
    for (uint32_t t = 0; t < profile.threads().size(); ++t) {
      if (!v.ThreadShown(t)) {
        continue;
      }
      RwCounts total;
      Json tf = Json::array();
      for (const uint32_t f : fields) {
        const RwCounts& c = profile.ThreadFieldCounts(t, f);
        if (c.total() > 0) {
          total += c;
          tf.push_back(
              Json{{"path", profile.fields()[f].path}, {"reads", c.reads}, {"writes", c.writes}});
        }
      }
      if (!tf.empty()) {
        const watch::ThreadInfo& ti = profile.threads()[t];
        Json th{{"tid", ti.tid},
                {"pid", ti.pid},
                {"reads", total.reads},
                {"writes", total.writes},
                {"fields", std::move(tf)}};
        if (auto names = opts.task_names.find(ti.tid); names != opts.task_names.end()) {
          th["comm"] = absl::StrJoin(names->second, ", ");
        }
        threads.push_back(std::move(th));
      }
    }
    jw["threads"] = std::move(threads);
    Json top = Json::array();
    for (const SiteCount& s : profile.ObjectSites(obj)) {
      if (top.size() < opts.top_sites) {
        top.push_back(v.SiteJson(s));
      }
    }
    jw["top_sites"] = std::move(top);
    watches.push_back(std::move(jw));
  }
  root["watches"] = std::move(watches);
  Json fs = Json::array();
  for (const auto& f : v.FalseSharing()) {
    Json jf{{"line", Hex(f.addr.value)},
            {"false_transfers", f.false_transfers},
            {"true_transfers", f.true_transfers},
            {"first_ns", f.first_ns - start},
            {"last_ns", f.last_ns - start}};
    Json fields = Json::array();
    for (const uint32_t fi : f.fields) {
      const FieldInfo& info = profile.fields()[fi];
      fields.push_back(
          Json{{"path", info.path},
               {"address", Hex(profile.objects()[info.object].addr.value + info.begin)},
               {"size", info.end - info.begin}});
    }
    jf["fields"] = std::move(fields);
    Json shared = Json::array();
    for (const uint32_t fi : f.shared_fields) {
      shared.push_back(profile.fields()[fi].path);
    }
    jf["shared_fields"] = std::move(shared);
    Json threads = Json::array();
    for (const auto& tw : f.threads) {
      Json wf = Json::array();
      for (const auto& [field, n] : tw.fields) {
        wf.push_back(Json{{"path", profile.fields()[field].path}, {"writes", n}});
      }
      Json sites = Json::array();
      for (const SiteCount& s : tw.top_sites) {
        sites.push_back(v.SiteJson(s));
      }
      threads.push_back(Json{{"tid", tw.tid},
                             {"writes", tw.writes},
                             {"fields", std::move(wf)},
                             {"top_sites", std::move(sites)}});
    }
    jf["threads"] = std::move(threads);
    fs.push_back(std::move(jf));
  }
  root["false_sharing"] = std::move(fs);
  return root;
}

std::string RenderCsv(const StorageProfile& profile, const SiteNamer& namer,
                      const ReportRenderOptions& opts) {
  View v(profile, namer, opts);
  std::string out = "watch,field,offset,size,reads,writes,threads,top_site\n";
  for (uint32_t obj = 0; obj < profile.objects().size(); ++obj) {
    for (const uint32_t f : v.Fields(obj)) {
      const FieldInfo& fi = profile.fields()[f];
      const RwCounts c = v.Counts(f);
      const std::vector<std::string> cells = {profile.objects()[obj].expr,
                                              fi.path,
                                              OffsetText(fi),
                                              SizeText(fi),
                                              absl::StrCat(c.reads),
                                              absl::StrCat(c.writes),
                                              absl::StrCat(v.Threads(f)),
                                              TopSiteText(v, f)};
      std::vector<std::string> quoted;
      quoted.reserve(cells.size());
      for (const std::string& s : cells) {
        quoted.push_back(CsvCell(s));
      }
      absl::StrAppend(&out, absl::StrJoin(quoted, ","), "\n");
    }
  }
  return out;
}

}  // namespace kwatch::cli
