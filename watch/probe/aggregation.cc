#include "watch/probe/aggregation.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/base/status_macros.h"
#include "watch/probe/hit_filter.h"
#include "watch/probe/hit_stacks.h"

namespace kwatch::watch::probe {

namespace {

using Func = AggregationSpec::Func;
using Kind = ConditionVariable::Kind;

struct FuncName {
  absl::string_view name;
  Func func = Func::kCount;
  int args = 0;  // after the value (-1: none, count())
};
constexpr std::array<FuncName, 7> kFuncs = {{{"count", Func::kCount, -1},
                                             {"sum", Func::kSum, 0},
                                             {"min", Func::kMin, 0},
                                             {"max", Func::kMax, 0},
                                             {"avg", Func::kAvg, 0},
                                             {"hist", Func::kHist, 0},
                                             {"lhist", Func::kLhist, 3}}};

// A small cursor over the text, for errors with a column.
class Cursor {
 public:
  explicit Cursor(const std::string& text) : text_(text) {}

  void SkipBlanks() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool AtEnd() {
    SkipBlanks();
    return pos_ >= text_.size();
  }
  bool Take(char c) {
    SkipBlanks();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // A name as probes write their arguments: letters, digits, _ $ and paths (-> . [N]), or a
  // register (%di).
  std::string Name() {
    SkipBlanks();
    const size_t start = pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.' ||
          c == '[' || c == ']' || (c == '%' && pos_ == start)) {
        ++pos_;
      } else if (c == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '>') {
        pos_ += 2;
      } else {
        break;
      }
    }
    return text_.substr(start, pos_ - start);
  }
  std::optional<int64_t> Integer() {
    SkipBlanks();
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') {
      ++pos_;
    }
    while (pos_ < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::string_view(text_).substr(start, pos_ - start), &v)) {
      pos_ = start;
      return std::nullopt;
    }
    return v;
  }
  size_t pos() const { return pos_; }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("--agg '", text_, "': ", what, " at column ",
                                                   pos_ + 1, "\n  ", text_, "\n  ",
                                                   std::string(pos_, ' '), "^"));
  }

 private:
  const std::string& text_;
  size_t pos_ = 0;
};

uint64_t BuiltinOf(const ProbeHit& hit, const std::string& name) {
  if (name == "tid") {
    return static_cast<uint64_t>(static_cast<int64_t>(hit.tid));
  }
  if (name == "pid") {
    return static_cast<uint64_t>(static_cast<int64_t>(hit.pid));
  }
  return hit.cpu;
}

// The index of `def`'s argument named (or written) `name`, -1 if none.
int ArgIndex(const ProbeDef& def, const std::string& name) {
  for (size_t i = 0; i < def.args.size(); ++i) {
    if (def.args[i].name == name || def.args[i].text == name) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string ShownArgs(const ProbeDef& def) {
  std::vector<std::string> names = {"tid", "pid", "cpu"};
  for (size_t i = 0; i + def.hidden_args < def.args.size(); ++i) {
    names.push_back(def.args[i].name);
  }
  if (def.duration) {
    names.emplace_back(kDurationName);
  }
  return absl::StrJoin(names, ", ");
}

bool Less(uint64_t a, uint64_t b, bool is_signed) {
  return is_signed ? static_cast<int64_t>(a) < static_cast<int64_t>(b) : a < b;
}

}  // namespace

absl::StatusOr<AggregationSpec> ParseAggregation(const std::string& text) {
  AggregationSpec spec;
  spec.text = text;
  Cursor c(text);
  const size_t paren = text.find('(');
  const size_t colon = text.find(':');
  if (colon != std::string::npos && (paren == std::string::npos || colon < paren)) {
    spec.event = std::string(absl::StripAsciiWhitespace(text.substr(0, colon)));
    while (c.pos() <= colon) {
      c.Take(text[c.pos()]);
    }
  }
  const std::string func = c.Name();
  const FuncName* f = nullptr;
  for (const FuncName& candidate : kFuncs) {
    if (candidate.name == func) {
      f = &candidate;
    }
  }
  if (f == nullptr) {
    return c.Error(
        absl::StrCat("unknown aggregation '", func, "' (count, sum, min, max, avg, hist, lhist)"));
  }
  spec.func = f->func;
  if (!c.Take('(')) {
    return c.Error(absl::StrCat("expected '(' after ", func));
  }
  if (f->args >= 0) {
    spec.value = c.Name();
    if (spec.value.empty()) {
      return c.Error(absl::StrCat(func, "() needs a value: an argument's name, tid, pid or cpu"));
    }
    std::vector<int64_t> numbers;
    for (int i = 0; i < f->args; ++i) {
      if (!c.Take(',')) {
        return c.Error("lhist needs a value, MIN, MAX and STEP: lhist(x, 0, 1000, 100)");
      }
      const std::optional<int64_t> n = c.Integer();
      if (!n.has_value()) {
        return c.Error("expected an integer");
      }
      numbers.push_back(*n);
    }
    if (spec.func == Func::kLhist) {
      spec.low = numbers[0];
      spec.high = numbers[1];
      spec.step = numbers[2];
      if (spec.step <= 0 || spec.high <= spec.low || (spec.high - spec.low) / spec.step > 10000) {
        return c.Error("lhist needs MIN < MAX and 0 < STEP, at most 10000 buckets");
      }
    }
  }
  if (!c.Take(')')) {
    return c.Error("expected ')'");
  }
  spec.call = spec.func == Func::kLhist ? absl::StrCat("lhist(", spec.value, ", ", spec.low, ", ",
                                                       spec.high, ", ", spec.step, ")")
                                        : absl::StrCat(func, "(", spec.value, ")");
  if (c.AtEnd()) {
    return spec;
  }
  if (c.Name() != "by") {
    return c.Error("expected 'by KEY' or the end");
  }
  do {
    std::string key = c.Name();
    if (key.empty()) {
      return c.Error("expected a key: tid, pid, cpu, comm or an argument's name");
    }
    if (key == "stack") {
      return c.Error("the user stack is 'ustack'");
    }
    spec.keys.push_back(std::move(key));
  } while (c.Take(','));
  if (!c.AtEnd()) {
    return c.Error("expected ',' and another key, or the end");
  }
  absl::StrAppend(&spec.call, " by ", absl::StrJoin(spec.keys, ","));
  return spec;
}

std::vector<FetchFor> NamesToFetch(const std::vector<AggregationSpec>& specs) {
  std::vector<FetchFor> names;
  for (const AggregationSpec& s : specs) {
    auto add = [&](const std::string& n) {
      const FetchFor f{s.event, n};
      if (!n.empty() && !IsHitBuiltin(n) && n != kUstack &&
          std::find(names.begin(), names.end(), f) == names.end()) {
        names.push_back(f);
      }
    };
    add(s.value);
    for (const std::string& k : s.keys) {
      add(k);
    }
  }
  return names;
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Make(const std::vector<ProbeDef>& probes,
                                                             std::vector<AggregationSpec> specs) {
  std::unique_ptr<Aggregator> a(new Aggregator());
  a->specs_ = std::move(specs);
  for (const AggregationSpec& spec : a->specs_) {
    bool any = false;
    for (const ProbeDef& def : probes) {
      if (def.internal() || (!spec.event.empty() && def.point.event != spec.event)) {
        continue;
      }
      any = true;
      Binding b;
      b.table = a->tables_.size();
      AggregateTable t;
      t.probe = &def;
      t.spec = &spec;
      if (!spec.value.empty()) {
        if (IsHitBuiltin(spec.value)) {
          b.value_builtin = spec.value;
        } else if (spec.value == kDurationName && def.duration) {
          b.value_arg = static_cast<int>(def.args.size());  // the filter appends it
          b.kind = Kind::kUnsigned;
          t.is_signed = false;
        } else {
          b.value_arg = ArgIndex(def, spec.value);
          if (b.value_arg < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "--agg '", spec.text, "': probe ", def.point.event, " has no value '", spec.value,
                "' (it has: ", ShownArgs(def), "; give EVENT: to aggregate one probe)"));
          }
          const std::optional<Kind> kind = ConditionKindOf(def.args[b.value_arg].type);
          if (!kind.has_value() || *kind == Kind::kString) {
            return absl::InvalidArgumentError(absl::StrCat("--agg '", spec.text, "': '", spec.value,
                                                           "' of probe ", def.point.event,
                                                           " is not an integer"));
          }
          b.kind = *kind;
          t.is_signed = *kind == Kind::kSigned;
        }
      }
      for (const std::string& key : spec.keys) {
        const int index = IsHitBuiltin(key) || key == kUstack ? -1 : ArgIndex(def, key);
        if (index < 0 && !IsHitBuiltin(key) && key != kUstack) {
          return absl::InvalidArgumentError(absl::StrCat("--agg '", spec.text, "': probe ",
                                                         def.point.event, " has no key '", key,
                                                         "' (it has: ", ShownArgs(def), ", comm)"));
        }
        b.key_args.push_back(index);
      }
      a->tables_.push_back(std::move(t));
      a->by_probe_[def.id].push_back(std::move(b));
    }
    if (!any) {
      std::vector<std::string> events;
      for (const ProbeDef& def : probes) {
        if (!def.internal()) {
          events.push_back(def.point.event);
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--agg '", spec.text, "': no probe is named '", spec.event,
                       "' (events: ", absl::StrJoin(events, ", "), ")"));
    }
  }
  return a;
}

std::string Aggregator::FoldedStack(const std::vector<core::RemoteAddr>& stack) const {
  if (stack.empty()) {
    return "[no stack]";
  }
  std::string out;
  for (size_t i = stack.size(); i-- > 0;) {
    const core::RemoteAddr at = FrameLookupAddress(stack, i);
    std::string name;
    if (locate_) {
      name = locate_(at).function;
    }
    if (name.empty()) {
      name = absl::StrCat("0x", absl::Hex(stack[i].value));
    }
    absl::StrAppend(&out, out.empty() ? "" : ";", name);
  }
  return out;
}

bool UsesStacks(const std::vector<AggregationSpec>& specs) {
  return std::ranges::any_of(specs, [](const AggregationSpec& s) {
    return std::find(s.keys.begin(), s.keys.end(), kUstack) != s.keys.end();
  });
}

void Aggregator::Accumulate(AggregateTable& t, AggregateValue& v, uint64_t value) {
  const AggregationSpec& spec = *t.spec;
  if (v.count == 0 || Less(value, v.min, t.is_signed)) {
    v.min = value;
  }
  if (v.count == 0 || Less(v.max, value, t.is_signed)) {
    v.max = value;
  }
  ++v.count;
  v.sum += value;
  if (spec.func == Func::kHist) {
    int index = 0;
    if (t.is_signed && static_cast<int64_t>(value) < 0) {
      index = -1;
    } else if (value > 0) {
      index = 64 - std::countl_zero(value);  // [2^(index-1), 2^index)
    }
    ++v.buckets[index];
  } else if (spec.func == Func::kLhist) {
    const auto s = static_cast<int64_t>(value);
    const int n = static_cast<int>((spec.high - spec.low + spec.step - 1) / spec.step);
    const int index = s < spec.low     ? -1
                      : s >= spec.high ? n
                                       : static_cast<int>((s - spec.low) / spec.step);
    ++v.buckets[index];
  }
}

const Aggregator::Binding& Aggregator::binding(size_t table) const {
  const ProbeDef* probe = tables_.at(table).probe;
  for (const Binding& b : by_probe_.at(probe->id)) {
    if (b.table == table) {
      return b;
    }
  }
  KW_CHECK(false && "every table has its binding");
  return by_probe_.begin()->second.front();
}

void Aggregator::TakeOver(size_t table, TableReader read) {
  tables_.at(table).in_target = true;
  tables_.at(table).in_kwatch_why.clear();
  readers_[table] = std::move(read);
}

void Aggregator::KeepInKwatch(size_t table, std::string why) {
  tables_.at(table).in_target = false;
  tables_.at(table).in_kwatch_why = std::move(why);
}

void Aggregator::Refresh() {
  for (auto& [table, read] : readers_) {
    read(tables_[table]);
  }
}

void Aggregator::Release() {
  Refresh();
  readers_.clear();
}

bool Aggregator::Add(const ProbeHit& hit) {
  const auto it = by_probe_.find(hit.probe->id);
  if (it == by_probe_.end()) {
    return true;
  }
  for (const Binding& b : it->second) {
    AggregateTable& t = tables_[b.table];
    if (t.in_target) {
      continue;  // the target accumulates it (TakeOver)
    }
    uint64_t value = 1;
    if (b.value_arg >= 0) {
      const std::optional<uint64_t> v = static_cast<size_t>(b.value_arg) < hit.args.size()
                                            ? ArgNumber(hit.args[b.value_arg].second, b.kind)
                                            : std::nullopt;
      if (!v.has_value()) {
        ++t.no_value;
        continue;
      }
      value = *v;
    } else if (!b.value_builtin.empty()) {
      value = BuiltinOf(hit, b.value_builtin);
    }
    key_.clear();
    for (size_t k = 0; k < b.key_args.size(); ++k) {
      const std::string& name = t.spec->keys[k];
      const int index = b.key_args[k];
      if (name == kUstack) {
        key_.emplace_back(name, FoldedStack(hit.stack));
      } else if (index < 0) {
        const uint64_t builtin = BuiltinOf(hit, name);
        key_.emplace_back(name, name == "cpu" ? absl::StrCat(builtin)
                                              : absl::StrCat(static_cast<int64_t>(builtin)));
      } else if (static_cast<size_t>(index) < hit.args.size()) {
        key_.emplace_back(name, hit.args[index].second);
      }
    }
    Accumulate(t, t.rows[key_], value);
  }
  return true;
}

uint64_t AggregateTable::Scalar(const AggregateValue& v) const {
  switch (spec->func) {
    case Func::kSum:
      return v.sum;
    case Func::kMin:
      return v.min;
    case Func::kMax:
      return v.max;
    default:
      return v.count;
  }
}

double AggregateTable::AverageOf(const AggregateValue& v) const {
  if (v.count == 0) {
    return 0;
  }
  // The sum wraps past 2^64; an average of values that large is rare in practice.
  return is_signed ? static_cast<double>(static_cast<int64_t>(v.sum)) / static_cast<double>(v.count)
                   : static_cast<double>(v.sum) / static_cast<double>(v.count);
}

std::vector<HistBucket> AggregateTable::Buckets(const AggregateValue& v) const {
  std::vector<HistBucket> out;
  if (v.buckets.empty()) {
    return out;
  }
  const int first = v.buckets.begin()->first;
  const int last = v.buckets.rbegin()->first;
  const bool hist = spec->func == Func::kHist;
  const int n =
      hist ? 65 : static_cast<int>((spec->high - spec->low + spec->step - 1) / spec->step);
  for (int i = first; i <= last; ++i) {
    HistBucket b;
    const auto it = v.buckets.find(i);
    b.count = it == v.buckets.end() ? 0 : it->second;
    if (i < 0) {
      b.high = hist ? 0 : spec->low;
    } else if (hist) {
      b.low = i == 0 ? 0 : static_cast<int64_t>(uint64_t{1} << (i - 1));
      if (i < 63) {
        b.high = static_cast<int64_t>(uint64_t{1} << i);
      }
    } else if (i >= n) {
      b.low = spec->high;
    } else {
      b.low = spec->low + static_cast<int64_t>(i) * spec->step;
      b.high = std::min(spec->high, *b.low + spec->step);
    }
    out.push_back(b);
  }
  return out;
}

}  // namespace kwatch::watch::probe
