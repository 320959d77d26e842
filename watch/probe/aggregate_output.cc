#include "watch/probe/aggregate_output.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/printable.h"
#include "core/probe/fetch_format.h"

namespace kwatch::watch::probe {

namespace {

using core::store::AggregateBucketRecord;
using core::store::AggregateRecord;
using core::store::AggregateRowRecord;
using Func = AggregationSpec::Func;

bool IsDecimalInteger(absl::string_view s) {
  if (absl::ConsumePrefix(&s, "-") && s.empty()) {
    return false;
  }
  return !s.empty() && s.size() <= 20 &&
         std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

const char* FuncName(Func f) {
  switch (f) {
    case Func::kCount:
      return "count";
    case Func::kSum:
      return "sum";
    case Func::kMin:
      return "min";
    case Func::kMax:
      return "max";
    case Func::kAvg:
      return "avg";
    case Func::kHist:
      return "hist";
    case Func::kLhist:
      return "lhist";
  }
  return "count";
}

std::string ScalarText(const AggregateTable& t, const AggregateValue& v) {
  if (t.spec->func == Func::kAvg) {
    return absl::StrFormat("%.6g", t.AverageOf(v));
  }
  const uint64_t x = t.Scalar(v);
  return t.is_signed ? absl::StrCat(static_cast<int64_t>(x)) : absl::StrCat(x);
}

std::string BoundText(const std::optional<int64_t>& v, const char* none) {
  return v.has_value() ? absl::StrCat(*v) : std::string(none);
}

}  // namespace

std::string AggregateKeyText(const std::vector<std::pair<std::string, std::string>>& key) {
  std::string out;
  for (const auto& [name, value] : key) {
    absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", value);
  }
  return out;
}

std::string BucketRangeText(const AggregateBucketRecord& b) {
  return absl::StrCat(b.low.has_value() ? "[" : "(", BoundText(b.low, "..."), ", ",
                      BoundText(b.high, "..."), ")");
}

std::vector<AggregateRecord> AggregateResults(const Aggregator& agg) {
  std::vector<AggregateRecord> out;
  out.reserve(agg.tables().size());
  for (const AggregateTable& t : agg.tables()) {
    AggregateRecord a;
    a.probe_id = t.probe->id;
    a.event = t.probe->point.event;
    a.agg = t.spec->call;
    a.func = FuncName(t.spec->func);
    a.no_value = t.no_value;
    a.rows.reserve(t.rows.size());
    for (const auto& [key, value] : t.rows) {
      AggregateRowRecord row;
      row.key = key;
      row.count = value.count;
      if (a.histogram()) {
        for (const HistBucket& b : t.Buckets(value)) {
          row.buckets.push_back(AggregateBucketRecord{b.low, b.high, b.count});
        }
      } else {
        row.value = ScalarText(t, value);
      }
      a.rows.push_back(std::move(row));
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::string AggregatesText(const std::vector<AggregateRecord>& aggs, double elapsed) {
  std::string out = elapsed < 0 ? std::string("== aggregations ==\n")
                                : absl::StrFormat("== aggregations at %.3f s ==\n", elapsed);
  for (const AggregateRecord& a : aggs) {
    absl::StrAppend(&out, a.event, ": ", a.agg);
    if (a.no_value > 0) {
      absl::StrAppend(&out, " (", a.no_value, " hit", a.no_value == 1 ? "" : "s",
                      " without a value left out)");
    }
    out += '\n';
    if (a.rows.empty()) {
      out += "    (no hits)\n";
    }
    for (const AggregateRowRecord& row : a.rows) {
      if (!a.histogram()) {
        absl::StrAppendFormat(&out, "    %-40s %s\n",
                              row.key.empty() ? std::string("-") : AggregateKeyText(row.key),
                              row.value);
        continue;
      }
      if (!row.key.empty()) {
        absl::StrAppend(&out, "    ", AggregateKeyText(row.key), "\n");
      }
      uint64_t most = 0;
      for (const AggregateBucketRecord& b : row.buckets) {
        most = std::max(most, b.count);
      }
      for (const AggregateBucketRecord& b : row.buckets) {
        const std::string range = BucketRangeText(b);
        // In 128 bits: a recording's count may be any 64-bit number.
        const auto bar =
            most == 0 ? size_t{0}
                      : static_cast<size_t>(static_cast<unsigned __int128>(b.count) * 50 / most);
        absl::StrAppendFormat(&out, "    %-24s %10d |%-50s|\n", range, b.count,
                              std::string(bar, '@'));
      }
    }
  }
  return out;
}

std::string AggregatesJson(const std::vector<AggregateRecord>& aggs, double elapsed,
                           JsonQuote quote) {
  std::string out;
  for (const AggregateRecord& a : aggs) {
    const std::string head = absl::StrCat(
        R"({"type":"aggregate","event":)", quote(a.event), R"(,"agg":)", quote(a.agg),
        ",\"time\":", elapsed < 0 ? std::string("null") : absl::StrFormat("%.6f", elapsed));
    for (const AggregateRowRecord& row : a.rows) {
      std::string k = "null";
      if (!row.key.empty()) {
        k = "{";
        for (size_t i = 0; i < row.key.size(); ++i) {
          absl::StrAppend(&k, i == 0 ? "" : ",", quote(row.key[i].first), ":",
                          ArgValueJson(row.key[i].second, quote));
        }
        k += "}";
      }
      if (!a.histogram()) {
        absl::StrAppendFormat(&out, "%s,\"key\":%s,\"value\":%s,\"count\":%d}\n", head, k,
                              row.value, row.count);
        continue;
      }
      for (const AggregateBucketRecord& b : row.buckets) {
        absl::StrAppendFormat(&out, "%s,\"key\":%s,\"low\":%s,\"high\":%s,\"count\":%d}\n", head, k,
                              BoundText(b.low, "null"), BoundText(b.high, "null"), b.count);
      }
    }
  }
  return out;
}

std::string ArgValueJson(const std::string& formatted, JsonQuote quote) {
  if (IsDecimalInteger(formatted)) {
    return formatted;
  }
  std::string s;
  if (core::probe::UnquoteFetchString(formatted, s)) {
    return quote(s);
  }
  double d = 0;
  if (formatted.find_first_of(".e") != std::string::npos && absl::SimpleAtod(formatted, &d) &&
      std::isfinite(d) && formatted.find_first_not_of("0123456789.e+-") == std::string::npos) {
    return formatted;
  }
  return quote(formatted);
}

std::string ReportAggregatesText(const std::vector<AggregateRecord>& aggs) {
  if (aggs.empty()) {
    return "";
  }
  std::vector<AggregateRecord> shown = aggs;
  for (AggregateRecord& a : shown) {
    a.event = core::Printable(a.event);
    a.agg = core::Printable(a.agg);
    for (AggregateRowRecord& row : a.rows) {
      for (auto& [name, value] : row.key) {
        name = core::Printable(name);
        value = core::Printable(value);
      }
    }
  }
  return AggregatesText(shown, -1);
}

nlohmann::json ReportAggregatesJson(const std::vector<AggregateRecord>& aggs) {
  auto ascii = [](absl::string_view s) {
    const std::string text(s);
    return nlohmann::json(text).dump(-1, ' ', /*ensure_ascii=*/true,
                                     nlohmann::json::error_handler_t::replace);
  };
  nlohmann::json out = nlohmann::json::array();
  for (absl::string_view line :
       absl::StrSplit(AggregatesJson(aggs, -1, ascii), '\n', absl::SkipEmpty())) {
    // ASCII and well-formed by construction.
    out.push_back(nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                        /*allow_exceptions=*/false));
  }
  return out;
}

}  // namespace kwatch::watch::probe
