#pragma once

// The results of `kwatch probe --agg` as people and scripts read them, one formatter for both
// the live session (from the Aggregator) and `kwatch report` (from a recording): each
// aggregation's result is first made plain data (core::store::AggregateRecord, what a
// recording stores), then printed as text (bpftrace's layout) or JSON lines.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "core/store/trace_records.h"
#include "watch/probe/aggregation.h"

namespace kwatch::watch::probe {

// The aggregations' results now, in the order of agg.tables(): each key's row with its value as
// printed (or its buckets), the hits without a value.
std::vector<core::store::AggregateRecord> AggregateResults(const Aggregator& agg);

// The text block: a title line ("== aggregations ==", "== aggregations at 2.000 s ==" for an
// `elapsed` >= 0), then per aggregation "EVENT: AGG" and its rows: keys and values in columns,
// histograms as bpftrace draws them ("[4, 8)   3 |@@@@   |"). Strings are printed as given
// (a report escapes them first).
std::string AggregatesText(const std::vector<core::store::AggregateRecord>& aggs, double elapsed);

// A histogram bucket's range as the text block shows it: "[4, 8)", "(..., 0)", "[1000, ...)".
std::string BucketRangeText(const core::store::AggregateBucketRecord& b);

// A row's key as the text block shows it: "tid=12 comm=\"prog\"", "" without a key.
std::string AggregateKeyText(const std::vector<std::pair<std::string, std::string>>& key);

// A JSON string literal for a string, quotes included.
using JsonQuote = absl::FunctionRef<std::string(absl::string_view)>;

// The same as JSON lines: one {"type":"aggregate","event":...,"agg":...,"time":...,"key":...}
// object per row (count, sum, min, max, avg: "value" and "count"; hist and lhist: one per
// bucket, "low", "high", "count"). `time`: `elapsed` seconds, null when negative. `quote`
// writes the strings (event, agg, key names and string values).
std::string AggregatesJson(const std::vector<core::store::AggregateRecord>& aggs, double elapsed,
                           JsonQuote quote);

// A probe argument's value, formatted as the hits show it, as JSON: a number for decimal
// integers and finite floats, the string itself for quoted strings ("\"prog\"" -> "prog"), the
// text otherwise ("0x64", "(fault)"), quoted with `quote`.
std::string ArgValueJson(const std::string& formatted, JsonQuote quote);

// `kwatch report`'s forms of a recording's aggregations (a recording is anybody's file): the text
// block with every string shown escaped (core::Printable), "" when there are none; and the JSON
// objects of AggregatesJson (time null) as an array, strings ASCII-only (\uXXXX; bytes that are
// not UTF-8 become U+FFFD).
std::string ReportAggregatesText(const std::vector<core::store::AggregateRecord>& aggs);
nlohmann::json ReportAggregatesJson(const std::vector<core::store::AggregateRecord>& aggs);

}  // namespace kwatch::watch::probe
