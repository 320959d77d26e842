// The recording reader (core/store/trace_reader.h) on recordings changed by SQL: the input is
// SQL run against a copy of a real recording (fuzz/corpus/trace_reader/probe.kwdb), then the
// result is read as trace_reader_fuzzer.cc reads it. Byte-level mutation of a SQLite file
// mostly breaks page checksums and structure; this reaches the reader's own logic with values
// a damaged or hand-edited file can hold (wrong types, NULLs, extreme rowids and times,
// missing or extra tables). ATTACH (and VACUUM INTO, which attaches) is refused and every
// statement is bounded, so the SQL touches nothing but its copy.

#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "core/store/trace_reader.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr int kMaxRows = 2000;

const std::string& Template() {
  static const std::string* bytes = [] {
    std::ifstream in(KWATCH_FUZZ_RECORDING, std::ios::binary);
    auto* s = new std::string(std::istreambuf_iterator<char>(in), {});
    if (s->empty()) {
      std::abort();  // the harness is broken: the template recording must exist
    }
    return s;
  }();
  return *bytes;
}

// Runs `sql` on the file at `path`. Errors in the SQL are fine: what ran stays.
void Apply(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 1 << 20);
  sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, nullptr);
  // About 10^6 virtual machine steps per input: no runaway recursive CTE.
  int budget = 1000;
  sqlite3_progress_handler(
      db, 1000, [](void* b) { return --*static_cast<int*>(b) < 0 ? 1 : 0; }, &budget);
  sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close(db);
}

void ReadAll(const kwatch::core::store::TraceReader& r, const kwatch::core::store::EventFilter& ef,
             const kwatch::core::store::HitFilter& hf) {
  int n = 0;
  (void)r.ForEachEvent(ef, [&](const kwatch::core::AccessEvent& e) {
    (void)r.FindSite(e.ip);
    return ++n < kMaxRows;
  });
  n = 0;
  (void)r.ForEachHit(hf, [&](const kwatch::core::store::HitRecord& h) {
    (void)r.FindSite(h.ip);
    return ++n < kMaxRows;
  });
  (void)r.CountEvents(ef);
  (void)r.CountHits(hf);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& tmpl = Template();
  const kwatch::fuzz::TempFile file(reinterpret_cast<const uint8_t*>(tmpl.data()), tmpl.size());
  Apply(file.path(), std::string(reinterpret_cast<const char*>(data), size));
  auto reader = kwatch::core::store::TraceReader::Open(file.path());
  if (!reader.ok()) {
    return 0;
  }
  const kwatch::core::store::TraceReader& r = **reader;
  ReadAll(r, {}, {});
  for (const uint64_t from : {uint64_t{0}, uint64_t{1000}, uint64_t{1} << 63, UINT64_MAX}) {
    kwatch::core::store::EventFilter ef;
    ef.from_ns = from;
    ef.to_ns = from + 5000;
    kwatch::core::store::HitFilter hf;
    hf.from_ns = from;
    ReadAll(r, ef, hf);
  }
  return 0;
}
