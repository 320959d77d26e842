#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/base/remote_addr.h"
#include "watch/profile/storage_profile.h"

namespace kwatch::watch::profile {

// What the report shows for an accessing instruction: "add_hits+0x12 (field_writer.c:41)".
struct SiteName {
  std::string function;  // "" when unknown: the report shows the address
  uint64_t offset = 0;   // from the function's start
  std::string file;      // "" when unknown (the report shows its base name)
  int line = 0;
  std::string inlined;  // the inlined function the instruction is in ("" if none)
};

// Names an accessing instruction (called once per distinct address per rendering). An empty
// function shows bare addresses.
using SiteNamer = std::function<SiteName(core::RemoteAddr ip)>;

// How to render a profile (which events went into it is the caller's choice). The rows come
// from BuildReportRows (watch/profile/report_rows.h); this file only formats them.
struct ReportRenderOptions {
  // Fields shown: those whose path contains `field_filter` ("" = all) and, when `path_prefix`
  // is set, whose path is it or continues it with a member or element ("g.lines" keeps
  // "g.lines[3].tag" and "g.lines.n" but not "g.lines_used").
  std::string field_filter;
  std::string path_prefix;
  // Threads whose accesses count (field counts, heatmap, per-thread view); empty = all. The
  // profile keeps sites per field for all threads together, so sites stay unfiltered (the
  // text says so). False-sharing findings are shown when one of these threads took part.
  std::vector<pid_t> threads;
  bool color = false;      // text: 256-colour heatmap cells instead of shading blocks
  bool log_scale = false;  // text: logarithmic heatmap scale (watch/profile/heat_scale.h)
  int width = 100;         // text: terminal columns (the heatmap merges time columns to fit)
  size_t top_sites = 5;
  // Command names of the recorded tasks by tid (kernel sessions record them; tid 0 has one
  // per CPU, "swapper/N"): shown after each thread's tid, and as "comm" in JSON.
  std::map<pid_t, std::vector<std::string>> task_names;
};

// Text: a header line; per watch its field table (field, offset, size, reads, writes,
// threads, top site; bitfields show offset "byte:bit" and size "<bits>b"), a heatmap of
// fields x time (shading blocks, or 256-colour cells with opts.color; time columns merged to
// fit opts.width; a legend with the count scale and the time axis), its top sites with the
// fields they touched, and per thread its per-field counts; then the false-sharing findings
// with their evidence ("no false sharing found" when none). Times are relative to the
// profile's start_ns.
std::string RenderText(const StorageProfile& profile, const SiteNamer& namer,
                       const ReportRenderOptions& opts);
// {"start_ns", "events", "ignored_events", "duration_ns",
//  "watches": [{"id", "expr", "address" ("0x..."), "length", "type", "reads", "writes",
//    "unattributed", "fields": [{"path", "type", "offset", "size", "bit_offset", "bit_size",
//      "reads", "writes", "threads", "top_sites": [SITE], "other_sites": {"reads", "writes"}}],
//    "heatmap": {"bucket_ns", "first_column_ns", "columns",
//                "rows": [{"path", "reads": [...], "writes": [...]}]},
//    "threads": [{"tid", "pid", "reads", "writes", "fields": [{"path", "reads", "writes"}]}],
//    "top_sites": [SITE]}],
//  "false_sharing": [{"line" ("0x..."), "false_transfers", "true_transfers", "first_ns",
//    "last_ns", "fields": [{"path", "address", "size"}], "shared_fields": [path],
//    "threads": [{"tid", "writes", "fields": [{"path", "writes"}], "top_sites": [SITE]}]}]}
// SITE = {"ip" ("0x..."), "function", "offset", "file", "line", "count", "reads", "writes"}.
// Times (first_ns, ...) are nanoseconds after start_ns; "false_sharing" is [] when none.
// Fields, heatmap rows and per-thread fields are the shown ones (opts filters).
nlohmann::json RenderJson(const StorageProfile& profile, const SiteNamer& namer,
                          const ReportRenderOptions& opts);
// Writes RenderJson(profile, namer, opts) with `extra`'s members added (an object: e.g.
// "session", "probes") to `out`, as dump(2) indents it, ASCII only (\uXXXX escapes; bytes that
// are not UTF-8 become U+FFFD), then a newline. Builds one field's JSON at a time: memory does
// not grow with the fields and columns the report prints.
void WriteJson(const StorageProfile& profile, const SiteNamer& namer,
               const ReportRenderOptions& opts, const nlohmann::json& extra, FILE* out);
// Header "watch,field,offset,size,reads,writes,threads,top_site", then one row per shown
// field, values as in the text table (RFC 4180 quoting).
std::string RenderCsv(const StorageProfile& profile, const SiteNamer& namer,
                      const ReportRenderOptions& opts);

// Columns of the terminal `out` writes to: its window size when it is one, else $COLUMNS,
// else 100. Reports fit their heatmaps to it.
int TerminalWidth(FILE* out);

}  // namespace kwatch::watch::profile
