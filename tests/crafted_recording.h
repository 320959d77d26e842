#pragma once

// Crafted recordings for the tests of hostile input (a recording is a file people share): a
// small real recording written by TraceWriter, then changed or grown with SQL, the way anybody
// holding the file could. Header-only: for the test binaries that link the store.
#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/event.h"
#include "core/store/trace_records.h"
#include "core/store/trace_writer.h"

namespace kwatch::testing {

inline constexpr uint64_t kCraftStartNs = 1'000'000'000;
inline constexpr uint64_t kCraftWatchAddr = 0x10000;

// What the base recording holds.
struct CraftSpec {
  uint64_t span_ns = 1'000'000;  // session length (end - start)
  std::vector<core::AccessEvent> events;
  std::vector<core::store::SiteRecord> sites;
  std::vector<core::store::TaskRecord> tasks;
  std::vector<core::store::ProbeRecord> probes;
  std::vector<core::store::HitRecord> hits;
  std::string command_line = "kwatch --rw g -o crafted.kwdb -- ./prog";
};

// A write of `size` bytes at watch offset `offset` by `tid`, `after_ns` after the start.
inline core::AccessEvent CraftWrite(uint64_t after_ns, pid_t tid, uint64_t offset,
                                    uint32_t size = 8, uint32_t watch_id = 0,
                                    uint64_t ip = 0x401000) {
  core::AccessEvent e;
  e.time_ns = kCraftStartNs + after_ns;
  e.pid = 100;
  e.tid = tid;
  e.cpu = 0;
  e.watch_id = watch_id;
  e.ip = core::RemoteAddr{ip};
  e.trap_ip = e.ip;
  e.addr = core::RemoteAddr{kCraftWatchAddr + offset};
  e.len = size;
  e.access_addr = e.addr;
  e.access_size = size;
  e.kind = core::AccessKind::kWrite;
  e.value = 1;
  e.value_exact = true;
  return e;
}

// Writes a finished recording at `path`: one watch (id 0, "g", struct s, 16 bytes at
// kCraftWatchAddr, leaf fields .a at 0 and .b at 8, 8 bytes each), the session started at
// kCraftStartNs and ended span_ns later, and what `spec` lists.
inline absl::Status WriteCraftBase(const std::string& path, const CraftSpec& spec) {
  core::store::SessionRecord session;
  session.command_line = spec.command_line;
  session.pid = 100;
  session.kernel = "6.1.0";
  session.host = "host";
  session.start_wall_ns = 1'700'000'000'000'000'000ULL;
  session.start_mono_ns = kCraftStartNs;
  session.kwatch_version = "0.1.0";
  session.mode = spec.probes.empty() ? "watch" : "probe";
  session.backend = "page";
  // Events as rows, which SQL can change one by one (kwatch's blocks: event_blocks_test.cc).
  KW_ASSIGN_OR_RETURN(
      std::unique_ptr<core::store::TraceWriter> w,
      core::store::TraceWriter::Create(path, session, core::store::TraceWriter::kDefaultBatchSize,
                                       core::store::EventStorage::kRows));
  core::store::WatchRecord watch;
  watch.id = 0;
  watch.expr = "g";
  watch.address = core::RemoteAddr{kCraftWatchAddr};
  watch.length = 16;
  watch.kind = "rw";
  watch.backend = "page";
  watch.coverage = "16 bytes, exact (page protection)";
  watch.type_name = "struct s";
  watch.fields = {{".a", "long", 0, 8, 0, 0, 0, true}, {".b", "long", 8, 8, 0, 0, 0, true}};
  KW_RETURN_IF_ERROR(w->AddWatch(watch));
  for (const core::store::ProbeRecord& p : spec.probes) {
    KW_RETURN_IF_ERROR(w->AddProbe(p));
  }
  for (const core::store::SiteRecord& s : spec.sites) {
    KW_RETURN_IF_ERROR(w->AddSite(s));
  }
  for (const core::store::TaskRecord& t : spec.tasks) {
    KW_RETURN_IF_ERROR(w->AddTask(t));
  }
  for (const core::AccessEvent& e : spec.events) {
    KW_RETURN_IF_ERROR(w->Append(e));
  }
  for (const core::store::HitRecord& h : spec.hits) {
    KW_RETURN_IF_ERROR(w->AppendHit(h));
  }
  core::store::SessionEnd end;
  end.end_wall_ns = session.start_wall_ns + spec.span_ns;
  end.end_mono_ns = kCraftStartNs + spec.span_ns;
  end.exit_status = 0;
  end.exit_reason = "target exited";
  return w->Finish(end);
}

// Runs `sql` on the recording at `path` (read-write, as any SQLite client could), binding
// `texts` to ?1, ?2, ... as TEXT of exactly those bytes.
inline absl::Status CraftSql(const std::string& path, const std::string& sql,
                             const std::vector<std::string>& texts = {}) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr);
  std::unique_ptr<sqlite3, decltype(&sqlite3_close)> db(raw, &sqlite3_close);
  if (rc != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("open ", path, ": ", sqlite3_errmsg(raw)));
  }
  sqlite3_stmt* stmt = nullptr;
  const char* tail = sql.c_str();
  while (*tail != '\0') {
    rc = sqlite3_prepare_v2(raw, tail, -1, &stmt, &tail);
    if (rc != SQLITE_OK) {
      return absl::InternalError(absl::StrCat(sql, ": ", sqlite3_errmsg(raw)));
    }
    if (stmt == nullptr) {
      break;  // trailing whitespace
    }
    for (size_t i = 0; i < texts.size() && static_cast<int>(i) < sqlite3_bind_parameter_count(stmt);
         ++i) {
      sqlite3_bind_text(stmt, static_cast<int>(i + 1), texts[i].data(),
                        static_cast<int>(texts[i].size()), SQLITE_TRANSIENT);
    }
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    }
    sqlite3_finalize(stmt);
    if (rc != SQLITE_DONE) {
      return absl::InternalError(absl::StrCat(sql, ": ", sqlite3_errmsg(raw)));
    }
  }
  return absl::OkStatus();
}

// SQL that adds `n` leaf fields to watch `watch` (after the ones it has): ".fI" of type int,
// 4 bytes at offset 4*I (set the watch's length to cover them).
inline std::string CraftFieldsSql(uint32_t watch, uint64_t n) {
  return absl::StrCat(
      "WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < ", n,
      ") INSERT INTO fields SELECT ", watch,
      ", 1000 + i, '.f' || i, 'int', 4 * i, 4, 0, 0, 0, 1, 0 FROM k;");
}

}  // namespace kwatch::testing
