#include "watch/probe/hit_filter.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/probe/fetch_format.h"

namespace kwatch::watch::probe {

namespace {

using Kind = ConditionVariable::Kind;

}  // namespace

std::optional<Kind> ConditionKindOf(const core::probe::ArgType& t) {
  switch (t.kind) {
    case core::probe::ArgType::Kind::kSigned:
      return Kind::kSigned;
    case core::probe::ArgType::Kind::kUnsigned:
    case core::probe::ArgType::Kind::kHex:
      return Kind::kUnsigned;
    case core::probe::ArgType::Kind::kString:
      return Kind::kString;
    case core::probe::ArgType::Kind::kFloat:
      break;
  }
  return std::nullopt;
}

std::optional<uint64_t> ArgNumber(std::string_view shown_text, Kind kind) {
  absl::string_view shown(shown_text.data(), shown_text.size());
  if (kind == Kind::kSigned) {
    int64_t v = 0;
    if (absl::SimpleAtoi(shown, &v)) {
      return static_cast<uint64_t>(v);
    }
    return std::nullopt;
  }
  uint64_t v = 0;
  if (absl::ConsumePrefix(&shown, "0x") ? absl::SimpleHexAtoi(shown, &v)
                                        : absl::SimpleAtoi(shown, &v)) {
    return v;
  }
  return std::nullopt;
}

namespace {

// The probes' event names, for errors.
std::string EventNames(const std::vector<ProbeDef>& probes) {
  std::vector<std::string> names;
  for (const ProbeDef& p : probes) {
    if (!p.internal()) {
      names.push_back(p.point.event);
    }
  }
  return absl::StrJoin(names, ", ");
}

// Whether `counts` names only events of `probes`.
absl::Status CheckEvents(const PerProbeCounts& counts, const std::vector<ProbeDef>& probes,
                         const std::string& option) {
  for (const auto& entry : counts.event) {
    const std::string& event = entry.first;
    const bool known = std::any_of(probes.begin(), probes.end(), [&event](const ProbeDef& p) {
      return !p.internal() && p.point.event == event;
    });
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(option, " ", event, ":", entry.second,
                                                     ": no probe is named '", event,
                                                     "' (events: ", EventNames(probes), ")"));
    }
  }
  return absl::OkStatus();
}

std::optional<uint64_t> CountFor(const PerProbeCounts& counts, const std::string& event) {
  const auto it = counts.event.find(event);
  return it != counts.event.end() ? std::optional<uint64_t>(it->second) : counts.every;
}

}  // namespace

std::string DurationText(std::optional<uint64_t> ns) {
  return ns.has_value() ? absl::StrCat(*ns) : std::string("(no entry)");
}

bool IsHitBuiltin(const std::string& name) {
  return name == "tid" || name == "pid" || name == "cpu";
}

absl::StatusOr<ConditionOptions> ConditionOptionsFor(const ProbeDef& def) {
  ConditionOptions opts;
  opts.access_names = false;
  opts.context = def.spec;
  opts.context_offset = def.condition_offset;
  for (const core::probe::CompiledArg& a : def.args) {
    const std::optional<Kind> kind = ConditionKindOf(a.type);
    opts.variables.push_back(ConditionVariable{a.name, kind.value_or(Kind::kSigned),
                                               a.text != a.name ? a.text : std::string()});
  }
  if (def.duration) {
    opts.variables.push_back(ConditionVariable{std::string(kDurationName), Kind::kUnsigned, ""});
  }
  for (const std::string& name : Condition::NamesIn(def.condition)) {
    const bool is_float = std::any_of(def.args.begin(), def.args.end(), [&](const auto& a) {
      return (a.name == name || a.text == name) && !ConditionKindOf(a.type).has_value();
    });
    if (is_float) {
      return absl::InvalidArgumentError(
          absl::StrCat("probe '", def.spec, "': '", name,
                       "' is a floating-point value: conditions compare integers and strings\n  ",
                       PointAt(def.spec, def.spec.find(name, def.condition_offset), name.size())));
    }
  }
  return opts;
}

absl::Status ParsePerProbeCount(const std::string& text, const std::string& option,
                                PerProbeCounts& counts) {
  absl::string_view number = text;
  std::string event;
  if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    event = text.substr(0, colon);
    number = absl::string_view(text).substr(colon + 1);
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(number, &n) || (event.empty() && absl::StrContains(text, ':'))) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, " '", text, "': expected N or EVENT:N (N a whole number)"));
  }
  if (event.empty()) {
    counts.every = n;
  } else {
    counts.event[event] = n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HitFilter>> HitFilter::Make(const std::vector<ProbeDef>& probes,
                                                           HitFilterOptions opts) {
  KW_RETURN_IF_ERROR(CheckEvents(opts.skip, probes, "--skip"));
  KW_RETURN_IF_ERROR(CheckEvents(opts.count, probes, "-c"));
  std::unique_ptr<HitFilter> f(new HitFilter(std::move(opts)));
  f->filters_ = f->opts_.stop_on || f->opts_.skip.every.has_value() ||
                !f->opts_.skip.event.empty() || f->opts_.count.every.has_value() ||
                !f->opts_.count.event.empty();
  for (const ProbeDef& def : probes) {
    PerProbe& p = f->per_probe_[def.id];
    p.def = &def;
    p.skip = CountFor(f->opts_.skip, def.point.event).value_or(0);
    p.count = CountFor(f->opts_.count, def.point.event);
    if (def.condition.empty()) {
      continue;
    }
    KW_ASSIGN_OR_RETURN(ConditionOptions co, ConditionOptionsFor(def));  // $duration last
    for (const ConditionVariable& v : co.variables) {
      p.kinds.push_back(v.kind);
    }
    KW_ASSIGN_OR_RETURN(Condition c, Condition::Parse(def.condition, co));
    p.condition = std::move(c);
    f->filters_ = true;
  }
  return f;
}

bool HitFilter::Matches(PerProbe& p, const ProbeHit& hit, std::optional<uint64_t> duration) {
  if (!p.condition.has_value()) {
    return true;
  }
  const size_t n = p.kinds.size();
  numbers_.assign(n, std::nullopt);
  strings_.assign(n, std::nullopt);
  string_values_.resize(std::max(string_values_.size(), n));
  if (p.def->duration && !numbers_.empty()) {
    numbers_.back() = duration;  // $duration follows the arguments
  }
  for (size_t i = 0; i < n && i < hit.args.size(); ++i) {
    if (!p.condition->uses_variable(i)) {
      continue;
    }
    const std::string& shown = hit.args[i].second;
    if (p.kinds[i] == Kind::kString) {
      if (core::probe::UnquoteFetchString(shown, string_values_[i])) {
        strings_[i] = string_values_[i];
      }
    } else {
      numbers_[i] = ArgNumber(shown, p.kinds[i]);
    }
  }
  ConditionInputs in;
  in.tid = hit.tid;
  in.pid = hit.pid;
  in.cpu = hit.cpu;
  in.numbers = numbers_;
  in.strings = strings_;
  return p.condition->Matches(in);
}

std::optional<uint64_t> HitFilter::Pair(const ProbeHit& hit) {
  const ProbeDef& def = *hit.probe;
  const size_t sp_arg = def.internal() ? 0 : def.sp_arg;
  const std::optional<uint64_t> sp =
      sp_arg < hit.args.size() ? ArgNumber(hit.args[sp_arg].second, Kind::kUnsigned) : std::nullopt;
  const uint32_t ret_id = def.internal() ? def.pairs_with : def.id;
  std::vector<Entry>& calls = calls_[CallKey{hit.pid, hit.tid, ret_id}];
  if (def.internal()) {
    if (sp.has_value()) {
      calls.push_back(Entry{hit.time_ns, *sp});
    }
    return std::nullopt;
  }
  if (!sp.has_value()) {
    return std::nullopt;
  }
  // The entry of this call had the stack pointer 8 below the return's (the return address
  // popped). Entries below it are calls that never returned (longjmp, an exception).
  const uint64_t entry_sp = *sp - 8;
  while (!calls.empty() && calls.back().sp < entry_sp) {
    calls.pop_back();
    ++per_probe_[def.id].stats.unpaired_entries;
  }
  if (calls.empty() || calls.back().sp != entry_sp) {
    return std::nullopt;  // entered before the session, or its entry hit was lost
  }
  const uint64_t began = calls.back().time_ns;
  calls.pop_back();
  return hit.time_ns >= began ? hit.time_ns - began : 0;
}

bool HitFilter::Add(const ProbeHit& hit) {
  auto it = per_probe_.find(hit.probe->id);
  if (it == per_probe_.end() || stopped_at_.has_value()) {
    return true;
  }
  PerProbe& p = it->second;
  std::optional<uint64_t> duration;
  if (p.def->internal() || p.def->duration) {
    duration = Pair(hit);
    if (p.def->internal()) {
      return true;  // an entry, kept for its return
    }
  }
  ++p.stats.seen;
  if (!Matches(p, hit, duration)) {
    return true;
  }
  ++p.stats.matched;
  if (p.stats.skipped < p.skip) {
    ++p.stats.skipped;
    return true;
  }
  if (p.count.has_value() && p.taken >= *p.count) {
    ++p.stats.over_count;
    return true;
  }
  const size_t hidden = p.def->hidden_args;
  bool taken = false;
  if (!p.def->duration && (hidden == 0 || hit.args.size() < hidden)) {
    taken = next_->Add(hit);
  } else {
    ProbeHit shown = hit;
    shown.args.resize(hit.args.size() >= hidden ? hit.args.size() - hidden : hit.args.size());
    if (p.def->duration_shown.has_value()) {
      const size_t at = std::min(*p.def->duration_shown, shown.args.size());
      shown.args.emplace(shown.args.begin() + static_cast<std::ptrdiff_t>(at),
                         std::string(kDurationName), DurationText(duration));
    }
    taken = next_->Add(shown);
  }
  p.taken += static_cast<uint64_t>(taken);
  if (taken && opts_.stop_on && !stopped_at_.has_value()) {
    stopped_at_ = hit;
  }
  if (taken && also_ != nullptr) {
    if (p.def->duration) {
      ProbeHit full = hit;  // $duration after the arguments, as the aggregations bind it
      full.args.emplace_back(std::string(kDurationName), DurationText(duration));
      also_->Add(full);
    } else {
      also_->Add(hit);
    }
  }
  return true;
}

bool HitFilter::done() const {
  if (stopped_at_.has_value() || next_->done()) {
    return true;
  }
  if (opts_.count.event.empty() && !opts_.count.every.has_value()) {
    return false;
  }
  return std::all_of(per_probe_.begin(), per_probe_.end(), [](const auto& entry) {
    const PerProbe& p = entry.second;
    return p.def->internal() || (p.count.has_value() && p.taken >= *p.count);
  });
}

std::string HitFilter::done_reason() const {
  if (stopped_at_.has_value()) {
    return absl::StrCat("--stop-on: ", stopped_at_->probe->point.event, " hit by thread ",
                        stopped_at_->tid);
  }
  if (next_->done()) {
    return next_->done_reason();
  }
  if (done()) {
    return "every probe reached its -c count";
  }
  return "";
}

ProbeFilterStats SummaryFilterStats(ProbeFilterStats filter, const ProbeEndStats& end) {
  if (!end.target_filter.has_value()) {
    return filter;
  }
  const ProbeEndStats::TargetFilter& t = *end.target_filter;
  filter.matched = end.counted.value_or(filter.matched);
  filter.seen = filter.matched + t.rejected + t.no_value + t.division_by_zero;
  ConditionStats c;
  c.evaluated = filter.seen;
  c.matched = filter.matched;
  c.missing_value = t.no_value;
  c.division_by_zero = t.division_by_zero;
  filter.condition = c;
  return filter;
}

ProbeFilterStats HitFilter::stats(uint32_t probe_id) const {
  const auto it = per_probe_.find(probe_id);
  if (it == per_probe_.end()) {
    return {};
  }
  ProbeFilterStats s = it->second.stats;
  if (it->second.condition.has_value()) {
    s.condition = it->second.condition->stats();
  }
  return s;
}

}  // namespace kwatch::watch::probe
