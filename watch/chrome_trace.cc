#include "watch/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/symbols/type_layout.h"
#include "watch/value_text.h"

namespace kwatch::watch {

namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMinBucketNs = 1'000'000;  // 1 ms
constexpr uint64_t kCutShortBucketNs = 10'000'000;
constexpr uint64_t kBinsPerSession = 200;

std::string Hex(uint64_t v) {
  return absl::StrFormat("0x%x", v);
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "func+0x1a (file.c:42)" as the live lines show a site, else the address.
std::string SiteText(const core::store::TraceReader& r, core::RemoteAddr ip) {
  const core::store::SiteRecord* s = r.FindSite(ip);
  if (s == nullptr || s->function.empty()) {
    return Hex(ip.value);
  }
  std::string text = absl::StrFormat("%s+0x%x", s->function, s->offset);
  if (!s->file.empty()) {
    absl::StrAppend(&text, " (", Basename(s->file), ":", s->line, ")");
  }
  return text;
}

// Writes the trace events of one document, one per line, counting them.
class TraceOut {
 public:
  TraceOut(FILE* out, uint64_t start_ns) : out_(out), start_ns_(start_ns) {}

  void Open() { std::fputs("{\"traceEvents\":[", out_); }

  void Put(const Json& ev) {
    std::fputs(first_ ? "\n" : ",\n", out_);  // one event a line; ASCII only, as --format json
    first_ = false;
    const std::string s = ev.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
    std::fwrite(s.data(), 1, s.size(), out_);
  }

  absl::Status Close() {
    std::fputs("\n],\"displayTimeUnit\":\"ns\"}\n", out_);
    if (std::fflush(out_) != 0 || std::ferror(out_) != 0) {
      const int err = errno;
      return absl::ErrnoToStatus(err, "writing the chrome trace");
    }
    return absl::OkStatus();
  }

  // Microseconds from the session's start (negative before it).
  double Ts(uint64_t time_ns) const {
    return static_cast<double>(static_cast<int64_t>(time_ns - start_ns_)) / 1e3;
  }

 private:
  FILE* out_;
  uint64_t start_ns_;
  bool first_ = true;
};

// The process and thread tracks, each named once, when it first makes an event.
class Tracks {
 public:
  Tracks(const core::store::TraceReader& r, TraceOut& out, ChromeTraceCounts& counts)
      : out_(out), counts_(counts), target_(r.session().pid) {
    for (const core::store::TaskRecord& t : r.tasks()) {
      comms_.emplace(t.tid, t.comm);  // the first name of a tid (the idle task has several)
    }
  }

  void See(pid_t pid, pid_t tid) {
    if (pids_.insert(pid).second) {
      const std::string name =
          pid == target_ ? absl::StrCat("target ", pid) : absl::StrCat("pid ", pid);
      out_.Put(Json{{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", pid},
                    {"args", {{"name", name}}}});
    }
    if (tids_.insert({pid, tid}).second) {
      std::string name = absl::StrCat("tid ", tid);
      if (auto it = comms_.find(tid); it != comms_.end()) {
        absl::StrAppend(&name, " (", it->second, ")");
      }
      out_.Put(Json{{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", tid},
                    {"args", {{"name", name}}}});
      ++counts_.threads;
    }
  }

 private:
  TraceOut& out_;
  ChromeTraceCounts& counts_;
  pid_t target_;
  std::map<pid_t, std::string> comms_;
  absl::flat_hash_set<pid_t> pids_;
  absl::flat_hash_set<std::pair<pid_t, pid_t>> tids_;
};

// The leaf field an access touched (by its first byte), with the path the report shows.
struct FieldRef {
  std::string path;
  const core::symbols::FieldLayout* layout = nullptr;  // nullptr: the watch as a whole
};

class FieldFinder {
 public:
  explicit FieldFinder(const core::store::TraceReader& r) {
    for (const core::store::WatchRecord& w : r.watches()) {
      watches_.emplace(w.id, &w);
    }
  }

  // The counter track of `ev` (an index into tracks()).
  size_t Find(const core::AccessEvent& ev) {
    auto wit = watches_.find(ev.watch_id);
    if (wit == watches_.end()) {
      return Track({ev.watch_id, -1}, absl::StrCat("watch ", ev.watch_id), nullptr);
    }
    const core::store::WatchRecord& w = *wit->second;
    const uint64_t at = ev.access_size > 0 ? ev.access_addr.value : ev.addr.value;
    int best = -1;
    if (at >= w.address.value) {
      const uint64_t off = at - w.address.value;
      for (size_t i = 0; i < w.fields.size(); ++i) {  // the deepest leaf: the last one
        const core::symbols::FieldLayout& f = w.fields[i];
        if (f.is_leaf && off >= f.offset && off < f.offset + f.size) {
          best = static_cast<int>(i);
        }
      }
    }
    if (best < 0) {
      return Track({w.id, -1}, w.expr, nullptr);
    }
    const core::symbols::FieldLayout& f = w.fields[static_cast<size_t>(best)];
    return Track({w.id, best}, w.expr + f.path, &f);
  }

  const FieldRef& track(size_t i) const { return tracks_[i]; }
  size_t size() const { return tracks_.size(); }

 private:
  size_t Track(std::pair<uint32_t, int> key, const std::string& path,
               const core::symbols::FieldLayout* layout) {
    auto [it, added] = index_.emplace(key, tracks_.size());
    if (added) {
      tracks_.push_back(FieldRef{path, layout});
    }
    return it->second;
  }

  absl::flat_hash_map<uint32_t, const core::store::WatchRecord*> watches_;
  absl::flat_hash_map<std::pair<uint32_t, int>, size_t> index_;
  std::vector<FieldRef> tracks_;
};

// The value an access left, as the live lines show it: "OLD -> NEW" in exact modes, "~V" when
// read at drain time; "" when the recording has none.
std::string ValueText(const core::AccessEvent& ev, const FieldRef& f) {
  if (!ev.value.has_value()) {
    return "";
  }
  const uint32_t size = ev.access_size > 0 ? ev.access_size : ev.len;
  const auto text = [&](uint64_t raw) {
    if (f.layout != nullptr && f.layout->bit_size == 0 && f.layout->size == size) {
      return FieldValueText(f.layout->type_name, size, 0, raw);
    }
    return absl::StrCat(raw);
  };
  std::string s = absl::StrCat(ev.value_exact ? "" : "~", text(*ev.value));
  if (ev.old_value.has_value()) {
    s = absl::StrCat(text(*ev.old_value), " -> ", s);
  }
  return s;
}

// Counters per field and time bin: a bin's counts are written when a later event starts
// another bin, and a field that goes quiet gets a 0 at the start of its first empty bin.
class Counters {
 public:
  Counters(TraceOut& out, ChromeTraceCounts& counts, const FieldFinder& fields, pid_t pid,
           uint64_t start_ns, uint64_t bucket_ns)
      : out_(out),
        counts_(counts),
        fields_(fields),
        pid_(pid),
        start_ns_(start_ns),
        bucket_ns_(bucket_ns) {}

  void Add(uint64_t time_ns, size_t track, core::AccessKind kind) {
    // An event before the session's start (a clock read racing the first one) counts in bin 0.
    const int64_t bin =
        time_ns < start_ns_ ? 0 : static_cast<int64_t>((time_ns - start_ns_) / bucket_ns_);
    if (bin != bin_) {
      Flush(bin);
    }
    if (bin_counts_.size() <= track) {
      bin_counts_.resize(track + 1);
    }
    auto& [reads, writes] = bin_counts_[track];
    if (reads == 0 && writes == 0) {
      active_.push_back(track);
    }
    (kind == core::AccessKind::kRead ? reads : writes) += 1;
  }

  // Writes the current bin (`next`: the bin that starts; nullopt at the end).
  void Flush(std::optional<int64_t> next) {
    std::vector<size_t> quiet;
    for (const size_t t : previous_) {
      if (std::find(active_.begin(), active_.end(), t) == active_.end()) {
        quiet.push_back(t);
      }
    }
    for (const size_t t : quiet) {
      Put(bin_, t, 0, 0);
    }
    std::sort(active_.begin(), active_.end());
    for (const size_t t : active_) {
      Put(bin_, t, bin_counts_[t].first, bin_counts_[t].second);
      bin_counts_[t] = {0, 0};
    }
    previous_.clear();
    if (next.has_value() && *next == bin_ + 1) {
      previous_ = std::move(active_);
    } else {
      for (const size_t t : active_) {
        Put(bin_ + 1, t, 0, 0);  // the next bin is empty
      }
    }
    active_.clear();
    bin_ = next.value_or(bin_ + 1);
  }

 private:
  void Put(int64_t bin, size_t track, uint64_t reads, uint64_t writes) {
    const uint64_t at = start_ns_ + static_cast<uint64_t>(bin) * bucket_ns_;
    out_.Put(Json{{"name", absl::StrCat("accesses ", fields_.track(track).path)},
                  {"cat", "counter"},
                  {"ph", "C"},
                  {"ts", out_.Ts(at)},
                  {"pid", pid_},
                  {"args", {{"reads", reads}, {"writes", writes}}}});
    ++counts_.counters;
  }

  TraceOut& out_;
  ChromeTraceCounts& counts_;
  const FieldFinder& fields_;
  pid_t pid_;
  uint64_t start_ns_;
  uint64_t bucket_ns_;
  int64_t bin_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> bin_counts_;  // by track: reads, writes
  std::vector<size_t> active_;                             // tracks with counts in bin_
  std::vector<size_t> previous_;                           // ... in bin_ - 1
};

Json ArgsJson(const std::vector<std::pair<std::string, std::string>>& args) {
  Json j = Json::object();
  for (const auto& [name, value] : args) {
    j[name] = value;
  }
  return j;
}

// Entry and return probes of one function at one address: a call is an entry hit and the
// return hit that follows on its thread.
struct CallPairs {
  absl::flat_hash_map<uint32_t, std::string> entry;  // probe id -> function
  absl::flat_hash_map<uint32_t, std::string> ret;
};

CallPairs PairProbes(const std::vector<core::store::ProbeRecord>& probes) {
  CallPairs pairs;
  for (const core::store::ProbeRecord& r : probes) {
    if (!r.is_return) {
      continue;
    }
    for (const core::store::ProbeRecord& e : probes) {
      if (!e.is_return && e.address.value == r.address.value && e.function == r.function) {
        pairs.entry.emplace(e.id, e.function);  // the first entry probe there
        pairs.ret.emplace(r.id, r.function);
        break;
      }
    }
  }
  return pairs;
}

uint64_t BucketNs(const core::store::TraceReader& r, uint64_t asked) {
  if (asked > 0) {
    return asked;
  }
  if (!r.end().has_value() || r.end()->end_mono_ns <= r.session().start_mono_ns) {
    return kCutShortBucketNs;
  }
  return std::max(kMinBucketNs,
                  (r.end()->end_mono_ns - r.session().start_mono_ns) / kBinsPerSession);
}

}  // namespace

absl::StatusOr<ChromeTraceCounts> WriteChromeTrace(const core::store::TraceReader& reader,
                                                   const ChromeTraceOptions& opts, FILE* out) {
  ChromeTraceCounts counts;
  const uint64_t start = reader.session().start_mono_ns;
  TraceOut trace(out, start);
  trace.Open();
  Tracks tracks(reader, trace, counts);

  const core::store::HitFilter hf = HitFilterOf(reader, opts.slice);
  core::store::EventFilter ef;
  ef.from_ns = hf.from_ns;
  ef.to_ns = hf.to_ns;
  ef.tid = hf.tid;

  FieldFinder fields(reader);
  Counters counters(trace, counts, fields, reader.session().pid, start,
                    BucketNs(reader, opts.bucket_ns));
  bool any_event = false;
  absl::Status st = reader.ForEachEvent(ef, [&](const core::AccessEvent& ev) {
    tracks.See(ev.pid, ev.tid);
    const size_t track = fields.Find(ev);
    const FieldRef& f = fields.track(track);
    Json args{{"field", f.path},
              {"access", std::string{core::AccessKindLetter(ev.kind)}},
              {"addr", Hex(ev.access_size > 0 ? ev.access_addr.value : ev.addr.value)},
              {"size", ev.access_size > 0 ? ev.access_size : ev.len}};
    if (const std::string v = ValueText(ev, f); !v.empty()) {
      args["value"] = v;
    }
    args["site"] = SiteText(reader, ev.ip);
    trace.Put(Json{{"name", f.path},
                   {"cat", "access"},
                   {"ph", "i"},
                   {"s", "t"},
                   {"ts", trace.Ts(ev.time_ns)},
                   {"pid", ev.pid},
                   {"tid", ev.tid},
                   {"args", std::move(args)}});
    ++counts.accesses;
    counters.Add(ev.time_ns, track, ev.kind);
    any_event = true;
    return true;
  });
  if (any_event) {
    counters.Flush(std::nullopt);
  }
  if (!st.ok()) {
    (void)trace.Close();
    return st;
  }

  absl::flat_hash_map<uint32_t, const core::store::ProbeRecord*> probes;
  for (const core::store::ProbeRecord& p : reader.probes()) {
    probes.emplace(p.id, &p);
  }
  const CallPairs pairs = PairProbes(reader.probes());
  struct OpenCall {
    uint64_t time_ns = 0;
    Json args;
  };
  // (tid, function) -> the calls entered and not yet returned, innermost last.
  std::map<std::pair<pid_t, std::string>, std::vector<OpenCall>> open;
  st = reader.ForEachHit(hf, [&](const core::store::HitRecord& h) {
    tracks.See(h.pid, h.tid);
    auto pit = probes.find(h.probe_id);
    const std::string name =
        pit == probes.end() ? absl::StrCat("probe ", h.probe_id) : pit->second->event;
    Json args{{"probe", pit == probes.end() ? std::string() : pit->second->spec},
              {"site", SiteText(reader, h.ip)}};
    for (const auto& [arg, value] : h.args) {
      args[arg] = value;
    }
    trace.Put(Json{{"name", name},
                   {"cat", "probe"},
                   {"ph", "i"},
                   {"s", "t"},
                   {"ts", trace.Ts(h.time_ns)},
                   {"pid", h.pid},
                   {"tid", h.tid},
                   {"args", std::move(args)}});
    ++counts.hits;
    if (auto e = pairs.entry.find(h.probe_id); e != pairs.entry.end()) {
      std::vector<OpenCall>& calls = open[{h.tid, e->second}];
      if (calls.size() == kMaxOpenCalls) {
        calls.erase(calls.begin());  // the oldest never returned (longjmp, thread exit)
      }
      calls.push_back(OpenCall{h.time_ns, ArgsJson(h.args)});
    } else if (auto r = pairs.ret.find(h.probe_id); r != pairs.ret.end()) {
      auto it = open.find({h.tid, r->second});
      if (it != open.end() && !it->second.empty()) {
        OpenCall call = std::move(it->second.back());
        it->second.pop_back();
        if (it->second.empty()) {
          open.erase(it);
        }
        trace.Put(Json{
            {"name", r->second},
            {"cat", "call"},
            {"ph", "X"},
            {"ts", trace.Ts(call.time_ns)},
            {"dur",
             h.time_ns > call.time_ns ? static_cast<double>(h.time_ns - call.time_ns) / 1e3 : 0.0},
            {"pid", h.pid},
            {"tid", h.tid},
            {"args", {{"entry", std::move(call.args)}, {"return", ArgsJson(h.args)}}}});
        ++counts.calls;
      }
    }
    return true;
  });
  const absl::Status closed = trace.Close();
  if (!st.ok()) {
    return st;
  }
  if (!closed.ok()) {
    return closed;
  }
  return counts;
}

}  // namespace kwatch::watch
